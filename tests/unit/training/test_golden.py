"""Golden: a training row decodes to the chat-template render of its conversation, then the generated answer.

Conversations come from the public samples in ../shared/data (multi-turn OpenAI messages and ShareGPT),
regenerated turn by turn the way the `all_turns` policy does it: each assistant turn is one generation
event whose prompt carries the earlier answers' visible content. The "model output" of a turn is a
reasoning text, `</think>`, and the sample's own answer, as Qwen3.6 writes it after `<think>\\n`.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import render_prompt_ids, render_text, special_ids
from dagster_project.training import gates, row_gates
from dagster_project.training.shards import iter_training_batches
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.paths import require_shared
from tests.support.training_shards import completion_row, output_ids, publish_completions, tokenizer

SAMPLES_PER_SOURCE = 25


def _kto_conversations() -> list[list[dict[str, str]]]:
    records = json.loads(require_shared("data", "LLaMA-Factory", "kto_en_demo.json").read_text())
    multi_turn = [r["messages"] for r in records if len(r["messages"]) > 2]
    return multi_turn[:SAMPLES_PER_SOURCE]


def _fastchat_conversations() -> list[list[dict[str, str]]]:
    records = json.loads(require_shared("data", "FastChat", "dummy_conversation.json").read_text())
    roles = {"human": "user", "gpt": "assistant"}
    return [
        [{"role": roles[m["from"]], "content": m["value"]} for m in r["conversations"]]
        for r in records[:SAMPLES_PER_SOURCE]
    ]


def _reasoning(question: str) -> str:
    return f"The user asks: {question.strip()[:120]!r}. I recall what I know and answer directly."


def _events(conversations: list[list[dict[str, str]]]) -> tuple[list[dict], dict[str, tuple[list[dict], str, str]]]:
    """Completions rows for every assistant turn, and per event the prompt messages, reasoning and answer."""
    tok = tokenizer()
    rows, turns = [], {}
    for c, messages in enumerate(conversations):
        history: list[dict[str, str]] = []
        turn = 0
        for message in messages:
            if message["role"] != "assistant":
                history.append({"role": message["role"], "content": message["content"]})
                continue
            event_id = f"sample-{c}#turn{turn}"
            answer, reasoning = message["content"].strip(), _reasoning(history[-1]["content"])
            rows.append(completion_row(event_id, render_prompt_ids(tok, history), output_ids(reasoning, answer)))
            turns[event_id] = ([dict(m) for m in history], reasoning, answer)
            history.append({"role": "assistant", "content": answer})
            turn += 1
    return rows, turns


@pytest.mark.parametrize(
    "source", [_kto_conversations, _fastchat_conversations], ids=["kto_messages", "fastchat_sharegpt"]
)
def test_a_row_decodes_to_the_template_render_then_the_answer(source, tmp_path):
    tok = tokenizer()
    rows, turns = _events(source())
    outputs = {row["event_id"]: row["output_ids"] for row in rows}
    store = LocalStore(tmp_path / "store")
    publish_completions(store, 0, rows)
    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")

    training = [row for batch in iter_training_batches(store, 0) for row in batch.to_pylist()]
    assert len(training) == len(rows) > SAMPLES_PER_SOURCE  # multi-turn: more events than conversations
    for row in training:
        messages, reasoning, answer = turns[row["event_id"]]
        decoded = tok.decode(row["input_ids"])
        assert decoded == render_text(tok, messages, add_generation_prompt=True) + tok.decode(outputs[row["event_id"]])
        # The same row is the template's own render of the finished turn, except the "\n" the template puts
        # after <|im_end|>: the model stops at <|im_end|> and never generates it.
        finished = [*messages, {"role": "assistant", "reasoning_content": reasoning, "content": answer}]
        assert decoded + "\n" == render_text(tok, finished, add_generation_prompt=False)
        supervised = [i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        assert supervised == outputs[row["event_id"]]


def test_the_gates_pass_on_the_multi_turn_public_sample(tmp_path):
    tok = tokenizer()
    rows, _ = _events(_kto_conversations())
    store = LocalStore(tmp_path / "store")
    publish_completions(store, 0, rows)
    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    special = special_ids(tok)
    profile = gates.profile_training_batches(iter_training_batches(store, 0), special, tok.decode)
    results = gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True)
    results.append(row_gates.ids_match_completions(profile.digests, pa.Table.from_pylist(rows).to_batches()))
    assert {r.name: r.message for r in results if not r.passed} == {}
