"""The pilot: a stratified sample of the job's conversations generated before the job, and judged by every gate.

It goes the shards' way: the same generation settings (so the same fingerprint), the same preflight, the same
`ShardGeneration` over the same dispatcher and fleet, the same Parquet of the journal's final records. Then
every gate of `completions_quality` judges its answers and, after they are assembled into training rows as
`training_set` would (`training.stage.assemble_batches`), every gate of `training_set_gates` and the Great
Expectations suite judge the rows. A gate that would block shards of the job blocks the pilot first, for the
price of ~0.2% of it.

What it measured (rates, the answer lengths, accept length, error share) is recorded (`pilot_record`) and, when
it passed, becomes the plan `dflash status` compares the job against (`ops.plan`).

Nothing of the pilot is a shard: it writes no heartbeat, lease, journal checkpoint or manifest of one, and its
journal lives in a temporary directory (each pilot measures afresh).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.generation.dispatch import Dispatcher
from dagster_project.generation.events import ShardGeneration
from dagster_project.generation.journal import Journal
from dagster_project.generation.preflight import check_before_dispatch
from dagster_project.generation.shards import unrecorded_of
from dagster_project.generation.stage import write_completions_parquet
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.plan import Plan, read_plan, write_plan
from dagster_project.pilot.sample import PilotSampleOptions, sample_conversations
from dagster_project.pilot_record import LengthDistribution, PilotRecord, write_pilot
from dagster_project.records import STATUS_OK
from dagster_project.store.storage import Store
from dagster_project.tokenizer import special_ids, tokenizer_identity, tokenizer_profile
from dagster_project.training import gate_messages, gate_result, gate_sets, gates
from dagster_project.training.lengths import KEEP, LengthFigures, LengthGateOptions
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.stage import COMPLETION_COLUMNS, assemble_batches
from dagster_project.training.suite import answer_ends, training_frame, validate_training_frame
from dagster_project.training.tool_call_gate import ToolCallGateOptions

# The shard the pilot's rows name: none of the job's (its sample spans them).
PILOT_SHARD = -1
PILOT_GATES = gate_messages.GateStage(
    check="pilot",
    override="once the failures are understood, generate without a passed pilot: DFLASH_SKIP_PILOT=1 (or "
    "skip_pilot: true in completions' run config)",
)


@dataclass(frozen=True)
class PilotLimits:
    """The thresholds the pilot's gates use: the stages' own defaults unless the pilot's config sets them."""

    thresholds: gates.GateThresholds = field(default_factory=gates.GateThresholds)
    shares: gate_sets.CompletionShareLimits = field(default_factory=gate_sets.CompletionShareLimits)
    tool_calls: ToolCallGateOptions = field(default_factory=ToolCallGateOptions)
    length: LengthGateOptions = field(default_factory=LengthGateOptions)
    assembly: AssemblyOptions = field(default_factory=AssemblyOptions)

    def keys(self) -> SimpleNamespace:
        """Every threshold by its config key, as `gate_messages.actionable` names them."""
        return SimpleNamespace(
            **{
                k: v
                for part in (self.thresholds, self.shares, self.tool_calls, self.length)
                for k, v in asdict(part).items()
            }
        )


def run_pilot(
    store: Store,
    *,
    tokenizer: Any,
    settings: GenerationSettings,
    dispatcher: Dispatcher,
    work_dir: Path,
    options: PilotSampleOptions = PilotSampleOptions(),
    limits: PilotLimits = PilotLimits(),
    log: Callable[[str], None] = lambda message: None,
    run_id: str | None = None,
) -> PilotRecord:
    """Sample, generate, gate; record the outcome in the store (and the plan, when it passed). The record names
    each gate `completions/<gate>` or `training_set/<gate>`, after the check whose gates it ran."""
    conversations, choice = sample_conversations(store, options)
    if not conversations:
        raise LookupError("the published conversations are empty: there is nothing for a pilot to generate")
    policies = {c.policy for c in conversations} - {settings.policy}
    if policies:
        raise RuntimeError(
            f"conversations were planned with policy {sorted(policies)} but generation is configured with "
            f"{settings.policy!r}: re-materialize `conversations` with the same policy"
        )
    log(
        f"pilot: {len(conversations)} of {choice.population:,} conversations ({len(choice.strata)} strata"
        + (f"; under min_per_stratum: {', '.join(choice.uncovered)}" if choice.uncovered else "")
        + ")"
    )
    check_before_dispatch(store, settings, dispatcher, log)
    started_at = time.time()
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pilot-", dir=work_dir) as scratch:
        with Journal(Path(scratch) / "journal.jsonl") as journal:
            job = ShardGeneration(PILOT_SHARD, conversations, tokenizer, settings, journal)
            heartbeat = asyncio.run(job.run(dispatcher))
            parquet = Path(scratch) / "completions.parquet"
            planned = {c.event_id(t) for c in conversations for t in range(c.num_turns)}
            written = write_completions_parquet(journal, parquet, planned, settings)
        counts = gate_sets.EventCounts(
            rows=written.rows,
            errors=written.errors,
            errors_by_kind=dict(written.counts.errors_by_kind),
            length_capped=written.counts.length_capped,
            max_new_tokens=settings.max_new_tokens,
        )
        results, lengths = _judge(pq.ParquetFile(parquet), counts, settings, tokenizer, limits)
    failed = {r.name: r.message for r in results if not r.passed}
    record = PilotRecord(
        passed=not failed,
        settings_fingerprint=settings.fingerprint(),
        settings=settings,
        started_at=started_at,
        finished_at=time.time(),
        run_id=run_id,
        population=choice.population,
        conversations=len(conversations),
        strata=choice.strata,
        uncovered_strata=list(choice.uncovered),
        answers=written.rows,
        ok=written.ok,
        errors=written.errors,
        errors_by_kind=dict(written.counts.errors_by_kind),
        finish_reasons=dict(written.counts.finish_reasons),
        seconds=heartbeat.lifetime.seconds,
        req_per_s=heartbeat.lifetime.req_per_s,
        output_tok_per_s=heartbeat.lifetime.output_tok_per_s,
        avg_prompt_tokens=written.prompt_tokens / written.rows if written.rows else 0.0,
        accept_length=heartbeat.spec.accept_length_lifetime,
        output_lengths=LengthDistribution.of(lengths),
        output_tokens=heartbeat.output_tokens,
        tokenizer=tokenizer_identity(tokenizer).fingerprint,
        unrecorded=unrecorded_of(heartbeat).as_dict(),
        servers=sorted(heartbeat.servers),
        gates={r.name: r.message for r in results},
        failed_gates=failed,
    )
    write_pilot(store, record)
    if record.passed:
        write_plan(store, plan_from_pilot(record, read_plan(store)))
    return record


def plan_from_pilot(record: PilotRecord, previous: Plan | None) -> Plan:
    """The pilot's measurements as the plan; the fleet's size, price and the job's prompts stay the earlier
    plan's (without one: a GPU per server the pilot used)."""
    return Plan(
        source=record.label(),
        req_per_s=round(record.req_per_s, 3),
        avg_output_tokens=round(record.output_lengths.mean, 1),
        output_tok_per_s=round(record.output_tok_per_s, 1),
        gpus=previous.gpus if previous else max(len(record.servers), 1),
        cost_per_hour=previous.cost_per_hour if previous else None,
        prompts=previous.prompts if previous else None,
        accept_length=round(record.accept_length, 3) if record.accept_length else None,
        error_share=round(record.error_share, 4),
        output_tokens_percentiles=record.output_lengths.percentiles,
        sample_answers=record.answers,
    )


def _judge(
    completions: pq.ParquetFile,
    counts: gate_sets.EventCounts,
    settings: GenerationSettings,
    tokenizer: Any,
    limits: PilotLimits,
) -> tuple[list[gate_result.GateResult], np.ndarray]:
    """Every completions gate and every training-set gate over the pilot's answers; the answers' output lengths."""
    special = special_ids(tokenizer)
    keys = limits.keys()
    table = completions.read()
    batches = table.to_batches()
    answer_profile = gates.profile_completion_batches(
        [b.select(gates.COMPLETION_GATE_COLUMNS) for b in batches], special, tokenizer.decode
    )
    answer_results = gate_sets.completions_gates(
        counts,
        answer_profile,
        vocab_size=special.vocab_size,
        enable_thinking=settings.enable_thinking,
        thresholds=limits.thresholds,
        limits=limits.shares,
    )
    row_profile, row_results = _judge_rows(batches, settings, tokenizer, limits)

    def judged(stage: str, result: gate_result.GateResult, profile: gates.ShardProfile) -> gate_result.GateResult:
        examples = gate_messages.example_ids(result, profile, keys)
        result = gate_messages.actionable(result, limits=keys, where=PILOT_GATES, examples=examples)
        return gate_result.GateResult(f"{stage}/{result.name}", result.passed, result.message, result.metadata)

    results = [judged("completions", r, answer_profile) for r in answer_results]
    results += [judged("training_set", r, row_profile) for r in row_results]
    answered = table.filter(pa.compute.equal(table.column("status"), STATUS_OK))
    return results, answered.column("completion_tokens").to_numpy(zero_copy_only=False)


def _judge_rows(
    batches: list[pa.RecordBatch], settings: GenerationSettings, tokenizer: Any, limits: PilotLimits
) -> tuple[gates.ShardProfile, list[gate_result.GateResult]]:
    """The answers assembled into training rows as `training_set` would, and the training set's gates on them."""
    special = special_ids(tokenizer)
    lengths = LengthFigures(limits.assembly.max_length, limits.assembly.length_policy)
    rows = [
        training
        for training, _, _ in assemble_batches(
            [b.select(COMPLETION_COLUMNS) for b in batches], PILOT_SHARD, limits.assembly, lengths, settings=settings
        )
    ]
    profile = gates.profile_training_batches(
        [b.select(gates.TRAINING_GATE_COLUMNS) for b in rows], special, tokenizer.decode
    )
    results = gate_sets.training_gates(
        profile,
        [b.select(["event_id", "prompt_ids", "output_ids"]) for b in batches],
        lengths,
        vocab_size=special.vocab_size,
        enable_thinking=settings.enable_thinking,
        thresholds=limits.thresholds,
        tool_calls=limits.tool_calls,
        tool_calls_known=tokenizer_profile(tokenizer).tool_calls_known,
        length=limits.length,
    )
    assembly = limits.assembly
    suite = validate_training_frame(
        training_frame(rows, settings),
        shard=PILOT_SHARD,
        rows=sum(b.num_rows for b in rows),
        max_length=None if assembly.length_policy == KEEP else assembly.max_length,
        finish_reasons=answer_ends(assembly.exclude_length_capped),
    )
    results.append(gate_result.GateResult("gx_suite", suite.success, suite.message))
    return profile, results
