"""The operator's page: the six answers (`ops.status`) as Markdown tables, the figures Dagster plots over time,
and a chart of the run so far.

`render_markdown` is the `run_report` asset's page; `plot_metrics` its numeric metadata (one series per key
figure, unknown figures left out rather than written as 0, so a plot never dips to a false zero);
`progress_chart` a PNG of progress against the plan and of the accept length over the run, drawn from the
points earlier reports recorded.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from dagster_project.generation.heartbeat import read_heartbeats, run_is_alive
from dagster_project.ops.alerts import dollars
from dagster_project.ops.status import Status
from dagster_project.store.storage import Store

SERVER_COLUMNS = [
    "server",
    "client window",
    "in flight",
    "cap",
    "running",
    "queued",
    "KV use",
    "mamba use",
    "what limits it",
]
# Measured / planned within this band of 1 is "on plan".
ON_PLAN_BAND = 0.1


def as_of(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows), ""]


def verdict(ratio: float | None, higher_is_better: bool = True) -> str:
    if ratio is None:
        return "—"
    if abs(ratio - 1) <= ON_PLAN_BAND:
        return "on plan"
    ahead = ratio > 1 if higher_is_better else ratio < 1
    return "ahead of plan" if ahead else "behind plan"


def _ratio(measured: float | None, planned: float | None) -> float | None:
    return measured / planned if measured is not None and planned else None


def _plan_rows(status: Status) -> list[list[str]]:
    p = status.progress
    plan = p.plan
    if plan is None:
        return []
    running = bool(p.shards_running)
    req = p.window_req_per_s if running else p.lifetime_req_per_s or None
    tok = p.window_output_tok_per_s if running else p.lifetime_output_tok_per_s or None
    figures = [
        ("requests / s", req, plan.req_per_s, 2, True),
        ("output tokens / s", tok, plan.output_tok_per_s, 0, True),
        ("avg output tokens", p.avg_output_tokens, plan.avg_output_tokens, 0, False),
        ("ETA for what remains (h)", p.eta_hours, p.plan_eta_hours, 2, False),
    ]
    rows = []
    for name, measured, planned, digits, higher_is_better in figures:
        ratio = _ratio(measured, planned)
        rows.append(
            [name, _num(measured, digits), _num(planned, digits), _num(ratio, 2), verdict(ratio, higher_is_better)]
        )
    return rows


def render_markdown(status: Status) -> str:
    p, mtp, c, s, cov, turns = (
        status.progress,
        status.mtp,
        status.concurrency,
        status.storage,
        status.coverage,
        status.multi_turn,
    )
    out = [f"**As of {as_of(status.collected_at)}**", ""]
    if status.alerts:
        out += ["### Alerts", *(f"- **{a.kind}**: {a.message}" for a in status.alerts), ""]
    else:
        out += ["No alerts.", ""]

    out += [
        "### 1. Progress vs plan",
        f"{_num(p.events_done)} of {_num(p.events_planned)} events ({p.fraction_done:.1%}); "
        f"shards running: {', '.join(map(str, p.shards_running)) or 'none'}"
        + (f"; dead: {', '.join(map(str, p.shards_dead))}" if p.shards_dead else "")
        + (f"; failed: {', '.join(map(str, p.shards_failed))}" if p.shards_failed else ""),
        "",
        f"ETA at the measured rate: **{_num(p.eta_hours, 2)} h**"
        + ("" if p.shards_running else " (no shard running now)")
        + "; at the plan's rate: "
        f"**{_num(p.plan_eta_hours, 2)} h**; lifetime {_num(p.lifetime_req_per_s, 2)} req/s, "
        f"{_num(p.lifetime_output_tok_per_s)} output tok/s over {_num(p.lifetime_span_hours * 60, 1)} min of "
        "generation",
        "",
    ]
    plan_rows = _plan_rows(status)
    if plan_rows:
        out += [f"Plan: {p.plan.source}", ""]
        out += _table(
            [
                "figure",
                "measured (recent)" if p.shards_running else "measured (lifetime)",
                "plan",
                "measured / plan",
                "verdict",
            ],
            plan_rows,
        )
    else:
        out += ["No plan recorded (`dflash plan`).", ""]

    out += [
        "### 2. MTP (speculative decoding)",
        f"MTP {'on' if mtp.mtp_on else 'OFF or unknown'}; accept length on our recent requests "
        f"**{_num(mtp.accept_length_window, 2)}**, over the published shards "
        f"{_num(mtp.accept_length_published_shards, 2)}",
        "",
    ]
    if mtp.speculative_algorithm:
        out += _table(
            ["server", "algorithm", "its own average accept length"],
            [
                [url, name or "OFF", _num(mtp.server_avg_spec_accept_length.get(url), 2)]
                for url, name in mtp.speculative_algorithm.items()
            ],
        )

    out += ["### 3. Concurrency per server", ""]
    if c.servers:
        out += _table(
            SERVER_COLUMNS,
            [
                [
                    url,
                    _num(row.client_window),
                    _num(row.in_flight),
                    _num(row.effective_cap),
                    _num(row.running),
                    _num(row.queued),
                    _percent(row.token_usage),
                    _percent(row.mamba_usage),
                    row.limited_by,
                ]
                for url, row in c.servers.items()
            ],
        )
        out += [f"- {url}: {row.capacity.explanation}" for url, row in c.servers.items() if row.capacity is not None]
        out += [f"(capacity at {c.lengths})", ""]
    else:
        out += ["No server known: start a fleet (`dflash fleet up`) or set DFLASH_SGLANG_ENDPOINTS.", ""]

    out += [
        "### 4. Storage",
        f"`{s.store}`: **{s.shards_published} of {s.shards_total}** shards published "
        f"(Dagster: {_num(s.shards_materialized)} materialized), {s.bytes_published / 1e6:,.1f} MB, "
        f"failed uploads {s.failed_uploads}, last publish "
        f"{as_of(s.last_publish_at) if s.last_publish_at else 'never'}",
        "",
        f"Generation settings of published shards: "
        f"{', '.join(f'`{fp}` × {n}' for fp, n in s.settings_fingerprints.items()) or '—'}"
        + (f"; stale (other settings than configured now): {s.stale_shards}" if s.stale_shards else ""),
        "",
        "### 5. Coverage",
        f"Input rows {_num(cov.input_rows)} → normalized {_num(cov.normalized)} + quarantined "
        f"{_num(cov.quarantined)}"
        + (
            " (" + ", ".join(f"{reason} {n:,}" for reason, n in cov.quarantined_by_reason.items()) + ")"
            if cov.quarantined_by_reason
            else ""
        ),
        "",
    ]
    if cov.by_source:
        out += _table(
            ["source", "input rows", "conversations", "quarantined"],
            [
                [name, _num(t.input_rows), _num(t.conversations), _num(t.quarantined)]
                for name, t in cov.by_source.items()
            ],
        )
    out.append(
        f"\nEvents planned {_num(cov.events_planned)}, in published shards {_num(cov.events_in_published_shards)} "
        f"(errors {_num(cov.errors_in_published_shards)})."
    )
    if cov.by_id:
        b = cov.by_id
        out.append(
            f" By id (as of {as_of(b.computed_at)}): conversations {_num(b.conversations)} = done "
            f"{_num(b.conversations_done)} + partial {_num(b.conversations_partial)} + missing "
            f"{_num(b.conversations_missing)}; events missing {_num(b.events_missing)}, duplicated "
            f"{_num(b.events_duplicated)}, unexpected {_num(b.events_unexpected)}."
        )
    out += [
        "",
        "### 6. Multi-turn",
        f"Policy `{turns.policy}`: {_num(turns.multi_turn_conversations)} multi-turn of "
        f"{_num(turns.conversations)} conversations; {_num(turns.generated_turns_planned)} assistant turns generated.",
        "",
        "### Cost",
    ]
    cost = status.cost
    if cost is None:
        out.append("No price configured (the fleet resource's `cost_per_gpu_hour`, or DFLASH_COST_PER_GPU_HOUR).")
    else:
        out += _table(
            [
                "fleet $/hour",
                "GPUs",
                "spent",
                "to finish",
                "to finish (plan)",
                "$ / 1M output tokens",
                "GPU-hours / 1K kept rows",
            ],
            [
                [
                    f"${cost.cost_per_hour:,.2f}",
                    str(cost.gpus),
                    f"${cost.spent:,.2f}",
                    dollars(cost.to_finish),
                    dollars(cost.to_finish_plan),
                    dollars(cost.per_million_output_tokens),
                    _num(cost.gpu_hours_per_1k_rows, 3),
                ]
            ],
        )
    return "\n".join(out)


def _percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction:.0%}"


# ---- the figures Dagster plots -----------------------------------------------------------------------------


def _safe(url: str) -> str:
    """A metadata key from a server URL: `http://10.0.0.1:30000` → `10_0_0_1_30000`."""
    return "".join(ch if ch.isalnum() else "_" for ch in url.split("://", 1)[-1]).strip("_")


def plot_metrics(status: Status) -> dict[str, float | int]:
    """Every key figure as a number, by a stable name; a figure not known now is absent, never 0."""
    p, mtp, cost = status.progress, status.mtp, status.cost
    running = bool(p.shards_running)
    figures: dict[str, float | int | None] = {
        "events_done": p.events_done,
        "percent_done": round(100 * p.fraction_done, 2),
        "shards_running": len(p.shards_running),
        "shards_published": status.storage.shards_published,
        "req_per_s": p.window_req_per_s if running else None,
        "output_tok_per_s": p.window_output_tok_per_s if running else None,
        "accept_length": mtp.accept_length_window,
        "accept_length_published": mtp.accept_length_published_shards,
        "eta_hours": p.eta_hours,
        "plan_eta_hours": p.plan_eta_hours,
        "percent_of_plan_rate": (
            round(100 * p.window_output_tok_per_s / p.plan.output_tok_per_s, 1)
            if running and p.plan and p.plan.output_tok_per_s
            else None
        ),
        "alerts": len(status.alerts),
    }
    if cost is not None:
        figures.update(
            cost_spent_usd=round(cost.spent, 2),
            cost_to_finish_usd=round(cost.to_finish, 2) if cost.to_finish is not None else None,
            usd_per_million_output_tokens=cost.per_million_output_tokens,
            gpu_hours_per_1k_rows=cost.gpu_hours_per_1k_rows,
        )
    for url, row in status.concurrency.servers.items():
        figures[f"in_flight_{_safe(url)}"] = row.in_flight
        figures[f"queued_{_safe(url)}"] = row.queued
        figures[f"running_{_safe(url)}"] = row.running
    return {
        name: round(value, 4) if isinstance(value, float) else value
        for name, value in figures.items()
        if value is not None
    }


# ---- the chart ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportPoint:
    """One refresh of the report: what the chart draws."""

    at: float
    events_done: int
    accept_length: float | None


def progress_chart(points: Sequence[ReportPoint], status: Status) -> bytes:
    """PNG: events done over time against the plan's line from the first point, and the accept length."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on a run worker
    from matplotlib import pyplot as plt

    points = sorted(points, key=lambda point: point.at)
    start = points[0].at if points else status.collected_at
    minutes = [(point.at - start) / 60 for point in points]
    figure, (progress, accept) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    try:
        progress.plot(minutes, [point.events_done for point in points], marker="o", label="events done")
        plan = status.progress.plan
        if plan and plan.req_per_s and points:
            span = max(minutes[-1], 1.0)
            first = points[0].events_done
            planned_end = min(status.progress.events_planned, first + plan.req_per_s * span * 60)
            progress.plot([0, span], [first, planned_end], linestyle="--", label=f"plan ({plan.req_per_s:g} req/s)")
        progress.axhline(status.progress.events_planned, color="grey", linewidth=0.8, label="events planned")
        progress.set_ylabel("events")
        progress.set_title(f"Run progress as of {as_of(status.collected_at)}")
        progress.legend(loc="lower right")
        known = [(m, point.accept_length) for m, point in zip(minutes, points) if point.accept_length is not None]
        if known:
            accept.plot([m for m, _ in known], [a for _, a in known], marker="o", color="tab:green")
        accept.set_ylabel("accept length")
        accept.set_xlabel("minutes since the first report")
        buffer = io.BytesIO()
        figure.tight_layout()
        figure.savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()
    finally:
        plt.close(figure)


# ---- when to refresh ---------------------------------------------------------------------------------------------

CHART_KEY = "report/progress.png"


def shards_running(store: Store, now: float | None = None) -> list[int]:
    """The shards whose runs are generating or publishing now (live heartbeats): while any is, the report is
    worth refreshing."""
    now = time.time() if now is None else now
    return sorted(beat.shard for beat in read_heartbeats(store) if run_is_alive(beat, now))
