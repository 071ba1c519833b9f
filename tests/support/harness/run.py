"""One job through every stage, in process: its inputs written (locally and to moto), `ingest_to_store`,
`build_conversations`, `generate_shard` on a simulator fleet with the job's fault, `assemble_shard`; then what the
fleet itself recorded (each server's request log and `sglang:generation_tokens_total`) is collected for the checks.

Faults are injected when the fleet shows the shard under way (a server's request log), never after a sleep.
"""

from __future__ import annotations

import functools
import gzip
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster_aws.s3 import S3Resource

from dagster_project.conversations.stage import build_conversations
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.line_hold import Hold, LineHeld, put_hold, release_hold
from dagster_project.generation.served_model import ExpectedModel
from dagster_project.generation.stage import generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ingest.stage import ingest_to_store
from dagster_project.resources.store import DatasetStore
from dagster_project.store.storage import LocalStore, Store
from dagster_project.tokenizer import load_tokenizer, special_ids, tokenizer_identity
from dagster_project.training.gates import GateThresholds
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.stage import assemble_shard
from dagster_project.training.watch_figures import AnswerQualityWatch
from tests.support.fault_proxy import FaultProxy
from tests.support.harness.answer_proxy import AnswerProxy
from tests.support.harness.jobs import Fault, Job
from tests.support.s3_server import S3Server
from tests.support.sglang_fixtures import SimFleet, generation_tokens_total, wait_until

MAX_NEW_TOKENS = 128
FIT_MAX_LENGTH = 200  # with fit on: long prompts are not sent, some answers are cut where the trainer cuts
# Answers long enough for the gates (48-96 tokens), a little decode time (so a fault finds requests in flight),
# /metrics on, hangs found in 0.5 s.
SIM_OPTIONS: dict[str, Any] = {
    "output_len": "uniform:48:96",
    "decode_step_s": 0.002,
    "max_running_requests": 4,
    "enable_metrics": True,
    "health_check_timeout_s": 0.5,
    "tool_call_share": 0.3,
}
# The dispatcher as the fault tests run it: probes and watchdog in seconds, not minutes.
DISPATCH = DispatchOptions(
    probe_interval_s=0.2,
    watchdog_s=1.0,
    canary_timeout_s=3.0,
    max_probe_backoff_s=0.5,
    probe_timeout_s=5.0,
    fleet_down_grace_s=30.0,
    load_read_interval_s=0.2,
)
# Every server is checked to serve the job's model before its first request, as the fleet resource does.
EXPECTED_MODEL = ExpectedModel().identity()
FAULTY_SERVER = 1
BREAK_EVERY = 3  # the broken-answers proxy breaks every third job answer of its server
FAULT_WAIT_S = 60.0
# How long a hung server's originals may take to be aborted by rid once they are re-sent (at once, when kept),
# while the other servers run this many times slower (their answers take seconds).
ABORT_GRACE_S = 2.0
HEDGE_SLOWDOWN = 40.0


MAX_SERVERS = 3  # the shared fleet's size; a job uses its first `Job.servers`


class FleetPool:
    """One simulator fleet shared by the jobs (starting one costs seconds on a loaded machine): each job starts
    with its faults cleared and reads only its own part of the request logs and counters (`ServerMark`); a fleet
    a job killed a server of is replaced at the next job."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.fleet: SimFleet | None = None
        self.starts = 0

    def fleet_for_job(self) -> SimFleet:
        if self.fleet is not None and not all(self.fleet.alive(i) for i in range(MAX_SERVERS)):
            self.fleet.stop()
            self.fleet = None
        if self.fleet is None:
            self.starts += 1
            self.fleet = SimFleet.start(MAX_SERVERS, self.run_dir / f"fleet{self.starts}", SIM_OPTIONS)
        for index in range(MAX_SERVERS):
            self.fleet.clear_faults(index)
        return self.fleet

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()


@dataclass(frozen=True)
class ServerMark:
    """Where a shared server's request log and token counter stood when the job began."""

    logged: int
    tokens: float

    @classmethod
    def now(cls, fleet: SimFleet, index: int) -> ServerMark:
        return cls(len(fleet.requests(index)), generation_tokens_total(fleet.url(index)))

    def record(self, fleet: SimFleet, index: int, killed: bool = False) -> ServerRecord:
        """The job's part of the server's log and count (once it has settled every request it holds)."""
        wait_until(lambda: _idle(fleet, index), timeout_s=FAULT_WAIT_S, what=f"server {index} to settle its requests")
        tokens = generation_tokens_total(fleet.url(index)) - self.tokens
        return ServerRecord(fleet.url(index), fleet.requests(index, self.logged), tokens, killed)


def _idle(fleet: SimFleet, index: int) -> bool:
    state = fleet.state(index)
    return state["running"] == 0 and state["queued"] == 0


@dataclass
class ServerRecord:
    url: str  # the simulator itself (a proxy may stand between it and the dispatcher)
    requests: list[dict]  # its request log (probes included)
    generated_tokens: float  # its sglang:generation_tokens_total
    killed: bool = False


@dataclass
class JobRun:
    job: Job
    root: Path
    store: Store
    settings: GenerationSettings
    assembly: AssemblyOptions
    uris: dict[str, str]  # input file name → the URI ingest read it from
    servers: list[ServerRecord] = field(default_factory=list)
    answer_proxy: AnswerProxy | None = None
    failures: list[str] = field(default_factory=list)  # a stage or the harness raised
    refused_while_held: bool = False
    # HANG_AND_RECOVER: the rids of the hung server's requests that were re-sent elsewhere, and when it came back.
    resent_rids: set[str] = field(default_factory=set)
    recovered_at: float | None = None
    s3_refused: int = 0  # S3_OUTAGE: the store's connections reset by the outage
    seconds: float = 0.0
    started_wall: float = field(default_factory=time.time)
    phases: dict[str, float] = field(default_factory=dict)  # seconds each part of the job took

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - started, 2)


def _write_inputs(job: Job, root: Path, s3: S3Server, bucket: str) -> dict[str, str]:
    uris = {}
    client = s3.client()
    for file in job.files:
        data = "".join(row.line + "\n" for row in file.rows).encode()
        if file.noise_bytes:
            data = random.Random(job.seed).randbytes(file.noise_bytes)
        elif file.name.endswith(".gz"):
            data = gzip.compress(data)
            if "broken" in file.name:
                data = data[: len(data) * 2 // 3]  # cut short mid-stream
        if file.on_s3:
            key = f"inputs/{file.name}"
            client.put_object(Bucket=bucket, Key=key, Body=data)
            uris[file.name] = f"s3://{bucket}/{key}"
        else:
            path = root / "inputs" / file.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            uris[file.name] = str(path)
    return uris


class _FaultInjector:
    """Injects the job's fault from a thread once the shard is under way; `stop()` ends it however far it got."""

    def __init__(self, run: JobRun, fleet: SimFleet, marks: list[ServerMark], s3_proxy: FaultProxy | None):
        self.run, self.fleet, self.marks, self.s3_proxy = run, fleet, marks, s3_proxy
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._inject, daemon=True)
        self.killed_record: ServerRecord | None = None

    def __enter__(self) -> _FaultInjector:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=FAULT_WAIT_S)

    def _when(self, predicate: Callable[[], Any], what: str) -> bool:
        """Wait for `predicate` (True) or the end of generation (False)."""
        wait_until(lambda: self.stopping.is_set() or predicate(), timeout_s=FAULT_WAIT_S * 5, what=what)
        return not self.stopping.is_set() or bool(predicate())

    def _inject(self) -> None:
        try:
            self._fault(self.run.job.fault)
        except Exception:  # the harness itself broke: a failure of the job, named
            self.run.failures.append("fault injection: " + traceback.format_exc(limit=3))

    def _requests(self, index: int) -> list[dict]:
        """The job's requests at a server so far (no probes)."""
        return self.fleet.job_requests(index, self.marks[index].logged)

    def _fault(self, fault: Fault) -> None:
        fleet, index, servers = self.fleet, FAULTY_SERVER, range(self.run.job.servers)
        if fault is Fault.KILL:
            if not self._when(lambda: len(self._requests(index)) >= 3, "requests at the server to kill"):
                return
            fleet.set_faults(index, hang=True)  # nothing more finishes: its counters are final
            mark = self.marks[index]
            self.killed_record = ServerRecord(
                fleet.url(index),
                fleet.requests(index, mark.logged),
                generation_tokens_total(fleet.url(index)) - mark.tokens,
                killed=True,
            )
            fleet.kill(index)
        elif fault is Fault.HANG_AND_RECOVER:

            def busy() -> bool:
                return any(e["outcome"] == "pending" for e in self._requests(index))

            if not self._when(busy, "requests in flight at the server to hang"):
                return
            # Every server slows down first: the requests in flight at the one to hang stay there, and no re-sent
            # request can win elsewhere (and have its original aborted as the loser) before the hung server comes
            # back: only an abort at re-sending reaches it in time.
            others = [i for i in servers if i != index]
            for server in servers:
                fleet.set_faults(server, slow=HEDGE_SLOWDOWN)
            fleet.set_faults(index, hang=True)
            pending = {e["rid"]: e["input_hash"] for e in self._requests(index) if e["outcome"] == "pending"}

            def resent() -> set[str]:
                elsewhere = {e["input_hash"] for i in others for e in self._requests(i)}
                return {rid for rid, prompt in pending.items() if prompt in elsewhere}

            self._when(resent, "the hung server's requests sent to another server")
            proxy = self.run.answer_proxy
            assert proxy is not None
            try:  # each original is aborted by its rid when it is re-sent (kept running: never)
                wait_until(lambda: resent() <= set(proxy.aborts), timeout_s=ABORT_GRACE_S, what="originals aborted")
            except AssertionError:
                pass  # what the check reports
            self.run.resent_rids, self.run.recovered_at = resent(), time.time()
            for server in servers:
                fleet.clear_faults(server)  # it comes back, its requests still there
            # ... and still slow: its originals must not outrun the dispatcher's re-probe, which aborts them by rid
            # as the server answers again (on a loaded machine the probe comes seconds later).
            fleet.set_faults(index, slow=HEDGE_SLOWDOWN)
        elif fault is Fault.S3_OUTAGE:
            proxy = self.s3_proxy
            assert proxy is not None
            if not self._when(lambda: sum(len(self._requests(i)) for i in servers) >= 4, "requests under way"):
                return
            proxy.go_down()
            self._when(lambda: proxy.refused >= 2, "the store to meet the outage")
            proxy.come_back()
            self.run.s3_refused = proxy.refused


def _watch(tokenizer: Any, settings: GenerationSettings) -> AnswerQualityWatch:
    return AnswerQualityWatch(special_ids(tokenizer), tokenizer.decode, settings=settings, thresholds=GateThresholds())


def _open_store(job: Job, root: Path, bucket: str, endpoint: str) -> Store:
    if not job.store_on_s3:
        return LocalStore(root / "store")
    return DatasetStore(
        root=f"s3://{bucket}/runs/seed{job.seed}",
        work_dir=str(root / "store_work"),
        s3=S3Resource(endpoint_url=endpoint),
        attempts=6,
        backoff_s=0.2,
    ).open()


def run_job(job: Job, root: Path, s3: S3Server, bucket: str, tokenizer: Any, fleets: FleetPool) -> JobRun:
    """Run `job` under `root` (a fresh directory), its S3 objects in `bucket` on `s3`, on the pool's fleet. The
    store is reached through a TCP proxy (the S3 outage's), and handed back for the checks reaching S3 directly."""
    started = time.perf_counter()
    os.environ.update(s3.env)
    settings = GenerationSettings(
        max_new_tokens=MAX_NEW_TOKENS, policy=job.policy, fit_max_length=FIT_MAX_LENGTH if job.fit else None
    )
    assembly = AssemblyOptions(max_length=FIT_MAX_LENGTH) if job.fit else AssemblyOptions()
    host, port = s3.endpoint.removeprefix("http://").split(":")
    s3_proxy = FaultProxy(host, int(port))
    try:
        store = _open_store(job, root, bucket, s3_proxy.endpoint)
        run = JobRun(job, root, store, settings, assembly, _write_inputs(job, root, s3, bucket))
        _run_stages(run, s3, s3_proxy, tokenizer, fleets)
    finally:
        s3_proxy.close()
    run.store = _open_store(job, root, bucket, s3.endpoint)
    run.seconds = time.perf_counter() - started
    return run


def _run_stages(run: JobRun, s3: S3Server, s3_proxy: FaultProxy, tokenizer: Any, fleets: FleetPool) -> None:
    job, store, work = run.job, run.store, run.root / "work"
    try:
        with run.phase("ingest"):
            ingest_to_store(
                store, [run.uris[f.name] for f in job.files], work_dir=work, s3_client=functools.cache(s3.client)
            )
        with run.phase("conversations"):
            build_conversations(
                store,
                load_tokenizer=load_tokenizer,
                tokenizer=tokenizer_identity(tokenizer),
                settings=run.settings,
                num_shards=job.num_shards,
                work_dir=work,
            )
    except Exception:
        run.failures.append("preparing conversations: " + traceback.format_exc(limit=4))
        return
    with run.phase("fleet start"):
        fleet = fleets.fleet_for_job()
    marks = [ServerMark.now(fleet, index) for index in range(job.servers)]
    endpoints = list(fleet.urls[: job.servers])
    special = special_ids(tokenizer)
    if job.fault in (Fault.BROKEN_ANSWERS, Fault.GENERATE_HANGS, Fault.HANG_AND_RECOVER):
        run.answer_proxy = AnswerProxy(
            fleet.url(FAULTY_SERVER),
            tokenizer.decode,
            special.eos_ids[0],
            break_every=BREAK_EVERY if job.fault is Fault.BROKEN_ANSWERS else 0,
            hang_generate=job.fault is Fault.GENERATE_HANGS,
        )
        endpoints[FAULTY_SERVER] = run.answer_proxy.start()
    try:
        with _FaultInjector(run, fleet, marks, s3_proxy) as injector:
            _generate_and_assemble(run, endpoints, tokenizer, work)
        for index, mark in enumerate(marks):
            if injector.killed_record is not None and index == FAULTY_SERVER:
                run.servers.append(injector.killed_record)
            else:
                run.servers.append(mark.record(fleet, index))
    finally:
        if run.answer_proxy is not None:
            run.answer_proxy.close()


def _generate_and_assemble(run: JobRun, endpoints: list[str], tokenizer: Any, work: Path) -> None:
    job, store = run.job, run.store
    for shard in range(job.num_shards):
        try:
            if job.hold and shard == 0:
                put_hold(store, _harness_hold())
                try:
                    generate_shard(
                        store, shard, tokenizer=tokenizer, settings=run.settings,
                        dispatcher=Dispatcher(endpoints, DISPATCH, expected_model=EXPECTED_MODEL), work_dir=work,
                    )  # fmt: skip
                except LineHeld:
                    run.refused_while_held = True
                release_hold(store, by="harness", reason="the harness's rehearsed hold")
            with run.phase("generate"):
                generate_shard(
                    store,
                    shard,
                    tokenizer=tokenizer,
                    settings=run.settings,
                    dispatcher=Dispatcher(endpoints, DISPATCH, expected_model=EXPECTED_MODEL),
                    work_dir=work,
                    watch=_watch(tokenizer, run.settings),
                )
            with run.phase("assemble"):
                assemble_shard(store, shard, run.assembly, run.root / "staging")
        except Exception:
            run.failures.append(f"shard {shard}: " + traceback.format_exc(limit=4))


def _harness_hold() -> Hold:
    return Hold(
        gate="harness_rehearsal",
        message="a hold the harness puts before generation and releases",
        figure=0.0,
        threshold=0.0,
        sample_size=0,
        scope="fleet",
        held_at=time.time(),
    )
