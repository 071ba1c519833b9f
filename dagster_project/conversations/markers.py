"""Turn markers: a rendered prompt holds exactly one `<|im_start|>` per turn its messages make.

Content holding control-token text is quarantined at ingest (`control_tokens: quarantine`, the default), so no
text can forge a turn. This is the gate behind that rule: it renders the prompt of each conversation's last
generated turn (which holds every message any of its prompts shows) and counts the control tokens in its text, so
control-token text that reached a conversation any other way fails it. The template makes one turn for the system
prompt and the tool definitions together, one per user or assistant message, one per run of tool results, and
one for the generation prompt; `<|im_end|>` closes every turn but the last, and no other control token appears.

A conversation read with `control_tokens: literal` (marked in its `extra`) may hold such text on purpose: its
prompt ids encode it as ordinary text (`tokenizer.render_prompt_ids`), so for it the gate counts the control
tokens the template wrote, the content's text held out the same way (`tokenizer.template_render`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dagster_project.conversations.turns import prompt_messages
from dagster_project.ingest.formats import CONTROL_TOKENS_KEY, CONTROL_TOKENS_LITERAL
from dagster_project.records import HISTORY_SOURCE, Conversation
from dagster_project.tokenizer import CONTROL_TOKENS, render_text, template_render

TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"


def expected_turns(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """Turns of the prompt that renders `messages` (with `tools`) and asks for the next reply."""
    turns = 1 if tools or messages[0]["role"] == "system" else 0
    previous = None
    for message in messages:
        role = message["role"]
        if role != "system" and not (role == "tool" and previous == "tool"):
            turns += 1
        previous = role
    return turns + 1


def last_prompt(conversation: Conversation) -> list[dict[str, Any]]:
    """The messages of the last generated turn's prompt, the source's answers standing in for generated ones."""
    last = conversation.num_turns - 1
    if conversation.history == HISTORY_SOURCE:
        return prompt_messages(conversation, last, [])
    return [
        {"role": m["role"], "content": m["content"]}
        for m in conversation.messages[: conversation.generate_after[last] + 1]
    ]


def marker_mismatch(tokenizer: Any, conversation: Conversation, **flags: bool) -> str | None:
    """What is wrong with the control tokens of the conversation's last prompt, or None when they are exact."""
    messages = last_prompt(conversation)
    if conversation.extra.get(CONTROL_TOKENS_KEY) == CONTROL_TOKENS_LITERAL:
        text = template_render(tokenizer, messages, add_generation_prompt=True, tools=conversation.tools, **flags).text
    else:
        text = render_text(tokenizer, messages, add_generation_prompt=True, tools=conversation.tools, **flags)
    found = Counter({token: text.count(token) for token in CONTROL_TOKENS if token in text})
    turns = expected_turns(messages, conversation.tools)
    expected = Counter({TURN_START: turns, TURN_END: turns - 1})
    if found == expected:
        return None
    return f"{dict(found)} in its last prompt, expected {dict(expected)}"
