"""Qwen3.6 tool calls read back from an answer: content, calls, and the blocks that break the format."""

from __future__ import annotations

from dagster_project.tool_calls import declared_tools, parse_tool_calls, render_call


def test_calls_parse_back_to_what_was_rendered():
    first = render_call("get_weather", {"city": "Lyon", "days": 3})
    second = render_call("get_time", {})
    parsed = parse_tool_calls(f"Let me check.\n\n{first}\n{second}")
    assert parsed.content == "Let me check."
    assert parsed.malformed == 0
    assert parsed.calls == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon", "days": "3"}}},
        {"type": "function", "function": {"name": "get_time", "arguments": {}}},
    ]
    assert parse_tool_calls("No call at all.").total == 0


def test_malformed_blocks_are_counted():
    good = render_call("get_time", {})
    unclosed = render_call("get_weather", {"city": "Lyon"}).replace("</function>\n", "")
    assert parse_tool_calls(unclosed).malformed == 1
    assert parse_tool_calls(f"{good}\n{unclosed}").total == 2
    assert parse_tool_calls(f"{good}\n{unclosed}").malformed == 1
    assert parse_tool_calls(f"{good} and then some text").malformed == 1


def test_declared_tools_are_read_from_the_rendered_system_prompt():
    prompt = (
        '<tools>\n{"type": "function", "function": {"name": "get_weather", "parameters": {"properties": {"city": {}}}}}'
        '\n{"type": "function", "function": {"name": "get_time"}}\n</tools>'
    )
    assert declared_tools(prompt) == {"get_weather": ["city"], "get_time": []}
    assert declared_tools("no tools here") == {}
