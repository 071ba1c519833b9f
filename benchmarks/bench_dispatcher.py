"""Dispatcher benchmark: (a) does every server stay at its running cap, (b) how many requests/s on one core.

    python -m benchmarks.bench_dispatcher [--quick]

(a) Saturation. Four simulated servers with a running cap of 16 and a latency model (prefill, decode
    steps, long-tailed output lengths). Measured on each server, over a steady-state window: the share of
    time it runs exactly `cap` requests. Baseline in the same run: the best simple client, workers pinned
    per server at the dispatcher's window (each loops: take a request, send it to its server, record).
(b) Throughput. Zero-latency simulators answering 2,000-token responses, pinned to the last core; the
    dispatcher pinned to the first core. Baseline in the same run: a minimal raw aiohttp loop (fixed
    concurrency, POST, parse, nothing else) against the same servers. The dispatcher's own CPU time per
    request gives its single-core capacity even where the simulators, sharing one core, are the limit.
(c) Faults. Two servers; a fixed batch of requests; a few seconds in, one server hangs (no progress, /health
    failing) or answers garbage (HTML bodies). The pinned simple client next to the dispatcher: who finishes
    every request, and when.
(d) Runs sharing a fleet. Four clients at once against two servers, each sized on its own (pinned workers at
    the full window) next to four dispatchers sharing one ledger: peak in flight per server and time at cap.

Results go to the `dispatcher` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from benchmarks.report import write_section
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
from dagster_project.generation.ledger import FleetLedger
from dagster_project.sglang.client import SGLangClient, SGLangError, new_session
from dagster_project.sglang.launch import Fleet, launch_simulators, stop_fleet
from dagster_project.sglang.protocol import sampling_params

PARAMS = sampling_params(max_new_tokens=8192)
SATURATION_CAP = 16
SATURATION_SERVERS = 4
SATURATION_SIM = {
    "max_running_requests": SATURATION_CAP,
    "ttft_s": 0.02,
    "prefill_s_per_token": 0.00002,
    "decode_step_s": 0.01,
    "output_len": "lognormal:150:0.6",
    "max_output_len": 600,
}
THROUGHPUT_CAP = 64
THROUGHPUT_OVERSUBSCRIPTION = DispatchOptions().oversubscription
THROUGHPUT_IN_FLIGHT = math.ceil(THROUGHPUT_CAP * THROUGHPUT_OVERSUBSCRIPTION)
THROUGHPUT_SERVERS = 2
THROUGHPUT_SIM = {"max_running_requests": THROUGHPUT_CAP, "output_len": "fixed:2000"}


def prompt(i: int, length: int = 200) -> list[int]:
    return [1000 + (i * 7 + j) % 50000 for j in range(length)]


def endless_requests(stop: asyncio.Event) -> Iterator[GenRequest]:
    for i in itertools.count():
        if stop.is_set():
            return
        yield GenRequest(f"req{i}", prompt(i), PARAMS)


def http_json(method: str, url: str, body: dict | None = None) -> dict:
    import urllib.request

    data = orjson.dumps(body) if body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=10) as response:
        return orjson.loads(response.read())


# ---- (a) saturation ---------------------------------------------------------------------------------------


@dataclass
class Saturation:
    name: str
    at_cap: list[float]  # per server, share of the window spent at the cap
    mean_running: list[float]
    requests_per_s: float
    tokens_per_s: float


WINDOW = math.ceil(SATURATION_CAP * DispatchOptions().oversubscription)


async def pinned_workers(
    urls: list[str],
    requests: Iterator[GenRequest],
    record: Callable[[int], None],
    lost: Callable[[], None] = lambda: None,
    window: int = WINDOW,
) -> None:
    """Baseline: the best simple client: `window` workers pinned to each server, each looping (take a request,
    send it to its server, record). An error is recorded as a lost request; nothing is retried."""
    async with new_session() as session:

        async def worker(client: SGLangClient) -> None:
            for request in requests:
                try:
                    result = await client.generate(request.input_ids, request.sampling_params)
                except SGLangError:
                    lost()
                    continue
                record(result.completion_tokens)

        clients = [SGLangClient(url, session=session) for url in urls]
        await asyncio.gather(*(worker(client) for client in clients for _ in range(window)))


async def simple_client(urls: list[str], stop: asyncio.Event, record: Callable[[int], None]) -> None:
    await pinned_workers(urls, endless_requests(stop), record)


async def dispatched(
    urls: list[str], stop: asyncio.Event, record: Callable[[int], None], oversubscription: float
) -> None:
    def on_outcome(outcome: Outcome) -> None:
        if outcome.ok:
            record(outcome.result.completion_tokens)

    await Dispatcher(urls, DispatchOptions(oversubscription=oversubscription)).run(endless_requests(stop), on_outcome)


async def measure_saturation(
    fleet: Fleet, name: str, client: Callable[..., Awaitable[None]], warmup_s: float, window_s: float, **options
) -> Saturation:
    stop = asyncio.Event()
    done = {"requests": 0, "tokens": 0}

    def record(tokens: int) -> None:
        done["requests"] += 1
        done["tokens"] += tokens

    running = asyncio.create_task(client(fleet.urls, stop, record, **options))
    await asyncio.sleep(warmup_s)  # the measurement window opens once every server has filled up
    for url in fleet.urls:
        await asyncio.to_thread(http_json, "POST", url + "/_sim/state?reset_occupancy=1")
    before = dict(done)
    await asyncio.sleep(window_s)
    states = [await asyncio.to_thread(http_json, "GET", url + "/_sim/state") for url in fleet.urls]
    after = dict(done)
    stop.set()
    await running
    occupancy = [state["occupancy"] for state in states]
    window = occupancy[0]["window_s"]
    return Saturation(
        name=name,
        at_cap=[o["at_cap_fraction"] for o in occupancy],
        mean_running=[o["mean_running"] for o in occupancy],
        requests_per_s=(after["requests"] - before["requests"]) / window,
        tokens_per_s=(after["tokens"] - before["tokens"]) / window,
    )


def run_saturation(run_dir: Path, warmup_s: float, window_s: float) -> list[Saturation]:
    fleet = launch_simulators(SATURATION_SERVERS, run_dir, SATURATION_SIM)
    try:
        return [
            asyncio.run(
                measure_saturation(
                    fleet,
                    f"baseline: simple client, {WINDOW} workers pinned per server",
                    simple_client,
                    warmup_s,
                    window_s,
                )
            ),
            asyncio.run(
                measure_saturation(
                    fleet,
                    "dispatcher, window = cap (oversubscription 1.0)",
                    dispatched,
                    warmup_s,
                    window_s,
                    oversubscription=1.0,
                )
            ),
            asyncio.run(
                measure_saturation(
                    fleet,
                    f"dispatcher, default window = {DispatchOptions().oversubscription} x cap",
                    dispatched,
                    warmup_s,
                    window_s,
                    oversubscription=DispatchOptions().oversubscription,
                )
            ),
        ]
    finally:
        stop_fleet(run_dir)


# ---- (b) throughput ---------------------------------------------------------------------------------------


@dataclass
class Throughput:
    name: str
    requests_per_s: float
    cpu_per_request_us: float
    core_utilization: float  # CPU time of this process / wall time

    @property
    def single_core_capacity(self) -> float:
        return 1e6 / self.cpu_per_request_us


async def raw_loop(urls: list[str], count: int) -> None:
    """Baseline: the least a client can do: fixed concurrency per server, POST, parse the JSON, count."""
    bodies = [orjson.dumps({"input_ids": prompt(i, 256), "sampling_params": PARAMS}) for i in range(256)]
    remaining = iter(range(count))
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker(url: str) -> None:
            for i in remaining:
                async with session.post(url + "/generate", data=bodies[i % 256], headers=headers) as response:
                    body = orjson.loads(await response.read())
                assert len(body["output_ids"]) == 2000

        await asyncio.gather(*(worker(url) for url in urls for _ in range(THROUGHPUT_IN_FLIGHT)))


async def dispatcher_loop(urls: list[str], count: int) -> None:
    requests = (GenRequest(f"req{i}", prompt(i, 256), PARAMS) for i in range(count))
    tokens = 0

    def on_outcome(outcome: Outcome) -> None:
        nonlocal tokens
        tokens += outcome.result.completion_tokens

    await Dispatcher(urls).run(requests, on_outcome)  # the default window: THROUGHPUT_IN_FLIGHT per server
    assert tokens == 2000 * count


def measure_throughput(
    name: str, client: Callable[[list[str], int], Awaitable[None]], urls: list[str], count: int, repeats: int
) -> Throughput:
    """Median of `repeats` runs (other work on the machine adds noise)."""
    runs = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        asyncio.run(client(urls, count))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        runs.append(Throughput(name, count / wall, cpu / count * 1e6, cpu / wall))
    return sorted(runs, key=lambda run: run.requests_per_s)[len(runs) // 2]


def run_throughput(run_dir: Path, count: int, repeats: int) -> tuple[list[Throughput], str]:
    cores = sorted(os.sched_getaffinity(0))
    client_core, server_cores = {cores[0]}, {cores[-1]} if len(cores) > 1 else {cores[0]}
    placement = f"dispatcher on core {cores[0]}, {THROUGHPUT_SERVERS} simulator processes on core {cores[-1]}"
    os.sched_setaffinity(0, server_cores)  # the simulators inherit this affinity
    try:
        fleet = launch_simulators(THROUGHPUT_SERVERS, run_dir, THROUGHPUT_SIM)
    finally:
        os.sched_setaffinity(0, client_core)
    try:
        results = [
            measure_throughput("baseline: raw aiohttp loop", raw_loop, fleet.urls, count, repeats),
            measure_throughput("dispatcher", dispatcher_loop, fleet.urls, count, repeats),
        ]
    finally:
        stop_fleet(run_dir)
        os.sched_setaffinity(0, set(cores))
    return results, placement


# ---- (c) faults ------------------------------------------------------------------------------------------

FAULT_SERVERS = 2
FAULT_SIM = {**SATURATION_SIM, "health_check_timeout_s": 3.0}  # SGLang's is 20 s; shorter keeps the run short
FAULT_REQUESTS = 800
FAULT_AT_S = 3.0
FAULT_DEADLINE_S = 90.0
FAULT_OPTIONS = DispatchOptions(probe_interval_s=1.0)
FAULTS = {"hang": "hangs (nothing progresses, /health fails)", "garbage": "answers HTML error pages"}


@dataclass
class FaultRun:
    fault: str
    client: str
    ok: int
    lost: int  # ended without an answer
    unfinished: int  # still waiting at the deadline
    wall_s: float | None  # None: not done by the deadline


async def fault_run(urls: list[str], fault: str, client: str) -> FaultRun:
    requests = [GenRequest(f"req{i}", prompt(i), PARAMS) for i in range(FAULT_REQUESTS)]
    counts = Counter()

    def on_outcome(outcome: Outcome) -> None:
        counts["ok" if outcome.ok else "lost"] += 1

    async def inject() -> None:
        await asyncio.sleep(FAULT_AT_S)
        await asyncio.to_thread(http_json, "POST", urls[-1] + "/_sim/faults", {fault: True})

    if client == "simple":
        work = pinned_workers(urls, iter(requests), lambda _: counts.update(["ok"]), lambda: counts.update(["lost"]))
    else:
        work = Dispatcher(urls, FAULT_OPTIONS).run(requests, on_outcome)
    started, wall = time.monotonic(), None
    try:
        await asyncio.wait_for(asyncio.gather(work, inject()), FAULT_DEADLINE_S)
        wall = time.monotonic() - started
    except TimeoutError:
        pass
    finally:
        await asyncio.to_thread(http_json, "DELETE", urls[-1] + "/_sim/faults")
    unfinished = FAULT_REQUESTS - counts["ok"] - counts["lost"]
    return FaultRun(fault, client, counts["ok"], counts["lost"], unfinished, wall)


def run_faults(run_dir: Path) -> list[FaultRun]:
    fleet = launch_simulators(FAULT_SERVERS, run_dir, FAULT_SIM)
    try:
        return [
            asyncio.run(fault_run(fleet.urls, fault, client)) for fault in FAULTS for client in ("simple", "dispatcher")
        ]
    finally:
        stop_fleet(run_dir)


# ---- (d) runs sharing a fleet -------------------------------------------------------------------------------

SHARING_RUNS = 4
SHARING_REQUESTS = 300  # per run


@dataclass
class Sharing:
    name: str
    wall_s: float
    finished_s: list[float]  # when each run ended, from the start
    peak_in_flight: list[int]  # per server: running + queued peaks
    at_cap: list[float]


async def sharing_run(urls: list[str], shared: Path | None) -> Sharing:
    for url in urls:
        await asyncio.to_thread(http_json, "POST", url + "/_sim/state?reset_occupancy=1")
    started = time.monotonic()
    finished: list[float] = []

    async def one_run(index: int) -> None:
        requests = [
            GenRequest(f"run{index}-req{i}", prompt(index * SHARING_REQUESTS + i), PARAMS)
            for i in range(SHARING_REQUESTS)
        ]
        if shared is None:
            await pinned_workers(urls, iter(requests), lambda _: None)
        else:
            ended = 0

            def on_outcome(outcome: Outcome) -> None:
                nonlocal ended
                ended += 1

            dispatcher = Dispatcher(urls, ledger=FleetLedger(shared))
            await dispatcher.run(requests, on_outcome, remaining=lambda: SHARING_REQUESTS - ended)
        finished.append(time.monotonic() - started)

    await asyncio.gather(*(one_run(index) for index in range(SHARING_RUNS)))
    wall = time.monotonic() - started
    states = [await asyncio.to_thread(http_json, "GET", url + "/_sim/state") for url in urls]
    name = (
        f"baseline: {SHARING_RUNS} simple clients, each {WINDOW} workers pinned per server"
        if shared is None
        else f"{SHARING_RUNS} dispatchers sharing one ledger"
    )
    return Sharing(
        name,
        wall,
        sorted(finished),
        [s["peaks"]["running"] + s["peaks"]["queued"] for s in states],
        [s["occupancy"]["at_cap_fraction"] for s in states],
    )


def run_sharing(run_dir: Path) -> list[Sharing]:
    fleet = launch_simulators(FAULT_SERVERS, run_dir, SATURATION_SIM)
    try:
        return [asyncio.run(sharing_run(fleet.urls, None)), asyncio.run(sharing_run(fleet.urls, run_dir / "ledger"))]
    finally:
        stop_fleet(run_dir)


# ---- report ---------------------------------------------------------------------------------------------


def render(
    saturation: list[Saturation],
    window_s: float,
    throughput: list[Throughput],
    placement: str,
    count: int,
    repeats: int,
    faults: list[FaultRun],
    sharing: list[Sharing],
) -> str:
    lines = [
        "## Dispatcher (`python -m benchmarks.bench_dispatcher`)",
        "",
        (
            f"**(a) Saturation.** {SATURATION_SERVERS} simulated servers, running cap {SATURATION_CAP} each, prefill "
            f"{SATURATION_SIM['ttft_s'] * 1000:.0f} ms + 20 us/prompt token, "
            f"{SATURATION_SIM['decode_step_s'] * 1000:.0f} ms "
            "per decode step (MTP: ~2.8 tokens per step), output lengths lognormal (median 150 tokens). Share of a "
            f"{window_s:.0f} s steady-state window that each server spent running exactly its cap (target: >= 98%)."
        ),
        "",
        "| client | at cap, worst server | at cap, per server | mean running / cap | requests/s | output tokens/s |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for run in saturation:
        per_server = " / ".join(f"{share:.1%}" for share in run.at_cap)
        running = statistics.mean(run.mean_running) / SATURATION_CAP
        lines.append(
            f"| {run.name} | **{min(run.at_cap):.1%}** | {per_server} | {running:.1%} | "
            f"{run.requests_per_s:.0f} | {run.tokens_per_s:,.0f} |"
        )
    baseline, dispatcher = throughput
    lines += [
        "",
        (
            f"**(b) Throughput.** {count:,} requests of 256 prompt tokens, zero-latency simulators answering "
            f"2,000-token responses (running cap {THROUGHPUT_CAP}, {THROUGHPUT_IN_FLIGHT} in flight per server for "
            f"both clients); {placement}. Median of {repeats} runs. The wall rate is bounded by the simulators, which "
            "share one core; the CPU time per request is the client's own cost, so `1 / CPU per request` is what "
            "one core can sustain (target: >= 1,000 requests/s)."
        ),
        "",
        "| client | requests/s (wall) | output tokens/s | CPU per request | client core busy | one-core capacity |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in (baseline, dispatcher):
        lines.append(
            f"| {run.name} | **{run.requests_per_s:,.0f}** | {run.requests_per_s * 2000:,.0f} | "
            f"{run.cpu_per_request_us:.0f} us | "
            f"{run.core_utilization:.0%} | {run.single_core_capacity:,.0f} req/s |"
        )
    lines += [
        "",
        (
            "Dispatcher overhead over the raw loop: "
            f"{dispatcher.cpu_per_request_us - baseline.cpu_per_request_us:+.0f} us "
            "of CPU per request (typed errors, windows, failover bookkeeping, exactly-once delivery)."
        ),
        "",
        (
            f"**(c) A server fails mid-run.** {FAULT_SERVERS} servers as in (a) (health check timeout 3 s instead of "
            f"SGLang's 20 s), {FAULT_REQUESTS:,} requests; {FAULT_AT_S:.0f} s in, the second server's fault is set. "
            f"Deadline {FAULT_DEADLINE_S:.0f} s."
        ),
        "",
        "| the second server | client | answered | lost (error) | still waiting at the deadline | wall (s) |",
        "|---|---|---:|---:|---:|---:|",
        *(
            f"| {FAULTS[run.fault]} | {'simple client (pinned workers)' if run.client == 'simple' else 'dispatcher'} "
            f"| {run.ok} | {run.lost} | {run.unfinished} | {'—' if run.wall_s is None else f'{run.wall_s:.1f}'} |"
            for run in faults
        ),
        "",
        (
            f"**(d) Runs sharing a fleet.** {SHARING_RUNS} clients at once, {SHARING_REQUESTS} requests each, against "
            f"{FAULT_SERVERS} servers as in (a) (window {WINDOW} = cap x {DispatchOptions().oversubscription}). "
            "Peak in flight = the server's peak running + peak queued; at cap over the whole run, tails included."
        ),
        "",
        "| clients | wall (s) | runs ended at (s) | peak in flight per server | at cap per server |",
        "|---|---:|---|---|---|",
        *(
            f"| {run.name} | {run.wall_s:.1f} | {' / '.join(f'{t:.1f}' for t in run.finished_s)} | "
            f"{' / '.join(map(str, run.peak_in_flight))} | {' / '.join(f'{a:.1%}' for a in run.at_cap)} |"
            for run in sharing
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short windows, for a smoke run")
    args = parser.parse_args()
    warmup_s, window_s = (2.0, 5.0) if args.quick else (4.0, 20.0)
    count, repeats = (3000, 1) if args.quick else (12000, 3)
    with tempfile.TemporaryDirectory(prefix="bench-dispatcher-") as scratch:
        saturation = run_saturation(Path(scratch) / "a", warmup_s, window_s)
        throughput, placement = run_throughput(Path(scratch) / "b", count, repeats)
        faults = run_faults(Path(scratch) / "c")
        sharing = run_sharing(Path(scratch) / "d")
    markdown = render(saturation, window_s, throughput, placement, count, repeats, faults, sharing)
    print(markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('dispatcher', markdown)}")


if __name__ == "__main__":
    main()
