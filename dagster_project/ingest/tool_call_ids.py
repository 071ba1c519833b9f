"""Tool-call ids: every call of a conversation gets one and every tool result the id of the call it answers.

* **Kept**: a call's id as the source writes it (OpenAI's `tool_calls[].id`, the Responses API's `call_id`,
  Anthropic's `tool_use` `id`), and the call a result names (OpenAI's `tool_call_id`, Anthropic's `tool_use_id`, the
  Responses API's `call_id`). The conversations keep them as written; a template that requires another form of id is
  given them fitted at render time (`template_calls`), the pairs unchanged.
* **Made up** where the source has none (LLaMA-Factory's `function_call` turns, OpenAI's legacy `function_call`,
  Harmony's calls): 9 letters and digits from a digest of the conversation (its messages as ingest normalized them)
  and the call's number in it, so a row gets the same ids on every run and two rows that are otherwise equal stay
  equal. Letters and digits of that length are what the strictest template seen takes as they are (Mistral's).
* **Paired**, in order: the n-th tool result after an assistant message with calls answers its n-th call, unless
  the result names its call, which must then be one of that message's. A result with no call left to answer (more
  results than calls), one naming a call the message did not make and one answering a call a second time
  quarantine the row (`unpaired_tool_result`), never renumbered; so do two calls of one message with the same id
  (`bad_tool_call`). A call left unanswered is kept (the conversation goes on, or ends, without its result).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from dagster_project.ingest.quarantine import Rejected
from dagster_project.template_calls import alphanumeric_id

# Where a source writes a call's id and the id of the call a result answers, in the order they are looked up (the
# Responses API's `function_call` item has an `id` of its own beside the `call_id` that results name).
CALL_ID_KEYS = ("call_id", "id")
RESULT_ID_KEYS = ("tool_call_id", "tool_use_id", "call_id")
MADE_UP_ID_LENGTH = 9


def source_call_id(item: Mapping[str, Any], keys: tuple[str, ...], reason: str, where: str) -> str | None:
    """The id `item` holds under the first of `keys` it has (a string, or an integer as its digits); None where it
    holds none or a blank one. Any other value is no id and rejects the row with `reason`."""
    for key in keys:
        value = item.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise Rejected(reason, f"{where}: its {key!r} is a {type(value).__name__}, not an id")
        text = str(value)
        if text.strip():
            return text
    return None


def made_up_call_id(seed: bytes, number: int) -> str:
    """The id of the conversation's call number `number` (counted from 0 across its messages), `seed` its digest."""
    return alphanumeric_id(seed + b"#" + str(number).encode(), MADE_UP_ID_LENGTH)


def pair_tool_results(messages: list[dict[str, Any]]) -> None:
    """Give every call of `messages` an id and every tool result the `tool_call_id` of the call it answers, in place
    (see the module); raises `Rejected` where a result cannot be paired. Expects the messages `check_structure`
    passed: a tool result follows a call or another result."""
    seed = _seed(messages)
    number = 0
    calls_at = -1  # the index of the assistant message whose calls the results that follow answer
    calls: list[str] = []
    answered: set[str] = set()
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            message["tool_call_id"] = _answered_call(message, index, calls_at, calls, answered)
            answered.add(message["tool_call_id"])
            continue
        calls_at, calls, answered = index, [], set()
        for call in message.get("tool_calls") or ():
            if call.get("id") is None:
                call["id"] = made_up_call_id(seed, number)
            if call["id"] in calls:
                raise Rejected("bad_tool_call", f"message {index} has two calls with the id {call['id']!r}")
            calls.append(call["id"])
            number += 1


def _seed(messages: list[dict[str, Any]]) -> bytes:
    """The digest the made-up ids are drawn from: the messages before any is made up (empty when none is needed)."""
    for message in messages:
        if any(call.get("id") is None for call in message.get("tool_calls") or ()):
            return orjson.dumps(messages)
    return b""


def _answered_call(message: dict[str, Any], index: int, calls_at: int, calls: list[str], answered: set[str]) -> str:
    if len(answered) >= len(calls):
        raise Rejected(
            "unpaired_tool_result",
            f"message {index} is tool result {len(answered) + 1} after message {calls_at}, which made "
            f"{len(calls)} call{'' if len(calls) == 1 else 's'}: more results than calls",
        )
    named = message.get("tool_call_id")
    call_id = calls[len(answered)] if named is None else named
    if call_id not in calls:
        raise Rejected(
            "unpaired_tool_result",
            f"message {index} answers the call {named!r}, which is none of message {calls_at}'s calls {calls}",
        )
    if call_id in answered:
        raise Rejected("unpaired_tool_result", f"message {index} answers the call {call_id!r} a second time")
    return call_id
