"""One point of a `dflash tune` sweep: requests sent at one concurrency per server, and what they measured.

Steady state: with C requests in flight per server and n requests per point, the window runs from the C-th
completion to the (n − C)-th, when the server still had C in flight; the tokens produced inside it (each
request's spread over its time in service) over its length are the server's rate. The fleet's rate is the
sum over servers.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster_project.sglang.model_identity import ModelIdentity


@dataclass(frozen=True)
class RequestRecord:
    """One request of a sweep, as the client saw it."""

    server: str
    started: float  # monotonic seconds
    ended: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    verify_passes: int = 0  # 0: no spec-decoding stats
    ttft_s: float | None = None  # the server's first_token_latency (with --enable-metrics)
    queue_s: float = 0.0  # the server's queue_time (with --enable-metrics): waiting, not in service
    error: str | None = None  # the error kind of a failed request

    @property
    def latency_s(self) -> float:
        return self.ended - self.started


@dataclass(frozen=True)
class TunePoint:
    """What one client concurrency gave under one server setting."""

    server_setting: str
    concurrency: int  # requests in flight per server
    cap: int | None  # the servers' effective running cap (the smallest)
    servers: int
    requests: int
    errors: int
    output_tok_per_s: float  # the fleet's, in steady state
    req_per_s: float
    accept_length: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    mean_prompt_tokens: float
    mean_output_tokens: float
    window_s: float


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def steady_window(records: Sequence[RequestRecord], concurrency: int) -> tuple[float, float]:
    """The span one server had `concurrency` requests in flight after the first wave: from the
    `concurrency`-th completion to the (n − concurrency)-th. Too few requests for one: the whole run."""
    done = sorted((r for r in records if r.error is None), key=lambda r: r.ended)
    if not done:
        return 0.0, 0.0
    first, last = concurrency - 1, len(done) - concurrency - 1
    if last > first and done[last].ended > done[first].ended:
        return done[first].ended, done[last].ended
    return min(r.started for r in records), max(r.ended for r in done)


def steady_rate(records: Sequence[RequestRecord], concurrency: int) -> tuple[float, float, float]:
    """(output tokens/s, requests/s, window seconds) of one server over its steady window (`steady_window`).

    Each request's tokens are spread evenly over its time in service (after its queue time, where the server
    reports it), and the window gets the share that falls inside it: counting whole requests by their end
    instead would credit a window with work done before it, which the first synchronized wave makes
    lopsided."""
    start, end = steady_window(records, concurrency)
    if end <= start:
        return 0.0, 0.0, 0.0
    tokens = requests = 0.0
    for record in records:
        if record.error is not None:
            continue
        begun = min(record.started + record.queue_s, record.ended)
        overlap = min(end, record.ended) - max(start, begun)
        if overlap > 0:
            share = overlap / (record.ended - begun)
            tokens += record.output_tokens * share
            requests += share
    window = end - start
    return tokens / window, requests / window, window


def summarize(records: Sequence[RequestRecord], *, server_setting: str, concurrency: int, cap: int | None) -> TunePoint:
    """One point from its requests: rates summed over servers; accept length, TTFT and latency over the
    requests that ran entirely in their server's steady window (all of them when none did)."""
    by_server: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_server.setdefault(record.server, []).append(record)
    rates = [steady_rate(group, concurrency) for group in by_server.values()]
    steady = []
    for group in by_server.values():
        start, end = steady_window(group, concurrency)
        steady += [r for r in group if r.error is None and r.started >= start and r.ended <= end]
    done = steady or [r for r in records if r.error is None]
    verify = sum(r.verify_passes for r in done if r.verify_passes)
    spec_tokens = sum(r.output_tokens for r in done if r.verify_passes)
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
    latencies = [r.latency_s for r in done]
    return TunePoint(
        server_setting=server_setting,
        concurrency=concurrency,
        cap=cap,
        servers=len(by_server),
        requests=len(records),
        errors=sum(r.error is not None for r in records),
        output_tok_per_s=sum(rate for rate, _, _ in rates),
        req_per_s=sum(rate for _, rate, _ in rates),
        accept_length=spec_tokens / verify if verify else None,
        ttft_p50_s=percentile(ttfts, 0.5),
        ttft_p99_s=percentile(ttfts, 0.99),
        latency_p50_s=percentile(latencies, 0.5),
        latency_p99_s=percentile(latencies, 0.99),
        mean_prompt_tokens=statistics.fmean(r.prompt_tokens for r in done) if done else 0.0,
        mean_output_tokens=statistics.fmean(r.output_tokens for r in done) if done else 0.0,
        window_s=max((window for _, _, window in rates), default=0.0),
    )


async def run_point(
    endpoints: Sequence[str],
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    concurrency: int,
    requests_per_server: int,
    *,
    api_key: str | None = None,
    timeout_s: float = 3600.0,
    expected_model: ModelIdentity | None = None,
    check_timeout_s: float = 60.0,
) -> list[RequestRecord]:
    """`requests_per_server` requests to each endpoint, `concurrency` at a time per endpoint.

    Nothing is sent before every endpoint is found to serve `expected_model` (`served_model.check_endpoints`: a
    `ServedModelMismatch` otherwise); then no prompt holding an id outside its vocabulary is sent, and an answer that
    breaks the answer contract is a failed request (its kind recorded), never a measurement."""
    # Here, not at the top: `dflash status` reads this module's report without the client (aiohttp).
    from dagster_project.generation.served_model import check_endpoints
    from dagster_project.sglang.client import SGLangClient, SGLangError, new_session

    served = await check_endpoints(endpoints, expected_model, api_key, check_timeout_s)
    records: list[RequestRecord] = []
    async with new_session() as session:

        async def server(index: int, url: str) -> None:
            client = SGLangClient(url, api_key, session)
            issued = iter(range(requests_per_server))

            async def worker() -> None:
                for number in issued:
                    prompt = prompts[(index * requests_per_server + number) % len(prompts)]
                    started = time.monotonic()
                    try:
                        result = await client.generate(
                            list(prompt), dict(params), timeout=timeout_s, require_reasoning=False, served=served
                        )
                    except SGLangError as error:
                        records.append(RequestRecord(url, started, time.monotonic(), len(prompt), error=error.kind))
                        continue
                    meta = result.meta_info
                    records.append(
                        RequestRecord(
                            url,
                            started,
                            time.monotonic(),
                            result.prompt_tokens,
                            result.completion_tokens,
                            result.spec_verify_ct or 0,
                            _seconds(meta.get("first_token_latency")),
                            _seconds(meta.get("queue_time")) or 0.0,
                        )
                    )

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await asyncio.gather(*(server(index, url) for index, url in enumerate(endpoints)))
    return records


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None
