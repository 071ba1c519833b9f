"""How a chat template takes tool calls, found by rendering a probe call (`probe_tool_call`), and the conversations'
calls given to it in that form (`as_template_takes`).

The conversations hold a call as `{"id", "type": "function", "function": {"name", "arguments": {...}}}` and a tool
result with the `tool_call_id` of the call it answers (`ingest.tool_call_ids`). Templates differ in what they take:

* **arguments**: most take the object (Qwen's `tojson`); DeepSeek-R1's joins them to text (`'\\n' + arguments`) and
  fails on an object, so it is given them as JSON text.
* **ids**: most ignore them (Qwen3.6's, Qwen3's, DeepSeek-R1's); Mistral's refuses a call or a result whose id is
  not exactly 9 characters long, and mistral-common's encoder, its reference, any id but 9 letters or digits. A
  template that refuses an id as OpenAI writes them (`call_` and 24 more) but takes one of letters and digits of
  some length is given every id fitted to that length (`fitted_call_id`): an id that fits as it is, another as a
  digest of it in letters and digits. A call and the result that names it get the same fitted id, so the pairs hold;
  the conversations keep the source's ids.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster_project import tool_calls

ALPHANUMERIC = string.ascii_letters + string.digits
_PROBE_USER = {"role": "user", "content": "Probe question"}
_PROBE_TOOL, _PROBE_ARGUMENT, _PROBE_VALUE, _PROBE_RESULT = "probe_tool", "probe_key", "probe value", "probe result"
# A call id as OpenAI writes them: a template that takes it takes a source's id as it is.
_PROBE_SOURCE_ID = "call_" + "Pr0beCa11" * 2 + "Id0000"
# The lengths of letters-and-digits ids tried when a template refuses the source's form.
_PROBED_ID_LENGTHS = range(1, 65)


@dataclass(frozen=True)
class ToolCallForm:
    """`arguments_as_text`: the template takes a call's arguments as JSON text; `known`: it writes a call exactly as
    `tool_calls.render_call` does (Qwen3.6's `<tool_call>` form); `id_length`: it takes only ids of that many letters
    and digits (None: any id)."""

    arguments_as_text: bool = False
    known: bool = False
    id_length: int | None = None


def probe_tool_call(render: Callable[[list[dict[str, Any]]], str]) -> ToolCallForm:
    """The form `render` (a template's render of messages to text) takes a call in, from a probe exchange: a user
    message, a call and its result.

    Each id is tried with the arguments as an object, then, where the template fails on them with a `TypeError`
    (joining them to text), as JSON text. A template that refuses the source-form id but takes a letters-and-digits
    id of some length requires that length; one that refuses every probe (for another reason) or renders the call in
    another form writes calls in a form the project does not read (`known` False)."""
    for call_id in (_PROBE_SOURCE_ID, *(alphanumeric_id(b"probe", length) for length in _PROBED_ID_LENGTHS)):
        for as_text in (False, True):
            try:
                text = render(_probe_exchange(call_id, as_text))
            except TypeError:
                continue
            except Exception:  # its own refusal, of this id or of the call
                break
            known = tool_calls.render_call(_PROBE_TOOL, {_PROBE_ARGUMENT: _PROBE_VALUE}) in text
            return ToolCallForm(as_text, known, None if call_id == _PROBE_SOURCE_ID else len(call_id))
    return ToolCallForm()


def _probe_exchange(call_id: str, arguments_as_text: bool) -> list[dict[str, Any]]:
    arguments: Any = {_PROBE_ARGUMENT: _PROBE_VALUE}
    if arguments_as_text:
        arguments = json.dumps(arguments)
    call = {"id": call_id, "type": "function", "function": {"name": _PROBE_TOOL, "arguments": arguments}}
    return [
        _PROBE_USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": _PROBE_RESULT, "tool_call_id": call_id},
    ]


def as_template_takes(messages: list[dict[str, Any]], form: ToolCallForm) -> list[dict[str, Any]]:
    """`messages` in the form the template takes (see the module): the arguments as JSON text where it wants text,
    the call ids fitted where it requires a length; the messages themselves where it takes them as they are."""
    if not form.arguments_as_text and form.id_length is None:
        return messages
    return [_message_as_taken(message, form) for message in messages]


def _message_as_taken(message: dict[str, Any], form: ToolCallForm) -> dict[str, Any]:
    if message.get("tool_calls"):
        return {**message, "tool_calls": [_call_as_taken(call, form) for call in message["tool_calls"]]}
    if form.id_length is not None and isinstance(message.get("tool_call_id"), str):
        return {**message, "tool_call_id": fitted_call_id(message["tool_call_id"], form.id_length)}
    return message


def _call_as_taken(call: dict[str, Any], form: ToolCallForm) -> dict[str, Any]:
    taken = call
    function = call.get("function", {})
    if form.arguments_as_text and not isinstance(function.get("arguments"), str):
        arguments = json.dumps(function.get("arguments"), ensure_ascii=False)
        taken = {**taken, "function": {**function, "arguments": arguments}}
    if form.id_length is not None and isinstance(call.get("id"), str):
        taken = {**taken, "id": fitted_call_id(call["id"], form.id_length)}
    return taken


def fitted_call_id(call_id: str, length: int) -> str:
    """`call_id` when it is `length` ASCII letters and digits, else `length` of them from a digest of it: the same id
    always fits to the same one, so a call and the result that names it stay paired."""
    if len(call_id) == length and call_id.isascii() and call_id.isalnum():
        return call_id
    return alphanumeric_id(call_id.encode("utf-8"), length)


def alphanumeric_id(data: bytes, length: int) -> str:
    """`length` ASCII letters and digits from a digest of `data` (up to 86 of them carry its 512 bits)."""
    number = int.from_bytes(hashlib.blake2b(data, digest_size=64).digest(), "big")
    digits = []
    for _ in range(length):
        number, digit = divmod(number, len(ALPHANUMERIC))
        digits.append(ALPHANUMERIC[digit])
    return "".join(digits)
