"""The operator's questions, answered from the store (heartbeats, manifests, plan) and the live fleet.

1. progress vs the plan   2. MTP on and its accept length   3. concurrency and what caps it
4. storage                5. coverage of the dataset          6. multi-turn handling      7. cost
and every shard's state at each stage (completions → training set → export), which says whether the job is done.

`collect_status` reads the store and the fleet once (`take_readings`), then answers each question with its own
module in `ops.answers` (the answer's dataclass, `answer_*` and `render_*`); `Status` holds them and the alerts
(`ops.alerts`, which reads the answers). `render_text` prints them for the `status` command, and
`dataclasses.asdict(status)` is the `--json` output and the report asset's metadata. Both come from the same
answers, so the UI and the terminal agree.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dagster_project import settings
from dagster_project.conversations.shards import (
    ConversationsShardManifest,
    read_conversations_manifest,
)
from dagster_project.generation.fleet_life import read_fleet_lives
from dagster_project.generation.fleet_registry import NodeRecord
from dagster_project.generation.heartbeat import read_heartbeats
from dagster_project.generation.line_hold import read_hold, read_hold_log
from dagster_project.generation.line_stop import read_watch_reports
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ingest.shards import read_raw_prompts_manifest
from dagster_project.ops.alerts import (
    DEFAULT_THRESHOLDS,
    Alert,
    AlertThresholds,
    pilot_alerts,
    quality_alerts,
    raise_alerts,
    render_alerts,
)
from dagster_project.ops.answers.concurrency import ConcurrencyAnswer, answer_concurrency, render_concurrency
from dagster_project.ops.answers.cost import NO_PRICE, CostAnswer, CostInputs, FleetCost, answer_cost, render_cost
from dagster_project.ops.answers.coverage import CoverageAnswer, answer_coverage, render_coverage
from dagster_project.ops.answers.mtp import MtpAnswer, answer_mtp, render_mtp
from dagster_project.ops.answers.multi_turn import MultiTurnAnswer, answer_multi_turn, render_multi_turn
from dagster_project.ops.answers.progress import ProgressAnswer, answer_progress, render_progress
from dagster_project.ops.answers.quality import QualityAnswer, answer_quality, render_quality
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.shards import BLOCKED, ShardsAnswer, answer_shards, render_shards
from dagster_project.ops.answers.storage import StorageAnswer, StoreDelay, answer_storage, render_storage
from dagster_project.ops.answers.text import ago, as_of
from dagster_project.ops.answers.waste import WasteAnswer, answer_waste, price_waste, render_waste
from dagster_project.ops.coverage import read_coverage
from dagster_project.ops.plan import read_plan
from dagster_project.ops.tune import read_report
from dagster_project.pilot_record import read_latest_pilot, read_pilot_runs
from dagster_project.sglang.launch import fleet_status
from dagster_project.shown_text import shown
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, TRAINING_SET
from dagster_project.store.manifest import read_published_manifests
from dagster_project.store.storage import Store
from dagster_project.store.verdicts import read_stage_records
from dagster_project.training.shards import TrainingShardManifest


def probe_fleet(endpoints: list[str], api_key: str | None = None) -> dict[str, dict[str, Any]]:
    return {probe["url"]: probe for probe in fleet_status(endpoints, api_key)} if endpoints else {}


def take_readings(store: Store, endpoints: list[str], *, api_key: str | None, now: float) -> Readings:
    """A few requests whatever the shard count, made side by side: the shards' manifests and the finished runs'
    heartbeats come from the store's index (`store.object_index`), not one object each, and the other records and
    the fleet's probes are read meanwhile. Checking the stored shards themselves (listing, checksums) is the
    coverage check's work (`ops.coverage`), which reads every object anyway."""
    with ThreadPoolExecutor(max_workers=12) as pool:
        conversations = pool.submit(read_conversations_manifest, store)
        generated = pool.submit(read_stage_records, store, COMPLETIONS, CompletionsShardManifest)
        raw = pool.submit(read_raw_prompts_manifest, store)
        heartbeats = pool.submit(read_heartbeats, store)
        fleet = pool.submit(probe_fleet, endpoints, api_key)
        plan = pool.submit(read_plan, store)
        coverage_by_id = pool.submit(read_coverage, store)
        tuning = pool.submit(read_report, store)
        assembled = pool.submit(read_stage_records, store, TRAINING_SET, TrainingShardManifest)
        lives = pool.submit(read_fleet_lives, store)
        hold, watch = pool.submit(read_hold, store), pool.submit(read_watch_reports, store)
        hold_log = pool.submit(read_hold_log, store)
        pilot, pilot_runs = pool.submit(read_latest_pilot, store), pool.submit(read_pilot_runs, store)
        planned = pool.submit(read_published_manifests, store, CONVERSATIONS, ConversationsShardManifest)
        stage = conversations.result()
        shards = stage.num_shards if stage else 0  # as published: the environment has no say
        conversations_shards = {s: m for s, m in planned.result().items() if s < shards}
        # The stage manifest is written last: while it is missing, the shards published so far tell the plan.
        events_planned = (stage.turns if stage else 0) or sum(m.turns for m in conversations_shards.values())
        completions, training = generated.result(), assembled.result()
        return Readings(
            now=now,
            num_shards=shards,
            raw=raw.result(),
            conversations=stage,
            conversations_shards=conversations_shards,
            events_planned=events_planned,
            published={s: m for s, m in completions.manifests.items() if s < shards},
            heartbeats=heartbeats.result(),
            fleet=fleet.result(),
            plan=plan.result(),
            coverage_by_id=coverage_by_id.result(),
            tuning=tuning.result(),
            training_set=training.manifests,
            verdicts={COMPLETIONS: completions.verdicts, TRAINING_SET: training.verdicts},
            exports=training.exports,
            fleet_lives=lives.result(),
            hold=hold.result(),
            released_holds=hold_log.result().released,
            watch=watch.result(),
            pilot=pilot.result(),
            pilot_runs=pilot_runs.result(),
            served_model=settings.served_model(),
        )


@dataclass(frozen=True)
class Status:
    collected_at: float
    progress: ProgressAnswer
    mtp: MtpAnswer
    concurrency: ConcurrencyAnswer
    storage: StorageAnswer
    coverage: CoverageAnswer
    multi_turn: MultiTurnAnswer
    cost: CostAnswer | None = None  # None: no price configured
    shards: ShardsAnswer | None = None  # every shard's state at each stage
    alerts: list[Alert] = field(default_factory=list)
    # Registered nodes lost without `fleet down`: their servers accept no connection and they did not `fleet up` again.
    stale_nodes: list[NodeRecord] = field(default_factory=list)
    waste: WasteAnswer | None = None  # output tokens generated and not trained, by cause (question 7)
    quality: QualityAnswer | None = None  # the quality watch's figures while shards run, and the line's hold


def collect_status(
    store: Store,
    endpoints: list[str],
    *,
    api_key: str | None = None,
    current_fingerprint: str | None = None,
    materialized: set[int] | None = None,
    now: float | None = None,
    cost: FleetCost = NO_PRICE,
    thresholds: AlertThresholds = DEFAULT_THRESHOLDS,
) -> Status:
    """`current_fingerprint`: the generation settings configured now; published shards made otherwise are stale.
    `materialized`: the completions shards Dagster recorded as materialized; each should be published intact.
    `cost`: the fleet's price; `thresholds`: when to raise an alert."""
    now = time.time() if now is None else now
    readings = take_readings(store, endpoints, api_key=api_key, now=now)
    return answer_all(
        store,
        readings,
        current_fingerprint=current_fingerprint,
        materialized=materialized,
        cost=cost,
        thresholds=thresholds,
        endpoints_known=bool(endpoints),
    )


def answer_all(
    store: Store,
    readings: Readings,
    *,
    current_fingerprint: str | None,
    materialized: set[int] | None,
    cost: FleetCost,
    thresholds: AlertThresholds,
    endpoints_known: bool,
    delay: StoreDelay | None = None,
) -> Status:
    """Every answer, the cost and the alerts from one set of readings; `delay`: the store did not answer in time,
    and the readings from it are the last snapshot's."""
    progress, mtp, concurrency = answer_progress(readings), answer_mtp(readings), answer_concurrency(readings)
    held = readings.hold is not None  # nothing generates: no time to the end, no server waiting for work
    progress = progress.while_held() if held else progress
    storage = answer_storage(store, readings, current_fingerprint, materialized, delay)
    shards = answer_shards(readings)
    waste = answer_waste(readings, shards.not_green.get(f"training_set {BLOCKED}", []))
    priced = answer_cost(cost, progress, servers=len(readings.fleet), inputs=cost_inputs(readings, waste))
    quality = answer_quality(readings.hold, readings.watch, readings.now)
    return Status(
        collected_at=readings.now,
        progress=progress,
        mtp=mtp,
        concurrency=concurrency,
        storage=storage,
        coverage=answer_coverage(readings),
        multi_turn=answer_multi_turn(readings),
        cost=priced,
        waste=price_waste(waste, priced),
        shards=shards,
        alerts=[
            *quality_alerts(quality),
            *pilot_alerts(readings.pilot),
            *raise_alerts(
                progress,
                mtp,
                concurrency,
                storage,
                shards,
                endpoints_known=endpoints_known,
                thresholds=thresholds,
                held=held,
            ),
        ],
        quality=quality,
    )


def cost_inputs(readings: Readings, waste: WasteAnswer) -> CostInputs:
    """What the cost is computed from: the fleet's life, when shards generated, and what was trained (the
    ledger's: within max_length, of shards no gate stops)."""
    return CostInputs(
        lives=readings.fleet_lives,
        busy=[(b.started_at, b.updated_at) for b in readings.heartbeats],
        output_tokens=readings.output_tokens,
        trained_tokens=waste.trained_output_tokens,
        now=readings.now,
    )


def render_text(status: Status) -> str:
    """The answers as text, one line each: what the data and the servers wrote in a line escaped (`shown`), its
    line breaks among them (a file name or a server's error cannot forge a line, nor move the terminal's cursor)."""
    hold = status.quality.hold if status.quality else None
    lines = [
        *([hold.headline()] if hold else []),  # first: nothing else matters until it is looked at
        # Every answer below is from readings taken then (the store, the heartbeats, the fleet's probes); the
        # coverage by id and the last publish say their own age.
        f"As of {as_of(status.collected_at)}" + _not_refreshed(status.storage.delay),
        *(render_shards(status.shards) if status.shards else []),
        *(render_quality(status.quality, status.collected_at) if status.quality else []),
        *render_progress(status.progress, status.collected_at),
        *render_mtp(status.mtp),
        *render_concurrency(status.concurrency),
        *render_storage(status.storage, status.collected_at),
        *render_coverage(status.coverage, status.collected_at),
        *render_multi_turn(status.multi_turn),
        *render_cost(status.cost),
        *(render_waste(status.waste) if status.waste else []),
        *render_alerts(status.alerts),
        *render_stale_nodes(status.stale_nodes, status.collected_at),
    ]
    return "\n".join(shown(line) for line in lines)


def _not_refreshed(delay: StoreDelay | None) -> str:
    if delay is None:
        return ""
    return (
        f" — NOT REFRESHED ({delay.describe()}): {delay.figures()}; the servers' own figures (2, 3) are read now, "
        f"{as_of(delay.now)}"
    )


def render_stale_nodes(records: list[NodeRecord], now: float) -> list[str]:
    return [
        f"stale node record {record.node} (host {record.host}, last `fleet up` {ago(record.registered_at, now)}): "
        f"none of {', '.join(record.urls)} accepts a connection; no run dispatches to it. Remove it with "
        f"`dflash fleet forget --node {record.node}`"
        for record in records
    ]
