"""`make demo`: the whole pipeline on the embedded demo data, through the Dagster CLI, against simulators.

Every stage runs as a real `dagster asset materialize` in the persistent instance under `.dagster_home`
(so `make dev` shows these runs in the UI), the fleet is a set of SGLang-protocol simulator processes,
and the store is a local directory. The same code path runs in production with S3 and real servers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dagster_project.ops.plan import Plan, write_plan
from dagster_project.sglang.launch import stop_fleet
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore

DEMO_SHARDS = 4
DEMO_SERVERS = 2
CONCURRENT_SHARD_RUNS = 2
SHARD_ASSETS = layout.REGENERATED_WITH[layout.COMPLETIONS]
# An example price, so the demo shows its cost figures: each simulated server stands for one H200 rented at
# $3.50 per GPU-hour (the real job: 7 GPUs at ~$27/hour).
DEMO_GPU_HOUR_PRICE = 3.50


def demo_environment(root: Path) -> dict[str, str]:
    """The demo's own settings; none of the shell's pipeline settings (a production store, say) leak in, except
    the evaluation sets prompts are checked against (read only)."""
    demo = root / ".demo"
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_", "SGLANG_", "DAGSTER_"))}
    return {
        **inherited,
        "DFLASH_EVAL_SETS": os.environ.get("DFLASH_EVAL_SETS", ""),
        "DFLASH_STORE": str(demo / "store"),
        "DFLASH_WORK_DIR": str(demo / "work"),
        "DFLASH_NUM_SHARDS": str(DEMO_SHARDS),
        "DAGSTER_HOME": str(root / ".dagster_home"),
        "DFLASH_COST_PER_GPU_HOUR": str(DEMO_GPU_HOUR_PRICE),
    }


def _dflash(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "-m", "dagster_project.cli", *args], env=env, check=True)


def _dagster() -> str:
    return str(Path(sys.executable).with_name("dagster"))  # the CLI installed beside this interpreter


def initialize_instance(env: dict[str, str]) -> None:
    """Make (or bring up to date) the databases of the instance at `env`'s DAGSTER_HOME, in this one process,
    before anything runs on it. Dagster's SQLite storage creates its schema on first use: processes that first
    use a fresh instance at once (four shard runs, or the UI and the daemon) race to stamp the schema's version,
    and every later command on it then fails ("more than one head present")."""
    result = subprocess.run([_dagster(), "instance", "migrate"], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-2000:] + result.stderr[-4000:])
        raise SystemExit(f"could not initialise the Dagster instance at {env['DAGSTER_HOME']}")


def _materialize(env: dict[str, str], select: str, partition: str | None = None) -> None:
    command = [_dagster(), "asset", "materialize", "-m", "dagster_project.definitions", "--select", select]
    if partition:
        command += ["--partition", partition]
    label = f"{select}" + (f" [{partition}]" if partition else "")
    print(f"\n=== dagster asset materialize --select {label}", flush=True)
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-4000:])
        sys.stderr.write(result.stderr[-8000:])
        raise SystemExit(f"materialization of {label} failed (exit {result.returncode})")
    print(f"    ok: {label}", flush=True)


def run_demo(root: Path) -> int:
    env = demo_environment(root)
    stop_fleet(Path(env["DFLASH_WORK_DIR"]) / "fleet")  # one left running for `make dev`, say
    shutil.rmtree(root / ".demo", ignore_errors=True)  # a fresh run every time; the Dagster history stays
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(root / "dagster.yaml", Path(env["DAGSTER_HOME"]) / "dagster.yaml")
    initialize_instance(env)  # before the shard runs use it at once
    store = LocalStore(env["DFLASH_STORE"])
    write_plan(
        store,
        Plan(
            source="demo: simulator settings of `make demo`",
            req_per_s=40.0,
            avg_output_tokens=300,
            output_tok_per_s=12000,
            gpus=DEMO_SERVERS,
            cost_per_hour=DEMO_SERVERS * DEMO_GPU_HOUR_PRICE,
        ),
    )
    _dflash(env, "fleet", "up", "--simulate", str(DEMO_SERVERS))
    try:
        _materialize(env, "raw_prompts,conversations")
        _materialize(env, "pilot")  # the shards refuse to start until a pilot of their settings has passed
        with ThreadPoolExecutor(CONCURRENT_SHARD_RUNS) as pool:  # shard runs share the fleet, as in production
            list(pool.map(lambda key: _materialize(env, SHARD_ASSETS, key), layout.partition_keys(DEMO_SHARDS)))
        _materialize(env, "run_report,mixture_report")
        print("\n" + "=" * 100 + "\nThe six operator questions (`dflash status --dagster`):\n", flush=True)
        # The command itself, as the operator runs it: it reads the same Dagster instance as the UI (`make dev`),
        # so its count of materialized shards is the UI's.
        _dflash(env, "status", "--dagster")
        print(
            f"\nTraining set: {store.url(layout.TRAINING_SET)}   exports (SpecForge JSONL, HF Parquet + card): "
            f"{store.url(layout.EXPORTS)}   mixture: the mixture_report asset, {store.url('reports/mixture.json')}"
        )
        print("Browse the runs, checks and partitions: make dev  (http://127.0.0.1:3000)")
    finally:
        _dflash(env, "fleet", "down")
    return 0
