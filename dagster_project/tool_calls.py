"""Qwen3.6 tool calls as the model writes them, and as the official chat template renders an assistant message's
`tool_calls`:

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A string value is written as is, any other value as JSON. The declared tools are the JSON lines of the system
prompt's `<tools>` block. `parse_tool_calls` reads an answer's calls back into `tool_calls` and counts the blocks
that do not follow the format (the training gate's `malformed tool calls` figure).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_CALL = re.compile(
    r"<tool_call>\n<function=([^>\n]+)>\n((?:<parameter=[^>\n]+>\n.*?\n</parameter>\n)*)</function>\n</tool_call>",
    re.DOTALL,
)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n", re.DOTALL)


def declared_tools(prompt_text: str) -> dict[str, list[str]]:
    """Tool name → its parameter names, from the `<tools>` block the template renders (empty: no tools)."""
    block = _TOOLS.search(prompt_text)
    if block is None:
        return {}
    tools: dict[str, list[str]] = {}
    for line in block.group(1).splitlines():
        try:
            tool = json.loads(line)
        except ValueError:
            continue  # a tool whose JSON spans lines cannot be told from text: it is not offered
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            tools[function["name"]] = list(properties) if isinstance(properties, dict) else []
    return tools


def render_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call, exactly as the official template renders it."""
    parameters = "".join(f"<parameter={key}>\n{_value(value)}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)  # the template's `tojson`


@dataclass
class ParsedCalls:
    """The calls of one answer: its text before them, the well-formed calls, and how many blocks were malformed."""

    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0

    @property
    def total(self) -> int:
        return len(self.calls) + self.malformed


def parse_tool_calls(answer: str) -> ParsedCalls:
    """Split an answer (the text after `</think>`) into its content and `tool_calls`; a `<tool_call>` block that
    does not follow the format exactly, or text after the calls, is counted as malformed."""
    start = answer.find(OPEN)
    if start < 0:
        return ParsedCalls(answer)
    parsed = ParsedCalls(answer[:start].rstrip("\n"))
    position = start
    while position < len(answer):
        call = _CALL.match(answer, position)
        if call is None:
            parsed.malformed += max(1, answer.count(OPEN, position))
            break
        arguments = {key: value for key, value in _PARAMETER.findall(call.group(2))}
        parsed.calls.append({"type": "function", "function": {"name": call.group(1), "arguments": arguments}})
        position = call.end()
        if answer.startswith("\n" + OPEN, position):
            position += 1
    return parsed
