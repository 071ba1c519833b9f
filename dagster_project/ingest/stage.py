"""Stage 1 (`raw_prompts`): read every source row, normalize it to messages, or quarantine it.

Rows are streamed from each file (see `readers`). **The format is decided per file**: the source's own
(`NAME@FORMAT=URI`), else the run's `format` config when it is not `auto`, else detected from the file's
first rows, so one folder may mix ShareGPT, OpenAI and Alpaca files. Each row becomes either a snapshot
record (normalized messages + provenance) or a quarantine record with a reason code
(`quarantine.REASONS`). The rules of this stage depend on the row alone (`formats.parse_row`); those that
depend on the multi-turn policy or on other rows (token budget, duplicates, ids) belong to stage 2
(`prepare`), which reads this snapshot, so changing the policy never re-reads the sources.

No file stops the others: a metadata file (`dataset_info.json`, a README) is skipped with a notice and
listed in the manifest; a file whose format cannot be told has each row quarantined (`unrecognized_format`,
saying how to set it); a file that cannot be split into rows (a JSON array that does not close, a corrupt
Parquet footer, a `.gz`/`.zst` cut short) keeps the rows read before the break and adds one `unreadable_file`
record for the rest. No row costs more memory than `max_line_bytes` (`readers.MAX_LINE_BYTES` by default): a
longer line is skipped unread (`line_too_long`), whatever it inflates from.

What it publishes, and the manifest that accounts for every row, are described in `ingest.shards`.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from dagster_project.ingest.formats import (
    AUTO,
    FORMATS,
    ID_FIELDS,
    QUARANTINE_CONTROL_TOKENS,
    ControlTokenPolicy,
    detect_format,
    parse_row,
    source_id,
)
from dagster_project.ingest.quarantine import Accounting, Rejected, quarantine_record
from dagster_project.ingest.readers import (
    MAX_LINE_BYTES,
    FileFormatError,
    RawRow,
    RowRange,
    iter_rows,
    row_ranges,
    splits_into_ranges,
)
from dagster_project.ingest.shards import PROMPTS_KEY, QUARANTINE_KEY, IngestedFile, PromptRow, RawPromptsManifest
from dagster_project.ingest.sources import SourceError, SourceFile, local_copy, resolve_sources
from dagster_project.shown_text import shown
from dagster_project.store import layout
from dagster_project.store.jsonl import JsonlZstWriter
from dagster_project.store.manifest import StoredObject, put_object, write_stage_manifest
from dagster_project.store.storage import Store
from dagster_project.workers import WORKERS, cycle_collector_paused, worker_processes

STAGE = "ingest"
DETECTION_ROWS = 200
# Files are read side by side in the worker processes (`workers`) once the local input is this large (a smaller
# input would spend more on starting the processes than it saves).
PARALLEL_MIN_BYTES = 16 << 20
# A plain JSON Lines file longer than this, or a Parquet file of several row groups holding more data, is read in
# ranges of about this size side by side (`readers.row_ranges`): one large file keeps every worker busy, and the
# workers end together instead of one reading a last file alone.
RANGE_BYTES = 8 << 20
# Parts (files, or ranges of one) handed to the workers ahead of the one being appended: a worker that finishes
# a part starts the next one while a large one before it is still being read (appending stays in order). A part
# waits on disk, compressed, until it is appended; a file holds its local copy (an S3 file's download) until its
# last part is, so this also bounds the disk they use.
PARTS_AHEAD = 4 * WORKERS
_PARTS = "ingest_parts"
_ID_IN_TEXT = re.compile(rf'"(?:{"|".join(ID_FIELDS)})"\s*:\s*"([^"\\]{{1,200}})"')


@dataclass
class IngestResult:
    accounting: Accounting
    files: list[IngestedFile] = field(default_factory=list)
    seconds: float = 0.0


def ingest_files(
    files: list[SourceFile],
    prompts: JsonlZstWriter,
    quarantine: JsonlZstWriter,
    *,
    fmt: str = AUTO,
    control_tokens: ControlTokenPolicy = QUARANTINE_CONTROL_TOKENS,
    work_dir: Path,
    s3_client: Callable[[], Any] | None = None,
    log: Callable[[str], None] = lambda _: None,
    parallel_min_bytes: int = PARALLEL_MIN_BYTES,
    range_bytes: int = RANGE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> IngestResult:
    """Normalize every row of `files` into `prompts` or `quarantine`; return the accounting.

    Files are independent, and so are the ranges of a large file (`readers.row_ranges`). So when there are several
    files or such a file, and their local bytes reach `parallel_min_bytes`, each file or range is read in a worker
    process (`workers.WORKERS` at a time) into its own part files, which are appended to `prompts` and `quarantine`
    in order: the same records in the same order as one process writes."""
    if fmt != AUTO and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose auto or one of {', '.join(FORMATS)}")
    if max_line_bytes < 1:
        raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
    started = time.perf_counter()
    result = IngestResult(Accounting())
    readable = [file for file in files if file.skip is None]
    local = [file for file in readable if not file.uri.startswith("s3://")]
    splits = any(splits_into_ranges(Path(file.uri), file.uri, range_bytes) for file in local)
    local_bytes = sum(Path(file.uri).stat().st_size for file in local)
    parallel = (len(readable) > 1 or splits) and local_bytes >= parallel_min_bytes
    appender = _Appender(result, prompts, quarantine, log)
    with ExitStack() as stack:
        pool = stack.enter_context(worker_processes()) if parallel else None
        running: deque[_Part] = deque()

        def make_room() -> None:
            while len(running) >= (PARTS_AHEAD if pool else 1):
                appender.append(running.popleft())

        for index, file in enumerate(files):
            make_room()  # before the file's copy is made
            reading = _Reading(file)
            if file.skip is not None:
                running.append(_Part(reading, None, last=True))
                continue
            path = reading.copy.enter_context(local_copy(file, work_dir, s3_client))
            rule = (control_tokens.for_source(file.source), control_tokens.tokens)
            file_format, ranges = _ranges(file, path, file.format or fmt, range_bytes if pool else None, max_line_bytes)
            for number, row_range in enumerate(ranges):
                make_room()
                part = work_dir / _PARTS / f"{index:05d}-{number:05d}"
                job = (file, file_format, rule, path, part, row_range, max_line_bytes)
                running.append(_Part(reading, pool.submit(_ingest_file, *job) if pool else _ingest_file(*job)))
            running[-1].last = True
        while running:
            appender.append(running.popleft())
    if (work_dir / _PARTS).is_dir():
        (work_dir / _PARTS).rmdir()
    result.seconds = time.perf_counter() - started
    return result


def _ranges(
    file: SourceFile, path: Path, fmt: str, range_bytes: int | None, max_line_bytes: int
) -> tuple[str, Iterable[RowRange | None]]:
    """The format to read the file at `path` with, and its ranges (None: the whole file). A file that
    `readers.splits_into_ranges` accepts is read in ranges when its format is known: set, or detected here from
    its first rows as reading it whole would (one whose format cannot be told is read whole, its rows quarantined)."""
    if range_bytes is None or not splits_into_ranges(path, file.uri, range_bytes):
        return fmt, [None]
    if fmt == AUTO:
        head = islice(iter_rows(path, file.uri, max_line_bytes=max_line_bytes), DETECTION_ROWS)
        detected = detect_format([raw.value for raw in head if raw.reason is None])
        if detected is None:
            return fmt, [None]
        fmt = detected
    return fmt, row_ranges(path, file.uri, range_bytes)


@dataclass
class _FilePart:
    """One file, or a range of it, read into its own part files (`prompts`, `quarantine`), with its accounting."""

    accounting: Accounting
    format: str
    note: str
    prompts: Path
    quarantine: Path


@dataclass
class _Reading:
    """A file whose parts are being read: what they counted so far, and its local copy."""

    file: SourceFile
    copy: ExitStack = field(default_factory=ExitStack)  # removed once its last part is appended
    accounting: Accounting = field(default_factory=Accounting)


@dataclass
class _Part:
    reading: _Reading
    done: Future[_FilePart] | _FilePart | None  # None: a skipped file
    last: bool = False  # the file's last part


def _ingest_file(
    file: SourceFile,
    fmt: str,
    control_tokens: tuple[str, tuple[str, ...]],
    path: Path,
    part: Path,
    row_range: RowRange | None,
    max_line_bytes: int,
) -> _FilePart:
    """Read one file's rows (`row_range`'s only, when given) into part files under `part` (in a worker process,
    or in this one); `control_tokens`: the file's mode (`CONTROL_TOKEN_MODES`) and the model's control tokens."""
    accounting = Accounting()
    with (
        JsonlZstWriter(part / "prompts.jsonl.zst") as prompts,
        JsonlZstWriter(part / "quarantine.jsonl.zst") as quarantine,
        cycle_collector_paused(),
    ):
        file_reader = _FileIngest(file, fmt, prompts, quarantine, accounting)
        file_reader.control_tokens, file_reader.model_control_tokens = control_tokens
        file_reader.run(path, row_range, max_line_bytes)
    return _FilePart(accounting, file_reader.format, file_reader.note, prompts.path, quarantine.path)


class _Appender:
    """Appends the parts read to the stage's files in the order they were handed out, and counts each file once
    its last part is in."""

    def __init__(
        self, result: IngestResult, prompts: JsonlZstWriter, quarantine: JsonlZstWriter, log: Callable[[str], None]
    ):
        self.result, self.prompts, self.quarantine, self.log = result, prompts, quarantine, log

    def append(self, part: _Part) -> None:
        reading, file = part.reading, part.reading.file
        if part.done is None:  # a skipped file
            reading.copy.close()
            self.result.files.append(IngestedFile(file.uri, file.source, "skipped", 0, 0, 0, note=file.skip))
            self.log(shown(f"{file.uri}: skipped ({file.skip})"))  # a file's name is the data's: escaped
            return
        read = part.done.result() if isinstance(part.done, Future) else part.done
        for writer, part_path in ((self.prompts, read.prompts), (self.quarantine, read.quarantine)):
            writer.append_frames(part_path)
            part_path.unlink()
        read.prompts.parent.rmdir()
        reading.accounting.add(read.accounting)
        if not part.last:
            return
        reading.copy.close()
        self.result.accounting.add(reading.accounting)
        rows, kept = reading.accounting.rows, reading.accounting.kept
        ingested = IngestedFile(
            file.uri, file.source, read.format, rows=rows, kept=kept, quarantined=rows - kept, note=read.note
        )
        self.result.files.append(ingested)
        note = f" ({ingested.note})" if ingested.note else ""
        self.log(
            shown(f"{file.uri}: {ingested.format}, {ingested.rows} rows, {ingested.quarantined} quarantined{note}")
        )


class _FileIngest:
    """One file's rows into the snapshot or the quarantine; `format` and `note` say what was decided."""

    def __init__(
        self, file: SourceFile, fmt: str, prompts: JsonlZstWriter, quarantine: JsonlZstWriter, accounting: Accounting
    ):
        self.file, self.requested = file, fmt
        self.prompts, self.quarantine, self.accounting = prompts, quarantine, accounting
        self.format = "unknown"
        self.control_tokens = QUARANTINE_CONTROL_TOKENS.default
        self.model_control_tokens = QUARANTINE_CONTROL_TOKENS.tokens
        self.note = ""
        self.rows_read = 0
        self.kept = 0  # counted in `accounting` once the file is read: a call per row costs more than the count

    def run(self, path: Path, row_range: RowRange | None, max_line_bytes: int) -> None:
        rows = iter_rows(path, self.file.uri, row_range, max_line_bytes)
        head: list[RawRow] = []
        broken = None
        try:
            head.extend(islice(rows, DETECTION_ROWS))
        except FileFormatError as error:  # a short file that breaks: its rows before the break still count
            broken = error
        undetectable = self._decide_format(head)
        for raw in head:
            self._row(raw, undetectable)
        if broken is None:
            try:
                for raw in rows:
                    self._row(raw, undetectable)
            except FileFormatError as error:
                broken = error
        if broken is not None:
            self.note = f"unreadable after {self.rows_read} rows: {broken}"
            self._quarantine("unreadable_file", str(broken), {"source_row": -1, "id": None, "raw": None})
        if self.kept:
            self.accounting.keep(self.file.source, self.kept)

    def _decide_format(self, head: list[RawRow]) -> str:
        """Set `format` from the request or the first rows; the reason rows cannot be parsed, if so."""
        parsed = [raw.value for raw in head if raw.reason is None]
        if self.requested != AUTO:
            self.format = self.requested
            return ""
        detected = detect_format(parsed)
        if detected is not None:
            self.format = detected
            return ""
        if not parsed:
            # Undecodable rows say nothing about the format; they are quarantined with their own reasons.
            return f"the file's first {len(head)} rows hold no readable row to detect its format from"
        keys = sorted({key for value in parsed if isinstance(value, dict) for key in value})[:20]
        self.note = "format unknown: every row quarantined"
        return (
            f"cannot tell the file's format from its first {len(head)} rows (keys {keys}); set it for this source "
            f"with NAME@FORMAT=URI (or NAME@FORMAT:FIELD=URI to name the main field), FORMAT one of "
            + ", ".join(FORMATS)
        )

    def _row(self, raw: RawRow, undetectable: str) -> None:
        self.rows_read += 1
        try:
            if raw.reason is not None:
                raise Rejected(raw.reason, raw.detail)
            if undetectable:
                raise Rejected("unrecognized_format", undetectable)
            row = parse_row(raw.value, self.format, self.file.field, self.control_tokens, self.model_control_tokens)
        except Rejected as rejected:
            self._quarantine(rejected.reason, rejected.detail, {"source_row": raw.row, **_evidence(raw)})
            return
        self.kept += 1
        self.prompts.write(
            PromptRow(
                source=self.file.source,
                source_file=self.file.uri,
                source_row=raw.row,
                format=self.format,
                source_id=row.source_id,
                messages=row.messages,
                extra=row.extra,
                tools=row.tools,
            )
        )

    def _quarantine(self, reason: str, detail: str, evidence: dict[str, Any]) -> None:
        self.accounting.reject(self.file.source, reason)
        self.quarantine.write(
            quarantine_record(
                stage=STAGE,
                reason=reason,
                detail=detail,
                source=self.file.source,
                source_file=self.file.uri,
                **evidence,
            )
        )


def _evidence(raw: RawRow) -> dict[str, Any]:
    """The id (when the row has one) and an excerpt of a rejected row, to find it again."""
    if raw.reason is not None:
        found = _ID_IN_TEXT.search(raw.raw or "")
        return {"id": found.group(1) if found else None, "raw": raw.raw}
    row_id = source_id(raw.value) if isinstance(raw.value, dict) else None
    return {"id": row_id, "raw": json.dumps(raw.value, ensure_ascii=False, default=str)}


def ingest_to_store(
    store: Store,
    sources: list[str],
    *,
    fmt: str = AUTO,
    control_tokens: ControlTokenPolicy = QUARANTINE_CONTROL_TOKENS,
    work_dir: Path,
    s3_client: Callable[[], Any] | None = None,
    log: Callable[[str], None] = lambda _: None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> RawPromptsManifest:
    """Ingest `sources` and publish the snapshot, the quarantine and the manifest; return the manifest."""
    files = resolve_sources(sources, s3_client)
    unknown = sorted(control_tokens.literal_sources - {file.source for file in files})
    if unknown:
        raise SourceError(f"literal control-token sources {unknown} name no source of this run")
    staging = work_dir / layout.RAW_PROMPTS
    with (
        JsonlZstWriter(staging / "prompts.jsonl.zst") as prompts,
        JsonlZstWriter(staging / "quarantine.jsonl.zst") as quarantine,
    ):
        result = ingest_files(
            files,
            prompts,
            quarantine,
            fmt=fmt,
            control_tokens=control_tokens,
            work_dir=work_dir,
            s3_client=s3_client,
            log=log,
            max_line_bytes=max_line_bytes,
        )
    # Withdraw the old manifest first: a reader never pairs it with the new objects.
    store.delete(layout.stage_manifest_key(layout.RAW_PROMPTS))
    objects = (_upload(store, PROMPTS_KEY, prompts.path), _upload(store, QUARANTINE_KEY, quarantine.path))
    accounting = result.accounting
    return write_stage_manifest(
        store,
        RawPromptsManifest(
            input_rows=accounting.rows,
            accepted=accounting.kept,
            quarantined=accounting.quarantined,
            quarantined_by_reason=dict(sorted(accounting.by_reason.items())),
            by_source=dict(sorted(accounting.by_source.items())),
            files=result.files,
            sources=sources,
            format=fmt,
            seconds=result.seconds,
            objects=objects,
        ),
    )


def _upload(store: Store, key: str, path: Path) -> StoredObject:
    return put_object(store, key, path, consume=True)  # a local store takes the file by rename
