"""A healthy run raises no alert: `dagster dev` (webserver, daemon, the page's refresh sensor, as `make dev` runs
it), one shard generating on a healthy, slow simulator fleet, and plain `dflash status` read every 20 s as an
operator's `--watch` would, for over 5 minutes (past the page's 180 s refresh interval plus the daemon's 120 s limit,
the ages the old rule alarmed at). Mostly waiting: under xdist it overlaps the other workers' tests.

Plain `dflash status` reads the daemon's heartbeat the page recorded at its last refresh: every sample is checked to
say "Alerts: none", and the samples must have seen that record older than the daemon's own silence limit (else the
test proves nothing about the rule: the recorded beat of a healthy daemon is that old between two refreshes).
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from dagster_project.ops.dagster_view import DAEMON_SILENT_S, read_view
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import (
    BIN_DIR,
    DAGSTER,
    DEFS_MODULE,
    DagsterDev,
    dagster_home,
    kill_process_group,
    pipeline_env,
    publish_conversations,
    run_cli,
)
from tests.support.pilots import pass_pilot_of_env
from tests.support.sglang_fixtures import SimFleet, wait_until

SAMPLE_EVERY_S = 20.0
WATCHED_S = 310.0
# A fleet that answers well and slowly: the shard generates for far longer than the test watches it.
SLOW_HEALTHY = {"output_len": "uniform:48:160", "max_running_requests": 4, "decode_step_s": 0.25}


@pytest.mark.timeout(900)
def test_plain_status_raises_no_alert_while_a_healthy_shard_runs_under_dagster_dev(tmp_path):
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    with SimFleet.start(2, tmp_path / "fleet", SLOW_HEALTHY) as fleet:
        home = dagster_home(tmp_path / "dagster_home")
        env = pipeline_env(home=home, store=store_dir, work_dir=tmp_path / "work", num_shards=1, endpoints=fleet.urls)
        publish_conversations(home, store_dir, env)
        pass_pilot_of_env(home, env)  # on this fleet: its measured rate is the plan the watched run is judged by
        with DagsterDev.running(env, tmp_path):
            shard = subprocess.Popen(
                [DAGSTER, "asset", "materialize", "-m", DEFS_MODULE, "--select", "completions",
                 "--partition", "shard-00000"],
                env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                what = "the page's first record of the daemon while the shard runs"
                wait_until(lambda: (view := read_view(store)) and view.daemon_heartbeat_at, 240, 1.0, what)
                samples, oldest_record = [], 0.0
                watched_until = time.monotonic() + WATCHED_S
                while time.monotonic() < watched_until:
                    text = run_cli([str(BIN_DIR / "dflash"), "status"], env=env, cwd=tmp_path, timeout_s=120).stdout
                    beat = read_view(store).daemon_heartbeat_at
                    oldest_record = max(oldest_record, time.time() - beat)
                    samples.append(text)
                    assert shard.poll() is None, "the shard run ended: the fleet must keep it generating"
                    alerts = [line for line in text.splitlines() if "ALERT" in line]
                    assert "Alerts: none" in text, f"sample {len(samples)}: {alerts}"
                    threading.Event().wait(SAMPLE_EVERY_S)  # the sampling period asked for, not a synchronization
            finally:
                kill_process_group(shard)
    assert len(samples) >= WATCHED_S / (SAMPLE_EVERY_S + 10)
    assert oldest_record >= DAEMON_SILENT_S, f"the record was at most {oldest_record:.0f} s old: nothing was tested"
