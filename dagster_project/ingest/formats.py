"""Row formats of prompt datasets, and their normalization to `[{role, content}]` messages.

Formats (detected per file from its first rows, or forced with an override):

* `sharegpt`: `conversations: [{from, value}]`; roles human/gpt/system and the odd ones
  (chatgpt, bing, bard, model, prompter); an optional top-level `system`.
* `openai`: `messages: [{role, content}]` (also lmsys' `conversation`); content a string or a list of
  parts (`{"type": "text", "text": ...}`); `developer` is a system role.
* `alpaca`: `instruction`, `input`, `output`, and LLaMA-Factory's optional `system` and
  `history: [[query, answer], ...]`. The user message is `instruction`, plus `"\n\n" + input` only when
  input is non-empty (SpecForge's convention).
* `prompt`: a plain `prompt` (or `question`, `query`) column; a list there is read as messages
  (TRL's conversational prompts).

Hugging Face datasets exports (Parquet or JSON Lines) use these same column layouts.

Every message is checked here, so `parse_row` returns a conversation that the chat template can
render or raises `Rejected` with a reason:

* **Tool use is quarantined** (`tool_use`): a row with tool definitions, tool calls or tool results.
  The fleet serves no tools, so a regenerated tool-calling turn would not call the tool and the recorded
  tool results would answer a call that was never made; cutting the row before the first call instead
  would train answers to prompts that expect a tool. Such rows are kept out, visibly, by reason.
* System prompts are kept, but only as the first message (the template refuses one anywhere else).
* A conversation needs a user message, and its first non-system message must be a user message.
* Every message needs non-empty string content; a list of text parts is joined the way the chat
  template renders it (no separator); any non-text part makes the row `non_string_content`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dagster_project.ingest.quarantine import Rejected

FORMATS = ("sharegpt", "openai", "alpaca", "prompt")
AUTO = "auto"

_MESSAGE_LIST_FIELDS = {"openai": ("messages", "conversation"), "sharegpt": ("conversations",)}
_PROMPT_FIELDS = ("prompt", "question", "query")
ID_FIELDS = ("id", "conversation_id", "uuid", "prompt_id")
_TOOL_FIELDS = ("tools", "functions")
_ROLE_ALIASES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "prompter": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
}
_TOOL_ROLES = frozenset(
    {"tool", "function", "function_call", "function_response", "ipython", "observation", "tool_call", "tool_response"}
)
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_EXTRA_MAX_FIELDS = 16
_EXTRA_MAX_CHARS = 256
_INT64 = (-(2**63), 2**63 - 1)


@dataclass
class ParsedRow:
    messages: list[dict[str, str]]
    source_id: str | None = None
    # Small scalar fields of the row worth keeping for analysis (category, label, ...).
    extra: dict[str, Any] = field(default_factory=dict)


def format_of(value: Any) -> str | None:
    """The format a single row looks like, or None."""
    if not isinstance(value, dict):
        return None
    for name in ("openai", "sharegpt"):
        if any(value.get(key) is not None for key in _MESSAGE_LIST_FIELDS[name]):
            return name
    if value.get("instruction") is not None:
        return "alpaca"
    if any(value.get(key) is not None for key in _PROMPT_FIELDS):
        return "prompt"
    return None


def detect_format(sample: Iterable[Any]) -> str | None:
    """The most common format among sample rows (so a few odd rows at the top do not decide)."""
    counts = Counter(fmt for fmt in map(format_of, sample) if fmt)
    return counts.most_common(1)[0][0] if counts else None


def parse_row(value: Any, fmt: str) -> ParsedRow:
    """Normalize one row of format `fmt`; raises `Rejected` when a rule is broken."""
    if not isinstance(value, dict):
        raise Rejected("unrecognized_format", f"expected a JSON object, got {type(value).__name__}")
    if not _has_fields_of(value, fmt):
        raise Rejected("unrecognized_format", f"no {fmt} field ({_expected_fields(fmt)}); keys: {sorted(value)[:12]}")
    _reject_tool_use(value, fmt)
    if fmt == "alpaca":
        messages = _alpaca_messages(value)
    elif fmt == "prompt":
        messages = _prompt_messages(value)
    else:
        messages = _system_field(value) + _message_list(_first_present(value, _MESSAGE_LIST_FIELDS[fmt]))
    check_structure(messages)
    return ParsedRow(messages, source_id(value), _extra_fields(value, fmt))


def check_structure(messages: list[dict[str, str]]) -> None:
    """Turn-order rules on canonical messages."""
    roles = [m["role"] for m in messages]
    if "user" not in roles:
        raise Rejected("no_user_turn", f"roles {roles[:8]}" if roles else "no messages")
    if "system" in roles[1:]:
        raise Rejected("misplaced_system", f"system message at index {roles.index('system', 1)}")
    first_turn = roles[1] if roles[0] == "system" else roles[0]
    if first_turn == "assistant":
        raise Rejected("starts_with_assistant", "the first message after the system prompt is an assistant message")


def _has_fields_of(value: dict[str, Any], fmt: str) -> bool:
    if fmt in _MESSAGE_LIST_FIELDS:
        return any(value.get(key) is not None for key in _MESSAGE_LIST_FIELDS[fmt])
    keys = ("instruction",) if fmt == "alpaca" else _PROMPT_FIELDS
    return any(value.get(key) is not None for key in keys)


def _expected_fields(fmt: str) -> str:
    keys = _MESSAGE_LIST_FIELDS.get(fmt) or (("instruction",) if fmt == "alpaca" else _PROMPT_FIELDS)
    return " or ".join(keys)


def _first_present(value: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next(value[key] for key in keys if value.get(key) is not None)


def _reject_tool_use(value: dict[str, Any], fmt: str) -> None:
    for key in _TOOL_FIELDS:
        if value.get(key):
            raise Rejected("tool_use", f"the row defines tools ({key!r})")
    for index, item in enumerate(_message_items(value, fmt)):
        if not isinstance(item, dict):
            continue
        role = item.get("role", item.get("from"))
        if isinstance(role, str) and role.strip().lower() in _TOOL_ROLES:
            raise Rejected("tool_use", f"message {index} has tool role {role!r}")
        if item.get("tool_calls") or item.get("function_call"):
            raise Rejected("tool_use", f"message {index} calls a tool")


def _message_items(value: dict[str, Any], fmt: str) -> list[Any]:
    keys = _MESSAGE_LIST_FIELDS.get(fmt) or (_PROMPT_FIELDS if fmt == "prompt" else ())
    found = next((value[key] for key in keys if value.get(key) is not None), None)
    return found if isinstance(found, list) else []


def _message_list(items: Any) -> list[dict[str, str]]:
    if not isinstance(items, list):
        raise Rejected("unrecognized_format", f"expected a list of messages, got {type(items).__name__}")
    messages = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise Rejected("unrecognized_format", f"message {index} is a {type(item).__name__}, not an object")
        role = _canonical_role(item.get("role", item.get("from")), index)
        content = item["content"] if "content" in item else item.get("value")
        messages.append({"role": role, "content": flatten_content(content, f"message {index} ({role})")})
    return messages


def _canonical_role(role: Any, index: int) -> str:
    canonical = _ROLE_ALIASES.get(role.strip().lower()) if isinstance(role, str) else None
    if canonical is None:
        raise Rejected("unknown_role", f"message {index} has role {role!r}")
    return canonical


def flatten_content(content: Any, where: str) -> str:
    """Message content as text: a string, or a list of text parts joined as the chat template does."""
    if isinstance(content, list):
        content = "".join(_text_of_part(part, where) for part in content)
    if content is None:
        raise Rejected("empty_content", f"{where} has no content")
    if not isinstance(content, str):
        raise Rejected("non_string_content", f"{where} has {type(content).__name__} content")
    if not content.strip():
        raise Rejected("empty_content", f"{where} is empty or whitespace only")
    return content


def _text_of_part(part: Any, where: str) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type", "text") in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
        return part["text"]
    kind = part.get("type", sorted(part)) if isinstance(part, dict) else type(part).__name__
    raise Rejected("non_string_content", f"{where} has a non-text part ({kind})")


def _system_field(value: dict[str, Any]) -> list[dict[str, str]]:
    system = value.get("system")
    if system is None or (isinstance(system, str) and not system.strip()):
        return []
    return [{"role": "system", "content": flatten_content(system, "system field")}]


def _alpaca_messages(value: dict[str, Any]) -> list[dict[str, str]]:
    messages = _system_field(value)
    history = value.get("history") or []
    if not isinstance(history, list):
        raise Rejected("unrecognized_format", f"history is a {type(history).__name__}, not a list of pairs")
    for index, pair in enumerate(history):
        if not isinstance(pair, list) or len(pair) != 2:
            raise Rejected("unrecognized_format", f"history[{index}] is not a [query, answer] pair")
        messages.append({"role": "user", "content": flatten_content(pair[0], f"history[{index}] query")})
        messages.append({"role": "assistant", "content": flatten_content(pair[1], f"history[{index}] answer")})
    instruction = flatten_content(value.get("instruction"), "instruction")
    extra_input = value.get("input")
    if extra_input is not None and not isinstance(extra_input, str):
        raise Rejected("non_string_content", f"input has {type(extra_input).__name__} content")
    user = f"{instruction}\n\n{extra_input}" if extra_input and extra_input.strip() else instruction
    messages.append({"role": "user", "content": user})
    output = value.get("output")
    # A missing or empty output is a prompt without a reference answer: fine, the answer is regenerated.
    if output is not None and not (isinstance(output, str) and not output.strip()):
        messages.append({"role": "assistant", "content": flatten_content(output, "output")})
    return messages


def _prompt_messages(value: dict[str, Any]) -> list[dict[str, str]]:
    prompt = _first_present(value, _PROMPT_FIELDS)
    if isinstance(prompt, list) and all(isinstance(item, dict) for item in prompt):
        return _system_field(value) + _message_list(prompt)
    return _system_field(value) + [{"role": "user", "content": flatten_content(prompt, "prompt")}]


def source_id(value: dict[str, Any]) -> str | None:
    """The row's own id: a non-blank string or an integer in one of ID_FIELDS."""
    for key in ID_FIELDS:
        found = value.get(key)
        if isinstance(found, str) and found.strip():
            return found
        if isinstance(found, int) and not isinstance(found, bool):
            return str(found)
    return None


def _extra_fields(value: dict[str, Any], fmt: str) -> dict[str, Any]:
    consumed = {*ID_FIELDS, *_TOOL_FIELDS, "system", *_MESSAGE_LIST_FIELDS.get(fmt, ())}
    consumed |= {"instruction", "input", "output", "history"} if fmt == "alpaca" else set()
    consumed |= set(_PROMPT_FIELDS) if fmt == "prompt" else set()
    extra: dict[str, Any] = {}
    for key, item in value.items():
        if key in consumed or len(extra) >= _EXTRA_MAX_FIELDS:
            continue
        small_text = isinstance(item, str) and len(item) <= _EXTRA_MAX_CHARS
        # orjson writes only 64-bit integers; a bigger one is not worth keeping as an annotation.
        small_number = isinstance(item, float | bool) or (isinstance(item, int) and _INT64[0] <= item <= _INT64[1])
        if small_text or small_number:
            extra[key] = item
    return extra
