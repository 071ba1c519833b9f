"""zstd-compressed JSON Lines on local disk: the format of snapshots and quarantine files.

Both are streamed, one record at a time, so neither writing nor reading holds a file in memory.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import zstandard

# Level 1: a quarter less CPU than 3 on the snapshot, which is written and read once per build, for 6% more bytes.
ZSTD_LEVEL = 1
# Lines are handed to the compressor in blocks of about this size: one call per line costs more than the
# compression itself when rows are small.
WRITE_BLOCK_BYTES = 1 << 20


class JsonlZstWriter:
    """Appends one JSON object per line to a new `.jsonl.zst` file; use as a context manager."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")
        self._stream = zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(self._file, closefd=False)
        self._block: list[bytes] = []
        self._block_bytes = 0

    def write(self, record: Any) -> None:
        """`record`: a dict, or a dataclass (written as the object of its fields)."""
        line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        self._block.append(line)
        self._block_bytes += len(line)
        if self._block_bytes >= WRITE_BLOCK_BYTES:
            self._write_block()

    def _write_block(self) -> None:
        self._stream.write(b"".join(self._block))
        self._block.clear()
        self._block_bytes = 0

    def append_frames(self, path: Path) -> None:
        """Append the records of another `.jsonl.zst` file (as its compressed frames, not recompressed)."""
        self._write_block()
        self._stream.flush(zstandard.FLUSH_FRAME)
        with open(path, "rb") as source:
            shutil.copyfileobj(source, self._file, WRITE_BLOCK_BYTES)

    def close(self) -> None:
        self._write_block()
        self._stream.close()
        self._file.close()

    def __enter__(self) -> JsonlZstWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_jsonl_zst(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as handle:
        for line in _decompressed(handle):
            if line.strip():
                yield orjson.loads(line)


def jsonl_zst_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The file's lines, unparsed, in blocks of whole lines of about `block_bytes` (more when one line is longer),
    each one bytes object (cheap to hand to another process, and cut without a Python step per line); blank lines
    are kept, for the reader to skip."""
    with open(path, "rb") as handle:
        stream = _decompressed(handle)
        rest = b""
        while chunk := stream.read(block_bytes):
            block = rest + chunk
            end = block.rfind(b"\n") + 1
            rest = block[end:]
            if end:
                yield block[:end]
        if rest:
            yield rest


def _decompressed(handle: BinaryIO) -> BinaryIO:
    # A file may hold several frames (`JsonlZstWriter.append_frames`).
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True))
