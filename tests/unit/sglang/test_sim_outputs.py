"""The simulator's output model, without a server: acceptance that degrades with context and batch, and answers
written as the model writes them."""

from __future__ import annotations

import pytest

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.config import SimConfig, load_sim_vocab
from dagster_project.sglang.sim.outputs import AcceptModel, OutputModel
from tests.support.chat_templates import official_prompt_ids, official_template
from tests.support.training_shards import tokenizer


def test_acceptance_degrades_with_context_length():
    import random

    model = AcceptModel((0.2, 0.2, 0.2, 0.4), decay_tokens=16384, seed=0)
    short = model.draw(100, 2000, random.Random(1))
    long = model.draw(30000, 2000, random.Random(1))
    assert 2000 / short.verify > 2.5 > 2000 / long.verify > 1.2
    for draw in (short, long):
        meta = {
            "completion_tokens": 2000,
            "spec_verify_ct": draw.verify,
            "spec_num_correct_drafts": draw.correct,
            "spec_num_proposed_drafts": draw.verify * 3,
            "spec_correct_drafts_histogram": draw.histogram,
            "spec_accept_length": 2000 / draw.verify,
            "spec_accept_rate": draw.correct / (draw.verify * 3),
        }
        assert proto.check_spec_stats(meta) == []


def test_acceptance_degrades_with_batch_size():
    import random

    model = AcceptModel((0.2, 0.2, 0.2, 0.4), decay_tokens=0, seed=0, decay_batch=32)
    alone = model.draw(100, 2000, random.Random(1), batch=1)
    crowded = model.draw(100, 2000, random.Random(1), batch=65)  # halfway to no acceptance
    assert 2000 / alone.verify > 2.5 > 2000 / crowded.verify > 1.5
    assert model.draw(100, 2000, random.Random(1)).verify == alone.verify  # batch 1 is the default


def _rerender(tok, template: str, messages: list[dict], text: str, *, enable_thinking: bool) -> list[int]:
    """The official template's ids for `messages` plus the simulated answer `text` as an assistant message."""
    reasoning, _, content = text.rpartition("\n</think>\n\n")
    reply = {"role": "assistant", "content": content}
    if enable_thinking:
        reply["reasoning_content"] = reasoning
    rendered = tok.apply_chat_template(
        [*messages, reply], chat_template=template, tokenize=False, enable_thinking=enable_thinking
    )
    return tok.encode(rendered, add_special_tokens=False)


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_answers_rerender_through_the_official_template_to_their_own_ids(enable_thinking):
    """A generated row, re-rendered as a message by the official template, is the prompt and the output ids:
    words open a part without a leading space and the ids are the tokenizer's own encoding of the text."""
    tok = tokenizer()
    template = official_template()
    vocab = load_sim_vocab()
    model = OutputModel(SimConfig(output_len="uniform:1:400"), vocab)
    messages = [{"role": "user", "content": "Name three species of finch."}]
    prompt = official_prompt_ids(tok, template, messages, enable_thinking=enable_thinking)
    for sample in range(80):
        answer = model.plan(prompt, "finches", {}, 1024, sample)
        assert answer.finish_reason["type"] == "stop"
        text = tok.decode(answer.output_ids[:-1])
        assert text == answer.text
        assert not text.startswith(" ") and "\n " not in text and "> " not in text
        expected = _rerender(tok, template, messages, text, enable_thinking=enable_thinking)
        assert prompt + answer.output_ids + tok.encode("\n") == expected, f"sample {sample}: {text!r}"
