"""Great Expectations 1.x suites on the normalized conversations (not dagster-ge, which needs GX 0.x).

Conversations are nested, so they are validated as three flat tables:

* `conversations` (one row per conversation): id present and unique, known policy and history,
  at least one generated turn, stored in the shard its id hashes to;
* `messages` (one row per message): role in system/user/assistant/tool, non-blank content wherever a
  prompt shows it (an assistant message counts its tool calls; the source's answers that history
  `generated` never shows are not checked), and a legal predecessor for each role (system only first, the
  first turn a user message, a tool result after a call or another result);
* `turns` (one row per generated turn): it follows a user or tool-result message that ends its run (the
  next message is an assistant answer or the end), and turns are in increasing message order.

The tables are built a chunk of whole shards at a time, so memory is bounded by the chunk. Ids hash to
one shard each, so a duplicate id always sits inside one chunk and per-chunk uniqueness is global.
GX is imported lazily: it takes seconds to import, which code locations should not pay.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dagster_project.conversations.sharding import shard_of
from dagster_project.conversations.shards import read_all_conversations
from dagster_project.records import HISTORY_GENERATED, HISTORY_SOURCE, POLICIES, ROLES, Conversation
from dagster_project.store.storage import Store

START, END = "start", "end"
# (previous role, role) pairs a valid conversation may contain.
ALLOWED_ROLE_PAIRS = [
    (START, "system"),
    (START, "user"),
    ("system", "user"),
    ("user", "user"),
    ("assistant", "user"),
    ("user", "assistant"),
    ("assistant", "assistant"),
    ("assistant", "tool"),
    ("tool", "tool"),
    ("tool", "assistant"),
    ("tool", "user"),
]
_EXAMPLES = 5
CHUNK_ROWS = 100_000


def _suite_specs(gxe: Any) -> dict[str, list[Any]]:
    """Fresh expectation objects: one object can belong to one suite only."""
    return {
        "conversations": [
            gxe.ExpectTableRowCountToBeBetween(min_value=0),
            gxe.ExpectColumnValuesToNotBeNull(column="id"),
            gxe.ExpectColumnValuesToBeUnique(column="id"),
            gxe.ExpectColumnValuesToBeInSet(column="policy", value_set=list(POLICIES)),
            gxe.ExpectColumnValuesToBeInSet(column="history", value_set=[HISTORY_GENERATED, HISTORY_SOURCE]),
            gxe.ExpectColumnValuesToBeBetween(column="num_turns", min_value=1),
            gxe.ExpectColumnPairValuesToBeEqual(column_A="shard", column_B="expected_shard"),
            gxe.ExpectColumnValuesToNotBeNull(column="source"),
        ],
        "messages": [
            gxe.ExpectColumnValuesToBeInSet(column="role", value_set=list(ROLES)),
            gxe.ExpectColumnValuesToBeBetween(column="visible_chars", min_value=1),
            gxe.ExpectColumnPairValuesToBeInSet(
                column_A="previous_role", column_B="role", value_pairs_set=ALLOWED_ROLE_PAIRS
            ),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=["conversation_id", "index"]),
        ],
        "turns": [
            gxe.ExpectColumnValuesToBeInSet(column="role", value_set=["user", "tool"]),
            gxe.ExpectColumnValuesToBeInSet(column="next_role", value_set=["assistant", END]),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="message_index", column_B="previous_message_index"),
        ],
    }


def _visible_chars(message: dict[str, Any], history: str) -> int | None:
    """What a prompt shows of the message; None (not checked) for a source answer no prompt shows."""
    if message.get("role") == "assistant" and history == HISTORY_GENERATED:
        return None
    content = message.get("content")
    if not isinstance(content, str):
        return -1
    return len(content.strip()) + len(message.get("tool_calls") or ())


def frames(conversations: Iterable[Conversation], num_shards: int) -> dict[str, Any]:
    """The three tables of a chunk of conversations, as pandas DataFrames."""
    import pandas as pd

    rows: dict[str, list[dict[str, Any]]] = {"conversations": [], "messages": [], "turns": []}
    for c in conversations:
        rows["conversations"].append(
            {
                "id": c.id,
                "policy": c.policy,
                "history": c.history,
                "num_turns": c.num_turns,
                "shard": c.shard,
                "expected_shard": shard_of(c.id, num_shards) if isinstance(c.id, str) else -1,
                "source": c.source or None,
            }
        )
        roles = [m.get("role") for m in c.messages]
        for index, message in enumerate(c.messages):
            rows["messages"].append(
                {
                    "conversation_id": c.id,
                    "index": index,
                    "role": roles[index],
                    "previous_role": roles[index - 1] if index else START,
                    "visible_chars": _visible_chars(message, c.history),
                }
            )
        previous = -1
        for turn, message_index in enumerate(c.generate_after):
            inside = 0 <= message_index < len(roles)
            rows["turns"].append(
                {
                    "conversation_id": c.id,
                    "turn": turn,
                    "message_index": message_index,
                    "previous_message_index": previous,
                    "role": roles[message_index] if inside else None,
                    "next_role": roles[message_index + 1] if 0 <= message_index < len(roles) - 1 else END,
                }
            )
            previous = message_index
    columns = {
        "conversations": ["id", "policy", "history", "num_turns", "shard", "expected_shard", "source"],
        "messages": ["conversation_id", "index", "role", "previous_role", "visible_chars"],
        "turns": ["conversation_id", "turn", "message_index", "previous_message_index", "role", "next_role"],
    }
    return {name: pd.DataFrame(rows[name], columns=columns[name]) for name in rows}


@dataclass
class ExpectationOutcome:
    suite: str
    expectation: str
    columns: str
    success: bool = True
    elements: int = 0
    unexpected: int = 0
    examples: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class SuiteSummary:
    chunks: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    outcomes: dict[tuple[str, str, str], ExpectationOutcome] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes.values())

    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes.values() if not o.success]

    def markdown(self) -> str:
        lines = ["| suite | expectation | columns | result | unexpected | examples |", "|---|---|---|---|---|---|"]
        for o in self.outcomes.values():
            result = "pass" if o.success else ("ERROR" if o.errors else "FAIL")
            shown = "; ".join(o.errors[:1]) or ", ".join(map(str, o.examples))
            cells = [o.suite, o.expectation, o.columns, result, f"{o.unexpected} of {o.elements}", shown[:200]]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        return "\n".join(lines)


class ConversationSuites:
    """An ephemeral GX context with the three suites registered; validate chunk after chunk."""

    def __init__(self) -> None:
        import great_expectations as gx
        import great_expectations.expectations as gxe
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._context = gx.get_context(mode="ephemeral")
        self._context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = self._context.data_sources.add_pandas(name="conversations")
        self._definitions = {}
        for name, expectations in _suite_specs(gxe).items():
            batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe(f"{name}_chunk")
            # A suite must be registered with the context, or ValidationDefinition.run refuses it.
            suite = self._context.suites.add(gx.ExpectationSuite(name=f"{name}_suite"))
            for expectation in expectations:
                suite.add_expectation(expectation)
            self._definitions[name] = self._context.validation_definitions.add(
                gx.ValidationDefinition(name=f"{name}_validation", data=batch, suite=suite)
            )

    def validate(self, chunks: Iterable[list[Conversation]], num_shards: int) -> SuiteSummary:
        summary = SuiteSummary()
        for chunk in chunks:
            summary.chunks += 1
            for name, frame in frames(chunk, num_shards).items():
                summary.rows[name] = summary.rows.get(name, 0) + len(frame)
                result = self._definitions[name].run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
                for outcome in result.results:
                    _merge(summary, name, outcome)
        return summary


def _merge(summary: SuiteSummary, suite: str, outcome: Any) -> None:
    config = outcome.expectation_config
    kwargs = config.kwargs
    named = [kwargs.get("column"), kwargs.get("column_A"), kwargs.get("column_B"), *(kwargs.get("column_list") or [])]
    columns = ", ".join(filter(None, named)) or "table"
    merged = summary.outcomes.setdefault((suite, config.type, columns), ExpectationOutcome(suite, config.type, columns))
    details = outcome.result or {}
    merged.success &= bool(outcome.success)
    merged.elements += int(details.get("element_count") or details.get("observed_value") or 0)
    merged.unexpected += int(details.get("unexpected_count") or 0)
    room = _EXAMPLES - len(merged.examples)
    if room > 0:
        merged.examples.extend(details.get("partial_unexpected_list", [])[:room])
    raised = (outcome.exception_info or {}).get("raised_exception")
    if raised:
        merged.errors.append(str((outcome.exception_info or {}).get("exception_message")))


def shard_chunks(store: Store, num_shards: int, target_rows: int = CHUNK_ROWS) -> Iterator[list[Conversation]]:
    """The published conversations, in chunks of whole shards of about `target_rows`."""
    chunk: list[Conversation] = []
    for contents in read_all_conversations(store, num_shards):
        chunk.extend(contents.conversations)
        if len(chunk) >= target_rows:
            yield chunk
            chunk = []
    if chunk or num_shards == 0:
        yield chunk
