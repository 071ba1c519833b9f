"""Stage 1 (`raw_prompts`): read every source row, normalize it to messages, or quarantine it.

Rows are streamed from each file (see `readers`), the file's format is detected from its first rows
(or forced), and each row becomes either a snapshot record (normalized messages + provenance) or a
quarantine record with a reason code (`quarantine.REASONS`). The rules of this stage depend on the row
alone (`formats.parse_row`); those that depend on the multi-turn policy or on other rows (token
budget, duplicates, ids) belong to stage 2 (`prepare`), which reads this snapshot, so changing the
policy never re-reads the sources.

What it publishes, and the manifest that accounts for every row, are described in `ingest.shards`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any

from dagster_project.ingest.formats import AUTO, FORMATS, ID_FIELDS, detect_format, parse_row, source_id
from dagster_project.ingest.quarantine import Accounting, Rejected, quarantine_record
from dagster_project.ingest.readers import FileFormatError, RawRow, iter_rows
from dagster_project.ingest.shards import PROMPTS_KEY, QUARANTINE_KEY, IngestedFile, PromptRow, RawPromptsManifest
from dagster_project.ingest.sources import SourceFile, local_copy, resolve_sources
from dagster_project.store import layout
from dagster_project.store.jsonl import JsonlZstWriter
from dagster_project.store.manifest import StoredObject, put_object, write_stage_manifest
from dagster_project.store.storage import Store

STAGE = "ingest"
DETECTION_ROWS = 200
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
    work_dir: Path,
    s3_client: Callable[[], Any] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> IngestResult:
    """Normalize every row of `files` into `prompts` or `quarantine`; return the accounting."""
    if fmt != AUTO and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose auto or one of {', '.join(FORMATS)}")
    started = time.perf_counter()
    result = IngestResult(Accounting())
    for file in files:
        before = (result.accounting.rows, result.accounting.kept)
        with local_copy(file, work_dir, s3_client) as path:
            file_format = _ingest_file(file, path, fmt, prompts, quarantine, result.accounting)
        rows, kept = result.accounting.rows - before[0], result.accounting.kept - before[1]
        ingested = IngestedFile(file.uri, file.source, file_format, rows=rows, kept=kept, quarantined=rows - kept)
        result.files.append(ingested)
        log(f"{file.uri}: {file_format}, {ingested.rows} rows, {ingested.quarantined} quarantined")
    result.seconds = time.perf_counter() - started
    return result


def _ingest_file(
    file: SourceFile, path: Path, fmt: str, prompts: JsonlZstWriter, quarantine: JsonlZstWriter, accounting: Accounting
) -> str:
    rows = iter_rows(path, file.uri)
    head = list(islice(rows, DETECTION_ROWS))
    parsed = [raw.value for raw in head if raw.reason is None]
    file_format = fmt if fmt != AUTO else detect_format(parsed)
    # Undecodable rows say nothing about the format; a file that starts with many of them still
    # needs its readable rows quarantined with a reason rather than guessed at.
    undetectable = f"the file's first {len(head)} rows hold no readable row to detect its format from"
    if file_format is None and parsed:
        keys = sorted({key for value in parsed if isinstance(value, dict) for key in value})[:20]
        raise FileFormatError(
            f"{file.uri}: cannot tell the format from its first {len(head)} rows (keys {keys}); "
            f"set the format to one of {', '.join(FORMATS)}"
        )
    for raw in chain(head, rows):
        where = {"source": file.source, "source_file": file.uri, "source_row": raw.row}
        try:
            if raw.reason is not None:
                raise Rejected(raw.reason, raw.detail)
            if file_format is None:
                raise Rejected("unrecognized_format", undetectable)
            row = parse_row(raw.value, file_format)
        except Rejected as rejected:
            accounting.reject(file.source, rejected.reason)
            quarantine.write(
                quarantine_record(
                    stage=STAGE, reason=rejected.reason, detail=rejected.detail, **where, **_evidence(raw)
                )
            )
            continue
        accounting.keep(file.source)
        prompts.write(
            PromptRow(**where, format=file_format, source_id=row.source_id, messages=row.messages, extra=row.extra)
        )
    return file_format or "unknown"


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
    work_dir: Path,
    s3_client: Callable[[], Any] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> RawPromptsManifest:
    """Ingest `sources` and publish the snapshot, the quarantine and the manifest; return the manifest."""
    files = resolve_sources(sources, s3_client)
    staging = work_dir / layout.RAW_PROMPTS
    with (
        JsonlZstWriter(staging / "prompts.jsonl.zst") as prompts,
        JsonlZstWriter(staging / "quarantine.jsonl.zst") as quarantine,
    ):
        result = ingest_files(files, prompts, quarantine, fmt=fmt, work_dir=work_dir, s3_client=s3_client, log=log)
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
    uploaded = put_object(store, key, path)
    path.unlink()
    return uploaded
