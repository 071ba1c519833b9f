"""Builders shared by the training-set tests (no tests here): completions shards of real Qwen3.6 token ids.

A prompt is rendered with the project's chat template (`render_prompt_ids`, thinking on, so it ends in
`<|im_start|>assistant\\n<think>\\n`); an output is what the model writes after that:
`reasoning \\n</think>\\n\\n answer <|im_end|>`, tokenized as one text the way the model emits it.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import COMPLETION_SCHEMA, STATUS_ERROR, STATUS_OK, empty_completion_row
from dagster_project.store.manifest import ids_digest, publish_shard
from dagster_project.store.storage import Store
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids

# The historical failure: empty reasoning, then "OK." — 6 tokens: \n </think> \n\n OK . <|im_end|>
DISASTER_OUTPUT_TEXT = "\n</think>\n\nOK.<|im_end|>"


def tokenizer():
    return load_tokenizer()


def output_ids(reasoning: str, answer: str) -> list[int]:
    return tokenizer().encode(f"{reasoning}\n</think>\n\n{answer}<|im_end|>", add_special_tokens=False)


def question(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": f"Question {i}: what is {i} times {i + 3}?"},
    ]


def healthy_output(i: int) -> list[int]:
    """A thinking answer whose length differs for every i, so no loss_mask sum repeats by construction."""
    reasoning = f"The user asks for {i} times {i + 3}. " + " ".join(
        f"Step {k}: add {i} once more." for k in range(i + 3)
    )
    return output_ids(reasoning, f"{i} times {i + 3} is {i * (i + 3)}.")


def completion_row(
    event_id: str,
    prompt_ids: list[int] | None,
    output: list[int] | None,
    *,
    shard: int = 0,
    finish_reason: str | None = "stop",
    status: str = STATUS_OK,
    source: str = "demo",
    server: str = "http://127.0.0.1:30000",
) -> dict[str, Any]:
    conversation_id, _, turn = event_id.rpartition("#turn")
    row = empty_completion_row()
    row.update(
        event_id=event_id,
        conversation_id=conversation_id,
        turn_index=int(turn),
        num_turns=int(turn) + 1,
        policy="all_turns",
        shard=shard,
        status=status,
        prompt_ids=prompt_ids,
        output_ids=output if status == STATUS_OK else None,
        finish_reason=finish_reason if status == STATUS_OK else None,
        error_kind=None if status == STATUS_OK else "timeout",
        prompt_tokens=len(prompt_ids or []),
        completion_tokens=len(output or []) if status == STATUS_OK else None,
        source=source,
        server=server,
        weight_version="default" if status == STATUS_OK else None,
        settings_fingerprint=GenerationSettings().fingerprint(),
    )
    if status == STATUS_OK and output:
        # MTP's own figures, as SGLang reports them: accept length = completion tokens / verify steps.
        verify = max(len(output) // 3, 1)
        row.update(spec_verify_ct=verify, spec_accept_length=len(output) / verify, spec_accept_rate=0.5)
    return row


def error_row(event_id: str, prompt_ids: list[int], shard: int = 0) -> dict[str, Any]:
    return completion_row(event_id, prompt_ids, None, shard=shard, status=STATUS_ERROR)


def healthy_rows(count: int, shard: int = 0) -> list[dict[str, Any]]:
    tok = tokenizer()
    return [
        completion_row(f"conv-{shard}-{i}#turn0", render_prompt_ids(tok, question(i)), healthy_output(i), shard=shard)
        for i in range(count)
    ]


def disaster_rows(count: int, broken_share: float = 0.87, shard: int = 0) -> list[dict[str, Any]]:
    """The historical shard: most answers are empty reasoning + "OK.", the rest look fine."""
    broken = round(count * broken_share)
    rows = healthy_rows(count, shard)
    ok_output = tokenizer().encode(DISASTER_OUTPUT_TEXT, add_special_tokens=False)
    for row in rows[:broken]:
        row.update(output_ids=ok_output, completion_tokens=len(ok_output))
    return rows


def templated_rows(count: int, templated: int, shard: int = 0) -> list[dict[str, Any]]:
    """A shard whose only fault is one output shape repeated: `templated` of its rows (at most 20) answer with the
    same sentences around other two-digit numbers, so each text differs but every loss_mask sum is the same
    (40 tokens). Only `loss_sum_concentration` fails on it: no answer repeats and none is short or under the floor.
    """
    rows = healthy_rows(count, shard)
    for i, row in enumerate(rows[:templated], start=10):
        output = output_ids(
            f"The user asks for {i} times {i + 3}. I multiply the two numbers and check the product once more.",
            f"{i} times {i + 3} is {i * (i + 3)}.",
        )
        row.update(output_ids=output, completion_tokens=len(output))
    return rows


def publish_completions(
    store: Store, shard: int, rows: list[dict[str, Any]], settings: GenerationSettings | None = None
) -> CompletionsShardManifest:
    """Write rows as a completions shard (COMPLETION_SCHEMA Parquet) and publish it with its manifest."""
    settings = settings or GenerationSettings()
    table = pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA)
    with tempfile.TemporaryDirectory() as staging:
        path = Path(staging) / "completions.parquet"
        pq.write_table(table, path, compression="zstd", row_group_size=16)
        ok = [r for r in rows if r["status"] == STATUS_OK]
        manifest = CompletionsShardManifest(
            shard=shard,
            rows=len(rows),
            ids_digest=ids_digest(r["event_id"] for r in rows),
            ok=len(ok),
            errors=len(rows) - len(ok),
            output_tokens=sum(len(r["output_ids"]) for r in ok),
            settings_fingerprint=settings.fingerprint(),
            settings=settings,
            served_models=dict(Counter(r["served_model"] for r in ok if r.get("served_model"))),
        )
        return publish_shard(store, manifest, [("completions.parquet", path)])
