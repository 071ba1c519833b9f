"""Benchmark: assemble a synthetic completions shard set at the real run's per-shard scale.

    python -m benchmarks.bench_training_set [--shards 12] [--rows 500] [--output-tokens 2400]

Each shard has `--rows` generation events (the real run: 500 conversations per shard, ~2,400 output tokens
each, thinking on). Every stage runs in a fresh process so its peak RSS is its own:

* **baseline** — plain pyarrow: read every completions file's `prompt_ids` and `output_ids` and concatenate
  the tables: the cost of merely loading the same tokens;
* **assemble** — `assemble_shard` per shard: stream, join, write zstd Parquet, publish with a manifest;
* **gates** — the row-level gates and the identity check against the completions, per shard;
* **Great Expectations suite** — the GX 1.x suite per shard;
* **export** — the SpecForge JSONL per shard.

Writes its section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.report import write_section
from dagster_project.generation.shards import CompletionsShardManifest, completions_manifest
from dagster_project.records import COMPLETION_SCHEMA
from dagster_project.store.manifest import ids_digest, iter_parquet_batches, publish_shard, verify_shard
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import load_tokenizer, special_ids
from dagster_project.training import gates, row_gates
from dagster_project.training.export import export_shard, record_verdict
from dagster_project.training.shards import iter_training_batches, training_manifest
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from dagster_project.training.suite import FRAME_COLUMNS, training_frame, validate_training_frame

REAL_RUN_TOKENS = 913_786 * (400 + 2_400)  # prompts × (prompt + output tokens), the brief's figures
BASE_VOCABULARY = 248_044
THINK_END, DOUBLE_NEWLINE, IM_END = 248_069, 271, 248_046


def _lists(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))


def synthetic_completions(rng: np.random.Generator, shard: int, rows: int, output_tokens: int) -> pa.Table:
    """Thinking-shaped outputs (reasoning, `</think>`, "\\n\\n", answer, `<|im_end|>`) over the real vocabulary."""
    prompt_len = np.clip(rng.lognormal(np.log(400), 0.6, rows), 32, 8_000).astype(np.int64)
    output_len = np.clip(rng.normal(output_tokens, output_tokens / 3, rows), 64, 32_768).astype(np.int64)
    prompt_values = rng.integers(0, BASE_VOCABULARY, int(prompt_len.sum()), dtype=np.int32)
    output_values = rng.integers(0, BASE_VOCABULARY, int(output_len.sum()), dtype=np.int32)
    ends = np.cumsum(output_len)
    think_at = ends - output_len + (output_len * 0.85).astype(np.int64)
    output_values[think_at], output_values[think_at + 1], output_values[ends - 1] = THINK_END, DOUBLE_NEWLINE, IM_END
    events = [f"bench-{shard}-{i}#turn0" for i in range(rows)]
    columns = {
        "event_id": pa.array(events),
        "conversation_id": pa.array([event.split("#")[0] for event in events]),
        "turn_index": pa.array(np.zeros(rows, np.int32)),
        "shard": pa.array(np.full(rows, shard, np.int32)),
        "status": pa.array(["ok"] * rows),
        "prompt_ids": _lists(prompt_len, prompt_values),
        "output_ids": _lists(output_len, output_values),
        "finish_reason": pa.array(["stop"] * rows),
        "prompt_tokens": pa.array(prompt_len.astype(np.int32)),
        "completion_tokens": pa.array(output_len.astype(np.int32)),
    }
    return pa.table([columns.get(f.name, pa.nulls(rows, f.type)) for f in COMPLETION_SCHEMA], schema=COMPLETION_SCHEMA)


def publish_synthetic_shards(store: LocalStore, shards: int, rows: int, output_tokens: int) -> int:
    rng = np.random.default_rng(0)
    tokens = 0
    with tempfile.TemporaryDirectory() as staging:
        for shard in range(shards):
            table = synthetic_completions(rng, shard, rows, output_tokens)
            path = Path(staging) / "completions.parquet"
            pq.write_table(table, path, compression="zstd", row_group_size=256)
            manifest = CompletionsShardManifest(
                shard=shard,
                rows=rows,
                ids_digest=ids_digest(table.column("event_id").to_pylist()),
                settings_fingerprint="bench",
            )
            publish_shard(store, manifest, [("completions.parquet", path)])
            tokens += int(np.sum(table.column("prompt_tokens"))) + int(np.sum(table.column("completion_tokens")))
    return tokens


# ---- stages, each run in its own process ----------------------------------------------------------


def _baseline(root: str, shards: int) -> int:
    store = LocalStore(root)
    tables = [
        pq.read_table(store.root / key, columns=["prompt_ids", "output_ids"])
        for shard in range(shards)
        for key in completions_manifest(store, shard).data_keys
    ]
    combined = pa.concat_tables(tables)
    return sum(len(chunk.values) for name in ("prompt_ids", "output_ids") for chunk in combined.column(name).chunks)


def _assemble(root: str, shards: int) -> int:
    store = LocalStore(root)
    return sum(
        assemble_shard(store, shard, AssemblyOptions(), Path(root) / "staging").tokens for shard in range(shards)
    )


def _gates(root: str, shards: int) -> int:
    tok = load_tokenizer()
    special = special_ids(tok)
    store = LocalStore(root)
    tokens = 0
    for shard in range(shards):
        profile = gates.profile_training_batches(
            iter_training_batches(store, shard, gates.TRAINING_GATE_COLUMNS), special, tok.decode
        )
        results = gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True)
        completions = completions_manifest(store, shard)
        batches = iter_parquet_batches(store, completions, ["event_id", "prompt_ids", "output_ids"])
        results.append(row_gates.ids_match_completions(profile.digests, batches))
        manifest = training_manifest(store, shard)
        record_verdict(store, manifest, "gates", {r.name: r.message for r in results if not r.passed})
        tokens += manifest.tokens
    return tokens


def _gx_suite(root: str, shards: int) -> int:
    store = LocalStore(root)
    tokens = 0
    for shard in range(shards):
        manifest = training_manifest(store, shard)
        frame = training_frame(iter_training_batches(store, shard, FRAME_COLUMNS))
        outcome = validate_training_frame(
            frame, shard=shard, rows=manifest.rows, max_length=None, finish_reasons=["stop"]
        )
        record_verdict(store, manifest, "gx_suite", {} if outcome.success else {"gx_suite": outcome.message})
        tokens += manifest.tokens
    return tokens


def _verify(root: str, shards: int) -> int:
    """What integrity on read adds to each read of a shard: size and SHA-256 of its objects against the manifest."""
    store = LocalStore(root)
    tokens = 0
    for shard in range(shards):
        assert verify_shard(store, completions_manifest(store, shard)) == []
        manifest = training_manifest(store, shard)
        assert verify_shard(store, manifest) == []
        tokens += manifest.tokens
    return tokens


def _export(root: str, shards: int) -> int:
    store = LocalStore(root)
    return sum(export_shard(store, shard, Path(root) / "staging").tokens for shard in range(shards))


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measured(stage: Callable[[str, int], int], root: str, shards: int) -> tuple[int, float, float]:
    if stage is _gates:
        load_tokenizer()  # loading the tokenizer is not the gates' cost (its memory still counts)
    if stage is _gx_suite:
        import great_expectations  # noqa: F401  (seconds of import, once per process: not the suite's cost)
    # Reset the kernel's peak-RSS mark (VmHWM), so the peak read afterwards is the work's, not the imports'.
    Path("/proc/self/clear_refs").write_text("5")
    start = time.perf_counter()
    tokens = stage(root, shards)
    return tokens, time.perf_counter() - start, _status_mib("VmHWM")


def run_stage(stage: Callable[[str, int], int], root: str, shards: int) -> tuple[int, float, float]:
    """(tokens, seconds, peak RSS MiB) of `stage` over the first `shards` shards, in a fresh process."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_measured, stage, root, shards).result()


ASSEMBLE = "assemble (`assemble_shard`: verify, read, join, zstd Parquet, publish)"
VERIFY = "verify on read (`verify_shard`: SHA-256 of the completions and training objects)"
STAGES = {
    "baseline: pyarrow read + concat of the completions": _baseline,
    ASSEMBLE: _assemble,
    VERIFY: _verify,
    "gates (row-level gates + ids vs completions)": _gates,
    "Great Expectations suite": _gx_suite,
    "export (SpecForge JSONL)": _export,
}


@dataclass
class StageFigures:
    tokens: int
    seconds: float
    peak_mib: float
    one_shard_peak_mib: float

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def report(args: argparse.Namespace, tokens: int, figures: dict[str, StageFigures], sizes: dict[str, int]) -> str:
    rows = "\n".join(
        f"| {name} | {f.tokens:,} | {f.seconds:.2f} | {f.seconds / args.shards:.2f} | {f.rate / 1e6:.1f}M "
        f"| {f.one_shard_peak_mib:.0f} | {f.peak_mib:.0f} |"
        for name, f in figures.items()
    )
    command = f"python -m benchmarks.bench_training_set --shards {args.shards} --rows {args.rows}"
    verify_per_shard = figures[VERIFY].seconds / args.shards
    verify_share = figures[VERIFY].seconds / figures[ASSEMBLE].seconds
    return f"""## training_set: assembly, gates and export

`{command} --output-tokens {args.output_tokens}`: {args.shards} synthetic completions shards of {args.rows}
events each (prompts ~400 tokens, outputs ~{args.output_tokens} tokens with `</think>` at 85% and
`<|im_end|>` last, ids uniform over the Qwen3.6 vocabulary), {tokens:,} tokens in all. Each stage runs in
a fresh process, once over the first shard and once over all of them; peak RSS is that process's during
the work (Linux VmHWM, reset just before), imports and, for the gates, the tokenizer included.

| stage | tokens | seconds | s / shard | tokens/s | peak RSS, 1 shard (MiB) | peak RSS, {args.shards} shards (MiB) |
|---|---:|---:|---:|---:|---:|---:|
{rows}

* Sizes: completions {sizes["completions"] / 2**20:.0f} MiB, training Parquet {sizes["training_set"] / 2**20:.0f} MiB,
  SpecForge JSONL {sizes["exports"] / 2**20:.0f} MiB (uniform random ids compress less than real BPE streams).
* The baseline holds every shard in memory at once, so its peak grows with the shard count; assembly,
  gates and export stream one row group at a time, so theirs stays near the one-shard figure. The gates'
  peak is mostly the tokenizer (248K-token vocabulary), which they need to decode answers; the GX
  suite's, Great Expectations itself (it reads per-row figures, never the token lists).
* Every stage checks each object it reads against its manifest first (size and SHA-256 of the whole object,
  even when it reads some columns): {verify_per_shard:.3f} s per shard for both stages' objects,
  {verify_share:.0%} of the assembly's time. (On S3, a read of some columns checks size and ETag by one HEAD
  instead: hashing would need the whole object downloaded.)
* At the assembly rate, the real run's ~{REAL_RUN_TOKENS / 1e9:.1f}B tokens (913,786 events × ~2,800
  tokens) take ~{REAL_RUN_TOKENS / figures[ASSEMBLE].rate / 60:.0f} min in one process; shard runs parallelise it.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--rows", type=int, default=500, help="generation events per shard")
    parser.add_argument("--output-tokens", type=int, default=2400, help="mean output tokens per event")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-training-") as root:
        store = LocalStore(root)
        tokens = publish_synthetic_shards(store, args.shards, args.rows, args.output_tokens)
        figures = {}
        for name, stage in STAGES.items():
            _, _, one_shard_peak = run_stage(stage, root, 1)
            figures[name] = StageFigures(*run_stage(stage, root, args.shards), one_shard_peak)
            print(f"{name}: {figures[name].rate / 1e6:.1f}M tokens/s", flush=True)
        sizes = {
            prefix: sum(o.size for o in store.list(prefix + "/"))
            for prefix in ("completions", "training_set", "exports")
        }
    print(write_section("training_set", report(args, tokens, figures, sizes)))


if __name__ == "__main__":
    main()
