"""Reading prompt files row by row: JSON arrays, JSON Lines (plain, `.gz`, `.zst`) and Parquet; a `.json` file
holding one JSON object (a single conversation, pretty-printed) is one row.

Every file is streamed, so a 600 MB ShareGPT array costs the memory of one row, not of the file (a single
object is read whole: it is the row).
A row that cannot be decoded is still yielded, with a reason (`invalid_utf8`, `invalid_json`), so the
caller can quarantine it: rows are counted, never skipped. A file whose structure is broken (a JSON
array that does not close, a corrupt Parquet footer) cannot be split into rows at all and raises
`FileFormatError` naming the file and the position.

`row` is the 0-based index of the row in its file; for JSON Lines it is the line index (blank lines
are not rows but still count), so `sed -n "$((row + 1))p"` shows the line.

A large plain (uncompressed) JSON Lines file or Parquet file of several row groups can be read in parts
(`row_ranges`: byte ranges cut after a line break, runs of row groups), each knowing the index of its first
row, so that several processes read one large file with the same rows and row indices as one process
reading it whole.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import zstandard

FILE_KINDS = ("json", "jsonl", "parquet")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_KIND_BY_SUFFIX = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_CHUNK_CHARS = 1 << 20
_PARQUET_BATCH_ROWS = 2048
_WHITESPACE = re.compile(r"\s*")
_RAW_EXCERPT_BYTES = 4000


class FileFormatError(ValueError):
    """A file that cannot be split into rows."""


@dataclass
class RawRow:
    row: int
    value: Any = None
    # Set when the row could not be decoded: a quarantine reason code and what went wrong.
    reason: str | None = None
    detail: str = ""
    raw: str | None = None


def file_kind(name: str) -> tuple[str, str | None]:
    """(kind, compression) from a file name, e.g. `train.jsonl.zst` -> ("jsonl", "zstd")."""
    suffixes = [s.lower() for s in Path(name).suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    kind = _KIND_BY_SUFFIX.get(suffixes[-1]) if suffixes else None
    if kind is None or (kind == "parquet" and compression):
        raise FileFormatError(
            f"{name}: unsupported file type; expected .json, .jsonl/.ndjson (optionally .gz/.zst) or .parquet"
        )
    return kind, compression


def is_supported(name: str) -> bool:
    try:
        file_kind(name)
    except FileFormatError:
        return False
    return True


@dataclass(frozen=True)
class RowRange:
    """A part of a file that is read on its own (`row_ranges`): bytes [start, end) of a plain JSON Lines file, cut
    after a line break, or row groups [start, end) of a Parquet file; `first_row`: the index of its first row."""

    start: int
    end: int
    first_row: int


def splits_into_ranges(path: Path, name: str, range_bytes: int) -> bool:
    """Whether the file at `path` is read in more than one range (`row_ranges`): a plain JSON Lines file longer than
    `range_bytes`, or a Parquet file of several row groups holding more than `range_bytes` of data."""
    if not is_supported(name):
        return False
    kind, compression = file_kind(name)
    if kind == "parquet":
        groups = _parquet_group_sizes(path)
        return len(groups) > 1 and sum(size for _, size in groups) > range_bytes
    return kind == "jsonl" and compression is None and path.stat().st_size > range_bytes


def row_ranges(path: Path, name: str, range_bytes: int) -> Iterator[RowRange]:
    """The file at `path` (one `splits_into_ranges` accepts) in ranges of about `range_bytes` each, found as they
    are yielded: of its bytes for JSON Lines, of its row groups' data for Parquet."""
    if file_kind(name)[0] == "parquet":
        yield from _row_group_ranges(_parquet_group_sizes(path), range_bytes)
        return
    start, first_row = 0, 0
    with open(path, "rb") as handle:
        while block := handle.read(range_bytes):
            block += handle.readline()  # to the end of the line the range would cut
            yield RowRange(start, start + len(block), first_row)
            start += len(block)
            first_row += block.count(b"\n")


def _parquet_group_sizes(path: Path) -> list[tuple[int, int]]:
    """(rows, bytes of data) of each row group of a Parquet file; none when its footer cannot be read (reading it
    whole then reports why)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(path).metadata
    except (pa.ArrowInvalid, OSError):
        return []
    groups = (metadata.row_group(index) for index in range(metadata.num_row_groups))
    return [(group.num_rows, group.total_byte_size) for group in groups]


def _row_group_ranges(groups: list[tuple[int, int]], range_bytes: int) -> Iterator[RowRange]:
    start, first_row, rows, size = 0, 0, 0, 0
    for index, (group_rows, group_bytes) in enumerate(groups):
        rows, size = rows + group_rows, size + group_bytes
        if size >= range_bytes or index == len(groups) - 1:
            yield RowRange(start, index + 1, first_row)
            start, first_row, rows, size = index + 1, first_row + rows, 0, 0


def iter_rows(path: Path, name: str | None = None, row_range: RowRange | None = None) -> Iterator[RawRow]:
    """The rows of the file at `path`; `name` (default: the path) decides the format and appears in errors.
    `row_range`: only the rows of that part of the file (`row_ranges`)."""
    name = name or str(path)
    kind, compression = file_kind(name)
    if kind == "parquet":
        yield from _parquet_rows(path, name, row_range)
        return
    if row_range is not None:
        with open(path, "rb") as handle:
            handle.seek(row_range.start)
            part = io.BytesIO(handle.read(row_range.end - row_range.start))  # a range's bytes, not the file's
        yield from _jsonl_rows(part, row_range.first_row)
        return
    try:
        with _open_decompressed(path, compression) as stream:
            if kind == "json" and _first_byte(stream) == b"[":
                yield from _json_array_rows(stream, name)
                return
            rows = _jsonl_rows(stream)
            first = next(rows, None)
            # A `.json` file that is not an array is JSON Lines (as Hugging Face exports are) or one pretty-printed
            # object (one conversation), which read as lines would turn into a quarantined row per line.
            if kind == "json" and first is not None and first.reason == "invalid_json":
                yield _single_object_row(path, name, compression, first.detail)
                return
            if first is not None:
                yield first
                yield from rows
    except _DAMAGED_STREAM as exc:
        if compression is None:
            raise
        # A file cut short or not compressed at all: its rows before the damage count, the file is named unreadable.
        raise FileFormatError(f"{name}: damaged {compression} stream: {type(exc).__name__}: {exc}") from exc


def _single_object_row(path: Path, name: str, compression: str | None, line_error: str) -> RawRow:
    """The one row of a `.json` file holding a single JSON object (read whole: such a file is one row); a file that is
    not one object either raises `FileFormatError`."""
    with _open_decompressed(path, compression) as stream:
        data = stream.read()
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FileFormatError(
            f"{name}: neither a JSON array, JSON Lines nor one JSON object (as lines: {line_error}; whole: {exc})"
        ) from exc
    if not isinstance(value, dict):
        raise FileFormatError(f"{name}: neither a JSON array, JSON Lines nor one JSON object")
    return RawRow(0, value=value)


# What a damaged compressed stream raises while it is read: cut short, a bad header, corrupt data.
_DAMAGED_STREAM = (EOFError, gzip.BadGzipFile, zlib.error, zstandard.ZstdError)


def _open_decompressed(path: Path, compression: str | None) -> BinaryIO:
    if compression == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "zstd":
        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


def _first_byte(stream: BinaryIO) -> bytes:
    """The first non-whitespace byte, consuming only the whitespace before it."""
    while True:
        head = stream.peek(64)
        if not head:
            return b""
        stripped = head.lstrip()
        if stripped:
            return stripped[:1]
        stream.read(len(head))


def _jsonl_rows(stream: BinaryIO, first_row: int = 0) -> Iterator[RawRow]:
    for index, line in enumerate(stream, first_row):
        if not line or line.isspace():  # not line.strip(): that copies every line
            continue
        try:
            yield RawRow(index, value=orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            yield _undecodable_line(index, line, exc)


def _undecodable_line(index: int, line: bytes, exc: orjson.JSONDecodeError) -> RawRow:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as bad:
        raw = line[:_RAW_EXCERPT_BYTES].decode("utf-8", errors="replace")
        return RawRow(index, reason="invalid_utf8", detail=f"line {index + 1}: {bad}", raw=raw)
    # orjson refuses escaped unpaired surrogates ("\udc80"); the stdlib parser accepts them, which tells
    # a Unicode problem apart from broken JSON.
    try:
        value = json.loads(text)
    except ValueError:
        return RawRow(index, reason="invalid_json", detail=f"line {index + 1}: {exc}", raw=text[:_RAW_EXCERPT_BYTES])
    return _checked_unicode(index, value)


def _checked_unicode(index: int, value: Any) -> RawRow:
    bad = first_unencodable(value)
    if bad is None:
        return RawRow(index, value=value)
    return RawRow(
        index,
        reason="invalid_utf8",
        detail=f"row {index}: text {bad!r} is not valid UTF-8",
        raw=json.dumps(value)[:_RAW_EXCERPT_BYTES],
    )


def first_unencodable(value: Any) -> str | None:
    """The first string in `value` that cannot be encoded as UTF-8 (an unpaired surrogate), if any."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return value[max(exc.start - 10, 0) : exc.end + 10]
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        found = first_unencodable(item)
        if found is not None:
            return found
    return None


def _json_array_rows(stream: BinaryIO, name: str) -> Iterator[RawRow]:
    """Elements of a top-level JSON array, decoded one at a time from a sliding text window.

    Invalid UTF-8 bytes are decoded with `surrogateescape`, so they surface as unpaired surrogates in
    the element that holds them: that element is quarantined, the rest of the file still reads.
    """
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    buffer, position, eof = "", 0, False

    def refill() -> None:
        nonlocal buffer, position, eof
        chunk = stream.read(_CHUNK_CHARS)
        eof = not chunk
        buffer = buffer[position:] + text.decode(chunk, final=eof)
        position = 0

    def skip_whitespace() -> str:
        nonlocal position
        while True:
            position = _WHITESPACE.match(buffer, position).end()
            if position < len(buffer) or eof:
                return buffer[position : position + 1]
            refill()

    refill()
    if skip_whitespace() != "[":
        raise FileFormatError(f"{name}: expected a JSON array")
    position += 1
    index = 0
    if skip_whitespace() == "]":
        position += 1
    else:
        while True:
            try:
                value, end = decoder.raw_decode(buffer, position)
                complete = end < len(buffer) or eof  # a number cut at the window's end would parse short
            except json.JSONDecodeError as exc:
                if eof or not _may_be_cut_short(exc, len(buffer)):
                    raise FileFormatError(f"{name}: element {index} is not valid JSON ({exc.msg})") from exc
                complete = False
            if not complete:
                refill()
                continue
            yield _checked_unicode(index, value)
            index += 1
            position = end
            separator = skip_whitespace()
            position += 1
            if separator == "]":
                break
            if separator != ",":
                raise FileFormatError(f"{name}: expected ',' or ']' after element {index - 1}, found {separator!r}")
            skip_whitespace()
    if skip_whitespace():
        raise FileFormatError(f"{name}: unexpected data after the closing ']'")


def _may_be_cut_short(exc: json.JSONDecodeError, window_end: int) -> bool:
    """Whether a decode error could come from the window ending mid-element rather than bad JSON.

    Errors from a cut element sit at the window's end, except an unterminated string, which is
    reported where the string starts. Anything else is broken JSON, reported without reading on.
    """
    return exc.msg.startswith("Unterminated string") or exc.pos >= window_end - 16


def _parquet_rows(path: Path, name: str, row_range: RowRange | None = None) -> Iterator[RawRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FileFormatError(f"{name}: not a readable Parquet file ({exc})") from exc
    groups = range(row_range.start, row_range.end) if row_range is not None else None
    index = row_range.first_row if row_range is not None else 0
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=groups):
        try:
            rows = batch.to_pylist()
        except UnicodeDecodeError:
            # Arrow does not validate strings on read; convert row by row to find the bad ones.
            for offset in range(batch.num_rows):
                yield _parquet_row(batch.slice(offset, 1), index + offset)
        else:
            for offset, value in enumerate(rows):
                yield RawRow(index + offset, value=value)
        index += batch.num_rows


def _parquet_row(single_row_batch: Any, index: int) -> RawRow:
    try:
        return RawRow(index, value=single_row_batch.to_pylist()[0])
    except UnicodeDecodeError as exc:
        return RawRow(index, reason="invalid_utf8", detail=f"row {index}: {exc}")
