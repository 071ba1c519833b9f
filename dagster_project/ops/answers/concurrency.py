"""3. Concurrency: the dispatcher's window next to each server's cap and queue, what caps it and what would raise it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dagster_project.generation.ledger import split_followed
from dagster_project.generation.server_watch import SLOWNESS
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import counted, fmt, shard_list, utc
from dagster_project.ops.tune import TuneReport, gain
from dagster_project.sglang import capacity
from dagster_project.sglang.answer_contract import BREACHES
from dagster_project.sglang.model_identity import MODEL_MISMATCH, OTHER_MODEL, reported_model, serves_other_model


@dataclass(frozen=True)
class ServerCapacity:
    """What binds a server's cap and what would raise it (`capacity.analyze` of its /server_info)."""

    explanation: str  # "cap 22 per server, bound by mamba state slots (...); ...; `flags` → est. ×3.1"
    binding: str  # its first part, what binds the cap: "cap 22 per server, bound by mamba state slots (...)"
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
    kv_usage: float | None  # of the KV pool (`sglang:full_token_usage`)
    mamba_usage: float | None
    limited_by: str
    capacity: ServerCapacity | None = None
    capacity_error: str | None = None  # why there is no capacity answer (no /server_info fields, a router)
    model: str | None = None  # the model its /server_info names now (None: it names none, or did not answer)
    # Why it is not serving the job's model (`other_model_verdicts`); None: nothing says so.
    other_model: str | None = None


@dataclass(frozen=True)
class SetAside:
    """A server a running shard's dispatcher set aside (quarantined): it gets no new requests until a re-probe
    passes."""

    url: str
    reason: str  # each reason the runs give, once (a run that follows another's verdict gives the verdict's)
    since: float | None  # when it was set aside (None: when the run started, before the time was recorded)
    shards: list[int]  # the runs that have it set aside
    # The ledger members (runs on the node) whose verdicts the other runs follow (`ledger.Verdict`); empty: each
    # run found it on its own.
    found_by: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SlowServer:
    """A server the shard runs set aside for slowness (`server_watch.SLOWNESS`: answers trickling in, or no progress
    on their requests), by the last run of every shard, running or finished: it stays in view after the run."""

    url: str
    set_aside: dict[str, int]  # reason → times the runs set it aside for it
    limits_s: dict[str, float]  # reason → the limit it was judged by (the fleet resource's option of that reason)
    answers_trickled: int  # answers caught arriving for longer than their limit (each re-sent elsewhere)
    shards: list[int]  # the runs that set it aside


@dataclass(frozen=True)
class ConcurrencyAnswer:
    servers: dict[str, ServerConcurrency] = field(default_factory=dict)
    lengths: str = ""  # the request lengths the capacity answers assume, and their source
    set_aside: list[SetAside] = field(default_factory=list)
    # Server → kind → answers its dispatchers refused as not answers (each retried, on another server where there
    # is one), over the last run of every shard (`refused_answers`).
    refused_answers: dict[str, dict[str, int]] = field(default_factory=dict)
    served_model: str = ""  # the model every server must serve (empty: not checked)
    slow_servers: list[SlowServer] = field(default_factory=list)


# A dispatcher's states of a server it set aside and of one it has not checked yet
# (`generation.server_checks.QUARANTINED`, `UNPROBED`, not imported: the dispatcher imports aiohttp, which `dflash
# status` does without).
QUARANTINED, UNPROBED = "quarantined", "unprobed"
# The error kinds of an HTTP 200 that is not an answer: a body that is not a response (`sglang.client`, not imported
# for the same reason), and every breach of the answer contract ("NaN happened", a length stop short of the request's
# max_new_tokens, the end-of-turn id mid-answer, ...).
NOT_AN_ANSWER_KINDS = ("bad_response", *BREACHES)
EXPECTED_LENGTHS = "expected lengths (no completions yet)"
# What a server set aside gets, said alike where it is named and in its row of the concurrency answer.
NO_WORK_UNTIL_REPROBE = "it gets no new requests until a re-probe passes"
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
        binding=report.binding(),
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
    server: dict[str, Any],
    window: int | None,
    in_flight: int | None,
    fix: ServerCapacity | None = None,
    set_aside: SetAside | None = None,
) -> str:
    """What caps this server's batch now, and so what it would take to run 4-8x more at once. `set_aside`: the
    running shards' verdict on it, which sends it no work (not an idle server, nor a shard's tail)."""
    cap, running, queued = server.get("max_running_requests"), server.get("running"), server.get("queued")
    flag = server.get("max_running_requests_flag")
    if not server.get("healthy"):
        return "unreachable"
    if set_aside is not None:
        return f"set aside ({set_aside.reason}): {NO_WORK_UNTIL_REPROBE}"
    if cap is None or running is None:
        return "unknown (no /server_info cap or /metrics)"
    # What binds the cap, said as the capacity answer says it (one statement of it on the page and in the terminal);
    # without /server_info, only what the cap and the flag tell.
    if fix is not None:
        bound = fix.binding
    elif flag and cap < flag:
        bound = f"cap {cap} per server, bound by the mamba state pool (below --max-running-requests {flag})"
    else:
        bound = f"cap {cap} per server"
    if running >= cap and (queued or 0) > 0:
        if fix is None:
            higher = _CAPACITY_FLAGS
        elif fix.flags and fix.headroom >= capacity.MEANINGFUL_HEADROOM:
            higher = f"`{' '.join(fix.flags)}` ({fix.expected_gain})"
        else:
            higher = "no launch flag that keeps the numerics raises it in this memory (more GPUs do)"
        return (
            f"the server's cap ({bound}), {queued:.0f} queued behind it. More client concurrency only grows the "
            f"queue; to go higher: {higher}"
        )
    if window is not None and in_flight is not None and in_flight >= window and running < cap:
        return f"the client window ({window}): raise the fleet resource's oversubscription"
    if (queued or 0) == 0 and running < cap:
        return f"not enough work in flight ({bound}; idle server or the tail of a shard)"
    return f"balanced at the cap ({bound})"


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
    other_models = other_model_verdicts(readings)
    set_aside = set_aside_servers(readings)
    set_aside_by_url = {server.url: server for server in set_aside}
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
            kv_usage=server.get("kv_usage"),
            mamba_usage=server.get("mamba_usage"),
            limited_by=_limit_reason(server, window, flying, fix, set_aside_by_url.get(url)),
            capacity=fix,
            capacity_error=problem,
            model=reported_model(server),
            other_model=other_models.get(url),
        )
    return ConcurrencyAnswer(
        servers,
        f"{prompt:,.0f} prompt + {output:,.0f} output tokens per request, {lengths}",
        set_aside,
        refused_answers(readings),
        readings.served_model,
        slow_servers(readings),
    )


def other_model_verdicts(readings: Readings) -> dict[str, str]:
    """Server → why it does not serve the job's model: the model its /server_info names now, when that is another
    (`model_identity.serves_other_model`, the dispatcher's own test of a name); else the verdict of the last shard
    run that checked it, running or finished (its last heartbeat), when that run set it aside as another model
    (names, architecture, vocabulary, end-of-sequence id: `generation.served_model`). A later run that found the
    job's model there clears it."""
    expected = readings.served_model
    found = {
        url: f"serves {reported_model(probe)}, not the job's {expected}"
        for url, probe in readings.fleet.items()
        if serves_other_model(probe, expected)
    }
    last_checked: dict[str, tuple[float, int, dict[str, Any]]] = {}
    for beat in readings.heartbeats:
        for url, view in beat.servers.items():
            if view.get("state") != UNPROBED and beat.updated_at >= last_checked.get(url, (-1.0,))[0]:
                last_checked[url] = (beat.updated_at, beat.shard, view)
    for url, (_, shard, view) in last_checked.items():
        reason = view.get("reason") or ""
        if url not in found and view.get("state") == QUARANTINED and reason.startswith(MODEL_MISMATCH):
            found[url] = f"the run of shard {shard} set it aside: {reason}"
    return found


def refused_answers(readings: Readings) -> dict[str, dict[str, int]]:
    """Server → kind → answers refused as not answers, by the dispatchers' own counts in the shard runs' last
    heartbeats (a finished run's included: a fault retried elsewhere leaves no error row to count)."""
    found: dict[str, Counter] = {}
    for beat in readings.heartbeats:
        for url, view in beat.servers.items():
            errors = view.get("errors") or {}
            refused = Counter({kind: int(errors[kind]) for kind in NOT_AN_ANSWER_KINDS if errors.get(kind)})
            if refused:
                found.setdefault(url, Counter()).update(refused)
    return {url: dict(sorted(kinds.items())) for url, kinds in sorted(found.items())}


def slow_servers(readings: Readings) -> list[SlowServer]:
    """The servers set aside for slowness, by the dispatchers' own counts in the shard runs' last heartbeats (a
    finished run's included: the run's end does not make a slow server fast)."""
    times: dict[str, Counter] = {}
    limits: dict[str, dict[str, float]] = {}
    trickled: Counter = Counter()
    shards: dict[str, list[int]] = {}
    for beat in readings.heartbeats:
        for url, view in beat.servers.items():
            slow = view.get("slow") or {}
            if not slow.get("set_aside"):
                continue
            times.setdefault(url, Counter()).update(slow["set_aside"])
            judged = limits.setdefault(url, {})
            for reason, limit in (slow.get("limits_s") or {}).items():
                judged[reason] = max(limit, judged.get(reason, limit))
            trickled[url] += int(slow.get("answers_trickled") or 0)
            shards.setdefault(url, []).append(beat.shard)
    return [
        SlowServer(url, dict(sorted(times[url].items())), limits[url], trickled[url], sorted(shards[url]))
        for url in sorted(times)
    ]


def describe_slow(server: SlowServer) -> str:
    """ "3 answers trickled in; set aside for slowness by the runs of shards 0: answers_trickling 1× (answers begun
    and not complete within 15 s)": each reason worded after the limit it was judged by."""
    reasons = "; ".join(
        f"{reason} {count}×"
        + (
            f" ({SLOWNESS[reason][1].format(server.limits_s[reason])})"
            if reason in SLOWNESS and reason in server.limits_s
            else ""
        )
        for reason, count in server.set_aside.items()
    )
    trickled = f"{counted(server.answers_trickled, 'answer')} trickled in; " if server.answers_trickled else ""
    return f"{trickled}set aside for slowness by the runs of shards {shard_list(server.shards)}: {reasons}"


def set_aside_servers(readings: Readings) -> list[SetAside]:
    """The servers the running shards' dispatchers have set aside, by the dispatchers' own views (heartbeats)."""
    found: dict[str, list[tuple[int, str, str, float | None]]] = {}
    for beat in readings.live:
        for url, view in beat.servers.items():
            if view.get("state") == QUARANTINED:
                reason, by = split_followed(view.get("reason") or "unknown")
                found.setdefault(url, []).append((beat.shard, reason, by, view.get("set_aside_at")))
    return [
        SetAside(
            url,
            "; ".join(sorted({reason for _, reason, _, _ in seen})),
            min((at for _, _, _, at in seen if at is not None), default=None),
            sorted(shard for shard, _, _, _ in seen),
            sorted({by for _, _, by, _ in seen if by}),
        )
        for url, seen in sorted(found.items())
    ]


def render_concurrency(concurrency: ConcurrencyAnswer) -> list[str]:
    lines = ["3. Concurrency (client window / in flight / server cap / running / queued → what limits it)"]
    if not concurrency.servers:
        lines.append(f"   {NO_FLEET}")
    for url, row in concurrency.servers.items():
        lines.append(
            f"   {url}: {fmt(row.client_window)} / {fmt(row.in_flight)} / {fmt(row.effective_cap)} / "
            f"{fmt(row.running)} / {fmt(row.queued)} → {row.limited_by}"
        )
        # A server that did not answer its probe names no model: said only of one a run set aside as another's.
        if row.effective_cap is not None or row.other_model is not None:
            lines.append(f"      model: {describe_model(row, concurrency.served_model)}")
        if row.capacity is not None:
            lines.append(f"      capacity: {row.capacity.explanation}")
    if any(row.capacity for row in concurrency.servers.values()):
        lines.append(f"   (capacity at {concurrency.lengths}{lengths_note(concurrency.lengths)})")
    lines += [f"   SET ASIDE: {describe_set_aside(server)}" for server in concurrency.set_aside]
    lines += [f"   SLOW: {server.url}: {describe_slow(server)}" for server in concurrency.slow_servers]
    return lines


def describe_model(row: ServerConcurrency, served_model: str) -> str:
    """The model a server serves and the verdict on it: OTHER MODEL and why, or that it is the job's."""
    named = row.model or "— (its /server_info names none)"
    if row.other_model is not None:
        return f"{named} — {OTHER_MODEL}: {row.other_model}"
    return f"{named}, the job's" if row.model and served_model else named


def lengths_note(lengths: str) -> str:
    """Why the cap and gain here differ from what `fleet up` printed: it planned at the expected lengths."""
    if lengths == EXPECTED_LENGTHS:
        return ""
    return (
        "; `fleet up` printed its figures at the lengths it sizes servers for (by default "
        f"{capacity.EXPECTED_PROMPT_TOKENS:,.0f} prompt + {capacity.EXPECTED_OUTPUT_TOKENS:,.0f} output tokens), "
        "so its caps and gains differ from these"
    )


def describe_set_aside(server: SetAside) -> str:
    since = f"since {utc(server.since)}" if server.since else "since its run started"
    found_by = f", found by {', '.join(server.found_by)}" if server.found_by else ""
    return (
        f"{server.url} ({server.reason}{found_by}) {since} by the runs of shards {server.shards}: "
        f"{NO_WORK_UNTIL_REPROBE}; look at its log"
    )
