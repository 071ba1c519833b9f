import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from dagster_project.assets.line_hold import stop_launching
from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.generation.heartbeat import ReportIntervals
from dagster_project.generation.line_hold import Hold, LineHeld
from dagster_project.generation.line_stop import WatchOptions
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.generation.slot_use import SlotUse
from dagster_project.generation.stage import PilotNote, generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.report import shard_progress_figures
from dagster_project.partitions import SHARD_BACKFILL_POLICY, ShardMaterialized, materialize_shards, shard_partitions
from dagster_project.pilot_record import clearance
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.resources.config_fields import config_fields
from dagster_project.settings import skip_pilot
from dagster_project.store import layout
from dagster_project.store.dataclass_json import from_dict
from dagster_project.store.lease import LeaseOptions
from dagster_project.store.storage import Store
from dagster_project.tokenizer import special_ids, tokenizer_identity
from dagster_project.training import gate_sets
from dagster_project.training.gate_messages import COMPLETIONS_GATES, TRAINING_GATES
from dagster_project.training.gates import GateThresholds
from dagster_project.training.watch_figures import AnswerQualityWatch

# A range run generates two shards at once: the next one's requests fill the servers while the current one's tail
# ends and it is published (`generation.overlap`); memory holds two shards.
SHARDS_AT_ONCE = 2
# The blocking checks whose thresholds the quality watch holds by: the answer gates' (`checks/completions.py`), and
# the supervised length's concentration, a training-set gate (`checks/training_set.py`).
QUALITY_CHECK, TRAINING_CHECK = COMPLETIONS_GATES.check, TRAINING_GATES.check


class CompletionsConfig(
    config_fields(WatchOptions, config_fields(ReportIntervals, config_fields(LeaseOptions, dg.Config)))
):
    """How often a running shard reports its progress, how it holds its shard (one run at a time), and how its
    quality watch may stop the line."""

    quality_watch: bool = Field(
        default=True,
        description="Judge answers by the blocking gates while they arrive, and hold every shard run's admission "
        "when one fails (docs/OPERATIONS.md, 'Stop the line').",
    )

    override_failed_gates: bool = Field(
        default=False,
        description="Generate from a conversations shard that failed blocking conversations checks in an earlier "
        "run (refused otherwise).",
    )
    skip_pilot: bool = Field(
        default=False,
        description="Generate although no pilot of these generation settings has passed (as DFLASH_SKIP_PILOT=1); "
        "recorded in each shard's manifest.",
    )


def quality_watch(run_config: Mapping[str, Any], tok: Any, settings: GenerationSettings) -> AnswerQualityWatch:
    """The watch judges by the thresholds the shard's `completions_quality` check blocks by in this run, and the
    supervised length's concentration by the `training_set_gates` check's (their run config, defaults where it sets
    none): one rule, so the line is never held for what the shard's gates would pass, nor let run past what they
    would block."""
    ops = run_config.get("ops") or {}
    check_config, training_config = (
        ((ops.get(name) or {}).get("config") or {}) for name in (QUALITY_CHECK, TRAINING_CHECK)
    )
    # A check's config read as its dataclasses read a record: the fields each has, defaults for the rest.
    limits = from_dict(gate_sets.CompletionShareLimits, check_config)
    return AnswerQualityWatch(
        special_ids(tok),
        tok.decode,
        settings=settings,
        thresholds=from_dict(GateThresholds, check_config),
        training_thresholds=from_dict(GateThresholds, training_config),
        max_error_share=limits.max_error_share,
        max_length_capped_share=limits.max_length_capped_share,
    )


def _progress_line(heartbeat: Heartbeat) -> str:
    window, accept_length = heartbeat.window, heartbeat.spec.accept_length_window
    eta = f"{heartbeat.eta_s / 60:.1f} min" if heartbeat.eta_s is not None else "none yet (no answer finished)"
    if heartbeat.eta_settling and heartbeat.eta_s is not None:
        eta += (
            f" at the lifetime rate (the window is settling: {heartbeat.eta_rates.seconds / 60:.1f} of "
            f"{heartbeat.eta_window_s / 60:.1f} min measured)"
        )
    accept = f"{accept_length:.2f}" if accept_length else "—"
    return (
        f"{heartbeat.done_events}/{heartbeat.total_events} events, {window.req_per_s:.2f} req/s, "
        f"{window.output_tok_per_s:.0f} out tok/s, accept length {accept}, errors {heartbeat.errors_by_kind or 0}, "
        f"ETA {eta}"
    )


def _known(**figures: float | int | None) -> dict[str, float | int]:
    """The figures that are known (not None): Dagster plots an unknown figure as a gap, not as a dip to 0."""
    return {name: value for name, value in figures.items() if value is not None}


@dg.asset(
    partitions_def=shard_partitions,
    backfill_policy=SHARD_BACKFILL_POLICY,
    # The pilot of the job's settings: its data version is their fingerprint, so the shards go stale in the UI when
    # the settings change, and "Materialize all" runs the pilot first.
    deps=[layout.CONVERSATIONS, layout.PILOT],
    group_name="shards",
    kinds={"sglang", "parquet"},
    pool="sglang_fleet",
    description="One generation event per assistant turn of the shard's conversations, from the SGLang fleet. "
    "Resumes from its journal after a crash: nothing journaled is requested again.",
)
def completions(
    context: dg.AssetExecutionContext,
    config: CompletionsConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
    fleet: SGLangFleet,
    generation: GenerationConfig,
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    tag_asset_run(context)
    settings = generation.to_dataclass()
    skip = config.skip_pilot or skip_pilot()
    model = "" if skip else tokenizer_identity(tokenizer.load()).fingerprint
    cleared = clearance(store.open(), settings.fingerprint(), tokenizer=model, skip=skip)
    if not cleared.allowed:
        raise dg.Failure(description=cleared.message, allow_retries=False)
    context.log.info(cleared.message)
    slot = SlotUse()  # the step holds its `sglang_fleet` slot from here to its end
    # Without a fleet directory (endpoints configured) the shards generating at once share a ledger of the run's.
    run_ledger = tempfile.TemporaryDirectory(prefix="dflash-run-ledger-")

    def generate(shard: int, data: Store) -> ShardMaterialized:
        key = layout.partition_key(shard)

        def on_progress(heartbeat: Heartbeat) -> None:
            context.log.info(f"{key}: {_progress_line(heartbeat)}")
            context.log_event(
                dg.AssetObservation(
                    asset_key=context.asset_key, partition=key, metadata=shard_progress_figures(key, heartbeat)
                )
            )

        def stop_the_queue(hold: Hold) -> None:
            """No further generating run starts: the queued ones are cancelled by the run that sees the hold first,
            as it sees it (the `line_hold_sensor` does it too, but only every 15 s, while the queue launches a run
            a second), and again when it ends."""
            try:
                cancelled, _ = stop_launching(context.instance, hold.headline())
            except Exception as exc:  # noqa: BLE001 - the hold stands whatever this does; the sensor cancels them
                context.log.warning(f"{key}: the line is held; cancelling the queued generating runs failed: {exc}")
                return
            if cancelled:
                context.log.warning(f"{key}: the line is held: cancelled the queued generating runs {cancelled}")

        tok = tokenizer.load()
        watch = quality_watch(context.run.run_config, tok, settings) if config.quality_watch else None
        try:
            manifest = generate_shard(
                data,
                shard,
                tokenizer=tok,
                settings=settings,
                dispatcher=fleet.dispatcher(registry=data, slot_use=slot, ledger_dir=Path(run_ledger.name)),
                work_dir=store.local_dir(),
                intervals=config.to_dataclass(ReportIntervals),
                on_progress=on_progress,
                log=context.log.info,
                run_id=context.run_id,
                lease=config.to_dataclass(LeaseOptions),
                override_failed_gates=config.override_failed_gates,
                pilot=PilotNote(cleared.message, cleared.skipped),
                watch=watch,
                watch_options=config.to_dataclass(WatchOptions),
                on_hold=stop_the_queue,
            )
        except LineHeld as held:
            stop_the_queue(held.hold)
            raise dg.Failure(
                description=str(held),
                metadata={"hold_gate": held.hold.gate, "hold_figure": held.hold.figure, "shard": key},
            ) from held
        used = slot.take()
        metadata = {
            **shard_metadata(manifest),
            # Summed over a backfill's shards: the slot-seconds no request used (ops figure of the rehearsal).
            "pool_slot_s": round(used.held_s, 3),
            "pool_slot_idle_s": round(used.idle_s, 3),
            "uri": dg.MetadataValue.path(data.url(layout.shard_prefix(layout.COMPLETIONS, shard))),
        }
        # Downstream shards go stale in the UI when this shard's content or settings change.
        return ShardMaterialized(metadata, manifest.data_version)

    with run_ledger:
        yield from materialize_shards(context, store, generate, at_once=SHARDS_AT_ONCE)


def shard_metadata(manifest: CompletionsShardManifest) -> dict[str, object]:
    """A published shard's figures; one not known (no answer ok, a run that generated nothing and found no
    earlier run's rates) is left out, never written as 0."""
    run = manifest.generation
    rate = run.lifetime.output_tok_per_s if run.lifetime else None
    return {
        "rows": manifest.rows,
        "ok": manifest.ok,
        "errors": manifest.errors,
        "errors_by_kind": dg.MetadataValue.json(run.errors_by_kind),
        "finish_reasons": dg.MetadataValue.json(run.finish_reasons),
        "output_tokens": manifest.output_tokens,
        **_known(
            avg_output_tokens=round(manifest.avg_output_tokens, 1) if manifest.ok else None,
            output_tok_per_s=round(rate, 1) if rate else None,
            spec_accept_length=round(run.spec.accept_length_lifetime or 0, 3) or None,
        ),
        "settings_fingerprint": manifest.settings_fingerprint,
        "tokenizer": manifest.tokenizer.label(),
        "served_models": dg.MetadataValue.json(manifest.served_models),  # answers per model their servers served
    }
