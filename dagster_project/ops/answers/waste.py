"""7b. The waste ledger: output tokens generated (and paid for) that are not in the training set, by cause.

Exact by construction: every output token of a published completions shard is counted once, under where it went
when its training shard was assembled (`training.outcomes`, recorded in the training manifest) — trained, or a
cause — and the shard's whole output goes to `blocked_or_held` while a blocking gate stops it; a shard not
assembled yet, and what running shards generated so far, is `pending`. Each pilot's output (every pilot run
recorded under `pilot/runs/`) is `pilot`: its answers judge the settings and become no row. So trained + pending +
every cause = generated, always.

GPU-seconds and dollars are estimated: the fleet's busy GPU-time (its up-time less its idle time, `answers.cost`)
is shared among the output tokens generated, each request's share its output tokens (decoding dominates a long
answer; prefill is not told apart), so a cause's GPU-seconds are its tokens' share of the busy time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from enum import StrEnum

from dagster_project.generation import unrecorded
from dagster_project.generation.shards import unrecorded_of
from dagster_project.generation.unrecorded import Unrecorded
from dagster_project.ops.answers.cost import CostAnswer
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.shards import current_training
from dagster_project.ops.answers.text import dollars
from dagster_project.training import outcomes


class WasteCause(StrEnum):
    # A shard a blocking gate stops (and, with a hold on the fleet, a held one): its whole output.
    BLOCKED_OR_HELD = "blocked_or_held"
    EVAL_MATCH = "eval_match"  # conversations matched to an evaluation set
    # Error rows, and what failed attempts (aborted by their server, cut short) wrote before they failed
    ERRORS_AND_RETRIES = unrecorded.ERRORS_AND_RETRIES
    REFUSED = unrecorded.REFUSED  # answers that broke the answer contract: never rows
    LOST_HEDGES = unrecorded.LOST_HEDGES  # answers that arrived after another attempt of their request won
    # What originals wrote before they were aborted: their requests were re-sent when their server stopped answering
    RESENT_ORIGINAL = unrecorded.RESENT_ORIGINAL
    PROBES = unrecorded.PROBES  # the one-token canaries of servers rejoining
    # What each pilot generated (its answers judge the settings and become no row) and its servers' unrecorded output
    PILOT = "pilot"
    # What requests in flight when their run stopped (a hold, a failure) wrote before they were aborted
    STOPPED_IN_FLIGHT = unrecorded.STOPPED_IN_FLIGHT
    # Answers a hold condemned, dropped at its release and generated again (`dflash hold release`)
    DROPPED_AT_RELEASE = "dropped_at_release"
    ABORTS = "aborts"
    LENGTH_CAPPED = "length_capped"  # answers cut by max_new_tokens
    PAST_MAX_LENGTH = "past_max_length"  # past the trainer's sequence length (cut, dropped or cut by the trainer)
    PROMPT_FILLS_MAX_LENGTH = outcomes.PROMPT_FILLS_MAX_LENGTH  # answered turns whose prompt alone fills it
    OTHER_EXCLUSIONS = "other_exclusions"  # empty outputs, events recorded twice, unknown finish reasons
    NOT_ITEMIZED = "not_itemized"  # training shards assembled before their output's split was recorded


_CAUSE_OF_OUTCOME = {
    outcomes.EVAL_CONTAMINATION: WasteCause.EVAL_MATCH,
    outcomes.ERROR: WasteCause.ERRORS_AND_RETRIES,
    outcomes.ABORTED: WasteCause.ABORTS,
    outcomes.LENGTH_CAPPED: WasteCause.LENGTH_CAPPED,
    outcomes.OVER_MAX_LENGTH: WasteCause.PAST_MAX_LENGTH,
    outcomes.PROMPT_FILLS_MAX_LENGTH: WasteCause.PROMPT_FILLS_MAX_LENGTH,
    outcomes.PAST_MAX_LENGTH: WasteCause.PAST_MAX_LENGTH,
}


@dataclass(frozen=True)
class WasteAnswer:
    generated_output_tokens: int
    trained_output_tokens: int
    pending_output_tokens: int  # not assembled yet, or still generating: neither trained nor wasted so far
    output_tokens: dict[str, int]  # cause → output tokens, every cause listed
    # cause → answers (rows, or answers in no row); a cause whose tokens are part of kept rows counts none
    answers: dict[str, int] = field(default_factory=dict)
    gpu_seconds: dict[str, float] = field(default_factory=dict)  # cause → estimated GPU-seconds (with a cost)
    dollars: dict[str, float] = field(default_factory=dict)
    blocked_or_held_shards: list[int] = field(default_factory=list)
    # Events not sent at all (no tokens, nothing paid), by reason: what the ledger saved.
    not_sent: dict[str, int] = field(default_factory=dict)

    @property
    def wasted_output_tokens(self) -> int:
        return sum(self.output_tokens.values())


def answer_waste(
    readings: Readings, blocked: Collection[int], cost: CostAnswer | None = None, held: Collection[int] = ()
) -> WasteAnswer:
    """`blocked`: the shards a blocking gate stops (`ShardsAnswer`); `held`: the shards a hold stops. Without a
    `cost`, tokens only (`price_waste` adds the GPU-seconds and dollars)."""
    stopped = set(blocked) | set(held)
    tokens: Counter = Counter(dict.fromkeys(WasteCause, 0))
    answers: Counter = Counter(dict.fromkeys(WasteCause, 0))
    trained = pending = 0
    for shard, published in readings.published.items():
        attempts = published.generation.unrecorded
        tokens.update(attempts.tokens)
        answers.update(attempts.answers)
        tokens[WasteCause.DROPPED_AT_RELEASE] += published.generation.dropped_at_release_output_tokens
        answers[WasteCause.DROPPED_AT_RELEASE] += published.generation.dropped_at_release
        training = current_training(readings.training_set.get(shard), published)
        split = training.output_tokens_by_outcome if training is not None else {}
        if (training is None or not split) and shard in stopped:
            tokens[WasteCause.BLOCKED_OR_HELD] += published.output_tokens
            answers[WasteCause.BLOCKED_OR_HELD] += published.ok
            continue
        if training is None:
            pending += published.output_tokens
            continue
        if not split:
            tokens[WasteCause.NOT_ITEMIZED] += published.output_tokens
            answers[WasteCause.NOT_ITEMIZED] += published.ok
            continue
        for reason, count in training.exclusions.items():
            answers[_CAUSE_OF_OUTCOME.get(reason, WasteCause.OTHER_EXCLUSIONS)] += count
        for outcome, count in split.items():
            if outcome == outcomes.TRAINED:
                if shard in stopped:
                    tokens[WasteCause.BLOCKED_OR_HELD] += count
                    answers[WasteCause.BLOCKED_OR_HELD] += training.rows
                else:
                    trained += count
            else:
                tokens[_CAUSE_OF_OUTCOME.get(outcome, WasteCause.OTHER_EXCLUSIONS)] += count
    for beat in readings.live_unpublished:
        pending += beat.output_tokens
        attempts = unrecorded_of(beat)
        tokens.update(attempts.tokens)
        answers.update(attempts.answers)
    for pilot in readings.pilot_runs:
        tokens[WasteCause.PILOT] += pilot.output_tokens + sum(Unrecorded.of(pilot.unrecorded).tokens.values())
        answers[WasteCause.PILOT] += pilot.answers
    not_sent = sum((Counter(m.generation.excluded_by_reason) for m in readings.published.values()), Counter())
    waste = WasteAnswer(
        generated_output_tokens=trained + pending + sum(tokens.values()),
        trained_output_tokens=trained,
        pending_output_tokens=pending,
        output_tokens={str(cause): count for cause, count in tokens.items()},
        answers={str(cause): count for cause, count in answers.items()},
        blocked_or_held_shards=sorted(stopped & (readings.published.keys())),
        not_sent=dict(not_sent),
    )
    return price_waste(waste, cost)


def price_waste(waste: WasteAnswer, cost: CostAnswer | None) -> WasteAnswer:
    """Each cause's share of the fleet's busy GPU-seconds and dollars, by its output tokens."""
    generated = waste.generated_output_tokens
    if cost is None or not generated:
        return waste
    per_token_s = (cost.gpu_hours - cost.idle_gpu_hours) * 3600 / generated
    per_token_usd = (cost.spent - (cost.idle_cost or 0.0)) / generated
    return replace(
        waste,
        gpu_seconds={cause: n * per_token_s for cause, n in waste.output_tokens.items()},
        dollars={cause: n * per_token_usd for cause, n in waste.output_tokens.items()},
    )


def render_waste(waste: WasteAnswer) -> list[str]:
    wasted, generated = waste.wasted_output_tokens, waste.generated_output_tokens
    share = f" ({wasted / generated:.1%})" if generated else ""
    causes = "; ".join(
        f"{cause} {waste.answers.get(cause, 0):,} answers, {count:,} tokens"
        + (f" {dollars(waste.dollars[cause])}" if cause in waste.dollars else "")
        for cause, count in waste.output_tokens.items()
        if count or waste.answers.get(cause)
    )
    return [
        f"   waste: {wasted:,} of {generated:,} output tokens generated{share} are not trained; "
        f"trained {waste.trained_output_tokens:,}, pending {waste.pending_output_tokens:,}",
        f"   by cause: {causes or 'none'}"
        + "".join(f"; not sent: {reason} {n:,} events" for reason, n in sorted(waste.not_sent.items())),
    ]
