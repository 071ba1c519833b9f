"""Everything the answers are computed from, read once from the store and the fleet (`ops.status.take_readings`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dagster_project.conversations.shards import ConversationsManifest, ConversationsShardManifest
from dagster_project.generation.fleet_life import FleetLife
from dagster_project.generation.heartbeat import ACTIVE_STATES, run_is_alive
from dagster_project.generation.line_hold import Hold
from dagster_project.generation.line_stop import WatchReport
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ingest.shards import RawPromptsManifest
from dagster_project.ops.coverage import DatasetCoverage
from dagster_project.ops.plan import Plan
from dagster_project.ops.tune import TuneReport
from dagster_project.pilot_record import PilotRecord
from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.store.verdicts import ExportOutcome, Verdict
from dagster_project.tokenizer import TokenizerIdentity
from dagster_project.training.shards import TrainingShardManifest


@dataclass(frozen=True)
class Readings:
    """Everything the answers are computed from, read once from the store and the fleet."""

    now: float
    num_shards: int
    raw: RawPromptsManifest | None
    conversations: ConversationsManifest | None
    events_planned: int
    published: dict[int, CompletionsShardManifest]
    heartbeats: list[Heartbeat]
    # What each server says about itself (`launch.fleet_status`), keyed by URL.
    fleet: dict[str, dict[str, Any]]
    plan: Plan | None
    coverage_by_id: DatasetCoverage | None
    tuning: TuneReport | None = None  # the last `dflash tune` / fleet_tuning sweep
    training_set: dict[int, TrainingShardManifest] = field(default_factory=dict)
    # Stage → shard → the verdicts its blocking checks recorded (some may judge an earlier publication).
    verdicts: dict[str, dict[int, list[Verdict]]] = field(default_factory=dict)
    exports: dict[int, ExportOutcome] = field(default_factory=dict)  # the SpecForge export's last outcome
    fleet_lives: list[FleetLife] = field(default_factory=list)  # every `fleet up` to its `fleet down`, priced
    hold: Hold | None = None  # the line's hold, if one stands
    released_holds: list[Hold] = field(default_factory=list)  # every hold released, oldest first (`HoldLog`)
    watch: list[WatchReport] = field(default_factory=list)  # every shard's last quality-watch report
    pilot: PilotRecord | None = None  # the last pilot, of any settings (`pilot/latest.json`)
    pilot_runs: list[PilotRecord] = field(default_factory=list)  # every pilot run (`pilot/runs/`), for the ledger
    conversations_shards: dict[int, ConversationsShardManifest] = field(default_factory=dict)  # as published now
    # The model every server must serve (DFLASH_SERVED_MODEL, as the fleet resource reads it; empty: not checked).
    served_model: str = QWEN3_6_27B.model

    @property
    def made_from_edited_conversations(self) -> dict[str, list[int]]:
        """Stage → its shards made from conversations other than those published now (prompts edited, or rebuilt
        with other content, after the shard was made); a training shard whose staleness the operator accepted
        (`accept_stale_conversations`) is not listed."""
        now = self.conversations_shards
        completions = [
            s for s, m in sorted(self.published.items()) if s in now and m.conversations_used.changed_in(now[s])
        ]
        training = [
            s
            for s, m in sorted(self.training_set.items())
            if s in now and not m.source.stale_conversations_accepted and m.source.conversations.changed_in(now[s])
        ]
        return {stage: shards for stage, shards in (("completions", completions), ("training_set", training)) if shards}

    @property
    def tokenizers(self) -> dict[str, dict[int, TokenizerIdentity]]:
        """Stage → shard → the tokenizer its published shard was made under."""
        return {
            "conversations": {s: m.tokenizer for s, m in self.conversations_shards.items()},
            "completions": {s: m.tokenizer for s, m in self.published.items()},
            "training_set": {s: m.source.tokenizer for s, m in self.training_set.items()},
        }

    @property
    def live(self) -> list[Heartbeat]:
        """The heartbeats of shard runs running now."""
        return [b for b in self.heartbeats if run_is_alive(b, self.now)]

    @property
    def dead(self) -> list[Heartbeat]:
        """Shard runs that say `running` but whose process is gone (killed): they will never finish."""
        return [b for b in self.heartbeats if b.state in ACTIVE_STATES and not run_is_alive(b, self.now)]

    @property
    def damaged_objects(self) -> dict[int, list[str]]:
        """Shard → the problems (each naming its object) the last coverage check found with its completions, for
        the shards not published again since."""
        by_id = self.coverage_by_id
        if by_id is None:
            return {}
        found = {damage.shard: damage.problems for damage in by_id.damaged}
        found |= {shard: [] for shard in by_id.shards_damaged if shard not in found}  # a check that named no file
        return {
            shard: problems
            for shard, problems in found.items()
            if shard in self.published and self.published[shard].published_at <= by_id.computed_at
        }

    @property
    def damaged_training(self) -> dict[int, list[str]]:
        """Shard → the problems the last coverage check found with its training shard's objects, for the training
        shards not published again since."""
        by_id = self.coverage_by_id
        if by_id is None:
            return {}
        return {
            damage.shard: damage.problems
            for damage in by_id.training_damaged
            if damage.shard in self.training_set and self.training_set[damage.shard].published_at <= by_id.computed_at
        }

    @property
    def live_unpublished(self) -> list[Heartbeat]:
        """Running shards whose work is not yet counted in a published manifest."""
        return [b for b in self.live if b.shard not in self.published]

    @property
    def output_tokens(self) -> int:
        """Output tokens generated so far: the published shards' and what running shards generated since."""
        return sum(m.output_tokens for m in self.published.values()) + sum(
            b.output_tokens for b in self.live_unpublished
        )

    @property
    def held_runs(self) -> list[Heartbeat]:
        """The last runs of unpublished shards that ended (failed) while a hold stood, this one or a released one:
        their journaled answers are in no published shard and no live run until their shards run again (their
        heartbeats are then the new runs'), and are kept or dropped as the release says."""
        holds = [*self.released_holds, *([self.hold] if self.hold else [])]
        return [
            b
            for b in self.heartbeats
            if b.state == "failed"
            and b.shard not in self.published
            and any(h.held_at <= b.updated_at <= (h.released_at or math.inf) for h in holds)
        ]

    @property
    def stopped_by_the_standing_hold(self) -> set[int]:
        """The shards of the held runs the hold that stands now stopped (the verdict names them, and their command)."""
        hold = self.hold
        return {b.shard for b in self.held_runs if hold is not None and b.updated_at >= hold.held_at}

    @property
    def events_done(self) -> int:
        """Planned events with a record: the published shards' rows, and what running shards did so far (not the held
        runs' answers: see `held_runs`)."""
        return sum(m.rows for m in self.published.values()) + sum(b.done_events for b in self.live_unpublished)
