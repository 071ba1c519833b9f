"""Stop the line through Dagster, as a new user meets it: 8 shards, a fleet whose every answer is the seed's
disaster, `dagster dev` with its daemon and sensors (as `make dev` runs it), and "Materialize all" on the shard
assets.

The job's pilot passes on the healthy fleet first; then the fleet goes bad, and the shards generate at the default
`DFLASH_SHARDS_PER_RUN` (64: one run for the 8 shards). In headless Chromium, as an operator clicks it (the global
asset lineage filtered to completions, training_set, specforge_export and hf_export, "Materialize all…", every
partition, "Launch backfill"), one asset backfill over every partition is launched while both simulators answer every
request with empty reasoning then "OK." (`bad_model_share` 1.0). Asserted: the quality
watch writes the hold (a blocking gate, its figure over its threshold, the "OK." answers as evidence); the fleet
receives no job request later than the hold plus the watch's poll (the run stops admitting) and none after the
backfill ended; no generating run is created after the hold (the runs as the instance records them); the backfill
ends without materializing every shard; and `dflash status`'s first line, and the `run_report` page in Chromium,
name the hold, its gate and `dflash hold release`.

Then the fleet is made healthy (`DELETE /_sim/faults`), the hold released with `dflash hold release --reason` (no
`--override`: the answers were wrong), and "Materialize all" clicked again: it succeeds, every shard asset is
materialized for every shard, coverage by id is exact (`dflash status --by-id`, and each shard's), and the fleet is
asked exactly once for every planned event (the held shards' journaled answers, the bad fleet's, are asked again).

Each of the product's fixes this test came with fails it when undone: the simulator's bad model refusing the
served-model probe (no request sent, no hold), a shard under `watch_min_answers` never holding (all 8 generated, no
hold), the held shards' bad answers resumed after the release (their gates block them: the rerun fails).
"""

from __future__ import annotations

import dagster as dg
import pytest

from dagster_project.generation.line_hold import read_hold, read_hold_log
from dagster_project.generation.line_stop import read_watch_reports
from dagster_project.generation.shards import shard_coverage
from dagster_project.store.storage import LocalStore
from tests.support import browser as page
from tests.support.dagster_helpers import (
    BIN_DIR,
    FAST_ANSWERS,
    SHARD_ASSETS,
    DagsterDev,
    backfill_ended,
    backfill_ids,
    dagster_home,
    materialize,
    materialized_partitions,
    pipeline_env,
    publish_conversations,
    run_cli,
)
from tests.support.pilots import pass_pilot_of_env
from tests.support.sglang_fixtures import SimFleet, wait_until

NUM_SHARDS = 8
SHARDS = {f"shard-{i:05d}" for i in range(NUM_SHARDS)}
SERVERS = 2
DISASTER = {"bad_model_share": 1.0}  # every answer: empty reasoning, then "OK." (docs/OPERATIONS.md)
# The bound on stopping admission after a hold (the watch polls every 5 s by default).
ADMISSION_STOPS_WITHIN_S = 30.0
# Bounds for a loaded 2-core machine, far above the times seen; a miss fails with what was awaited.
BACKFILL_TIMEOUT_S = 240


def _ended(dev: DagsterDev, backfill: str, what: str) -> tuple[str, list[dict]]:
    return wait_until(lambda: backfill_ended(dev, backfill), timeout_s=BACKFILL_TIMEOUT_S, interval_s=1.0, what=what)


def _materialize_all(dev: DagsterDev, browser) -> str:
    """Clicked in the UI; returns the backfill it launched."""
    before = backfill_ids(dev)
    selection = " or ".join(f'key:"{asset}"' for asset in SHARD_ASSETS)
    page.click_materialize_all(
        browser, f"http://127.0.0.1:{dev.port}", selection, assets=len(SHARD_ASSETS), partitions=NUM_SHARDS
    )
    (launched,) = backfill_ids(dev) - before
    page.park(browser)  # until the backfill ends: the lineage page would keep polling the webserver meanwhile
    return launched


def _job_requests(fleet: SimFleet, since: list[int]) -> list[dict]:
    """The job's requests each server logged from `since[server]` on (its log's index)."""
    return [entry for index in range(SERVERS) for entry in fleet.job_requests(index, since=since[index])]


def _dflash(env: dict, cwd, *args: str) -> str:
    return run_cli([str(BIN_DIR / "dflash"), *args], env=env, cwd=cwd, timeout_s=120).stdout


def _generating_runs_created_after(instance: dg.DagsterInstance, at: float) -> list[str]:
    records = instance.get_run_records()
    return [
        f"{r.dagster_run.run_id} ({r.dagster_run.status.value}, {r.create_timestamp.timestamp() - at:+.1f} s)"
        for r in records
        if dg.AssetKey("completions") in (r.dagster_run.asset_selection or set())
        and r.create_timestamp.timestamp() > at
    ]


@pytest.mark.timeout(600)
def test_materialize_all_on_a_bad_fleet_holds_the_line_and_after_the_release_the_job_finishes(tmp_path):
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    with SimFleet.start(SERVERS, tmp_path / "fleet", **FAST_ANSWERS) as fleet:
        home = dagster_home(tmp_path / "dagster_home")
        env = pipeline_env(
            home=home, store=store_dir, work_dir=tmp_path / "work", num_shards=NUM_SHARDS, endpoints=fleet.urls
        )
        assert "DFLASH_SHARDS_PER_RUN" not in env and "DFLASH_SKIP_PILOT" not in env
        publish_conversations(home, store_dir, env)
        pass_pilot_of_env(home, env)  # on the healthy fleet: a pilot on the bad one blocks the job before it starts
        for index in range(SERVERS):
            fleet.set_faults(index, **DISASTER)
        after_pilot = [len(fleet.requests(index)) for index in range(SERVERS)]  # the job's requests come after

        with DagsterDev.running(env, tmp_path) as dev, page.headless_chromium() as browser:
            first = _materialize_all(dev, browser)
            status, runs = _ended(dev, first, "the backfill to end")
            asked = _job_requests(fleet, after_pilot)
            hold = read_hold(store)
            assert hold is not None, f"no hold: {len(asked)} answers of the bad fleet, backfill {status}, runs {runs}"

            # The hold: a blocking gate failed on the disaster's answers, with them as its evidence.
            assert hold.figure > hold.threshold and hold.sample_size > 0, hold
            assert hold.examples and all("OK." in e.answer_head for e in hold.examples), hold.examples
            # The fleet: nothing admitted after the runs read the hold (one poll; the bound is 30 s).
            late = [e for e in asked if e["received_at"] > hold.held_at + ADMISSION_STOPS_WITHIN_S]
            assert not late, f"{len(late)} of {len(asked)} job requests arrived > 30 s after the hold"
            # Dagster: no generating run created after the hold; the backfill ended, not every shard generated.
            instance = dg.DagsterInstance.from_config(str(home))
            try:
                assert _generating_runs_created_after(instance, hold.held_at) == []
                done = materialized_partitions(instance, SHARD_ASSETS)
            finally:
                instance.dispose()
            assert [run["status"] for run in runs] == ["FAILURE"] * len(runs), (status, runs)
            assert status != "COMPLETED_SUCCESS" and done["completions"] < SHARDS, (status, done)
            assert not done["training_set"], done  # the disaster's shards are never assembled
            # `dflash status`: its first line is the hold, its gate and the fix.
            first_line = _dflash(env, tmp_path, "status").splitlines()[0]
            assert first_line.startswith("LINE HELD") and f"gate {hold.gate}" in first_line, first_line
            assert "dflash hold release" in first_line, first_line
            # The page: run_report, materialized while the line is held, opens on the hold, its gate and the fix.
            materialize(env, tmp_path, "run_report")
            browser.get(f"http://127.0.0.1:{dev.port}/assets/run_report")
            page.wait_for(browser, "dflash hold release")
            shown = page.save(browser, "run_report_line_held")
            assert "LINE HELD" in shown and f"gate {hold.gate}" in shown, shown
            assert len(_job_requests(fleet, after_pilot)) == len(asked)  # still nothing asked of the fleet

            # A healthy fleet, the hold released after a look, and "Materialize all" again.
            held = {f"shard-{r.shard:05d}" for r in read_watch_reports(store) if r.held}
            assert held and held < SHARDS, held  # the shards the hold stopped mid-way (the rest never started)
            for index in range(SERVERS):
                fleet.clear_faults(index)
            _dflash(env, tmp_path, "hold", "release", "--reason", "restarted the fleet on the right weights")
            assert read_hold(store) is None and read_hold_log(store).released[-1].gate == hold.gate
            second = _materialize_all(dev, browser)
            status, runs = _ended(dev, second, "the rerun to end")
            instance = dg.DagsterInstance.from_config(str(home))
            try:
                done = materialized_partitions(instance, SHARD_ASSETS)
            finally:
                instance.dispose()
            by_id = _dflash(env, tmp_path, "status", "--by-id")

        resumed = _job_requests(fleet, after_pilot)[len(asked) :]
    # The job finished: every shard asset of every shard, each event exactly once.
    assert status == "COMPLETED_SUCCESS" and {run["status"] for run in runs} == {"SUCCESS"}, (status, runs)
    assert done == {asset: SHARDS for asset in SHARD_ASSETS}, done
    assert "missing 0, duplicated 0, unexpected 0" in by_id and "partial 0" in by_id, by_id
    coverage = {shard: shard_coverage(store, int(shard.removeprefix("shard-"))) for shard in SHARDS}
    assert all(c.exact for c in coverage.values()), {shard: c.describe() for shard, c in coverage.items()}
    # The held shards' journaled answers were the bad fleet's: released without --override, they were asked again
    # (and nothing twice), with every event of the shards the hold kept from starting.
    planned = sum(c.expected for c in coverage.values())
    assert len(resumed) == planned, f"{len(resumed)} requests after the release for {planned} planned events"
