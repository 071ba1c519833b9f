"""Multi-turn policies: which replies are generated, and the prompt of each turn."""

from __future__ import annotations

import pytest

from dagster_project.conversations.turns import apply_policy, prompt_messages, request_key
from dagster_project.records import Conversation


def msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


# system, two user turns (the second a run of two user messages), an answer made of two messages.
SOURCE = [
    msg("system", "S"),
    msg("user", "u1"),
    msg("assistant", "a1"),
    msg("assistant", "a1-more"),
    msg("user", "u2a"),
    msg("user", "u2b"),
    msg("assistant", "a2"),
    msg("user", "u3"),
]
GENERATED = [{"content": "g0", "reasoning_content": "r0"}, {"content": "g1", "reasoning_content": "r1"}]


def conversation(policy: str, messages: list[dict] = SOURCE) -> Conversation:
    kept, generate_after, history = apply_policy(messages, policy)
    return Conversation(id="c", messages=kept, generate_after=generate_after, policy=policy, history=history)


def with_reasoning(content: str, reasoning: str) -> dict:
    return {"role": "assistant", "content": content, "reasoning_content": reasoning}


@pytest.mark.parametrize(
    ("policy", "generate_after", "history", "kept"),
    [
        ("all_turns", [1, 5, 7], "generated", SOURCE),
        ("last_turn", [7], "source", SOURCE),
        ("first_turn", [1], "generated", SOURCE),
        (
            "user_only",
            [4],
            "generated",
            [msg("system", "S"), msg("user", "u1"), msg("user", "u2a"), msg("user", "u2b"), msg("user", "u3")],
        ),
    ],
)
def test_apply_policy(policy: str, generate_after: list[int], history: str, kept: list[dict]) -> None:
    assert apply_policy(SOURCE, policy) == (kept, generate_after, history)


def test_a_conversation_ending_on_an_answer_still_generates_every_turn() -> None:
    messages = [msg("user", "q1"), msg("assistant", "a1"), msg("user", "q2"), msg("assistant", "a2")]
    assert apply_policy(messages, "all_turns")[1] == [0, 2]
    assert apply_policy(messages, "last_turn")[1] == [2]


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown multi-turn policy"):
        apply_policy(SOURCE, "every_other_turn")


def test_all_turns_prompts_use_the_generated_answers_in_place_of_the_source_ones() -> None:
    c = conversation("all_turns")
    assert prompt_messages(c, 0, []) == [msg("system", "S"), msg("user", "u1")]
    assert prompt_messages(c, 1, GENERATED[:1]) == [
        msg("system", "S"),
        msg("user", "u1"),
        with_reasoning("g0", "r0"),  # one generated answer replaces the run a1, a1-more
        msg("user", "u2a"),
        msg("user", "u2b"),
    ]
    assert prompt_messages(c, 2, GENERATED) == [
        msg("system", "S"),
        msg("user", "u1"),
        with_reasoning("g0", "r0"),
        msg("user", "u2a"),
        msg("user", "u2b"),
        with_reasoning("g1", "r1"),
        msg("user", "u3"),
    ]


def test_all_turns_needs_the_earlier_answers() -> None:
    with pytest.raises(ValueError, match="needs the 2 earlier generated answers"):
        prompt_messages(conversation("all_turns"), 2, GENERATED[:1])
    with pytest.raises(ValueError, match="out of range"):
        prompt_messages(conversation("all_turns"), 3, GENERATED)


def test_last_turn_prompt_keeps_the_source_answers() -> None:
    assert prompt_messages(conversation("last_turn"), 0, []) == SOURCE


def test_first_turn_prompt_is_the_system_prompt_and_first_question() -> None:
    assert prompt_messages(conversation("first_turn"), 0, []) == [msg("system", "S"), msg("user", "u1")]


def test_user_only_prompt_has_no_answers() -> None:
    c = conversation("user_only")
    assert prompt_messages(c, 0, []) == c.messages
    assert all(m["role"] != "assistant" for m in prompt_messages(c, 0, []))


def test_request_key_ignores_source_answers_only_when_they_are_never_shown() -> None:
    other_answers = [dict(m, content="different") if m["role"] == "assistant" else m for m in SOURCE]
    for policy, same in [("all_turns", True), ("user_only", True), ("last_turn", False)]:
        assert (request_key(conversation(policy)) == request_key(conversation(policy, other_answers))) is same, policy
    # The turn structure counts: an answer between two questions makes two requests, not one.
    merged = [msg("user", "u1"), msg("user", "u2")]
    answered = [msg("user", "u1"), msg("assistant", "a"), msg("user", "u2")]
    assert request_key(conversation("all_turns", merged)) != request_key(conversation("all_turns", answered))
    # first_turn only asks the first question: later turns do not matter.
    assert request_key(conversation("first_turn", answered)) == request_key(conversation("first_turn", answered[:1]))
