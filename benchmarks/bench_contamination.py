"""Contamination scan of 1,000,000 synthetic prompts against MT-Bench, HumanEval and GSM8K: the project's
vectorized scan next to the plain Python one (a dict of word n-gram tuples, probed prompt by prompt).

    python -m benchmarks.bench_contamination [--prompts 1000000] [--eval-files FILE ...]

Prompts are made batch by batch from a fixed seed (the same ones in every child): 8 to 80 words drawn from
the evaluation texts' own vocabulary and common English words, so most windows consist of known words and
reach the hash lookup; one prompt in 1,000 holds an evaluation text reworded in case and whitespace. Each
method runs in a fresh child process that reports its own peak RSS; a third child only makes the prompts,
so what a scanner adds is the difference. Both scanners must flag the same prompts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.report import write_section

EVAL_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval_sets"
EVAL_FILES = [
    str(EVAL_DIR / name) for name in ("mt_bench/question.jsonl", "humaneval/HumanEval.jsonl.gz", "gsm8k/test.jsonl")
]
BATCH = 16_384
COMMON = (
    "the of and to in is that for it as with was on be by this are or from at which an have not explain write "
    "compare summarize list describe why how what when where code function data model error table graph market"
).split()


def batches(prompts: int, eval_texts: list, planted: list[str] | None = None) -> Iterator[list[str]]:
    """The prompts, a batch at a time; the evaluation texts planted in them are appended to `planted`."""
    from dagster_project.conversations.contamination import python_words

    vocabulary = sorted({word for text in eval_texts for word in python_words(text.text)}) + COMMON
    for first in range(0, prompts, BATCH):
        rng = random.Random(first)
        batch = []
        for index in range(first, min(first + BATCH, prompts)):
            if index % 1000 == 999:
                text = eval_texts[rng.randrange(len(eval_texts))].text
                if planted is not None:
                    planted.append(text)
                batch.append("Please answer:  " + "  ".join(w.upper() for w in text.split()) + "\nThanks.")
            else:
                batch.append(" ".join(rng.choices(vocabulary, k=rng.randint(8, 80))))
        yield batch


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, prompts: int, eval_files: list[str]) -> dict:
    from dagster_project.conversations.contamination import (
        DEFAULT_NGRAM,
        EvalIndex,
        load_eval_texts,
        python_grams,
        python_scan,
        python_words,
    )

    texts = load_eval_texts(eval_files)
    started = time.perf_counter()
    scan = None
    if kind == "vectorized":
        index = EvalIndex(texts)
        scan = lambda batch: index.match(batch).tolist()  # noqa: E731
    elif kind == "python":
        grams = python_grams(texts)
        scan = lambda batch: python_scan(grams, batch)  # noqa: E731
    index_s = time.perf_counter() - started
    scanned_s, made, flagged, planted = 0.0, 0, [], []
    for batch in batches(prompts, texts, planted):
        if scan is not None:
            started = time.perf_counter()
            hits = scan(batch)
            scanned_s += time.perf_counter() - started
            flagged += [made + i for i, hit in enumerate(hits) if hit >= 0]
        made += len(batch)
    return {
        "prompts": made,
        "eval_texts": len(texts),
        "index_s": index_s,
        "scan_s": scanned_s,
        "flagged": len(flagged),
        "planted": len(planted),
        # An evaluation text shorter than the n-gram matches only a message made of exactly its words.
        "planted_short": sum(1 for text in planted if len(python_words(text)) < DEFAULT_NGRAM),
        "flagged_digest": hashlib.sha256(json.dumps(flagged).encode()).hexdigest()[:16],
        "peak_rss_mib": _peak_rss_mib(),
    }


def run_child(kind: str, prompts: int, eval_files: list[str]) -> dict:
    command = [sys.executable, "-m", "benchmarks.bench_contamination", "--child", kind, "--prompts", str(prompts)]
    command += ["--eval-files", *eval_files]
    done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--eval-files", nargs="+", default=EVAL_FILES)
    parser.add_argument("--child", choices=["vectorized", "python", "prompts_only"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prompts, args.eval_files)))
        return
    floor = run_child("prompts_only", args.prompts, args.eval_files)
    ours = run_child("vectorized", args.prompts, args.eval_files)
    ours_tenth = run_child("vectorized", args.prompts // 10, args.eval_files)
    baseline = run_child("python", args.prompts, args.eval_files)
    if (ours["flagged"], ours["flagged_digest"]) != (baseline["flagged"], baseline["flagged_digest"]):
        raise SystemExit(f"the scans disagree: vectorized {ours['flagged']}, python {baseline['flagged']}")

    def row(label: str, result: dict) -> str:
        rate = result["prompts"] / result["scan_s"]
        added = result["peak_rss_mib"] - floor["peak_rss_mib"]
        return (
            f"| {label} | {result['prompts']:,} | {result['index_s']:.2f} | {result['scan_s']:.1f} | {rate:,.0f} "
            f"| {result['flagged']:,} | {result['peak_rss_mib']:.0f} | {added:+.0f} |"
        )

    speedup = baseline["scan_s"] / ours["scan_s"]
    body = "\n".join(
        [
            f"## Contamination: {ours['prompts']:,} synthetic prompts vs the evaluation sets "
            "(`python -m benchmarks.bench_contamination`)",
            "",
            f"Evaluation sets: MT-Bench questions, HumanEval prompts, GSM8K test ({ours['eval_texts']:,} texts), "
            "8-word runs after normalization. Prompts: 8 to 80 words from the evaluation vocabulary and common "
            "words (most windows reach the hash lookup), one in 1,000 an evaluation text reworded in case and "
            "whitespace, made in batches of 16,384 in each child process. Both scans flag the same prompts: "
            f"{ours['flagged']:,} of the {floor['planted']:,} planted ({floor['planted_short']:,} planted texts are "
            "under 8 words, which match only a message made of exactly their words, not one that adds a line "
            "around them).",
            "",
            "| scan | prompts | index (s) | scan (s) | prompts/s | flagged | peak RSS (MiB) | vs prompts only (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            row("plain Python: dict of word n-gram tuples, prompt by prompt", baseline),
            row("**project: Arrow normalization + numpy n-gram hashes**", ours),
            row("project, a tenth of the prompts", ours_tenth),
            f"| making the prompts only | {floor['prompts']:,} | | | | | {floor['peak_rss_mib']:.0f} | |",
            "",
            f"The project's scan is {speedup:.1f}x the plain Python scan on the same prompts. The last column is what "
            "each scanner adds over making the prompts alone. The project's peak is "
            f"{ours_tenth['peak_rss_mib']:.0f} MiB at a tenth of the prompts and {ours['peak_rss_mib']:.0f} MiB at "
            "all of them: its extra memory is mostly fixed — Arrow's Unicode kernels (NFKC and regular-expression "
            "tables, about 55 MiB once loaded), the 16 MiB bitmap of hash suffixes, and the buffers of one "
            "batch of 16,384 messages; the scan holds no prompt after its batch.",
        ]
    )
    print(body)
    write_section("contamination", body)


if __name__ == "__main__":
    main()
