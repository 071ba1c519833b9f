"""`dflash tune`: how many requests each server should run at once, measured rather than guessed.

A sweep sends real prompts (a sample of the published conversations, rendered as generation renders them) or
synthetic prompts of the observed length, at one client concurrency per server after another, and measures
at each point the fleet's output tokens/s in steady state, the accept length, TTFT and per-request latency
(p50, p99). In launch mode the servers are restarted between server settings (caps, memory flags; for
simulators, other `SimConfig` options), and every setting gets its own concurrency sweep.

The **knee** is the smallest concurrency that reaches `knee_fraction` (95%) of the best throughput measured:
beyond it more requests in flight buy little but latency. After a coarse sweep (powers of two up to the
server's cap, the cap, and 1.25x it) the knee is narrowed by bisection between its neighbours. The report
gives the points, the knee, the flags that run there, and a chart (SVG); `write_report` keeps it in the store
(`tuning/report.json`) for `status` and the `fleet_tuning` asset.

Steady state: with C requests in flight per server and n requests per point, the window runs from the C-th
completion to the (n − C)-th, when the server still had C in flight; the tokens produced inside it (each
request's spread over its time in service) over its length are the server's rate. The fleet's rate is the
sum over servers.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dagster_project.conversations.shards import read_conversations, read_conversations_manifest
from dagster_project.conversations.turns import prompt_messages
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang import capacity
from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.storage import Store
from dagster_project.tokenizer import render_prompt_ids

REPORT_KEY = "tuning/report.json"
CHART_KEY = "tuning/throughput.svg"
MARKDOWN_KEY = "tuning/report.md"
AS_RUNNING = "as running"  # the label of the one server setting of connect mode
AS_LAUNCHED = "as launched"  # and of launch mode without a sweep


@dataclass(frozen=True)
class TuneOptions:
    """How a sweep runs (the `fleet_tuning` asset's config and `dflash tune`'s flags)."""

    concurrencies: list[int] = field(
        default_factory=list,
        metadata={"help": "Client concurrencies per server to measure; empty: powers of two up to 1.25x the cap."},
    )
    rounds: int = field(default=4, metadata={"help": "Requests per point and server: rounds x concurrency."})
    min_requests: int = field(default=8, metadata={"help": "At least this many requests per point and server."})
    knee_fraction: float = field(
        default=0.95, metadata={"help": "The knee: the least concurrency reaching this share of the best tok/s."}
    )
    refine: int = field(default=3, metadata={"help": "Extra points that narrow the knee down by bisection."})
    sample: int = field(default=256, metadata={"help": "Prompts sampled from the published conversations."})
    synthetic_prompt_tokens: int = field(
        default=0, metadata={"help": "Synthetic prompts of this many tokens instead of the conversations; 0: none."}
    )
    max_new_tokens: int = field(default=0, metadata={"help": "Answer cap per request; 0: the generation settings'."})
    ignore_eos: bool = field(
        default=False, metadata={"help": "Write max_new_tokens every time (random weights never stop by themselves)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the prompt sample."})
    request_timeout_s: float = field(default=3600.0, metadata={"help": "Seconds one request may take."})

    def __post_init__(self) -> None:
        if not 0 < self.knee_fraction <= 1 or self.rounds < 1 or self.min_requests < 1:
            raise ValueError("knee_fraction must be in (0, 1], rounds and min_requests >= 1")
        if any(c < 1 for c in self.concurrencies):
            raise ValueError(f"concurrencies must be >= 1, got {self.concurrencies}")

    def requests_per_server(self, concurrency: int) -> int:
        return max(self.min_requests, self.rounds * concurrency)


# ---- prompts --------------------------------------------------------------------------------------------------


def conversation_prompts(
    store: Store, tokenizer: Any, settings: GenerationSettings, count: int, seed: int = 0
) -> list[list[int]]:
    """Up to `count` first-turn prompts of the published conversations, rendered as generation renders them
    (chat template, thinking flags), from shards taken in a seeded random order."""
    manifest = read_conversations_manifest(store)
    if manifest is None:
        raise ValueError("no published conversations to sample prompts from: materialize `conversations`")
    rng = random.Random(seed)
    shards = list(range(manifest.num_shards))
    rng.shuffle(shards)
    prompts: list[list[int]] = []
    for shard in shards:
        conversations = list(read_conversations(store, shard))
        rng.shuffle(conversations)
        for conversation in conversations[: count - len(prompts)]:
            messages = prompt_messages(conversation, 0, [])
            prompts.append(
                render_prompt_ids(
                    tokenizer,
                    messages,
                    enable_thinking=settings.enable_thinking,
                    preserve_thinking=settings.preserve_thinking,
                    tools=conversation.tools,
                )
            )
        if len(prompts) >= count:
            break
    if not prompts:
        raise ValueError("the published conversations hold no prompt")
    return prompts


def synthetic_prompts(count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    """`count` distinct prompts of exactly `tokens` ordinary token ids (no prefix shared between them)."""
    rng = random.Random(seed)
    return [[rng.randrange(1000, 150_000) for _ in range(tokens)] for _ in range(count)]


# ---- one point ------------------------------------------------------------------------------------------------


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
) -> list[RequestRecord]:
    """`requests_per_server` requests to each endpoint, `concurrency` at a time per endpoint."""
    # Here, not at the top: `dflash status` reads this module's report without the client (aiohttp).
    from dagster_project.sglang.client import SGLangClient, SGLangError, new_session

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
                            list(prompt), dict(params), timeout=timeout_s, require_reasoning=False
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


# ---- the sweep ------------------------------------------------------------------------------------------------


def coarse_concurrencies(cap: int | None, given: Sequence[int] = ()) -> list[int]:
    """The given concurrencies, else powers of two up to the cap, the cap and 1.25x it (past the cap requests
    only queue: the point shows the plateau)."""
    if given:
        return sorted(set(given))
    top = cap or 64
    points = {1 << k for k in range(int(math.log2(top)) + 1)} | {top, math.ceil(top * 1.25)}
    return sorted(points)


def find_knee(points: Sequence[TunePoint], fraction: float) -> TunePoint | None:
    """The point with the least concurrency (then the least cap) reaching `fraction` of the best throughput."""
    usable = [p for p in points if p.output_tok_per_s > 0]
    if not usable:
        return None
    best = max(p.output_tok_per_s for p in usable)
    reaching = [p for p in usable if p.output_tok_per_s >= fraction * best]
    return min(reaching, key=lambda p: (p.concurrency, p.cap or 0, -p.output_tok_per_s))


def next_probe(points: Sequence[TunePoint], fraction: float, tolerance: float = 0.05) -> int | None:
    """The concurrency halfway between the knee and the closest measured point below it, while that gap is wider
    than `tolerance` of the knee (and one request); None once the knee is that precise."""
    knee = find_knee(points, fraction)
    if knee is None:
        return None
    below = [p.concurrency for p in points if p.concurrency < knee.concurrency]
    if not below:
        return None
    low = max(below)
    if knee.concurrency - low <= max(1, tolerance * knee.concurrency):
        return None
    return (low + knee.concurrency) // 2


@dataclass(frozen=True)
class ServerSetting:
    """One server configuration of a launch-mode sweep: a label and the options it launches with."""

    label: str
    options: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # the launch flags it stands for, for the recommendation


# Launches the fleet under a setting, yields its endpoints, stops it on exit.
Launcher = Callable[[ServerSetting], AbstractContextManager[list[str]]]


@dataclass(frozen=True)
class TuneReport:
    """A sweep's points, its knee and what to launch with."""

    created_at: float
    endpoints: list[str]
    prompts_source: str
    prompts: int
    knee_fraction: float
    points: list[TunePoint]
    knee: TunePoint | None
    best_output_tok_per_s: float
    recommended_flags: list[str]
    recommendation: str
    capacity: dict[str, str] = field(default_factory=dict)  # per server setting: `capacity.analyze(...).explain()`
    options: dict[str, Any] = field(default_factory=dict)

    def curve(self, server_setting: str | None = None) -> list[TunePoint]:
        """The points of one server setting (default: the knee's), by concurrency."""
        label = server_setting or (self.knee.server_setting if self.knee else None)
        return sorted((p for p in self.points if p.server_setting == label), key=lambda p: p.concurrency)

    def throughput_at(self, concurrency: float, server_setting: str | None = None) -> tuple[float, float | None]:
        """(output tok/s, accept length) at `concurrency`, interpolated between the measured points of one
        setting; outside the measured range, raises `LookupError`."""
        curve = self.curve(server_setting)
        for low, high in zip(curve, curve[1:] or curve):
            if low.concurrency <= concurrency <= high.concurrency:
                span = high.concurrency - low.concurrency
                weight = (concurrency - low.concurrency) / span if span else 0.0
                rate = low.output_tok_per_s + weight * (high.output_tok_per_s - low.output_tok_per_s)
                accepts = (low.accept_length, high.accept_length)
                accept = accepts[0] + weight * (accepts[1] - accepts[0]) if None not in accepts else None
                return rate, accept
        raise LookupError(f"concurrency {concurrency} is outside the measured points")


def sweep_concurrency(
    urls: Sequence[str],
    label: str,
    cap: int | None,
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    options: TuneOptions,
    *,
    api_key: str | None = None,
    log: Callable[[str], None] = print,
) -> list[TunePoint]:
    """The coarse concurrencies, then bisection towards the knee, against the servers at `urls` as they run."""
    measured: dict[int, TunePoint] = {}

    def measure(concurrency: int) -> None:
        requests = options.requests_per_server(concurrency)
        records = asyncio.run(
            run_point(
                urls, prompts, params, concurrency, requests, api_key=api_key, timeout_s=options.request_timeout_s
            )
        )
        point = summarize(records, server_setting=label, concurrency=concurrency, cap=cap)
        measured[concurrency] = point
        log(_point_line(point))

    for concurrency in coarse_concurrencies(cap, options.concurrencies):
        measure(concurrency)
    for _ in range(options.refine):
        probe = next_probe(list(measured.values()), options.knee_fraction)
        if probe is None or probe in measured:
            break
        measure(probe)
    return sorted(measured.values(), key=lambda p: p.concurrency)


def sweep(
    settings: Sequence[ServerSetting],
    prompts: Sequence[Sequence[int]],
    params: Mapping[str, Any],
    options: TuneOptions,
    *,
    endpoints: Sequence[str] = (),
    launcher: Launcher | None = None,
    api_key: str | None = None,
    prompts_source: str = "",
    log: Callable[[str], None] = print,
) -> TuneReport:
    """Measure every server setting (launched in turn by `launcher`, or the running `endpoints` as they are),
    narrow the knee down, and recommend."""
    if launcher is None and not endpoints:
        raise ValueError("nothing to tune: no endpoints and no launcher")
    points: list[TunePoint] = []
    explained: dict[str, str] = {}
    used: list[str] = list(endpoints)
    flags_of = {setting.label: setting.flags for setting in settings}
    for setting in settings or [ServerSetting(AS_RUNNING)]:
        with _serving(setting, launcher, endpoints) as urls:
            used = list(urls)
            infos = asyncio.run(_server_infos(urls, api_key))
            cap = min((c for c in map(_cap, infos) if c), default=None)
            log(f"tune [{setting.label}]: {len(urls)} servers, running cap {cap}")
            measured = sweep_concurrency(urls, setting.label, cap, prompts, params, options, api_key=api_key, log=log)
            explained[setting.label] = _explain(infos, measured)
            log(f"tune [{setting.label}]: {explained[setting.label]}")
            points += measured
    knee = find_knee(points, options.knee_fraction)
    best = max((p.output_tok_per_s for p in points), default=0.0)
    flags, text = recommend(knee, points, flags_of.get(knee.server_setting, []) if knee else [], best)
    return TuneReport(
        created_at=time.time(),
        endpoints=used,
        prompts_source=prompts_source,
        prompts=len(prompts),
        knee_fraction=options.knee_fraction,
        points=points,
        knee=knee,
        best_output_tok_per_s=best,
        recommended_flags=flags,
        recommendation=text,
        capacity=explained,
        options=asdict(options),
    )


def recommend(
    knee: TunePoint | None, points: Sequence[TunePoint], setting_flags: Sequence[str], best: float
) -> tuple[list[str], str]:
    """The SGLang launch flags that run at the knee, and a sentence saying why.

    A server runs at most its cap whatever the client sends (the dispatcher's window is the cap times its
    oversubscription), so running at the knee means a cap at the knee: `--max-running-requests`, with the radix
    cache off so that the state pool is exactly that many slots and the rest of the memory is KV pool.
    """
    if knee is None:
        return [], "no point produced output: check the servers (the report has the errors per point)"
    share = knee.output_tok_per_s / best if best else 0.0
    head = (
        f"knee at {knee.concurrency} requests per server: {knee.output_tok_per_s:,.0f} output tok/s, "
        f"{share:.0%} of the best {best:,.0f}"
    )
    flags = list(setting_flags)
    at_cap = knee.cap is not None and knee.concurrency >= knee.cap
    running = knee.cap if at_cap and knee.cap is not None else knee.concurrency
    if "--max-running-requests" in flags:
        flags[flags.index("--max-running-requests") + 1] = str(running)
    else:
        flags += ["--max-running-requests", str(running)]
    if "--radix-cache" not in flags and "--disable-radix-cache" not in flags:
        flags.insert(0, "--disable-radix-cache")
    if at_cap:
        return flags, (
            f"{head}, reached only at the servers' cap {knee.cap}: the cap binds, so more concurrency would pay "
            "if the memory allowed it (`dflash status`, question 3, says which flags raise the cap and at what cost)"
        )
    highest = max(p.concurrency for p in points if p.server_setting == knee.server_setting)
    if knee.concurrency == highest:
        return flags, (
            f"{head}, at the highest concurrency measured: throughput was still rising there, below the cap "
            f"({knee.cap if knee.cap is not None else 'unknown'}); measure higher concurrencies before settling"
        )
    return flags, (
        f"{head}; more requests at once add latency for under {1 - share:.0%} more throughput, and a cap at the knee "
        "leaves the rest of the memory to the KV pool"
    )


def _serving(
    setting: ServerSetting, launcher: Launcher | None, endpoints: Sequence[str]
) -> AbstractContextManager[list[str]]:
    """The servers of `setting`: launched for it, or the running ones as they are."""
    return launcher(setting) if launcher is not None else nullcontext(list(endpoints))


async def _server_infos(urls: Sequence[str], api_key: str | None) -> list[dict | None]:
    from dagster_project.sglang.client import SGLangClient, SGLangError, new_session

    async with new_session() as session:

        async def one(url: str) -> dict | None:
            try:
                return await SGLangClient(url, api_key, session).server_info()
            except SGLangError:
                return None

        return list(await asyncio.gather(*(one(url) for url in urls)))


def _cap(info: Mapping[str, Any] | None) -> int | None:
    states = (info or {}).get("internal_states") or [{}]
    cap = states[0].get("effective_max_running_requests_per_dp")
    return cap if isinstance(cap, int) and cap > 0 else None


def _explain(infos: Sequence[dict | None], points: Sequence[TunePoint]) -> str:
    """What binds the first server's cap at the request lengths the sweep measured."""
    info = next((i for i in infos if i), None)
    done = [p for p in points if p.requests > p.errors]
    if info is None or not done:
        return "no /server_info" if info is None else "no request finished"
    prompt = statistics.fmean(p.mean_prompt_tokens for p in done)
    output = statistics.fmean(p.mean_output_tokens for p in done)
    try:
        return capacity.analyze(info, prompt, output).explain()
    except (KeyError, TypeError, ValueError):
        return "no capacity fields in /server_info"


def _point_line(point: TunePoint) -> str:
    accept = f"{point.accept_length:.2f}" if point.accept_length else "—"
    ttft = f"{point.ttft_p50_s * 1000:.0f} ms" if point.ttft_p50_s is not None else "—"
    latency = f"{point.latency_p50_s:.2f}/{point.latency_p99_s:.2f} s" if point.latency_p50_s is not None else "—"
    return (
        f"  concurrency {point.concurrency:>4}: {point.output_tok_per_s:>10,.0f} out tok/s, "
        f"{point.req_per_s:6.2f} req/s, accept {accept}, TTFT p50 {ttft}, latency p50/p99 {latency}, "
        f"errors {point.errors}"
    )


def launch_settings_grid(
    sweeps: Mapping[str, Sequence[Any]], flag_of: Callable[[str, Any], list[str]]
) -> list[ServerSetting]:
    """Every combination of the swept option values, labelled by them; `flag_of(name, value)` gives the launch
    flags each value stands for."""
    combos: list[dict[str, Any]] = [{}]
    for name, values in sweeps.items():
        combos = [{**combo, name: value} for combo in combos for value in values]
    settings = []
    for combo in combos:
        label = ", ".join(f"{name}={value}" for name, value in combo.items()) or AS_LAUNCHED
        flags = [flag for name, value in combo.items() for flag in flag_of(name, value)]
        settings.append(ServerSetting(label, combo, flags))
    return settings


def request_params(settings: GenerationSettings, options: TuneOptions) -> dict[str, Any]:
    """The generation settings' sampling parameters, with the sweep's answer cap and `ignore_eos`."""
    params = settings.sampling_params()
    if options.max_new_tokens:
        params["max_new_tokens"] = options.max_new_tokens
    if options.ignore_eos:
        params["ignore_eos"] = True
    return params


# ---- the report -----------------------------------------------------------------------------------------------


def write_report(store: Store, report: TuneReport) -> None:
    store.put_bytes(REPORT_KEY, to_json(report))
    store.put_bytes(MARKDOWN_KEY, render_markdown(report).encode())
    store.put_bytes(CHART_KEY, render_svg(report).encode())


def write_local(report: TuneReport, directory: Path) -> Path:
    """report.json, report.md and throughput.svg in `directory`; returns the markdown's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_bytes(to_json(report))
    (directory / "throughput.svg").write_text(render_svg(report))
    markdown = directory / "report.md"
    markdown.write_text(render_markdown(report))
    return markdown


def read_report(store: Store) -> TuneReport | None:
    raw = store.get_bytes(REPORT_KEY) if store.exists(REPORT_KEY) else None
    return from_json(TuneReport, raw) if raw is not None else None


def render_markdown(report: TuneReport, chart: str = "throughput.svg") -> str:
    lines = [
        "# Fleet tuning",
        "",
        f"{len(report.endpoints)} servers, {report.prompts} prompts ({report.prompts_source}); "
        f"knee at {report.knee_fraction:.0%} of the best throughput.",
        "",
        f"**{report.recommendation}**",
        "",
    ]
    if report.recommended_flags:
        lines += [f"Launch with: `{' '.join(report.recommended_flags)}`", ""]
    for label, text in report.capacity.items():
        lines.append(f"* capacity [{label}]: {text}")
    lines += [
        "",
        f"![output tokens/s by concurrency]({chart})",
        "",
        "| server setting | concurrency | cap | output tok/s | req/s | accept length | TTFT p50 (ms) | TTFT p99 (ms) "
        "| latency p50 (s) | latency p99 (s) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report.points:
        mark = " **(knee)**" if report.knee == p else ""
        lines.append(
            f"| {p.server_setting} | {p.concurrency}{mark} | {_cell(p.cap)} | {p.output_tok_per_s:,.0f} | "
            f"{p.req_per_s:.2f} | {_cell(p.accept_length, 2)} | {_ms(p.ttft_p50_s)} | {_ms(p.ttft_p99_s)} | "
            f"{_cell(p.latency_p50_s, 2)} | {_cell(p.latency_p99_s, 2)} | {p.errors} |"
        )
    return "\n".join(lines) + "\n"


def _cell(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:,.0f}"


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def render_svg(report: TuneReport, width: int = 720, height: int = 400) -> str:
    """A line chart of output tok/s (solid) and accept length (dashed, right axis) by concurrency, one colour
    per server setting, the knee marked: plain SVG, no plotting library needed."""
    left, right, top, bottom = 70, 60, 30, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for p in report.points if p.output_tok_per_s > 0]
    max_c = max((p.concurrency for p in points), default=1) * 1.08  # room for the last point's marks
    max_t = max((p.output_tok_per_s for p in points), default=1.0) * 1.1
    max_a = max((p.accept_length or 0 for p in points), default=0.0) * 1.1 or 1.0

    def x(c: float) -> float:
        return left + plot_w * c / max_c

    def y(value: float, scale: float) -> float:
        return top + plot_h * (1 - value / scale)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">output tok/s (solid) and accept length (dashed) by client '
        "concurrency per server</text>",
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
        f'<line x1="{left + plot_w}" y1="{top}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="gray"/>',
        f'<text x="{left + plot_w / 2}" y="{height - 10}" text-anchor="middle">requests in flight per server</text>',
    ]
    for k in range(6):
        t, a, c = max_t * k / 5, max_a * k / 5, max_c * k / 5
        out.append(f'<text x="{left - 6}" y="{y(t, max_t) + 4:.1f}" text-anchor="end">{t:,.0f}</text>')
        out.append(f'<text x="{left + plot_w + 6}" y="{y(a, max_a) + 4:.1f}" fill="gray">{a:.1f}</text>')
        out.append(f'<text x="{x(c):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{c:.0f}</text>')
    settings = list(dict.fromkeys(p.server_setting for p in points))
    for index, label in enumerate(settings):
        color = _COLORS[index % len(_COLORS)]
        series = sorted((p for p in points if p.server_setting == label), key=lambda p: p.concurrency)
        path = " ".join(f"{x(p.concurrency):.1f},{y(p.output_tok_per_s, max_t):.1f}" for p in series)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [
            f'<circle cx="{x(p.concurrency):.1f}" cy="{y(p.output_tok_per_s, max_t):.1f}" r="3" fill="{color}"/>'
            for p in series
        ]
        accepts = [p for p in series if p.accept_length]
        if accepts:
            path = " ".join(f"{x(p.concurrency):.1f},{y(p.accept_length or 0, max_a):.1f}" for p in accepts)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{color}" stroke-dasharray="4 3" stroke-width="1"/>'
            )
        out.append(f'<text x="{left + 10}" y="{top + 14 + 14 * index}" fill="{color}">{_xml(label)}</text>')
    if report.knee is not None:
        kx = x(report.knee.concurrency)
        out.append(
            f'<line x1="{kx:.1f}" y1="{top}" x2="{kx:.1f}" y2="{top + plot_h}" stroke="black" stroke-dasharray="2 2"/>'
        )
        out.append(
            f'<text x="{kx - 4:.1f}" y="{top + plot_h - 6}" text-anchor="end">knee {report.knee.concurrency}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def gain(
    report: TuneReport, from_concurrency: int, to_concurrency: int
) -> tuple[float, float | None, float | None, int]:
    """Measured output tok/s at `to_concurrency` over `from_concurrency` (interpolated on the knee's setting; a
    target past the last point is taken at the last point), the accept lengths at both, and the concurrency the
    target was taken at."""
    curve = report.curve()
    if not curve:
        raise LookupError("the sweep measured nothing")
    reached = min(to_concurrency, curve[-1].concurrency)
    before, accept_before = report.throughput_at(from_concurrency)
    after, accept_after = report.throughput_at(reached)
    if not before:
        raise LookupError(f"no throughput measured at {from_concurrency}")
    return after / before, accept_before, accept_after, reached
