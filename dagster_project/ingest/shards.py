"""What the ingest stage publishes (`raw_prompts/`), and reading it back.

* `raw_prompts/prompts.jsonl.zst`: one `PromptRow` per line, the snapshot the conversations stage reads;
* `raw_prompts/quarantine.jsonl.zst`: one rejected row per line (reason, detail, id, provenance, raw excerpt);
* `raw_prompts/_manifest.json`: the `RawPromptsManifest`, written last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagster_project.ingest.quarantine import SourceCounts
from dagster_project.store import layout
from dagster_project.store.dataclass_json import from_dict
from dagster_project.store.manifest import StageManifest, StoredObject, read_stage_manifest
from dagster_project.store.storage import Store

PROMPTS_KEY = f"{layout.RAW_PROMPTS}/prompts.jsonl.zst"
QUARANTINE_KEY = f"{layout.RAW_PROMPTS}/quarantine.jsonl.zst"


@dataclass  # not frozen: rows are built by the million, and a frozen dataclass is slower to build
class PromptRow:
    """One accepted source row: its messages normalized to {role, content}, and where it came from."""

    source: str
    source_file: str
    source_row: int
    format: str
    source_id: str | None
    messages: list[dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)  # the source's own fields the format does not use
    tools: list[dict[str, Any]] | None = None  # the row's tool definitions, in OpenAI's form


@dataclass(frozen=True)
class IngestedFile:
    uri: str
    source: str
    format: str
    rows: int
    kept: int
    quarantined: int
    note: str = ""  # why it was skipped, stopped early, or had every row quarantined


@dataclass(frozen=True, kw_only=True)
class RawPromptsManifest(StageManifest):
    """Every input row is accepted or quarantined: input_rows = accepted + quarantined, per source too."""

    stage: str = layout.RAW_PROMPTS
    input_rows: int
    accepted: int
    quarantined: int
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, SourceCounts] = field(default_factory=dict)
    files: list[IngestedFile] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    format: str = ""
    seconds: float = 0.0
    objects: tuple[StoredObject, ...] = ()


def read_raw_prompts_manifest(store: Store) -> RawPromptsManifest | None:
    return read_stage_manifest(store, layout.RAW_PROMPTS, RawPromptsManifest)


def prompt_row(record: dict[str, Any]) -> PromptRow:
    """One parsed line of the snapshot."""
    try:
        return PromptRow(**record)  # the snapshot of this version: a million rows, no field-by-field reading
    except TypeError:  # a snapshot written by another version: fields added or missing
        return from_dict(PromptRow, record)
