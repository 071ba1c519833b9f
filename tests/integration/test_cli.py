"""The `dflash` command line as an operator types it (a fresh process per call), and in process where a test
looks at what it hands on."""

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dagster_project.cli import main
from dagster_project.settings import DEMO_DATA_DIR
from dagster_project.sglang import launch, launch_plan
from dagster_project.sglang.model_identity import QWEN3_6_27B
from tests.support.ingest_helpers import run_stages

SECRET = "sk-test-4f1d9a7c"


@pytest.fixture
def env(tmp_path):
    return {
        **os.environ,
        "DFLASH_STORE": str(tmp_path / "store"),
        "DFLASH_WORK_DIR": str(tmp_path / "work"),
        "SGLANG_API_KEY": SECRET,
    }


def dflash(env: dict, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert SECRET not in result.stdout + result.stderr, "the API key was printed"
    return result.stdout


def test_fleet_up_status_down_never_shows_the_api_key_and_what_it_cost_outlives_it(env, tmp_path):
    env["DFLASH_COST_PER_GPU_HOUR"] = "13.5"  # where the fleet starts: recorded with its life
    try:
        assert "fleet up (simulator)" in dflash(
            env, "fleet", "up", "--simulate", "2", "--sim-option", "output_len=fixed:8"
        )
        record = (tmp_path / "work" / "fleet" / "fleet.json").read_text()
        assert SECRET not in record and "--config" in record
        # Nor in any fleet process's command line (`ps`): each read its key from a 0600 --config file, removed
        # once the fleet was up.
        fleet = launch.Fleet.load(tmp_path / "work" / "fleet")
        processes = [p for m in fleet.members for p in (m.process(), *m.process().children(recursive=True))]
        assert len(processes) >= 2
        for process in processes:
            assert SECRET.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes(), process.cmdline()
        assert not list((tmp_path / "work" / "fleet").glob("*.secrets.yaml"))
        # `fleet up` again while it runs: refused in one line, the running fleet untouched.
        again = subprocess.run(
            [sys.executable, "-m", "dagster_project.cli", "fleet", "up", "--simulate", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 1 and "Traceback" not in again.stderr
        assert (
            again.stderr.startswith("dflash fleet up: a simulator fleet is already running")
            and again.stderr.count("\n") == 1
        )
        table = dflash(env, "fleet", "status").splitlines()
        assert table[0].split() == ["pid", "address", "health", "model", "cap", "running", "queued"]
        assert [row.split()[2:4] for row in table[1:]] == [["healthy", QWEN3_6_27B.model]] * 2
        record = json.loads((tmp_path / "work" / "fleet" / "fleet.json").read_text())
        assert sorted(int(row.split()[0]) for row in table[1:]) == sorted(m["pid"] for m in record["members"])
        servers = [json.loads(line) for line in dflash(env, "fleet", "status", "--json").splitlines()]
        assert [s["healthy"] for s in servers] == [True, True]
        assert all(s["speculative_algorithm"] == "EAGLE" and s["max_running_requests"] == 16 for s in servers)
        # Routes other than /health need the key: without it, status cannot read the servers' state.
        servers_without_key = [
            json.loads(line) for line in dflash({**env, "SGLANG_API_KEY": ""}, "fleet", "status", "--json").splitlines()
        ]
        assert all("unauthorized" in s["error"] for s in servers_without_key)
        before = json.loads(dflash(env, "status", "--json"))["cost"]
        asked_at = time.time()
        assert before["basis"] == "fleet_life" and before["gpus"] == 2 and before["fleet_up"]
    finally:
        assert "stopped sim0, sim1" in dflash(env, "fleet", "down")
    # Later, in processes with no price configured: what the fleet cost, at the price it was started with.
    elsewhere = {name: value for name, value in env.items() if name != "DFLASH_COST_PER_GPU_HOUR"}
    after = json.loads(dflash(elsewhere, "status", "--json"))["cost"]
    assert not after["fleet_up"]
    # The same as just before `fleet down`, plus the seconds the GPUs stayed up between the two.
    assert before["spent"] <= after["spent"] <= before["spent"] + 2 * 13.5 * (time.time() - asked_at) / 3600
    assert f"spent ${after['spent']:,.2f}" in dflash(elsewhere, "status")
    assert "nothing" in dflash(env, "fleet", "down")


def test_plan_and_status_on_an_empty_store(env):
    dflash(env, "plan", "--brief")
    assert json.loads(dflash(env, "plan", "--show"))["req_per_s"] == 5.6
    text = dflash(env, "status")
    for heading in ("1. Progress", "2. MTP", "3. Concurrency", "4. Storage", "5. Coverage", "6. Multi-turn"):
        assert heading in text
    assert "5.6 req/s" in text
    by_id = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", "status", "--by-id"], env=env, capture_output=True, text=True
    )
    assert by_id.returncode != 0 and "materialize conversations" in by_id.stderr


def test_plan_says_what_the_job_costs(env):
    text = dflash(env, "plan", "--brief")
    assert "cost at $27.00/hour (7 GPUs): 913,786 prompts in 45.3 h: $1,224" in text
    assert "$0.47 per 1M output tokens" in text and "0.347 GPU-hours per 1K rows" in text


def test_status_piped_into_head_ends_quietly(env):
    """`dflash status | head`: the reader closes the pipe before status prints; no traceback follows."""
    process = subprocess.Popen(
        [sys.executable, "-m", "dagster_project.cli", "status"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # before the status is computed and printed: the print meets a closed pipe
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0 and b"Traceback" not in stderr, stderr.decode()[-3000:]


def test_status_with_the_fleet_down_says_so_per_server_and_alerts(env):
    (port,) = launch.free_ports(1)
    down = f"http://127.0.0.1:{port}"
    text = dflash({**env, "DFLASH_SGLANG_ENDPOINTS": down, "DFLASH_COST_PER_GPU_HOUR": "3.5"}, "status")
    concurrency = text.split("3. Concurrency")[1].split("4. Storage")[0].strip().splitlines()
    assert concurrency[1:] == [f"   {down}: — / — / — / — / — → unreachable"]
    assert f"ALERT [fleet]: the fleet is unreachable: {down}" in text
    assert "7. Cost at $3.50/hour (1 GPUs)" in text


def test_plan_shards_follows_the_fleet_and_the_cost_of_a_run_and_writes_nothing(env, tmp_path):
    common = ("plan", "--shards", "--events", "900000", "--fleet-cap", "672", "--seconds-per-event", "50")
    cheap = dflash(env, *common, "--run-overhead-s", "4")
    costly = dflash(env, *common, "--run-overhead-s", "60")
    assert "tail per run" in cheap and "fixed cost per run" in costly
    assert int(costly.split()[0]) < int(cheap.split()[0])
    assert not (tmp_path / "store" / "plan.json").exists()


def test_status_reports_the_shard_count_of_the_store_it_reads(env, tmp_path):
    """An operator shell without DFLASH_NUM_SHARDS: status and coverage by id follow the conversations manifest."""
    run_stages(tmp_path, [str(DEMO_DATA_DIR)], num_shards=7)  # the store and work dir of `env`
    env = {name: value for name, value in env.items() if name != "DFLASH_NUM_SHARDS"}
    status = json.loads(dflash(env, "status", "--json", "--by-id"))
    assert status["storage"]["shards_total"] == 7
    assert status["coverage"]["by_id"]["shards"] == 7
    assert "0/7 shards published" in dflash(env, "status")


def test_fleet_up_flags_are_the_server_options_and_unset_ones_keep_their_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("DFLASH_STORE", str(tmp_path / "store"))  # where `fleet up` registers the node
    monkeypatch.setenv("SGLANG_API_KEY", SECRET)
    launched = {}

    def launch_fleet(gpus, run_dir, options, **kwargs):
        launched.update(gpus=gpus, run_dir=run_dir, options=options, kwargs=kwargs)
        return SimpleNamespace(kind="sglang", urls=[], members=[])

    monkeypatch.setattr(launch, "launch_fleet", launch_fleet)
    flags = ["--gpus", "0,1", "--model", "/models/q", "--max-running-requests", "96", "--radix-cache"]
    assert main(["fleet", "up", *flags, "--base-port", "31000", "--load-format", "dummy"]) == 0
    assert launched["gpus"] == [0, 1] and launched["run_dir"] == tmp_path / "work" / "fleet"
    # The key comes from SGLANG_API_KEY, resolved like the fleet resource's; nothing else given keeps its default.
    expected = launch.ServerOptions(
        model_path="/models/q", max_running_requests=96, radix_cache=True, load_format="dummy"
    )
    assert launched["options"] == dataclasses.replace(expected, api_key=SECRET)
    assert launched["kwargs"] == {"base_port": 31000}


def test_fleet_up_plans_the_cap_from_gpu_memory_and_the_expected_lengths(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DFLASH_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("DFLASH_STORE", str(tmp_path / "store"))  # where `fleet up` registers the node
    launched = {}

    def launch_fleet(gpus, run_dir, options, **kwargs):
        launched.update(options=options)
        return SimpleNamespace(kind="sglang", urls=[], members=[])

    monkeypatch.setattr(launch, "launch_fleet", launch_fleet)
    monkeypatch.setattr(launch_plan, "gpu_memory", lambda gpus: launch_plan.parse_nvidia_smi("0, 143771, 143771\n"))
    assert main(["fleet", "up", "--gpus", "0"]) == 0
    # An H200 at 600 + 2,000 tokens per request: the radix cache off and 68 running (69 less the plan's margin).
    assert launched["options"].max_running_requests == 68 and not launched["options"].radix_cache
    assert "plan: cap 68 per server with `--disable-radix-cache --max-running-requests 68`" in capsys.readouterr().out
    assert main(["fleet", "up", "--gpus", "0", "--expected-output-tokens", "8000"]) == 0
    assert launched["options"].max_running_requests == 47
    # Without nvidia-smi and without a figure, the plan cannot be made: the operator is told what to pass.
    monkeypatch.setattr(launch_plan, "gpu_memory", lambda gpus: {})
    with pytest.raises(SystemExit, match="--gpu-memory-gib"):
        main(["fleet", "up", "--gpus", "0"])


def test_every_launch_logs_the_servers_cap_next_to_the_plans(env):
    h200 = ["--sim-option", "gpu_memory_gb=139.4", "--sim-option", "mem_fraction_static=0.824"]
    try:
        out = dflash(env, "fleet", "up", "--simulate", "1", *h200)
        assert "plan: cap 69 per server with `--disable-radix-cache --max-running-requests 69`" in out
        assert "cap 69 per server, bound by the configured maximum; KV pool allows 72 at the expected 2.6K" in out
    finally:
        dflash(env, "fleet", "down")
    try:  # SGLang's own sizing, asked for: 22, and what would raise it
        out = dflash(env, "fleet", "up", "--simulate", "1", *h200, "--sim-option", "max_running_requests=48")
        assert "plan: cap 22 per server with the flags given" in out
        assert "cap 22 per server, bound by mamba state slots (5 per request, radix cache on)" in out
        assert "`--disable-radix-cache --max-running-requests 69` → est. ×3.1" in out
    finally:
        dflash(env, "fleet", "down")


def test_fleet_up_listens_wider_only_when_asked_and_warns_without_a_key(env, tmp_path):
    """Servers bind 127.0.0.1 by default; `--host 0.0.0.0` without SGLANG_API_KEY is said loudly, and the registry
    publishes this host's name for them (reached from other hosts), never 0.0.0.0."""
    import socket

    from dagster_project.generation.fleet_registry import registered_nodes
    from dagster_project.store.storage import LocalStore

    keyless = {name: value for name, value in env.items() if name != "SGLANG_API_KEY"}
    command = [sys.executable, "-m", "dagster_project.cli", "fleet", "up", "--simulate", "1", "--node", "n1"]
    for host_flags, warned, advertised in (([], False, "127.0.0.1"), (["--host", "0.0.0.0"], True, socket.getfqdn())):
        try:
            up = subprocess.run(command + host_flags, env=keyless, capture_output=True, text=True, timeout=120)
            assert up.returncode == 0, up.stderr[-3000:]
            assert (
                "WARNING: the servers listen on 0.0.0.0 (beyond this host) WITHOUT an API key" in up.stderr
            ) is warned
            (record,) = registered_nodes(LocalStore(tmp_path / "store"))
            assert [server.url.split("//")[1].rsplit(":", 1)[0] for server in record.servers] == [advertised]
        finally:
            dflash(keyless, "fleet", "down", "--node", "n1")
    with_key = subprocess.run(command + ["--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert with_key.returncode == 0 and "WARNING" not in with_key.stderr, with_key.stderr[-3000:]
    finally:
        dflash(env, "fleet", "down", "--node", "n1")


def test_fleet_up_with_a_bad_store_starts_nothing_and_a_later_failure_stops_what_it_started(env, tmp_path):
    fleet_dir = tmp_path / "work" / "fleet"
    command = [sys.executable, "-m", "dagster_project.cli", "fleet", "up", "--simulate", "1"]
    bad = subprocess.run(command, env={**env, "DFLASH_STORE": "s3//bucket/x"}, capture_output=True, text=True)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("dflash fleet up: ") and "s3://" in bad.stderr
    assert launch.Fleet.load(fleet_dir) is None, "nothing was started"
    # The store works, but the node's record cannot be written (a directory stands where it goes): the servers the
    # command started are stopped, not left running unregistered.
    (tmp_path / "store" / "fleet" / "n1.json").mkdir(parents=True)
    failed = subprocess.run(command, env={**env, "DFLASH_NODE": "n1"}, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "fleet up failed: stopped the servers it started (" in failed.stderr
    started = launch.Fleet.load(fleet_dir)
    assert started is None or not started.alive(), "a server is left running"
