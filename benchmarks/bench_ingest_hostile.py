"""Peak memory of both prompt stages over hostile files, next to the same runs without them.

    python -m benchmarks.bench_ingest_hostile [--rows 10000] [--bomb-mib 1024] [--line-mib 30] [--repeats 1]

The clean folder is `ingest_inputs` at `--rows` rows (Parquet, ShareGPT, zstd OpenAI, an Alpaca array); none of
its prompts comes near the token budget, so that run never loads the tokenizer (about 380 MiB). The second folder
adds one ordinary prompt over the budget (20,000 words), which loads it, as most real datasets do. The hostile
folder is the clean files plus:

* `bomb.jsonl.gz`: a gzip bomb, one line of `--bomb-mib` MiB inflating from about a thousandth of that;
* `long_line.jsonl`: one prompt of `--line-mib` MB (about 4 M tokens; under `max_line_bytes`, so it reaches
  the token budget, which must refuse it without tokenizing it whole);
* `turns.jsonl`: one conversation of 5,000 turns;
* `cut.jsonl.gz`: 2,000 rows, cut at two thirds of its bytes;
* `deep.jsonl`: a line nested 10,000 deep, between two normal rows.

Each run is a fresh process (`bench_ingest --child`: `ingest_to_store`, then `build_conversations` with the
default token budget) on a local store; its peak RSS comes from `wait4`, the largest of the process and the
worker processes it reaped. The runs alternate clean / hostile.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_ingest import measure
from benchmarks.ingest_inputs import make_inputs

SHARDS = 16
PEAK_GOAL_MIB = 1536
PEAK_GOAL_RATIO = 2.0


def _line(index: int) -> bytes:
    return json.dumps({"id": f"h{index}", "prompt": f"Hostile folder's normal row {index}: why?"}).encode() + b"\n"


def make_hostile(folder: Path, bomb_mib: int, line_mib: int) -> None:
    """The hostile files, beside the clean ones already in `folder`."""
    with gzip.open(folder / "bomb.jsonl.gz", "wb", compresslevel=9) as bomb:
        bomb.write(_line(0) + b'{"prompt": "')
        block = b"a" * (1 << 20)
        for _ in range(bomb_mib):
            bomb.write(block)
        bomb.write(b'"}\n' + _line(2))
    with open(folder / "long_line.jsonl", "wb") as handle:
        words = b"why " * (line_mib * 250_000)
        handle.write(b'{"id": "long", "prompt": "' + words + b'"}\n' + _line(1))
    turns = []
    for turn in range(5_000):
        turns += [{"role": "user", "content": f"Turn {turn}: and then?"}, {"role": "assistant", "content": "More."}]
    (folder / "turns.jsonl").write_text(json.dumps({"id": "turns", "messages": turns}) + "\n")
    cut = gzip.compress(b"".join(_line(index) for index in range(2_000)))
    (folder / "cut.jsonl.gz").write_bytes(cut[: len(cut) * 2 // 3])
    (folder / "deep.jsonl").write_bytes(_line(0) + b'{"prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}\n" + _line(2))


def make_over_budget(folder: Path) -> None:
    (folder / "over_budget.jsonl").write_bytes(json.dumps({"id": "over", "prompt": "why " * 20_000}).encode() + b"\n")


def report(runs: dict[str, list[dict]], args: argparse.Namespace, sizes: dict[str, float]) -> str:
    def median(kind: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[kind])

    clean, loaded = median("clean", "peak_rss_mib"), median("clean + tokenizer", "peak_rss_mib")
    hostile = median("hostile", "peak_rss_mib")
    within = hostile <= PEAK_GOAL_MIB and hostile <= PEAK_GOAL_RATIO * loaded
    last = runs["hostile"][-1]
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(last["quarantined_by_reason"].items()))
    lines = [
        "## Ingest over hostile files: peak memory, next to the same run without them",
        "",
        f"Clean: `ingest_inputs` at {args.rows:,} rows ({sizes['clean']:.1f} MiB); no prompt near the token budget, so "
        "the tokenizer is never loaded. Clean + tokenizer: the same plus one ordinary prompt of 20,000 words, over "
        "the budget, which loads it (as most real datasets do). Hostile: the clean files plus a gzip bomb "
        f"({sizes['bomb']:.1f} MiB inflating to one line of {args.bomb_mib:,} MiB), one prompt of {args.line_mib} MB "
        "on one line (under `max_line_bytes`, 32 MiB: it reaches the token budget), a conversation of 5,000 turns, "
        "a `.gz` of 2,000 rows cut at two thirds, and a line nested 10,000 deep. Each run: `raw_prompts` then "
        f"`conversations` ({SHARDS} shards, default budget of 16,384 prompt tokens) in a fresh process; peak RSS is "
        "`wait4`'s, the largest of the process and its worker processes; runs alternate, medians of "
        f"{args.repeats}.",
        "",
        "| input | wall (s) | peak RSS (MiB) | conversations | quarantined |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in runs:
        run = runs[kind][-1]
        lines.append(
            f"| {kind} | {median(kind, 'wall'):.1f} | {median(kind, 'peak_rss_mib'):.0f} | "
            f"{run['conversations']:,} | {sum(run['quarantined_by_reason'].values()):,} |"
        )
    lines += [
        "",
        f"Hostile run's quarantine by reason: {reasons}. Peak {hostile:.0f} MiB: "
        f"{'within' if hostile <= PEAK_GOAL_MIB else '**over**'} the {PEAK_GOAL_MIB:,} MiB goal. Against the "
        f"{PEAK_GOAL_RATIO:.0f}× goal: {hostile / loaded:.2f}× the clean run that loads the tokenizer "
        f"({loaded:.0f} MiB; {'within' if within else '**not** within'}), {hostile / clean:.2f}× the clean run that "
        f"never loads it ({clean:.0f} MiB; {'within' if hostile <= PEAK_GOAL_RATIO * clean else '**not** within'}): "
        f"the tokenizer ({loaded - clean:.0f} MiB here) is loaded by the first prompt whose byte bound passes the "
        "budget, an ordinary long prompt as much as a hostile one, so the first ratio is the cost of the hostile "
        "files. Before these bounds (issue #43, item 5) the cut `.gz` or the deep line stopped the whole ingest, the "
        "bomb's line was read whole (4 GB for a 6 GiB line), and the long prompt was tokenized whole (4.8 GB peak); "
        "now the bomb's line is skipped in 1 MiB pieces (`line_too_long`), and the long prompt is refused on a lower "
        "bound of its tokens (`too_long`: its rendered bytes over the vocabulary's longest token), read "
        "and rendered but never tokenized.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--bomb-mib", type=int, default=1024)
    parser.add_argument("--line-mib", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_ingest_hostile-") as scratch:
        folders = {kind: Path(scratch) / kind.replace(" + ", "_") for kind in ("clean", "clean + tokenizer", "hostile")}
        for folder in folders.values():
            make_inputs(folder, args.rows)
        make_over_budget(folders["clean + tokenizer"])
        make_hostile(folders["hostile"], args.bomb_mib, args.line_mib)
        sizes = {
            "clean": sum(path.stat().st_size for path in folders["clean"].iterdir()) / 2**20,
            "bomb": (folders["hostile"] / "bomb.jsonl.gz").stat().st_size / 2**20,
        }
        runs: dict[str, list[dict]] = {kind: [] for kind in folders}
        for repeat in range(args.repeats):
            for kind, folder in folders.items():
                runs[kind].append(measure("project", folder, Path(scratch) / f"{folder.name}-{repeat}", SHARDS))
                print(
                    f"{kind}: {runs[kind][-1]['wall']:.1f} s, {runs[kind][-1]['peak_rss_mib']:.0f} MiB", file=sys.stderr
                )
    body = report(runs, args, sizes)
    from benchmarks.report import write_section

    print(body)
    print(f"written to {write_section('ingest_hostile', body)}")


if __name__ == "__main__":
    main()
