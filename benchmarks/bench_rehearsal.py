"""Dress rehearsal: the whole job's shape through Dagster, one backfill over every shard, the head node measured.

    python -m benchmarks.bench_rehearsal [--shards 1830] [--events-per-shard 4] [--timeout-min 60] [--quick]

The real job's partition count (1,830 by default), each shard holding only a few single-turn events with short
answers from a fast simulator profile, so that Dagster, not generation, is what takes the time. Everything else
is the production shape on one machine: the instance of deploy/dagster-postgres.yaml on a real PostgreSQL server,
the store on S3 (moto's server on loopback), `dagster dev -w workspace.yaml` (webserver, daemon, code server) with
the project's sensors and automation on as they ship, the job's pilot (`dagster asset materialize --select pilot`,
before the shards may generate), and one `launchPartitionBackfill` of the shard job's assets over every partition,
as the UI's Materialize dialog sends it. Beside it, a Prometheus (Debian's
`/usr/bin/prometheus`, loopback) scrapes `dflash metrics`.

Measured, into the `rehearsal` section of BENCHMARKS.md:

* wall time from the launch to the last run's end, against the ideal: one dispatcher in this process over the same
  events (the prompts built as a shard run builds them), against the same servers;
* runs enqueued per second (the backfill runs' creation times);
* CPU-s per shard run and per partition, and of everything the job needs per partition (daemon, webserver, code
  server, runs, PostgreSQL, moto, simulators, Prometheus and the exporter), from /proc: each process tree's own
  and reaped children's CPU time, sampled every `SAMPLE_S`; peak RSS of each;
* event-log rows and bytes per partition (PostgreSQL's `event_logs`);
* pool slots held after the end (leaked: must be 0); slot-seconds held without a request in flight (the pool's
  slots held, from PostgreSQL, less the runs with requests in flight, from the fleet's ledger);
* each server at its running cap while two or more runs generate (the simulators' own state);
* coverage by id at the end (`dflash status --json --by-id`); every partition of every shard asset materialized
  exactly once; every run materialized something (no run without work);
* while the backfill runs, headless Chromium's load time of the asset page with every partition, the backfill's
  page and the `run_report` page;
* the Prometheus check: its query results for the pipeline's figures against `dflash status --json`.

The harness (`rehearse`) is also what tests/integration/test_rehearsal.py runs at 120 partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psutil
import psycopg2

from benchmarks.bench_fleet import Row, Sample, generating_runs, http_json, shard_requests
from benchmarks.report import write_section
from dagster_project.conversations.sharding import shard_of
from dagster_project.generation.dispatch import Dispatcher
from dagster_project.ops.coverage import DatasetCoverage, read_coverage
from dagster_project.settings import DEFAULT_SHARDS_PER_RUN
from dagster_project.sglang.launch import free_ports, launch_simulators, stop_fleet
from dagster_project.store import layout
from dagster_project.store.storage import open_store
from tests.support.browser import chromium_driver
from tests.support.dagster_helpers import (
    DAGSTER,
    FINISHED,
    LAUNCH_BACKFILL,
    SHARD_ASSETS,
    DagsterDev,
    kill_process_group,
    materialize,
    pipeline_env,
    run_cli,
)
from tests.support.postgres_server import PostgresServer, postgres_bin_dir, running_postgres
from tests.support.s3_server import S3Server, running_s3_server
from tests.support.sglang_fixtures import wait_until

ROOT = Path(__file__).resolve().parents[1]
INSTANCE_YAML = ROOT / "deploy" / "dagster-postgres.yaml"
POOL = "sglang_fleet"
SERVERS, CAP = 2, 4
# Short answers at once: ~100 output tokens at ~2.8 tokens per 4 ms step, a fraction of a second each, so the
# servers never hold the job back; lengths spread, so every training gate passes on a shard of a few rows.
FAST_PROFILE = {
    "enable_metrics": True,
    "max_running_requests": CAP,
    "output_len": "uniform:48:160",
    "decode_step_s": 0.004,
}
# Enough for one run to fill both servers' caps (2 x 4) with a shard's events.
EVENTS_PER_SHARD = 8
# Each sample walks every process under this one and asks PostgreSQL for the pool's slots: every second is enough
# for shares of time over a backfill of minutes, and keeps the benchmark's own load off the two cores.
SAMPLE_S = 1.0
PROGRESS_S = 10
PROMETHEUS = Path(os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus"))
SCRAPE_S = 10
PAGE_TIMEOUT_S = 120
# Browse once this share of the partitions is materialized: the pages then show a backfill in progress.
BROWSE_AT = 0.3
MATERIALIZATION = "ASSET_MATERIALIZATION"


# ---- input -------------------------------------------------------------------------------------------------


def write_prompts(path: Path, shards: int, per_shard: int) -> Path:
    """Single-turn prompts (OpenAI messages, one per line), exactly `per_shard` of them hashing to each shard, so
    every partition has the same work."""
    counts = [0] * shards
    with path.open("wb") as out:
        i = 0
        while min(counts) < per_shard:
            prompt_id = f"q{i}"
            shard = shard_of(prompt_id, shards)
            if counts[shard] < per_shard:
                counts[shard] += 1
                question = f"Question {i}: explain, step by step, why {i} is {'even' if i % 2 == 0 else 'odd'}."
                line = {"id": prompt_id, "messages": [{"role": "user", "content": question}]}
                out.write(orjson.dumps(line) + b"\n")
            i += 1
    return path


# ---- sampling the head node --------------------------------------------------------------------------------

# Process kinds, by their command line (first match wins); anything else this process started is "other".
KINDS = (
    # The code server starts each run worker as a multiprocessing child (`dagster api execute_run` elsewhere).
    ("runs", ("execute_run", "spawn_main")),
    ("daemon", ("dagster-daemon", "dagster._daemon")),
    ("webserver", ("dagster-webserver", "dagster_webserver")),
    ("code server", ("code-server", "api grpc", "grpc-health-check")),
    ("dagster dev", (" dev ",)),
    ("postgres", ("postgres",)),
    ("moto", ("moto_s3_server",)),
    ("simulators", ("sglang.sim", "sglang_sim")),
    ("prometheus", ("prometheus",)),
    ("exporter", ("dflash metrics", "cli metrics")),
    ("browser", ("chromium", "chromedriver")),
)
HEAD_NODE = ("daemon", "webserver", "code server", "dagster dev", "postgres")


def kind_of(cmdline: list[str]) -> str:
    text = " " + " ".join(cmdline) + " "
    return next((kind for kind, marks in KINDS if any(mark in text for mark in marks)), "other")


@dataclass
class Tick:
    at: float  # monotonic
    cpu: dict[str, float]  # kind -> CPU-s of its live processes and the children they reaped
    rss: dict[str, int]  # kind -> bytes
    slots_held: int
    sample: Sample


@dataclass
class HeadSampler:
    """Polls every `SAMPLE_S`: this process's descendants (/proc), the simulators, the ledgers, the pool's slots."""

    urls: list[str]
    ledger_root: Path
    postgres: PostgresServer
    ticks: list[Tick] = field(default_factory=list)
    # Run worker pid -> the most CPU-s seen (its own and its children's): short of its last SAMPLE_S at most.
    run_cpu: dict[int, float] = field(default_factory=dict)
    run_rss: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._kinds: dict[int, str] = {}
        self._db = psycopg2.connect(self.postgres.psql_url())
        self._db.autocommit = True

    def __enter__(self) -> HeadSampler:
        self.tick()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._db.close()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.tick()

    def tick(self) -> Tick:
        cpu: dict[str, float] = defaultdict(float)
        rss: dict[str, int] = defaultdict(int)
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                kind = self._kinds.get(process.pid) or self._kinds.setdefault(process.pid, kind_of(process.cmdline()))
                times, memory = process.cpu_times(), process.memory_info().rss
                own, reaped = times.user + times.system, times.children_user + times.children_system
                # A code server's reaped children are the run workers it started.
                cpu[kind] += own
                cpu["runs" if kind == "code server" else kind] += reaped
                rss[kind] += memory
                if kind == "runs":
                    self.run_cpu[process.pid] = max(self.run_cpu.get(process.pid, 0.0), own + reaped)
                    self.run_rss[process.pid] = max(self.run_rss.get(process.pid, 0), memory)
        states = [http_json(url + "/_sim/state") for url in self.urls]
        sample = Sample(
            time.monotonic(), [s["running"] for s in states], [s["queued"] for s in states], self._generating()
        )
        tick = Tick(sample.at, dict(cpu), dict(rss), self._slots_held(), sample)
        self.ticks.append(tick)
        return tick

    def _generating(self) -> int:
        return generating_runs(self.ledger_root) if self.ledger_root.exists() else 0

    def _slots_held(self) -> int:
        with self._db.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM concurrency_slots WHERE concurrency_key = %s AND run_id IS NOT NULL", (POOL,)
            )
            return cursor.fetchone()[0]

    def between(self, start: float, end: float) -> list[Tick]:
        return [t for t in self.ticks if start <= t.at <= end]


def cpu_used(first: Tick, last: Tick) -> dict[str, float]:
    kinds = set(first.cpu) | set(last.cpu)
    return {kind: max(0.0, last.cpu.get(kind, 0.0) - first.cpu.get(kind, 0.0)) for kind in kinds}


def peak_rss(ticks: list[Tick]) -> dict[str, int]:
    peaks: dict[str, int] = defaultdict(int)
    for tick in ticks:
        for kind, value in tick.rss.items():
            peaks[kind] = max(peaks[kind], value)
    return dict(peaks)


def idle_slot_seconds(ticks: list[Tick]) -> tuple[float, float]:
    """(slot-seconds held by runs with no request in flight, slot-seconds held): each run generating holds one slot,
    so the slots held beyond the runs generating sat idle; weighted by the time to the next tick."""
    idle = held = 0.0
    for tick, after in zip(ticks, ticks[1:]):
        dt = after.at - tick.at
        idle += max(0, tick.slots_held - tick.sample.generating) * dt
        held += tick.slots_held * dt
    return idle, held


# ---- the instance, read back from PostgreSQL ---------------------------------------------------------------


def sql(postgres: PostgresServer, query: str, params: tuple = ()) -> list[tuple]:
    with contextlib.closing(psycopg2.connect(postgres.psql_url())) as connection:
        with connection.cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchall()


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    status: str
    created: float  # Unix seconds
    ended: float | None
    backfill: str | None
    purpose: str | None
    materializations: int
    pid: int | None  # of its worker process


def run_records(postgres: PostgresServer) -> list[RunRecord]:
    rows = sql(
        postgres,
        r"""
        SELECT r.run_id, r.status, extract(epoch FROM r.create_timestamp), r.end_time,
               max(CASE WHEN t.key = 'dagster/backfill' THEN t.value END),
               max(CASE WHEN t.key = 'dflash/purpose' THEN t.value END),
               (SELECT count(*) FROM event_logs e WHERE e.run_id = r.run_id AND e.dagster_event_type = %s),
               (SELECT substring(e.event FROM 'Started process for run \(pid: ([0-9]+)\)') FROM event_logs e
                WHERE e.run_id = r.run_id AND e.dagster_event_type = 'ENGINE_EVENT'
                  AND e.event LIKE '%%Started process for run%%' LIMIT 1)
        FROM runs r LEFT JOIN run_tags t ON t.run_id = r.run_id
        GROUP BY r.run_id, r.status, r.create_timestamp, r.end_time
        """,
        (MATERIALIZATION,),
    )
    return [
        RunRecord(run_id, status, float(created), ended, backfill, purpose, materializations, pid and int(pid))
        for run_id, status, created, ended, backfill, purpose, materializations, pid in rows
    ]


def failures(postgres: PostgresServer) -> dict[str, list[str]]:
    """Run id -> what went wrong in it: its step failures, its run failure (Dagster stores it as PIPELINE_FAILURE) and
    engine events carrying an error (a launch that timed out, say), with the error's message."""
    rows = sql(
        postgres,
        "SELECT run_id, event FROM event_logs WHERE dagster_event_type IN ('STEP_FAILURE', 'PIPELINE_FAILURE') "
        "OR (dagster_event_type = 'ENGINE_EVENT' AND event LIKE '%%SerializableErrorInfo%%') ORDER BY id",
    )
    found: dict[str, list[str]] = defaultdict(list)
    for run_id, event in rows:
        record = json.loads(event)
        dagster_event = record.get("dagster_event") or {}
        error = (dagster_event.get("event_specific_data") or {}).get("error") or {}
        said = " ".join(filter(None, (dagster_event.get("message"), error.get("message"))))
        found[run_id].append(f"{record.get('step_key') or 'run'}: {said or record.get('user_message')}")
    return dict(found)


def backfill_status(postgres: PostgresServer, backfill_id: str) -> str:
    return sql(postgres, "SELECT status FROM bulk_actions WHERE key = %s", (backfill_id,))[0][0]


def materialized_partitions(postgres: PostgresServer, asset: str) -> dict[str, int]:
    """Partition -> how many materializations of `asset` the event log holds."""
    rows = sql(
        postgres,
        "SELECT partition, count(*) FROM event_logs WHERE dagster_event_type = %s AND asset_key = %s "
        "GROUP BY partition",
        (MATERIALIZATION, json.dumps([asset])),
    )
    return dict(rows)


def event_log_size(postgres: PostgresServer) -> tuple[int, int, int]:
    """(rows, bytes of their serialized events, bytes of the table with its indexes)."""
    rows, event_bytes = sql(postgres, "SELECT count(*), coalesce(sum(octet_length(event)), 0) FROM event_logs")[0]
    (table_bytes,) = sql(postgres, "SELECT pg_total_relation_size('event_logs')")[0]
    return rows, int(event_bytes), table_bytes


def pool_slots_held(postgres: PostgresServer) -> list[tuple[str, str]]:
    return sql(
        postgres, "SELECT run_id, step_key FROM concurrency_slots WHERE concurrency_key = %s AND run_id IS NOT NULL",
        (POOL,),
    )  # fmt: skip


# ---- Prometheus --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def prometheus_scraping(env: dict[str, str], scratch: Path) -> Iterator[str]:
    """`dflash metrics` on a free loopback port and a Prometheus scraping it every SCRAPE_S; yields Prometheus' URL."""
    exporter_port, prometheus_port = free_ports(2)
    config = scratch / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {SCRAPE_S}s, scrape_timeout: {SCRAPE_S}s}}\n"
        "scrape_configs:\n"
        f"  - job_name: dflash\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    processes = []
    with contextlib.ExitStack() as stack:
        for name, command in (
            ("exporter", [str(Path(DAGSTER).parent / "dflash"), "metrics", "--port", str(exporter_port)]),
            (
                "prometheus",
                [
                    str(PROMETHEUS),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={scratch / 'prometheus-data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
            ),
        ):
            log = stack.enter_context(open(scratch / f"{name}.log", "ab"))
            process = subprocess.Popen(
                command, env=env, cwd=scratch, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            processes.append(process)
            stack.callback(kill_process_group, process)
        url = f"http://127.0.0.1:{prometheus_port}"
        wait_until(lambda: _answers(url + "/-/ready"), timeout_s=60, interval_s=0.5, what="Prometheus to be ready")
        yield url


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def prometheus_query(url: str, query: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=30) as r:
        return orjson.loads(r.read())["data"]["result"]


def prometheus_matches_status(url: str, status: dict) -> dict[str, tuple[object, object]]:
    """Each figure as Prometheus answers it (after a scrape newer than `status`) and as `dflash status --json` says
    it: name -> (prometheus, status). Waits for that scrape."""
    collected = status["collected_at"]

    def fresh() -> bool:
        result = prometheus_query(url, "dflash_status_collected_timestamp_seconds")
        return bool(result) and float(result[0]["value"][1]) >= collected

    wait_until(fresh, timeout_s=SCRAPE_S * 6, interval_s=1.0, what="Prometheus to scrape after the status")

    def scalar(name: str) -> float | None:
        result = prometheus_query(url, f"dflash_{name}")
        return float(result[0]["value"][1]) if result else None

    progress, shards = status["progress"], status["shards"] or {}
    pairs: dict[str, tuple[object, object]] = {
        name: (scalar(name), progress[name])
        for name in ("events_planned", "events_done", "events_ok", "events_remaining")
    }
    pairs["shards_running"] = (scalar("shards_running"), len(progress["shards_running"] or []))
    pairs["shards_total"] = (scalar("shards_total"), shards.get("shards"))
    pairs["job_done"] = (scalar("job_done"), float(shards["done"]) if shards else None)
    by_state = {
        (r["metric"]["stage"], r["metric"]["state"]): float(r["value"][1])
        for r in prometheus_query(url, "dflash_shards")
    }
    for stage in ("completions", "training_set", "export"):
        for state, count in (shards.get(stage) or {}).items():
            pairs[f"shards{{stage={stage},state={state}}}"] = (by_state.pop((stage, state), None), count)
    for (stage, state), value in by_state.items():
        pairs[f"shards{{stage={stage},state={state}}}"] = (value, None)
    return pairs


# ---- the browser -------------------------------------------------------------------------------------------


def page_load_s(driver, url: str, shows: tuple[str, ...], artifacts: Path, name: str) -> float | None:
    """Seconds from asking for `url` until its body shows each of `shows` (the UI fetches its data after the page
    loads); None if it did not within PAGE_TIMEOUT_S."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    started = time.monotonic()
    driver.get(url)
    try:
        WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.2).until(
            lambda d: all(text in d.find_element(By.TAG_NAME, "body").text for text in shows)
        )
        return time.monotonic() - started
    except TimeoutException:
        return None
    finally:
        artifacts.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(artifacts / f"{name}.png"))
        (artifacts / f"{name}.txt").write_text(driver.find_element(By.TAG_NAME, "body").text)


def browse(base: str, backfill_id: str, last_partition: str, artifacts: Path) -> dict[str, float | None]:
    """Load times of the three pages an operator watches a backfill from."""
    pages = {
        "asset page, every partition (completions)": (
            f"{base}/assets/completions?view=partitions&partition={last_partition}",
            ("Partitions Selected", last_partition),
        ),
        # Its table of the backfill's assets, with their partitions requested, completed and failed.
        "backfill page": (f"{base}/runs/b/{backfill_id}", ("Partition selection", "completions")),
        "run_report page": (f"{base}/assets/run_report", ("6. Multi-turn",)),
    }
    with chromium_driver(1600, 1200) as driver:
        return {
            name: page_load_s(driver, url, shows, artifacts, f"page{index}")
            for index, (name, (url, shows)) in enumerate(pages.items())
        }


# ---- the rehearsal -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    shards: int
    events_per_shard: int = EVENTS_PER_SHARD
    shards_per_run: int | None = None  # DFLASH_SHARDS_PER_RUN of the runs (None: the definitions' default)
    timeout_s: float = 3600.0
    browser: bool = True
    prometheus: bool = True
    ideal: bool = True


@dataclass
class Result:
    settings: Settings
    partitions: list[str]
    events: int
    finished: bool  # the backfill ended within the timeout
    wall_s: float  # launch to the last backfill run's end (or to the timeout)
    ideal_s: float | None
    runs: list[RunRecord]
    backfill_id: str
    backfill_status: str
    launched_at: float  # Unix seconds
    cpu: dict[str, float]  # kind -> CPU-s over the backfill
    rss: dict[str, int]  # kind -> peak bytes
    run_cpu: dict[int, float]
    run_rss: dict[int, int]
    samples: list[Sample]
    idle_slot_s: float
    slot_s: float
    leaked_slots: list[tuple[str, str]]
    materialized: dict[str, dict[str, int]]  # asset -> partition -> count
    event_log: tuple[int, int, int]
    coverage: DatasetCoverage
    sensors: dict[str, str]
    failures: dict[str, list[str]]  # run id -> its failure messages
    pages: dict[str, float | None] = field(default_factory=dict)
    prometheus: dict[str, tuple[object, object]] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    # The setup (`dagster asset materialize --select raw_prompts,conversations`, its checks included): wall seconds,
    # and the load average (1 min) at its start and end.
    setup: tuple[float, float, float] = (0.0, 0.0, 0.0)
    machine_busy: float = 0.0  # share of both cores busy over the backfill, every process on the machine

    @property
    def backfill_runs(self) -> list[RunRecord]:
        return [run for run in self.runs if run.backfill == self.backfill_id]

    @property
    def other_runs(self) -> list[RunRecord]:
        """Runs launched after the backfill that are not its own: the sensors'."""
        return [run for run in self.runs if run.backfill != self.backfill_id and run.created >= self.launched_at]

    def cpu_of(self, runs: list[RunRecord]) -> float:
        """CPU-s of these runs' worker processes (sampled; a run whose worker was not seen counts 0)."""
        return sum(self.run_cpu.get(run.pid, 0.0) for run in runs)

    @property
    def runs_without_work(self) -> list[RunRecord]:
        return [run for run in self.runs if run.materializations == 0]

    def partitions_materialized_once(self) -> dict[str, list[str]]:
        """Asset -> the partitions not materialized exactly once (empty lists: all good)."""
        return {
            asset: [p for p in self.partitions if by_partition.get(p) != 1]
            + sorted(set(by_partition) - set(self.partitions))
            for asset, by_partition in self.materialized.items()
        }

    def enqueue_rate(self) -> float | None:
        created = sorted(run.created for run in self.backfill_runs)
        return len(created) / (created[-1] - self.launched_at) if created else None

    def at_cap(self) -> list[float | None]:
        row = Row("rehearsal", self.events, 0.0, self.wall_s, self.samples, [], cap=CAP)
        return [row.at_cap(server, 2) for server in range(SERVERS)]

    def generating_s(self, min_runs: int) -> float:
        row = Row("rehearsal", self.events, 0.0, self.wall_s, self.samples, [], cap=CAP)
        return sum(dt for _, dt in row.busy(min_runs))


def instance_home(path: Path) -> Path:
    path.mkdir(parents=True)
    shutil.copyfile(INSTANCE_YAML, path / "dagster.yaml")
    return path


def cpu_seconds_busy() -> tuple[float, float]:
    """(busy, total) jiffies of every core since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def ideal_s(urls: list[str], store_uri: str, s3: S3Server, shards: int, scratch: Path) -> float:
    """One dispatcher in this process over every shard's first requests (the prompts built as a run builds them)."""
    store = open_store(store_uri, s3.client)
    requests = [request for shard in shard_requests(store, scratch, shards) for request in shard]
    outcomes: list = []
    started = time.monotonic()
    asyncio.run(Dispatcher(urls).run(requests, outcomes.append))
    wall = time.monotonic() - started
    if not all(outcome.ok for outcome in outcomes) or len(outcomes) != len(requests):
        raise RuntimeError(f"ideal: {sum(not o.ok for o in outcomes)} of {len(requests)} requests failed")
    return wall


SENSORS = """
{
  sensorsOrError(repositorySelector: {repositoryLocationName: "dagster_project", repositoryName: "__repository__"}) {
    ... on Sensors { results { name sensorState { id selectorId status } } }
  }
}
"""


def sensor_states(dev: DagsterDev) -> dict[str, str]:
    return {s["name"]: s["sensorState"]["status"] for s in dev.query(SENSORS)["sensorsOrError"]["results"]}


def rehearse(settings: Settings, scratch: Path, postgres: PostgresServer, s3: S3Server) -> Result:
    """Publish the prompts, then one backfill of the shard job over every partition under `dagster dev`, measured."""
    shards = settings.shards
    partitions = layout.partition_keys(shards)
    bucket = f"rehearsal-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=bucket)
    store_uri = f"s3://{bucket}/store"
    work = scratch / "work"
    prompts = write_prompts(scratch / "prompts.jsonl", shards, settings.events_per_shard)
    with contextlib.ExitStack() as stack:
        fleet = launch_simulators(SERVERS, scratch / "fleet", FAST_PROFILE)
        stack.callback(stop_fleet, scratch / "fleet")
        env = pipeline_env(
            home=instance_home(scratch / "home"),
            store=store_uri,
            work_dir=work,
            num_shards=shards,
            endpoints=fleet.urls,
            extra={
                **postgres.env,
                **s3.env,
                "DFLASH_SOURCES": str(prompts),
                "DFLASH_FLEET_DIR": str(work / "fleet"),
                **({"DFLASH_SHARDS_PER_RUN": str(settings.shards_per_run)} if settings.shards_per_run else {}),
            },
        )
        run_cli([DAGSTER, "instance", "migrate"], env=env, cwd=scratch)  # one process makes the tables
        setup_load, setup_started = os.getloadavg()[0], time.monotonic()
        materialize(env, scratch, "raw_prompts,conversations", timeout_s=1800)
        setup = (time.monotonic() - setup_started, setup_load, os.getloadavg()[0])
        log(f"{shards} shards of {settings.events_per_shard} events published and checked in {setup[0]:.0f} s")
        pilot_started = time.monotonic()
        materialize(env, scratch, "pilot", timeout_s=1800)  # the shards generate once a pilot of their settings passed
        log(f"the pilot passed in {time.monotonic() - pilot_started:.0f} s")
        ideal = ideal_s(fleet.urls, store_uri, s3, shards, scratch) if settings.ideal else None
        if ideal is not None:
            log(f"ideal: {ideal:.1f} s")
        prometheus = stack.enter_context(prometheus_scraping(env, scratch)) if settings.prometheus else None
        sampler = stack.enter_context(HeadSampler(fleet.urls, work / "fleet", postgres))
        dev = stack.enter_context(DagsterDev.running(env, scratch, startup_timeout_s=600))
        sensors = sensor_states(dev)
        params = {
            "partitionNames": partitions,
            "assetSelection": [{"path": [asset]} for asset in SHARD_ASSETS],
            "title": "rehearsal",
        }
        busy_at_launch, launch_tick = cpu_seconds_busy(), sampler.tick()
        launched_at, load_at_launch = time.time(), os.getloadavg()[0]
        launched = dev.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
        if launched["__typename"] != "LaunchBackfillSuccess":
            raise RuntimeError(f"the backfill did not launch: {launched}")
        backfill_id = launched["backfillId"]
        log(f"backfill {backfill_id} launched over {shards} partitions")
        deadline = time.monotonic() + settings.timeout_s
        pages: dict[str, float | None] = {}
        finished = False
        while time.monotonic() < deadline:
            runs = run_records(postgres)
            done = len(materialized_partitions(postgres, "completions"))
            status = backfill_status(postgres, backfill_id)
            in_progress = [r for r in runs if r.status not in FINISHED]
            if status != "REQUESTED" and not in_progress:
                finished = True
                break
            if settings.browser and not pages and done >= BROWSE_AT * len(partitions):
                log("browsing")
                base = f"http://127.0.0.1:{dev.port}"
                pages = browse(base, backfill_id, partitions[-1], scratch / "browser")
                log(f"pages: {pages}")
            log(f"backfill {status}: {done} partitions generated, {len(in_progress)} runs in progress")
            time.sleep(PROGRESS_S)  # a progress poll for the log, not synchronization: the loop's condition decides
        end_tick = sampler.tick()
        busy_at_end = cpu_seconds_busy()
        runs = run_records(postgres)
        backfill_runs = [r for r in runs if r.backfill == backfill_id and r.ended]
        wall = (max(r.ended for r in backfill_runs) - launched_at) if finished and backfill_runs else settings.timeout_s
        pairs = final_status(env, scratch, prometheus)
        ticks = sampler.between(launch_tick.at, end_tick.at)
        idle, held = idle_slot_seconds(ticks)
        return Result(
            settings=settings,
            partitions=partitions,
            events=shards * settings.events_per_shard,
            finished=finished,
            wall_s=wall,
            ideal_s=ideal,
            runs=runs,
            backfill_id=backfill_id,
            backfill_status=backfill_status(postgres, backfill_id),
            launched_at=launched_at,
            cpu=cpu_used(launch_tick, end_tick),
            rss=peak_rss(ticks),
            run_cpu=dict(sampler.run_cpu),
            run_rss=dict(sampler.run_rss),
            samples=[t.sample for t in ticks],
            idle_slot_s=idle,
            slot_s=held,
            leaked_slots=pool_slots_held(postgres),
            materialized={asset: materialized_partitions(postgres, asset) for asset in SHARD_ASSETS},
            event_log=event_log_size(postgres),
            coverage=read_coverage(open_store(store_uri, s3.client)),
            sensors=sensors,
            failures=failures(postgres),
            pages=pages,
            prometheus=pairs,
            load=(load_at_launch, os.getloadavg()[0]),
            setup=setup,
            machine_busy=(busy_at_end[0] - busy_at_launch[0]) / max(1, busy_at_end[1] - busy_at_launch[1]),
        )


def final_status(env: dict[str, str], scratch: Path, prometheus: str | None) -> dict[str, tuple[object, object]]:
    """`dflash status --json --by-id` at the end (coverage recounted by id, into the store), and Prometheus' figures
    beside its own."""
    dflash = str(Path(DAGSTER).parent / "dflash")
    printed = run_cli([dflash, "status", "--json", "--by-id"], env=env, cwd=scratch, timeout_s=900).stdout
    status = json.loads(printed)
    return prometheus_matches_status(prometheus, status) if prometheus else {}


def log(message: str) -> None:
    print(f"{time.strftime('%X')} {message}", file=sys.stderr, flush=True)


# ---- report ------------------------------------------------------------------------------------------------


def render(result: Result) -> str:
    settings, runs = result.settings, result.backfill_runs
    partitions = len(result.partitions)
    cpu = result.cpu
    runs_cpu = result.cpu_of(runs)
    everything = sum(cpu.values())
    at_cap = result.at_cap()
    enqueue = result.enqueue_rate()
    rows, event_bytes, table_bytes = result.event_log
    not_once = result.partitions_materialized_once()
    prometheus_ok = bool(result.prometheus) and all(a == b for a, b in result.prometheus.values())
    statuses = defaultdict(int)
    for run in result.runs:
        statuses[run.status] += 1
    others = result.other_runs
    purposes = defaultdict(int)
    for run in others:
        purposes[run.purpose or "untagged"] += 1
    per_run = [result.run_cpu.get(run.pid, 0.0) for run in runs]
    mb = 1024 * 1024
    lines = [
        f"## Rehearsal: {partitions:,} partitions, one backfill through Dagster "
        f"(`python -m benchmarks.bench_rehearsal{'' if partitions == 1830 else f' --shards {partitions}'}`)",
        "",
        (
            f"{partitions:,} shard partitions of {settings.events_per_shard} single-turn events each "
            f"({result.events:,} events), answers of 48–160 tokens from {SERVERS} simulators (running cap {CAP}, "
            "4 ms per decode step): generation is not what takes the time, Dagster is. The instance is "
            "deploy/dagster-postgres.yaml on a real PostgreSQL server, the store S3 (moto's server on loopback); "
            "`dagster dev -w workspace.yaml` with the project's sensors as they ship ("
            + ", ".join(f"`{name}` {state.lower()}" for name, state in sorted(result.sensors.items()))
            + "); one `launchPartitionBackfill` of the shard job's assets "
            f"({', '.join(SHARD_ASSETS)}) over every partition, at most "
            f"{settings.shards_per_run or DEFAULT_SHARDS_PER_RUN} partitions per run (`DFLASH_SHARDS_PER_RUN`), "
            f"the `{POOL}` pool at dagster.yaml's limit. A Prometheus scrapes `dflash metrics` every "
            f"{SCRAPE_S} s. Processes are sampled from /proc every {SAMPLE_S} s (CPU: each process's own time and "
            "the children it reaped)."
        ),
        "",
        "| figure | value |",
        "|---|---:|",
        f"| setup: raw_prompts and conversations with its checks, one `dagster asset materialize` | "
        f"{result.setup[0] / 60:.1f} min (load average {result.setup[1]:.1f} → {result.setup[2]:.1f}) |",
        f"| backfill finished within {settings.timeout_s / 60:.0f} min | **{'yes' if result.finished else 'no'}** "
        f"({result.backfill_status}) |",
        f"| wall time, launch to the last backfill run's end | **{result.wall_s / 60:.1f} min** |",
    ]
    if result.ideal_s is not None:
        lines.append(
            f"| ideal: one dispatcher over the same {result.events:,} events | {result.ideal_s:.1f} s "
            f"(rehearsal: **{result.ideal_s / result.wall_s:.3f}x** the ideal's speed) |"
        )
    lines += [
        f"| backfill runs (and the sensors' runs during it) | {len(runs):,} ({len(others)}: "
        + (", ".join(f"{n} {p}" for p, n in sorted(purposes.items())) or "none")
        + ") |",
        f"| runs by status | {', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))} |",
        f"| runs enqueued per second (backfill runs / launch to the last one's creation) | "
        f"{'—' if enqueue is None else f'{enqueue:.2f}'} |",
        f"| CPU-s of the backfill's runs, per run (median, max) / per partition | {runs_cpu / max(1, len(runs)):.1f} "
        f"({statistics.median(per_run) if per_run else 0:.1f}, {max(per_run, default=0):.1f}) / "
        f"**{runs_cpu / partitions:.2f}** |",
        f"| CPU-s of the sensors' runs during it | {result.cpu_of(others):,.0f} |",
        f"| CPU-s of everything started for the job, per partition | **{everything / partitions:.2f}** "
        f"({everything:,.0f} CPU-s) |",
    ]
    for kind in ("daemon", "webserver", "code server", "dagster dev", "runs", "postgres", "moto", "simulators",
                 "prometheus", "exporter", "browser", "other"):  # fmt: skip
        if kind in cpu or kind in result.rss:
            lines.append(
                f"| {kind}: CPU-s, peak RSS (all its processes) | {cpu.get(kind, 0.0):,.0f}, "
                f"{result.rss.get(kind, 0) / mb:,.0f} MiB |"
            )
    lines += [
        f"| peak RSS of one run process | {max(result.run_rss.values(), default=0) / mb:,.0f} MiB |",
        f"| machine CPU busy over the backfill (every process, both cores) | {result.machine_busy:.0%} |",
        f"| event-log rows, bytes per partition | {rows / partitions:,.0f}, {event_bytes / partitions / 1024:,.1f} KiB "
        f"(table with indexes {table_bytes / mb:,.0f} MiB) |",
        f"| pool slots held after the end (leaked) | **{len(result.leaked_slots)}** |",
        f"| slot-seconds held without a request in flight / held | **{result.idle_slot_s:,.0f}** / "
        f"{result.slot_s:,.0f} |",
        f"| each server at its cap while ≥ 2 runs generate ({result.generating_s(2):.0f} s of it; ≥ 1 run: "
        f"{result.generating_s(1):.0f} s) | " + " / ".join("—" if v is None else f"{v:.1%}" for v in at_cap) + " |",
        f"| coverage by id at the end (`dflash status --by-id`) | "
        f"**{'exact' if result.coverage.exactly_once else 'NOT exact'}** "
        f"({result.coverage.events_recorded:,} of {result.coverage.events_planned:,} events) |",
        "| every partition of every shard asset materialized exactly once | **"
        + ("yes" if not any(not_once.values()) else "no: " + "; ".join(f"{a}: {len(p)}" for a, p in not_once.items()))
        + "** |",
        f"| runs without work (no materialization) | **{len(result.runs_without_work)}** |",
    ]
    for page, seconds in result.pages.items():
        shown = f"> {PAGE_TIMEOUT_S} s (its content did not show)" if seconds is None else f"{seconds:.1f} s"
        lines.append(f"| Chromium, {page}, load time during the backfill | {shown} |")
    if result.prometheus:
        differ = {name: pair for name, pair in result.prometheus.items() if pair[0] != pair[1]}
        lines.append(
            f"| Prometheus check: {len(result.prometheus)} figures queried against `dflash status --json` | "
            f"**{'pass' if prometheus_ok else 'FAIL: ' + str(differ)}** |"
        )
    for run_id, messages in sorted(result.failures.items())[:5]:
        said = "; ".join(m.splitlines()[0][:200].replace("|", "/") for m in messages)
        lines.append(f"| failed run {run_id[:8]} | {said} |")
    lines += [
        "",
        (
            "A slot held without a request in flight: the pool's slots held (PostgreSQL's `concurrency_slots`) beyond "
            "the runs with requests in flight (the fleet's ledger), each sample weighted by its time. At cap: the "
            "share of the time with two or more runs generating at once that each server ran its cap ('—': never "
            "two at once). "
            f"Load average (1 min) at the launch / the end: {result.load[0]:.1f} / {result.load[1]:.1f} on 2 cores "
            "(at the launch: what else the machine ran; the busy share above counts every process on it)."
        ),
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def servers() -> Iterator[tuple[PostgresServer, S3Server]]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin")
    with running_postgres(bin_dir) as postgres, running_s3_server() as s3:
        yield postgres, s3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1830, help="partitions (default 1,830: the real job's)")
    parser.add_argument("--events-per-shard", type=int, default=EVENTS_PER_SHARD)
    parser.add_argument("--shards-per-run", type=int, help="DFLASH_SHARDS_PER_RUN (default: the definitions')")
    parser.add_argument("--timeout-min", type=float, default=60.0, help="stop waiting for the backfill after this")
    parser.add_argument("--quick", action="store_true", help="print the table, write nothing")
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--result", type=Path, help="also pickle the measurements here (`--render` reads them)")
    parser.add_argument("--render", type=Path, help="only render (and write) a pickled result")
    args = parser.parse_args()
    settings = Settings(
        shards=args.shards,
        events_per_shard=args.events_per_shard,
        shards_per_run=args.shards_per_run,
        timeout_s=args.timeout_min * 60,
        browser=not args.no_browser,
    )
    if args.render:
        result = pickle.loads(args.render.read_bytes())
    else:
        with tempfile.TemporaryDirectory(prefix="bench-rehearsal-") as tmp, servers() as (postgres, s3):
            result = rehearse(settings, Path(tmp), postgres, s3)
        if args.result:
            args.result.write_bytes(pickle.dumps(result))
    markdown = render(result)
    print(markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('rehearsal', markdown)}")


if __name__ == "__main__":
    main()
