"""Why an input row was not turned into a conversation.

Every input row ends up either normalized or quarantined with one of these reason codes, never silently
dropped. The ingest stage (`raw_prompts`) applies the rules that depend only on the row itself; the
conversations stage applies the ones that depend on the multi-turn policy or on other rows (the token
budget, duplicates). Both write their rejected rows as JSON Lines with the code and a human detail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Reason code -> what it means (shown in the asset's metadata and in docs).
REASONS: dict[str, str] = {
    "invalid_utf8": "the row is not valid UTF-8 (or holds unpaired surrogates that cannot be encoded)",
    "invalid_json": "a JSON Lines row that does not parse",
    "line_too_long": "a JSON Lines row longer than the ingest's max_line_bytes: skipped unread, its start kept",
    "too_deep": "a row nested deeper than the JSON parser goes (thousands of levels): no dataset row is",
    "unreadable_file": "a file, or its rest, that cannot be split into rows: compressed data cut short or corrupt, a "
    "broken JSON array, an element over max_line_bytes (one record per file, after its complete rows; the other files "
    "go on)",
    "unrecognized_format": "the row lacks the fields of its file's format (or is not a JSON object)",
    "not_a_conversation": "a plain-text row (a pre-training corpus); map its field as the prompt to use it",
    "unparsable_transcript": "an hh-rlhf transcript whose 'Human:'/'Assistant:' turns do not alternate from a "
    "'Human:' turn",
    "flattened_layout": "a column override would read a transcript or a message tree as one message (its answers "
    "or replies lost): read the source in its own format",
    "empty_content": "a message whose content is missing, empty or whitespace only (where a prompt shows it)",
    "non_string_content": "message content that cannot be flattened to text (numbers, objects, unknown parts)",
    "unknown_part": "a content part of a type the ingest does not read (the type is named in the detail)",
    "misplaced_part": "reasoning, a tool call or a tool result in a message that cannot hold it",
    "image_content": "images, video or audio in the row: the fleet is sent text only, never the media",
    "control_tokens": "the model's control tokens (Qwen3.6's <|im_start|>, <|im_end|>, ..., DeepSeek's <｜User｜>) in "
    "the text: they would forge turns",
    "unknown_role": "a message role that is not system/user/assistant/tool or a known alias",
    "bad_tool_definition": "a `tools` field that is not a list of named tool definitions (or bad JSON)",
    "bad_tool_call": "an assistant tool call without a function name, with arguments that are not an object, or with "
    "the id of another call of its message",
    "orphan_tool_result": "a tool result that follows no tool call",
    "unpaired_tool_result": "a tool result that answers none of the calls before it: more results than calls, a call "
    "id the message did not make, or a call answered twice",
    "no_user_turn": "no user message at all",
    "starts_with_assistant": "the first message after the system prompt is not a user message",
    "misplaced_system": "a system message after the first message (the chat template refuses it)",
    "too_long": "the prompt of the last generated turn is longer than the token budget",
    "duplicate": "the same generation requests as an earlier row (first kept; not a bad row: counted on its own, "
    "against duplicate_rate_max)",
    "duplicate_id": "the id it would get is already taken by an earlier row",
}

# The reason of an exact duplicate: set aside with the others, but not a bad row (its own rate and limit).
DUPLICATE = "duplicate"
RAW_EXCERPT_CHARS = 2000


class Rejected(Exception):
    """A row breaks a rule; `reason` is one of REASONS, `detail` says where and why."""

    def __init__(self, reason: str, detail: str):
        if reason not in REASONS:
            raise ValueError(f"unknown quarantine reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def quarantine_record(
    *,
    stage: str,
    reason: str,
    detail: str,
    source: str,
    source_file: str,
    source_row: int,
    id: str | None = None,
    raw: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    record = {
        "stage": stage,
        "reason": reason,
        "detail": detail,
        "id": id,
        "source": source,
        "source_file": source_file,
        "source_row": source_row,
        **extra,
    }
    if raw is not None:
        record["raw"] = raw[:RAW_EXCERPT_CHARS]
    return record


@dataclass
class SourceCounts:
    """Rows read from one source: rows = kept + quarantined."""

    rows: int = 0
    kept: int = 0
    quarantined: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass
class Accounting:
    """Rows in, rows kept, rows quarantined by reason, overall and per source."""

    rows: int = 0
    kept: int = 0
    by_reason: Counter = field(default_factory=Counter)
    by_source: dict[str, SourceCounts] = field(default_factory=dict)

    @property
    def quarantined(self) -> int:
        return sum(self.by_reason.values())

    def keep(self, source: str, rows: int = 1) -> None:
        self._count_row(source, rows).kept += rows
        self.kept += rows

    def reject(self, source: str, reason: str) -> None:
        counts = self._count_row(source)
        counts.quarantined += 1
        counts.by_reason[reason] = counts.by_reason.get(reason, 0) + 1
        self.by_reason[reason] += 1

    def add(self, other: Accounting) -> None:
        """Count `other`'s rows too (the rows of a later file: reasons keep the order they first appeared in)."""
        self.rows += other.rows
        self.kept += other.kept
        self.by_reason.update(other.by_reason)
        for source, theirs in other.by_source.items():
            counts = self.by_source.setdefault(source, SourceCounts())
            counts.rows += theirs.rows
            counts.kept += theirs.kept
            counts.quarantined += theirs.quarantined
            for reason, count in theirs.by_reason.items():
                counts.by_reason[reason] = counts.by_reason.get(reason, 0) + count

    def _count_row(self, source: str, rows: int = 1) -> SourceCounts:
        self.rows += rows
        counts = self.by_source.setdefault(source, SourceCounts())
        counts.rows += rows
        return counts
