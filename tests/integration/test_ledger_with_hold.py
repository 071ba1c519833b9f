"""Issue 44's acceptance, whole: a fleet that goes bad mid-shard is held by the quality watch, released with `dflash
hold release` (the answers before the hold's onset kept), and the job finishes; then `dflash status --json`'s waste
ledger (trained + pending + every cause) equals what the fleet's servers generated (`sglang:generation_tokens_total`,
summed) within 1%, with the held run's answers under their causes: those the release dropped (`dropped_at_release`)
and those the hold's stop cut short in flight (`stopped_in_flight`, counted by the held run and kept in the store),
and the pilot's answers, passed before on a healthy fleet of its own, under `pilot` (its servers' count included).

Two simulators: one switches to the seed's disaster ("OK.") after a few answers; the other stays healthy and answers
slowly, so it has answers in flight when the hold stops the run (`hold_drain_s` 0). Every shard in one range run (what
"Materialize all" launches): generated, judged, assembled, judged, exported; `dg.materialize` in process with the
real resources, the operator's commands as processes.
"""

from __future__ import annotations

import json
import os

import dagster as dg

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks import completions as completions_checks
from dagster_project.checks import training_set as training_set_checks
from dagster_project.conversations.shards import read_conversations_manifest
from dagster_project.generation.line_hold import read_hold, read_hold_log
from dagster_project.generation.shards import read_completions_manifest, shard_coverage
from dagster_project.generation.unrecorded import STOPPED_IN_FLIGHT
from dagster_project.ops.answers.waste import WasteCause
from dagster_project.resources import SGLangFleet
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.training.export import specforge_key
from tests.support.dagster_helpers import BIN_DIR, in_process_resources, run_cli
from tests.support.harness.invariants import LEDGER_TOLERANCE
from tests.support.pilots import pass_pilot
from tests.support.sglang_fixtures import generation_tokens_total, wait_until

ANSWERS = {"output_len": "uniform:48:160", "max_running_requests": 4, "enable_metrics": True}
BAD, SLOW = 0, 1
FLEET = [
    {**ANSWERS, "decode_step_s": 0.001, "faults": {"bad_model_share": 1.0, "bad_model_after_answers": 6}},
    {**ANSWERS, "decode_step_s": 0.01},  # healthy; its answers take about half a second: some are in flight
]
# The watch as the tests run it: holds from the 8th answer, polls often; the hold stops the run at once.
WATCH = {"watch_min_answers": 8, "watch_judge_every": 4, "watch_poll_interval_s": 0.2, "hold_drain_s": 0.0}
SHARD_RUN = [
    completions,
    training_set,
    specforge_export,
    *dg.load_asset_checks_from_modules([completions_checks]),
    *dg.load_asset_checks_from_modules([training_set_checks]),
]


def _dflash(env: dict, cwd, *args: str) -> str:
    return run_cli([str(BIN_DIR / "dflash"), *args], env=env, cwd=cwd, timeout_s=120).stdout


def _settled(fleet) -> bool:
    """No server holds a request: their counts are final."""
    states = [fleet.state(index) for index in range(len(fleet.urls))]
    return all(state["running"] == 0 and state["queued"] == 0 for state in states)


def test_a_fleet_gone_bad_is_held_released_and_finished_and_the_ledger_equals_what_it_generated(sim_fleet, tmp_path):
    fleet = sim_fleet(2, FLEET)
    store = LocalStore(tmp_path / "store")
    resources = in_process_resources(store, tmp_path / "work", fleet.urls)
    operator = {name: value for name, value in os.environ.items() if not name.startswith(("DFLASH_", "DAGSTER_"))}
    operator |= {"DFLASH_STORE": str(store.root), "DFLASH_SGLANG_ENDPOINTS": ",".join(fleet.urls)}
    with dg.instance_for_test() as instance:

        def materialize(assets: list, **options) -> dg.ExecuteInProcessResult:
            return dg.materialize(assets, resources=resources, instance=instance, raise_on_error=False, **options)

        assert materialize([raw_prompts, conversations]).success
        # The pilot passed on a healthy fleet of its own, before this one goes bad: its servers are counted too.
        pilot_fleet = sim_fleet(2, ANSWERS)
        pilot = pass_pilot({**resources, "fleet": SGLangFleet(endpoints=pilot_fleet.urls)}, instance)
        shards = read_conversations_manifest(store).num_shards
        every_shard = {
            "dagster/asset_partition_range_start": layout.partition_key(0),
            "dagster/asset_partition_range_end": layout.partition_key(shards - 1),
        }
        job = {"ops": {"completions": {"config": WATCH}}}

        held = materialize(SHARD_RUN, tags=every_shard, run_config=job)
        hold = read_hold(store)
        assert not held.success and hold is not None, hold
        assert hold.examples and all("OK." in example.answer_head for example in hold.examples), hold.examples

        released = _dflash(operator, tmp_path, "hold", "release", "--reason", "restarted the bad server")
        assert read_hold(store) is None and read_hold_log(store).released[-1].gate == hold.gate, released
        fleet.clear_faults(BAD)
        finished = materialize(SHARD_RUN, tags=every_shard, run_config=job)
        steps = [e.step_failure_data.error.to_string() for e in finished.get_step_failure_events()]
        assert finished.success, steps

    # The job finished: every shard generated exactly once by id, assembled and exported.
    assert all(shard_coverage(store, shard).exact for shard in range(shards))
    assert all(store.exists(specforge_key(shard)) for shard in range(shards))
    wait_until(lambda: _settled(fleet), timeout_s=30, what="the servers to settle their requests")
    generated = sum(generation_tokens_total(url) for url in fleet.urls + pilot_fleet.urls)

    waste = json.loads(_dflash(operator, tmp_path, "status", "--json"))["waste"]
    tokens, answers = waste["output_tokens"], waste["answers"]
    ledger = waste["trained_output_tokens"] + waste["pending_output_tokens"] + sum(tokens.values())
    assert ledger == waste["generated_output_tokens"]
    assert abs(ledger - generated) <= LEDGER_TOLERANCE * generated, (ledger, generated, tokens)
    # The held run's answers, under their causes: those its release dropped (journaled from the onset), and those in
    # flight at the slow server when the hold stopped the run (its count, kept in the store until the shard published).
    manifests = [read_completions_manifest(store, shard) for shard in range(shards)]
    dropped = sum(m.generation.dropped_at_release for m in manifests)
    assert answers[WasteCause.DROPPED_AT_RELEASE] == dropped > 0, answers
    dropped_tokens = sum(m.generation.dropped_at_release_output_tokens for m in manifests)
    assert tokens[WasteCause.DROPPED_AT_RELEASE] == dropped_tokens
    assert answers[STOPPED_IN_FLIGHT] > 0 and tokens[STOPPED_IN_FLIGHT] > answers[STOPPED_IN_FLIGHT], (answers, tokens)
    assert waste["pending_output_tokens"] == 0 and tokens[WasteCause.BLOCKED_OR_HELD] == 0
    assert answers[WasteCause.PILOT] == pilot.answers and tokens[WasteCause.PILOT] >= pilot.output_tokens > 0
