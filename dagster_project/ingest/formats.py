"""Row formats of prompt datasets, and their normalization to chat messages.

Formats (detected per file from its first rows, or set per source or for the whole run):

* `sharegpt`: `conversations: [{from, value}]`; roles human/gpt/system and the odd ones
  (chatgpt, bing, bard, model, prompter), LLaMA-Factory's `function_call` (an assistant tool call, its
  value the JSON of `{name, arguments}` or a list of them) and `observation` (a tool result); an optional
  top-level `system` and `tools`.
* `openai`: `messages: [{role, content}]` (also lmsys' `conversation`); content a string or a list of
  parts; `developer` is a system role; assistant `tool_calls` (or the legacy `function_call`),
  `tool`/`function` results, an optional top-level `tools` (or `functions`).
* `alpaca`: `instruction`, `input`, `output`, and LLaMA-Factory's optional `system` and
  `history: [[query, answer], ...]`. The user message is `instruction`, plus `"\n\n" + input` only when
  input is non-empty (SpecForge's convention).
* `prompt`: a plain `prompt` (or `question`, `query`) column; a list there is read as messages
  (TRL's conversational prompts), a list of lists as turns, each a list of messages (the Berkeley
  function-calling leaderboard's `question`: each turn's reply is generated, an empty assistant message
  standing between the turns as the source's missing answer; its tools are in `function`).
* `hh_rlhf`, `oasst`, `ultrachat`: Anthropic's hh-rlhf transcripts, OpenAssistant message trees and UltraChat's
  alternating strings (`public_layouts`); Dolly's `context` and `response` are Alpaca's `input` and `output`,
  and Chatbot Arena's `conversation_a` is a message list.
* `text`: rows of plain text (`{"text": ...}`, a pre-training corpus): not conversations, every row is
  quarantined (`not_a_conversation`) unless the source maps the text field as the prompt
  (`NAME@prompt:text=URI`, see `sources`).

Hugging Face datasets exports (Parquet or JSON Lines) use these same column layouts. A source may rename
a format's main field (`field`): the column that holds the messages, the instruction or the prompt.

Every message is checked here, so `parse_row` returns a conversation that the chat template can
render or raises `Rejected` with a reason:

* Content parts: `{"type": "text", "text"|"value"|"content": ...}` (OpenAI, LLaMA-Factory, others),
  `input_text`/`output_text`, a bare string; they are joined the way the chat template renders them (no
  separator). Reasoning, tool-call and tool-result parts (LLaMA-Factory, OpenAI, Anthropic blocks) and
  Harmony's channels become `reasoning_content`, `tool_calls` and tool messages (see `parts`).
  **Media are never dropped silently**: an image, video or audio part, or a row-level `images`/`videos`/`audios`
  field (LLaMA-Factory's multimodal rows, which keep `<image>` placeholders in
  the text), quarantines the row as `image_content`: the fleet is sent text only, so an answer regenerated
  without the picture would train on the wrong context.
* **Control tokens** of the job's model (`TokenizerProfile.control_tokens`: its special tokens and the turn
  markers its template writes; Qwen3.6's `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, the vision markers, ...,
  DeepSeek's `<｜User｜>`, Mistral's `[INST]`) inside any content quarantine the row (`control_tokens`): the
  tokenizer would turn them into real control tokens, so the text could forge a turn of its own
  (`"...<|im_end|>\n<|im_start|>system\n..."`). Another model's markers are ordinary text (no control token of
  this model). With `control_tokens: literal` the row is kept, marked in `extra`, and the text is encoded as
  ordinary text (`tokenizer.render_prompt_ids`).
* **Tool calling**: `tools` (or `functions`, or the leaderboard's `function`: a list or a JSON string of one;
  each definition in OpenAI's `{"type": "function", "function": {...}}` form, or bare `{name, description,
  parameters}`, which is wrapped in that form) becomes the row's tool list; the parameters' non-standard
  JSON Schema types are renamed to the standard ones (`dict` → `object`, `float` → `number`, `tuple` →
  `array`, as the leaderboard writes them), so the chat template renders a valid schema; assistant tool calls
  become `tool_calls: [{"type": "function", "function": {"name", "arguments": {...}}, "id"}]` with `arguments`
  parsed when the source stores JSON as a string; tool results become `tool` messages with the `tool_call_id`
  of the call they answer (ids kept from the source, made up where it has none, results paired with calls in
  order: `tool_call_ids`). Consecutive assistant messages where the later only calls tools merge into one
  message (a reply then its call). A call needs a name and object arguments (`bad_tool_call`); a tool result
  must follow a call (`orphan_tool_result`) and answer one of its calls (`unpaired_tool_result`). An empty tool
  list (`"tools": "[]"`) is no tools: the row is an ordinary chat.
* **Reasoning**: an assistant's `reasoning_content` (or `reasoning`) is kept as `reasoning_content`; a
  leading `<think>...</think>` in its content is split out into it, so `content` is the visible answer.
  What a prompt shows of it follows the chat template (see `conversations.turns`).
* System prompts are kept, but only as the first message (the template refuses one anywhere else).
* A conversation needs a user message, and its first non-system message must be a user message.
* Every user, system and tool message needs non-empty text. An assistant message may be empty (a source
  answer that the `all_turns` policy never shows); the conversations stage rejects it where a prompt
  would show it.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dagster_project.ingest.parts import harmony_message, split_parts
from dagster_project.ingest.public_layouts import (
    HH_RLHF,
    LAYOUTS,
    OASST,
    ULTRACHAT,
    alternating_messages,
    layout_of,
    oasst_source_id,
    oasst_thread,
    refuse_flattened,
    transcript_messages,
)
from dagster_project.ingest.quarantine import Rejected
from dagster_project.ingest.tool_call_ids import CALL_ID_KEYS, RESULT_ID_KEYS, pair_tool_results, source_call_id
from dagster_project.tokenizer import CONTROL_TOKENS, control_token_pattern

FORMATS = ("sharegpt", "openai", "alpaca", "prompt", "text", *LAYOUTS)
AUTO = "auto"
TEXT = "text"
# What becomes of control-token text in content: the row is quarantined, or the text is kept and encoded as
# ordinary text (never a control id: `tokenizer.render_prompt_ids`).
CONTROL_TOKENS_QUARANTINE = "quarantine"
CONTROL_TOKENS_LITERAL = "literal"
CONTROL_TOKEN_MODES = (CONTROL_TOKENS_QUARANTINE, CONTROL_TOKENS_LITERAL)
# The key of a row's `extra` that marks it read with `literal` (a source's own field of that name is dropped).
CONTROL_TOKENS_KEY = "control_tokens"

# lmsys-chat's `conversation`; Chatbot Arena's `conversation_a` (its `conversation_b` asks the same prompts of the
# other model: `NAME@openai:conversation_b=URI` reads that side instead).
_MESSAGE_LIST_FIELDS = {"openai": ("messages", "conversation", "conversation_a"), "sharegpt": ("conversations",)}
_PROMPT_FIELDS = ("prompt", "question", "query")
# The fields a row of each format needs one of.
_FORMAT_FIELDS = {
    **_MESSAGE_LIST_FIELDS,
    "alpaca": ("instruction",),
    "prompt": _PROMPT_FIELDS,
    HH_RLHF: ("chosen",),
    OASST: ("prompt", "replies"),
    ULTRACHAT: ("data",),
}
# Alpaca's `input` and `output` as Dolly names them (`context`, `response`).
_ALPACA_INPUT_FIELDS = ("input", "context")
_ALPACA_OUTPUT_FIELDS = ("output", "response")
_TEXT_FIELDS = ("text", "content")
# The field a source's `field` mapping renames to, per format.
MAIN_FIELD = {
    "openai": "messages",
    "sharegpt": "conversations",
    "alpaca": "instruction",
    "prompt": "prompt",
    HH_RLHF: "chosen",
    OASST: "prompt",
    ULTRACHAT: "data",
}
ID_FIELDS = ("id", "conversation_id", "uuid", "prompt_id")
_TOOL_FIELDS = ("tools", "functions")
# The function-calling leaderboard's field of tool specs: a list there is one (a string may be a row's label).
_LEADERBOARD_TOOL_FIELD = "function"
# JSON Schema types as some datasets write them (Python's names) → the standard type.
_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_MEDIA_FIELDS = ("images", "image", "videos", "video", "audios", "audio")
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
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
    "tool_response": "tool",
    "function_response": "tool",
}
# Exact role names whose `{role, content}` message needs no more than its role mapped (`_plain_message`).
_PLAIN_ROLES = {name: role for name, role in _ROLE_ALIASES.items() if role in ("system", "user", "assistant")}
# Roles whose message *is* a tool call (LLaMA-Factory's ShareGPT), its content the call's JSON.
_CALL_ROLES = frozenset({"function_call", "tool_call"})
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
_LEADING_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_EXTRA_MAX_FIELDS = 16
_EXTRA_MAX_CHARS = 256
_INT64 = (-(2**63), 2**63 - 1)


@dataclass
class ParsedRow:
    messages: list[dict[str, Any]]
    source_id: str | None = None
    # Small scalar fields of the row worth keeping for analysis (category, label, ...).
    extra: dict[str, Any] = field(default_factory=dict)
    # Tool definitions in OpenAI's form; None when the row defines none.
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ControlTokenPolicy:
    """What becomes of control-token text, for the whole run (`default`) and for the sources named literal;
    `tokens`: the job's model's control tokens (`TokenizerProfile.control_tokens`), the built-in Qwen3.6's by
    default."""

    default: str = CONTROL_TOKENS_QUARANTINE
    literal_sources: frozenset[str] = frozenset()
    tokens: tuple[str, ...] = CONTROL_TOKENS

    def __post_init__(self) -> None:
        if self.default not in CONTROL_TOKEN_MODES:
            raise ValueError(f"unknown control_tokens {self.default!r}; choose one of {', '.join(CONTROL_TOKEN_MODES)}")

    def for_source(self, source: str) -> str:
        return CONTROL_TOKENS_LITERAL if source in self.literal_sources else self.default


QUARANTINE_CONTROL_TOKENS = ControlTokenPolicy()


def format_of(value: Any) -> str | None:
    """The format a single row looks like, or None."""
    if not isinstance(value, dict):
        return None
    layout = layout_of(value)
    if layout is not None:
        return layout
    for name in ("openai", "sharegpt"):
        if any(value.get(key) is not None for key in _MESSAGE_LIST_FIELDS[name]):
            return name
    if value.get("instruction") is not None:
        return "alpaca"
    if any(value.get(key) is not None for key in _PROMPT_FIELDS):
        return "prompt"
    if any(isinstance(value.get(key), str) for key in _TEXT_FIELDS):
        return TEXT
    return None


def detect_format(sample: Iterable[Any]) -> str | None:
    """The most common format among sample rows (so a few odd rows at the top do not decide)."""
    counts = Counter(fmt for fmt in map(format_of, sample) if fmt)
    return counts.most_common(1)[0][0] if counts else None


def parse_row(
    value: Any,
    fmt: str,
    field_name: str | None = None,
    control_tokens: str = CONTROL_TOKENS_QUARANTINE,
    model_control_tokens: tuple[str, ...] = CONTROL_TOKENS,
) -> ParsedRow:
    """Normalize one row of format `fmt`; raises `Rejected` when a rule is broken.

    `field_name`: the source's own name for the format's main field (`MAIN_FIELD`); `control_tokens`: one of
    `CONTROL_TOKEN_MODES`; `model_control_tokens`: the job's model's (`ControlTokenPolicy.tokens`)."""
    if not isinstance(value, dict):
        raise Rejected("unrecognized_format", f"expected a JSON object, got {type(value).__name__}")
    if field_name and fmt in MAIN_FIELD:
        if value.get(field_name) is None:
            raise Rejected("unrecognized_format", f"no {field_name!r} field (mapped as {fmt}'s {MAIN_FIELD[fmt]!r})")
        value = {key: item for key, item in value.items() if key != field_name} | {MAIN_FIELD[fmt]: value[field_name]}
    if fmt == TEXT:
        raise Rejected(
            "not_a_conversation",
            "a plain-text row, not a conversation; to generate from it, map its field as the prompt "
            "(source spec NAME@prompt:FIELD=URI)",
        )
    if not _has_fields_of(value, fmt):
        raise Rejected("unrecognized_format", f"no {fmt} field ({_expected_fields(fmt)}); keys: {sorted(value)[:12]}")
    _reject_media_fields(value)
    extra = _extra_fields(value, fmt)
    row_id = source_id(value)
    if fmt == "alpaca":
        messages = _alpaca_messages(value)
    elif fmt == "prompt":
        messages = _prompt_messages(value)
    elif fmt == HH_RLHF:
        messages = _system_field(value) + transcript_messages(value["chosen"], "the transcript")
    elif fmt == ULTRACHAT:
        messages = _system_field(value) + alternating_messages(value["data"], "data")
    elif fmt == OASST:
        thread, counts = oasst_thread(value)
        messages = [_canonical(message, f"message {index} of the thread") for index, message in enumerate(thread)]
        extra |= counts
        row_id = row_id or oasst_source_id(value)
    else:
        messages = _system_field(value) + _message_list(_first_present(value, _MESSAGE_LIST_FIELDS[fmt]))
    check_structure(messages)
    for message in messages:  # a loop, not any(): this runs for every row
        if message.get("tool_calls"):
            pair_tool_results(messages)
            break
    tools = _tools(value)
    extra.pop(CONTROL_TOKENS_KEY, None)
    if control_tokens == CONTROL_TOKENS_LITERAL:
        return ParsedRow(messages, row_id, extra | {CONTROL_TOKENS_KEY: CONTROL_TOKENS_LITERAL}, tools)
    pattern = control_token_pattern(model_control_tokens)
    _reject_control_tokens(messages, pattern)
    found = pattern.search(json.dumps(tools, ensure_ascii=False)) if tools else None
    if found:
        raise Rejected("control_tokens", f"a tool definition holds the control token {found.group()!r}")
    return ParsedRow(messages, row_id, extra, tools)


def _canonical(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A `{role, content}` message of a layout read here, its content checked as every message's is."""
    allow_empty = message["role"] == "assistant"
    return {"role": message["role"], "content": flatten_content(message["content"], where, allow_empty=allow_empty)}


def check_structure(messages: list[dict[str, Any]]) -> None:
    """Turn-order rules on canonical messages."""
    roles = [m["role"] for m in messages]
    if "user" not in roles:
        raise Rejected("no_user_turn", f"roles {roles[:8]}" if roles else "no messages")
    if roles.count("system") > (roles[0] == "system"):
        raise Rejected("misplaced_system", f"system message at index {roles.index('system', 1)}")
    first_turn = roles[1] if roles[0] == "system" else roles[0]
    if first_turn != "user":
        raise Rejected("starts_with_assistant", f"the first message after the system prompt is a {first_turn} message")
    if "tool" not in roles:
        return
    for index, message in enumerate(messages):
        if message["role"] != "tool":
            continue
        before = messages[index - 1] if index else {"role": None}
        if before["role"] != "tool" and not before.get("tool_calls"):
            raise Rejected("orphan_tool_result", f"message {index} is a tool result that follows no tool call")


def _has_fields_of(value: dict[str, Any], fmt: str) -> bool:
    return _first_present(value, _FORMAT_FIELDS[fmt]) is not None


def _expected_fields(fmt: str) -> str:
    return " or ".join(_FORMAT_FIELDS[fmt])


def _first_present(value: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The first of `keys` that the row holds (not null); None if none. (Loops, not generators, in the helpers
    that every row passes through: a generator costs more than the lookups it makes.)"""
    for key in keys:
        found = value.get(key)
        if found is not None:
            return found
    return None


def _reject_media_fields(value: dict[str, Any]) -> None:
    if value.keys().isdisjoint(_MEDIA_FIELDS):
        return
    for key in _MEDIA_FIELDS:
        if value.get(key):
            raise Rejected("image_content", f"the row carries media ({key!r}); only text is sent to the fleet")


def _reject_control_tokens(messages: list[dict[str, Any]], pattern: re.Pattern[str]) -> None:
    for message in messages:
        if len(message) > 2:
            break
    else:  # plain {role, content} messages: one search for all
        if pattern.search("\n".join([message["content"] for message in messages])) is None:
            return
    for index, message in enumerate(messages):
        for key in ("content", "reasoning_content"):
            found = pattern.search(message.get(key) or "")
            if found:
                raise Rejected(
                    "control_tokens",
                    f"message {index} ({message['role']}) {key} holds the control token {found.group()!r}, "
                    "which would render as a real turn marker",
                )
        for call in message.get("tool_calls") or ():
            found = pattern.search(json.dumps(call, ensure_ascii=False))  # its function and its id
            if found:
                raise Rejected("control_tokens", f"message {index} has a tool call holding {found.group()!r}")


def _parsed_json(value: Any, what: str, reason: str) -> Any:
    """`value`, or what it encodes when the source stores JSON as a string."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise Rejected(reason, f"{what} is a string that is not valid JSON ({exc})") from exc


def _tools(value: dict[str, Any]) -> list[dict[str, Any]] | None:
    key = _LEADERBOARD_TOOL_FIELD if isinstance(value.get(_LEADERBOARD_TOOL_FIELD), list) else None
    for field_name in _TOOL_FIELDS:
        if value.get(field_name) is not None:
            key = field_name
            break
    if key is None:
        return None
    tools = _parsed_json(value[key], f"{key!r}", "bad_tool_definition")
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise Rejected("bad_tool_definition", f"{key!r} is not a list of tool objects")
    wrapped = [tool if tool.get("type") == "function" and "function" in tool else _wrap(tool) for tool in tools]
    for index, tool in enumerate(wrapped):
        function = tool["function"]
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Rejected("bad_tool_definition", f"tool {index} of {key!r} has no name")
        if "parameters" in function:
            tool["function"] = function | {"parameters": _standard_schema(function["parameters"])}
    return wrapped or None


def _standard_schema(schema: Any) -> Any:
    """A JSON schema with the types some datasets spell as Python's (`_SCHEMA_TYPES`) renamed, at every depth."""
    if isinstance(schema, list):
        return [_standard_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    standard = {key: _standard_schema(item) for key, item in schema.items()}
    kind = schema.get("type")
    if isinstance(kind, str):
        standard["type"] = _SCHEMA_TYPES.get(kind, kind)
    elif isinstance(kind, list):
        standard["type"] = [_SCHEMA_TYPES.get(item, item) if isinstance(item, str) else item for item in kind]
    return standard


def _wrap(tool: dict[str, Any]) -> dict[str, Any]:
    if "input_schema" in tool and "parameters" not in tool:
        # Anthropic's definition: the same JSON schema under another name.
        tool = {("parameters" if key == "input_schema" else key): item for key, item in tool.items()}
    return {"type": "function", "function": tool}


def _message_list(items: Any) -> list[dict[str, Any]]:
    if not isinstance(items, list):
        raise Rejected("unrecognized_format", f"expected a list of messages, got {type(items).__name__}")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise Rejected("unrecognized_format", f"message {index} is a {type(item).__name__}, not an object")
        plain = _plain_message(item)
        if plain is not None:
            messages.append(plain)
            continue
        # Harmony writes one message per channel: a turn's reasoning, calls and answer are one assistant turn.
        harmony = item.get("channel") is not None
        for message in _messages(item, index):
            previous = messages[-1] if messages else None
            only_calls = message.get("tool_calls") and not message["content"].strip()
            joins = message["role"] == "assistant" and (only_calls or harmony)
            if joins and previous is not None and previous["role"] == "assistant":
                # A reply then its call, or parallel calls written one per message, are one assistant turn.
                _merge_into(previous, message)
            else:
                messages.append(message)
    return messages


def _plain_message(item: dict[str, Any]) -> dict[str, Any] | None:
    """The canonical form of the commonest message, `{role, content}` or `{from, value}` with text content and
    nothing else, without the general path's checks; None for any other message (the general path reads it)."""
    if len(item) != 2:
        return None
    raw_role = item.get("role", item.get("from"))
    content = item.get("content", item.get("value"))
    if type(content) is not str or type(raw_role) is not str:
        return None
    role = _PLAIN_ROLES.get(raw_role)
    # `not content.isspace()` is `content.strip()` without the copy (an empty text is not a space)
    if role is None or not (content and not content.isspace() if role != "assistant" else "<think>" not in content):
        return None  # an empty text, a leading think block: the general path says or does what it must
    return {"role": role, "content": content}


def _merge_into(previous: dict[str, Any], message: dict[str, Any]) -> None:
    if message["content"].strip():
        previous["content"] += message["content"]
    if message.get("tool_calls"):
        previous["tool_calls"] = previous.get("tool_calls", []) + message["tool_calls"]
    reasoning = message.get("reasoning_content")
    if reasoning and not previous.get("reasoning_content"):
        previous["reasoning_content"] = reasoning
    elif reasoning and reasoning != previous["reasoning_content"]:
        previous["reasoning_content"] += "\n\n" + reasoning


def _messages(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The canonical messages of one source message: one, or, when it holds tool results, one per result."""
    raw_role = item.get("role", item.get("from"))
    role_name = raw_role.strip().lower() if isinstance(raw_role, str) else None
    content = item["content"] if "content" in item else item.get("value")
    where = f"message {index} ({role_name})"
    if role_name in _CALL_ROLES:
        # Reasoning datasets write the thought before the call's JSON: `<think>...</think>{"name": ...}`.
        inline = _LEADING_THINK.match(content) if isinstance(content, str) else None
        calls = _parsed_json(content[inline.end() :] if inline else content, f"{where} call", "bad_tool_call")
        call_message = {"role": "assistant", "content": "", "tool_calls": _tool_calls(calls, where)}
        return [call_message | ({"reasoning_content": inline.group(1).strip()} if inline else {})]
    role = _ROLE_ALIASES.get(role_name or "")
    if role is None:
        raise Rejected("unknown_role", f"message {index} has role {raw_role!r}")
    if role == "assistant" and item.get("channel") is not None:
        message = harmony_message(item, flatten_content(content, where, allow_empty=True), where)
        if message.get("tool_calls"):
            message["tool_calls"] = _tool_calls(message["tool_calls"], where)
        return [message]
    if not isinstance(content, list):
        parts = None
    else:
        parts = split_parts(content, where)
        content = parts.joined_text
    if role != "assistant":
        return _asking_messages(item, role, content, parts, where)
    return [_assistant_message(item, content, parts, where)]


def _asking_messages(item: dict[str, Any], role: str, content: Any, parts: Any, where: str) -> list[dict[str, Any]]:
    """A system, user or tool message; tool-result parts (Anthropic's user message of results) become tool turns."""
    if parts is not None and (parts.reasoning or parts.calls):
        kind = "reasoning" if parts.reasoning else "a tool call"
        raise Rejected("misplaced_part", f"{where} holds {kind}; only an assistant message can")
    if (parts is None or not parts.results) and role != "tool":
        return [{"role": role, "content": flatten_content(content, where)}]
    if parts is None or not parts.results:  # a tool message: the call it names is the message's (OpenAI's)
        return [_result_message(content, source_call_id(item, RESULT_ID_KEYS, "unpaired_tool_result", where), where)]
    if role == "system":
        raise Rejected("misplaced_part", f"{where} holds tool results")
    results = [_result_message(result.text, result.call_id, where) for result in parts.results]
    if not content.strip():
        return results
    return [*results, {"role": role, "content": flatten_content(content, where)}]


def _result_message(content: Any, call_id: str | None, where: str) -> dict[str, Any]:
    """A tool message, with the id of the call it answers where the source names it (`tool_call_ids` pairs the rest)."""
    message = {"role": "tool", "content": flatten_content(content, where)}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def _assistant_message(item: dict[str, Any], content: Any, parts: Any, where: str) -> dict[str, Any]:
    if parts is not None and parts.results:
        raise Rejected("misplaced_part", f"{where} holds a tool result; tool results follow the call as their own turn")
    message: dict[str, Any] = {"role": "assistant", "content": flatten_content(content, where, allow_empty=True)}
    reasoning = next((item[key] for key in _REASONING_FIELDS if item.get(key) is not None), None)
    if reasoning is None and parts is not None and parts.reasoning:
        reasoning = parts.joined_reasoning
    inline = _LEADING_THINK.match(message["content"])
    if inline:
        reasoning = inline.group(1) if reasoning is None else reasoning
        message["content"] = message["content"][inline.end() :]
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise Rejected("non_string_content", f"{where} has {type(reasoning).__name__} reasoning")
        message["reasoning_content"] = reasoning.strip()
    calls = item.get("tool_calls") or ([item["function_call"]] if item.get("function_call") else [])
    calls = (calls if isinstance(calls, list) else [calls]) + (parts.calls if parts is not None else [])
    if calls:
        message["tool_calls"] = _tool_calls(calls, where)
    return message


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """Calls in the chat template's form: `{"type": "function", "function": {"name", "arguments": {...}}}`, and the
    source's `id` where it has one (`tool_call_ids` makes up the others)."""
    calls = calls if isinstance(calls, list) else [calls]
    normalized = []
    for number, call in enumerate(calls):
        call = _parsed_json(call, f"{where} call {number}", "bad_tool_call")
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise Rejected("bad_tool_call", f"{where} call {number} has no function name")
        arguments = _parsed_json(function.get("arguments", {}), f"{where} call {number} arguments", "bad_tool_call")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise Rejected("bad_tool_call", f"{where} call {number} arguments are a {type(arguments).__name__}")
        call_id = source_call_id(call, CALL_ID_KEYS, "bad_tool_call", f"{where} call {number}")
        normalized.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
        if call_id is not None:
            normalized[-1]["id"] = call_id
    if not normalized:
        raise Rejected("bad_tool_call", f"{where} has an empty list of calls")
    return normalized


def flatten_content(content: Any, where: str, *, allow_empty: bool = False) -> str:
    """Message content as text: a string, or a list of text parts joined as the chat template does."""
    if isinstance(content, list):
        parts = split_parts(content, where)
        if parts.reasoning or parts.calls or parts.results:
            raise Rejected(
                "misplaced_part", f"{where} holds reasoning, tool calls or tool results where only text fits"
            )
        content = parts.joined_text
    if content is None and allow_empty:
        return ""
    if content is None:
        raise Rejected("empty_content", f"{where} has no content")
    if not isinstance(content, str):
        raise Rejected("non_string_content", f"{where} has {type(content).__name__} content")
    if not content.strip() and not allow_empty:
        raise Rejected("empty_content", f"{where} is empty or whitespace only")
    return content


def _system_field(value: dict[str, Any]) -> list[dict[str, Any]]:
    system = value.get("system")
    if system is None or (isinstance(system, str) and not system.strip()):
        return []
    return [{"role": "system", "content": flatten_content(system, "system field")}]


def _alpaca_messages(value: dict[str, Any]) -> list[dict[str, Any]]:
    messages = _system_field(value)
    history = value.get("history") or []
    if not isinstance(history, list):
        raise Rejected("unrecognized_format", f"history is a {type(history).__name__}, not a list of pairs")
    for index, pair in enumerate(history):
        if not isinstance(pair, list) or len(pair) != 2:
            raise Rejected("unrecognized_format", f"history[{index}] is not a [query, answer] pair")
        messages.append({"role": "user", "content": flatten_content(pair[0], f"history[{index}] query")})
        answer = flatten_content(pair[1], f"history[{index}] answer", allow_empty=True)
        messages.append({"role": "assistant", "content": answer})
    instruction = flatten_content(value.get("instruction"), "instruction")
    extra_input = _first_present(value, _ALPACA_INPUT_FIELDS)
    if extra_input is not None and not isinstance(extra_input, str):
        raise Rejected("non_string_content", f"input has {type(extra_input).__name__} content")
    user = f"{instruction}\n\n{extra_input}" if extra_input and extra_input.strip() else instruction
    messages.append({"role": "user", "content": user})
    output = _first_present(value, _ALPACA_OUTPUT_FIELDS)
    # A missing or empty output is a prompt without a reference answer: fine, the answer is regenerated.
    if output is not None and not (isinstance(output, str) and not output.strip()):
        messages.append({"role": "assistant", "content": flatten_content(output, "output")})
    return messages


def _prompt_messages(value: dict[str, Any]) -> list[dict[str, Any]]:
    prompt = _first_present(value, _PROMPT_FIELDS)
    refuse_flattened(value, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(turn, list) for turn in prompt):
        return _system_field(value) + _turn_messages(prompt)
    if isinstance(prompt, list) and all(isinstance(item, dict) for item in prompt):
        return _system_field(value) + _message_list(prompt)
    return _system_field(value) + [{"role": "user", "content": flatten_content(prompt, "prompt")}]


def _turn_messages(turns: list[list[Any]]) -> list[dict[str, Any]]:
    """The messages of a list of turns, each a list of messages (the leaderboard's `question`). A turn that follows
    another's asking messages gets an empty assistant message first, the source's missing answer, so each turn's
    reply is generated on its own; an empty turn (the leaderboard writes some) adds nothing."""
    messages: list[dict[str, Any]] = []
    for number, turn in enumerate(turns):
        if not all(isinstance(item, dict) for item in turn):
            raise Rejected("unrecognized_format", f"turn {number} of the prompt is not a list of message objects")
        turn_messages = _message_list(turn)
        if turn_messages and messages and messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "content": ""})
        messages += turn_messages
    return messages


def source_id(value: dict[str, Any]) -> str | None:
    """The row's own id: a non-blank string or an integer in one of ID_FIELDS."""
    for key in ID_FIELDS:
        found = value.get(key)
        if isinstance(found, str) and found.strip():
            return found
        if isinstance(found, int) and not isinstance(found, bool):
            return str(found)
    return None


# The fields of a row of each format that become its messages (beyond the message-list fields), not `extra`.
_FORMAT_CONSUMED_FIELDS = {
    "alpaca": ("instruction", *_ALPACA_INPUT_FIELDS, *_ALPACA_OUTPUT_FIELDS, "history"),
    "prompt": _PROMPT_FIELDS,
    HH_RLHF: ("chosen", "rejected"),
    ULTRACHAT: ("data",),
    OASST: ("prompt", "replies", "text", "role", "message_tree_id", "message_id", "parent_id"),
}


@functools.cache
def _consumed_fields(fmt: str) -> frozenset[str]:
    """The fields of a row of format `fmt` that become its messages, id or tools (not `extra`)."""
    consumed = {*ID_FIELDS, *_TOOL_FIELDS, "system", *_MESSAGE_LIST_FIELDS.get(fmt, ())}
    return frozenset(consumed | set(_FORMAT_CONSUMED_FIELDS.get(fmt, ())))


def _extra_fields(value: dict[str, Any], fmt: str) -> dict[str, Any]:
    consumed = _consumed_fields(fmt)
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
