"""Normalize a 1,000,000-row synthetic prompt set; report rows/s and peak RSS next to a plain pyarrow read.

    python -m benchmarks.bench_ingest [--rows 1000000] [--shards 1830]

The input is a Hugging Face-style Parquet export (`id`, `messages: list<struct<role, content>>`) with
8.4% multi-turn rows, system prompts, 1% duplicates and 0.7% rows breaking a rule. Each measurement runs
in a fresh child process that reports its own peak RSS, so one measurement never inflates another:

* pyarrow `read_table` of the whole file (the in-memory baseline) and a streamed `iter_batches` +
  `to_pylist` (the floor of any row-by-row reader);
* the project's two stages on a local store: ingest (`raw_prompts`) and prepare (`conversations`:
  policy, token budget, dedup, ids, the real 1,830 shards, publish), at the full size and at a quarter
  of it, to show that memory does not grow with the row count.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORDS = [f"w{i}" for i in range(50)] + (
    "the of and to in is that for it as with was on be by this are or from at which an have not "
    "explain write compare summarize list describe why how what when where code function data model "
    "error table graph market history energy water light cell gene city river music number proof"
).split()
SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer briefly.", "You are a senior engineer."]
BATCH_ROWS = 50_000


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


def _row(rng: random.Random, index: int, recent: list[str]) -> dict:
    roll = rng.random()
    if roll < 0.01 and recent:  # a repeated prompt
        return {"id": f"row-{index}", "messages": [{"role": "user", "content": rng.choice(recent)}]}
    if roll < 0.015:
        return {"id": f"row-{index}", "messages": [{"role": "user", "content": "   "}]}
    if roll < 0.017:
        return {
            "id": f"row-{index}",
            "messages": [{"role": "user", "content": "2+2?"}, {"role": "tool", "content": "4"}],
        }
    messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.1 else []
    for _ in range(rng.randint(2, 3) if rng.random() < 0.084 else 1):
        question = f"Q{index}: {_sentence(rng, rng.randint(8, 60))}"
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": _sentence(rng, rng.randint(10, 80))},
        ]
        if len(recent) < 1000:
            recent.append(question)
    return {"id": f"row-{index}", "messages": messages}


def make_input(path: Path, rows: int, seed: int = 7) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema([("id", pa.string()), ("messages", pa.list_(message))])
    rng, recent = random.Random(seed), []
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for start in range(0, rows, BATCH_ROWS):
            batch = [_row(rng, i, recent) for i in range(start, min(start + BATCH_ROWS, rows))]
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_pyarrow_table(path: Path) -> dict:
    import pyarrow.parquet as pq

    started = time.perf_counter()
    rows = pq.read_table(path).num_rows
    return {"rows": rows, "seconds": time.perf_counter() - started, "peak_rss_mib": _peak_rss_mib()}


def child_pyarrow_rows(path: Path) -> dict:
    import pyarrow.parquet as pq

    started, rows = time.perf_counter(), 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=2048):
        rows += len(batch.to_pylist())
    return {"rows": rows, "seconds": time.perf_counter() - started, "peak_rss_mib": _peak_rss_mib()}


def child_project(path: Path, shards: int) -> dict:
    from dagster_project.conversations.stage import build_conversations
    from dagster_project.generation_settings import GenerationSettings
    from dagster_project.ingest.stage import ingest_to_store
    from dagster_project.store.storage import LocalStore
    from dagster_project.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    rss_before = psutil.Process().memory_info().rss / 2**20
    with tempfile.TemporaryDirectory() as scratch:
        store, work = LocalStore(Path(scratch) / "store"), Path(scratch) / "work"
        started = time.perf_counter()
        raw = ingest_to_store(store, [f"bench={path}"], work_dir=work)
        ingested = time.perf_counter()
        manifest = build_conversations(
            store, tokenizer=tokenizer, settings=GenerationSettings(), num_shards=shards, work_dir=work
        )
        finished = time.perf_counter()
    return {
        "rows": raw.input_rows,
        "conversations": manifest.rows,
        "quarantined_by_reason": manifest.quarantined_by_reason,
        "multi_turn": manifest.multi_turn,
        "prompts_tokenized": manifest.prompts_tokenized,
        "ingest_seconds": ingested - started,
        "prepare_seconds": finished - ingested,
        "seconds": finished - started,
        "rss_after_imports_mib": rss_before,
        "peak_rss_mib": _peak_rss_mib(),
    }


CHILDREN = {"pyarrow_table": child_pyarrow_table, "pyarrow_rows": child_pyarrow_rows, "project": child_project}


def run_child(kind: str, path: Path, shards: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks.bench_ingest",
        "--child",
        kind,
        "--input",
        str(path),
        "--shards",
        str(shards),
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(label: str, result: dict, seconds: float | None = None, rss: bool = True) -> str:
    """One table row: rows, seconds, rows/s and (optionally) peak RSS of a measured step."""
    seconds = result["seconds"] if seconds is None else seconds
    peak = f"{result['peak_rss_mib']:.0f}" if rss else ""
    return f"| {label} | {result['rows']:,} | {seconds:.1f} | {result['rows'] / seconds:,.0f} | {peak} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=1830)
    parser.add_argument("--child", choices=sorted(CHILDREN))
    parser.add_argument("--input", type=Path)
    args = parser.parse_args()
    if args.child:
        kind = CHILDREN[args.child]
        print(json.dumps(kind(args.input, args.shards) if args.child == "project" else kind(args.input)))
        return

    with tempfile.TemporaryDirectory() as scratch:
        full, quarter = Path(scratch) / "full.parquet", Path(scratch) / "quarter.parquet"
        started = time.perf_counter()
        make_input(full, args.rows)
        make_input(quarter, args.rows // 4)
        print(
            f"inputs written in {time.perf_counter() - started:.0f}s ({full.stat().st_size / 2**20:.0f} MiB)",
            file=sys.stderr,
        )
        table = run_child("pyarrow_table", full, args.shards)
        streamed = run_child("pyarrow_rows", full, args.shards)
        ours = run_child("project", full, args.shards)
        ours_quarter = run_child("project", quarter, args.shards)
        size_mib = full.stat().st_size / 2**20

    body = "\n".join(
        [
            "## Ingest: 1,000,000 synthetic prompts → conversations",
            "",
            f"Input: one Parquet file ({size_mib:.0f} MiB, zstd), Hugging Face `messages` layout, {args.rows:,} rows "
            f"({ours['multi_turn']:,} multi-turn kept, {sum(ours['quarantined_by_reason'].values()):,} quarantined: "
            f"{', '.join(f'{k} {v:,}' for k, v in ours['quarantined_by_reason'].items())}). Policy `all_turns`, "
            f"{args.shards:,} shards, local store; {ours['prompts_tokenized']:,} prompts needed the tokenizer "
            "for the budget.",
            "",
            "| what | rows | seconds | rows/s | peak RSS (MiB) |",
            "|---|---:|---:|---:|---:|",
            _row("pyarrow `read_table` (whole file in memory)", table),
            _row("pyarrow `iter_batches` + `to_pylist` (row floor)", streamed),
            _row("project: ingest (read, normalize, rules, snapshot)", ours, seconds=ours["ingest_seconds"], rss=False),
            _row(
                f"project: prepare (policy, budget, dedup, ids, {args.shards:,} shards published)",
                ours,
                seconds=ours["prepare_seconds"],
                rss=False,
            ),
            _row("**project: both stages**", ours),
            _row("project: both stages, a quarter of the rows", ours_quarter),
            "",
            f"The project's process holds {ours['rss_after_imports_mib']:.0f} MiB once transformers is imported and "
            "the tokenizer loaded, before reading any row (loading the tokenizer itself peaks near 630 MiB). Peak RSS "
            f"is {ours_quarter['peak_rss_mib']:.0f} MiB at {ours_quarter['rows']:,} rows and "
            f"{ours['peak_rss_mib']:.0f} MiB at {ours['rows']:,}: rows are streamed, shard buffers are capped at "
            "32 MiB and the dedup index is an on-disk SQLite file with a 16 MiB page cache. Four times the rows cost "
            f"{ours['peak_rss_mib'] - ours_quarter['peak_rss_mib']:.0f} MiB more peak (the SQLite cache filling is "
            "part of it; the rest is not attributed yet), while `read_table` holds "
            "the whole table.",
        ]
    )
    from benchmarks.report import write_section

    print(body)
    print(f"written to {write_section('ingest', body)}")


if __name__ == "__main__":
    main()
