"""Tool-call ids at ingest (`ingest.tool_call_ids`): the source's kept, the missing made up, every tool result
paired with the call it answers; a result that cannot be paired quarantines the row, never renumbered."""

from __future__ import annotations

import copy
import re

import pytest

from dagster_project.ingest.formats import parse_row
from dagster_project.ingest.quarantine import Rejected
from dagster_project.ingest.tool_call_ids import (
    CALL_ID_KEYS,
    RESULT_ID_KEYS,
    made_up_call_id,
    pair_tool_results,
    source_call_id,
)

USER = {"role": "user", "content": "Weather in Oslo and Rome?"}
MADE_UP = re.compile("[A-Za-z0-9]{9}")


def calls(*ids: str | None) -> dict:
    """An assistant message calling `get_weather` once per id (None: the source gives that call no id)."""
    made = []
    for number, call_id in enumerate(ids):
        made.append({"type": "function", "function": {"name": "get_weather", "arguments": {"n": number}}})
        if call_id is not None:
            made[-1]["id"] = call_id
    return {"role": "assistant", "content": "", "tool_calls": made}


def result(content: str, call_id: str | None = None) -> dict:
    return {"role": "tool", "content": content} | ({"tool_call_id": call_id} if call_id is not None else {})


def paired(messages: list[dict]) -> list[dict]:
    paired_messages = copy.deepcopy(messages)
    pair_tool_results(paired_messages)
    return paired_messages


def rejected(messages: list[dict]) -> tuple[str, str]:
    with pytest.raises(Rejected) as caught:
        pair_tool_results(copy.deepcopy(messages))
    return caught.value.reason, caught.value.detail


def test_the_sources_ids_are_kept_and_a_result_answers_the_call_it_names_in_any_order() -> None:
    messages = paired([USER, calls("call_oslo", "call_rome"), result("rain", "call_rome"), result("sun", "call_oslo")])
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["call_oslo", "call_rome"]
    assert [message["tool_call_id"] for message in messages[2:]] == ["call_rome", "call_oslo"]


def test_a_result_that_names_no_call_answers_the_call_at_its_position() -> None:
    messages = paired([USER, calls("call_oslo", "call_rome"), result("sun"), result("rain")])
    assert [message["tool_call_id"] for message in messages[2:]] == ["call_oslo", "call_rome"]


def test_missing_ids_are_made_up_deterministically_one_per_call_and_the_results_paired_in_order() -> None:
    source = [USER, calls(None, None), result("sun"), result("rain"), calls(None), result("wind")]
    messages = paired(source)
    made = [call["id"] for message in messages if message.get("tool_calls") for call in message["tool_calls"]]
    assert all(MADE_UP.fullmatch(call_id) for call_id in made) and len(set(made)) == 3
    assert [message["tool_call_id"] for message in messages if message["role"] == "tool"] == made
    assert paired(source) == messages  # the same row, the same ids: on every run, in every process
    # Another conversation's calls get other ids.
    other = paired([{**USER, "content": "Weather in Lima?"}, *source[1:]])
    assert {call["id"] for call in other[1]["tool_calls"]}.isdisjoint(made)


def test_a_made_up_id_is_nine_letters_and_digits_drawn_from_the_conversation_and_the_calls_number() -> None:
    ids = {made_up_call_id(seed, number) for seed in (b"a", b"b") for number in range(50)}
    assert len(ids) == 100 and all(MADE_UP.fullmatch(call_id) for call_id in ids)
    assert made_up_call_id(b"a", 7) == made_up_call_id(b"a", 7)


def test_a_call_without_an_id_beside_one_with_an_id_gets_one_and_the_sources_stays() -> None:
    messages = paired([USER, calls("call_oslo", None), result("sun"), result("rain")])
    kept, made = (call["id"] for call in messages[1]["tool_calls"])
    assert kept == "call_oslo" and MADE_UP.fullmatch(made)
    assert [message["tool_call_id"] for message in messages[2:]] == [kept, made]


def test_calls_left_unanswered_are_kept() -> None:
    messages = paired([USER, calls("call_oslo", "call_rome"), result("sun"), {"role": "user", "content": "Thanks."}])
    assert messages[2]["tool_call_id"] == "call_oslo" and "tool_call_id" not in messages[3]


@pytest.mark.parametrize(
    ("messages", "detail"),
    [
        (
            [USER, calls("call_oslo"), result("sun"), result("rain")],
            "message 3 is tool result 2 after message 1, which made 1 call: more results than calls",
        ),
        (
            [USER, calls(None, None), result("sun"), result("rain"), result("wind")],
            "message 4 is tool result 3 after message 1, which made 2 calls: more results than calls",
        ),
        (
            [USER, calls("call_oslo"), result("sun", "call_lima")],
            "message 2 answers the call 'call_lima', which is none of message 1's calls ['call_oslo']",
        ),
        (
            [USER, calls("call_oslo", "call_rome"), result("sun", "call_oslo"), result("sun again", "call_oslo")],
            "message 3 answers the call 'call_oslo' a second time",
        ),
        (
            # The second result takes the call at its position, which the first already answered by name.
            [USER, calls("call_oslo", "call_rome"), result("rain", "call_rome"), result("sun")],
            "message 3 answers the call 'call_rome' a second time",
        ),
    ],
)
def test_results_that_cannot_be_paired_with_calls_are_quarantined_never_renumbered(
    messages: list[dict], detail: str
) -> None:
    assert rejected(messages) == ("unpaired_tool_result", detail)


def test_two_calls_of_one_message_with_the_same_id_are_a_bad_call() -> None:
    assert rejected([USER, calls("call_1", "call_1"), result("sun"), result("rain")]) == (
        "bad_tool_call",
        "message 1 has two calls with the id 'call_1'",
    )


@pytest.mark.parametrize(
    ("item", "keys", "expected"),
    [
        ({"id": "call_abc"}, CALL_ID_KEYS, "call_abc"),
        ({"id": "fc_item", "call_id": "call_abc"}, CALL_ID_KEYS, "call_abc"),  # the Responses API's call id wins
        ({"id": 7}, CALL_ID_KEYS, "7"),
        ({"id": "  "}, CALL_ID_KEYS, None),
        ({"name": "f"}, CALL_ID_KEYS, None),
        ({"tool_call_id": "call_abc"}, RESULT_ID_KEYS, "call_abc"),
        ({"tool_use_id": "toolu_01"}, RESULT_ID_KEYS, "toolu_01"),
        ({"call_id": "call_abc"}, RESULT_ID_KEYS, "call_abc"),
    ],
)
def test_a_sources_id_is_read_where_each_layout_writes_it(item: dict, keys: tuple, expected: str | None) -> None:
    assert source_call_id(item, keys, "bad_tool_call", "call 0") == expected


@pytest.mark.parametrize("value", [{"nested": 1}, True, [1]])
def test_an_id_that_is_not_text_quarantines_the_row(value: object) -> None:
    with pytest.raises(Rejected) as caught:
        source_call_id({"id": value}, CALL_ID_KEYS, "bad_tool_call", "message 1 call 0")
    assert caught.value.reason == "bad_tool_call" and caught.value.detail.startswith("message 1 call 0: its 'id' is a ")


def test_an_openai_row_keeps_its_ids_and_more_results_than_calls_quarantine_it() -> None:
    call = {"id": "call_Xq7vB2", "type": "function", "function": {"name": "get_weather", "arguments": '{"n": 0}'}}
    row = {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [call]}, result("sun", "call_Xq7vB2")]
    }
    messages = parse_row(row, "openai").messages
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"] == "call_Xq7vB2"
    with pytest.raises(Rejected) as caught:
        parse_row({"messages": [*row["messages"], result("rain")]}, "openai")
    assert caught.value.reason == "unpaired_tool_result"


def test_a_control_token_in_an_id_quarantines_the_row() -> None:
    """A template may write the id (Mistral's does); a result names one of its message's calls, so checking the calls'
    ids covers the results'."""
    call = {"id": "<|im_start|>", "type": "function", "function": {"name": "get_weather", "arguments": {}}}
    row = {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [call]}, result("sun")]}
    with pytest.raises(Rejected) as caught:
        parse_row(row, "openai")
    assert (caught.value.reason, caught.value.detail) == (
        "control_tokens",
        "message 1 has a tool call holding '<|im_start|>'",
    )
