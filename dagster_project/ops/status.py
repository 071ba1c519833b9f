"""The six operator questions, answered from the store (heartbeats, manifests, plan) and the live fleet.

1. progress vs the plan   2. MTP on and its accept length   3. concurrency and what caps it
4. storage                5. coverage of the dataset          6. multi-turn handling

`collect_status` reads the store and the fleet once (`Readings`), then answers each question with its own
function and dataclass; `Status` holds the six. `render_text` prints them for the `status` command, one
function per question, and `dataclasses.asdict(status)` is the `--json` output and the report asset's
metadata. Both come from the same answers, so the UI and the terminal agree.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from dagster_project.conversations.shards import (
    ConversationsManifest,
    ConversationsShardManifest,
    SourceTotals,
    read_conversations_manifest,
)
from dagster_project.generation.fleet_registry import NodeRecord
from dagster_project.generation.heartbeat import ACTIVE_STATES, read_heartbeats, run_is_alive
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ingest.shards import RawPromptsManifest, read_raw_prompts_manifest
from dagster_project.ops.alerts import (
    DEFAULT_THRESHOLDS,
    NO_PRICE,
    Alert,
    AlertThresholds,
    CostAnswer,
    FleetCost,
    answer_cost,
    raise_alerts,
    render_alerts,
    render_cost,
)
from dagster_project.ops.coverage import DatasetCoverage, read_coverage
from dagster_project.ops.plan import Plan, read_plan
from dagster_project.ops.tune import TuneReport, gain, read_report
from dagster_project.sglang import capacity
from dagster_project.sglang.launch import fleet_status
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS
from dagster_project.store.manifest import read_published_manifests
from dagster_project.store.storage import Store


def probe_fleet(endpoints: list[str], api_key: str | None = None) -> dict[str, dict[str, Any]]:
    return {probe["url"]: probe for probe in fleet_status(endpoints, api_key)} if endpoints else {}


@dataclass(frozen=True)
class Readings:
    """Everything the answers are computed from, read once from the store and the fleet."""

    now: float
    num_shards: int
    raw: RawPromptsManifest | None
    conversations: ConversationsManifest | None
    events_planned: int
    published: dict[int, CompletionsShardManifest]
    heartbeats: list[Heartbeat]
    # What each server says about itself (`launch.fleet_status`), keyed by URL.
    fleet: dict[str, dict[str, Any]]
    plan: Plan | None
    coverage_by_id: DatasetCoverage | None
    tuning: TuneReport | None = None  # the last `dflash tune` / fleet_tuning sweep

    @property
    def live(self) -> list[Heartbeat]:
        """The heartbeats of shard runs running now."""
        return [b for b in self.heartbeats if run_is_alive(b, self.now)]

    @property
    def dead(self) -> list[Heartbeat]:
        """Shard runs that say `running` but whose process is gone (killed): they will never finish."""
        return [b for b in self.heartbeats if b.state in ACTIVE_STATES and not run_is_alive(b, self.now)]

    @property
    def live_unpublished(self) -> list[Heartbeat]:
        """Running shards whose work is not yet counted in a published manifest."""
        return [b for b in self.live if b.shard not in self.published]


def take_readings(store: Store, endpoints: list[str], *, api_key: str | None, now: float) -> Readings:
    """A few requests whatever the shard count, made side by side: the shards' manifests and the finished runs'
    heartbeats come from the store's index (`store.object_index`), not one object each, and the other records and
    the fleet's probes are read meanwhile. Checking the stored shards themselves (listing, checksums) is the
    coverage check's work (`ops.coverage`), which reads every object anyway."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        conversations = pool.submit(read_conversations_manifest, store)
        manifests = pool.submit(read_published_manifests, store, COMPLETIONS, CompletionsShardManifest)
        raw = pool.submit(read_raw_prompts_manifest, store)
        heartbeats = pool.submit(read_heartbeats, store)
        fleet = pool.submit(probe_fleet, endpoints, api_key)
        plan = pool.submit(read_plan, store)
        coverage_by_id = pool.submit(read_coverage, store)
        tuning = pool.submit(read_report, store)
        stage = conversations.result()
        shards = stage.num_shards if stage else 0  # as published: the environment has no say
        # The stage manifest is written last: while it is missing, the shards published so far tell the plan.
        events_planned = (stage.turns if stage else 0) or sum(
            m.turns
            for s, m in read_published_manifests(store, CONVERSATIONS, ConversationsShardManifest).items()
            if s < shards
        )
        return Readings(
            now=now,
            num_shards=shards,
            raw=raw.result(),
            conversations=stage,
            events_planned=events_planned,
            published={s: m for s, m in manifests.result().items() if s < shards},
            heartbeats=heartbeats.result(),
            fleet=fleet.result(),
            plan=plan.result(),
            coverage_by_id=coverage_by_id.result(),
            tuning=tuning.result(),
        )


# 1. progress ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeadRun:
    """A shard run that stopped without saying so (killed): its heartbeat says running, its process is gone."""

    shard: int
    run_id: str | None
    host: str
    pid: int
    last_heartbeat_at: float
    # True: its process was looked for on this host and is gone; False: judged by missed heartbeats.
    process_checked: bool


@dataclass(frozen=True)
class ProgressAnswer:
    events_planned: int
    events_done: int
    events_remaining: int
    fraction_done: float
    shards_running: list[int]
    shards_dead: list[int]
    dead_runs: list[DeadRun]
    window_req_per_s: float
    window_output_tok_per_s: float
    lifetime_req_per_s: float
    lifetime_output_tok_per_s: float
    avg_output_tokens: float | None
    eta_hours: float | None
    lifetime_span_hours: float
    plan: Plan | None
    plan_eta_hours: float | None
    events_ok: int | None = None  # answers generated without error (published, and running shards' so far)
    # Shards whose last run failed and which are not published: they need another run.
    shards_failed: list[int] = field(default_factory=list)


def _covered_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def answer_progress(readings: Readings) -> ProgressAnswer:
    """Published shards are exact; running shards report through their heartbeats."""
    published, running, beats = readings.published.values(), readings.live_unpublished, readings.heartbeats
    done = sum(m.rows for m in published) + sum(b.done_events for b in running)
    output_tokens = sum(m.output_tokens for m in published) + sum(b.output_tokens for b in running)
    ok_events = sum(m.ok for m in published) + sum(b.ok_events for b in running)
    window_tok_s = sum(b.window.output_tok_per_s for b in readings.live)
    # Lifetime: every shard run that reported, over the time some shard was generating (gaps between runs,
    # when nothing ran, do not dilute the rate).
    span = _covered_seconds([(b.started_at, b.updated_at) for b in beats])
    avg_output = output_tokens / ok_events if ok_events else None
    remaining = max(readings.events_planned - done, 0)
    eta_s = remaining * avg_output / window_tok_s if avg_output and window_tok_s else None
    plan = readings.plan
    return ProgressAnswer(
        events_planned=readings.events_planned,
        events_done=done,
        events_remaining=remaining,
        fraction_done=done / readings.events_planned if readings.events_planned else 0.0,
        shards_running=sorted(b.shard for b in readings.live),
        shards_dead=sorted(b.shard for b in readings.dead),
        dead_runs=[
            DeadRun(b.shard, b.run_id, b.host, b.pid, b.updated_at, bool(b.pid) and b.host == socket.gethostname())
            for b in sorted(readings.dead, key=lambda b: b.shard)
        ],
        window_req_per_s=sum(b.window.req_per_s for b in readings.live),
        window_output_tok_per_s=window_tok_s,
        lifetime_req_per_s=sum(b.done_events - b.resumed_events for b in beats) / span if span else 0.0,
        lifetime_output_tok_per_s=sum(b.output_tokens for b in beats) / span if span else 0.0,
        avg_output_tokens=avg_output,
        eta_hours=eta_s / 3600 if eta_s else None,
        lifetime_span_hours=span / 3600,
        plan=plan,
        plan_eta_hours=plan.eta_hours(remaining) if plan else None,
        events_ok=ok_events,
        shards_failed=sorted(b.shard for b in beats if b.state == "failed" and b.shard not in readings.published),
    )


def render_progress(progress: ProgressAnswer, now: float) -> list[str]:
    p = progress
    lines = [
        "1. Progress vs estimates",
        f"   events {_fmt(p.events_done)}/{_fmt(p.events_planned)} ({p.fraction_done:.1%}), "
        f"shards running {p.shards_running or 'none'}",
        "   rate: "
        + (
            f"window {_fmt(p.window_req_per_s, 2)} req/s, {_fmt(p.window_output_tok_per_s)} out tok/s; "
            if p.shards_running
            else "no shard running now; "
        )
        + f"lifetime {_fmt(p.lifetime_req_per_s, 2)} req/s, {_fmt(p.lifetime_output_tok_per_s)} out tok/s "
        f"over {_fmt(p.lifetime_span_hours * 60, 1)} min of generation",
        f"   avg output tokens {_fmt(p.avg_output_tokens)}; ETA {_fmt(p.eta_hours, 2)} h",
    ]
    for dead in p.dead_runs:
        how = "its process is gone" if dead.process_checked else "no heartbeat for"
        lines.append(
            f"   DEAD: shard {dead.shard} (run {dead.run_id or '—'}, {dead.host} pid {dead.pid}): {how}"
            + ("" if dead.process_checked else f" {now - dead.last_heartbeat_at:,.0f} s")
            + " — it will not finish; materialize the shard again (it resumes from its journal)"
        )
    if p.plan:
        lines.append(
            f"   plan ({p.plan.source}): {p.plan.req_per_s} req/s, {p.plan.avg_output_tokens} avg out tokens, "
            f"{p.plan.output_tok_per_s} out tok/s → ETA {_fmt(p.plan_eta_hours, 2)} h for what remains"
        )
    return lines


# 2. MTP (speculative decoding) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MtpAnswer:
    speculative_algorithm: dict[str, str | None]
    mtp_on: bool
    accept_length_window: float | None
    accept_length_published_shards: float | None
    server_avg_spec_accept_length: dict[str, float | None]


def answer_mtp(readings: Readings) -> MtpAnswer:
    """What each server runs, and the accept length measured on our own requests."""
    spec_tokens = sum(b.spec.window_spec_tokens for b in readings.live)
    spec_verify = sum(b.spec.window_verify_passes for b in readings.live)
    window_accept = spec_tokens / spec_verify if spec_verify else None
    lifetime_accepts = [
        accept
        for m in readings.published.values()
        if (accept := m.generation.spec.accept_length_lifetime)  # None or 0: the shard had no spec stats
    ]
    published_accept = sum(lifetime_accepts) / len(lifetime_accepts) if lifetime_accepts else None
    algorithms = {url: s.get("speculative_algorithm") for url, s in readings.fleet.items() if s.get("healthy")}
    return MtpAnswer(
        speculative_algorithm=algorithms,
        mtp_on=bool(algorithms) and all(algorithms.values()),
        accept_length_window=window_accept,
        accept_length_published_shards=published_accept,
        server_avg_spec_accept_length={url: s.get("avg_spec_accept_length") for url, s in readings.fleet.items()},
    )


def render_mtp(mtp: MtpAnswer) -> list[str]:
    algorithms = ", ".join(f"{url} {name or 'OFF'}" for url, name in mtp.speculative_algorithm.items())
    servers = ", ".join(f"{url} {_fmt(accept, 2)}" for url, accept in mtp.server_avg_spec_accept_length.items())
    return [
        "2. MTP (speculative decoding)",
        f"   algorithm per server: {algorithms or 'no server reachable'}",
        f"   accept length: window {_fmt(mtp.accept_length_window, 2)}, published shards "
        f"{_fmt(mtp.accept_length_published_shards, 2)}, servers' own average: {servers or '—'}",
    ]


# 3. concurrency ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerCapacity:
    """What binds a server's cap and what would raise it (`capacity.analyze` of its /server_info)."""

    explanation: str  # "cap 22 per server, bound by mamba state slots (...); ...; `flags` → est. ×3.1"
    cap: int
    bound: str  # the binding resource
    allowed_by: dict[str, int]  # the concurrency each resource allows on its own
    headroom: float  # concurrency under the best numerics-preserving flags over now
    flags: list[str]  # those flags
    expected_gain: str  # the estimate, and what a `dflash tune` sweep measured, if one did
    tokens_per_request: float
    lengths: str  # where the prompt and output lengths come from


@dataclass(frozen=True)
class ServerConcurrency:
    """One server: the dispatcher's window and requests in flight next to the server's own cap and queue."""

    client_window: int | None
    in_flight: int | None
    effective_cap: int | None
    cap_flag: int | None
    running: float | None
    queued: float | None
    token_usage: float | None
    mamba_usage: float | None
    limited_by: str
    capacity: ServerCapacity | None = None
    capacity_error: str | None = None  # why there is no capacity answer (no /server_info fields, a router)


@dataclass(frozen=True)
class ConcurrencyAnswer:
    servers: dict[str, ServerConcurrency] = field(default_factory=dict)
    lengths: str = ""  # the request lengths the capacity answers assume, and their source


EXPECTED_LENGTHS = "expected lengths (no completions yet)"
NO_FLEET = "no server known: start a fleet (`dflash fleet up`) or set DFLASH_SGLANG_ENDPOINTS"


def observed_lengths(readings: Readings) -> tuple[float, float, str]:
    """Mean prompt and output tokens per request: from the published completions and the running shards'
    heartbeats; before any, the lengths a launch is sized for."""
    published, running = list(readings.published.values()), readings.live_unpublished
    prompts = sum(m.prompt_tokens for m in published) + sum(b.prompt_tokens for b in running)
    outputs = sum(m.output_tokens for m in published) + sum(b.output_tokens for b in running)
    rows = sum(m.rows for m in published) + sum(b.ok_events for b in running)
    ok = sum(m.ok for m in published) + sum(b.ok_events for b in running)
    if not rows or not ok:
        return capacity.EXPECTED_PROMPT_TOKENS, capacity.EXPECTED_OUTPUT_TOKENS, EXPECTED_LENGTHS
    return prompts / rows, outputs / ok, f"observed over {ok:,} answers"


def server_capacity(
    server: dict[str, Any], prompt: float, output: float, lengths: str, tuning: TuneReport | None
) -> ServerCapacity:
    """`capacity.analyze` of the server's probed /server_info fields, with the gain a tuning sweep measured."""
    report = capacity.analyze(server["server_info"], prompt, output)
    best = report.best
    flags = list(best.flags) if best is not None else []
    raises = best is not None and report.headroom >= capacity.MEANINGFUL_HEADROOM
    estimate = f"est. ×{report.headroom:.1f} output tok/s at the same step time" if raises else "none"
    explanation = report.explain("expected" if lengths == EXPECTED_LENGTHS else "observed")
    if raises:
        explanation += " output tok/s"
        measured = _measured_gain(tuning, report.concurrency, best.concurrency)
        if measured:
            explanation += f" ({measured})"
            estimate += f"; {measured}"
    return ServerCapacity(
        explanation=explanation,
        cap=report.cap,
        bound=report.bound.value,
        allowed_by={resource.value: limit for resource, limit in report.limits.items()},
        headroom=report.headroom,
        flags=flags,
        expected_gain=estimate,
        tokens_per_request=report.tokens_per_request,
        lengths=lengths,
    )


def _measured_gain(tuning: TuneReport | None, now: int, then: int) -> str:
    """What the last tuning sweep measured between these concurrencies (empty without a sweep that covers them)."""
    if tuning is None:
        return ""
    try:
        ratio, accept_now, accept_then, reached = gain(tuning, now, then)
    except LookupError:
        return ""
    text = f"dflash tune measured ×{ratio:.1f}"
    if reached < then:
        text += f" up to {reached}, the most it ran"
    if accept_now and accept_then:
        text += f"; accept length falls from {accept_now:.1f} to {accept_then:.1f}"
    return text


# What raises a hybrid model's cap, for a server whose /server_info does not say enough to be more precise.
_CAPACITY_FLAGS = (
    "--disable-radix-cache with --max-running-requests N (one state slot per request instead of five), "
    "--mamba-full-memory-ratio (with the radix cache on), a bf16 --mamba-ssm-dtype or an fp8 --kv-cache-dtype"
)


def _limit_reason(
    server: dict[str, Any], window: int | None, in_flight: int | None, fix: ServerCapacity | None = None
) -> str:
    """What caps this server's batch now, and so what it would take to run 4-8x more at once."""
    cap, running, queued = server.get("max_running_requests"), server.get("running"), server.get("queued")
    flag = server.get("max_running_requests_flag")
    if not server.get("healthy"):
        return "unreachable"
    if cap is None or running is None:
        return "unknown (no /server_info cap or /metrics)"
    memory = (
        f"the mamba state pool caps it at {cap}, below --max-running-requests {flag}"
        if flag and cap < flag
        else f"its cap is {cap}"
    )
    if running >= cap and (queued or 0) > 0:
        if fix is not None and fix.flags and fix.headroom >= capacity.MEANINGFUL_HEADROOM:
            higher = f"`{' '.join(fix.flags)}` ({fix.expected_gain})"
        else:
            higher = _CAPACITY_FLAGS
        return (
            f"server memory: {memory}, {queued:.0f} queued behind it. More client concurrency only grows the queue; "
            f"to go higher: {higher}"
        )
    if window is not None and in_flight is not None and in_flight >= window and running < cap:
        return f"the client window ({window}): raise the fleet resource's oversubscription"
    if (queued or 0) == 0 and running < cap:
        return f"not enough work in flight ({memory}; idle server or the tail of a shard)"
    return f"balanced at the cap ({memory})"


def answer_concurrency(readings: Readings) -> ConcurrencyAnswer:
    """The dispatcher's view (heartbeats) next to the servers' own (/server_info, /metrics), and per server what
    binds its cap at the observed request lengths and what would raise it."""
    windows: Counter = Counter()
    in_flight: Counter = Counter()
    for beat in readings.live:
        for url, view in beat.servers.items():
            windows[url] += int(view.get("window") or 0)
            in_flight[url] += int(view.get("in_flight") or 0)
    prompt, output, lengths = observed_lengths(readings)
    servers = {}
    for url in sorted(set(readings.fleet) | set(windows)):
        server = readings.fleet.get(url, {"healthy": False})
        window, flying = (windows[url], in_flight[url]) if url in windows else (None, None)
        fix, problem = None, None
        if server.get("server_info"):
            try:
                fix = server_capacity(server, prompt, output, lengths, readings.tuning)
            except (KeyError, TypeError, ValueError) as exc:
                problem = f"/server_info lacks capacity fields ({exc!r})"
        else:
            problem = server.get("error") or "no /server_info (a router, or unreachable)"
        servers[url] = ServerConcurrency(
            client_window=window,
            in_flight=flying,
            effective_cap=server.get("max_running_requests"),
            cap_flag=server.get("max_running_requests_flag"),
            running=server.get("running"),
            queued=server.get("queued"),
            token_usage=server.get("token_usage"),
            mamba_usage=server.get("mamba_usage"),
            limited_by=_limit_reason(server, window, flying, fix),
            capacity=fix,
            capacity_error=problem,
        )
    return ConcurrencyAnswer(servers, f"{prompt:,.0f} prompt + {output:,.0f} output tokens per request, {lengths}")


def render_concurrency(concurrency: ConcurrencyAnswer) -> list[str]:
    lines = ["3. Concurrency (client window / in flight / server cap / running / queued → what limits it)"]
    if not concurrency.servers:
        lines.append(f"   {NO_FLEET}")
    for url, row in concurrency.servers.items():
        lines.append(
            f"   {url}: {_fmt(row.client_window)} / {_fmt(row.in_flight)} / {_fmt(row.effective_cap)} / "
            f"{_fmt(row.running)} / {_fmt(row.queued)} → {row.limited_by}"
        )
        if row.capacity is not None:
            lines.append(f"      capacity: {row.capacity.explanation}")
    if any(row.capacity for row in concurrency.servers.values()):
        lines.append(f"   (capacity at {concurrency.lengths})")
    return lines


# 4. storage ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageAnswer:
    store: str
    shards_total: int
    shards_published: int
    bytes_published: int
    last_publish_at: float | None
    unpublished_shards: list[int]  # the first 50
    failed_uploads: int
    # Shards published under different generation settings would mix in one training set.
    settings_fingerprints: dict[str, int]
    stale_shards: list[int]
    shards_materialized: int | None
    # Dagster says materialized, the store disagrees: no manifest, or the last coverage check found the shard's
    # objects missing or altered.
    materialized_not_in_store: list[int] | None


def answer_storage(
    store: Store, readings: Readings, current_fingerprint: str | None, materialized: set[int] | None
) -> StorageAnswer:
    """What the manifests say is safely in the store."""
    published = readings.published
    return StorageAnswer(
        store=store.uri,
        shards_total=readings.num_shards,
        shards_published=len(published),
        bytes_published=sum(m.stored_bytes for m in published.values()),
        last_publish_at=max((m.published_at for m in published.values()), default=None),
        unpublished_shards=[s for s in range(readings.num_shards) if s not in published][:50],
        failed_uploads=sum(b.upload_failures for b in readings.heartbeats),
        settings_fingerprints=dict(Counter(m.settings_fingerprint for m in published.values())),
        stale_shards=sorted(
            s for s, m in published.items() if current_fingerprint and m.settings_fingerprint != current_fingerprint
        ),
        shards_materialized=len(materialized) if materialized is not None else None,
        materialized_not_in_store=None
        if materialized is None
        else sorted(s for s in materialized if s not in published or s in _found_damaged(readings)),
    )


def _found_damaged(readings: Readings) -> set[int]:
    """Shards the last coverage check found damaged, unless published again since."""
    by_id = readings.coverage_by_id
    if by_id is None:
        return set()
    return {
        s
        for s in by_id.shards_damaged
        if s in readings.published and readings.published[s].published_at <= by_id.computed_at
    }


def render_storage(storage: StorageAnswer, now: float) -> list[str]:
    s = storage
    lines = [
        "4. Storage",
        f"   {s.store}: {s.shards_published}/{s.shards_total} shards published "
        f"(Dagster: {_fmt(s.shards_materialized)} materialized), {_fmt(s.bytes_published)} bytes, "
        f"failed uploads {s.failed_uploads}, last publish {_ago(s.last_publish_at, now)}",
        f"   generation settings of published shards: {s.settings_fingerprints or '—'}"
        + ("  ALERT: mixed settings" if len(s.settings_fingerprints) > 1 else "")
        + (f"  stale (made with other settings than configured now): {s.stale_shards}" if s.stale_shards else ""),
    ]
    if s.materialized_not_in_store:
        lines.append(f"   ALERT: materialized in Dagster but not intact in the store: {s.materialized_not_in_store}")
    return lines


# 5. coverage ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoverageAnswer:
    input_rows: int | None
    normalized: int | None
    quarantined: int | None
    quarantined_by_reason: dict[str, int] | None
    conversations: int | None
    by_source: dict[str, SourceTotals] | None
    # Rows kept under their hash id because their own id was taken, and conversations that call tools.
    renamed_ids: int | None
    tool_calling: int | None
    events_planned: int
    events_in_published_shards: int
    errors_in_published_shards: int
    # By id, across shards: written by the run_report asset or `dflash status --by-id`.
    by_id: DatasetCoverage | None


def answer_coverage(readings: Readings) -> CoverageAnswer:
    """Every input row accounted for, every conversation planned, every event done once."""
    # Before the conversations stage runs, the ingest stage's counts are all there is.
    rows = readings.conversations or readings.raw
    conversations = readings.conversations
    return CoverageAnswer(
        input_rows=rows.input_rows if rows else None,
        normalized=conversations.normalized if conversations else None,
        quarantined=rows.quarantined if rows else None,
        quarantined_by_reason=rows.quarantined_by_reason if rows else None,
        conversations=conversations.rows if conversations else None,
        by_source=conversations.by_source if conversations else None,
        renamed_ids=conversations.renamed_ids if conversations else None,
        tool_calling=conversations.tool_calling if conversations else None,
        events_planned=readings.events_planned,
        events_in_published_shards=sum(m.rows for m in readings.published.values()),
        errors_in_published_shards=sum(m.errors for m in readings.published.values()),
        by_id=readings.coverage_by_id,
    )


def _by_id_lines(by_id: DatasetCoverage | None, now: float) -> list[str]:
    if not by_id:
        return ["   by id: not computed yet (materialize run_report, or dflash status --by-id)"]
    return [
        f"   by id ({_ago(by_id.computed_at, now)}): conversations {_fmt(by_id.conversations)} = done "
        f"{_fmt(by_id.conversations_done)} + partial {_fmt(by_id.conversations_partial)} + missing "
        f"{_fmt(by_id.conversations_missing)}; events missing {_fmt(by_id.events_missing)}, duplicated "
        f"{_fmt(by_id.events_duplicated)}, unexpected {_fmt(by_id.events_unexpected)}",
        *(f"   ALERT: {problem}" for problem in by_id.disagreements),
        *([f"   ALERT: damaged completions shards: {by_id.shards_damaged}"] if by_id.shards_damaged else []),
    ]


def render_coverage(coverage: CoverageAnswer, now: float) -> list[str]:
    c = coverage
    by_source = {name: asdict(totals) for name, totals in c.by_source.items()} if c.by_source else None
    return [
        "5. Coverage",
        f"   input rows {_fmt(c.input_rows)} → normalized {_fmt(c.normalized)} + quarantined {_fmt(c.quarantined)} "
        f"{c.quarantined_by_reason or ''}",
        f"   conversations {_fmt(c.conversations)} by source {by_source}; events planned {_fmt(c.events_planned)}, "
        f"in published shards {_fmt(c.events_in_published_shards)} (errors {_fmt(c.errors_in_published_shards)})",
        f"   tool-calling conversations {_fmt(c.tool_calling)}; ids renamed (own id taken, kept under a hash id) "
        f"{_fmt(c.renamed_ids)}",
        *_by_id_lines(c.by_id, now),
    ]


# 6. multi-turn -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultiTurnAnswer:
    policy: str | None
    multi_turn_conversations: int | None
    conversations: int | None
    generated_turns_planned: int
    history: str | None


def answer_multi_turn(readings: Readings) -> MultiTurnAnswer:
    """Which policy, how many multi-turn conversations, how many turns generated."""
    conversations = readings.conversations
    return MultiTurnAnswer(
        policy=conversations.policy if conversations else None,
        multi_turn_conversations=conversations.multi_turn if conversations else None,
        conversations=conversations.rows if conversations else None,
        generated_turns_planned=readings.events_planned,
        history=conversations.history if conversations else None,
    )


def render_multi_turn(multi_turn: MultiTurnAnswer) -> list[str]:
    t = multi_turn
    return [
        "6. Multi-turn",
        f"   policy {t.policy}: {_fmt(t.multi_turn_conversations)} multi-turn of {_fmt(t.conversations)} "
        f"conversations, {_fmt(t.generated_turns_planned)} assistant turns generated",
    ]


# all six -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    collected_at: float
    progress: ProgressAnswer
    mtp: MtpAnswer
    concurrency: ConcurrencyAnswer
    storage: StorageAnswer
    coverage: CoverageAnswer
    multi_turn: MultiTurnAnswer
    cost: CostAnswer | None = None  # None: no price configured
    alerts: list[Alert] = field(default_factory=list)
    # Registered nodes lost without `fleet down`: their servers accept no connection and they did not `fleet up` again.
    stale_nodes: list[NodeRecord] = field(default_factory=list)


def collect_status(
    store: Store,
    endpoints: list[str],
    *,
    api_key: str | None = None,
    current_fingerprint: str | None = None,
    materialized: set[int] | None = None,
    now: float | None = None,
    cost: FleetCost = NO_PRICE,
    thresholds: AlertThresholds = DEFAULT_THRESHOLDS,
) -> Status:
    """`current_fingerprint`: the generation settings configured now; published shards made otherwise are stale.
    `materialized`: the completions shards Dagster recorded as materialized; each should be published intact.
    `cost`: the fleet's price; `thresholds`: when to raise an alert."""
    now = time.time() if now is None else now
    readings = take_readings(store, endpoints, api_key=api_key, now=now)
    return answer_all(
        store,
        readings,
        current_fingerprint=current_fingerprint,
        materialized=materialized,
        cost=cost,
        thresholds=thresholds,
        endpoints_known=bool(endpoints),
    )


def answer_all(
    store: Store,
    readings: Readings,
    *,
    current_fingerprint: str | None,
    materialized: set[int] | None,
    cost: FleetCost,
    thresholds: AlertThresholds,
    endpoints_known: bool,
) -> Status:
    """Every answer, the cost and the alerts from one set of readings."""
    progress, mtp, concurrency = answer_progress(readings), answer_mtp(readings), answer_concurrency(readings)
    storage = answer_storage(store, readings, current_fingerprint, materialized)
    return Status(
        collected_at=readings.now,
        progress=progress,
        mtp=mtp,
        concurrency=concurrency,
        storage=storage,
        coverage=answer_coverage(readings),
        multi_turn=answer_multi_turn(readings),
        cost=answer_cost(cost, progress, servers=len(readings.fleet)),
        alerts=raise_alerts(
            progress, mtp, concurrency, storage, endpoints_known=endpoints_known, thresholds=thresholds
        ),
    )


def render_text(status: Status) -> str:
    return "\n".join(
        [
            *render_progress(status.progress, status.collected_at),
            *render_mtp(status.mtp),
            *render_concurrency(status.concurrency),
            *render_storage(status.storage, status.collected_at),
            *render_coverage(status.coverage, status.collected_at),
            *render_multi_turn(status.multi_turn),
            *render_cost(status.cost),
            *render_alerts(status.alerts),
            *render_stale_nodes(status.stale_nodes, status.collected_at),
        ]
    )


def render_stale_nodes(records: list[NodeRecord], now: float) -> list[str]:
    return [
        f"stale node record {record.node} (host {record.host}, last `fleet up` {_ago(record.registered_at, now)}): "
        f"none of {', '.join(record.urls)} accepts a connection; no run dispatches to it. Remove it with "
        f"`dflash fleet forget --node {record.node}`"
        for record in records
    ]


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _ago(timestamp: float | None, now: float) -> str:
    return f"{now - timestamp:,.0f} s ago" if timestamp else "never"
