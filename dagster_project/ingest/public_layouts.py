"""Layouts public prompt sets come in that are not a list of messages, read as conversations.

* `hh_rlhf` — Anthropic's hh-rlhf: `chosen` and `rejected`, each a transcript string
  `"\\n\\nHuman: …\\n\\nAssistant: …"`. The `chosen` side is read by default (`NAME@hh_rlhf:rejected=URI` reads
  the other); the transcript is split at its speaker markers into alternating user and assistant turns, so no
  `Human:` marker is left in a message. A transcript whose turns do not alternate from a `Human:` turn, or that
  has text before its first marker, does not parse and is quarantined (`unparsable_transcript`).
* `oasst` — OpenAssistant message trees: a row that is the root message (`{message_id, text, role, replies}`,
  roles `prompter`/`assistant`), or the tree export (`{message_tree_id, prompt: {root}}`). A tree is read as one
  conversation: its **top-ranked thread**, from the root down through the best-ranked reply at each step (rank 0
  first, unranked replies after the ranked ones, deleted messages never). Every root-to-leaf path was the other
  choice; it regenerates a tree's shared first turns once per leaf (a prompt with ten ranked answers would be
  answered ten times), which buys GPU time for near-duplicate rows. Every message is accounted for: the
  conversation's `extra` records `oasst_tree_messages` (all messages of the tree, deleted ones included) and
  `oasst_thread_messages` (those on the thread kept).
* `ultrachat` — UltraChat's `data`: a list of strings alternating user, assistant, user, ….

What a column override would flatten is refused rather than read as one message (`flattened_layout`): a prompt
column holding a `Human:`/`Assistant:` transcript, or a row with `replies` (a message tree) read as a prompt.
"""

from __future__ import annotations

import re
from typing import Any

from dagster_project.ingest.quarantine import Rejected

HH_RLHF = "hh_rlhf"
OASST = "oasst"
ULTRACHAT = "ultrachat"
LAYOUTS = (HH_RLHF, OASST, ULTRACHAT)

_SPEAKER = re.compile(r"(?:^|\n\n)(Human|Assistant): ?")
_SPEAKER_ROLES = {"Human": "user", "Assistant": "assistant"}
_OASST_ROLES = {"prompter": "user", "assistant": "assistant"}
TREE_MESSAGES_KEY = "oasst_tree_messages"
THREAD_MESSAGES_KEY = "oasst_thread_messages"


def layout_of(value: dict[str, Any]) -> str | None:
    """The public layout a row is in, or None (then the message-list formats decide)."""
    prompt = value.get("prompt")
    if isinstance(prompt, dict) and isinstance(prompt.get("replies"), list):
        return OASST
    if isinstance(value.get("replies"), list) and isinstance(value.get("text"), str):
        return OASST
    chosen = value.get("chosen")
    if isinstance(chosen, str) and is_transcript(chosen):
        return HH_RLHF
    data = value.get("data")
    if isinstance(data, list) and data and all(isinstance(item, str) for item in data):
        return ULTRACHAT
    return None


def is_transcript(text: str) -> bool:
    """Whether a string is a `Human:`/`Assistant:` transcript (it opens on `Human:` and has an assistant turn)."""
    return text.lstrip().startswith("Human:") and "\n\nAssistant:" in text


def transcript_messages(text: Any, where: str) -> list[dict[str, Any]]:
    """An hh-rlhf transcript as alternating user and assistant messages; raises `Rejected` when it does not parse."""
    if not isinstance(text, str):
        raise Rejected("non_string_content", f"{where} is a {type(text).__name__}, not a transcript string")
    pieces = _SPEAKER.split(text.lstrip("\n"))
    if pieces[0].strip() or len(pieces) < 3:
        raise Rejected("unparsable_transcript", f"{where} does not open on a 'Human:' turn")
    messages = []
    for number, (speaker, content) in enumerate(zip(pieces[1::2], pieces[2::2], strict=True)):
        expected = "Human" if number % 2 == 0 else "Assistant"
        if speaker != expected:
            raise Rejected(
                "unparsable_transcript", f"{where}: turn {number} is '{speaker}:' where '{expected}:' was due"
            )
        messages.append({"role": _SPEAKER_ROLES[speaker], "content": content.rstrip()})
    return messages


def alternating_messages(items: Any, where: str) -> list[dict[str, Any]]:
    """UltraChat's `data`: strings alternating user and assistant, from a user turn."""
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise Rejected("unrecognized_format", f"{where} is not a list of strings alternating user and assistant")
    return [{"role": "user" if index % 2 == 0 else "assistant", "content": text} for index, text in enumerate(items)]


def oasst_thread(value: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The top-ranked thread of an OpenAssistant tree as messages, and the counts that account for the tree."""
    root = value["prompt"] if isinstance(value.get("prompt"), dict) else value
    thread = []
    node: dict[str, Any] | None = root
    while node is not None:
        role = _OASST_ROLES.get(node.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise Rejected("unknown_role", f"message {len(thread)} of the thread has role {node.get('role')!r}")
        thread.append({"role": role, "content": node.get("text")})
        node = _best_reply(node)
    return thread, {TREE_MESSAGES_KEY: _count_messages(root), THREAD_MESSAGES_KEY: len(thread)}


def oasst_source_id(value: dict[str, Any]) -> str | None:
    root = value["prompt"] if isinstance(value.get("prompt"), dict) else value
    found = value.get("message_tree_id") or root.get("message_tree_id") or root.get("message_id")
    return found if isinstance(found, str) and found.strip() else None


def _best_reply(node: dict[str, Any]) -> dict[str, Any] | None:
    replies = [reply for reply in node.get("replies") or () if isinstance(reply, dict) and not reply.get("deleted")]
    if not replies:
        return None

    def order(item: tuple[int, dict[str, Any]]) -> tuple[bool, float, int]:
        index, reply = item
        rank = reply.get("rank")
        ranked = isinstance(rank, int | float) and not isinstance(rank, bool)
        return (not ranked, rank if ranked else 0, index)

    return min(enumerate(replies), key=order)[1]


def _count_messages(root: dict[str, Any]) -> int:
    """Every message of a tree (a stack, not recursion: a tree from the data may be deep)."""
    count, stack = 0, [root]
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(reply for reply in node.get("replies") or () if isinstance(reply, dict))
    return count


def refuse_flattened(value: dict[str, Any], prompt: Any) -> None:
    """Refuse a row whose prompt column, read as one message, would flatten a transcript or a message tree."""
    if isinstance(value.get("replies"), list):
        raise Rejected(
            "flattened_layout",
            f"the row is a message tree ({len(value['replies'])} replies under it); read as one prompt its "
            f"replies would be dropped: read the source as NAME@{OASST}=URI",
        )
    if isinstance(prompt, str) and is_transcript(prompt):
        raise Rejected(
            "flattened_layout",
            "the prompt is a 'Human:'/'Assistant:' transcript; read as one message it would hold the answers "
            f"too: read the source as NAME@{HH_RLHF}[:FIELD]=URI",
        )
