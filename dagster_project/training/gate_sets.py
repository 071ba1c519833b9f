"""Which gates judge completions and which judge training rows, as plain functions: the asset checks of both
stages (`checks/completions.py`, `checks/training_set.py`) and the pilot (`pilot/stage.py`) call these, so a
gate added to a stage's set judges the pilot's sample too, with the same thresholds.

The gates themselves are in `training.distribution_gates` and `training.row_gates` (run over a shard by
`training.gates`), `training.tool_call_gate` and `training.lengths`; here are only the completions' share gates
(errors, length caps) and the two sets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from dagster_project.training import evidence, gate_result, gates, row_gates
from dagster_project.training.lengths import LengthFigures, LengthGateOptions
from dagster_project.training.tool_call_gate import ToolCallGateOptions, malformed_tool_calls

SPEC_ACCEPT_LENGTH_FLOOR = 1.5  # an accept length under it: MTP is off or not paying (a warning, never a block)
MAX_ERROR_SHARE = 0.02
MAX_LENGTH_CAPPED_SHARE = 0.10

# The answer gates judge completions as the training rows they would become, before any row is assembled.
ANSWER_GATES = ("thinking_structure", "degenerate_answers", "short_answers", "ids_in_vocabulary")


@dataclass(frozen=True)
class CompletionShareLimits:
    """The completions' own thresholds, beside the answer gates' `GateThresholds`."""

    max_error_share: float = field(
        default=MAX_ERROR_SHARE, metadata={"help": "Largest tolerated share of error events."}
    )
    max_length_capped_share: float = field(
        default=MAX_LENGTH_CAPPED_SHARE,
        metadata={"help": "Largest tolerated share of answers that hit max_new_tokens."},
    )


@dataclass(frozen=True)
class EventCounts:
    """What a set of generation events ended as: the figures the share gates judge."""

    rows: int
    errors: int
    errors_by_kind: Mapping[str, int]
    length_capped: int  # answers with finish_reason `length`
    max_new_tokens: int


def share_gate(
    name: str,
    count: int,
    total: int,
    max_share: float,
    what: str,
    by_kind: Mapping,
    *,
    false_block_rate: float = evidence.FALSE_BLOCK_RATE,
) -> gate_result.GateResult:
    """Blocks on evidence that more than `max_share` of the events `what` (`training.evidence`)."""
    weighed = evidence.weigh(count, total, max_share, false_block_rate=false_block_rate)
    passed = not weighed.blocks
    verdict = "ok" if passed else "BLOCKED"
    return gate_result.GateResult(
        name,
        passed,
        f"{verdict}: {weighed.share:.1%} of events ({count}/{total}) {what} ({weighed.bound_text('events')})"
        + (f"; by kind {dict(by_kind)}" if by_kind else ""),
        {
            "count": count,
            "events": total,
            "share": weighed.share,
            "max_share": max_share,
            **weighed.metadata(),
            "by_kind": dict(by_kind),
        },
    )


def completions_gates(
    counts: EventCounts,
    profile: gates.ShardProfile,
    *,
    vocab_size: int,
    enable_thinking: bool,
    thresholds: gates.GateThresholds,
    limits: CompletionShareLimits,
) -> list[gate_result.GateResult]:
    """Every gate of `completions_quality`: the error and length-capped shares, then the answer gates over
    `profile` (`gates.profile_completion_batches`)."""
    results = [
        share_gate(
            "error_rate", counts.errors, counts.rows, limits.max_error_share, "ended in an error", counts.errors_by_kind
        ),
        share_gate(
            "length_capped_rate",
            counts.length_capped,
            counts.rows,
            limits.max_length_capped_share,
            f"hit max_new_tokens={counts.max_new_tokens}",
            {},
        ),
    ]
    answer_gates = gates.shard_gates(
        profile, vocab_size=vocab_size, enable_thinking=enable_thinking, thresholds=thresholds
    )
    return results + [result for result in answer_gates if result.name in ANSWER_GATES]


def training_gates(
    profile: gates.ShardProfile,
    completion_batches: Iterable[pa.RecordBatch],
    lengths: LengthFigures,
    *,
    vocab_size: int,
    enable_thinking: bool,
    thresholds: gates.GateThresholds,
    tool_calls: ToolCallGateOptions,
    tool_calls_known: bool,
    length: LengthGateOptions,
) -> list[gate_result.GateResult]:
    """Every row-level gate of `training_set_gates` over `profile` (`gates.profile_training_batches`):
    `completion_batches` (event_id, prompt_ids, output_ids) are the completions the rows were built from. The
    check adds `source_is_current` (which compares publications in the store)."""
    return [
        *gates.shard_gates(profile, vocab_size=vocab_size, enable_thinking=enable_thinking, thresholds=thresholds),
        malformed_tool_calls(
            profile.outputs.answer_texts,
            profile.finished,
            calls_known=tool_calls_known,
            max_share=tool_calls.max_malformed_tool_call_share,
        ),
        row_gates.ids_match_completions(profile.digests, completion_batches),
        row_gates.length_loss(lengths, max_lost_share=length.max_lost_supervised_share),
    ]
