"""The operator's page: the six answers (`ops.status`) as sections of short Markdown and tables, the figures
Dagster plots over time.

`report_sections` is the `run_report` asset's page, one metadata entry per text and table so that Dagster's
asset page shows each in place; `render_markdown` the same page as one document. `plot_metrics` is the fleet's
numeric metadata (one series per key figure), `shard_progress_figures` a running shard's (named after the shard,
so shards running side by side plot as lines of their own); unknown figures are left out rather than written
as 0, so a plot never dips to a false zero. The charts of the run so far are `ops.report_chart`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dagster_project.generation.progress import Heartbeat
from dagster_project.ops.answers.concurrency import describe_model, describe_slow, lengths_note
from dagster_project.ops.answers.cost import idle_line, render_cost, spent_line
from dagster_project.ops.answers.coverage import by_id_summary
from dagster_project.ops.answers.mtp import mtp_verdict
from dagster_project.ops.answers.multi_turn import generated_of_planned
from dagster_project.ops.answers.progress import eta_text, held_runs_text
from dagster_project.ops.answers.quality import figure_reading, figure_verdict
from dagster_project.ops.answers.shards import GREEN, ShardsAnswer, green_shards
from dagster_project.ops.answers.storage import retried_calls
from dagster_project.ops.answers.text import as_of, counted, counted_shards, counts_in_line, dollars, shard_list, some
from dagster_project.ops.answers.waste import WasteAnswer
from dagster_project.ops.status import Status
from dagster_project.shown_text import shown, shown_markdown

# Key figures first, each cell and header a few characters (the two pool usages in one column), so the table fits the
# asset page's value column at 1,440 px: Dagster does not wrap a table's headers, and the page's timestamp column
# beside it widens with a two-digit hour or day. What limits a server, in full, is in the next table, where the
# sentence can wrap.
# The model each server serves is in the next table too (a sixth column made this one 499 px at its narrowest, wider
# than the value column at 1,440 px): its name and verdict can wrap there.
SERVER_COLUMNS = ["server", "busy/cap", "queued", "KV/mamba", "limit"]
# Measured / planned within this band of 1 is "on plan".
ON_PLAN_BAND = 0.1
# Dagster 1.13's asset page shows a Markdown metadata value in place only while it is shorter than this; a longer
# one hides behind a "[Show Markdown]" dialog. Each section's text and each inline chart stay under it.
INLINE_MARKDOWN_CHARS = 1000
# The characters of an "At a glance" answer that fit one line of the value column at 1,440 px, after its number
# (measured in Chromium: "all_turns: 26 multi-turn; turns 10 of 270" wrapped before its 48th, "planned").
GLANCE_LINE_CHARS = 47


def _num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


@dataclass(frozen=True)
class Table:
    """A table of the page: formatted cells (rounded, "—" when unknown), one row per item."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def markdown(self) -> list[str]:
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(shown_markdown(cell).replace("|", "\\|") for cell in cells) + " |"

        return [line(self.columns), "|" + "---|" * len(self.columns), *(line(row) for row in self.rows), ""]


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A table's cells as text, one line each, what the data and the servers wrote in them escaped (`shown`)."""
    return Table(tuple(columns), tuple(tuple(shown(cell) for cell in row) for row in rows))


@dataclass(frozen=True)
class Section:
    """One answer of the page: a short Markdown text (kept under `INLINE_MARKDOWN_CHARS`, so Dagster shows it
    in place) under the title, and its tables, each under a label of its own (no two entries of the page share
    a label)."""

    title: str
    text: str = ""
    tables: tuple[tuple[str, Table], ...] = ()


def gate_label(stage: str, gate: str) -> str:
    """A blocking gate as the page's tables name it: "short_answers (completions quality)". Its name first, as a word
    of its own: "quality/short_answers" cannot wrap, and with a thresholds column beside it was wider than the value
    column holds at 1,440 px."""
    check, _, name = gate.rpartition("/")
    return f"{name} ({stage} {check})" if check else f"{name} ({stage})"


def server_name(url: str) -> str:
    """A server as the tables show it: `http://10.0.0.12:30000` → `10.0.0.12:30000`."""
    return url.split("://", 1)[-1].rstrip("/")


def limit_label(limited_by: str) -> str:
    """What limits a server in a few words, for the servers table: the statement up to its detail (after ":" or
    " (")."""
    return limited_by.split(":", 1)[0].split(" (", 1)[0]


def verdict(ratio: float | None, higher_is_better: bool = True) -> str:
    if ratio is None:
        return "—"
    if abs(ratio - 1) <= ON_PLAN_BAND:
        return "on plan"
    ahead = ratio > 1 if higher_is_better else ratio < 1
    return "ahead of plan" if ahead else "behind plan"


def floor_verdict(ratio: float | None, higher_is_better: bool = True) -> str:
    """Against a plan whose rates are a floor (a pilot that never filled the fleet): above it is expected, not
    "ahead of plan"; below it is still behind."""
    if ratio is None:
        return "—"
    above = ratio > 1 if higher_is_better else ratio < 1
    return "above the pilot's floor" if above else verdict(ratio, higher_is_better)


def length_verdict(ratio: float | None) -> str:
    """Answers longer or shorter than planned are neither ahead nor behind: the rates and the ETA say what that
    does to the run."""
    if ratio is None:
        return "—"
    if abs(ratio - 1) <= ON_PLAN_BAND:
        return "as planned"
    return "longer than plan" if ratio > 1 else "shorter than plan"


def _ratio(measured: float | None, planned: float | None) -> float | None:
    return measured / planned if measured is not None and planned else None


def _plan_table(status: Status) -> Table | None:
    p = status.progress
    plan = p.plan
    if plan is None:
        return None
    running = bool(p.shards_running)
    req = p.window_req_per_s if running else p.lifetime_req_per_s or None
    tok = p.window_output_tok_per_s if running else p.lifetime_output_tok_per_s or None
    rate_verdict = floor_verdict if p.plan_floor else verdict
    figures = [
        ("req/s", req, plan.req_per_s, 2, rate_verdict),
        ("output tok/s", tok, plan.output_tok_per_s, 0, rate_verdict),
        ("avg output tokens", p.avg_output_tokens, plan.avg_output_tokens, 0, length_verdict),
        ("ETA, rest (h)", p.eta_hours, p.plan_eta_hours, 2, lambda r: rate_verdict(r, higher_is_better=False)),
    ]
    # What a pilot measured besides the rates (`pilot.stage.plan_from_pilot`); a plan by hand has neither.
    if plan.accept_length:
        mtp = status.mtp
        accept = mtp.accept_length_window if running else mtp.accept_length_published_shards
        figures.append(("accept length", accept, plan.accept_length, 2, verdict))
    if plan.error_share is not None:
        errors = 1 - p.events_ok / p.events_done if p.events_ok is not None and p.events_done else None
        # Fewer errors than planned is ahead; a plan of none gives no ratio (the error_rate gate judges them).
        figures.append(("error share", errors, plan.error_share, 3, lambda r: verdict(r, higher_is_better=False)))
    rows = []
    for name, measured, planned, digits, judge in figures:
        ratio = _ratio(measured, planned)
        rows.append([name, _num(measured, digits), _num(planned, digits), _num(ratio, 2), judge(ratio)])
    measured_header = "recent" if running else "lifetime"
    return _table(["figure", measured_header, "plan", "×plan", "verdict"], rows)


def _alerts(status: Status) -> Section:
    if not status.alerts:
        return Section("Alerts", "No alerts.")
    return Section(
        "Alerts",
        tables=(
            (
                "Alerts",
                _table(["alert", "what needs the operator"], [[alert.kind, alert.message] for alert in status.alerts]),
            ),
        ),
    )


def _hold(status: Status) -> Section:
    """First on the page while the line is held: what holds it and the way out."""
    hold = status.quality.hold
    examples = [[e.event_id, server_name(e.server) if e.server else "—", e.answer_head] for e in hold.examples]
    return Section(
        "LINE HELD",
        f"**{hold.headline()}**",
        tables=(("Hold evidence", _table(["event", "server", "answer (head)"], examples)),) if examples else (),
    )


def _quality(status: Status) -> Section:
    """The quality watch: each blocking answer gate over the running shards' answers, with threshold and n."""
    quality = status.quality
    title = "Quality watch"
    if quality is not None and quality.hold is not None:
        return Section(title, "None while the line is held: the hold, at the top of the page, is the verdict.")
    if quality is None or not quality.fleet:
        return Section(title, "No shard has reported answers yet.")
    # The figure, its threshold and n in one cell, as status words them: a cell wraps at its spaces where the page is
    # narrow, a header never does (five columns of their own pushed the page past 1,440 px once n had 4 digits).
    rows = [[f.label, figure_reading(f), figure_verdict(f)] for f in quality.fleet]
    text = f"Over {quality.fleet_answers:,} answers of {quality.fleet_runs} shard runs, fleet-wide."
    return Section(title, text, (("Watched gates", _table(["gate", "figure", "verdict"], rows)),))


# The page's table of shards that need a look shows this many rows (`dflash status --json` has them all).
SHOWN_SHARDS = 50


def _shard_counts(answer: ShardsAnswer, stage: str, counts: dict[str, int]) -> str:
    return ", ".join(
        f"{state} {n:,}" + ("" if state in GREEN else f" ({shard_list(answer.not_green[f'{stage} {state}'])})")
        for state, n in counts.items()
    )


def _shards(status: Status) -> Section:
    title = "Shards by stage"
    answer = status.shards
    if answer is None or not answer.shards:
        return Section(title, "No shards yet: materialize conversations.")
    done = (
        "**Done**: every shard exported with every blocking gate green."
        if answer.done
        else f"**Not done**: {green_shards(answer):,} of {answer.shards:,} exported with every blocking gate green."
    )
    text = [
        done,
        "",
        f"Completions: {_shard_counts(answer, 'completions', answer.completions)}",
        "",
        f"Training set: {_shard_counts(answer, 'training_set', answer.training_set)}",
        "",
        f"Export: {_shard_counts(answer, 'export', answer.export)}",
    ]
    rows, gates = [], {}
    for state in answer.needs_a_look:
        shard = str(state.shard)
        rows += [
            [shard, f"{failure.stage} blocked", gate_label(failure.stage, failure.gate)] for failure in state.blocked_by
        ]
        gates.update(((failure.stage, failure.gate), failure) for failure in state.blocked_by)
        rows += [[shard, "overridden", gate] for gate in state.overridden]
        rows += [[shard, "damaged", problem] for problem in state.damaged_objects]
        if state.refused and not state.blocked_by:
            rows.append([shard, "export refused", state.refused])
    tables = ()
    if rows:
        # Three narrow columns, readable at 1,440 px; a gate's thresholds and override, the same for every shard it
        # blocked, are one row of their own table (five columns did not fit the value column beside Dagster's panel).
        tables = (("Shards needing a look", _table(["shard", "state", "what"], rows[:SHOWN_SHARDS])),)
    if gates:
        gate_rows = [
            [gate_label(stage, gate), "; ".join(filter(None, (f.thresholds, f.override)))]
            for (stage, gate), f in sorted(gates.items())
        ]
        tables += (("Blocking gates", _table(["gate", "thresholds; override"], gate_rows)),)
    return Section(title, "\n".join(text), tables)


def _progress(status: Status) -> Section:
    p = status.progress
    text = [
        f"{_num(p.events_done)} of {_num(p.events_planned)} events ({p.fraction_done:.1%}){held_runs_text(p)}; "
        f"shards running: {counted_shards(p.shards_running)}"
        + (f"; dead: {counted_shards(p.shards_dead)}" if p.shards_dead else "")
        + (f"; failed: {counted_shards(p.shards_failed)}" if p.shards_failed else ""),
        "",
        f"ETA at the measured rate: **{eta_text(p)}**; "
        + (f"at the plan's rate: **{_num(p.plan_eta_hours, 2)} h**; " if p.plan_eta_hours is not None else "")
        + f"lifetime {_num(p.lifetime_req_per_s, 2)} req/s, {_num(p.lifetime_output_tok_per_s)} output tok/s over "
        f"{_num(p.lifetime_span_hours * 60, 1)} min of generation",
        "",
        (f"Plan: {p.plan.source}" + (f"; {p.plan_floor}" if p.plan_floor else ""))
        if p.plan
        else "No plan recorded (`dflash plan`).",
    ]
    plan = _plan_table(status)
    return Section("1. Progress vs plan", "\n".join(text), (("1. Plan vs measured", plan),) if plan else ())


def _mtp(status: Status) -> Section:
    mtp = status.mtp
    text = (
        f"{mtp_verdict(mtp)}; accept length on our recent requests "
        f"**{_num(mtp.accept_length_window, 2)}**, over the published shards "
        f"{_num(mtp.accept_length_published_shards, 2)}"
        f"; does it pay (last `dflash tune`): {mtp.tuned or 'not measured (no tuning sweep)'}"
    )
    if not mtp.speculative_algorithm:
        return Section("2. MTP (speculative decoding)", text)
    servers = _table(
        ["server", "MTP", "accept length"],
        [
            [server_name(url), name or "OFF", _num(mtp.server_avg_spec_accept_length.get(url), 2)]
            for url, name in mtp.speculative_algorithm.items()
        ],
    )
    return Section("2. MTP (speculative decoding)", text, (("2. MTP per server", servers),))


def _concurrency(status: Status) -> Section:
    c = status.concurrency
    title = "3. Concurrency per server"
    if not c.servers:
        return Section(title, "No server known: start a fleet (`dflash fleet up`) or set DFLASH_SGLANG_ENDPOINTS.")
    servers = _table(
        SERVER_COLUMNS,
        [
            [
                server_name(url),
                f"{_num(row.running)}/{_num(row.effective_cap)}",
                _num(row.queued),
                f"{_percent(row.kv_usage)}/{_percent(row.mamba_usage)}",
                limit_label(row.limited_by),
            ]
            for url, row in c.servers.items()
        ],
    )
    why = _table(
        ["server", "its model; what limits it now; its cap"],
        [
            [
                server_name(url),
                f"Model: {describe_model(row, c.served_model)}. "
                f"Now: {row.limited_by}; ours in flight {_num(row.in_flight)} of a window of "
                f"{_num(row.client_window)}. Cap: "
                + (row.capacity.explanation if row.capacity else row.capacity_error or "—"),
            ]
            for url, row in c.servers.items()
        ],
    )
    tables = [("3. Servers", servers), ("3. Capacity per server", why)]
    if c.slow_servers:  # after the run as well as during it
        slow = _table(
            ["server", "set aside for slowness"], [[server_name(s.url), describe_slow(s)] for s in c.slow_servers]
        )
        tables.append(("3. Slow servers", slow))
    return Section(title, f"{len(c.servers)} servers; capacity at {c.lengths}{lengths_note(c.lengths)}.", tuple(tables))


def _storage(status: Status) -> Section:
    s = status.storage
    fingerprints = [f"`{fp}` × {n:,}" for fp, n in s.settings_fingerprints.items()]
    text = [
        f"`{s.store}`: **{s.shards_published:,} of {s.shards_total:,}** shards published "
        f"(Dagster: {_num(s.shards_materialized)} materialized), {s.bytes_published / 1e6:,.1f} MB, "
        f"failed uploads {s.failed_uploads}, last publish "
        f"{as_of(s.last_publish_at) if s.last_publish_at else 'never'}",
        "",
        f"Generation settings of published shards: {some(fingerprints) if fingerprints else '—'}"
        + (f"; stale (other settings than configured now): {some(s.stale_shards)}" if s.stale_shards else ""),
        *(["", _sentence(retried_calls(s))] if s.store_retries else []),
    ]
    return Section("4. Storage", "\n".join(text))


def _coverage(status: Status) -> Section:
    cov = status.coverage
    reasons = cov.quarantined_by_reason
    text = [
        f"Input rows {_num(cov.input_rows)} → normalized {_num(cov.normalized)} + quarantined "
        f"{_num(cov.quarantined)}" + (f" ({counts_in_line(reasons)})" if reasons else ""),
        "",
        f"Events planned {_num(cov.events_planned)}, in published shards {_num(cov.events_in_published_shards)} "
        f"(errors {_num(cov.errors_in_published_shards)}).",
    ]
    if cov.by_id:
        b = cov.by_id
        text.append(f"By id (as of {as_of(b.computed_at)}): {by_id_summary(b)}.")
    tables = ()
    if cov.by_source:
        sources = _table(
            ["source", "rows in", "conversations", "quarantined"],  # short headers: see SERVER_COLUMNS
            [
                [name, _num(t.input_rows), _num(t.conversations), _num(t.quarantined)]
                for name, t in cov.by_source.items()
            ],
        )
        tables = (("5. Coverage by source", sources),)
    return Section("5. Coverage", "\n".join(text), tables)


def _multi_turn(status: Status) -> Section:
    turns = status.multi_turn
    return Section(
        "6. Multi-turn",
        f"Policy `{turns.policy}`: {_num(turns.multi_turn_conversations)} multi-turn of "
        f"{_num(turns.conversations)} conversations; assistant turns generated {generated_of_planned(turns)}.",
    )


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}."


def _cost(status: Status) -> Section:
    cost = status.cost
    waste = (("Waste by cause", _waste(status.waste)),) if status.waste else ()
    if cost is None:
        return Section("Cost", _sentence(render_cost(None)[0].removeprefix("7. Cost: ")), waste)
    # One figure a row (seven columns side by side would not fit the page's value column), the key ones first.
    figures = _table(
        ["figure", "cost"],
        [
            ["spent", f"${cost.spent:,.2f}"],
            ["to finish", dollars(cost.to_finish)],
            ["to finish (plan)", dollars(cost.to_finish_plan)],
            ["fleet $/hour", f"${cost.cost_per_hour:,.2f} ({cost.gpus} GPUs)"],
            ["$ / 1M output tokens", dollars(cost.per_million_output_tokens)],
            ["$ / 1M trained tokens", dollars(cost.per_million_trained_tokens)],
            ["GPU-hours / 1K kept rows", _num(cost.gpu_hours_per_1k_rows, 3)],
            ["fleet idle", dollars(cost.idle_cost)],
        ],
    )
    idle = idle_line(cost)
    return Section("Cost", _sentence(f"{spent_line(cost)}{f'; {idle}' if idle else ''}"), (("Cost", figures), *waste))


def _waste(waste: WasteAnswer) -> Table:
    """The waste ledger as the text says it: each cause's answers, output tokens and dollars, then what was trained
    and what is pending, which with the causes make up what was generated. Short headers and no GPU-seconds column
    (the dollars are priced from them; `dflash status --json` has both): the longest cause
    (`prompt_fills_max_length`) cannot wrap, and the table must fit the value column at 1,440 px."""
    rows = [
        [cause, _num(waste.answers.get(cause, 0)), _num(count), dollars(waste.dollars.get(cause))]
        for cause, count in waste.output_tokens.items()
    ]
    rows += [
        ["trained", "", _num(waste.trained_output_tokens), ""],
        ["pending", "", _num(waste.pending_output_tokens), ""],
        ["generated", "", _num(waste.generated_output_tokens), ""],
    ]
    return _table(["cause", "answers", "tokens", "cost"], rows)


def _at_a_glance(status: Status) -> Section:
    """The verdict and a line for each of the six questions: what the asset page's first screen shows (Dagster 1.13
    puts the first metadata entries above the fold; the sections below have the detail). Each answer fits one line
    of the value column at 1,440 px (`GLANCE_LINE_CHARS`): wrapped, a settling ETA's words and the turns' "planned"
    pushed the sixth answer to the bottom edge of a 900 px screen."""
    p, mtp, storage, turns = status.progress, status.mtp, status.storage, status.multi_turn
    hold = status.quality.hold if status.quality else None
    shards = status.shards
    if hold:
        headline = f"**LINE HELD**: gate {hold.gate} at {hold.figure:.1%} — see `dflash hold`, then release it"
    elif shards is not None and shards.shards and shards.done:
        headline = "**DONE**: every shard exported with every blocking gate green"
    elif shards is not None and shards.shards:
        headline = f"**Not done**: {green_shards(shards):,} of {shards.shards:,} shards exported green"
    else:
        headline = "**Nothing to report yet**: materialize conversations"
    alerts = len(status.alerts)
    headline += f"; {counted(alerts, 'alert')}" if alerts else "; no alerts"
    caps = sorted({row.effective_cap for row in status.concurrency.servers.values() if row.effective_cap is not None})
    limits = sorted({limit_label(row.limited_by) for row in status.concurrency.servers.values()})
    accept = mtp.accept_length_window or mtp.accept_length_published_shards
    by_id = status.coverage.by_id
    lines = [
        headline,
        f"1. {_num(p.events_done)}/{_num(p.events_planned)} events ({p.fraction_done:.1%})"
        f"{held_runs_text(p, brief=True)}; ETA {eta_text(p, brief=True)}",
        f"2. {mtp_verdict(mtp)}; accept length {_num(accept, 2)}",
        f"3. {len(status.concurrency.servers)} servers, cap {', '.join(map(str, caps)) or '—'}; "
        f"{'; '.join(limits) or 'no server known'}",
        f"4. {storage.shards_published:,}/{storage.shards_total:,} shards in the store; failed uploads "
        f"{storage.failed_uploads}",
        "5. by id: "
        + (
            f"events missing {_num(by_id.events_missing)}, duplicated {_num(by_id.events_duplicated)}"
            if by_id
            else "not counted yet"
        ),
        f"6. `{turns.policy}`: {_num(turns.multi_turn_conversations)} multi-turn; turns "
        f"{_num(turns.generated_turns_done)}/{_num(turns.generated_turns_planned)}",
    ]
    # Hard line breaks, not paragraphs: the page's paragraph spacing would push the last answers below the fold.
    return Section("At a glance", "  \n".join(lines))


def report_sections(status: Status) -> list[Section]:
    """The page in the order the operator reads it: at a glance (the verdict and the six answers in a line each),
    the hold of the line while one stands, alerts, the shards by stage, the six answers, cost, the quality watch.
    Each text as Dagster renders it, Markdown: what the data and the servers wrote in it escaped (`shown_markdown`:
    no control character, no HTML of theirs rendered)."""
    sections = [
        _at_a_glance(status),
        *([_hold(status)] if status.quality and status.quality.hold else []),
        _alerts(status),
        _shards(status),
        _progress(status),
        _mtp(status),
        _concurrency(status),
        _storage(status),
        _coverage(status),
        _multi_turn(status),
        _cost(status),
        _quality(status),
    ]
    return [replace(section, text=shown_markdown(section.text)) for section in sections]


def render_markdown(status: Status) -> str:
    """The whole page as one Markdown document (to copy or print)."""
    out = [f"**As of {as_of(status.collected_at)}**", ""]
    for section in report_sections(status):
        out += [f"### {section.title}", ""]
        if section.text:
            out += [section.text, ""]
        for _, table in section.tables:
            out += table.markdown()
    return "\n".join(out)


def _percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{fraction:.0%}"


# ---- the figures Dagster plots -----------------------------------------------------------------------------


def plot_metrics(status: Status) -> dict[str, float | int]:
    """Every key figure as a number, by a stable name; a figure not known now is absent, never 0. Each name is
    short, or breaks at a space (a server's figures: `running 10.0.0.1:30000`): the asset page's key column is as
    wide as the longest name's longest word, and at 1,440 px the values need the rest."""
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
        "accept_published": mtp.accept_length_published_shards,
        "eta_hours": p.eta_hours,
        "plan_eta_hours": p.plan_eta_hours,
        "pct_of_plan_rate": (
            round(100 * p.window_output_tok_per_s / p.plan.output_tok_per_s, 1)
            if running and p.plan and p.plan.output_tok_per_s
            else None
        ),
        "alerts": len(status.alerts),
    }
    if cost is not None:
        figures.update(
            usd_spent=round(cost.spent, 2),
            usd_to_finish=round(cost.to_finish, 2) if cost.to_finish is not None else None,
            usd_per_1m_tok=cost.per_million_output_tokens,
            gpuh_per_1k_rows=cost.gpu_hours_per_1k_rows,
        )
    for url, row in status.concurrency.servers.items():
        figures[f"in flight {server_name(url)}"] = row.in_flight
        figures[f"queued {server_name(url)}"] = row.queued
        figures[f"running {server_name(url)}"] = row.running
    return {
        name: round(value, 4) if isinstance(value, float) else value
        for name, value in figures.items()
        if value is not None
    }


def shard_progress_figures(shard_label: str, heartbeat: Heartbeat) -> dict[str, float | int]:
    """A running shard's figures for the plots, each named after its shard (`shard-00003/req_per_s`): shards run
    side by side, and one series per figure across shards would zig-zag between them. The fleet's figures over time
    are `run_report`'s. Rates are left out until the run has finished a request (before, 0 would be no measurement,
    not a stall); the accept length until a request reported speculative-decoding stats."""
    measured = heartbeat.lifetime.req_per_s > 0
    figures = {
        "done_events": heartbeat.done_events,
        "percent_done": round(100 * heartbeat.done_events / heartbeat.total_events, 2)
        if heartbeat.total_events
        else None,
        "req_per_s": round(heartbeat.window.req_per_s, 3) if measured else None,
        "output_tok_per_s": round(heartbeat.window.output_tok_per_s, 1) if measured else None,
        "accept_length": round(heartbeat.spec.accept_length_window, 3) if heartbeat.spec.accept_length_window else None,
    }
    return {f"{shard_label}/{name}": value for name, value in figures.items() if value is not None}
