"""The waste ledger: every output token generated is counted once, trained, pending or under one cause, so that
trained + pending + every cause = generated; each cause from the typed record the stage writes."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pyarrow as pa
import pytest

from dagster_project.generation.shards import CompletionsShardManifest, GenerationSummary
from dagster_project.generation.unrecorded import Unrecorded
from dagster_project.ops.answers.cost import FLEET_LIFE, CostAnswer
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.waste import WasteCause, answer_waste, render_waste
from dagster_project.ops.metrics import render_metrics
from dagster_project.ops.report import render_markdown
from dagster_project.ops.status import render_text
from dagster_project.pilot_record import PilotRecord
from dagster_project.records import COMPLETION_SCHEMA, EVAL_CONTAMINATION
from dagster_project.training import outcomes
from dagster_project.training.shards import AssemblyOptions, TrainingShardManifest, TrainingSource
from dagster_project.training.stage import assemble_batch
from tests.support.training_shards import completion_row, error_row
from tests.unit.ops.test_metrics import samples
from tests.unit.ops.test_report import beat, status_of


def test_assembly_counts_every_output_token_under_trained_past_max_length_or_its_reason():
    rows = [
        completion_row("ok#turn0", [1] * 6, [2] * 8),  # 2 of its 8 past a 12-token max_length
        completion_row("short#turn0", [1] * 3, [2] * 4),
        completion_row("capped#turn0", [1], [2] * 5, finish_reason="length"),
        completion_row("aborted#turn0", [1], [2] * 3, finish_reason="abort"),
        completion_row("eval#turn0", [1], [2] * 7),
        error_row("failed#turn0", [1, 2]),
        completion_row("ok#turn0", [1] * 6, [2] * 8),  # recorded twice
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA)
    counted: Counter = Counter()
    assemble_batch(batch, 0, AssemblyOptions(max_length=12), set(), contaminated={"eval"}, output_tokens=counted)
    assert counted == {
        outcomes.TRAINED: 6 + 4,
        outcomes.PAST_MAX_LENGTH: 2,
        outcomes.LENGTH_CAPPED: 5,
        outcomes.ABORTED: 3,
        EVAL_CONTAMINATION: 7,
        outcomes.ERROR: 0,
        outcomes.DUPLICATE_EVENT: 8,
    }
    assert sum(counted.values()) == sum(len(row["output_ids"] or []) for row in rows)


def completions(
    shard: int,
    output_tokens: int,
    lost_hedges: int = 0,
    resent: int = 0,
    attempts: Unrecorded | None = None,
    dropped: int = 0,
) -> CompletionsShardManifest:
    """`lost_hedges`, `resent`: as a manifest written before answers in no row were counted by cause records them;
    `dropped`: the output tokens of 3 answers a hold's release dropped."""
    attempts = attempts or Unrecorded()
    generation = GenerationSummary(
        lost_hedge_output_tokens=lost_hedges, resent_original_output_tokens=resent,
        unrecorded_answers=dict(attempts.answers), unrecorded_output_tokens=dict(attempts.tokens),
        dropped_at_release=3 if dropped else 0, dropped_at_release_output_tokens=dropped,
    )  # fmt: skip
    return CompletionsShardManifest(
        shard=shard, rows=10, ok=10, ids_digest=f"d{shard}", output_tokens=output_tokens, generation=generation
    )


# Shard 2's runs: answers the fleet generated in no row, by cause (`dispatch`'s count), one run held with requests
# in flight.
ATTEMPTS = Unrecorded(
    Counter({"refused": 2, "errors_and_retries": 1, "probes": 3, "lost_hedges": 1, "stopped_in_flight": 2}),
    Counter({"refused": 12, "errors_and_retries": 8, "probes": 3, "lost_hedges": 5, "stopped_in_flight": 70}),
)


def training(shard: int, split: dict[str, int]) -> TrainingShardManifest:
    return TrainingShardManifest(
        shard=shard, rows=10, rows_in=10, tokens=0, loss_tokens=0, prompt_tokens=0, output_tokens_by_outcome=split,
        source=TrainingSource(completions_ids_digest=f"d{shard}"),
    )  # fmt: skip


SPLIT = {
    outcomes.TRAINED: 1000,
    outcomes.PAST_MAX_LENGTH: 200,
    outcomes.OVER_MAX_LENGTH: 60,
    EVAL_CONTAMINATION: 50,
    outcomes.ERROR: 30,
    outcomes.ABORTED: 20,
    outcomes.LENGTH_CAPPED: 300,
    outcomes.DUPLICATE_EVENT: 10,
}


# Two pilots of the same settings (the first blocked, run again): each one's output is in the ledger.
PILOTS = [
    PilotRecord(False, "f", started_at=1.0, answers=8, output_tokens=400, unrecorded={"tokens": {"probes": 1}}),
    PilotRecord(True, "f", started_at=2.0, answers=8, output_tokens=450),
]


def ledger_readings() -> Readings:
    """A run where every cause occurs: shard 0 assembled (every exclusion, lost hedges, aborted originals of re-sent
    requests, answers dropped at a hold's release), shard 1 blocked by a gate, shard 2 not assembled yet, shard 3
    assembled before the ledger, shard 4 still generating."""
    server = {"unrecorded": {"answers": {"lost_hedges": 2, "resent_original": 1},
                             "tokens": {"lost_hedges": 30, "resent_original": 15}}}  # fmt: skip
    running = replace(beat(), shard=4, output_tokens=100, servers={"http://a": server})
    return Readings(
        0.0, 5, None, None, 100,
        {0: completions(0, sum(SPLIT.values()), lost_hedges=40, resent=25, dropped=35), 1: completions(1, 500),
         2: completions(2, 700, attempts=ATTEMPTS), 3: completions(3, 90)},
        [running], {}, None, None,
        training_set={0: training(0, SPLIT), 1: training(1, {outcomes.TRAINED: 500}), 3: training(3, {})},
        pilot_runs=PILOTS,
    )  # fmt: skip


def test_trained_pending_and_every_cause_add_up_to_what_was_generated():
    cost = CostAnswer(30.0, 2, 30.0, None, None, None, None, FLEET_LIFE, gpu_hours=2.0, idle_cost=6.0,
                      idle_gpu_hours=0.4)  # fmt: skip
    waste = answer_waste(ledger_readings(), blocked=[1], cost=cost)
    tokens = waste.output_tokens
    assert tokens == {
        WasteCause.BLOCKED_OR_HELD: 500,
        WasteCause.EVAL_MATCH: 50,
        WasteCause.ERRORS_AND_RETRIES: 30 + 8,
        WasteCause.REFUSED: 12,
        WasteCause.LOST_HEDGES: 40 + 30 + 5,
        WasteCause.RESENT_ORIGINAL: 25 + 15,
        WasteCause.DROPPED_AT_RELEASE: 35,
        WasteCause.PROBES: 3,
        WasteCause.PILOT: 400 + 1 + 450,
        WasteCause.STOPPED_IN_FLIGHT: 70,
        WasteCause.PROMPT_FILLS_MAX_LENGTH: 0,
        WasteCause.ABORTS: 20,
        WasteCause.LENGTH_CAPPED: 300,
        WasteCause.PAST_MAX_LENGTH: 260,
        WasteCause.OTHER_EXCLUSIONS: 10,
        WasteCause.NOT_ITEMIZED: 90,
    }
    assert waste.trained_output_tokens == 1000 and waste.pending_output_tokens == 700 + 100
    # Answers beside tokens: those in no row from the runs' counts (a manifest from before them gives none), the
    # stopped shard's answers, its training shard's exclusions.
    causes = ("refused", "probes", "pilot", "lost_hedges", "resent_original", "stopped_in_flight", "dropped_at_release")
    assert {cause: waste.answers[cause] for cause in causes} == {
        "refused": 2,
        "probes": 3,
        "pilot": 16,
        "lost_hedges": 1 + 2,
        "resent_original": 1,
        "stopped_in_flight": 2,
        "dropped_at_release": 3,
    }
    assert waste.answers[WasteCause.BLOCKED_OR_HELD] == 10
    assert waste.generated_output_tokens == 1000 + 800 + sum(tokens.values())  # exact, by construction
    # The busy GPU-time (2.0 - 0.4 GPU-hours) and dollars ($30 - $6 idle) shared by output token.
    per_token_s = 1.6 * 3600 / waste.generated_output_tokens
    assert waste.gpu_seconds[WasteCause.BLOCKED_OR_HELD] == pytest.approx(500 * per_token_s)
    assert sum(waste.dollars.values()) == pytest.approx(
        24.0 * waste.wasted_output_tokens / waste.generated_output_tokens
    )
    # A hold is one more set of stopped shards: shard 2's pending output becomes held.
    held = answer_waste(ledger_readings(), blocked=[1], cost=None, held=[2])
    assert held.output_tokens[WasteCause.BLOCKED_OR_HELD] == 1200 and held.pending_output_tokens == 100
    assert held.gpu_seconds == {}  # no cost, no estimate
    assert "by cause: blocked_or_held 10 answers, 500 tokens $" in "\n".join(render_waste(waste))
    assert "refused 2 answers, 12 tokens $" in "\n".join(render_waste(waste))


def test_the_ledger_is_the_same_in_status_text_page_and_prometheus(tmp_path):
    status = replace(status_of([beat()], {}, tmp_path=tmp_path), waste=answer_waste(ledger_readings(), [1], None))
    assert "blocked_or_held 10 answers, 500 tokens" in render_text(status)
    assert "| blocked_or_held | 10 | 500 |" in render_markdown(status)
    found = samples(render_metrics(status))
    assert found[("dflash_waste_output_tokens", (("cause", "blocked_or_held"),))] == 500
    assert found[("dflash_waste_answers", (("cause", "refused"),))] == 2
    assert found[("dflash_generated_output_tokens", ())] == status.waste.generated_output_tokens
