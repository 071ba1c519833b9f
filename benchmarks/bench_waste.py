"""Waste: what the seed's job generates that a 4,096-token trainer cuts, with `max_new_tokens` 32,768 against `fit`;
and the waste ledger of a measured run.

    python -m benchmarks.bench_waste [--shards 16]

Projection: the seed's job (913,786 answers, 7 B200 at $27/hour, 600-token prompts) through `dflash plan
--project`'s code (`ops.length_fit`), its answer lengths a pilot's: `PILOT_ANSWERS` answers drawn by the simulator's
own length sampler at its long-tailed setting (`output_len` lognormal, median 1,795 tokens, sigma 0.8: a 2,472-token
mean), as a pilot run on simulators would measure them (natural lengths; none reaches 32,768).

Measured: `--shards` shards of synthetic single-turn prompts (one of them an MT-Bench question, quarantined by the
contamination check) through the real stages in this process (no Dagster): two simulators at that length setting,
`max_new_tokens` 8,192 (so some answers are length-capped in a run this small), the fleet's life recorded as `fleet
up` records it, every shard generated with the quality watch on and assembled at max_length 4,096 (`keep`), one
training shard blocked by a recorded gate verdict; a hold: simulator 0 goes bad as shard 0 starts (the seed's "OK.")
while simulator 1 writes its long answers, the watch holds the line and stops the run at once (`hold_drain_s` 0: the
answers in flight are aborted), the hold is released without --override (the answers from its onset dropped and
asked again) and simulator 0 made healthy; a server fault: simulator 1 breaks the answer contract on a share of its
answers (the end id mid-answer), which the dispatcher refuses, retries elsewhere and, after a few, sets the server
aside until its canary passes. Then `dflash status`'s answers (`collect_status`) after the fleet is down, the ledger
among them, against what the simulators themselves counted (`sglang:generation_tokens_total`, read before they stop).
Results go to the `waste` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_section
from dagster_project.conversations.contamination import ContaminationOptions, scan_conversations, write_report
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.fleet_life import close_lives, record_fleet_up
from dagster_project.generation.line_hold import LineHeld, read_hold, release_hold
from dagster_project.generation.line_stop import WatchOptions
from dagster_project.generation.stage import generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.answers.cost import FleetCost, render_cost
from dagster_project.ops.answers.waste import render_waste
from dagster_project.ops.length_fit import FitOptions, LengthSample, project_caps
from dagster_project.ops.projection import Job
from dagster_project.ops.status import collect_status
from dagster_project.sglang.launch import launch_simulators, stop_fleet
from dagster_project.sglang.sim.outputs import parse_length_distribution
from dagster_project.store.verdicts import record_verdict
from dagster_project.tokenizer import load_tokenizer, special_ids
from dagster_project.training.shards import AssemblyOptions, training_manifest
from dagster_project.training.stage import assemble_shard
from dagster_project.training.watch_figures import AnswerQualityWatch
from tests.support.ingest_helpers import run_stages
from tests.support.paths import SHARED
from tests.support.sglang_fixtures import call, generation_tokens_total

LONG_TAILED = "lognormal:1795:0.8"
PILOT_ANSWERS = 5_000
SEED_EVENTS = 913_786
PROMPTS_PER_SHARD = 8
MEASURED_MAX_NEW_TOKENS = 8192
SIMULATORS = 2
PRICE_PER_GPU_HOUR = 27.0 / 7
FAULTY = {"eos_mid_answer_share": 0.05}  # simulator 1's fault: answers breaking the contract, refused
GOES_BAD = {"bad_model_share": 1.0}  # simulator 0 from shard 0's start until the release: the seed's "OK."
# The watch holds from the third answer (a shard holds 8) and stops the run at once, its long answers in flight.
WATCH = WatchOptions(watch_min_answers=3, watch_judge_every=1, watch_poll_interval_s=0.2, hold_drain_s=0.0)
MT_BENCH_81 = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions."
)


def pilot_lengths(answers: int = PILOT_ANSWERS) -> LengthSample:
    sample = parse_length_distribution(LONG_TAILED)
    rng = random.Random(1)
    return LengthSample.measured(
        [sample(rng) for _ in range(answers)], f"a pilot on the simulator, output_len {LONG_TAILED}"
    )


def projection_section() -> str:
    by_cap = project_caps(Job(events=SEED_EVENTS), FitOptions(), pilot_lengths())
    (plain, plain_job), (fit, fit_job) = by_cap.rows
    saved = plain_job.seed.hours - fit_job.seed.hours
    return (
        "### The seed's job projected (913,786 answers, 7 B200 at $27/hour; `dflash plan --project`)\n\n"
        f"{by_cap.table()}\n\n"
        f"With `max_new_tokens` 32,768, {plain.cut_share:.1%} of the output tokens generated lie past a 4,096-token "
        f"row (600-token prompts): a trainer at max_length 4,096 cuts them. `fit` does not generate them: "
        f"{saved:,.1f} of the seed launch's {plain_job.seed.hours:,.1f} hours "
        f"(${plain_job.seed.cost - fit_job.seed.cost:,.0f}), the same training rows."
    )


def write_prompts(path: Path, count: int) -> Path:
    rows = [
        {"prompt": f"Question {i}: how many apples does a farmer with {i + 2} trees pick in a week?"}
        for i in range(count)
    ]
    rows[count // 2] = {"prompt": MT_BENCH_81}  # an evaluation-set question: quarantined, not sent
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def held_then_released(store, run, fleet) -> str:
    """Shard 0 with simulator 0 gone bad: the watch holds the line mid-shard; released without --override, with
    simulator 0 healthy again. Returns what held the line."""
    call(fleet.urls[0] + "/_sim/faults", GOES_BAD)
    try:
        run(0)
    except LineHeld:
        pass
    else:
        raise AssertionError("shard 0 was not held: the watch let simulator 0's disaster through")
    hold = read_hold(store)
    release_hold(store, by="bench_waste", reason="restarted simulator 0 on the right weights")
    call(fleet.urls[0] + "/_sim/faults", method="DELETE")
    return (
        f"gate {hold.gate} at {hold.figure:.0%} (threshold {hold.threshold:.0%}) over {hold.sample_size} answers of "
        "shard 0, released without --override"
    )


def measured_section(shards: int, root: Path) -> str:
    outcome = run_stages(
        root, [str(write_prompts(root / "prompts.jsonl", shards * PROMPTS_PER_SHARD))], num_shards=shards
    )
    store = outcome.store
    eval_file = SHARED / "data" / "eval_sets" / "mt_bench" / "question.jsonl"
    if eval_file.exists():
        write_report(store, scan_conversations(store, ContaminationOptions(eval_files=[str(eval_file)])))
    options = {"output_len": LONG_TAILED, "max_running_requests": 16, "decode_step_s": 0.002, "enable_metrics": True}
    fleet = launch_simulators(SIMULATORS, root / "fleet", options)
    settings = GenerationSettings(max_new_tokens=MEASURED_MAX_NEW_TOKENS)
    tokenizer = load_tokenizer()
    call(fleet.urls[1] + "/_sim/faults", FAULTY)

    special = special_ids(tokenizer)

    def generate(shard: int) -> None:
        dispatcher = Dispatcher(fleet.urls, DispatchOptions())
        watch = AnswerQualityWatch(special, tokenizer.decode, settings=settings)
        generate_shard(
            store, shard, tokenizer=tokenizer, settings=settings, dispatcher=dispatcher, work_dir=root / "work",
            watch=watch, watch_options=WATCH,
        )  # fmt: skip

    started = time.time()
    try:
        record_fleet_up(store, "bench", "simulator", SIMULATORS, PRICE_PER_GPU_HOUR)
        held = held_then_released(store, generate, fleet)
        for shard in range(shards):
            generate(shard)
        fleet_generated = sum(generation_tokens_total(url) for url in fleet.urls)
    finally:
        stop_fleet(root / "fleet")
        close_lives(store, "bench")
    generated_s = time.time() - started
    for shard in range(shards):
        assemble_shard(store, shard, AssemblyOptions(), root / "staging")
    blocked = shards // 3
    record_verdict(store, training_manifest(store, blocked), "gates", {"length_loss": "BLOCKED (benchmark)"})
    status = collect_status(store, [], cost=FleetCost(cost_per_gpu_hour=PRICE_PER_GPU_HOUR))
    waste = status.waste
    rows = [
        f"| {cause} | {waste.answers.get(cause, 0):,} | {tokens:,} | {waste.gpu_seconds.get(cause, 0.0):,.1f} "
        f"| ${waste.dollars.get(cause, 0.0):,.4f} |"
        for cause, tokens in waste.output_tokens.items()
    ]
    question7 = [*render_cost(status.cost), *render_waste(waste)]  # as `dflash status` prints them
    total = waste.trained_output_tokens + waste.pending_output_tokens + waste.wasted_output_tokens
    return (
        f"### A measured run: {shards} shards, {SIMULATORS} simulators, `max_new_tokens` {MEASURED_MAX_NEW_TOKENS:,}, "
        f"max_length 4,096, shard {blocked} blocked, one evaluation-set match, simulator 0 gone bad in shard 0 "
        f"({GOES_BAD}) held by the watch and released, simulator 1 breaking the answer contract ({FAULTY})\n\n"
        f"The hold: {held}. Generated in {generated_s:,.0f} s (load average {os.getloadavg()[0]:.1f}: the 2 cores "
        "shared). The ledger (`dflash status` after `fleet down`):\n\n"
        "| cause | answers | output tokens | GPU-s | $ |\n|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
        f"| trained | | {waste.trained_output_tokens:,} | | |\n| pending | | {waste.pending_output_tokens:,} | | |\n"
        f"| **generated** | | **{waste.generated_output_tokens:,}** | | |\n\n"
        f"trained + pending + every cause = {total:,} = generated. Not sent: {waste.not_sent or 'none'}.\n\n"
        f"The simulators' own count (`sglang:generation_tokens_total`, summed): {fleet_generated:,}; the ledger "
        f"{'=' if total == fleet_generated else 'differs by'} "
        f"{'' if total == fleet_generated else f'{total - fleet_generated:+,} '}"
        f"({(total - fleet_generated) / max(fleet_generated, 1):+.2%}).\n\n"
        "Question 7 as `dflash status` prints it:\n\n```\n" + "\n".join(question7) + "\n```"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        body = f"{projection_section()}\n\n{measured_section(args.shards, Path(scratch))}"
    print(body)
    path = write_section("waste", "## waste: what the trainer cuts, max_new_tokens against fit; a measured ledger "
                         "(`python -m benchmarks.bench_waste`)\n\n" + body)  # fmt: skip
    print(f"written to {path}")


if __name__ == "__main__":
    main()
