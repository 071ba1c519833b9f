"""Fixed seconds of one shard run: what a `completions` run costs besides generating.

    python -m benchmarks.bench_run_overhead [--runs N]

Tiny shards (a few single-turn events) against one zero-latency simulator, so almost all of a run is fixed
cost. Each run is `dagster asset materialize --select completions --partition shard-N` (the asset and its
checks, as a shard run executes them), timed from process start to exit and split by the run's own event
log: process start and definitions load (to RUN_START), run setup and resources (to the step's start), each
step (the completions step split at its first log line, which comes once the tokenizer is loaded and the
shard read), and teardown (RUN_SUCCESS to exit). Next to them, in fresh processes: importing the definitions,
loading the tokenizer, importing Great Expectations. Results go to the `run_overhead` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
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


def fresh_process_s(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
    return time.perf_counter() - started


def timed_run(env: dict[str, str], home: Path, shard: int) -> dict[str, float]:
    """One shard run's wall time split into phases by its event log."""
    started = time.time()
    materialize(env, ROOT, "completions", layout.partition_key(shard))
    ended = time.time()
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
    phases = {
        "process start, definitions load": first[kinds.RUN_START] - started,
        "run setup, resources": first[kinds.STEP_START] - first[kinds.RUN_START],
    }
    for step, times in steps.items():
        name = step.replace("__", " ")
        if step == "completions":
            first_log = times[1]  # times: the step's start, its log lines, its success
            phases["completions step: until its first log line (tokenizer, shard read)"] = first_log - times[0]
            phases["completions step: the rest (generate, publish)"] = times[-1] - first_log
        else:
            phases[f"step {name}"] = times[-1] - times[0]
    phases["teardown (RUN_SUCCESS to exit)"] = ended - first[kinds.RUN_SUCCESS]
    phases["whole run"] = ended - started
    return phases


def render(runs: list[dict[str, float]], pieces: dict[str, float], baseline_s: float) -> str:
    lines = [
        "## Fixed cost of a shard run (`python -m benchmarks.bench_run_overhead`)",
        "",
        (
            f"`dagster asset materialize --select completions` on tiny shards ({PROMPTS // SHARDS} events each, one "
            f"zero-latency simulator), {len(runs)} runs one after another; median seconds per phase, from the run's "
            "event log. The checks of `completions` run in the same process, as in a shard run."
        ),
        "",
        "| phase | seconds (median) |",
        "|---|---:|",
    ]
    for phase in runs[0]:
        figure = statistics.median(run[phase] for run in runs)
        lines.append(f"| {'**' + phase + '**' if phase == 'whole run' else phase} | {figure:.2f} |")
    lines += [
        "",
        f"Each piece alone, in a fresh process (less `python -c pass`, {baseline_s:.2f} s):",
        "",
        "| piece | seconds |",
        "|---|---:|",
        *(f"| {name} | {seconds - baseline_s:.2f} |" for name, seconds in pieces.items()),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="shard runs to time (at most the shard count)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        scratch = Path(tmp)
        home = dagster_home(scratch / "home")
        fleet = launch_simulators(1, scratch / "fleet", SIM)
        try:
            source = write_prompts(scratch / "prompts.jsonl", PROMPTS)
            env = pipeline_env(
                home=home,
                store=scratch / "store",
                work_dir=scratch / "work",
                num_shards=SHARDS,
                endpoints=fleet.urls,
                extra={"DFLASH_SOURCES": str(source), "DFLASH_FLEET_DIR": str(scratch / "work" / "fleet")},
            )
            materialize(env, ROOT, "raw_prompts,conversations")
            runs = [timed_run(env, home, shard) for shard in range(min(args.runs, SHARDS))]
        finally:
            stop_fleet(scratch / "fleet")
    baseline_s = statistics.median(fresh_process_s("pass") for _ in range(3))
    pieces = {name: statistics.median(fresh_process_s(code) for _ in range(3)) for name, code in PIECES.items()}
    markdown = render(runs, pieces, baseline_s)
    print(markdown)
    if not args.no_write:
        print(f"\nwritten to {write_section('run_overhead', markdown)}")


if __name__ == "__main__":
    main()
