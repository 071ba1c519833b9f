"""How a template takes tool calls (`template_calls`): probed by rendering a probe call, and the conversations' calls
given to it in that form; the ids fitted only where the template requires a form, the pairs unchanged."""

from __future__ import annotations

import re

import jinja2
import pytest

from dagster_project.template_calls import ToolCallForm, as_template_takes, fitted_call_id, probe_tool_call

FITS_NINE = re.compile("[A-Za-z0-9]{9}")
OPENAI_ID = "call_Xq7vB2mWk9RtLp4sHd6Yc3Aa"


def conversation(call_id: str) -> list[dict]:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}, "id": call_id}
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "4C", "tool_call_id": call_id},
    ]


def render_with(template: str):
    """A real Jinja template's render of messages, with the `raise_exception` transformers gives templates."""

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    compiled = jinja2.Environment().from_string(template)
    return lambda messages: compiled.render(messages=messages, raise_exception=raise_exception)


# Writes each call's id and refuses one that is not `length` characters long, as Mistral's template does with 9.
ID_OF_LENGTH = """{%- for m in messages %}{%- for c in m.get('tool_calls', []) %}
{%- if c.id|length != LENGTH %}{{ raise_exception('bad id') }}{% endif %}[{{ c.id }}]{{ c.function.arguments|tojson }}
{%- endfor %}{% if m.role == 'tool' %}({{ m.tool_call_id }}){% endif %}{%- endfor %}"""
IGNORES_IDS = "{% for m in messages %}{{ m.content }}{% endfor %}"
# Joins a call's arguments to text, as DeepSeek-R1's template does: it fails on an object.
JOINS_ARGUMENTS = (
    "{% for m in messages %}{% for c in m.get('tool_calls', []) %}{{ '\\n' + c.function.arguments }}{% endfor %}"
    "{% endfor %}"
)


def test_an_id_that_fits_is_kept_and_another_becomes_letters_and_digits_of_that_length() -> None:
    assert fitted_call_id("abcDEF123", 9) == "abcDEF123"
    fitted = fitted_call_id(OPENAI_ID, 9)
    assert FITS_NINE.fullmatch(fitted) and fitted == fitted_call_id(OPENAI_ID, 9)
    # Not letters and digits, or not that long: fitted, each to its own id.
    others = {fitted_call_id(call_id, 9) for call_id in ("call_1234", "abcdefgh", "abcdefghij", "ünïcödé12", "call_1")}
    assert len(others) == 5 and all(FITS_NINE.fullmatch(call_id) for call_id in others)
    assert len(fitted_call_id(OPENAI_ID, 12)) == 12


def test_a_template_that_takes_any_id_is_given_the_conversation_as_it_is() -> None:
    messages = conversation(OPENAI_ID)
    assert as_template_takes(messages, ToolCallForm(known=True)) is messages


def test_a_template_that_requires_a_length_gets_the_call_and_its_result_the_same_fitted_id() -> None:
    messages = conversation(OPENAI_ID)
    taken = as_template_takes(messages, ToolCallForm(id_length=9))
    fitted = taken[1]["tool_calls"][0]["id"]
    assert FITS_NINE.fullmatch(fitted) and taken[2]["tool_call_id"] == fitted
    assert messages == conversation(OPENAI_ID)  # the conversation keeps the source's id
    kept = conversation("Nemo0Call")
    assert as_template_takes(kept, ToolCallForm(id_length=9)) == kept


def test_a_template_that_joins_arguments_to_text_gets_them_as_json_text() -> None:
    taken = as_template_takes(conversation(OPENAI_ID), ToolCallForm(arguments_as_text=True))
    assert taken[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert taken[1]["tool_calls"][0]["id"] == OPENAI_ID


@pytest.mark.parametrize("length", [9, 12])
def test_the_probe_finds_the_id_length_a_template_requires(length: int) -> None:
    render = render_with(ID_OF_LENGTH.replace("LENGTH", str(length)))
    form = probe_tool_call(render)
    assert form == ToolCallForm(arguments_as_text=False, known=False, id_length=length)
    text = render(as_template_takes(conversation(OPENAI_ID), form))
    fitted = re.findall(r"\[(\w+)\]", text)
    assert len(fitted[0]) == length and text.endswith(f"({fitted[0]})")


def test_the_probe_of_a_template_that_ignores_ids_or_joins_arguments() -> None:
    assert probe_tool_call(render_with(IGNORES_IDS)) == ToolCallForm()
    assert probe_tool_call(render_with(JOINS_ARGUMENTS)) == ToolCallForm(arguments_as_text=True)


def test_a_template_that_refuses_every_probe_writes_calls_in_no_known_form() -> None:
    assert probe_tool_call(render_with("{{ raise_exception('no tools here') }}")) == ToolCallForm()
