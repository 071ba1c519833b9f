"""1. Progress vs the plan: events done, rates, the ETA, and shard runs that died or failed."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from typing import Any

from dagster_project.generation.progress import ETA_FROM_LIFETIME, ETA_FROM_WINDOW
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import counted_shards, fmt
from dagster_project.ops.plan import Plan


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
    # Why the plan's rates are a floor for this fleet (a pilot too small to fill it), or None.
    plan_floor: str | None = None
    events_ok: int | None = None  # answers generated without error (published, and running shards' so far)
    # Every running shard is still measuring the window its rate needs to be stable.
    eta_settling: bool = False
    # What the ETA comes from: "window" (every running shard's stable window), "lifetime" (the rates measured so
    # far, while a window settles), "" without an ETA.
    eta_basis: str = ""
    # Shards whose last run failed and which are not published: they need another run.
    shards_failed: list[int] = field(default_factory=list)
    # Running shards whose generation has ended, publishing: shard → seconds since it ended (their work is with the
    # store now, not the fleet).
    shards_publishing: dict[int, float] = field(default_factory=dict)
    # The line is held: no shard generates until it is released, so there is no time to the end to tell.
    held: bool = False
    # Answers the runs a hold stopped journaled, in no published shard and not in `events_done` until their shards run
    # again (`Readings.held_runs`): shown beside it, so the count does not seem to fall as the held runs end.
    held_runs_answers: int = 0

    def while_held(self) -> ProgressAnswer:
        """The answer while the line is held: no ETA (nor the plan's for what is left)."""
        return replace(self, eta_hours=None, plan_eta_hours=None, eta_basis="", eta_settling=False, held=True)


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
    done = readings.events_done
    output_tokens = readings.output_tokens
    ok_events = sum(m.ok for m in published) + sum(b.ok_events for b in running)
    window_tok_s = sum(b.window.output_tok_per_s for b in readings.live)
    # Lifetime: every shard run that reported, over the time some shard was generating (gaps between runs,
    # when nothing ran, do not dilute the rate).
    span = _covered_seconds([(b.started_at, b.updated_at) for b in beats])
    avg_output = output_tokens / ok_events if ok_events else None
    remaining = max(readings.events_planned - done, 0)
    # Events end at the running shards' rates over their ETA windows (`generation.progress`): stable, where a
    # two-minute window swings with each wave of answers ending. A shard still settling counts at its lifetime rate,
    # and the ETA says so; running shards that have finished nothing yet (a shard just begun after another) leave
    # the lifetime rate of every run so far. So from the first finished answers on there is an ETA.
    live = readings.live
    settling = bool(live) and all(b.eta_settling for b in live)
    events_per_s = sum(b.lifetime.req_per_s if b.eta_settling else b.eta_rates.req_per_s for b in live)
    lifetime_req_per_s = sum(b.done_events - b.resumed_events for b in beats) / span if span else 0.0
    if live and not events_per_s:
        events_per_s = lifetime_req_per_s
    eta_s = remaining / events_per_s if events_per_s else None
    from_window = eta_s is not None and not any(b.eta_settling for b in live)
    plan = readings.plan
    # The runs the standing hold stopped are no failures to chase one by one: the hold's verdict names their shards
    # and the one command that runs them again after the release.
    stopped_by_the_hold = readings.stopped_by_the_standing_hold
    return ProgressAnswer(
        events_planned=readings.events_planned,
        events_done=done,
        held_runs_answers=sum(b.done_events for b in readings.held_runs),
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
        lifetime_req_per_s=lifetime_req_per_s,
        lifetime_output_tok_per_s=sum(b.output_tokens for b in beats) / span if span else 0.0,
        avg_output_tokens=avg_output,
        eta_hours=eta_s / 3600 if eta_s is not None else None,
        lifetime_span_hours=span / 3600,
        plan=plan,
        plan_eta_hours=plan.eta_hours(remaining) if plan else None,
        plan_floor=plan.floor_reason(fleet_slots(readings.fleet)) if plan else None,
        events_ok=ok_events,
        eta_settling=settling,
        eta_basis=(ETA_FROM_WINDOW if from_window else ETA_FROM_LIFETIME) if eta_s is not None else "",
        shards_failed=sorted(
            b.shard
            for b in beats
            if b.state == "failed" and b.shard not in readings.published and b.shard not in stopped_by_the_hold
        ),
        shards_publishing={
            b.shard: readings.now - b.updated_at
            for b in sorted(readings.live, key=lambda b: b.shard)
            if b.state == "generated"
        },
    )


def fleet_slots(fleet: dict[str, dict[str, Any]]) -> int:
    """Requests the healthy servers run at once, by their own caps."""
    return sum(int(probe.get("max_running_requests") or 0) for probe in fleet.values() if probe.get("healthy"))


def held_runs_text(progress: ProgressAnswer, *, brief: bool = False) -> str:
    """What to add after the events done while the held runs' answers are in no count (`held_runs_answers`), so that
    the count is not read as fallen: " + 127 answered by the held shard runs (…)"; `brief`: " +127 held", for the
    page's first screen (as `eta_text`)."""
    p = progress
    if not p.held_runs_answers:
        return ""
    if brief:
        return f" +{fmt(p.held_runs_answers)} held"
    when = "at the release" if p.held else "as the release said, once their shards run again"
    return f" + {fmt(p.held_runs_answers)} answered by the held shard runs (kept or dropped {when})"


def eta_text(progress: ProgressAnswer, *, brief: bool = False) -> str:
    """ "1.25 h", marked when it comes from the lifetime rate; "done" with no event left; or why there is no figure.
    `brief`: the same in a few words, for the page's first screen, whose lines must each fit one line of its value
    column at 1,440 px."""
    if progress.events_planned and not progress.events_remaining:
        return "done"
    if progress.held:
        if brief:  # the held runs' figure beside it names the hold already (`held_runs_text`)
            return "none" if progress.held_runs_answers else "none (held)"
        return "none while the line is held"
    if progress.eta_hours is None and progress.events_remaining and progress.shards_running:
        return "none yet" if brief else "none yet (no answer has finished)"
    if progress.eta_hours is None:
        return "none (idle)" if brief else "none: no shard is running"
    if progress.eta_basis == ETA_FROM_LIFETIME:
        settling = "settling" if brief else "at the lifetime rate so far: the windowed rate is still settling"
        return f"{fmt(progress.eta_hours, 2)} h ({settling})"
    return f"{fmt(progress.eta_hours, 2)} h"


def render_progress(progress: ProgressAnswer, now: float) -> list[str]:
    p = progress
    lines = [
        "1. Progress vs estimates",
        f"   events {fmt(p.events_done)}/{fmt(p.events_planned)} ({p.fraction_done:.1%}){held_runs_text(p)}, "
        f"shards running {counted_shards(p.shards_running)}",
        "   rate: "
        + (
            f"window {fmt(p.window_req_per_s, 2)} req/s, {fmt(p.window_output_tok_per_s)} out tok/s; "
            if p.shards_running
            else "no shard running now; "
        )
        + f"lifetime {fmt(p.lifetime_req_per_s, 2)} req/s, {fmt(p.lifetime_output_tok_per_s)} out tok/s "
        f"over {fmt(p.lifetime_span_hours * 60, 1)} min of generation",
        f"   avg output tokens {fmt(p.avg_output_tokens)}; ETA {eta_text(p)}",
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
            f"{p.plan.output_tok_per_s} out tok/s{_measured(p.plan)} → ETA {fmt(p.plan_eta_hours, 2)} h for what "
            "remains" + (f" ({p.plan_floor})" if p.plan_floor else "")
        )
    return lines


def _measured(plan: Plan) -> str:
    """What a pilot measured beyond the rates: the answers' lengths, accept length and error share."""
    percentiles = plan.output_tokens_percentiles
    parts = [f"out tokens p50 {fmt(percentiles['p50'], 0)}, p90 {fmt(percentiles['p90'], 0)}"] if percentiles else []
    if plan.accept_length:
        parts.append(f"accept length {plan.accept_length:.2f}")
    if plan.error_share is not None:
        parts.append(f"errors {plan.error_share:.1%}")
    return "".join(f", {part}" for part in parts)
