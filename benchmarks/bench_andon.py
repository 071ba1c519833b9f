"""Stop the line (`andon`): how much a bad model generates before the quality watch holds the line.

    python -m benchmarks.bench_andon [--quick] [--time-scale 0.2]

Two simulators with the fleet benchmark's latency model (running cap 16, time to first token 0.05 s, 0.05 s per
decode step, MTP ~2.8 tokens per step, lognormal outputs with median 300 tokens), every duration scaled by
`--time-scale`, and the watch's poll interval and drain scaled with it, so answers per poll are the real job's
shape. 16 shards of ~500 single-turn events built by the `raw_prompts` and `conversations` assets; the shards are
generated one after another by `generation.stage.generate_shard` with the watch on (what each `completions` run
does), against a fresh copy of the store per scenario:

* the disaster from the start, 100% and 30% of answers (`bad_model_share`);
* a fleet going bad after shard 5 (`bad_model_after_answers`: each server's share of shards 0-4's events);
* a healthy control.

Per scenario: answers generated after the onset (the first bad answer) before the hold, and drained after it; the
same in GPU-seconds and dollars at the brief's fleet (7 GPUs, $27/h, ~6 answers/s: 7/6 GPU-s an answer); shard runs
started after the hold that sent any request (goal 0: a held store refuses every shard at its start); the answers
from the onset to the first failing figure (the `quality` alert) and to the hold, and those in seconds at the real
job's ~6 answers/s plus one poll interval; holds in the healthy control (goal 0). Not measured here: the Dagster
side (a backfill's runs, the `line_hold_sensor`): this drives the stage function as a run would, in one process.
Results go to the `andon` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_fleet import ROOT, SERVERS, dagster_home, simulator_config, write_prompts
from benchmarks.report import write_section
from dagster_project.conversations.shards import read_conversations
from dagster_project.generation.dispatch import Dispatcher
from dagster_project.generation.journal import Journal
from dagster_project.generation.line_hold import LineHeld, read_hold
from dagster_project.generation.line_stop import WatchOptions
from dagster_project.generation.stage import generate_shard, journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang.launch import launch_simulators, stop_fleet
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import load_tokenizer, special_ids
from dagster_project.training.watch_figures import AnswerQualityWatch
from tests.support.dagster_helpers import materialize, pipeline_env

SHARDS = 16
PROMPTS_PER_SHARD = 540  # conversation ids hash to shards: ~540 each gives shards of ~500 events
BAD_AFTER_SHARD = 5
REAL_ANSWERS_PER_S = 6.0  # the real job's fleet (BENCHMARKS.md, rehearsal; the issue)
FLEET_GPUS, FLEET_DOLLARS_PER_HOUR = 7, 27.0
GOAL_ANSWERS, GOAL_SECONDS = 500, 120.0
OK_ANSWER = "\n</think>\n\nOK."


@dataclass
class Scenario:
    name: str
    faults: dict


@dataclass
class Row:
    name: str
    held: bool
    gate: str = ""
    onset_answers: int | None = None  # answers before the first bad one
    before_hold: int = 0  # answers after the onset, before the hold
    drained: int = 0  # answers after the hold (in flight when it was written)
    runs_after_hold: int = 0  # shard runs that sent a request after the hold
    refused: int = 0  # shard runs refused at their start
    to_alert: int | None = None  # answers from the onset to the first failing figure
    to_hold: int | None = None  # ... to the hold, as the watch replayed over them sees it
    shards_published: int = 0
    wall_s: float = 0.0


def _journal_rows(work: Path, fingerprint: str) -> list[dict]:
    rows = []
    for shard in range(SHARDS):
        path = journal_path(work, shard, fingerprint)
        if path.exists():
            with Journal(path) as journal:
                rows += [{**record, "shard": shard} for record in journal.final_records()]
    return sorted(rows, key=lambda row: row["finished_at"])


def _is_bad(row: dict) -> bool:
    return row["status"] == "ok" and (row.get("text") or "") == OK_ANSWER


def _replay(rows: list[dict], tokenizer, options: WatchOptions) -> tuple[int | None, int | None]:
    """The answer (counted from the onset) at which the watch's own figure first fails, and at which it may hold,
    judging after every answer, each shard's run with a watch of its own as the runs here have (one shard after
    another)."""
    onset = next((i for i, row in enumerate(rows) if _is_bad(row)), None)
    if onset is None:
        return None, None
    watches: dict[int, AnswerQualityWatch] = {}
    alert = None
    for i, row in enumerate(rows):
        watch = watches.setdefault(
            row["shard"], AnswerQualityWatch(special_ids(tokenizer), tokenizer.decode, enable_thinking=True)
        )
        watch.observe(row)
        if i < onset:
            continue
        failed = watch.judge(watch.rows()).failed
        if failed is not None and alert is None:
            alert = i - onset
        if failed is not None and len(watch.rows()) >= options.watch_min_answers:
            return alert, i - onset
    return alert, None


def run_scenario(scenario: Scenario, root: Path, seed: Path, time_scale: float, tokenizer) -> Row:
    store_dir, work = root / "store", root / "work"
    shutil.copytree(seed, store_dir)
    store = LocalStore(store_dir)
    settings = GenerationSettings()
    options = WatchOptions(watch_poll_interval_s=5.0 * time_scale, hold_drain_s=300.0 * time_scale)
    fleet = launch_simulators(SERVERS, root / "fleet", {**simulator_config(time_scale), "faults": scenario.faults})
    row = Row(scenario.name, held=False)
    started = time.monotonic()
    starts: list[tuple[int, float]] = []  # shard, when its run started
    try:
        for shard in range(SHARDS):
            starts.append((shard, time.time()))
            watch = AnswerQualityWatch(special_ids(tokenizer), tokenizer.decode, enable_thinking=True)
            try:
                generate_shard(
                    store,
                    shard,
                    tokenizer=tokenizer,
                    settings=settings,
                    dispatcher=Dispatcher(fleet.urls),
                    work_dir=work,
                    watch=watch,
                    watch_options=options,
                )
                row.shards_published += 1
            except LineHeld:
                pass
            print(f"{time.strftime('%X')} {scenario.name}: shard {shard} done", file=sys.stderr, flush=True)
    finally:
        stop_fleet(root / "fleet")
    row.wall_s = time.monotonic() - started
    rows = _journal_rows(work, settings.fingerprint())
    hold = read_hold(store)
    onset = next((i for i, r in enumerate(rows) if _is_bad(r)), None)
    row.onset_answers = onset
    if hold is not None:
        row.held, row.gate = True, hold.gate
        after_onset = rows[onset:] if onset is not None else []
        row.before_hold = sum(r["finished_at"] < hold.held_at for r in after_onset)
        row.drained = sum(r["finished_at"] >= hold.held_at for r in after_onset)
        for shard, at in starts:
            if at >= hold.held_at:
                sent = any(r["shard"] == shard and r["finished_at"] >= at for r in rows)
                row.runs_after_hold += sent
                row.refused += not sent
    row.to_alert, row.to_hold = _replay(rows, tokenizer, options)
    return row


def _seconds(answers: int | None, poll_s: float) -> str:
    return "—" if answers is None else f"{answers / REAL_ANSWERS_PER_S + poll_s:.0f}"


def render(rows: list[Row], shard_sizes: list[int], time_scale: float) -> str:
    gpu_s = FLEET_GPUS / REAL_ANSWERS_PER_S
    dollars = FLEET_DOLLARS_PER_HOUR / 3600 / REAL_ANSWERS_PER_S
    poll = WatchOptions().watch_poll_interval_s
    lines = [
        "## andon: a bad model stopped by the quality watch (`python -m benchmarks.bench_andon`)",
        "",
        f"2 simulated servers, the fleet benchmark's latency model x {time_scale:g} (the watch's poll and drain x "
        f"{time_scale:g} too); {SHARDS} shards of {min(shard_sizes)}–{max(shard_sizes)} events "
        f"({sum(shard_sizes):,} in all), generated one after another by `generate_shard` with the watch on "
        f"(`watch_min_answers` {WatchOptions().watch_min_answers}). GPU-s and $ at the brief's fleet: "
        f"{FLEET_GPUS} GPUs, ${FLEET_DOLLARS_PER_HOUR:g}/h, ~{REAL_ANSWERS_PER_S:g} answers/s. Seconds at the real "
        f"job's ~{REAL_ANSWERS_PER_S:g} answers/s: the answers / {REAL_ANSWERS_PER_S:g} + one poll ({poll:g} s).",
        "",
        "| scenario | held (gate) | answers after onset before the hold | drained after it | GPU-s | $ | shard runs "
        "generating after the hold | refused at start | onset → first alert (answers / s) | onset → hold "
        "(answers / s) | shards published | wall (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for row in rows:
        wasted = row.before_hold + row.drained
        lines.append(
            f"| {row.name} | {'yes (' + row.gate + ')' if row.held else 'no'} | {row.before_hold:,} | {row.drained:,} "
            f"| {wasted * gpu_s:,.0f} | {wasted * dollars:,.2f} | {row.runs_after_hold} | {row.refused} | "
            f"{'—' if row.to_alert is None else row.to_alert} / {_seconds(row.to_alert, poll)} | "
            f"{'—' if row.to_hold is None else row.to_hold} / {_seconds(row.to_hold, poll)} | "
            f"{row.shards_published} | {row.wall_s:.0f} |"
        )
    verdicts = []
    for row in rows:
        if row.name.startswith("healthy"):
            verdicts.append(
                f"* {row.name}: holds {int(row.held)} (goal 0): **{'met' if not row.held else 'NOT met'}**."
            )
            continue
        met = (
            row.held
            and row.before_hold + row.drained <= GOAL_ANSWERS
            and row.runs_after_hold == 0
            and row.to_hold is not None
            and row.to_hold / REAL_ANSWERS_PER_S + poll <= GOAL_SECONDS
        )
        verdicts.append(
            f"* {row.name}: answers after the onset ≤ {GOAL_ANSWERS}, no shard run generating after the hold, "
            f"onset → hold ≤ {GOAL_SECONDS:g} s at the real rate: **{'met' if met else 'NOT met'}**."
        )
    return "\n".join([*lines, "", *verdicts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer prompts, nothing written")
    parser.add_argument("--time-scale", type=float, default=0.2, help="latency model x this (default 0.2)")
    args = parser.parse_args()
    per_shard = 60 if args.quick else PROMPTS_PER_SHARD
    with tempfile.TemporaryDirectory(prefix="bench-andon-") as tmp:
        scratch = Path(tmp)
        seed = scratch / "seed-store"
        source = write_prompts(scratch / "prompts.jsonl", per_shard * SHARDS)
        env = pipeline_env(
            home=dagster_home(scratch / "home"),
            store=seed,
            work_dir=scratch / "seed-work",
            num_shards=SHARDS,
            extra={"DFLASH_SOURCES": str(source)},
        )
        materialize(env, ROOT, "raw_prompts,conversations")
        shard_sizes = [sum(c.num_turns for c in read_conversations(LocalStore(seed), s)) for s in range(SHARDS)]
        first = sum(shard_sizes[:BAD_AFTER_SHARD])
        scenarios = [
            Scenario("disaster from the start, 100%", {"bad_model_share": 1.0}),
            Scenario("disaster from the start, 30%", {"bad_model_share": 0.3}),
            Scenario(
                f"fleet going bad after {BAD_AFTER_SHARD} shards (100%)",
                {"bad_model_share": 1.0, "bad_model_after_answers": first // SERVERS},
            ),
            Scenario("healthy control", {}),
        ]
        tokenizer = load_tokenizer()
        rows = [
            run_scenario(s, scratch / f"scenario-{i}", seed, args.time_scale, tokenizer)
            for i, s in enumerate(scenarios)
        ]
    markdown = render(rows, shard_sizes, args.time_scale)
    print(markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('andon', markdown)}")


if __name__ == "__main__":
    main()
