"""Fault-matrix soak: every fault an operator meets, injected into real shard runs; then exactly-once by id.

    python -m benchmarks.soak_faults [--prompts 3000] [--shards 12] [--kills 100] [--seed 0]

The workload: `--prompts` synthetic prompts (30% two-turn, so ~1.3 events each) built into conversations
by `dagster asset materialize`, with S3 on a moto server behind a TCP fault proxy and three simulated
SGLang servers with a latency model (a shard takes about a minute). Each fault gets shards of its own, so
its figures are its own; every shard run is `dagster asset materialize --select completions --partition
shard-NNNNN` in its own process group, rerun until it publishes:

* server faults: one server answering garbage, one hung, "NaN happened" answers, 503 bursts, a crash;
* S3 faults while the shard publishes: connections reset (proxy down), S3 hung (proxy silent);
* SIGKILL of the whole run at random moments, `--kills` times over the remaining shards.

At the end every shard's published Parquet (the objects its `_manifest.json` names, read with pyarrow
straight from moto) is compared with the event ids planned from its conversations: lost, duplicated,
stray. Requests re-sent come from the simulators' own logs (`/_sim/requests`): the same prompt hash
received more than once. Results go to RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.report import machine
from dagster_project.conversations.shards import read_conversations
from dagster_project.generation.dispatch import DispatchOptions
from dagster_project.sglang.protocol import input_hash
from dagster_project.store.storage import S3Store
from tests.support.dagster_helpers import DAGSTER, DEFS_MODULE, dagster_home, materialize, pipeline_env
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_server import running_s3_server
from tests.support.sglang_fixtures import SimFleet, wait_until

RELIABILITY_MD = Path(__file__).resolve().parents[1] / "RELIABILITY.md"
BUCKET, PREFIX = "soak", "run"
CAP = 8  # running requests per server
# ~100 tokens per answer at 0.05 s per verify step (~2.8 tokens each): ~2 s per request, so a shard of
# ~330 events on two servers of 8 takes about a minute. 48..160 tokens pass the completions gates.
SIM = {"output_len": "uniform:48:160", "max_running_requests": CAP, "decode_step_s": 0.05, "ttft_s": 0.05}
WINDOW = 2 * math.ceil(CAP * DispatchOptions().oversubscription)  # in flight per shard run on two servers
# Share of kills timed from the run's first journaled answer rather than from its process start: on a busy
# machine a run's start-up alone can outlast any fixed delay, and kills there re-send nothing.
GENERATION_KILLS = 0.8
RUN_TIMEOUT_S = 900  # one run of one shard; a run past this is a hang of the product, killed and reported
HEALTHY, FAULTY, SPARE = 0, 1, 2  # server roles; SPARE replaces FAULTY for the crash (a crashed server stays down)


@dataclass
class FaultResult:
    fault: str
    shards: list[int]
    planned: int = 0
    lost: int = 0
    duplicated: int = 0
    stray: int = 0
    errors: int = 0  # events published with status error
    resent: int = 0  # extra receptions of a prompt hash across the fleet
    kills: int = 0
    runs: int = 0  # shard runs started
    failed_runs: int = 0  # runs that exited non-zero (and were rerun)
    detect_s: float | None = None
    finish_s: float = 0.0
    note: str = ""


class RequestLogs:
    """Every request each simulator received, polled incrementally in the background, so what a server
    logged before it crashed is kept."""

    def __init__(self, urls: Sequence[str]):
        self.urls = list(urls)
        self.entries: list[list[dict]] = [[] for _ in self.urls]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            self.refresh()

    def refresh(self) -> None:
        for index, url in enumerate(self.urls):
            try:
                with urllib.request.urlopen(f"{url}/_sim/requests?since={len(self.entries[index])}", timeout=5) as r:
                    self.entries[index].extend(json.loads(r.read())["requests"])
            except OSError:  # crashed or hung: keep what it logged
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def received(self, hashes: set[str]) -> list[tuple[int, dict]]:
        """(server index, entry) of every logged request for one of `hashes` (health canaries are not)."""
        return [(i, e) for i, log in enumerate(self.entries) for e in log if e["input_hash"] in hashes]


@dataclass
class Soak:
    root: Path
    env: dict[str, str]
    fleet: SimFleet
    proxy: FaultProxy
    store: S3Store  # straight to moto: verification never goes through the fault proxy
    logs: RequestLogs
    rng: random.Random
    num_shards: int
    planned: dict[int, set[str]] = field(default_factory=dict)
    _rows: dict[int, list[dict]] = field(default_factory=dict)

    def rows(self, shard: int) -> list[dict]:
        """The published rows of a shard (read once it is published)."""
        if shard not in self._rows:
            self._rows[shard] = published_rows(self.store, shard)
        return self._rows[shard]

    def prompt_hashes(self, shard: int) -> set[str]:
        """Hashes of the shard's prompts: a second turn's prompt holds the first answer, so they are known
        only once the shard is published."""
        return {input_hash(row["prompt_ids"]) for row in self.rows(shard)}

    def endpoints(self, *servers: int) -> str:
        return ",".join(self.fleet.url(i) for i in servers)

    def start_run(self, shard: int, servers: Sequence[int], tag: str) -> subprocess.Popen:
        log = open(self.root / "runs" / f"shard{shard}-{tag}.log", "wb")  # noqa: SIM115 (closed with the run)
        command = [DAGSTER, "asset", "materialize", "-m", DEFS_MODULE, "--select", "completions"]
        process = subprocess.Popen(
            [*command, "--partition", f"shard-{shard:05d}"],
            env={**self.env, "DFLASH_SGLANG_ENDPOINTS": self.endpoints(*servers)},
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the run, its step worker and anything they start share one group
        )
        log.close()
        return process

    def operator_status(self) -> None:
        """`dflash status --dagster`, as the dead-runs alert tells the operator after a kill: it fails the dead runs
        and frees their pool slots (a SIGKILLed CLI run is ended by nothing else without a daemon; plain `status`
        reads Dagster's recorded view and changes nothing, so four dead runs held the pool's four slots for good)."""
        subprocess.run(
            [sys.executable, "-m", "dagster_project.cli", "status", "--dagster"],
            env={**self.env, "DFLASH_SGLANG_ENDPOINTS": self.endpoints(HEALTHY, FAULTY)},
            cwd=self.root,
            capture_output=True,
            check=True,
            timeout=300,
        )

    def published(self, shard: int) -> bool:
        return self.store.exists(f"completions/shard={shard:05d}/_manifest.json")

    def journaled(self, shard: int) -> int:
        """Lines in the shard's local journal (every finished attempt): how far a live run has got."""
        journals = list((self.root / "work" / "journal" / f"completions/shard={shard:05d}").glob("*.jsonl"))
        return sum(path.read_bytes().count(b"\n") for path in journals)

    def run_until_published(
        self, result: FaultResult, shard: int, servers: Sequence[int], during: Callable[[], None] | None = None
    ) -> None:
        """Runs of `shard` until one publishes; `during` injects the fault while the first run works."""
        for attempt in range(5):
            process = self.start_run(shard, servers, f"{result.fault.split()[0]}-{result.runs}")
            result.runs += 1
            if during is not None and attempt == 0:
                during()
            if process.wait(timeout=RUN_TIMEOUT_S) == 0 and self.published(shard):
                return
            result.failed_runs += 1
        raise RuntimeError(f"shard {shard} not published after 5 runs; see {self.root / 'runs'}")

    def when_journaled(self, shard: int, share: float, timeout_s: float = 600) -> None:
        target = max(1, int(share * len(self.planned[shard])))
        wait_until(lambda: self.journaled(shard) >= target, timeout_s=timeout_s, interval_s=0.1, what="progress")


# ---- one function per fault: inject it into the runs of its shard(s) --------------------------------------------


def server_fault(
    soak: Soak,
    result: FaultResult,
    faults: dict,
    *,
    at_share: float,
    servers: Sequence[int] = (HEALTHY, FAULTY),
    strikes: Callable[[], bool] | None = None,
) -> None:
    """One server (the second of `servers`) gets `faults` once the shard is `at_share` done; cleared after.
    The fault's onset is then, or when `strikes` first holds (a crash set to come after N requests)."""
    (shard,) = result.shards
    faulty = servers[1]
    onset: list[float] = []

    def inject() -> None:
        if at_share:
            soak.when_journaled(shard, at_share)
        soak.fleet.set_faults(faulty, **faults)
        if strikes is not None:
            wait_until(strikes, timeout_s=600, interval_s=0.05, what="the fault to strike")
        onset.append(time.time())

    soak.run_until_published(result, shard, servers, during=inject)
    result.detect_s = first_resend_after(soak, shard, faulty, onset[0])


def first_resend_after(soak: Soak, shard: int, faulty: int, onset: float) -> float | None:
    """Seconds from the fault's onset until work the faulty server had received first reached another server."""
    soak.logs.refresh()
    received = soak.logs.received(soak.prompt_hashes(shard))
    on_faulty = {e["input_hash"] for i, e in received if i == faulty}
    moved = [e["received_at"] for i, e in received if i != faulty and e["input_hash"] in on_faulty]
    moved = [t for t in moved if t >= onset]
    return min(moved) - onset if moved else None


def fault_garbage(soak: Soak, result: FaultResult) -> None:
    # A counted fault, so the simulator tells how many garbage answers it gave: they never reach its request
    # log, and each one is a request re-sent elsewhere.
    budget = 1_000_000
    server_fault(soak, result, {"garbage": budget}, at_share=0.0)
    result.resent = budget - soak.fleet.state(FAULTY)["faults"]["garbage"]
    served = collections.Counter(row["server"] for row in soak.rows(result.shards[0]))
    healthy = served.pop(soak.fleet.url(HEALTHY), 0)
    result.note = (
        f"{result.resent} garbage answers; {healthy} events answered by the healthy server, "
        f"{sum(served.values())} by the garbage one"
    )


def fault_hang(soak: Soak, result: FaultResult) -> None:
    server_fault(soak, result, {"hang": True}, at_share=0.25)


def fault_nan(soak: Soak, result: FaultResult) -> None:
    server_fault(soak, result, {"nan": 5}, at_share=0.25)


def fault_crash(soak: Soak, result: FaultResult) -> None:
    # The spare takes the crashing role: the healthy pair stays up for the other faults.
    crashed = lambda: not soak.fleet.alive(SPARE)  # noqa: E731
    # One running batch more: it crashes well before the shard ends, whatever the shard's size.
    server_fault(soak, result, {"crash_after_requests": CAP}, at_share=0.25, servers=(HEALTHY, SPARE), strikes=crashed)
    result.note = f"server crashed: {crashed()}"


def fault_503_bursts(soak: Soak, result: FaultResult) -> None:
    """Both servers refuse with 503 for 5 s, three times over the shard: the whole fleet's queue is full."""
    (shard,) = result.shards

    def bursts() -> None:
        for share in (0.15, 0.4, 0.65):
            soak.when_journaled(shard, share)
            for server in (HEALTHY, FAULTY):
                soak.fleet.set_faults(server, error_503_for_s=5.0)

    soak.run_until_published(result, shard, (HEALTHY, FAULTY), during=bursts)


def s3_fault(soak: Soak, result: FaultResult, fail: Callable[[], None], outage_s: float) -> None:
    """S3 fails for `outage_s` from the moment generation ends, i.e. while the shard publishes."""
    (shard,) = result.shards
    onset: list[float] = []

    def outage() -> None:
        soak.when_journaled(shard, 1.0)
        onset.append(time.time())
        fail()
        time.sleep(outage_s)  # the outage's length is the fault itself
        soak.proxy.come_back()

    soak.run_until_published(result, shard, (HEALTHY, FAULTY), during=outage)
    result.note = f"{outage_s:.0f} s outage; connections reset {soak.proxy.refused}, left hanging {soak.proxy.held}"


def fault_s3_resets(soak: Soak, result: FaultResult) -> None:
    s3_fault(soak, result, soak.proxy.go_down, outage_s=5.0)


def fault_s3_hung(soak: Soak, result: FaultResult) -> None:
    s3_fault(soak, result, soak.proxy.go_silent, outage_s=40.0)


def fault_sigkills(soak: Soak, result: FaultResult, kills: int) -> None:
    """SIGKILL to a run's whole process group at a random moment, over all of this fault's shards at once,
    each kill followed by `dflash status`; a shard whose run publishes before its kill stops taking kills.
    Every shard is then rerun to the end."""
    lock = threading.Lock()

    def kill_loop(shard: int) -> None:
        while not soak.published(shard):
            with lock:
                if result.kills >= kills:
                    return
                result.runs += 1
                tag = f"kill-{result.runs}"
            journaled_before = soak.journaled(shard)
            process = soak.start_run(shard, (HEALTHY, FAULTY), tag)
            with lock:
                during_generation = soak.rng.random() < GENERATION_KILLS
                # Short enough that the kill shards (a few hundred events each) take all the kills unpublished.
                moment_s = soak.rng.uniform(0.0, 8.0 if during_generation else 20.0)
            if during_generation:  # the clock starts at the run's first journaled answer, however slow its start
                wait_until(
                    lambda before=journaled_before, run=process: (
                        soak.journaled(shard) > before or run.poll() is not None
                    ),
                    timeout_s=RUN_TIMEOUT_S,
                    interval_s=0.1,
                    what=f"shard {shard}'s run to generate",
                )
            try:  # a random moment: start-up, generation, checkpoint or publish
                process.wait(timeout=moment_s)
                if process.returncode != 0:
                    with lock:
                        result.failed_runs += 1
                continue
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                with lock:
                    result.kills += 1
                soak.operator_status()

    with ThreadPoolExecutor(len(result.shards)) as pool:
        list(pool.map(kill_loop, result.shards))
    for shard in result.shards:
        if not soak.published(shard):
            soak.run_until_published(result, shard, (HEALTHY, FAULTY))


# ---- verification ----------------------------------------------------------------------------------------------


def published_rows(store: S3Store, shard: int) -> list[dict]:
    """The rows of every object the shard's manifest names, read with pyarrow."""
    manifest = json.loads(store.get_bytes(f"completions/shard={shard:05d}/_manifest.json"))
    rows: list[dict] = []
    for obj in manifest["objects"]:
        if obj["key"].endswith(".parquet"):
            table = pq.read_table(
                io.BytesIO(store.get_bytes(obj["key"])), columns=["event_id", "status", "server", "prompt_ids"]
            )
            rows.extend(table.to_pylist())
    return rows


def verify(soak: Soak, result: FaultResult) -> None:
    """Lost, duplicated, stray and error events of the fault's shards, and requests re-sent."""
    soak.logs.refresh()
    for shard in result.shards:
        rows = soak.rows(shard)
        ids = collections.Counter(row["event_id"] for row in rows)
        planned = soak.planned[shard]
        result.planned += len(planned)
        result.lost += len(planned - ids.keys())
        result.duplicated += sum(n - 1 for n in ids.values() if n > 1)
        result.stray += len(ids.keys() - planned)
        result.errors += sum(row["status"] != "ok" for row in rows)
        received = collections.Counter(e["input_hash"] for _, e in soak.logs.received(soak.prompt_hashes(shard)))
        result.resent += sum(n - 1 for n in received.values())
    if result.kills:
        result.note = (
            f"{result.resent / result.kills:.1f} re-sent per kill (bound: one window, {WINDOW}); "
            "`dflash status --dagster` after each kill fails the dead run and frees its pool slot"
        )


# ---- the workload ----------------------------------------------------------------------------------------------


def write_prompts(path: Path, count: int, rng: random.Random) -> None:
    """OpenAI-messages JSON Lines; 30% carry a second user turn (two generated events)."""
    words = "cache index shard queue lease token window retry publish journal manifest quorum".split()
    with path.open("w") as out:
        for i in range(count):
            topic = " ".join(rng.choices(words, k=6))
            messages = [{"role": "user", "content": f"Prompt {i}: explain {topic} in a short paragraph."}]
            if rng.random() < 0.3:
                messages += [
                    {"role": "assistant", "content": f"(reference) about {topic}."},
                    {"role": "user", "content": f"Now give an example for prompt {i}."},
                ]
            out.write(json.dumps({"id": f"soak-{i}", "messages": messages}) + "\n")


def run(args: argparse.Namespace) -> list[FaultResult]:
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="soak_faults_"))
    (root / "runs").mkdir()
    write_prompts(root / "prompts.jsonl", args.prompts, rng)
    print(f"soak in {root}", flush=True)
    with running_s3_server() as s3, SimFleet.start(3, root / "fleet", SIM) as fleet:
        s3.client().create_bucket(Bucket=BUCKET)
        proxy = FaultProxy("127.0.0.1", int(s3.endpoint.rsplit(":", 1)[1]))
        env = pipeline_env(
            home=dagster_home(root / "home"),
            store=f"s3://{BUCKET}/{PREFIX}",
            work_dir=root / "work",
            num_shards=args.shards,
            extra={**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint, "DFLASH_SOURCES": str(root / "prompts.jsonl")},
            without_pilot="the soak's shard runs meet faults it injects; a pilot would meet them first and block",
        )
        materialize(env, root, "raw_prompts,conversations", timeout_s=900)
        os.environ.update(s3.env)  # this process reads the store straight from moto
        store = S3Store(f"s3://{BUCKET}/{PREFIX}", s3.client())
        logs = RequestLogs(fleet.urls)
        soak = Soak(root, env, fleet, proxy, store, logs, rng, args.shards)
        plan(soak)
        results = inject_all(soak, args.kills, [] if args.kills_only else SCENARIOS)
        logs.close()
        proxy.close()
    return results


def plan(soak: Soak) -> None:
    """Planned event ids per shard, from the published conversations (`<conversation>#turn<k>`)."""
    for shard in range(soak.num_shards):
        soak.planned[shard] = {c.event_id(t) for c in read_conversations(soak.store, shard) for t in range(c.num_turns)}


SCENARIOS: list[tuple[str, Callable[[Soak, FaultResult], None]]] = [
    ("one server answers garbage (HTML, 200)", fault_garbage),
    ("one server hangs (health 503 after 20 s)", fault_hang),
    ('"NaN happened" answers (5)', fault_nan),
    ("503 bursts (3 × 5 s, both servers)", fault_503_bursts),
    ("server crash mid-shard", fault_crash),
    ("S3 resets during publish (proxy down)", fault_s3_resets),
    ("S3 hung during publish (proxy silent)", fault_s3_hung),
]


def inject_all(soak: Soak, kills: int, scenarios: Sequence[tuple[str, Callable]]) -> list[FaultResult]:
    results = []
    for shard, (name, scenario) in enumerate(scenarios):
        results.append(FaultResult(name, [shard]))
        timed(soak, results[-1], lambda r, s=scenario: s(soak, r))
    kill_shards = list(range(len(scenarios), soak.num_shards))
    results.append(FaultResult("SIGKILL of the run at random moments", kill_shards))
    timed(soak, results[-1], lambda r: fault_sigkills(soak, r, kills))
    return results


def timed(soak: Soak, result: FaultResult, scenario: Callable[[FaultResult], None]) -> None:
    started = time.monotonic()
    print(f"-- {result.fault} (shards {result.shards})", flush=True)
    scenario(result)
    result.finish_s = time.monotonic() - started
    for server in (HEALTHY, FAULTY, SPARE):  # the next fault starts on a clean fleet
        if soak.fleet.alive(server):
            soak.fleet.clear_faults(server)
    verify(soak, result)
    print(f"   {result}", flush=True)


# ---- the report ------------------------------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def report(results: list[FaultResult], args: argparse.Namespace, elapsed_s: float) -> str:
    events = sum(r.planned for r in results)
    lines = [
        "| fault | shards | events | lost | duplicated | stray | errors | re-sent | kills | runs (failed) "
        "| time to detect | time to finish | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.fault} | {', '.join(map(str, r.shards))} | {r.planned:,} | {r.lost} | {r.duplicated} | {r.stray} "
            f"| {r.errors} | {r.resent} | {r.kills} | {r.runs} ({r.failed_runs}) | {seconds(r.detect_s)} "
            f"| {seconds(r.finish_s)} | {r.note} |"
        )
    command = f"python -m benchmarks.soak_faults --prompts {args.prompts} --shards {args.shards} --kills {args.kills}"
    command += " --kills-only" if args.kills_only else ""
    return (
        f"`{command}`: {args.prompts:,} prompts, {events:,} planned events over {args.shards} shards, "
        f"simulated servers of {CAP} running requests (in-flight window of a shard run on two servers: {WINDOW}), "
        f"S3 on moto behind a fault proxy. The whole soak took {elapsed_s / 60:.1f} min.\n\n" + "\n".join(lines)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--shards", type=int, default=12, help=f"{len(SCENARIOS)} go to faults, the rest to kills")
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--kills-only", action="store_true", help="no other faults: every shard takes kills (a table of its own)"
    )
    parser.add_argument("--write", action="store_true", help="write the table into RELIABILITY.md")
    args = parser.parse_args()
    if args.shards <= (0 if args.kills_only else len(SCENARIOS)):
        parser.error(f"--shards must leave shards for the kills (> {len(SCENARIOS)})")
    started = time.monotonic()
    results = run(args)
    table = report(results, args, time.monotonic() - started)
    print(table)
    if args.write:
        write_table(table, "soak:kills" if args.kills_only else "soak:faults")


def write_table(table: str, section_name: str) -> None:
    """Replace a section of RELIABILITY.md (between its markers), leaving the prose around it."""
    start, end = f"<!-- {section_name} -->", f"<!-- /{section_name} -->"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = f"{start}\n{table}\n\n_Measured {stamp} on {machine()}, shared with other work._\n{end}"
    text = RELIABILITY_MD.read_text()
    before, _, rest = text.partition(start)
    RELIABILITY_MD.write_text(before + section + rest.partition(end)[2])


if __name__ == "__main__":
    main()
