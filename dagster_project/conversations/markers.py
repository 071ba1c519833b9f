"""Turn markers: every control token of a rendered prompt is one its chat template wrote.

Content holding the model's control-token text (`TokenizerProfile.control_tokens`: Qwen3.6's `<|im_start|>`,
DeepSeek's `<｜User｜>`, Mistral's `[INST]`, ...) is quarantined at ingest (`control_tokens: quarantine`, the
default), so no text can forge a turn. This is the gate behind that rule, with the same model's list: it takes the
prompt of each conversation's last generated turn (which holds every message any of its prompts shows) and, where
its messages or tools hold control-token text, counts the control tokens of its render against those the template
itself writes (the render with the content's control-token text held out, `tokenizer.template_render`), so
control-token text that reached a conversation any other way fails it. A prompt whose content holds none renders
only the template's own.

A conversation read with `control_tokens: literal` (marked in its `extra`) may hold such text on purpose: its
prompt ids encode it as ordinary text (`tokenizer.render_prompt_ids`), so for it the gate counts the control ids
of those prompt ids.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dagster_project.conversations.turns import prompt_messages
from dagster_project.ingest.formats import CONTROL_TOKENS_KEY, CONTROL_TOKENS_LITERAL
from dagster_project.records import HISTORY_SOURCE, Conversation
from dagster_project.tokenizer import (
    control_token_pattern,
    holds_control_tokens,
    render_prompt_ids,
    render_text,
    template_render,
    tokenizer_profile,
)


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
    messages, tools = last_prompt(conversation), conversation.tools
    control = tokenizer_profile(tokenizer).control_tokens
    if not holds_control_tokens([messages, tools], control):
        return None
    template = template_render(tokenizer, messages, add_generation_prompt=True, tools=tools, **flags)
    expected = _control_tokens_in(template.text, control)
    if conversation.extra.get(CONTROL_TOKENS_KEY) == CONTROL_TOKENS_LITERAL:
        by_id = {int(tokenizer.convert_tokens_to_ids(token)): token for token in control}
        ids = render_prompt_ids(tokenizer, messages, tools=tools, **flags)
        found = Counter(by_id[token_id] for token_id in ids if token_id in by_id)
    else:
        text = render_text(tokenizer, messages, add_generation_prompt=True, tools=tools, **flags)
        found = _control_tokens_in(text, control)
    if found == expected:
        return None
    return f"{dict(found)} in its last prompt, expected {dict(expected)}"


def _control_tokens_in(text: str, control: tuple[str, ...]) -> Counter[str]:
    return Counter(marker.group() for marker in control_token_pattern(control).finditer(text))
