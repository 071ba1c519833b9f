"""CPU per shard against shards per run: the curve `DFLASH_SHARDS_PER_RUN` (the backfill policy's N) is chosen from.

    python -m benchmarks.bench_shards_per_run [--runs R] [--curve 1,2,4,8,16] [--before DIR]

Each point is one run of `shard_job` (generate, gate, assemble, gate, export: what a backfill runs) over N tiny
shards (a few single-turn events each, one zero-latency simulator, so the run's cost is Dagster's, the
imports', the tokenizer's and the per-shard work's, not generation), launched as the backfill daemon launches
it: `dagster job execute` tagged with the partition (N = 1) or the partition range (N > 1). Measured per run:
the run process's CPU time (user + system), wall time, the run's event-log rows; divided by N per shard. With
`--before DIR` (a checkout of earlier code), that code's run of one shard, the only shape it had, taking turns
with this checkout's runs. Retry granularity: a failed shard stops its run, the shards before it stay
materialized, and the run's retry redoes them (CPU only: their journals hold every answer), at most N - 1.
Results go to the `shards_per_run` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import dagster as dg

from benchmarks.bench_fleet import ROOT
from benchmarks.bench_run_overhead import tiny_shards, with_code
from benchmarks.report import write_section
from dagster_project.store import layout
from tests.support.dagster_helpers import DAGSTER, DEFS_MODULE, run_cli

EVENTS_PER_SHARD = 10  # enough that no shard comes out empty (an empty shard fails its training gates)


def range_tags(first: int, count: int) -> dict[str, str]:
    """The tags the backfill daemon gives a run of shards first..first+count-1."""
    if count == 1:
        return {"dagster/partition": layout.partition_key(first)}
    return {
        "dagster/asset_partition_range_start": layout.partition_key(first),
        "dagster/asset_partition_range_end": layout.partition_key(first + count - 1),
    }


def timed_run(env: dict[str, str], code: Path, home: Path, first: int, count: int) -> dict[str, float]:
    command = [DAGSTER, "job", "execute", "-m", DEFS_MODULE, "-j", "shard_job"]
    command += ["--tags", json.dumps(range_tags(first, count))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run_cli(command, env=with_code(env, code), cwd=code, timeout_s=1800)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs(limit=1)
        assert run.status == dg.DagsterRunStatus.SUCCESS, run.run_id
        rows = len(instance.all_logs(run.run_id))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall, "rows": rows}


def render(points: dict[str, list[dict[str, float]]], shards: dict[str, int], runs: int) -> str:
    base = statistics.median(p["cpu_s"] for p in points[next(iter(points))]) / shards[next(iter(points))]
    lines = [
        "## Shards per run: CPU per shard against the backfill policy's N "
        "(`python -m benchmarks.bench_shards_per_run`)",
        "",
        f"One `shard_job` run (generate, gate, assemble, gate, export) over N tiny shards ({EVENTS_PER_SHARD} events "
        "each, one zero-latency simulator), tagged as the backfill daemon tags it (a partition for N = 1, a "
        f"partition range above); median of {runs} runs per row. CPU = the run process's user + system time. "
        "Retry granularity: the shards a failed run's retry processes again (CPU only, their journals hold every "
        "answer), at most N - 1.",
        "",
        "| run | shards | CPU per run (s) | **CPU per shard (s)** | vs one run per shard | wall per run (s) "
        "| event-log rows per shard | redone on a retry, at most |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, measured in points.items():
        n = shards[name]
        cpu = statistics.median(p["cpu_s"] for p in measured)
        wall = statistics.median(p["wall_s"] for p in measured)
        rows = statistics.median(p["rows"] for p in measured)
        lines.append(
            f"| {name} | {n} | {cpu:.2f} | **{cpu / n:.2f}** | {cpu / n / base:.2f}x | {wall:.1f} | {rows / n:.0f} "
            f"| {n - 1} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per point")
    parser.add_argument("--curve", default="1,2,4,8,16", help="shards per run, comma-separated")
    parser.add_argument("--before", type=Path, help="a checkout of earlier code: its one-shard run, for comparison")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    curve = [int(n) for n in args.curve.split(",")]
    plan: list[tuple[str, Path, int]] = []
    if args.before:
        revision = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"], capture_output=True)
        plan.append((f"before ({revision.stdout.decode().strip()}): one run per shard", args.before.resolve(), 1))
    plan += [(f"this checkout, N = {n}", ROOT, n) for n in curve]
    num_shards = args.runs * sum(n for _, _, n in plan)
    points: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in plan}
    prompts = EVENTS_PER_SHARD * num_shards
    with (
        tempfile.TemporaryDirectory(prefix="bench-shards-per-run-") as tmp,
        tiny_shards(Path(tmp), num_shards, prompts) as env,
    ):
        first = 0
        for _ in range(args.runs):  # the points take turns, so all see the same load on the machine
            for name, code, n in plan:
                points[name].append(timed_run(env, code, Path(env["DAGSTER_HOME"]), first, n))
                first += n
    markdown = render(points, {name: n for name, _, n in plan}, args.runs)
    print(markdown)
    if not args.no_write:
        print(f"\nwritten to {write_section('shards_per_run', markdown)}")


if __name__ == "__main__":
    main()
