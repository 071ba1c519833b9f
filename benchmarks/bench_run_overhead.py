"""Fixed seconds of one shard run: what a `completions` run costs besides generating.

    python -m benchmarks.bench_run_overhead [--runs N]

Tiny shards (a few single-turn events) against one zero-latency simulator, so almost all of a run is fixed
cost. Each run is `dagster asset materialize --select completions --partition shard-N` (the asset and its
checks, as a shard run executes them), timed from process start to exit and split by the run's own event
log: process start and definitions load (to RUN_START), run setup and resources (to the step's start), each
step (the completions step split at its first log line, which comes once the tokenizer is loaded and the
shard read), and teardown (RUN_SUCCESS to exit); with the process's CPU time, which other work on the machine
disturbs less. Next to them, in fresh processes: importing the definitions, loading the tokenizer, importing
Great Expectations. With `--before DIR` (a checkout of earlier code, e.g. from `git worktree add`), the same
runs with that code, taking turns with this checkout's so both see the same load. Results go to the
`run_overhead` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from benchmarks.bench_fleet import ROOT, dagster_home, write_prompts
from benchmarks.report import write_section
from dagster_project.sglang.launch import launch_simulators, stop_fleet
from dagster_project.store import layout
from tests.support.dagster_helpers import materialize, pipeline_env

SHARDS = 8
PROMPTS = 3 * SHARDS
SIM = {"max_running_requests": 16, "output_len": "uniform:48:160"}
# What a fresh process pays for each piece, measured on its own (the import line is subtracted).
PIECES = {
    "import the definitions (process start included)": "import dagster_project.definitions",
    "load the tokenizer (transformers import included)": (
        "from dagster_project.tokenizer import load_tokenizer; load_tokenizer()"
    ),
    "import Great Expectations": "import great_expectations",
}


def with_code(env: dict[str, str], code: Path) -> dict[str, str]:
    """`env` running the package from the checkout `code` (the processes also start in it: Python and Dagster
    put the working directory first on the path)."""
    return {**env, "PYTHONPATH": os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def fresh_process_s(code: Path, line: str) -> float:
    started = time.perf_counter()
    env = with_code(dict(os.environ), code)
    subprocess.run([sys.executable, "-c", line], check=True, cwd=code, env=env, capture_output=True)
    return time.perf_counter() - started


@contextmanager
def tiny_shards(scratch: Path, shards: int, prompts: int) -> Iterator[dict[str, str]]:
    """`prompts` single-turn prompts over `shards` shards, their conversations published in a local store, one
    zero-latency simulator running: the environment of a shard run against them (`DAGSTER_HOME` its instance)."""
    fleet = launch_simulators(1, scratch / "fleet", SIM)
    try:
        source = write_prompts(scratch / "prompts.jsonl", prompts)
        env = pipeline_env(
            home=dagster_home(scratch / "home"),
            store=scratch / "store",
            work_dir=scratch / "work",
            num_shards=shards,
            endpoints=fleet.urls,
            extra={"DFLASH_SOURCES": str(source), "DFLASH_FLEET_DIR": str(scratch / "work" / "fleet")},
            without_pilot="a shard run's own overhead is measured; the pilot is a run of its own, before the job",
        )
        materialize(env, ROOT, "raw_prompts,conversations", timeout_s=1800)
        yield env
    finally:
        stop_fleet(scratch / "fleet")


def timed_run(env: dict[str, str], code: Path, home: Path, shard: int) -> dict[str, float]:
    """One shard run with the package of checkout `code`, its wall time split into phases by its event log."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    materialize(with_code(env, code), code, "completions", layout.partition_key(shard))
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs(limit=1)
        events = instance.all_logs(run.run_id)
    kinds = dg.DagsterEventType
    first: dict[str, float] = {}
    steps: dict[str, list[float]] = defaultdict(list)
    for event in events:
        kind = event.dagster_event.event_type if event.dagster_event else "LOG"
        first.setdefault(kind, event.timestamp)
        if kind in (kinds.STEP_START, kinds.STEP_SUCCESS) or (kind == "LOG" and event.step_key):
            steps[event.step_key].append(event.timestamp)
    step = steps.pop("completions")  # its start, its log lines, its success
    return {
        "process start, definitions load": first[kinds.RUN_START] - started,
        "run setup, resources": first[kinds.STEP_START] - first[kinds.RUN_START],
        "completions step (holds the pool slot): until its first log line": step[1] - step[0],
        "completions step (holds the pool slot): generate, publish": step[-1] - step[1],
        "the completions checks' steps": sum(times[-1] - times[0] for times in steps.values()),
        "teardown (RUN_SUCCESS to exit)": ended - first[kinds.RUN_SUCCESS],
        "**whole run**": ended - started,
        "**inside the pool slot**": step[-1] - step[0],
        "**CPU time of the run process (user + system)**": (after.ru_utime - before.ru_utime)
        + (after.ru_stime - before.ru_stime),
    }


def render(codes: dict[str, Path], runs: dict[str, list[dict[str, float]]], pieces: dict[str, dict[str, float]]) -> str:
    names = list(codes)
    lines = [
        "## Fixed cost of a shard run (`python -m benchmarks.bench_run_overhead`)",
        "",
        (
            f"`dagster asset materialize --select completions` on tiny shards ({PROMPTS // SHARDS} events each, one "
            f"zero-latency simulator), {len(runs[names[0]])} runs per code tree, the trees taking turns; median "
            "seconds per phase, from the run's event log. The checks of `completions` run in the same process, as in a "
            "shard run; only the `completions` step holds a `sglang_fleet` slot."
        ),
        "",
        "| phase | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for phase in runs[names[0]][0]:
        figures = (statistics.median(run[phase] for run in runs[name]) for name in names)
        lines.append(f"| {phase} | " + " | ".join(f"{figure:.2f}" for figure in figures) + " |")
    lines += [
        "",
        "Each piece alone, in a fresh process (less a bare `python -c pass`):",
        "",
        "| piece | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        *(f"| {piece} | " + " | ".join(f"{pieces[name][piece]:.2f}" for name in names) + " |" for piece in PIECES),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="shard runs to time per code tree")
    parser.add_argument("--before", type=Path, help="a checkout of earlier code to time in the same run")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    codes = {"this checkout": ROOT}
    if args.before:
        revision = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"], capture_output=True)
        codes = {f"before ({revision.stdout.decode().strip() or args.before.name})": args.before.resolve(), **codes}
    if args.runs * len(codes) > SHARDS:
        raise SystemExit(f"at most {SHARDS // len(codes)} runs per code tree")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp, tiny_shards(Path(tmp), SHARDS, PROMPTS) as env:
        shards = iter(range(SHARDS))
        for _ in range(args.runs):  # the trees take turns, so both see the same load on the machine
            for name, code in codes.items():
                runs[name].append(timed_run(env, code, Path(env["DAGSTER_HOME"]), next(shards)))
    pieces = {}
    for name, code in codes.items():
        bare = statistics.median(fresh_process_s(code, "pass") for _ in range(3))
        pieces[name] = {
            piece: statistics.median(fresh_process_s(code, line) for _ in range(3)) - bare
            for piece, line in PIECES.items()
        }
    markdown = render(codes, runs, pieces)
    print(markdown)
    if not args.no_write:
        print(f"\nwritten to {write_section('run_overhead', markdown)}")


if __name__ == "__main__":
    main()
