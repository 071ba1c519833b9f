"""Fleet benchmark: K shard runs at a time through Dagster, sharing two simulated servers, next to the ideal.

    python -m benchmarks.bench_fleet [--quick] [--nodes] [--rows backfill,materialize] [--time-scale 0.2]

Two simulators with the issue's latency model (running cap 16, time to first token 0.05 s, 0.05 s per decode
step, MTP on at ~2.8 tokens per step, lognormal outputs with median 300 tokens: ~56 output tokens/s per request,
about what the target model serves), every duration scaled by `--time-scale` (1, the default: the issue's model,
~15 min a row on 2 cores; 0.2: 5x faster, the same shape, but a process start then weighs 5x more against the
generation). Synthetic single-turn prompts go through the real `raw_prompts` and `conversations` assets into
`SHARDS` shards; then one `completions` run per shard, `RUNS_AT_ONCE` holding a slot of the `sglang_fleet` pool
at a time, every run on one shared ledger. Rows, in the same run against the
same servers:

* ideal: one long-lived dispatcher in this process over every shard's events (the same prompt ids);
* backfill: `dagster dev` on an instance with the project's dagster.yaml and the definitions' sensors running as
  they ship (their follow-up runs share the cores), a `launchPartitionBackfill` over every shard (the UI's
  Materialize dialog), the daemon's queue launching the runs; timed from the launch to the last backfill run's
  end (its run record);
* backfill before: the same without the pool's `op_granularity_run_buffer` (Dagster's default, 0);
* materialize: each shard one `dagster asset materialize` process, `RUNS_AT_ONCE` at a time, a new one as soon
  as one ends; with the CPU-s each process used.

A sampler polls each simulator's `/_sim/state` (running, queued) and the runs' ledgers (which runs hold
requests in flight) every `SAMPLE_S`. Results go to the `fleet` section of BENCHMARKS.md.

`--nodes`: runs on two nodes, i.e. two ledgers that do not see each other, against the same servers (in this
process: `RUNS_AT_ONCE` dispatchers, half on each ledger, each over one shard's events, the next shard as soon
as one ends), with the servers' reported load read and without; one node (one ledger) is the reference.
`NODES_PROMPTS_PER_SHARD` keeps it modest. Results go to the `fleet-nodes` section.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import orjson
import yaml

from benchmarks.report import write_section
from dagster_project.conversations.shards import read_conversations
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest
from dagster_project.generation.events import ShardGeneration
from dagster_project.generation.journal import Journal
from dagster_project.generation.ledger import FleetLedger
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang.launch import launch_simulators, stop_fleet
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore, Store
from dagster_project.tokenizer import load_tokenizer
from tests.support.dagster_helpers import (
    BACKFILL_RUNS,
    DAGSTER,
    LAUNCH_BACKFILL,
    DagsterDev,
    materialize,
    pipeline_env,
    shard_of_run,
    step_windows,
)
from tests.support.sglang_fixtures import wait_until

ROOT = Path(__file__).resolve().parents[1]
SERVERS, CAP = 2, 16


def simulator_config(time_scale: float) -> dict:
    """The issue's latency model, every duration x `time_scale`."""
    return {
        "enable_metrics": True,
        "max_running_requests": CAP,
        "ttft_s": 0.05 * time_scale,
        "decode_step_s": 0.05 * time_scale,
        "output_len": "lognormal:300:0.6",
    }


SHARDS, RUNS_AT_ONCE = 8, 4
PROMPTS_PER_SHARD = 550  # conversation ids hash to shards: ~550 each gives every shard >= 500 events
SAMPLE_S = 0.05
POOL = "sglang_fleet"
DAEMON_ROW = "backfill, dagster.yaml: the queue launches runs ahead of free slots (`op_granularity_run_buffer` 4)"
DAEMON_ROW_BEFORE = "backfill, Dagster's default buffer (0): a run launched only once a slot is free (before)"
MATERIALIZE_ROW = "four `dagster asset materialize` processes at a time"
PEAK_SLACK = 2  # the "small constant" over the window: slots granted in one fill before a release is seen
OVERSUBSCRIPTION = DispatchOptions().oversubscription
NODES = 2
NODES_PROMPTS_PER_SHARD = 275
ROWS = {"backfill": DAEMON_ROW, "backfill-default-buffer": DAEMON_ROW_BEFORE, "materialize": MATERIALIZE_ROW}


def http_json(url: str, method: str = "GET") -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
        return orjson.loads(response.read())


# ---- input -------------------------------------------------------------------------------------------------


def write_prompts(path: Path, count: int) -> Path:
    """Distinct single-turn prompts (OpenAI messages, one per line): one generation event each."""
    with path.open("wb") as out:
        for i in range(count):
            question = f"Question {i}: explain, step by step, why {i} is {'even' if i % 2 == 0 else 'odd'}."
            out.write(orjson.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": question}]}) + b"\n")
    return path


def dagster_home(path: Path, keep_run_buffer: bool = True) -> Path:
    """An instance with the project's dagster.yaml, its storage created here: runs starting at once on a new
    SQLite instance race to create its tables."""
    path.mkdir(parents=True)
    settings = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    if not keep_run_buffer:
        del settings["concurrency"]["pools"]["op_granularity_run_buffer"]
    (path / "dagster.yaml").write_text(yaml.safe_dump(settings))
    dg.DagsterInstance.from_config(str(path)).dispose()
    return path


# ---- sampling ----------------------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float  # monotonic seconds
    running: list[int]
    queued: list[int]
    generating: int  # runs with requests in flight


@dataclass
class Sampler:
    """Polls the simulators and the ledgers under `ledger_root` until stopped (a thread)."""

    urls: list[str]
    ledger_root: Path | None
    generating: int | None = None  # fixed count (the ideal) instead of reading ledgers
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        for url in self.urls:
            http_json(url + "/_sim/state?reset_occupancy=1", "POST")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peaks = [http_json(url + "/_sim/state")["peaks"] for url in self.urls]

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            states = [http_json(url + "/_sim/state") for url in self.urls]
            generating = self.generating if self.generating is not None else self._generating_runs()
            running, queued = [s["running"] for s in states], [s["queued"] for s in states]
            self.samples.append(Sample(time.monotonic(), running, queued, generating))

    def _generating_runs(self) -> int:
        return generating_runs(self.ledger_root)


def generating_runs(ledger_root: Path) -> int:
    """Runs (processes: a range run's shards generating at once are ledger members of one) with requests in
    flight, over every ledger under `ledger_root`."""
    runs: set[int] = set()
    for path in ledger_root.glob("**/ledger/*.json"):
        with path.open("rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)  # the ledger rewrites the file under an exclusive lock
            raw = handle.read()
        if raw:
            runs |= {m["pid"] for m in orjson.loads(raw)["members"].values() if m["in_flight"] > 0}
    return len(runs)


@dataclass(frozen=True, order=True)
class RunTimes:
    """One shard run's timeline, seconds after the backfill's launch."""

    created: float
    started: float  # the run's process reported itself started
    slot: float  # the completions step started: it holds a pool slot
    released: float  # the completions step ended: its slot is free
    ended: float


@dataclass
class Row:
    name: str
    events: int
    started: float  # monotonic seconds when the wall clock started
    wall_s: float
    samples: list[Sample]
    peaks: list[dict]
    runs: list[RunTimes] = field(default_factory=list)  # the daemon's rows: each run's timeline
    cap: int = CAP  # each server's running cap
    cpu_per_run: float | None = None  # the materialize row: CPU-s (user + system) per shard run's process tree
    other_runs: int = 0  # the daemon's rows: runs the sensors launched meanwhile (follow-ups, report refreshes)

    def busy(self, min_runs: int) -> list[tuple[Sample, float]]:
        """Samples taken while at least `min_runs` runs were generating, each with the time until the next one
        (a loaded machine stretches the sampling period: shares are weighted by time, not counted)."""
        spans = zip(self.samples, self.samples[1:])
        return [(s, after.at - s.at) for s, after in spans if s.generating >= min_runs]

    def at_cap(self, server: int, min_runs: int) -> float | None:
        busy = self.busy(min_runs)
        total = sum(dt for _, dt in busy)
        return sum(dt for s, dt in busy if s.running[server] >= self.cap) / total if total else None

    def mean_running(self, min_runs: int) -> float:
        busy = self.busy(min_runs)
        total = sum(dt for _, dt in busy)
        return sum(statistics.mean(s.running) * dt for s, dt in busy) / total if total else 0.0

    def generation_s(self) -> float:
        return sum(dt for _, dt in self.busy(1))

    def peak_in_flight(self, server: int) -> int:
        return max((s.running[server] + s.queued[server] for s in self.samples), default=0)

    def generating_span(self) -> tuple[float, float]:
        """Seconds after the clock's start of the first and the last sample with a run generating."""
        times = [s.at - self.started for s in self.samples if s.generating]
        return min(times), max(times)

    def pool_short(self) -> tuple[float, float]:
        """(seconds with fewer than RUNS_AT_ONCE pool slots held, seconds) from the first completions step's start
        to the last's: how long a shard waited for its run while a slot was free (the daemon's rows)."""
        changes = sorted([(t.slot, 1) for t in self.runs] + [(t.released, -1) for t in self.runs])
        first, last = min(t.slot for t in self.runs), max(t.slot for t in self.runs)
        held, short, previous = 0, 0.0, first
        for at, change in changes:
            if at > last:
                break
            if held < RUNS_AT_ONCE:
                short += at - previous
            held, previous = held + change, at
        return short, last - first


# ---- the three rows ----------------------------------------------------------------------------------------


def shard_requests(store: Path | Store, scratch: Path, shards: int = SHARDS) -> list[list[GenRequest]]:
    """Each shard's first requests, the prompts built exactly as a shard run builds them."""
    tokenizer, settings = load_tokenizer(), GenerationSettings()
    store = LocalStore(store) if isinstance(store, Path) else store
    requests = []
    for shard in range(shards):
        with Journal(scratch / f"requests-{shard}.jsonl") as journal:
            job = ShardGeneration(shard, list(read_conversations(store, shard)), tokenizer, settings, journal)
            requests.append(list(job.initial_requests()))
    return requests


def ideal(urls: list[str], store: Path, scratch: Path) -> Row:
    """One dispatcher over every shard's events."""
    requests = [request for shard in shard_requests(store, scratch) for request in shard]
    ended = 0

    def on_outcome(outcome) -> None:
        nonlocal ended
        ended += outcome.ok

    with Sampler(urls, None, generating=SHARDS) as sampler:
        started = time.monotonic()
        asyncio.run(Dispatcher(urls).run(requests, on_outcome))
        wall = time.monotonic() - started
    if ended != len(requests):
        raise RuntimeError(f"ideal: {len(requests) - ended} of {len(requests)} requests failed")
    return Row(
        "ideal: one long-lived dispatcher, every event", len(requests), started, wall, sampler.samples, sampler.peaks
    )


def shard_run_env(urls: list[str], seed_store: Path, run_dir: Path, **home_options) -> tuple[dict[str, str], Path]:
    """The environment of this row's shard runs (a copy of the input store, an instance of its own, one fleet ledger
    for every run) and their work directory."""
    store, work = run_dir / "store", run_dir / "work"
    shutil.copytree(seed_store, store)
    env = pipeline_env(
        home=dagster_home(run_dir / "home", **home_options),
        store=store,
        work_dir=work,
        num_shards=SHARDS,
        endpoints=urls,
        # One ledger for every run; a run per shard (a backfill policy's range of one), as this benchmark compares.
        extra={"DFLASH_FLEET_DIR": str(work / "fleet"), "DFLASH_SHARDS_PER_RUN": "1"},
        without_pilot="the rows compare the shard runs' throughput; a pilot is a run of its own, before the job",
    )
    return env, work


def shard_runs(name: str, urls: list[str], seed_store: Path, run_dir: Path, events: int, checkout: Path = ROOT) -> Row:
    """Every shard as its own `dagster asset materialize`, RUNS_AT_ONCE at a time, on a copy of the input;
    `checkout`: whose code the runs are (its own `.venv`), this one's unless measuring an earlier commit."""
    env, work = shard_run_env(urls, seed_store, run_dir)
    cli = str(checkout / ".venv" / "bin" / "dagster") if checkout != ROOT else DAGSTER

    def run(shard: int) -> None:
        materialize(env, checkout, "completions", layout.partition_key(shard), timeout_s=1800, dagster=cli)

    with Sampler(urls, work) as sampler:
        started, children_before = time.monotonic(), children_cpu_s()
        with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
            list(pool.map(run, range(SHARDS)))
        wall = time.monotonic() - started
        cpu_per_run = (children_cpu_s() - children_before) / SHARDS
    return Row(name, events, started, wall, sampler.samples, sampler.peaks, cpu_per_run=cpu_per_run)


def commit_of(checkout: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def children_cpu_s() -> float:
    """CPU-s of this process's children that ended and were waited for, their own children included (the
    kernel's accounting): during the materialize row, only its `dagster asset materialize` processes end."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def daemon_runs(name: str, urls: list[str], seed_store: Path, run_dir: Path, events: int, ahead: bool) -> Row:
    """A backfill of `completions` over every shard, launched as the UI's Materialize dialog does and run by the
    daemon under the project's dagster.yaml (its run queue and the `sglang_fleet` pool, limit RUNS_AT_ONCE).

    `ahead=False`: without the pool's `op_granularity_run_buffer`, Dagster's default (the queue launches a run
    only once a slot is free), as dagster.yaml was before."""
    env, work = shard_run_env(urls, seed_store, run_dir, keep_run_buffer=ahead)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    try:
        instance.event_log_storage.set_concurrency_slots(POOL, RUNS_AT_ONCE)
        with DagsterDev.running(env, run_dir) as dev:  # the sensors on, as the definitions ship them
            params = {
                "partitionNames": [layout.partition_key(shard) for shard in range(SHARDS)],
                "assetSelection": [{"path": ["completions"]}],
                "title": "bench_fleet",
            }
            with Sampler(urls, work) as sampler:
                launched_at, started = time.time(), time.monotonic()
                launched = dev.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
                if launched["__typename"] != "LaunchBackfillSuccess":
                    raise RuntimeError(f"{name}: the backfill did not launch: {launched}")

                def succeeded() -> list[dict] | None:
                    """Every shard's successful run, once each has one (a run that failed to launch is retried by
                    the daemon under another id)."""
                    runs = dev.query(BACKFILL_RUNS, {"backfill": launched["backfillId"]})["runsOrError"]["results"]
                    ok = {
                        shard_of_run({tag["key"]: tag["value"] for tag in run["tags"]}): run
                        for run in runs
                        if run["status"] == "SUCCESS"
                    }
                    done = [ok[key] for key in params["partitionNames"] if key in ok]
                    return done if len(done) == SHARDS else None

                runs = wait_until(succeeded, timeout_s=1800, interval_s=0.2, what="the daemon to run the backfill")
                polled_wall = time.monotonic() - started
        times = sorted(run_times(instance, run["runId"], launched_at) for run in runs)
        backfill_runs = {run["runId"] for run in runs}
        other_runs = len([run for run in instance.get_runs() if run.run_id not in backfill_runs])
    finally:
        instance.dispose()
    wall = max(t.ended for t in times)  # the run records' end, not when the poll saw it
    if not 0 < wall <= polled_wall:
        raise RuntimeError(f"{name}: the runs ended {wall:.1f} s after launch, the poll saw {polled_wall:.1f} s")
    return Row(name, events, started, wall, sampler.samples, sampler.peaks, times, other_runs=other_runs)


def run_times(instance: dg.DagsterInstance, run_id: str, launched_at: float) -> RunTimes:
    record = instance.get_run_record_by_id(run_id)
    slot, released = step_windows(instance, run_id, "completions")
    return RunTimes(
        *(
            at - launched_at
            for at in (record.create_timestamp.timestamp(), record.start_time, slot, released, record.end_time)
        )
    )


def node_runs(name: str, urls: list[str], shards: list[list[GenRequest]], root: Path, nodes: int, read_s: float) -> Row:
    """`RUNS_AT_ONCE` dispatchers in this process, spread over `nodes` ledgers, taking shards from one queue."""
    options = DispatchOptions(load_read_interval_s=read_s)
    queue = deque(shards)

    async def run_shard(requests: list[GenRequest], ledger_dir: Path) -> None:
        ended: list = []
        dispatcher = Dispatcher(urls, options, ledger=FleetLedger(ledger_dir))
        await dispatcher.run(requests, ended.append, remaining=lambda: len(requests) - len(ended))
        if not all(outcome.ok for outcome in ended):
            raise RuntimeError(f"{name}: a request failed")

    async def run_slot(ledger_dir: Path) -> None:
        while queue:
            await run_shard(queue.popleft(), ledger_dir)

    async def all_nodes() -> None:
        slots = [run_slot(root / f"node{slot % nodes}" / "ledger") for slot in range(RUNS_AT_ONCE)]
        await asyncio.gather(*slots)

    with Sampler(urls, root) as sampler:
        started = time.monotonic()
        asyncio.run(all_nodes())
        wall = time.monotonic() - started
    return Row(name, sum(map(len, shards)), started, wall, sampler.samples, sampler.peaks)


# ---- report ------------------------------------------------------------------------------------------------


def render(rows: list[Row], shard_sizes: list[int], load: tuple[float, float], time_scale: float) -> str:
    best = rows[0]
    sim = simulator_config(time_scale)
    window = int(CAP * OVERSUBSCRIPTION)
    lines = [
        f"## Fleet: shard runs sharing the fleet (`python -m benchmarks.bench_fleet{scale_flag(time_scale)}`)",
        "",
        (
            f"{SERVERS} simulated servers, running cap {CAP}, the issue's latency model with every duration x "
            f"{time_scale:g} (time to first token {sim['ttft_s'] * 1000:.0f} ms, {sim['decode_step_s'] * 1000:.0f} ms "
            "per decode step, MTP ~2.8 tokens per step, outputs lognormal with median 300 tokens). "
            f"{SHARDS} shards of {min(shard_sizes)}–{max(shard_sizes)} single-turn events "
            f"({sum(shard_sizes):,} in all) built by the `raw_prompts` and `conversations` assets, one run per shard "
            f"(`completions`), {RUNS_AT_ONCE} generating at a time, all on one shared ledger. The backfill rows are "
            "the operator's path: `dagster dev` on an instance with the project's dagster.yaml (queued run "
            f"coordinator, `max_concurrent_runs` 8, the `sglang_fleet` pool at {RUNS_AT_ONCE} with op granularity), "
            "a `launchPartitionBackfill` over every shard as the UI's Materialize dialog sends it, the daemon "
            "launching each run as its own process. "
            + (
                f"The last row starts each shard as its own `dagster asset materialize` process, {RUNS_AT_ONCE} at "
                "a time, the next when one exits. "
                if any(row.name == MATERIALIZE_ROW for row in rows)
                else ""
            )
            + f"Window per server = cap x {OVERSUBSCRIPTION} = {window}. Samples every {SAMPLE_S * 1000:.0f} ms of "
            "each simulator's running and queued requests and of the runs holding requests in flight (their ledgers)."
        ),
        "",
        "| client | wall (s) | speed vs ideal | first request (s) | first request to last answer (s) "
        "| its speed vs ideal | after the last answer (s) | at cap while ≥ 2 runs generate, per server "
        "| peak in flight per server (running + queued) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        at_cap = " / ".join("—" if row.at_cap(i, 2) is None else f"{row.at_cap(i, 2):.1%}" for i in range(SERVERS))
        peaks = " / ".join(
            f"{row.peak_in_flight(i)} (server's own peaks: {p['running']} + {p['queued']})"
            for i, p in enumerate(row.peaks)
        )
        first, last = row.generating_span()
        lines.append(
            f"| {row.name} | {row.wall_s:.1f} | **{best.wall_s / row.wall_s:.2f}x** | {first:.1f} | "
            f"{last - first:.1f} | {span(best) / (last - first):.2f}x | {row.wall_s - last:.1f} | "
            f"**{at_cap}** | {peaks} |"
        )
    if any(row.runs or row.cpu_per_run is not None for row in rows):
        lines += ["", "The shard runs (the backfills': seconds after the launch):", ""]
    for row in rows:
        if row.runs:
            short, until = row.pool_short()
            lines.append(
                f"* {row.name}: runs created {row.runs[0].created:.1f}–{max(t.created for t in row.runs):.1f}, "
                f"processes started {', '.join(f'{t.started:.0f}' for t in row.runs)}; completions steps (pool "
                f"slots) {', '.join(f'{t.slot:.0f}–{t.released:.0f}' for t in row.runs)}; fewer than "
                f"{RUNS_AT_ONCE} slots held for {short:.1f} of the {until:.1f} s until the last run took its slot; "
                f"{row.other_runs} runs launched by the sensors meanwhile (shard follow-ups, report refreshes)."
            )
        if row.cpu_per_run is not None:
            lines.append(
                f"* {row.name}: **{row.cpu_per_run:.1f} CPU-s per shard run** (each process and its children, user + "
                "system, from the kernel's accounting of the processes this benchmark waited for)."
            )
    lines.append("")
    for product in rows[1:]:
        verdicts = {
            "wall time >= 0.95x the ideal's speed": best.wall_s / product.wall_s >= 0.95,
            "first request to last answer >= 0.95x the ideal's speed": span(best) / span(product) >= 0.95,
            "each server at cap >= 95% while >= 2 runs generate": all(
                (product.at_cap(i, 2) or 0.0) >= 0.95 for i in range(SERVERS)
            ),
            f"peak in flight per server <= {window} + {PEAK_SLACK}": all(
                product.peak_in_flight(i) <= window + PEAK_SLACK for i in range(SERVERS)
            ),
        }
        lines.append(
            f"* {product.name.capitalize()} against the targets: "
            + "; ".join(f"{name}: **{'met' if met else 'not met'}**" for name, met in verdicts.items())
            + "."
        )
    lines += [
        "",
        (
            "Targets: speed >= 0.95x the ideal's; each server at its cap >= 95% of the time while at least two runs "
            f"generate; peak in flight per server <= cap x oversubscription ({window}) + a small constant, whatever "
            "the number of runs. A backfill row's wall time counts from the launch to the last run's end (the run "
            "records), so it includes the daemon's pickup, every process start, the definitions and the tokenizer "
            "before the first request, and the last run's publishing and exit; the `materialize` row's from its "
            "first process start to the last exit. The ideal's clock starts with the tokenizer loaded and the "
            "prompts built. "
            f"Load average over the bench (1 min, at its start / end): {load[0]:.1f} / {load[1]:.1f} on 2 cores."
        ),
    ]
    return "\n".join(lines)


def scale_flag(time_scale: float) -> str:
    return "" if time_scale == 1 else f" --time-scale {time_scale:g}"


def span(row: Row) -> float:
    first, last = row.generating_span()
    return last - first


def render_nodes(rows: list[Row], shard_sizes: list[int], time_scale: float) -> str:
    window = int(CAP * OVERSUBSCRIPTION)
    lines = [
        f"## Fleet: runs on two nodes, one set of servers (`python -m benchmarks.bench_fleet --nodes"
        f"{scale_flag(time_scale)}`)",
        "",
        (
            f"The servers of the section above, the latency model with every duration x {time_scale:g}. {SHARDS} "
            f"shards of {min(shard_sizes)}–"
            f"{max(shard_sizes)} single-turn events ({sum(shard_sizes):,} in all), one dispatcher per shard, "
            f"{RUNS_AT_ONCE} at a time in this process, each starting the next shard when it ends. A node is a "
            f"ledger: runs on different nodes see each other only through the servers. Server-reported load: every "
            f"{load_read_interval_s(time_scale) * 1000:.0f} ms (the default 1 s x {time_scale:g}) each dispatcher "
            "reads the "
            "servers' `/metrics`. Window per server "
            f"= cap x {OVERSUBSCRIPTION} = {window}. Samples every {SAMPLE_S * 1000:.0f} ms."
        ),
        "",
        "| runs | wall (s) | at cap while ≥ 2 runs generate, per server "
        "| peak in flight per server, sampled (server's own peaks: running + queued) |",
        "|---|---:|---|---|",
    ]
    for row in rows:
        at_cap = " / ".join("—" if row.at_cap(i, 2) is None else f"{row.at_cap(i, 2):.1%}" for i in range(SERVERS))
        peaks = " / ".join(
            f"**{row.peak_in_flight(i)}** ({p['running']} + {p['queued']})" for i, p in enumerate(row.peaks)
        )
        lines.append(f"| {row.name} | {row.wall_s:.1f} | {at_cap} | {peaks} |")
    excess = [
        " / ".join(
            f"{max(row.peak_in_flight(i), p['running'] + p['queued']) - window:+d}" for i, p in enumerate(row.peaks)
        )
        for row in rows
    ]
    lines += [
        "",
        f"Peak in flight per server over the window ({window}), the larger of the sampled and the server's own: "
        + "; ".join(f"{row.name}: **{over}**" for row, over in zip(rows, excess))
        + ".",
    ]
    return "\n".join(lines)


def load_read_interval_s(time_scale: float) -> float:
    """The default read period of the servers' load, scaled like every other duration."""
    return DispatchOptions().load_read_interval_s * time_scale


def nodes_rows(urls: list[str], store: Path, scratch: Path, time_scale: float) -> list[Row]:
    shards = shard_requests(store, scratch)
    read_s = load_read_interval_s(time_scale)
    rows = []
    for name, nodes, interval_s in (
        (f"one node, {RUNS_AT_ONCE} runs on one ledger", 1, read_s),
        (f"{NODES} nodes x {RUNS_AT_ONCE // NODES} runs, server-reported load", NODES, read_s),
        (f"{NODES} nodes x {RUNS_AT_ONCE // NODES} runs, ledgers only (`load_read_interval_s=0`)", NODES, 0.0),
    ):
        rows.append(node_runs(name, urls, shards, scratch / f"nodes-{len(rows)}", nodes, interval_s))
        print(f"{time.strftime('%X')} {name}: {rows[-1].wall_s:.1f} s", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer prompts, nothing written")
    parser.add_argument("--nodes", action="store_true", help="only the two-node rows (the fleet-nodes section)")
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help=f"the shard-run rows to measure beside the ideal, comma-separated among {', '.join(ROWS)} (default: all)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="a checkout of an earlier commit with its own .venv: its `dagster asset materialize` processes are "
        "measured as one more row, after this checkout's materialize row (the CPU-s per shard run before and after)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="every duration of the latency model x this (default 1: the issue's model; 0.2 runs 5x faster)",
    )
    args = parser.parse_args()
    if unknown := set(args.rows.split(",")) - set(ROWS):
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    per_shard = NODES_PROMPTS_PER_SHARD if args.nodes else PROMPTS_PER_SHARD
    prompts = (60 if args.quick else per_shard) * SHARDS
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        scratch = Path(tmp)
        seed_store = scratch / "seed-store"
        source = write_prompts(scratch / "prompts.jsonl", prompts)
        home = dagster_home(scratch / "seed-home")
        env = pipeline_env(
            home=home,
            store=seed_store,
            work_dir=scratch / "seed-work",
            num_shards=SHARDS,
            extra={"DFLASH_SOURCES": str(source)},
        )
        materialize(env, ROOT, "raw_prompts,conversations")
        print(f"{time.strftime('%X')} input ready", file=sys.stderr, flush=True)
        store = LocalStore(seed_store)
        shard_sizes = [sum(c.num_turns for c in read_conversations(store, shard)) for shard in range(SHARDS)]
        fleet = launch_simulators(SERVERS, scratch / "fleet", simulator_config(args.time_scale))
        if args.nodes:
            try:
                rows = nodes_rows(fleet.urls, seed_store, scratch, args.time_scale)
            finally:
                stop_fleet(scratch / "fleet")
            markdown = render_nodes(rows, shard_sizes, args.time_scale)
            print(markdown)
            if not args.quick:
                print(f"\nwritten to {write_section('fleet-nodes', markdown)}")
            return
        load_at_start = os.getloadavg()[0]
        try:
            rows = [ideal(fleet.urls, seed_store, scratch)]
            print(f"{time.strftime('%X')} ideal: {rows[0].wall_s:.1f} s", file=sys.stderr, flush=True)
            events = rows[0].events
            for key in args.rows.split(","):
                run_dir = scratch / key
                if key == "materialize":
                    rows.append(shard_runs(ROWS[key], fleet.urls, seed_store, run_dir, events))
                else:
                    ahead = key == "backfill"
                    rows.append(daemon_runs(ROWS[key], fleet.urls, seed_store, run_dir, events, ahead))
                print(f"{time.strftime('%X')} {ROWS[key]}: {rows[-1].wall_s:.1f} s", file=sys.stderr, flush=True)
            if args.before:
                name = f"{MATERIALIZE_ROW}, before ({commit_of(args.before)})"
                run_dir = scratch / "materialize-before"
                rows.append(shard_runs(name, fleet.urls, seed_store, run_dir, events, checkout=args.before))
                print(f"{time.strftime('%X')} {name}: {rows[-1].wall_s:.1f} s", file=sys.stderr, flush=True)
        finally:
            stop_fleet(scratch / "fleet")
    markdown = render(rows, shard_sizes, (load_at_start, os.getloadavg()[0]), args.time_scale)
    print(markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('fleet', markdown)}")


if __name__ == "__main__":
    main()
