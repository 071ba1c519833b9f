"""Turns of tool-calling conversations, empty source answers under each policy, and renamed ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagster_project.conversations.turns import apply_policy, prompt_messages, request_key
from dagster_project.records import Conversation
from dagster_project.tokenizer import load_tokenizer, render_prompt_ids
from tests.support.chat_templates import official_prompt_ids, official_template
from tests.support.ingest_helpers import run_stages
from tests.support.paths import require_shared

CALL = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
TOOL_CHAT = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Find x."},
    {"role": "assistant", "content": "", "reasoning_content": "Need a lookup.", "tool_calls": [CALL]},
    {"role": "tool", "content": "x is 1"},
    {"role": "assistant", "content": "x is 1."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You're welcome."},
]


@pytest.mark.parametrize(
    ("policy", "generate_after", "history"),
    [
        ("all_turns", [1, 3, 5], "source"),
        ("last_turn", [5], "source"),
        ("first_turn", [1], "source"),
        ("user_only", [2], "generated"),
    ],
)
def test_tool_conversations_generate_every_reply_on_the_recorded_context(
    policy: str, generate_after: list[int], history: str
) -> None:
    messages, after, chosen = apply_policy(TOOL_CHAT, policy)
    assert (after, chosen) == (generate_after, history)
    if policy == "user_only":
        assert [m["role"] for m in messages] == ["system", "user", "user"]


def test_a_tool_result_turn_shows_the_recorded_call_with_its_reasoning() -> None:
    messages, after, history = apply_policy(TOOL_CHAT, "all_turns")
    conversation = Conversation(id="c", messages=messages, generate_after=after, history=history)
    assert prompt_messages(conversation, 1, []) == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Find x."},
        {"role": "assistant", "content": "", "reasoning_content": "Need a lookup.", "tool_calls": [CALL]},
        {"role": "tool", "content": "x is 1"},
    ]


def test_the_tools_are_part_of_what_makes_requests_equal() -> None:
    messages, after, history = apply_policy(TOOL_CHAT, "all_turns")
    plain = Conversation(id="a", messages=messages, generate_after=after, history=history)
    with_tools = Conversation(id="b", messages=messages, generate_after=after, history=history, tools=[{"x": 1}])
    assert request_key(plain) != request_key(with_tools)


def test_glaive_tool_turns_render_as_the_official_template_renders_them(tmp_path: Path) -> None:
    glaive = require_shared("data", "LLaMA-Factory", "glaive_toolcall_en_demo.json")
    official = official_template()
    tok = load_tokenizer()
    held = run_stages(tmp_path, [str(glaive)]).conversations
    # The first 40 conversations that hold recorded calls and results: their every turn, calls included.
    with_calls = [c for c in held if c.history == "source" and any(m.get("tool_calls") for m in c.messages)][:40]
    turns = [(c, turn) for c in with_calls for turn in range(c.num_turns)]
    assert len(with_calls) == 40 and len(turns) > 60
    for conversation, turn in turns:
        messages = prompt_messages(conversation, turn, [])
        ours = render_prompt_ids(tok, messages, tools=conversation.tools)
        assert ours == official_prompt_ids(tok, official, messages, tools=conversation.tools), (conversation.id, turn)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_an_empty_source_answer_is_rejected_only_where_a_prompt_shows_it(tmp_path: Path) -> None:
    row = {
        "id": "empty-answer",
        "messages": [
            {"role": "user", "content": "First?"},
            {"role": "assistant", "content": "  "},
            {"role": "user", "content": "Second?"},
        ],
    }
    path = _jsonl(tmp_path / "rows.jsonl", [row])
    all_turns = run_stages(tmp_path / "all", [path], policy="all_turns")
    assert [c.id for c in all_turns.conversations] == ["empty-answer"]
    last_turn = run_stages(tmp_path / "last", [path], policy="last_turn")
    assert [(q["reason"], q["detail"]) for q in last_turn.quarantined] == [
        ("empty_content", "assistant message 1 is empty and history source shows it in a prompt")
    ]


def test_a_taken_source_id_is_counted_and_the_row_kept_under_its_hash(tmp_path: Path) -> None:
    rows = [{"id": "same", "prompt": "One."}, {"id": "same", "prompt": "Two."}]
    outcome = run_stages(tmp_path, [_jsonl(tmp_path / "rows.jsonl", rows)])
    assert outcome.manifest.renamed_ids == 1
    renamed = next(c for c in outcome.conversations if c.id != "same")
    assert renamed.id.startswith("h-") and renamed.extra["renamed_from"] == "same"
