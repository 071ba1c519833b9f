"""The promises harness's long run: many seeded random jobs (tests/support/harness/), each run through every stage
on the simulator and moto with its fault and checked against every promise; a table per promise of the seeds
that broke it. `make soak` runs it after the fault soak; `--write` puts the table into RELIABILITY.md.

    python -m benchmarks.soak_harness --seeds 200 [--first 1000] [--minutes 30] [--write]

A seed that breaks a promise reproduces alone: `python -m benchmarks.soak_harness --first SEED --seeds 1`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

from benchmarks.soak_faults import write_table
from dagster_project.tokenizer import load_tokenizer
from tests.support.chat_templates import official_template
from tests.support.harness.invariants import check_job
from tests.support.harness.jobs import build_job
from tests.support.harness.run import FleetPool, run_job
from tests.support.s3_server import running_s3_server


def promise_of(violation: str) -> str:
    return violation.split(":", 1)[0]


def soak(first: int, seeds: int, minutes: float) -> tuple[dict[str, list[int]], dict[str, str], int, float]:
    """(promise → seeds that broke it, promise → its first message, jobs run, seconds)."""
    broken: dict[str, list[int]] = defaultdict(list)
    example: dict[str, str] = {}
    started = time.monotonic()
    tokenizer, template = load_tokenizer(), official_template()
    ran = 0
    with tempfile.TemporaryDirectory(prefix="soak_harness_") as scratch, running_s3_server() as s3:
        fleets = FleetPool(Path(scratch) / "fleet")
        try:
            for seed in range(first, first + seeds):
                if time.monotonic() - started > minutes * 60:
                    break
                job = build_job(seed)
                root = Path(scratch) / f"seed{seed}"
                bucket = f"harness-{uuid.uuid4().hex[:12]}"
                s3.client().create_bucket(Bucket=bucket)
                run = run_job(job, root, s3, bucket, tokenizer, fleets)
                violations = check_job(run, tokenizer, template)
                ran += 1
                promises = sorted({promise_of(v) for v in violations})
                print(f"{job.describe()}: {run.seconds:.1f} s, " + (", ".join(promises) or "every promise kept"))
                for violation in violations:
                    promise = promise_of(violation)
                    if seed not in broken[promise]:
                        broken[promise].append(seed)
                    example.setdefault(promise, violation[:300])
                shutil.rmtree(root, ignore_errors=True)
        finally:
            fleets.close()
    return broken, example, ran, time.monotonic() - started


def report(broken: dict[str, list[int]], example: dict[str, str], ran: int, first: int, seconds: float) -> str:
    lines = ["| promise | seeds that broke it | first message |", "|---|---|---|"]
    for promise in sorted(broken):
        seeds = broken[promise]
        shown = ", ".join(map(str, seeds[:12])) + (f" … ({len(seeds)})" if len(seeds) > 12 else f" ({len(seeds)})")
        message = example[promise].replace("|", "\\|")
        lines.append(f"| {promise} | {shown} | {message} |")
    if not broken:
        lines.append("| — | none | every promise kept |")
    return (
        f"`python -m benchmarks.soak_harness --first {first} --seeds {ran}`: {ran} random jobs "
        f"(seeds {first}-{first + ran - 1}) in {seconds / 60:.1f} min.\n\n" + "\n".join(lines)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", type=int, default=1000, help="the first seed (the fixed seeds of make test < 1000)")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=30.0, help="stop starting jobs after this long")
    parser.add_argument("--write", action="store_true", help="write the table into RELIABILITY.md")
    args = parser.parse_args()
    broken, example, ran, seconds = soak(args.first, args.seeds, args.minutes)
    table = report(broken, example, ran, args.first, seconds)
    print(table)
    if args.write:
        write_table(table, "soak:harness")


if __name__ == "__main__":
    main()
