"""Blocking completions gates stop `training_set` of the shard in the same run; a healthy fleet passes them all.

One shard run (completions, its checks, training_set with its checks, specforge_export: what `shard_job` and
a backfill run) through `dg.materialize` with the real resources, against simulator processes. With every
server answering with the EOS token alone (the simulator's "empty" fault), `completions` is still materialized
(its events are results, not errors), the answer gates fail with a message that says what is wrong, and
neither `training_set` nor the export runs; nor does it in a later run that selects `training_set` alone (the
checks recorded their verdicts next to the shard), unless its config overrides the failed gates. With a
healthy fleet every completions check passes and the shard goes through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import QUALITY_CHECK, completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks import completions as completions_checks
from dagster_project.checks import training_set as training_set_checks
from dagster_project.generation.journal import Journal
from dagster_project.generation.line_hold import read_hold, read_hold_log, release_hold
from dagster_project.generation.shards import iter_completion_batches, read_completions_manifest, shard_coverage
from dagster_project.pilot_record import PilotRecord
from dagster_project.resources import (
    DatasetStore,
    GenerationConfig,
    SGLangFleet,
    TokenizerResource,
)
from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.training.shards import read_training_manifest
from tests.support.dagster_helpers import (
    FAST_ANSWERS,
    LIFTED_ANSWER_GATES,
    asset_check_keys,
    evaluations_by_check,
    partition_colours,
)
from tests.support.pilots import pass_pilot

SHARD_RUN = [
    completions,
    *dg.load_asset_checks_from_modules([completions_checks]),
    training_set,
    *dg.load_asset_checks_from_modules([training_set_checks]),
    specforge_export,
]
SHARD_ASSETS = ("completions", "training_set", "specforge_export")
# Gates a fleet of empty answers must trip; each says what it saw.
EMPTY_ANSWER_GATES = {"short_answers": "empty", "thinking_structure": "</think>"}


@dataclass
class Prepared:
    store: LocalStore
    instance: dg.DagsterInstance
    pilot: PilotRecord


@contextmanager
def _prepare(root: Path) -> Iterator[Prepared]:
    """The demo's conversations, sharded like the loaded partitions, published in a store and instance of their own,
    and the job's pilot passed on a healthy fleet (before a test's fleet goes bad)."""
    with dg.instance_for_test() as instance:
        store = LocalStore(root / "store")
        result = dg.materialize([raw_prompts, conversations], resources=_resources(store, []), instance=instance)
        assert result.success
        record = pass_pilot(_resources(store, []), instance, own_fleet=root / "pilot_fleet")
        yield Prepared(store, instance, record)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Iterator[Prepared]:
    """Published once for every test of this module."""
    with _prepare(tmp_path_factory.mktemp("gates")) as ready:
        yield ready


def _resources(store: LocalStore, endpoints: list[str]) -> dict:
    return {
        "store": DatasetStore(root=store.uri, work_dir=str(store.root.parent / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
        "fleet": SGLangFleet(endpoints=endpoints),
    }


def _run_shard(
    prepared: Prepared, shard: int, endpoints: list[str], *, quality_watch: bool = True
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        SHARD_RUN,
        partition_key=layout.partition_key(shard),
        resources=_resources(prepared.store, endpoints),
        instance=prepared.instance,
        run_config={"ops": {"completions": {"config": {"quality_watch": quality_watch}}}},
        raise_on_error=False,
    )


def _run_training_set(prepared: Prepared, shard: int, **config) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [training_set],
        partition_key=layout.partition_key(shard),
        resources=_resources(prepared.store, []),
        instance=prepared.instance,
        run_config={"ops": {"training_set": {"config": config}}},
        raise_on_error=False,
    )


def _steps_started(result: dg.ExecuteInProcessResult) -> set[str]:
    return {e.step_key for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START}


def test_empty_answers_fail_the_blocking_gates_and_stop_training_set_in_the_same_run(prepared, sim_fleet):
    fleet = sim_fleet(2, **FAST_ANSWERS)
    for index in range(len(fleet.urls)):
        assert fleet.set_faults(index, empty=True)["empty"] is True
    shard = 1
    partition = layout.partition_key(shard)

    # The gates themselves, the last line: with the quality watch on, a shard of such answers, judged whole at its
    # end, holds the line unpublished (test_a_fleet_going_bad_holds_the_line_...; tests/unit/training).
    result = _run_shard(prepared, shard, fleet.urls, quality_watch=False)

    assert not result.success
    # The fault was live: every answer is the EOS token alone, stored as a result (an empty answer is data).
    events = [
        r for b in iter_completion_batches(prepared.store, shard, ["status", "output_ids"]) for r in b.to_pylist()
    ]
    assert events and {(r["status"], len(r["output_ids"])) for r in events if r["status"] == "ok"} == {("ok", 1)}
    # completions is materialized (its data exists, and the UI shows it) ...
    assert [m.partition for m in result.asset_materializations_for_node("completions")] == [partition]
    assert partition in prepared.instance.get_materialized_partitions(dg.AssetKey("completions"))
    # ... its blocking gates fail, each saying what it saw, attributed to the shard ...
    evaluations = evaluations_by_check(result, "completions")
    failed = {name: e for name, e in evaluations.items() if not e.passed}
    assert set(EMPTY_ANSWER_GATES) <= set(failed), {n: e.description for n, e in evaluations.items()}
    blocked = {name for name, e in failed.items() if e.severity == dg.AssetCheckSeverity.ERROR}
    assert blocked <= {key.name for key in asset_check_keys("completions") if _is_blocking(key)}
    assert set(failed) - blocked <= {"completions_spec_decoding"}  # a warning: one-token answers draft nothing
    for name, phrase in EMPTY_ANSWER_GATES.items():
        assert failed[name].description.startswith("BLOCKED") and phrase in failed[name].description, failed[
            name
        ].description
    assert {e.partition for e in evaluations.values()} == {partition}
    # The run's failure names the gates that stopped it.
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert [e.step_key for e in failures] == ["completions_quality"]
    message = failures[0].event_specific_data.error.message
    assert "blocking asset check" in message and all(name in message for name in blocked), message
    # ... and nothing downstream ran in that run: no training_set step, no rows, no export.
    assert not {"training_set", "specforge_export"} & _steps_started(result)
    assert {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()} == {"completions"}
    assert partition not in prepared.instance.get_materialized_partitions(dg.AssetKey("training_set"))
    assert read_training_manifest(prepared.store, shard) is None
    # What Dagster's partitions view shows of the blocked shard (docs/OPERATIONS.md, "A blocked shard in Dagster's
    # partitions view"): completions green, its failed checks counting for nothing there; the stages the run planned
    # after it red, planned and never materialized in a failed run.
    colours = {asset: partition_colours(prepared.instance, asset).get(partition) for asset in SHARD_ASSETS}
    assert colours == {"completions": "Materialized", "training_set": "Failed", "specforge_export": "Failed"}

    # A later run of training_set alone refuses the gated shard, naming the gates and the way out ...
    later = _run_training_set(prepared, shard)
    assert not later.success
    [failure] = [e for e in later.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    error = failure.event_specific_data.error
    message = error.to_string()
    # One line naming the gates and the override, not a traceback through the stage's code.
    assert error.cls_name == "Failure" and error.cause is None and "override_failed_gates" in message, message
    assert all(f"quality/{name}: BLOCKED" in message for name in EMPTY_ANSWER_GATES), message
    assert read_training_manifest(prepared.store, shard) is None
    # ... and goes on when the operator overrides them, recording which.
    overridden = _run_training_set(prepared, shard, override_failed_gates=True)
    assert overridden.success
    assert {f"quality/{name}" for name in EMPTY_ANSWER_GATES} <= set(
        read_training_manifest(prepared.store, shard).source.gates_overridden
    )


def test_a_healthy_fleet_passes_every_completions_check_and_the_shard_goes_through(prepared, sim_fleet):
    fleet = sim_fleet(2, **FAST_ANSWERS)
    shard = 0
    partition = layout.partition_key(shard)

    result = _run_shard(prepared, shard, fleet.urls)

    evaluations = evaluations_by_check(result, "completions")
    assert set(evaluations) == {key.name for key in asset_check_keys("completions")}
    assert {name: e.description for name, e in evaluations.items() if not e.passed} == {}
    assert {e.partition for e in evaluations.values()} == {partition}
    assert result.success, [e.message for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()} == {
        "completions",
        "training_set",
        "specforge_export",
    }
    trained = read_training_manifest(prepared.store, shard)
    assert trained.rows > 10
    # Cleared by the job's pilot, which its manifest names.
    completions = read_completions_manifest(prepared.store, shard)
    assert not completions.pilot_skipped and completions.pilot.startswith(prepared.pilot.label())
    # Every answer came from a server checked to serve the job's model, and the manifests say which.
    assert completions.served_models == trained.source.served_models == {QWEN3_6_27B.label: completions.ok}


def _is_blocking(key: dg.AssetCheckKey) -> bool:
    from dagster_project.definitions import defs

    return defs.resolve_asset_graph().get_check_spec(key).blocking


def test_a_rerun_of_a_finished_shard_writes_its_figures_not_zeros(prepared, sim_fleet):
    """The rerun finds every answer in its journal and generates nothing: its metadata still says how the
    answers were generated (the rate of the run that made them, their finish reasons), not 0 and {}."""
    fleet = sim_fleet(1, **FAST_ANSWERS)
    shard = 2
    first = _run_completions(prepared, shard, fleet.urls)
    again = _run_completions(prepared, shard, fleet.urls)

    assert first["output_tok_per_s"] > 0 and sum(first["finish_reasons"].values()) == first["ok"] > 0
    # The answers' figures agree; the pool slot's seconds are each run's own.
    assert _answer_figures(again) == _answer_figures(first)


def _answer_figures(metadata: dict) -> dict:
    return {name: value for name, value in metadata.items() if name not in ("pool_slot_s", "pool_slot_idle_s")}


def _run_completions(prepared: Prepared, shard: int, endpoints: list[str]) -> dict:
    result = dg.materialize(
        [completions],
        partition_key=layout.partition_key(shard),
        resources=_resources(prepared.store, endpoints),
        instance=prepared.instance,
    )
    (materialization,) = result.asset_materializations_for_node("completions")
    return {name: getattr(value, "value", value) for name, value in materialization.metadata.items()}


# Answers that take a moment while the fleet is bad (a `slow` fault, about 5 a second over the fleet), so the shard
# is far from done when the watch holds; at full speed once the faults are cleared.
SLOW_BAD_MODEL = {
    "output_len": "uniform:48:160",
    "max_running_requests": 2,
    "decode_step_s": 0.001,
    "faults": {"slow": 10.0, "bad_model_share": 1.0, "bad_model_after_answers": 3},
}
WATCH = {"watch_min_answers": 8, "watch_poll_interval_s": 0.2, "hold_drain_s": 30.0}


def _run_watched_completions(
    prepared: Prepared, shard: int, endpoints: list[str], quality: dict | None = None
) -> dg.ExecuteInProcessResult:
    """The completions step under the watch; with `quality`, its completions_quality check in the run too, with
    that config."""
    ops = {"completions": {"config": WATCH}}
    if quality is not None:
        ops[completions_checks.completions_quality.node_def.name] = {"config": quality}
    return dg.materialize(
        [completions, *([completions_checks.completions_quality] if quality is not None else [])],
        partition_key=layout.partition_key(shard),
        resources=_resources(prepared.store, endpoints),
        instance=prepared.instance,
        run_config={"ops": ops},
        raise_on_error=False,
    )


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    return failure.event_specific_data.error.message


def test_a_fleet_going_bad_holds_the_line_and_a_release_resumes_exactly_once(prepared, sim_fleet):
    """Stop the line (docs/OPERATIONS.md): the watch holds on the bad answers while they arrive, the run stops
    admitting and fails naming the hold, no shard starts while it stands; after the release a rerun asks only
    what is missing and coverage by id is exact."""
    store, shard = prepared.store, 3
    fleet = sim_fleet(2, **SLOW_BAD_MODEL)
    sent = lambda: sum(len(fleet.requests(i)) for i in range(2))  # noqa: E731
    # A generating run waiting in the queue (not submitted yet: a queued run needs a code location's origin).
    waiting = dg.DagsterRun(
        job_name="shard_job", run_id="queued-shard-run", status=dg.DagsterRunStatus.NOT_STARTED, tags={}
    )
    prepared.instance.add_run(waiting)
    try:
        held = _run_watched_completions(prepared, shard, fleet.urls)

        assert not held.success
        # The held run cancelled it at once: no further generating run starts (the sensor would, within 15 s).
        assert prepared.instance.get_run_by_id(waiting.run_id).status == dg.DagsterRunStatus.CANCELED
        hold = read_hold(store)
        assert hold is not None and hold.shards == [shard] and hold.figure > hold.threshold
        assert hold.examples and all("OK." in example.answer_head for example in hold.examples)
        message = _failure_message(held)
        assert "LINE HELD" in message and hold.gate in message and "dflash hold release" in message, message
        assert read_completions_manifest(store, shard) is None  # nothing published
        asked = sent()

        refused = _run_watched_completions(prepared, shard, fleet.urls)  # no shard starts while the hold stands
        assert not refused.success and "LINE HELD" in _failure_message(refused)
        assert sent() == asked
    finally:
        if read_hold(store) is not None:
            release_hold(store, by="test", reason="a known false alarm", override=[hold.gate])
    assert read_hold_log(store).released[-1].released_by == "test"
    for index in range(2):
        fleet.clear_faults(index)

    resumed = _run_watched_completions(prepared, shard, fleet.urls)

    assert resumed.success
    coverage = shard_coverage(store, shard)
    assert coverage.exact, coverage.describe()
    manifest = read_completions_manifest(store, shard)
    assert 0 < sent() - asked < manifest.rows  # only what the held run had not answered
    assert "a known false alarm" in manifest.hold_overrides[hold.gate]  # recorded as override_failed_gates is


def test_the_watch_holds_by_the_thresholds_the_runs_quality_check_blocks_by(tmp_path, sim_fleet):
    """One rule: a run that lifts the completions_quality check's thresholds (its run config) is not held by the
    watch for what that check passes. The same disaster fleet holds the line at the defaults (the test above); with
    the completions gates lifted it is still held, by the supervised length's concentration, which the watch judges
    by the training_set_gates check's thresholds (not lifted here): the seed's own signature."""
    fleet = sim_fleet(2, **SLOW_BAD_MODEL)
    with _prepare(tmp_path) as prepared:
        result = _run_watched_completions(prepared, 3, fleet.urls, quality=LIFTED_ANSWER_GATES)
        hold = read_hold(prepared.store)
        assert hold is not None and hold.gate == "loss_sum_concentration", hold
        assert not result.success
    assert completions_checks.completions_quality.node_def.name == QUALITY_CHECK  # the name the watch reads


BAD_ANSWER = "\n</think>\n\nOK."  # the disaster's answer as the journal's `text` holds it


def _journaled(store: LocalStore, shard: int) -> list[dict]:
    """The records of the shard's journal (one settings fingerprint in this store), oldest first."""
    [path] = (store.root.parent / "work" / "journal" / layout.shard_prefix(layout.COMPLETIONS, shard)).glob("*.jsonl")
    with Journal(path) as journal:
        return sorted(journal.final_records(), key=lambda record: record["finished_at"])


def test_a_release_keeps_the_answers_before_the_onset_and_regenerates_only_the_rest(tmp_path, sim_fleet):
    """A fleet switched bad mid-shard: the hold records its onset, the first answer that failed the holding gate on
    its own; a release without --override drops the answers from there (recorded for the waste ledger) and keeps
    those before it, and the shard then finishes once, exact, with no bad answer published."""
    fleet = sim_fleet(2, **SLOW_BAD_MODEL)
    shard = 3
    with _prepare(tmp_path) as prepared:
        store = prepared.store
        held = _run_watched_completions(prepared, shard, fleet.urls)
        assert not held.success
        hold = read_hold(store)
        assert hold is not None and hold.onset is not None
        journaled = _journaled(store, shard)
        before = [record for record in journaled if record["finished_at"] < hold.onset]
        after = [record for record in journaled if record["finished_at"] >= hold.onset]
        assert before and after and all(record["text"] != BAD_ANSWER for record in before)
        assert after[0]["text"] == BAD_ANSWER  # the onset is the first bad answer

        release_hold(store, by="test", reason="restarted the fleet")  # the answers were wrong: no --override
        for index in range(2):
            fleet.clear_faults(index)
        resumed = _run_watched_completions(prepared, shard, fleet.urls)

        assert resumed.success
        assert shard_coverage(store, shard).exact
        published = {
            row["event_id"]: row
            for batch in iter_completion_batches(store, shard, ["event_id", "text", "finished_at"])
            for row in batch.to_pylist()
        }
        assert all(row["text"] != BAD_ANSWER for row in published.values())
        # Kept as journaled, not asked again; the rest were.
        assert all(published[record["event_id"]]["finished_at"] == record["finished_at"] for record in before)
        assert all(published[record["event_id"]]["finished_at"] > hold.onset for record in after)
        manifest = read_completions_manifest(store, shard)
        assert manifest.generation.dropped_at_release == len(after)
        assert manifest.generation.dropped_at_release_output_tokens == sum(r["completion_tokens"] for r in after)
