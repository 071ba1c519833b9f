"""A conversations stage manifest as tests and benchmarks need one: the stage published, every row kept."""

from __future__ import annotations

from typing import Any

from dagster_project.conversations.shards import ConversationsManifest


def conversations_manifest(*, num_shards: int, rows: int, turns: int, **fields: Any) -> ConversationsManifest:
    """`rows` conversations, none quarantined, with `turns` assistant turns to generate; `fields` override the rest."""
    return ConversationsManifest(
        **{
            "num_shards": num_shards,
            "policy": "all_turns",
            "build_id": "b",
            "input_rows": rows,
            "rows": rows,
            "normalized": rows,
            "quarantined": 0,
            "quarantine_rate": 0.0,
            "history": "generated",
            "multi_turn": 0,
            "turns": turns,
            "ids_digest": "",
            "quarantine_rate_max": 0.01,
            "max_prompt_tokens": 8192,
            **fields,
        }
    )
