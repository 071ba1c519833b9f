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
job's ~6 answers/s plus one poll interval; holds in the healthy control (goal 0).

The Dagster paths (`--paths ui,jobs`), each scenario on a fresh copy of the store and of the instance, through
`dagster dev -w workspace.yaml` with its daemon and the project's sensors (`line_hold_sensor` among them), as
`make dev` runs it, with the watch's settings as they ship (no run config; the poll is not time-scaled):

* `ui`: "Materialize all" on the shard assets, one asset backfill over every partition through the webserver's
  GraphQL (`launchPartitionBackfill`, what the dialog's button calls) at the default `DFLASH_SHARDS_PER_RUN` (64:
  one run for the 16 shards);
* `jobs`: `dagster job backfill -j shard_job --all --noprompt`, one run per shard, queued at once.

Measured there, per row: the answers after the onset before the hold and drained (the journals' finish times
against the hold's `held_at`); the generating runs launched after the hold (their `RUN_STARTING` event), and
those of them that sent a request; the runs left cancelled (by the held run or the `line_hold_sensor`); the
seconds from the onset (the first bad answer's finish) to the first report in the store with a failing blocking
figure (what `dflash status` and the page show: the store is read every 0.5 s) and to the hold, in wall seconds
and divided by the time scale ("real"; the poll, not scaled, makes that an upper bound). Results go to the `andon`
section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from benchmarks.bench_fleet import ROOT, SERVERS, dagster_home, simulator_config, write_prompts
from benchmarks.report import write_section
from dagster_project.conversations.shards import read_conversations
from dagster_project.generation.dispatch import Dispatcher
from dagster_project.generation.journal import Journal
from dagster_project.generation.line_hold import LineHeld, read_hold
from dagster_project.generation.line_stop import WatchOptions, read_watch_reports
from dagster_project.generation.shards import read_completions_manifest
from dagster_project.generation.stage import generate_shard, journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang.launch import launch_simulators, stop_fleet
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import load_tokenizer, special_ids
from dagster_project.training.watch_figures import AnswerQualityWatch
from tests.support.dagster_helpers import (
    DAGSTER,
    FINISHED,
    WORKSPACE,
    DagsterDev,
    backfill_ended,
    materialize,
    materialize_all,
    pipeline_env,
    run_cli,
    shard_of_run,
)
from tests.support.sglang_fixtures import wait_until

SHARDS = 16
PROMPTS_PER_SHARD = 540  # conversation ids hash to shards: ~540 each gives shards of ~500 events
BAD_AFTER_SHARD = 5
REAL_ANSWERS_PER_S = 6.0  # the real job's fleet (BENCHMARKS.md, rehearsal; the issue)
FLEET_GPUS, FLEET_DOLLARS_PER_HOUR = 7, 27.0
GOAL_ANSWERS, GOAL_SECONDS = 500, 120.0
OK_ANSWER = "\n</think>\n\nOK."


PATHS = ("direct", "ui", "jobs")
PATH_NAMES = {
    "ui": "one asset backfill (Materialize all, 64 shards per run)",
    "jobs": "`dagster job backfill -j shard_job`: a run per shard",
}
SCENARIOS = ("disaster-100", "disaster-30", "bad-after-5", "healthy")
DAGSTER_TIMEOUT_S = 1800  # a stuck backfill's bound: the healthy control takes ~10 min on a loaded machine
ALERT_READ_S = 0.5  # how often the bench reads the store's watch reports


@dataclass
class Scenario:
    name: str
    faults: dict
    key: str = ""


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


@dataclass
class DagsterRow:
    path: str
    name: str
    held: bool = False
    gate: str = ""
    before_hold: int = 0  # answers after the onset, before the hold
    drained: int = 0  # answers after the hold
    runs: int = 0  # generating runs the path created
    cancelled: int = 0  # of them, left cancelled (the line_hold_sensor's)
    launched_after_hold: int = 0  # generating runs launched (RUN_STARTING) after the hold
    sent_after_hold: int = 0  # ... and of those, the runs that sent a request
    to_alert_s: float | None = None  # the onset to the first report with a failing blocking figure in the store
    to_hold_s: float | None = None  # the onset to the hold's `held_at`
    shards_published: int = 0
    ended: str = ""  # the backfill's status, or the runs' statuses
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
            row["shard"], AnswerQualityWatch(special_ids(tokenizer), tokenizer.decode, settings=GenerationSettings())
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
            watch = AnswerQualityWatch(special_ids(tokenizer), tokenizer.decode, settings=GenerationSettings())
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


class AlertReader(threading.Thread):
    """Reads the store's watch reports every `ALERT_READ_S` while a path runs: the earliest `updated_at` of a report
    with a failing blocking figure (its run's or the fleet's) is when `dflash status` could first show the alert."""

    def __init__(self, store: LocalStore):
        super().__init__(daemon=True)
        self.store, self.first_alert_at = store, None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(ALERT_READ_S):
            for report in read_watch_reports(self.store):
                if any(f.blocking and not f.passed for f in [*report.figures, *report.fleet_figures]):
                    at = report.updated_at
                    self.first_alert_at = at if self.first_alert_at is None else min(self.first_alert_at, at)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)


def _shards_of(tags: dict) -> list[int]:
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    one = shard_of_run(tags)
    if one is not None:
        return [int(one.removeprefix("shard-"))]
    if start and end:
        return list(range(int(start.removeprefix("shard-")), int(end.removeprefix("shard-")) + 1))
    return []


def _generating_runs(instance: dg.DagsterInstance) -> list:
    return [
        record
        for record in instance.get_run_records()
        if record.dagster_run.job_name == "shard_job"
        or dg.AssetKey("completions") in (record.dagster_run.asset_selection or set())
    ]


def _runs_finished(home: Path, count: int) -> list | None:
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        records = _generating_runs(instance)
    finally:
        instance.dispose()
    done = len(records) >= count and all(r.dagster_run.status.value in FINISHED for r in records)
    return records if done else None


def run_dagster_scenario(
    scenario: Scenario, path: str, root: Path, seed: Path, seed_home: Path, time_scale: float
) -> DagsterRow:
    store_dir, work, home = root / "store", root / "work", root / "home"
    shutil.copytree(seed, store_dir)
    shutil.copytree(seed_home, home)
    store = LocalStore(store_dir)
    fleet = launch_simulators(SERVERS, root / "fleet", {**simulator_config(time_scale), "faults": scenario.faults})
    env = pipeline_env(
        home=home,
        store=store_dir,
        work_dir=work,
        num_shards=SHARDS,
        endpoints=fleet.urls,
        # A pilot would block the worst fleets before the job whose hold is measured, and its answers would move the
        # others' onset (they turn bad after a count of answers).
        without_pilot="the scenarios' fleets turn bad on purpose, counted from the job's first answer",
    )
    row, reader = DagsterRow(path, scenario.name), AlertReader(store)
    try:
        with DagsterDev.running(env, root) as dev:
            reader.start()
            started = time.monotonic()
            if path == "ui":
                backfill = materialize_all(dev, f"andon {scenario.key}")
                row.ended, _ = wait_until(
                    lambda: backfill_ended(dev, backfill),
                    timeout_s=DAGSTER_TIMEOUT_S,
                    interval_s=2.0,
                    what=f"the backfill of {scenario.name} to end",
                )
            else:
                backfill = [DAGSTER, "job", "backfill", "-w", str(WORKSPACE), "-j", "shard_job", "--all", "--noprompt"]
                run_cli(backfill, env=env, cwd=root, timeout_s=600)
                records = wait_until(
                    lambda: _runs_finished(home, SHARDS),
                    timeout_s=DAGSTER_TIMEOUT_S,
                    interval_s=2.0,
                    what=f"the shard runs of {scenario.name} to end",
                )
                row.ended = ", ".join(
                    f"{n} {s}" for s, n in Counter(r.dagster_run.status.value for r in records).items()
                )
            row.wall_s = time.monotonic() - started
    finally:
        stop_fleet(root / "fleet")
        reader.stop()
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        records = _generating_runs(instance)
        # When the queue (or the backfill daemon) launched each run: its RUN_STARTING event.
        launched = {
            r.dagster_run.run_id: min(
                (
                    e.timestamp
                    for e in instance.all_logs(r.dagster_run.run_id, of_type=dg.DagsterEventType.RUN_STARTING)
                ),
                default=None,
            )
            for r in records
        }
    finally:
        instance.dispose()
    rows = _journal_rows(work, GenerationSettings().fingerprint())
    hold = read_hold(store)
    onset = next((i for i, r in enumerate(rows) if _is_bad(r)), None)
    onset_at = rows[onset]["finished_at"] if onset is not None else None
    row.runs = len(records)
    row.cancelled = sum(r.dagster_run.status == dg.DagsterRunStatus.CANCELED for r in records)
    row.shards_published = sum(read_completions_manifest(store, shard) is not None for shard in range(SHARDS))
    if onset_at is not None and reader.first_alert_at is not None:
        row.to_alert_s = max(reader.first_alert_at - onset_at, 0.0)
    if hold is not None:
        row.held, row.gate = True, hold.gate
        after_onset = rows[onset:] if onset is not None else []
        row.before_hold = sum(r["finished_at"] < hold.held_at for r in after_onset)
        row.drained = sum(r["finished_at"] >= hold.held_at for r in after_onset)
        row.to_hold_s = hold.held_at - onset_at if onset_at is not None else None
        for record in records:
            at = launched[record.dagster_run.run_id]
            if at is None or at < hold.held_at:
                continue
            row.launched_after_hold += 1
            shards = set(_shards_of(record.dagster_run.tags))
            row.sent_after_hold += any(r["shard"] in shards and r["finished_at"] >= at for r in rows)
    return row


def _seconds(answers: int | None, poll_s: float) -> str:
    return "—" if answers is None else f"{answers / REAL_ANSWERS_PER_S + poll_s:.0f}"


def _held(row: Row | DagsterRow) -> str:
    return f"yes ({row.gate})" if row.held else "no"


def _cost(answers: int) -> str:
    """GPU-s and $ of `answers` at the brief's fleet, as two cells."""
    gpu_s = FLEET_GPUS / REAL_ANSWERS_PER_S
    dollars = FLEET_DOLLARS_PER_HOUR / 3600 / REAL_ANSWERS_PER_S
    return f"{answers * gpu_s:,.0f} | {answers * dollars:,.2f}"


def _verdict(where: str, row: Row | DagsterRow, goals: str, met: bool) -> str:
    if where.startswith("healthy") or where.endswith("healthy control"):
        return f"* {where}: holds {int(row.held)} (goal 0): **{'met' if not row.held else 'NOT met'}**."
    return f"* {where}: {goals}: **{'met' if met and row.held else 'NOT met'}**."


def _wall_real(seconds: float | None, time_scale: float) -> str:
    return "—" if seconds is None else f"{seconds:.1f} / {seconds / time_scale:.0f}"


def render_dagster(rows: list[DagsterRow], time_scale: float) -> list[str]:
    lines = [
        "",
        f"Through Dagster: `dagster dev -w workspace.yaml` with its daemon and sensors, the same fleet and shards, the "
        f"watch as it ships (poll {WatchOptions().watch_poll_interval_s:g} s, not scaled). Seconds: wall / real "
        f"(wall ÷ {time_scale:g}; an upper bound, the poll not being scaled). Runs launched after the hold: their "
        "`RUN_STARTING` event after `held_at` (those that sent a request in brackets); cancelled: by the held run or "
        "the `line_hold_sensor`.",
        "",
        "| path | scenario | held (gate) | answers after onset before the hold | drained after it | GPU-s | $ | "
        "generating runs (cancelled) | runs launched after the hold (sent a request) | onset → first alert, s | "
        "onset → hold, s | shards published | ended | wall (s) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {PATH_NAMES[row.path]} | {row.name} | {_held(row)} | {row.before_hold:,} | {row.drained:,} | "
            f"{_cost(row.before_hold + row.drained)} | {row.runs} ({row.cancelled}) | "
            f"{row.launched_after_hold} ({row.sent_after_hold}) | {_wall_real(row.to_alert_s, time_scale)} | "
            f"{_wall_real(row.to_hold_s, time_scale)} | {row.shards_published} | {row.ended} | {row.wall_s:.0f} |"
        )
    goals = (
        f"answers after the onset ≤ {GOAL_ANSWERS}, no generating run launched after the hold, onset → hold ≤ "
        f"{GOAL_SECONDS:g} s real"
    )
    verdicts = [
        _verdict(
            f"{PATH_NAMES[row.path]}, {row.name}",
            row,
            goals,
            row.before_hold + row.drained <= GOAL_ANSWERS
            and row.launched_after_hold == 0
            and row.to_hold_s is not None
            and row.to_hold_s / time_scale <= GOAL_SECONDS,
        )
        for row in rows
    ]
    return [*lines, "", *verdicts]


def render(rows: list[Row], shard_sizes: list[int], time_scale: float, dagster_rows: list[DagsterRow] = ()) -> str:
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
        lines.append(
            f"| {row.name} | {_held(row)} | {row.before_hold:,} | {row.drained:,} | "
            f"{_cost(row.before_hold + row.drained)} | {row.runs_after_hold} | {row.refused} | "
            f"{'—' if row.to_alert is None else row.to_alert} / {_seconds(row.to_alert, poll)} | "
            f"{'—' if row.to_hold is None else row.to_hold} / {_seconds(row.to_hold, poll)} | "
            f"{row.shards_published} | {row.wall_s:.0f} |"
        )
    goals = (
        f"answers after the onset ≤ {GOAL_ANSWERS}, no shard run generating after the hold, onset → hold ≤ "
        f"{GOAL_SECONDS:g} s at the real rate"
    )
    verdicts = [
        _verdict(
            row.name,
            row,
            goals,
            row.before_hold + row.drained <= GOAL_ANSWERS
            and row.runs_after_hold == 0
            and row.to_hold is not None
            and row.to_hold / REAL_ANSWERS_PER_S + poll <= GOAL_SECONDS,
        )
        for row in rows
    ]
    dagster = render_dagster(list(dagster_rows), time_scale) if dagster_rows else []
    return "\n".join([*lines, "", *verdicts, *dagster])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer prompts, nothing written")
    parser.add_argument("--time-scale", type=float, default=0.2, help="latency model x this (default 0.2)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)} (default all)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {', '.join(SCENARIOS)} (default all)")
    args = parser.parse_args()
    paths, wanted = args.paths.split(","), args.scenarios.split(",")
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
            Scenario("disaster from the start, 100%", {"bad_model_share": 1.0}, "disaster-100"),
            Scenario("disaster from the start, 30%", {"bad_model_share": 0.3}, "disaster-30"),
            Scenario(
                f"fleet going bad after {BAD_AFTER_SHARD} shards (100%)",
                {"bad_model_share": 1.0, "bad_model_after_answers": first // SERVERS},
                "bad-after-5",
            ),
            Scenario("healthy control", {}, "healthy"),
        ]
        tokenizer = load_tokenizer()
        rows = []
        if "direct" in paths:
            rows = [
                run_scenario(s, scratch / f"scenario-{i}", seed, args.time_scale, tokenizer)
                for i, s in enumerate(scenarios)
                if s.key in wanted
            ]
        dagster_rows = [
            run_dagster_scenario(s, path, scratch / f"{path}-{i}", seed, scratch / "home", args.time_scale)
            for path in paths
            if path != "direct"
            for i, s in enumerate(scenarios)
            if s.key in wanted
        ]
        for row in dagster_rows:
            print(row, file=sys.stderr, flush=True)
    markdown = render(rows, shard_sizes, args.time_scale, dagster_rows)
    print(markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('andon', markdown)}")


if __name__ == "__main__":
    main()
