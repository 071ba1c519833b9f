"""Fleet lifecycle on simulator processes: pid file, readiness, startup errors, stop, stale cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dagster_project.sglang.launch import (
    PID_FILE,
    Fleet,
    FleetError,
    cleanup_stale,
    fleet_status,
    launch_simulators,
    stop_fleet,
)
from tests.support.sglang_fixtures import wait_until


def test_fleet_lifecycle_pid_file_logs_status_and_stop(tmp_path):
    fleet = launch_simulators(2, tmp_path, {"enable_metrics": True, "output_len": "fixed:8"})
    try:
        record = Fleet.load(tmp_path)
        assert record.state == "up" and record.kind == "simulator" and record.urls == fleet.urls
        assert all(member.process() is not None for member in record.members)
        assert all("simulator ready on" in Path(member.log).read_text() for member in record.members)
        status = fleet_status(fleet.urls)
        assert [s["healthy"] for s in status] == [True, True] and status[0]["max_running_requests"] == 48
        assert status[0]["running"] == 0.0
        with pytest.raises(FleetError, match="already running"):
            launch_simulators(1, tmp_path)
    finally:
        assert sorted(stop_fleet(tmp_path)) == ["sim0", "sim1"]
    assert not (tmp_path / PID_FILE).exists() and all(member.process() is None for member in record.members)
    assert stop_fleet(tmp_path) == []


def test_servers_do_not_inherit_store_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak-this")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "nor-this")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # not a secret: kept
    fleet = launch_simulators(1, tmp_path)
    try:
        environment = Fleet.load(tmp_path).members[0].process().environ()
    finally:
        stop_fleet(tmp_path)
    assert "AWS_SECRET_ACCESS_KEY" not in environment and "AWS_SESSION_TOKEN" not in environment
    assert environment["AWS_DEFAULT_REGION"] == "us-east-1" and fleet.urls


def test_startup_timeout_names_the_server_and_shows_its_log(tmp_path):
    with pytest.raises(FleetError) as caught:
        launch_simulators(1, tmp_path, {"startup_s": 120}, startup_timeout_s=10)
    message = str(caught.value)
    assert "sim0" in message and "not ready after" in message and "simulator ready on" in message
    assert not (tmp_path / PID_FILE).exists()  # what was started is stopped again


def test_a_server_that_dies_at_startup_fails_fast_with_its_log(tmp_path):
    with pytest.raises(FleetError) as caught:
        launch_simulators(1, tmp_path, {"output_len": "bogus"}, startup_timeout_s=30)
    assert "exited during startup" in str(caught.value) and "bad output length distribution" in str(caught.value)


LAUNCHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from dagster_project.sglang.launch import launch_simulators
    launch_simulators(2, Path(sys.argv[1]), {"startup_s": 120}, startup_timeout_s=300)
    """
)


def test_servers_left_by_a_killed_launcher_are_cleaned_up(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=os.getcwd())
    try:
        wait_until(
            lambda: (f := Fleet.load(tmp_path)) is not None and len(f.members) == 2,
            timeout_s=60,
            what="two servers spawned",
        )
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    orphans = Fleet.load(tmp_path)
    assert orphans.state == "starting" and all(member.process() is not None for member in orphans.members)
    assert sorted(cleanup_stale(tmp_path)) == ["sim0", "sim1"]
    assert all(member.process() is None for member in orphans.members) and Fleet.load(tmp_path) is None
