"""zstd-compressed JSON Lines on local disk: the format of snapshots and quarantine files.

Both are streamed, one record at a time, so neither writing nor reading holds a file in memory.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import zstandard

ZSTD_LEVEL = 3


class JsonlZstWriter:
    """Appends one JSON object per line to a new `.jsonl.zst` file; use as a context manager."""

    def __init__(self, path: Path):
        self.path = path
        self.rows = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")
        self._stream = zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(self._file, closefd=False)

    def write(self, record: Any) -> None:
        """`record`: a dict, or a dataclass (written as the object of its fields)."""
        self._stream.write(orjson.dumps(record) + b"\n")
        self.rows += 1

    def close(self) -> None:
        self._stream.close()
        self._file.close()

    def __enter__(self) -> JsonlZstWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_jsonl_zst(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as handle:
        lines = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(handle))
        for line in lines:
            if line.strip():
                yield orjson.loads(line)
