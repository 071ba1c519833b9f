"""Running both stages (ingest, prepare) on a local store and reading back every outcome."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster_project.conversations.shards import ConversationsManifest, read_conversations
from dagster_project.conversations.stage import QUARANTINE_KEY as PREPARE_QUARANTINE_KEY
from dagster_project.conversations.stage import build_conversations
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ingest.formats import QUARANTINE_CONTROL_TOKENS, ControlTokenPolicy
from dagster_project.ingest.shards import QUARANTINE_KEY as INGEST_QUARANTINE_KEY
from dagster_project.ingest.shards import RawPromptsManifest
from dagster_project.ingest.stage import ingest_to_store
from dagster_project.records import Conversation
from dagster_project.store import layout
from dagster_project.store.jsonl import read_jsonl_zst
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import load_tokenizer, tokenizer_identity


@dataclass
class Outcome:
    store: LocalStore
    raw_manifest: RawPromptsManifest
    manifest: ConversationsManifest
    conversations: list[Conversation]
    quarantined: list[dict[str, Any]]

    def by_row(self) -> dict[tuple[str, int], str]:
        """(source file, row) → "kept" or the quarantine reason; fails if a row appears twice."""
        outcomes: dict[tuple[str, int], str] = {}
        rows = [(c.source_file, c.source_row, "kept") for c in self.conversations]
        rows += [(q["source_file"], q["source_row"], q["reason"]) for q in self.quarantined]
        for source_file, source_row, outcome in rows:
            assert (source_file, source_row) not in outcomes, f"row {source_file}:{source_row} accounted twice"
            outcomes[(source_file, source_row)] = outcome
        return outcomes


def run_stages(
    root: Path,
    sources: list[str],
    *,
    policy: str = "all_turns",
    num_shards: int = 3,
    max_prompt_tokens: int = 16384,
    fmt: str = "auto",
    control_tokens: ControlTokenPolicy = QUARANTINE_CONTROL_TOKENS,
    s3_client: Callable[[], Any] | None = None,
) -> Outcome:
    store = LocalStore(root / "store")
    raw = ingest_to_store(
        store, sources, fmt=fmt, control_tokens=control_tokens, work_dir=root / "work", s3_client=s3_client
    )
    manifest = build_conversations(
        store,
        load_tokenizer=load_tokenizer,
        tokenizer=tokenizer_identity(load_tokenizer()),
        settings=GenerationSettings(policy=policy),
        num_shards=num_shards,
        work_dir=root / "work",
        max_prompt_tokens=max_prompt_tokens,
    )
    conversations = [c for shard in range(num_shards) for c in read_conversations(store, shard)]
    quarantined = [
        record
        for key in (INGEST_QUARANTINE_KEY, PREPARE_QUARANTINE_KEY)
        for record in read_jsonl_zst(store.download(key, root / "downloads" / key))
    ]
    assert manifest.num_shards == num_shards and store.exists(layout.stage_manifest_key(layout.CONVERSATIONS))
    return Outcome(store, raw, manifest, conversations, quarantined)


def questions_in_shards(root: Path, count: int = 6, num_shards: int = 2) -> LocalStore:
    """A store whose conversations are `count` one-line questions (ids c0, c1, ...) in `num_shards` shards."""
    source = root / "prompts.jsonl"
    with open(source, "w") as handle:
        for i in range(count):
            handle.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}))
            handle.write("\n")
    return run_stages(root, [str(source)], num_shards=num_shards).store
