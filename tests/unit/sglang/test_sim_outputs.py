"""The simulator's output model, without a server: acceptance that degrades with context and batch, and answers
written as the model writes them."""

from __future__ import annotations

import json

import pytest

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.model_identity import forced_token_params
from dagster_project.sglang.sim.config import SimConfig, load_sim_vocab
from dagster_project.sglang.sim.outputs import AcceptModel, OutputModel
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids
from dagster_project.tool_calls import parse_tool_calls
from tests.support.chat_templates import official_prompt_ids, official_template
from tests.support.model_families import QWEN3, family_tokenizer
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


def _rerender(
    tok, template: str, messages: list[dict], text: str, *, enable_thinking: bool, tools: list[dict] | None = None
) -> list[int]:
    """The official template's ids for `messages` plus the simulated answer `text` as an assistant message, its
    tool calls parsed into `tool_calls`."""
    reasoning, _, content = text.rpartition("\n</think>\n\n")
    parsed = parse_tool_calls(content)
    assert parsed.malformed == 0
    reply: dict = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        reply["tool_calls"] = parsed.calls
    if enable_thinking:
        reply["reasoning_content"] = reasoning
    rendered = tok.apply_chat_template(
        [*messages, reply], tools=tools, chat_template=template, tokenize=False, enable_thinking=enable_thinking
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


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_tool_calls_are_the_official_templates_rendering_of_the_parsed_call():
    """With tools declared, a share of answers are `<tool_call>`s naming a declared tool; a well-formed one, parsed
    into `tool_calls` and rendered by the official template, is the row's own ids; the malformed ones are counted."""
    tok = tokenizer()
    template = official_template()
    model = OutputModel(
        SimConfig(output_len="uniform:1:300", tool_call_share=0.5, malformed_tool_call_share=0.25), load_sim_vocab()
    )
    messages = [{"role": "user", "content": "Is it raining in Lyon?"}]
    tools = [WEATHER, CLOCK]
    prompt = official_prompt_ids(tok, template, messages, tools=tools)
    counts = {"text": 0, "call": 0, "malformed": 0, "text_before_call": 0, "typed_arguments": 0}
    for sample in range(60):
        answer = model.plan(prompt, "weather", {}, 1024, sample)
        text = tok.decode(answer.output_ids[:-1])
        assert text == answer.text == model.vocab.decode(answer.output_ids[:-1])
        parsed = parse_tool_calls(text.rpartition("\n</think>\n\n")[2])
        if parsed.malformed:
            counts["malformed"] += 1
            continue
        counts["call" if parsed.calls else "text"] += 1
        counts["text_before_call"] += bool(parsed.calls and parsed.content)
        assert {call["function"]["name"] for call in parsed.calls} <= {"get_weather", "get_time"}
        expected = _rerender(tok, template, messages, text, enable_thinking=True, tools=tools)
        assert prompt + answer.output_ids + tok.encode("\n") == expected, f"sample {sample}: {text!r}"
        # The arguments as the JSON values they are (numbers, booleans, arrays, objects): the template's `tojson`
        # renders them back to the same ids.
        typed = _typed_calls(parsed.calls)
        counts["typed_arguments"] += sum(
            not isinstance(value, str) for call in typed for value in call["function"]["arguments"].values()
        )
        reply = {"role": "assistant", "reasoning_content": text.rpartition("\n</think>\n\n")[0]}
        reply |= {"content": parsed.content} | ({"tool_calls": typed} if typed else {})
        rendered = tok.apply_chat_template([*messages, reply], tools=tools, chat_template=template, tokenize=False)
        assert prompt + answer.output_ids + tok.encode("\n") == tok.encode(rendered, add_special_tokens=False)
    assert counts["call"] >= 10 and counts["malformed"] >= 3 and counts["text"] >= 15, counts
    assert counts["text_before_call"] >= 2 and counts["typed_arguments"] >= 5, counts
    # Without tools in the prompt, no call is ever written.
    plain = official_prompt_ids(tok, template, messages)
    assert not any("<tool_call>" in model.plan(plain, "plain", {}, 1024, sample).text for sample in range(20))


def test_a_model_whose_template_writes_calls_in_another_form_is_answered_in_text():
    """Qwen3's template declares tools in the same `<tools>` block but writes calls as JSON: the simulator, which
    writes Qwen3.6's form only, answers its tool prompts in text and says so (the gate does not judge them)."""
    name = family_tokenizer(QWEN3)
    tok = load_tokenizer(name)
    model = OutputModel(SimConfig(output_len="uniform:1:300", tool_call_share=1.0), load_sim_vocab(name))
    assert model.calls_note == (
        f"tool_call_share 1.0 ignored: the chat template of {name} writes tool calls in another form than Qwen3.6's "
        "<tool_call>, the only one the simulator writes"
    )
    messages = [{"role": "user", "content": "Is it raining in Lyon?"}]
    prompt = tok.apply_chat_template(messages, tools=[WEATHER, CLOCK], add_generation_prompt=True, tokenize=False)
    assert "<tools>" in prompt
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    assert not any("<tool_call>" in model.plan(prompt_ids, "q3", {}, 1024, sample).text for sample in range(10))


def _typed_calls(calls: list[dict]) -> list[dict]:
    """Parsed calls (their arguments as text) with each argument that is JSON of another type decoded."""

    def typed(value: str) -> object:
        try:
            return json.loads(value)
        except ValueError:
            return value

    return [
        {"type": "function", "function": {**call["function"], "arguments": {k: typed(v) for k, v in args.items()}}}
        for call in calls
        for args in [call["function"]["arguments"]]
    ]


def test_tool_call_shares_outside_zero_to_one_are_refused(capsys):
    from dagster_project.sglang.sim.command_line import parse_args

    for flag in ("--tool-call-share", "--malformed-tool-call-share"):
        with pytest.raises(SystemExit):
            parse_args([flag, "1.5"])
        assert f"{flag} is a share: between 0 and 1, got 1.5" in capsys.readouterr().err
    assert parse_args(["--tool-call-share", "0.3"]).tool_call_share == 0.3


def test_a_bad_model_writes_the_seeds_disaster_for_its_share_of_answers_after_its_onset():
    """`bad_model_share` answers are empty reasoning, "OK." and the end token (6 tokens, as the seed's rows were),
    for about that share of prompts, once `bad_model_after_answers` answers have gone by."""
    from dagster_project.sglang.sim.faults import Faults

    tok = tokenizer()
    model = OutputModel(SimConfig(), load_sim_vocab())
    prompt = render_prompt_ids(tok, [{"role": "user", "content": "hi"}])
    answer = model.plan(prompt, "hi", {}, 1024, bad=True)
    assert tok.decode(answer.output_ids) == "\n</think>\n\nOK.<|im_end|>" and len(answer.output_ids) == 6
    assert answer.finish_reason["type"] == "stop" and answer.text == "\n</think>\n\nOK."
    # The served-model probe forces one id with a logit_bias: the sampler writes it whatever the weights say, so a
    # bad model still passes the probe (its answers are what is wrong, not the model it serves).
    forced = model.plan([0], "probe", forced_token_params(model.eos), 1, bad=True)
    assert forced.output_ids == [model.eos] and forced.finish_reason["type"] == "stop"

    faults = Faults()
    faults.update({"bad_model_share": 0.3, "bad_model_after_answers": 100}, now=0.0)
    spoiled = [faults.bad_answer(model.bad_draw(f"prompt-{i}")) for i in range(1100)]
    assert not any(spoiled[:100])
    assert 250 < sum(spoiled[100:]) < 350
    with pytest.raises(ValueError, match="bad_model_share"):
        faults.update({"bad_model_share": 1.5}, now=0.0)
