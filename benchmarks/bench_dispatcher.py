"""Dispatcher benchmark: (a) does every server stay at its running cap, (b) how many requests/s on one core.

    python -m benchmarks.bench_dispatcher [--quick]

(a) Saturation. Four simulated servers with a running cap of 16 and a latency model (prefill, decode
    steps, long-tailed output lengths). Measured on each server, over a steady-state window: the share of
    time it runs exactly `cap` requests. Baseline in the same run: a naive client with a fixed global
    concurrency equal to the fleet's total cap, spreading requests round robin.
(b) Throughput. Zero-latency simulators answering 2,000-token responses, pinned to the last core; the
    dispatcher pinned to the first core. Baseline in the same run: a minimal raw aiohttp loop (fixed
    concurrency, POST, parse, nothing else) against the same servers. The dispatcher's own CPU time per
    request gives its single-core capacity even where the simulators, sharing one core, are the limit.

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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from benchmarks.report import write_section
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
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


def http_json(method: str, url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
        return orjson.loads(response.read())


# ---- (a) saturation ---------------------------------------------------------------------------------------


@dataclass
class Saturation:
    name: str
    at_cap: list[float]  # per server, share of the window spent at the cap
    mean_running: list[float]
    requests_per_s: float
    tokens_per_s: float


async def naive_round_robin(urls: list[str], stop: asyncio.Event, record: Callable[[int], None]) -> None:
    """Baseline: a fixed number of workers (the fleet's total cap), each sending to the next server in turn."""
    servers = itertools.cycle(urls)
    requests = endless_requests(stop)
    async with new_session() as session:
        clients = {url: SGLangClient(url, session=session) for url in urls}

        async def worker() -> None:
            for request in requests:
                try:
                    result = await clients[next(servers)].generate(request.input_ids, request.sampling_params)
                except SGLangError:
                    continue
                record(result.completion_tokens)

        await asyncio.gather(*(worker() for _ in range(len(urls) * SATURATION_CAP)))


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
                    "baseline: fixed concurrency (= total cap), round robin",
                    naive_round_robin,
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


# ---- report ---------------------------------------------------------------------------------------------


def render(
    saturation: list[Saturation],
    window_s: float,
    throughput: list[Throughput],
    placement: str,
    count: int,
    repeats: int,
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
    markdown = render(saturation, window_s, throughput, placement, count, repeats)
    print(markdown)
    if not args.quick:
        print(f"\nwritten to {write_section('dispatcher', markdown)}")


if __name__ == "__main__":
    main()
