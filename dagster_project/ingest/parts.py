"""Typed content parts and blocks: the text, reasoning, tool calls and tool results inside a `content` list.

Layouts read (each part a `{"type": ..., ...}` object, a bare string being text):

* **Text**: `text`, `input_text`, `output_text` (text in `text`, `value` or `content`); OpenAI's `refusal`
  (in `refusal`). Text parts join with no separator, as the chat template joins them.
* **Reasoning**: `reasoning` (LLaMA-Factory's `value`, or `text`; OpenAI Responses' `summary` /
  `content` lists of `summary_text` / `reasoning_text` parts), Anthropic's `thinking` (in `thinking`; its
  `signature` is dropped). Several reasoning parts join with a blank line.
* **Tool calls**: `tool_call` / `function_call` (LLaMA-Factory: `value` the JSON of `{name, arguments}`;
  OpenAI Responses: `name` and `arguments` a JSON string, its id in `call_id`), Anthropic's `tool_use` (`name`,
  `input`, `id`).
* **Tool results**: Anthropic's `tool_result` (`content` a string or text blocks, the call's id in `tool_use_id`),
  OpenAI Responses' `function_call_output` (`output`, `call_id`), LLaMA-Factory's `observation` / `tool_response`
  (`value`). The ids are kept (`tool_call_ids`).
* **Media** (`image`, `image_url`, `input_audio`, ...) quarantine the row as `image_content`.

Any other part type (Anthropic's `redacted_thinking`, whose text is encrypted, a `document`, ...)
quarantines the row as `unknown_part`, naming the type; a part in a message that cannot hold it (a tool
call in a user message, reasoning in a tool result) as `misplaced_part`.

Harmony messages (gpt-oss: one message per `channel`) are read in `harmony_message`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagster_project.ingest.quarantine import Rejected
from dagster_project.ingest.tool_call_ids import RESULT_ID_KEYS, source_call_id

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_TEXT_PART_KEYS = ("text", "value", "content")
_REASONING_PART_KEYS = {"reasoning": ("value", "text", "reasoning"), "thinking": ("thinking", "text", "value")}
_NESTED_REASONING_KEYS = ("summary", "content")
_CALL_PART_TYPES = frozenset({"tool_call", "function_call", "tool_use"})
_RESULT_PART_KEYS = {
    "tool_result": ("content",),
    "function_call_output": ("output",),
    "observation": ("value", "content"),
    "tool_response": ("value", "content"),
}
MEDIA_PART_KEYS = ("image", "image_url", "input_image", "video", "video_url", "audio", "input_audio", "audio_url")
# Harmony's channels: the reasoning, the visible answer, and tool calls (or a visible preamble).
_HARMONY_CHANNELS = ("analysis", "final", "commentary")
_HARMONY_NAMESPACE = "functions."


@dataclass(frozen=True)
class ToolResult:
    """A tool result's text, and the id of the call it answers where the source names it."""

    text: str
    call_id: str | None = None


@dataclass
class Parts:
    """What a `content` list holds, by kind."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[Any] = field(default_factory=list)  # raw `{name, arguments}` objects, normalized by the caller
    results: list[ToolResult] = field(default_factory=list)

    @property
    def joined_text(self) -> str:
        return "".join(self.text)

    @property
    def joined_reasoning(self) -> str:
        return "\n\n".join(piece.strip() for piece in self.reasoning)


def split_parts(content: list[Any], where: str) -> Parts:
    """Sort each part of `content` by kind; raises `Rejected` on media, unknown and malformed parts."""
    parts = Parts()
    for number, part in enumerate(content):
        if isinstance(part, str):
            parts.text.append(part)
            continue
        if not isinstance(part, dict):
            raise Rejected("non_string_content", f"{where} part {number} is a {type(part).__name__}")
        kind = part.get("type")
        if kind in MEDIA_PART_KEYS or (kind is None and any(key in part for key in MEDIA_PART_KEYS)):
            raise Rejected("image_content", f"{where} has a {kind or 'media'} part; only text is sent to the fleet")
        at = f"{where} part {number} ({kind})"
        if kind is None or kind in TEXT_PART_TYPES:
            parts.text.append(_string_at(part, _TEXT_PART_KEYS, at))
        elif kind == "refusal":
            parts.text.append(_string_at(part, ("refusal",), at))
        elif kind in _REASONING_PART_KEYS:
            parts.reasoning.append(_reasoning_text(part, kind, at))
        elif kind in _CALL_PART_TYPES:
            parts.calls.append(_call(part, kind))
        elif kind in _RESULT_PART_KEYS:
            call_id = source_call_id(part, RESULT_ID_KEYS, "unpaired_tool_result", at)
            parts.results.append(ToolResult(_result_text(part, kind, at), call_id))
        else:
            raise Rejected("unknown_part", f"{where} part {number} has the unknown type {kind!r}")
    return parts


def harmony_message(item: dict[str, Any], content: str, where: str) -> dict[str, Any]:
    """An assistant message of one Harmony channel, in the canonical form (`formats` merges a turn's messages)."""
    channel = item.get("channel")
    recipient = item.get("recipient")
    if channel not in _HARMONY_CHANNELS:
        raise Rejected("unknown_part", f"{where} is on the unknown Harmony channel {channel!r}")
    if channel == "analysis":
        return {"role": "assistant", "content": "", "reasoning_content": content.strip()}
    if isinstance(recipient, str) and recipient:
        # A call: the recipient names the function (`functions.get_weather`), the content is its JSON arguments.
        name = recipient.removeprefix(_HARMONY_NAMESPACE)
        return {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": content}]}
    return {"role": "assistant", "content": content}


def _string_at(part: dict[str, Any], keys: tuple[str, ...], at: str) -> str:
    text = next((part[key] for key in keys if isinstance(part.get(key), str)), None)
    if text is None:
        raise Rejected("non_string_content", f"{at} has no text (keys {sorted(part)})")
    return text


def _reasoning_text(part: dict[str, Any], kind: str, at: str) -> str:
    for key in _NESTED_REASONING_KEYS:
        nested = part.get(key)
        if isinstance(nested, list) and nested:
            return "\n\n".join(_string_at(piece, ("text",), f"{at} {key}") for piece in nested)
    return _string_at(part, _REASONING_PART_KEYS[kind], at)


def _call(part: dict[str, Any], kind: str) -> Any:
    if kind == "tool_use":
        return {"name": part.get("name"), "arguments": part.get("input", {}), "id": part.get("id")}
    if "name" in part or "function" in part:
        return part
    # LLaMA-Factory keeps the call's JSON in `value`; `formats` parses it like any stored call.
    return part.get("value")


def _result_text(part: dict[str, Any], kind: str, at: str) -> str:
    result = next((part[key] for key in _RESULT_PART_KEYS[kind] if part.get(key) is not None), None)
    if isinstance(result, list):
        nested = split_parts(result, at)
        if nested.reasoning or nested.calls or nested.results:
            raise Rejected("misplaced_part", f"{at} holds parts other than text")
        return nested.joined_text
    if not isinstance(result, str):
        raise Rejected("non_string_content", f"{at} has no text result (keys {sorted(part)})")
    return result
