"""Ingest (sources → 1,830 published conversation shards) next to the simple script, at 250K and 1M rows.

    python -m benchmarks.bench_ingest [--sizes 250000 1000000] [--one-file-rows 1000000] [--shards 1830] [--repeats 2]

The input is a mixed folder at the real job's shape (`ingest_inputs`: Parquet, ShareGPT JSON Lines, zstd
OpenAI JSON Lines and an Alpaca JSON array; 8.4% multi-turn, duplicates, rows breaking rules), generated here,
and a folder of one large ShareGPT JSON Lines file (as a dataset often comes).
Each measurement is a fresh process, timed from its start to its exit, as a user runs it:

* **project**: the two stages the `raw_prompts` and `conversations` assets call (`ingest_to_store`, then
  `build_conversations`) on a local store: streamed rows, the on-disk dedup index, the snapshot, every shard
  published with its manifest and checksums, the stage manifests;
* **simple**: `benchmarks/simple_ingest.py`, one pass with pyarrow + orjson, its dedup set in memory, no
  snapshot, manifests or checksums.

The runs alternate (simple, project, simple, project, ...) so that a machine shared with other work slows both
alike; the table gives the median of each. The outputs are compared shard by shard (every conversation's
record equal, in order), with the events (generated turns) and quarantine counts by reason.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

from benchmarks.ingest_inputs import FILES, MULTI_TURN_SHARE, make_inputs

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.5
ONE_FILE = (("sharegpt.jsonl", 1.0),)


def child_project(input_dir: Path, output: Path, shards: int) -> dict:
    from dagster_project.conversations.stage import build_conversations
    from dagster_project.generation_settings import GenerationSettings
    from dagster_project.ingest.stage import ingest_to_store
    from dagster_project.store.storage import LocalStore
    from dagster_project.tokenizer import load_tokenizer, tokenizer_identity

    store, work = LocalStore(output / "store"), output / "work"
    tokenizer = tokenizer_identity(load_tokenizer())  # what the asset's resource has loaded before the stage runs
    started, cpu_started = time.perf_counter(), _cpu()
    ingest_to_store(store, [str(input_dir)], work_dir=work)
    ingested, cpu_ingested = time.perf_counter(), _cpu()
    manifest = build_conversations(
        store,
        load_tokenizer=load_tokenizer,
        tokenizer=tokenizer,
        settings=GenerationSettings(),
        num_shards=shards,
        work_dir=work,
    )
    cpu_prepared = _cpu()
    return {
        "conversations": manifest.rows,
        "events": manifest.turns,
        "quarantined_by_reason": manifest.quarantined_by_reason,
        "prompts_tokenized": manifest.prompts_tokenized,
        "multi_turn": manifest.multi_turn,
        "ingest_seconds": ingested - started,
        "prepare_seconds": time.perf_counter() - ingested,
        # CPU seconds of each stage: in this process, and in the worker processes
        "ingest_cpu": [now - before for now, before in zip(cpu_ingested, cpu_started, strict=True)],
        "prepare_cpu": [now - before for now, before in zip(cpu_prepared, cpu_ingested, strict=True)],
    }


def _cpu() -> tuple[float, float]:
    """User + system seconds of this process, and of its children: those it reaped, and those still running (the
    worker processes, which the stages share and which end with this process)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    running = sum(sum(child.cpu_times()[:2]) for child in psutil.Process().children(recursive=True))
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime + running


def measure(kind: str, input_dir: Path, output: Path, shards: int) -> dict:
    """Run one measurement in a fresh process; its wall, CPU and peak RSS (from wait4) and its summary."""
    if kind == "simple":
        command = [sys.executable, "-m", "benchmarks.simple_ingest", str(input_dir), str(output), "--shards"]
    else:
        command = [sys.executable, "-m", "benchmarks.bench_ingest", "--child", str(input_dir), str(output), "--shards"]
    with tempfile.TemporaryFile() as stdout:
        started = time.perf_counter()
        process = subprocess.Popen([*command, str(shards)], cwd=ROOT, stdout=stdout, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        lines = stdout.read().decode().strip().splitlines()
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} failed (exit {process.returncode}): {' '.join(command)}")
    summary = json.loads(lines[-1])
    return {
        **summary,
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def shard_lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def outputs_equal(project: Path, simple: Path, shards: int) -> tuple[bool, str]:
    """Whether every shard holds the same conversation records in the same order; what differs first if not."""
    for shard in range(shards):
        ours = shard_lines(project / "store" / "conversations" / f"shard={shard:05d}" / "conversations.jsonl")
        theirs = shard_lines(simple / f"shard={shard:05d}.jsonl")
        if ours != theirs:
            return False, f"shard {shard}: {len(ours)} vs {len(theirs)} conversations, or records differ"
    return True, ""


def bench_size(rows: int, shards: int, repeats: int, scratch: Path, files: tuple = FILES) -> dict:
    input_dir = scratch / f"input-{rows}-{len(files)}"
    make_inputs(input_dir, rows, files=files)
    runs: dict[str, list[dict]] = {"simple": [], "project": []}
    load_before = os.getloadavg()[0]
    for repeat in range(repeats):
        for kind in ("simple", "project"):
            output = scratch / f"{kind}-{rows}-{len(files)}-{repeat}"
            runs[kind].append(measure(kind, input_dir, output, shards))
            print(f"{_label(rows, files)}, {kind}: {runs[kind][-1]['wall']:.1f} s", file=sys.stderr)
            if repeat < repeats - 1:
                shutil.rmtree(output)  # only the last outputs are compared; a 1M-row store is a gigabyte
    load_after = os.getloadavg()[0]
    last = repeats - 1
    equal, difference = outputs_equal(
        scratch / f"project-{rows}-{len(files)}-{last}", scratch / f"simple-{rows}-{len(files)}-{last}", shards
    )
    ours, theirs = runs["project"][-1], runs["simple"][-1]
    same_counts = all(ours[key] == theirs[key] for key in ("conversations", "events", "quarantined_by_reason"))
    return {
        "rows": rows,
        "label": _label(rows, files),
        "one_file": files == ONE_FILE,
        "runs": runs,
        "equal": equal and same_counts,
        "difference": difference or ("" if same_counts else "counts differ"),
        "load": (load_before, load_after),
        "input_mib": sum(path.stat().st_size for path in input_dir.iterdir()) / 2**20,
    }


def _label(rows: int, files: tuple) -> str:
    return f"{rows:,} rows" + (" in one JSON Lines file" if files == ONE_FILE else "")


def _stage(run: dict, stage: str) -> str:
    own, workers = run[f"{stage}_cpu"]
    return f"{run[f'{stage}_seconds']:.1f} / {own:.1f} + {workers:.1f}"


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def report(results: list[dict], shards: int, repeats: int) -> str:
    lines = [
        f"## Ingest: sources → {shards:,} conversation shards, next to the simple script",
        "",
        "Input (generated by `benchmarks/ingest_inputs.py`, deterministic): one folder of "
        + ", ".join(f"{name} ({share:.0%})" for name, share in FILES)
        + f"; {MULTI_TURN_SHARE:.1%} multi-turn, ~1% repeated prompts, ~0.1% reused ids, ~0.7% rows breaking a "
        "rule; and a folder of one sharegpt.jsonl with the same kind of rows. **project**: the `raw_prompts` and "
        "`conversations` stages in one process (streamed rows, on-disk "
        "dedup index, snapshot, every shard published with its manifest and checksums, stage manifests; policy "
        "`all_turns`). **simple**: `benchmarks/simple_ingest.py` (pyarrow + orjson, one pass, dedup set in memory, "
        "no snapshot or manifests). Each run is a fresh process timed from start to exit; CPU is user + system "
        f"of that process; the runs alternate simple / project, {repeats} of each per size, medians shown.",
        "",
        "| input | project wall (s) | simple wall (s) | **wall ratio** | project CPU (s) | simple CPU (s) | CPU ratio "
        "| peak RSS project / simple (MiB) | outputs equal |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        ours, theirs = result["runs"]["project"], result["runs"]["simple"]
        wall, simple_wall = _median(ours, "wall"), _median(theirs, "wall")
        cpu, simple_cpu = _median(ours, "cpu"), _median(theirs, "cpu")
        lines.append(
            f"| {result['label']} | {wall:.1f} | {simple_wall:.1f} | **{wall / simple_wall:.2f}×** | {cpu:.1f} | "
            f"{simple_cpu:.1f} | {cpu / simple_cpu:.2f}× | {_median(ours, 'peak_rss_mib'):.0f} / "
            f"{_median(theirs, 'peak_rss_mib'):.0f} | "
            + ("yes" if result["equal"] else f"**no**: {result['difference']}")
            + " |"
        )
    lines += ["", "Every run, in the order it ran (wall s / CPU s):", ""]
    for result in results:
        runs = result["runs"]
        order = [
            f"{kind} {run['wall']:.1f}/{run['cpu']:.1f}"
            for pair in zip(runs["simple"], runs["project"], strict=True)
            for kind, run in zip(("simple", "project"), pair, strict=True)
        ]
        ours = runs["project"][-1]
        reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(ours["quarantined_by_reason"].items()))
        lines.append(
            f"* {result['label']} ({result['input_mib']:.0f} MiB of input; load average "
            f"{result['load'][0]:.1f} → {result['load'][1]:.1f} on this shared machine): {', '.join(order)}. "
            f"Both: {ours['conversations']:,} conversations, {ours['events']:,} events, quarantined {reasons}. "
            f"Project stages (last run), wall s / CPU s in the stage's process + in its workers: ingest "
            f"{_stage(ours, 'ingest')}, prepare {_stage(ours, 'prepare')}; {ours['prompts_tokenized']:,} prompts "
            "needed the tokenizer."
        )
    mixed = [r for r in results if not r["one_file"]]
    worst = max(_median(r["runs"]["project"], "wall") / _median(r["runs"]["simple"], "wall") for r in mixed)
    verdict = "within" if worst <= TARGET_RATIO else "**not** within"
    lines += [
        "",
        f"Worst wall ratio over the mixed folders {worst:.2f}×: {verdict} the {TARGET_RATIO}× target. What the "
        "project pays beyond the simple script: the snapshot between the two stages (each row written as JSON, "
        "compressed at zstd level 1, read back and parsed again: so a change of multi-turn policy never re-reads "
        "the sources), the dedup index on disk (sorted runs of 64-bit keys, searched and written once per block of "
        "4 MiB of rows), and per shard a checksum, an object and a manifest (1,830 of each; a shard's file is moved"
        " into the local store, not copied; made durable once per phase, the files then the manifests, not an fsync"
        " each). The project reads the source files (a large file in ranges) in two worker processes; the "
        "conversations stage drafts the snapshot's rows in the same two (started once, for both stages) while it "
        "decides duplicates and ids in order, and then publishes the shards in them (CPU above counts them all: "
        "wait4 includes the children a process reaped). So on two cores its wall time is about half its CPU time "
        "only when nothing else runs; at a load average near 1 it is closer to its CPU time, and the ratio to the "
        "one-process script nears the CPU ratio. The tokenizer is loaded only when a prompt's byte bound comes "
        "near the token budget; none does here.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000])
    parser.add_argument("--one-file-rows", type=int, default=1_000_000, help="rows of the one-file folder; 0: none")
    parser.add_argument("--shards", type=int, default=1830)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", nargs=2, type=Path, metavar=("INPUT", "OUTPUT"))
    args = parser.parse_args()
    if args.child:
        summary = child_project(*args.child, args.shards)
        print(json.dumps(summary | {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return
    with tempfile.TemporaryDirectory(prefix="bench_ingest-") as scratch:
        results = [bench_size(rows, args.shards, args.repeats, Path(scratch)) for rows in args.sizes]
        if args.one_file_rows:
            results.append(bench_size(args.one_file_rows, args.shards, args.repeats, Path(scratch), ONE_FILE))
    body = report(results, args.shards, args.repeats)
    from benchmarks.report import write_section

    print(body)
    print(f"written to {write_section('ingest', body)}")


if __name__ == "__main__":
    main()
