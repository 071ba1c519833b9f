"""Multi-turn policies: which assistant turns are generated, and on which history.

A turn is a reply to a user message or to tool results; a run of consecutive user (or tool-result)
messages gets one reply, after its last message. `generate_after` lists the indices of those messages,
in order.

* `all_turns` (default): every turn is generated, in order, on the model's own earlier answers
  (history `generated`). The source's assistant messages stay in `messages` as a reference, but a
  prompt never shows them: each is replaced by the generated answer of the turn it belongs to (so an
  empty source answer is no obstacle).
* `last_turn`: only the last user message's reply, with the source's assistant messages as context
  (history `source`).
* `first_turn`: only the reply to the first user turn (system prompt + first user message(s)).
* `user_only` (how the first dataset was built): assistant messages (and tool results) are removed from
  `messages`; system + user messages are kept and one reply is generated after the last user message.

**Tool-calling conversations** (an assistant tool call or a tool result anywhere) always use history
`source`: a recorded tool result answers the recorded call, so every prompt shows the recorded calls and
results before it, and every assistant turn (a call, or the answer to a result) is regenerated on that
recorded context. The model's own output, whether it calls a tool or answers, is what the training row
stores, token for token. Tool definitions are rendered by the chat template in every prompt.

**Reasoning in the source** (`reasoning_content`, split from a leading `<think>` block at ingest) is
passed with the source's assistant messages wherever history `source` shows them, and the chat template
decides what is rendered: nothing for answers before the last user message, the reasoning for a tool-loop
step after it, everything with `preserve_thinking`. With history `generated` the model's own reasoning
takes its place.
"""

from __future__ import annotations

from typing import Any

import orjson

from dagster_project.records import HISTORY_GENERATED, HISTORY_SOURCE, POLICIES, Conversation

# Which assistant messages a prompt shows: the model's own (generated) or the source's.
POLICY_HISTORY = {
    "all_turns": HISTORY_GENERATED,
    "last_turn": HISTORY_SOURCE,
    "first_turn": HISTORY_GENERATED,
    "user_only": HISTORY_GENERATED,
}
_ASKING_ROLES = ("user", "tool")


def apply_policy(messages: list[dict[str, Any]], policy: str) -> tuple[list[dict[str, Any]], list[int], str]:
    """(messages, generate_after, history) of a validated conversation under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"unknown multi-turn policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy == "user_only":
        messages = [m for m in messages if m["role"] in ("system", "user")]
    ends = turn_ends(messages)
    if not ends:
        raise ValueError("a conversation needs a user message")
    generate_after = ends if policy == "all_turns" else ends[:1] if policy == "first_turn" else ends[-1:]
    history = HISTORY_SOURCE if calls_tools(messages) else POLICY_HISTORY[policy]
    return messages, generate_after, history


def calls_tools(messages: list[dict[str, Any]]) -> bool:
    """Whether the conversation calls a tool (defining tools alone does not count)."""
    for message in messages:  # a loop, not any(): this runs for every row of the dataset
        if message["role"] == "tool" or message.get("tool_calls"):
            return True
    return False


def turn_ends(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of user or tool-result messages that end their run: one per assistant turn."""
    roles = [message["role"] for message in messages]
    after = roles[1:]
    after.append("assistant")  # the conversation's end ends the last run too
    return [
        index
        for index, (role, next_role) in enumerate(zip(roles, after))
        if next_role == "assistant" and role in _ASKING_ROLES
    ]


def request_key(conversation: Conversation) -> bytes:
    """What the conversation's generation requests depend on: equal keys, identical requests.

    The tools and the messages up to the last generated turn; with history `generated` the source's
    assistant contents are never shown to the model, so only their position counts.
    """
    upto = conversation.generate_after[-1] + 1
    if conversation.history == HISTORY_GENERATED:
        shown = [[m["role"], "" if m["role"] == "assistant" else m["content"]] for m in conversation.messages[:upto]]
    else:
        shown = [_source_message(m) for m in conversation.messages[:upto]]
    return orjson.dumps([conversation.tools, shown])


def source_messages(conversation: Conversation, upto: int) -> list[dict[str, Any]]:
    """The recorded messages before index `upto`, as a prompt with history `source` shows them."""
    return [_source_message(m) for m in conversation.messages[:upto]]


def _source_message(message: dict[str, Any]) -> dict[str, Any]:
    shown = {"role": message["role"], "content": message["content"]}
    for key in ("tool_calls", "tool_call_id", "reasoning_content"):
        if message.get(key) is not None:
            shown[key] = message[key]
    return shown


def prompt_messages(conversation: Conversation, turn: int, generated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages to render for turn `turn`, given the generated answers of the earlier turns.

    `generated[k]` is `{"content": visible answer, "reasoning_content": reasoning}` of turn k. With
    history `generated`, every run of source assistant messages after turn k's user message is replaced
    by `generated[k]`; `reasoning_content` is passed on so `preserve_thinking=True` renders it (the
    template drops it otherwise). With history `source`, `generated` is not used.
    """
    if not 0 <= turn < conversation.num_turns:
        raise ValueError(f"{conversation.id}: turn {turn} out of range (it has {conversation.num_turns})")
    upto = conversation.generate_after[turn]
    if conversation.history == HISTORY_SOURCE:
        return source_messages(conversation, upto + 1)
    context = conversation.messages[: upto + 1]
    if len(generated) < turn:
        raise ValueError(
            f"{conversation.id}: turn {turn} needs the {turn} earlier generated answers, got {len(generated)}"
        )
    prompt: list[dict[str, Any]] = []
    for index, message in enumerate(context):
        if message["role"] != "assistant":
            prompt.append({"role": message["role"], "content": message["content"]})
        elif context[index - 1]["role"] != "assistant":  # the first of a run stands for the whole run
            answered = _turn_before(conversation.generate_after, index)
            answer = generated[answered]
            prompt.append(
                {
                    "role": "assistant",
                    "content": answer["content"],
                    "reasoning_content": answer.get("reasoning_content") or "",
                }
            )
    return prompt


def _turn_before(generate_after: list[int], index: int) -> int:
    """The turn whose reply the assistant message at `index` is: the last turn before it."""
    earlier = [turn for turn, user_index in enumerate(generate_after) if user_index < index]
    if not earlier:
        raise ValueError(f"assistant message {index} answers no generated turn")
    return earlier[-1]
