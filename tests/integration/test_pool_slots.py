"""A run waiting forever for a `sglang_fleet` slot that a dead run holds: named with the command that frees it, in
`dflash status`, on the page (the run_report asset's alerts) and in the waiting run's own log; `dflash free-slots`
gives the slot back and the waiting run gets it.

The runs and their slots are real records of a real instance (the project's dagster.yaml, SQLite), made through
Dagster's own storage calls, the way a run's executor claims a slot: no process has to be killed to get there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import dagster as dg

from dagster_project.assets.pool_slots import stuck_pools, tell_waiting_runs
from dagster_project.ops.pool_slots import pool_alerts
from tests.support.dagster_helpers import dagster_home, pipeline_env

POOL = "sglang_fleet"


def _dflash(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_run_waiting_on_a_slot_held_by_a_dead_run_is_named_with_the_command_that_frees_it(tmp_path):
    home = dagster_home(tmp_path / "dagster_home")
    env = pipeline_env(home=home, store=tmp_path / "store", work_dir=tmp_path / "work", num_shards=2)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots(POOL, 1)
        killed, waiting = (
            instance.add_run(dg.DagsterRun(job_name="shard_job", run_id=run_id, status=dg.DagsterRunStatus.STARTED))
            for run_id in ("killed-run", "waiting-run")
        )
        assert storage.claim_concurrency_slot(POOL, killed.run_id, "completions").is_claimed
        assert not storage.claim_concurrency_slot(POOL, waiting.run_id, "completions").is_claimed
        assert stuck_pools(instance) == []  # the holder still runs, as far as anyone can tell: nothing to say
        instance.report_run_failed(killed, "killed")  # ended; without a daemon its slot is never given back

        (stuck,) = stuck_pools(instance)
        assert stuck.waiting_runs == ["waiting-run"] and stuck.limit == 1
        (alert,) = pool_alerts([stuck])
        assert alert.kind == "pool" and "waiting-run waits for a slot of pool `sglang_fleet` (limit 1)" in alert.message
        assert "killed-run (ended (FAILURE))" in alert.message and "`dflash free-slots killed-run`" in alert.message
        # The waiting run's own log says it, once however often it is checked.
        tell_waiting_runs(instance, [stuck])
        tell_waiting_runs(instance, [stuck])
        told = [
            record.event_log_entry.dagster_event.message
            for record in instance.get_records_for_run("waiting-run", of_type=dg.DagsterEventType.ENGINE_EVENT).records
        ]
        assert told == [alert.message]

    status = _dflash(env, "status", "--json", "--dagster")
    assert status.returncode == 0, status.stderr[-3000:]
    assert [a["message"] for a in json.loads(status.stdout)["alerts"] if a["kind"] == "pool"] == [alert.message]

    freed = _dflash(env, "free-slots", "killed-run")
    assert freed.returncode == 0 and "freed the pool slots of run killed-run (FAILURE)" in freed.stdout, freed.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        # The slot went to the waiting run: its executor's next claim (it polls) gets it.
        assert instance.event_log_storage.claim_concurrency_slot(POOL, "waiting-run", "completions").is_claimed
        assert stuck_pools(instance) == []
    missing = _dflash(env, "free-slots", "no-such-run")
    assert missing.returncode != 0 and "no run no-such-run" in missing.stderr and "Traceback" not in missing.stderr
