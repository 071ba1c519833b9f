"""What the ingest stage publishes (`raw_prompts/`), and reading its manifest back.

raw_prompts/prompts.jsonl.zst      one normalized row per line: source, source_file, source_row,
                                   format, source_id, messages, extra
raw_prompts/quarantine.jsonl.zst   one rejected row per line: reason, detail, id, provenance, raw excerpt
raw_prompts/_manifest.json         `RawPromptsManifest`, written last
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.ingest.quarantine import SourceCounts
from dagster_project.store import layout
from dagster_project.store.manifest import StageManifest, StoredObject, read_stage_manifest
from dagster_project.store.storage import Store

PROMPTS_KEY = f"{layout.RAW_PROMPTS}/prompts.jsonl.zst"
QUARANTINE_KEY = f"{layout.RAW_PROMPTS}/quarantine.jsonl.zst"


@dataclass(frozen=True)
class IngestedFile:
    uri: str
    source: str
    format: str
    rows: int
    kept: int
    quarantined: int


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
