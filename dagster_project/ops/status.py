"""The six operator questions, answered from the store (heartbeats, manifests, plan) and the live fleet.

1. progress vs the plan   2. MTP on and its accept length   3. concurrency and what caps it
4. storage                5. coverage of the dataset          6. multi-turn handling

`collect_status` gathers the figures as one dict (the report asset stores it as metadata); `render_text`
prints it for the `status` command. Both read the same data, so the UI and the terminal agree.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from dagster_project.conversations.shards import read_conversations_manifest, read_shard_conversations_manifest
from dagster_project.generation.heartbeat import read_heartbeats
from dagster_project.generation.shards import read_completions_manifest
from dagster_project.ingest.shards import read_raw_prompts_manifest
from dagster_project.ops.coverage import read_coverage
from dagster_project.ops.plan import read_plan
from dagster_project.sglang.launch import fleet_status
from dagster_project.store.manifest import verify_shard
from dagster_project.store.storage import Store

# A heartbeat older than this means its shard run is not running any more (killed or finished).
STALE_HEARTBEAT_S = 60.0
ACCEPT_LENGTH_ALERT_FLOOR = 2.0


def probe_fleet(endpoints: list[str], api_key: str | None = None) -> dict[str, dict[str, Any]]:
    return {probe["url"]: probe for probe in fleet_status(endpoints, api_key)} if endpoints else {}


def _limit_reason(server: dict[str, Any], window: int | None, in_flight: int | None) -> str:
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
        return (
            f"server memory: {memory}, {queued:.0f} queued behind it. More client concurrency only grows the queue; "
            "to go higher raise --mamba-full-memory-ratio (or --max-mamba-cache-size), --disable-radix-cache, "
            "a bf16 mamba state or fp8 KV (reference sglang.md §5.2)"
        )
    if window is not None and in_flight is not None and in_flight >= window and running < cap:
        return f"the client window ({window}): raise the fleet resource's oversubscription"
    if (queued or 0) == 0 and running < cap:
        return f"not enough work in flight ({memory}; idle server or the tail of a shard)"
    return f"balanced at the cap ({memory})"


def _covered_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def collect_status(
    store: Store,
    endpoints: list[str],
    *,
    api_key: str | None = None,
    num_shards: int | None = None,
    current_fingerprint: str | None = None,
    materialized: set[int] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """`current_fingerprint`: the generation settings configured now; published shards made otherwise are stale.
    `materialized`: the completions shards Dagster recorded as materialized; each should be published intact."""
    now = time.time() if now is None else now
    plan = read_plan(store)
    conversations = read_conversations_manifest(store)
    raw = read_raw_prompts_manifest(store)
    shards = num_shards or (conversations.num_shards if conversations else 0)
    manifests = {s: read_completions_manifest(store, s) for s in range(shards)}
    published = {s: m for s, m in manifests.items() if m}
    beats = read_heartbeats(store)
    live = [b for b in beats if b.state == "running" and now - b.updated_at < STALE_HEARTBEAT_S]
    fleet = probe_fleet(endpoints, api_key)

    # 1. progress: published shards are exact; running shards report through their heartbeats.
    planned_events = (conversations.turns if conversations else 0) or sum(
        m.turns for s in range(shards) if (m := read_shard_conversations_manifest(store, s))
    )
    done_published = sum(m.rows for m in published.values())
    done_running = sum(b.done_events for b in live if b.shard not in published)
    done = done_published + done_running
    output_tokens = sum(m.output_tokens for m in published.values()) + sum(
        b.output_tokens for b in live if b.shard not in published
    )
    ok_events = sum(m.ok for m in published.values()) + sum(b.ok_events for b in live if b.shard not in published)
    window_req_s = sum(b.window.req_per_s for b in live)
    window_tok_s = sum(b.window.output_tok_per_s for b in live)
    # Lifetime: every shard run that reported, over the time some shard was generating (gaps between runs,
    # when nothing ran, do not dilute the rate).
    span = _covered_seconds([(b.started_at, b.updated_at) for b in beats])
    lifetime_req_s = sum(b.done_events - b.resumed_events for b in beats) / span if span else 0.0
    lifetime_tok_s = sum(b.output_tokens for b in beats) / span if span else 0.0
    avg_output = output_tokens / ok_events if ok_events else None
    remaining = max(planned_events - done, 0)
    eta_s = remaining * avg_output / window_tok_s if avg_output and window_tok_s else None
    progress = {
        "events_planned": planned_events,
        "events_done": done,
        "events_remaining": remaining,
        "fraction_done": done / planned_events if planned_events else 0.0,
        "shards_running": sorted(b.shard for b in live),
        "window_req_per_s": window_req_s,
        "window_output_tok_per_s": window_tok_s,
        "lifetime_req_per_s": lifetime_req_s,
        "lifetime_output_tok_per_s": lifetime_tok_s,
        "avg_output_tokens": avg_output,
        "eta_hours": eta_s / 3600 if eta_s else None,
        "lifetime_span_hours": span / 3600,
        "plan": asdict(plan) if plan else None,
        "plan_eta_hours": plan.eta_hours(remaining) if plan else None,
    }

    # 2. MTP: what each server runs, and the accept length measured on our own requests.
    spec_tokens = sum(b.spec.window_spec_tokens for b in live)
    spec_verify = sum(b.spec.window_verify_passes for b in live)
    window_accept = spec_tokens / spec_verify if spec_verify else None
    lifetime_accepts = [
        m.generation.spec.accept_length_lifetime for m in published.values() if m.generation.spec.accept_length_lifetime
    ]
    algorithms = {url: s.get("speculative_algorithm") for url, s in fleet.items() if s.get("healthy")}
    mtp_on = bool(algorithms) and all(algorithms.values())
    accept_seen = window_accept or (sum(lifetime_accepts) / len(lifetime_accepts) if lifetime_accepts else None)
    mtp = {
        "speculative_algorithm": algorithms,
        "mtp_on": mtp_on,
        "accept_length_window": window_accept,
        "accept_length_published_shards": sum(lifetime_accepts) / len(lifetime_accepts) if lifetime_accepts else None,
        "server_avg_spec_accept_length": {url: s.get("avg_spec_accept_length") for url, s in fleet.items()},
        "alert": (
            "MTP is off on some servers"
            if algorithms and not mtp_on
            else f"accept length {accept_seen:.2f} is below {ACCEPT_LENGTH_ALERT_FLOOR}"
            if accept_seen and accept_seen < ACCEPT_LENGTH_ALERT_FLOOR
            else None
        ),
    }

    # 3. concurrency: the dispatcher's view (heartbeats) next to the servers' own (/server_info, /metrics).
    client_view: dict[str, dict[str, int]] = {}
    for b in live:
        for url, view in b.servers.items():
            merged = client_view.setdefault(url, {"window": 0, "in_flight": 0})
            merged["window"] += int(view.get("window") or 0)
            merged["in_flight"] += int(view.get("in_flight") or 0)
    concurrency = {}
    for url in sorted(set(fleet) | set(client_view)):
        server, view = fleet.get(url, {"healthy": False}), client_view.get(url, {})
        concurrency[url] = {
            "client_window": view.get("window"),
            "in_flight": view.get("in_flight"),
            "effective_cap": server.get("max_running_requests"),
            "cap_flag": server.get("max_running_requests_flag"),
            "running": server.get("running"),
            "queued": server.get("queued"),
            "token_usage": server.get("token_usage"),
            "mamba_usage": server.get("mamba_usage"),
            "limited_by": _limit_reason(server, view.get("window"), view.get("in_flight")),
        }

    # 4. storage: what the manifests say is safely in the store.
    storage = {
        "store": store.uri,
        "shards_total": shards,
        "shards_published": len(published),
        "bytes_published": sum(m.stored_bytes for m in published.values()),
        "last_publish_at": max((m.published_at for m in published.values()), default=None),
        "unpublished_shards": [s for s in range(shards) if s not in published][:50],
        "failed_uploads": sum(b.upload_failures for b in beats),
        # Shards published under different generation settings would mix in one training set.
        "settings_fingerprints": dict(Counter(m.settings_fingerprint for m in published.values())),
        "stale_shards": sorted(
            s for s, m in published.items() if current_fingerprint and m.settings_fingerprint != current_fingerprint
        ),
        "shards_materialized": len(materialized) if materialized is not None else None,
        # Dagster says materialized, the store disagrees: a manifest or an object is missing or altered.
        "materialized_not_in_store": None
        if materialized is None
        else sorted(s for s in materialized if s not in published or verify_shard(store, published[s])),
    }

    # 5. coverage: every input row accounted for, every conversation planned, every event done once.
    # Before the conversations stage runs, the ingest stage's counts are all there is.
    rows = conversations or raw
    by_id = read_coverage(store)
    coverage = {
        "input_rows": rows.input_rows if rows else None,
        "normalized": conversations.normalized if conversations else None,
        "quarantined": rows.quarantined if rows else None,
        "quarantined_by_reason": rows.quarantined_by_reason if rows else None,
        "conversations": conversations.rows if conversations else None,
        "by_source": {name: asdict(t) for name, t in conversations.by_source.items()} if conversations else None,
        "events_planned": planned_events,
        "events_in_published_shards": done_published,
        "errors_in_published_shards": sum(m.errors for m in published.values()),
        # By id, across shards: written by the run_report asset or `dflash status --by-id`.
        "by_id": asdict(by_id) if by_id else None,
    }

    # 6. multi-turn: which policy, how many multi-turn conversations, how many turns generated.
    multi_turn = {
        "policy": conversations.policy if conversations else None,
        "multi_turn_conversations": conversations.multi_turn if conversations else None,
        "conversations": conversations.rows if conversations else None,
        "generated_turns_planned": planned_events,
        "history": conversations.history if conversations else None,
    }
    return {
        "collected_at": now,
        "progress": progress,
        "mtp": mtp,
        "concurrency": concurrency,
        "storage": storage,
        "coverage": coverage,
        "multi_turn": multi_turn,
    }


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


def _by_id_line(by_id: dict[str, Any] | None, now: float) -> str:
    if not by_id:
        return "   by id: not computed yet (materialize run_report, or dflash status --by-id)"
    return (
        f"   by id ({_ago(by_id['computed_at'], now)}): conversations {_fmt(by_id['conversations'])} = done "
        f"{_fmt(by_id['conversations_done'])} + partial {_fmt(by_id['conversations_partial'])} + missing "
        f"{_fmt(by_id['conversations_missing'])}; events missing {_fmt(by_id['events_missing'])}, duplicated "
        f"{_fmt(by_id['events_duplicated'])}, unexpected {_fmt(by_id['events_unexpected'])}"
    )


def render_text(status: dict[str, Any]) -> str:
    p, m, s, c, t = status["progress"], status["mtp"], status["storage"], status["coverage"], status["multi_turn"]
    plan = p["plan"]
    lines = [
        "1. Progress vs estimates",
        f"   events {_fmt(p['events_done'])}/{_fmt(p['events_planned'])} ({p['fraction_done']:.1%}), "
        f"shards running {p['shards_running'] or 'none'}",
        "   rate: "
        + (
            f"window {_fmt(p['window_req_per_s'], 2)} req/s, {_fmt(p['window_output_tok_per_s'])} out tok/s; "
            if p["shards_running"]
            else "no shard running now; "
        )
        + f"lifetime {_fmt(p['lifetime_req_per_s'], 2)} req/s, {_fmt(p['lifetime_output_tok_per_s'])} out tok/s "
        f"over {_fmt(p['lifetime_span_hours'] * 60, 1)} min of generation",
        f"   avg output tokens {_fmt(p['avg_output_tokens'])}; ETA {_fmt(p['eta_hours'], 2)} h",
    ]
    if plan:
        lines.append(
            f"   plan ({plan['source']}): {plan['req_per_s']} req/s, {plan['avg_output_tokens']} avg out tokens, "
            f"{plan['output_tok_per_s']} out tok/s → ETA {_fmt(p['plan_eta_hours'], 2)} h for what remains"
        )
    lines += [
        "2. MTP (speculative decoding)",
        f"   algorithm per server: {m['speculative_algorithm'] or 'no server reachable'}",
        f"   accept length: window {_fmt(m['accept_length_window'], 2)}, published shards "
        f"{_fmt(m['accept_length_published_shards'], 2)}, servers' own average {m['server_avg_spec_accept_length']}",
    ]
    if m["alert"]:
        lines.append(f"   ALERT: {m['alert']}")
    lines.append("3. Concurrency (client window / in flight / server cap / running / queued → what limits it)")
    for url, row in status["concurrency"].items():
        lines.append(
            f"   {url}: {_fmt(row['client_window'])} / {_fmt(row['in_flight'])} / {_fmt(row['effective_cap'])} / "
            f"{_fmt(row['running'])} / {_fmt(row['queued'])} → {row['limited_by']}"
        )
    lines += [
        "4. Storage",
        f"   {s['store']}: {s['shards_published']}/{s['shards_total']} shards published "
        f"(Dagster: {_fmt(s['shards_materialized'])} materialized), {_fmt(s['bytes_published'])} bytes, "
        f"failed uploads {s['failed_uploads']}, last publish {_ago(s['last_publish_at'], status['collected_at'])}",
        f"   generation settings of published shards: {s['settings_fingerprints'] or '—'}"
        + ("  ALERT: mixed settings" if len(s["settings_fingerprints"]) > 1 else "")
        + (f"  stale (made with other settings than configured now): {s['stale_shards']}" if s["stale_shards"] else ""),
        *(
            [f"   ALERT: materialized in Dagster but not intact in the store: {s['materialized_not_in_store']}"]
            if s["materialized_not_in_store"]
            else []
        ),
        "5. Coverage",
        f"   input rows {_fmt(c['input_rows'])} → normalized {_fmt(c['normalized'])} + quarantined {_fmt(c['quarantined'])} "
        f"{c['quarantined_by_reason'] or ''}",
        f"   conversations {_fmt(c['conversations'])} by source {c['by_source']}; events planned {_fmt(c['events_planned'])}, "
        f"in published shards {_fmt(c['events_in_published_shards'])} (errors {_fmt(c['errors_in_published_shards'])})",
        _by_id_line(c["by_id"], status["collected_at"]),
        "6. Multi-turn",
        f"   policy {t['policy']}: {_fmt(t['multi_turn_conversations'])} multi-turn of {_fmt(t['conversations'])} conversations, "
        f"{_fmt(t['generated_turns_planned'])} assistant turns generated",
    ]
    return "\n".join(lines)
