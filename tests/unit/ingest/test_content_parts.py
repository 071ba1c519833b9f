"""Reasoning, tool calls and tool results as typed content parts: one fixture per layout (tests/fixtures/
content_parts/, written here in each layout's documented shape), read row by row and as one mixed folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dagster_project.conversations.turns import prompt_messages
from dagster_project.ingest.formats import parse_row
from dagster_project.ingest.quarantine import Rejected
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids
from tests.support.chat_templates import official_prompt_ids, official_template
from tests.support.ingest_helpers import run_stages

FIXTURES = Path(__file__).parents[2] / "fixtures" / "content_parts"
WEATHER_CALL = "get_weather"


def rows(name: str) -> dict[str, dict]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    return {row["id"]: row for row in map(json.loads, lines)}


def call(city: str, call_id: str) -> dict:
    return {"type": "function", "function": {"name": WEATHER_CALL, "arguments": {"city": city}}, "id": call_id}


def result(content: str, call_id: str) -> dict:
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def made_up_id(message: dict) -> str:
    """The id ingest made up for the message's one call (the layout has none): 9 letters and digits."""
    (made,) = [call["id"] for call in message["tool_calls"]]
    assert re.fullmatch("[A-Za-z0-9]{9}", made)
    return made


def reason_of(row: dict) -> tuple[str, str]:
    with pytest.raises(Rejected) as rejected:
        parse_row(row, "openai")
    return rejected.value.reason, rejected.value.detail


def test_llamafactory_parts_reasoning_calls_and_tools_as_a_json_string() -> None:
    layout = rows("llamafactory_parts.jsonl")
    assert parse_row(layout["lf-reasoning"], "openai").messages == [
        {"role": "user", "content": "What is 17 times 3?"},
        {"role": "assistant", "content": "It is 51.", "reasoning_content": "17 * 3 = 51."},
    ]
    parsed = parse_row(layout["lf-tools"], "openai")
    made = made_up_id(parsed.messages[2])
    assert parsed.messages == [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "How warm is it in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should look up the weather in Oslo.",
            "tool_calls": [call("Oslo", made)],
        },
        result('{"temp_c": 4}', made),
        {"role": "assistant", "content": "It is 4 °C in Oslo."},
    ]
    assert [tool["function"]["name"] for tool in parsed.tools] == [WEATHER_CALL]
    assert reason_of(layout["lf-unknown"]) == (
        "unknown_part",
        "message 1 (assistant) part 0 has the unknown type 'citation'",
    )


def test_openai_parts_chat_completions_and_responses_items() -> None:
    layout = rows("openai_parts.jsonl")
    assert parse_row(layout["oa-chat"], "openai").messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Lima?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call the tool.",
            "tool_calls": [call("Lima", "call_1")],
        },
        result('{"temp_c": 19}', "call_1"),
        {"role": "assistant", "content": "19 °C."},
    ]
    assert parse_row(layout["oa-responses"], "openai").messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "The user wants Paris weather.",
            "tool_calls": [call("Paris", "fc_1")],
        },
        result('{"temp_c": 12}', "fc_1"),
        {"role": "assistant", "content": "12 °C in Paris."},
    ]
    reason, detail = reason_of(layout["oa-unknown"])
    assert reason == "unknown_part" and "'file'" in detail


def test_anthropic_blocks_thinking_tool_use_and_tool_results_in_the_user_turn() -> None:
    layout = rows("anthropic_blocks.jsonl")
    parsed = parse_row(layout["an-tools"], "openai")
    assert parsed.messages == [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "Is it cold in Oslo?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "I need the current weather.",
            "tool_calls": [call("Oslo", "toolu_01")],
        },
        result('{"temp_c": -3}', "toolu_01"),
        {"role": "user", "content": "And is that below freezing?"},
        {"role": "assistant", "content": "Yes, -3 °C is below freezing."},
    ]
    # Anthropic's input_schema is the definition's parameters.
    assert parsed.tools[0]["function"]["parameters"]["required"] == ["city"]
    assert parse_row(layout["an-plain-result"], "openai").messages[1:3] == [
        {"role": "assistant", "content": "", "tool_calls": [call("Rome", "toolu_02")]},
        result('{"temp_c": 21}', "toolu_02"),
    ]
    reason, detail = reason_of(layout["an-redacted"])
    assert reason == "unknown_part" and "'redacted_thinking'" in detail


def test_harmony_channels_make_one_assistant_turn_per_step() -> None:
    layout = rows("harmony_channels.jsonl")
    parsed = parse_row(layout["hm-tools"], "openai")
    made = made_up_id(parsed.messages[2])
    assert parsed.messages == [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need get_weather for Oslo.",
            "tool_calls": [call("Oslo", made)],
        },
        result('{"temp_c": 4}', made),
        {"role": "assistant", "content": "It is 4 °C in Oslo.", "reasoning_content": "4 degrees."},
    ]
    assert parse_row(layout["hm-chat"], "openai").messages[1] == {
        "role": "assistant",
        "content": "4.",
        "reasoning_content": "Simple arithmetic.",
    }
    reason, detail = reason_of(layout["hm-unknown"])
    assert reason == "unknown_part" and "'scratchpad'" in detail


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"role": "user", "content": [{"type": "reasoning", "value": "x"}]}, "misplaced_part"),
        ({"role": "user", "content": [{"type": "tool_use", "name": "f", "input": {}}]}, "misplaced_part"),
        ({"role": "assistant", "content": [{"type": "tool_result", "content": "x"}]}, "misplaced_part"),
        (
            {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": "not an object"}]},
            "bad_tool_call",
        ),
        ({"role": "assistant", "content": [{"type": "tool_call", "value": "{not json"}]}, "bad_tool_call"),
    ],
)
def test_a_part_where_it_cannot_be_or_malformed_is_quarantined(message: dict, reason: str) -> None:
    row = {"messages": [{"role": "user", "content": "Hi"}, message]}
    if message["role"] == "user":
        row["messages"] = [message]
    assert reason_of(row)[0] == reason


@pytest.fixture(scope="module")
def mixed_layouts(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("layouts")
    data = root / "data"
    shutil.copytree(FIXTURES, data)
    return run_stages(root, [str(data)], num_shards=2)


def test_a_folder_of_every_layout_ingests_in_one_run_every_row_accounted_for(mixed_layouts) -> None:
    by_file: dict[str, list[str]] = {}
    for (source_file, _), outcome in sorted(mixed_layouts.by_row().items()):
        by_file.setdefault(Path(source_file).name, []).append(outcome)
    assert by_file == {
        "anthropic_blocks.jsonl": ["kept", "kept", "unknown_part"],
        "harmony_channels.jsonl": ["kept", "kept", "unknown_part"],
        "llamafactory_parts.jsonl": ["kept", "kept", "unknown_part"],
        "openai_parts.jsonl": ["kept", "kept", "unknown_part"],
    }
    manifest = mixed_layouts.manifest
    assert manifest.input_rows == manifest.rows + manifest.quarantined == 12
    assert manifest.tool_calling == 6
    assert {q["reason"] for q in mixed_layouts.quarantined} == {"unknown_part"}


def test_a_source_format_override_wins_over_the_parts_layout(tmp_path: Path) -> None:
    outcome = run_stages(tmp_path, [f"lf@sharegpt={FIXTURES / 'llamafactory_parts.jsonl'}"])
    assert list(outcome.by_row().values()) == ["unrecognized_format"] * 3


def test_reasoning_parts_render_as_the_official_template_renders_reasoning_content(mixed_layouts) -> None:
    """The tool-loop step after the last user message shows the call's reasoning, as Qwen3.6 renders it."""
    tok = load_tokenizer()
    official = official_template()
    tool_rows = [c for c in mixed_layouts.conversations if c.history == "source" and c.tools]
    assert len(tool_rows) == 6
    shown = 0
    for conversation in tool_rows:
        for turn in range(conversation.num_turns):
            messages = prompt_messages(conversation, turn, [])
            ours = render_prompt_ids(tok, messages, tools=conversation.tools)
            assert ours == official_prompt_ids(tok, official, messages, tools=conversation.tools), conversation.id
            reasoning = [m["reasoning_content"] for m in messages if m.get("reasoning_content")]
            text = tok.decode(ours)
            shown += sum(f"<think>\n{r}\n</think>" in text for r in reasoning)
    assert shown >= 4  # the LLaMA-Factory, OpenAI (both) and Harmony calls' reasoning after their user message
