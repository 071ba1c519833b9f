"""Every shard at every stage: completions → training set → export, and whether the job is done.

A shard is green when its completions are published intact, its training set passed every blocking check with
no gate overridden, and SpecForge's export of that training set is written. The job is done only when every
shard is green. Every other state is counted and its shards named; a blocked shard also names the gate that
blocks it, the run-config keys of that gate's thresholds and the config key that lets it through.

What it reads is what the stages record: the manifests, the verdicts of the blocking checks
(`store.verdicts`), and the export's outcome next to the training shard (`training.export.ExportOutcome`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import shard_list
from dagster_project.store.layout import COMPLETIONS, TRAINING_SET
from dagster_project.store.manifest import ShardManifest
from dagster_project.store.verdicts import REQUIRED_VERDICTS, ExportOutcome, Verdict
from dagster_project.training.gate_messages import COMPLETIONS_GATES, GATE_KEYS, TRAINING_GATES
from dagster_project.training.shards import TrainingShardManifest

# Completions
PUBLISHED, RUNNING, DEAD, FAILED, DAMAGED = "published", "running", "dead", "failed", "damaged"
NOT_STARTED = "not started"
# Training set
PASSED, OVERRIDDEN, BLOCKED, UNCHECKED = "passed", "overridden", "blocked", "unchecked"
NOT_ASSEMBLED, WAITING = "not assembled", "waiting for completions"
# Training set and export: built on objects that are damaged now (the completions, or the training shard)
ON_DAMAGED = "built on damaged data"
# Export
EXPORTED, REFUSED, NOT_EXPORTED = "exported", "refused", "not exported"
GREEN = (PUBLISHED, PASSED, EXPORTED)

# The Dagster check whose run config (`ops: {<check>: {config: ...}}`) holds a stage's gate thresholds, and the
# asset whose `override_failed_gates` lets a shard that failed them through to the next stage.
THRESHOLDS_CONFIG = {COMPLETIONS: COMPLETIONS_GATES.check, TRAINING_SET: TRAINING_GATES.check}
OVERRIDE_CONFIG = {COMPLETIONS: "training_set", TRAINING_SET: "specforge_export"}


@dataclass(frozen=True)
class GateFailure:
    """A blocking gate a shard failed, and what the operator can change."""

    stage: str  # whose check failed: completions or training_set
    gate: str  # `check/gate`, e.g. gates/loss_sum_concentration
    message: str
    thresholds: str  # where its thresholds are configured ("" for a gate that judges a fact)
    override: str  # the config key that lets the shard through, having looked

    def describe(self) -> str:
        where = f"thresholds: {self.thresholds}; " if self.thresholds else ""
        return f"{self.stage} gate {self.gate}: {self.message} ({where}override: {self.override})"


@dataclass(frozen=True)
class ShardState:
    shard: int
    completions: str
    training_set: str
    export: str
    blocked_by: list[GateFailure] = field(default_factory=list)
    overridden: list[str] = field(default_factory=list)  # gates failed and let through (`check/gate`)
    damaged_objects: list[str] = field(default_factory=list)  # each names the object
    refused: str = ""  # why the export refused the shard

    @property
    def green(self) -> bool:
        return (self.completions, self.training_set, self.export) == GREEN and not self.overridden

    @property
    def needs_a_look(self) -> bool:
        """Blocked, overridden, damaged or refused: not green, and no run will change that on its own (dead and
        failed runs are progress's to report)."""
        return bool(self.blocked_by or self.overridden or self.damaged_objects or self.refused) or (
            DAMAGED in (self.completions, self.training_set)
        )


@dataclass(frozen=True)
class ShardsAnswer:
    shards: int
    # State → shards in it, per stage (green states included).
    completions: dict[str, int]
    training_set: dict[str, int]
    export: dict[str, int]
    # "<stage> <state>" → the shards in each state that is not green.
    not_green: dict[str, list[int]]
    needs_a_look: list[ShardState]  # blocked, overridden, damaged or refused, with why
    done: bool  # every shard exported with every blocking gate green


def gate_failure(stage: str, gate: str, message: str) -> GateFailure:
    keys = GATE_KEYS.get(gate.rsplit("/", 1)[-1], ())
    return GateFailure(
        stage,
        gate,
        message,
        f"{THRESHOLDS_CONFIG[stage]} config {', '.join(keys)}" if keys else "",
        f"override_failed_gates: true in {OVERRIDE_CONFIG[stage]}'s config",
    )


def _failures(stage: str, verdicts: list[Verdict], manifest: ShardManifest) -> list[GateFailure]:
    return [
        gate_failure(stage, f"{verdict.check}/{gate}", message)
        for verdict in sorted(verdicts, key=lambda verdict: verdict.check)
        if verdict.judges(manifest) and not verdict.passed
        for gate, message in verdict.failures.items()
    ]


def completions_state(shard: int, published: bool, runs: dict[str, set[int]], damaged: Collection[int]) -> str:
    """`runs`: the shards whose completions runs are running, dead (killed) and failed."""
    if published:
        return DAMAGED if shard in damaged else PUBLISHED
    return next((state for state in (RUNNING, DEAD, FAILED) if shard in runs[state]), NOT_STARTED)


def current_training(
    training: TrainingShardManifest | None, published: CompletionsShardManifest
) -> TrainingShardManifest | None:
    """The training shard, unless it was assembled from an earlier publication of the completions (it is
    assembled again)."""
    if training is not None and training.source.completions_ids_digest not in ("", published.ids_digest):
        return None
    return training


def with_damage(
    state: ShardState,
    *,
    training: TrainingShardManifest | None,
    export: ExportOutcome | None,
    training_damaged: list[str],
) -> ShardState:
    """`state` with what is built on damaged objects not green: a training shard whose objects are not as published
    (`training_damaged`: what the coverage check found; or an export that refused it as damaged) is `DAMAGED`, one
    on damaged completions `ON_DAMAGED`, and so is an export of either."""
    refused_as_damaged = export is not None and training is not None and export.judges(training) and export.damaged
    found = [*training_damaged, *([export.refused] if refused_as_damaged else [])]
    state = replace(state, damaged_objects=[*state.damaged_objects, *found])
    assembled = state.training_set not in (WAITING, NOT_ASSEMBLED, BLOCKED)
    if found and assembled:
        state = replace(state, training_set=DAMAGED)
    elif state.completions == DAMAGED and assembled:
        state = replace(state, training_set=ON_DAMAGED)
    if state.training_set in (DAMAGED, ON_DAMAGED) and state.export == EXPORTED:
        state = replace(state, export=ON_DAMAGED)
    return state


def shard_state(
    shard: int,
    completions: str,
    *,
    published: CompletionsShardManifest | None,
    completions_verdicts: list[Verdict],
    training: TrainingShardManifest | None,
    training_verdicts: list[Verdict],
    export: ExportOutcome | None,
    damaged: list[str],
) -> ShardState:
    """One shard's state at each stage, from what the stages recorded about its current publications; `damaged`:
    what the coverage check found wrong with its completions' objects."""
    if published is None:
        return ShardState(shard, completions, WAITING, NOT_EXPORTED, damaged_objects=damaged)
    training = current_training(training, published)
    if training is None:
        blocked = _failures(COMPLETIONS, completions_verdicts, published)
        return ShardState(
            shard, completions, BLOCKED if blocked else NOT_ASSEMBLED, NOT_EXPORTED, blocked, damaged_objects=damaged
        )
    outcome = export if export is not None and export.judges(training) else None
    exported = outcome is not None and outcome.exported
    overridden = list(training.source.gates_overridden) + (list(outcome.overridden) if exported else [])
    failed = _failures(TRAINING_SET, training_verdicts, training)
    judged = {verdict.check for verdict in training_verdicts if verdict.judges(training)}
    if failed:
        state = OVERRIDDEN if exported else BLOCKED
    elif not judged.issuperset(REQUIRED_VERDICTS):
        state = UNCHECKED
    else:
        state = OVERRIDDEN if overridden else PASSED
    return ShardState(
        shard,
        completions,
        state,
        EXPORTED if exported else REFUSED if outcome is not None else NOT_EXPORTED,
        [] if exported else failed,
        overridden,
        damaged,
        outcome.refused if outcome is not None else "",
    )


def answer_shards(readings: Readings) -> ShardsAnswer:
    """Every shard's state at each stage, counted, and the shards that are not green."""
    damaged, training_damaged = readings.damaged_objects, readings.damaged_training
    verdicts = readings.verdicts
    runs = {
        RUNNING: {beat.shard for beat in readings.live},
        DEAD: {beat.shard for beat in readings.dead},
        FAILED: {beat.shard for beat in readings.heartbeats if beat.state == "failed"},
    }
    states = [
        with_damage(
            shard_state(
                shard,
                completions_state(shard, shard in readings.published, runs, damaged.keys()),
                published=readings.published.get(shard),
                completions_verdicts=verdicts.get(COMPLETIONS, {}).get(shard, []),
                training=readings.training_set.get(shard),
                training_verdicts=verdicts.get(TRAINING_SET, {}).get(shard, []),
                export=readings.exports.get(shard),
                damaged=damaged.get(shard, []),
            ),
            training=readings.training_set.get(shard),
            export=readings.exports.get(shard),
            training_damaged=training_damaged.get(shard, []),
        )
        for shard in range(readings.num_shards)
    ]
    not_green: dict[str, list[int]] = {}
    for state in states:
        for stage, value, green in zip(("completions", "training_set", "export"), _stages(state), GREEN, strict=True):
            if value != green:
                not_green.setdefault(f"{stage} {value}", []).append(state.shard)
    return ShardsAnswer(
        shards=readings.num_shards,
        completions=dict(Counter(state.completions for state in states)),
        training_set=dict(Counter(state.training_set for state in states)),
        export=dict(Counter(state.export for state in states)),
        not_green=not_green,
        needs_a_look=[state for state in states if state.needs_a_look],
        done=bool(states) and all(state.green for state in states),
    )


def _stages(state: ShardState) -> tuple[str, str, str]:
    return state.completions, state.training_set, state.export


def green_shards(shards: ShardsAnswer) -> int:
    """Shards exported with every blocking gate green."""
    return shards.shards - len({shard for in_state in shards.not_green.values() for shard in in_state})


def _counts(counts: dict[str, int], answer: ShardsAnswer, stage: str) -> str:
    return ", ".join(
        f"{state} {n:,}" + (f" [{shard_list(answer.not_green[f'{stage} {state}'])}]" if state not in GREEN else "")
        for state, n in counts.items()
    )


def render_shards(shards: ShardsAnswer) -> list[str]:
    done = (
        "DONE: every shard exported with every blocking gate green"
        if shards.done
        else f"not done: {green_shards(shards):,} of {shards.shards:,} exported with every blocking gate green"
    )
    lines = [
        f"Shards by stage ({shards.shards:,}): {done}",
        f"   completions: {_counts(shards.completions, shards, 'completions') or '—'}",
        f"   training set: {_counts(shards.training_set, shards, 'training_set') or '—'}",
        f"   export: {_counts(shards.export, shards, 'export') or '—'}",
    ]
    for state in shards.needs_a_look[:10]:
        lines += [f"   {line}" for line in describe_shard(state)]
    if len(shards.needs_a_look) > 10:
        lines.append(f"   … {len(shards.needs_a_look) - 10:,} more shards need a look (`dflash status --json`)")
    return lines


def describe_shard(state: ShardState) -> list[str]:
    """What is wrong with one shard, a line per finding."""
    shard = f"shard {state.shard}"
    return [
        *(f"BLOCKED {shard} by {failure.describe()}" for failure in state.blocked_by),
        *([f"OVERRIDDEN {shard}: failed gates let through: {', '.join(state.overridden)}"] if state.overridden else []),
        *(f"DAMAGED {shard}: {problem}" for problem in state.damaged_objects),
        *(
            [f"DAMAGED {shard}: its completions objects differ from its manifest"]
            if state.completions == DAMAGED and not state.damaged_objects
            else []
        ),
        *([f"REFUSED {shard} by specforge_export: {state.refused}"] if state.refused else []),
    ]
