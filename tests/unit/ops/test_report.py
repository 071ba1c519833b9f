"""The operator's page, cost and alerts, from made-up readings (heartbeats and server probes; no server runs)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from dagster_project.generation.line_hold import Hold
from dagster_project.generation.progress import ETA_FROM_LIFETIME, Heartbeat, Rates, SpecDecodingStats
from dagster_project.ops.alerts import DEFAULT_THRESHOLDS, Alert, AlertThresholds
from dagster_project.ops.answers.cost import NO_PRICE, FleetCost
from dagster_project.ops.answers.quality import QualityAnswer
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.shards import ShardsAnswer, ShardState, gate_failure
from dagster_project.ops.plan import Plan
from dagster_project.ops.report import (
    GLANCE_LINE_CHARS,
    INLINE_MARKDOWN_CHARS,
    as_of,
    plot_metrics,
    render_markdown,
    report_sections,
    server_name,
    shard_progress_figures,
    verdict,
)
from dagster_project.ops.status import Status, answer_all, collect_status, render_text
from dagster_project.processes import this_process
from dagster_project.store.storage import LocalStore

HOST, PID, STARTED = this_process()
URLS = ("http://gpu0:30000", "http://gpu1:30000")
PLAN = Plan(source="test plan", req_per_s=2.0, avg_output_tokens=100, output_tok_per_s=200, gpus=2)


def beat(*, accept: float | None = 2.8, req_per_s: float = 2.0, done: int = 40, total: int = 100) -> Heartbeat:
    """A live shard run (this process) half way through, 100 output tokens per answer."""
    now = time.time()
    return Heartbeat(
        shard=0,
        state="running",
        settings_fingerprint="f",
        started_at=now - 3600,
        updated_at=now,
        total_events=total,
        resumed_events=0,
        done_events=done,
        remaining_events=total - done,
        ok_events=done,
        output_tokens=100 * done,
        prompt_tokens=50 * done,
        window=Rates(120, req_per_s, 100 * req_per_s),
        eta_rates=Rates(600, req_per_s, 100 * req_per_s),
        spec=SpecDecodingStats(
            accept_length_window=accept,
            window_spec_tokens=int(280 * (accept or 0)),
            window_verify_passes=280 if accept else 0,
        ),
        servers={url: {"window": 4, "in_flight": 4} for url in URLS},
        host=HOST,
        pid=PID,
        process_start=STARTED,
        heartbeat_interval_s=5.0,
    )


def probe(*, spec: str | None = "EAGLE", running: float = 8, queued: float = 0, healthy: bool = True) -> dict:
    return {
        "healthy": healthy,
        "speculative_algorithm": spec,
        "max_running_requests": 8,
        "running": running,
        "queued": queued,
        "avg_spec_accept_length": 2.8,
        "kv_usage": 0.42,
    }


def status_of(
    beats: list[Heartbeat],
    fleet: dict[str, dict],
    *,
    plan: Plan | None = PLAN,
    cost: FleetCost = NO_PRICE,
    thresholds: AlertThresholds = DEFAULT_THRESHOLDS,
    tmp_path=None,
) -> Status:
    readings = Readings(time.time(), 1, None, None, 100, {}, beats, fleet, plan, None)
    return answer_all(
        LocalStore(tmp_path),
        readings,
        current_fingerprint=None,
        materialized=None,
        cost=cost,
        thresholds=thresholds,
        endpoints_known=bool(fleet),
    )


HEALTHY = {url: probe() for url in URLS}


def kinds(status: Status) -> list[str]:
    return [alert.kind for alert in status.alerts]


def test_a_healthy_run_on_plan_raises_no_alert_and_its_page_has_the_six_answers_as_tables(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    assert status.alerts == []
    page = render_markdown(status)
    for heading in (
        "1. Progress vs plan",
        "2. MTP",
        "3. Concurrency per server",
        "4. Storage",
        "5. Coverage",
        "6. Multi-turn",
        "Cost",
        "No alerts.",
    ):
        assert heading in page, heading
    # Short values, key figures first: the server's own figures, what limits it in a few words; the full
    # statements in the next table, where they can wrap.
    assert "| server | busy/cap | queued | KV/mamba | limit |" in page
    assert "| gpu0:30000 | 8/8 | 0 | 42%/— | balanced at the cap |" in page
    assert (
        "| gpu0:30000 | Model: — (its /server_info names none). Now: balanced at the cap (cap 8 per server); ours in "
        "flight 4 of a window of 4. Cap: " in page
    )
    # Plan vs measured: 2.0 req/s measured against 2.0 planned.
    assert "| req/s | 2.00 | 2.00 | 1.00 | on plan |" in page
    assert f"**As of {as_of(status.collected_at)}**" in page and "UTC" in page
    assert "{" not in page and "2.7745" not in page  # no Python dicts, no unrounded floats


def test_a_pilots_plan_is_compared_on_accept_length_and_error_share_too(tmp_path):
    pilot = replace(PLAN, source="pilot of 40 answers at 2026-12-04 21:29 UTC", accept_length=2.8, error_share=0.02)
    pilot = replace(pilot, output_tokens_percentiles={"p10": 20.0, "p50": 90.0, "p90": 210.0, "p99": 400.0})
    status = status_of([beat()], HEALTHY, plan=pilot, tmp_path=tmp_path)
    page = render_markdown(status)
    assert "| accept length | 2.80 | 2.80 | 1.00 | on plan |" in page
    assert "| error share | 0.000 | 0.020 | 0.00 | ahead of plan |" in page  # no error so far
    assert (
        "plan (pilot of 40 answers at 2026-12-04 21:29 UTC): 2.0 req/s, 100 avg out tokens, 200 out tok/s, out tokens "
        "p50 90, p90 210, accept length 2.80, errors 2.0% → ETA" in render_text(status)
    )
    plain = render_markdown(status_of([beat()], HEALTHY, tmp_path=tmp_path))  # a plan by hand has neither figure
    assert "| accept length | 2.80 | 2.80 |" not in plain and "| error share |" not in plain


def test_plotted_figures_leave_unknown_values_out_instead_of_writing_zero(tmp_path):
    known = plot_metrics(status_of([beat()], HEALTHY, tmp_path=tmp_path))
    assert known["accept_length"] == 2.8 and known["req_per_s"] == 2.0 and known["output_tok_per_s"] == 200.0
    assert known["pct_of_plan_rate"] == 100.0 and known["eta_hours"] == pytest.approx(60 / 2 / 3600, abs=1e-4)
    assert known["in flight gpu0:30000"] == 4 and known["queued gpu1:30000"] == 0
    assert all(isinstance(value, int | float) for value in known.values())
    unknown = plot_metrics(status_of([beat(accept=None)], {}, plan=None, tmp_path=tmp_path))
    assert "accept_length" not in unknown and "plan_eta_hours" not in unknown and "usd_spent" not in unknown
    assert unknown["in flight gpu0:30000"] == 4  # the dispatcher knows; the unreached server does not
    assert not any(name.startswith(("running ", "queued ")) for name in unknown)


def test_plotted_figure_names_are_short_words_so_the_key_column_stays_narrow(tmp_path):
    # The asset page's key column is as wide as the longest word of a key (a word cannot wrap): at 1,440 px the
    # values need all but about 160 px of the metadata table. A server's figures break at the space before it.
    names = plot_metrics(status_of([beat()], HEALTHY, tmp_path=tmp_path))
    servers = {server_name(url) for url in URLS}
    assert {name.split(" ")[-1] for name in names if " " in name} == servers
    longest = max((word for name in names for word in name.split(" ") if word not in servers), key=len)
    assert len(longest) <= len("output_tok_per_s"), longest


def test_cost_spent_to_finish_per_million_tokens_and_gpu_hours_per_thousand_rows(tmp_path):
    status = status_of([beat()], HEALTHY, cost=FleetCost(cost_per_gpu_hour=3.5), tmp_path=tmp_path)
    cost = status.cost
    assert cost.cost_per_hour == 7.0 and cost.gpus == 2  # one GPU per server reached
    assert cost.spent == pytest.approx(7.0, rel=1e-3)  # one hour of generation
    assert cost.to_finish == pytest.approx(7.0 * 30 / 3600, rel=1e-3)  # 60 events at 2 req/s
    assert cost.per_million_output_tokens == pytest.approx(7.0 / (200 * 3600) * 1e6)
    assert cost.gpu_hours_per_1k_rows == pytest.approx(2 * 1.0 / 40 * 1000, rel=1e-3)
    assert "7. Cost at $7.00/hour (2 GPUs)" in render_text(status)
    page = render_markdown(status)  # one figure a row, the key ones first
    assert "| spent | $7.00 |" in page and "| fleet $/hour | $7.00 (2 GPUs) |" in page
    assert status_of([beat()], HEALTHY, tmp_path=tmp_path).cost is None
    eight = status_of([beat()], HEALTHY, cost=FleetCost(cost_per_gpu_hour=3.5, gpus=8), tmp_path=tmp_path).cost
    assert eight.cost_per_hour == 28.0


def test_alerts_mtp_off_or_accepting_little_a_swamped_or_idle_server_a_slipping_eta_and_a_down_fleet(tmp_path):
    mtp_off = status_of([beat()], {URLS[0]: probe(spec=None), URLS[1]: probe()}, tmp_path=tmp_path)
    assert kinds(mtp_off) == ["mtp"] and URLS[0] in mtp_off.alerts[0].message
    low = status_of([beat(accept=1.2)], HEALTHY, tmp_path=tmp_path)
    assert kinds(low) == ["mtp"] and "accept length 1.20" in low.alerts[0].message
    assert kinds(status_of([beat(accept=1.2)], HEALTHY, thresholds=AlertThresholds(1.1), tmp_path=tmp_path)) == []
    swamped = status_of([beat()], {URLS[0]: probe(queued=9), URLS[1]: probe()}, tmp_path=tmp_path)
    assert kinds(swamped) == ["server"] and "9 queued" in swamped.alerts[0].message
    idle = status_of([beat()], {URLS[0]: probe(running=0), URLS[1]: probe()}, tmp_path=tmp_path)
    assert kinds(idle) == ["server"] and "idle" in idle.alerts[0].message
    slow = status_of([beat(req_per_s=1.0)], HEALTHY, tmp_path=tmp_path)  # half the plan's rate: ETA doubles
    assert kinds(slow) == ["eta"] and "100% past the plan" in slow.alerts[0].message
    down = status_of([beat()], {url: {"healthy": False} for url in URLS}, tmp_path=tmp_path)
    assert "fleet" in kinds(down) and "the fleet is unreachable" in render_text(down)
    failed = status_of(
        [beat(), Heartbeat(**{**beat().__dict__, "shard": 1, "state": "failed"})], HEALTHY, tmp_path=tmp_path
    )
    assert kinds(failed) == ["shards"] and "[1]" in failed.alerts[0].message
    page = render_markdown(low)
    assert "### Alerts" in page and "| mtp | accept length 1.20" in page


def test_a_pilot_too_small_to_fill_the_fleet_is_a_floor_not_a_plan_to_be_ahead_of(tmp_path):
    # Two servers of 8 slots; a pilot of 9 answers never ran them full, so 2.0 req/s against its 0.5 is expected.
    pilot = replace(PLAN, source="pilot of 9 answers at 2026-12-04 21:29 UTC", req_per_s=0.5, sample_answers=9)
    status = status_of([beat()], HEALTHY, plan=pilot, tmp_path=tmp_path)
    reason = "the pilot's 9 answers never filled the fleet's 16 request slots: its rates are a floor"
    assert reason in render_text(status)
    page = render_markdown(status)
    assert reason in page
    assert "| req/s | 2.00 | 0.50 | 4.00 | above the pilot's floor |" in page and "ahead of plan" not in page
    # A pilot that filled the fleet is a plan like any other.
    full = status_of([beat()], HEALTHY, plan=replace(pilot, sample_answers=400), tmp_path=tmp_path)
    assert "| req/s | 2.00 | 0.50 | 4.00 | ahead of plan |" in render_markdown(full)
    assert "never filled" not in render_text(full)


def test_at_a_glance_is_the_verdict_and_a_line_for_each_question_first_on_the_page(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    glance = report_sections(status)[0]
    assert glance.title == "At a glance" and len(glance.text) < INLINE_MARKDOWN_CHARS
    lines = glance.text.split("  \n")
    assert lines[0].startswith("**Not done**") or lines[0].startswith("**Nothing to report yet**")
    assert [line[:3] for line in lines[1:]] == ["1. ", "2. ", "3. ", "4. ", "5. ", "6. "]
    assert "accept length" in lines[2] and "2 servers, cap 8" in lines[3]
    hold = Hold("short_answers", "90% short", figure=0.9, threshold=0.1, sample_size=40, scope="fleet", held_at=0.0)
    held = replace(status, quality=QualityAnswer(hold=hold), progress=status.progress.while_held())
    text = report_sections(held)[0].text
    assert text.startswith("**LINE HELD**: gate short_answers at 90.0%") and "ETA none (held)" in text


def test_plan_verdicts_read_the_ratio_the_right_way_round():
    assert verdict(1.05) == "on plan" and verdict(1.5) == "ahead of plan" and verdict(0.5) == "behind plan"
    assert verdict(1.5, higher_is_better=False) == "behind plan"  # an ETA 1.5x the plan's
    assert verdict(None) == "—"


def test_shard_0_running_is_counted_not_read_as_none(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)  # shard 0 runs
    assert "shards running 1 (0)" in render_text(status)
    assert "shards running: 1 (0)" in render_markdown(status)


def test_every_section_text_stays_short_enough_to_show_in_place_at_the_real_jobs_scale(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    shards = list(range(1830))
    status = replace(
        status,
        progress=replace(status.progress, shards_running=shards[:64], shards_dead=shards, shards_failed=shards),
        storage=replace(status.storage, stale_shards=shards, settings_fingerprints={f"{n:016x}": n for n in range(40)}),
        coverage=replace(status.coverage, quarantined_by_reason={f"reason {n}": n for n in range(40)}),
        shards=ShardsAnswer(
            shards=1830,
            completions={"published": 1830},
            training_set={"passed": 915, "blocked": 915},
            export={"exported": 915, "not exported": 915},
            not_green={"training_set blocked": shards[::2], "export not exported": shards[::2]},
            needs_a_look=[],
            done=False,
        ),
    )
    sections = report_sections(status)
    assert [section.title for section in sections][:9] == [
        "At a glance",
        "Alerts",
        "Shards by stage",
        "1. Progress vs plan",
        "2. MTP (speculative decoding)",
        "3. Concurrency per server",
        "4. Storage",
        "5. Coverage",
        "6. Multi-turn",
    ]
    for section in sections:
        assert len(section.text) < INLINE_MARKDOWN_CHARS, (section.title, len(section.text))
    labels = [label for s in sections for label in ([s.title] if s.text else []) + [t for t, _ in s.tables]]
    assert len(labels) == len(set(labels))  # one metadata entry each
    progress = sections[3].text
    assert "shards running: 64 (0-63); dead: 1,830 (0-1829); failed: 1,830 (0-1829)" in progress
    # The tables carry the rows a sentence cannot: one per server, each cell formatted.
    servers = dict(sections[5].tables)["3. Servers"]
    assert [row[0] for row in servers.rows] == ["gpu0:30000", "gpu1:30000"] and servers.rows[0][1:4] == (
        "8/8",
        "0",
        "42%/—",
    )


def test_a_shards_plotted_figures_are_named_after_it_and_leave_out_what_is_not_measured_yet():
    running = shard_progress_figures("shard-00003", replace(beat(), lifetime=Rates(3600, 0.01, 1.0)))
    assert running == {
        "shard-00003/done_events": 40,
        "shard-00003/percent_done": 40.0,
        "shard-00003/req_per_s": 2.0,
        "shard-00003/output_tok_per_s": 200.0,
        "shard-00003/accept_length": 2.8,
    }
    # Just started: nothing finished yet, so no rate (a 0 would plot as a stall), no accept length.
    start = replace(beat(accept=None, req_per_s=0.0, done=0), lifetime=Rates(5, 0.0, 0.0))
    assert shard_progress_figures("shard-00004", start) == {
        "shard-00004/done_events": 0,
        "shard-00004/percent_done": 0.0,
    }
    # Stalled after finishing requests: a measured 0, plotted as such.
    stalled = replace(beat(req_per_s=0.0), lifetime=Rates(3600, 0.01, 1.0))
    assert shard_progress_figures("shard-00003", stalled)["shard-00003/req_per_s"] == 0.0


def test_status_without_a_fleet_says_so_in_one_line(tmp_path):
    text = render_text(collect_status(LocalStore(tmp_path / "store"), []))
    concurrency = text.split("3. Concurrency")[1].split("4. Storage")[0].strip().splitlines()
    assert len(concurrency) == 2 and "no server known: start a fleet" in concurrency[1]


def test_the_text_answers_say_when_their_readings_were_taken(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    assert render_text(status).splitlines()[0] == f"As of {as_of(status.collected_at)}"


def test_shards_needing_a_look_fit_three_columns_and_each_blocking_gate_is_said_once(tmp_path):
    """At 1,440 px the value column beside Dagster's panel holds three narrow columns: a gate's thresholds and
    override, the same for every shard it blocked, are one row of their own table, not repeated on every shard."""
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    gate = gate_failure("training_set", "gates/loss_sum_concentration", "BLOCKED: 50% of rows")
    blocked = [ShardState(shard, "published", "blocked", "not exported", blocked_by=[gate]) for shard in range(3)]
    not_green = {"training_set blocked": [0, 1, 2], "export not exported": [0, 1, 2]}
    shards = ShardsAnswer(3, {"published": 3}, {"blocked": 3}, {"not exported": 3}, not_green, blocked, False)
    sections = report_sections(replace(status, shards=shards))
    tables = dict(next(section for section in sections if section.title == "Shards by stage").tables)
    look, gates = tables["Shards needing a look"], tables["Blocking gates"]
    assert look.columns == ("shard", "state", "what") and len(look.rows) == 3
    assert look.rows[0] == ("0", "training_set blocked", "loss_sum_concentration (training_set gates)")
    assert gates.rows == (
        (
            "loss_sum_concentration (training_set gates)",
            "training_set_gates config max_top_loss_sum_share, min_repeats; "
            "override_failed_gates: true in specforge_export's config",
        ),
    )
    # A word cannot wrap, so a column is as wide as its longest word: the gate's name, not "gates/<name>" (at 1,440
    # px, quality/degenerate_answers beside its thresholds made the page 2 px wider than its window).
    assert max(gates.rows[0][0].split(), key=len) == "loss_sum_concentration"


def test_while_held_the_pages_hold_and_its_alert_wrap_inside_a_1440_px_window(tmp_path):
    """Seen by hand (issue 45): held, the hold's headline names each held shard's command, and its `--select` list
    written as one 51-character word set the Alerts table's width: the page was 830 px in the 769 px a 1,440 px
    window leaves it, cut off at the right. A word cannot wrap, so no word of the hold's entries may be that long."""
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    hold = Hold(
        "thinking_structure", "55% blank", figure=0.55, threshold=0.01, sample_size=103, scope="fleet", held_at=0.0,
        shards=[0, 1],
    )  # fmt: skip
    held = replace(status, quality=QualityAnswer(hold=hold), alerts=[Alert("hold", hold.headline())])
    sections = {section.title: section for section in report_sections(held)}
    ((_, alerts_table),) = sections["Alerts"].tables
    words = sections["LINE HELD"].text.split() + [word for row in alerts_table.rows for word in row[1].split()]
    assert "--partition" in words and "shard-00001`" in words  # each held shard's command is on the page
    # The longest the Alerts table's second column takes at 1,440 px (it measured 444 px for 51 characters).
    assert len(max(words, key=len)) <= len("dagster_project.definitions"), max(words, key=len)


def test_each_answer_at_a_glance_fits_one_line_of_the_value_column_at_1440_px(tmp_path):
    """Seen by hand at 1,440 x 900 (issue 45): a settling ETA's explanation took three lines and the turns' "planned"
    a second one, which pushed the sixth answer to the screen's bottom edge. The first screen is a line per answer."""
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    settling = replace(status.progress, eta_hours=0.11, eta_basis=ETA_FROM_LIFETIME, events_done=253)
    turns = replace(status.multi_turn, generated_turns_done=253, generated_turns_planned=270)
    hold = Hold("short_answers", "90% short", figure=0.9, threshold=0.1, sample_size=40, scope="fleet", held_at=0.0)
    glances = []
    for case in (
        replace(status, progress=settling, multi_turn=turns),
        replace(status, quality=QualityAnswer(hold=hold), progress=status.progress.while_held(), multi_turn=turns),
    ):
        answers = report_sections(case)[0].text.split("  \n")[1:]
        shown = [answer[3:].replace("`", "").replace("\\_", "_") for answer in answers]  # as the page draws it
        assert len(shown) == 6 and all(len(answer) <= GLANCE_LINE_CHARS for answer in shown), shown
        glances.append(shown)
    (settled, held) = glances
    assert settled[0].endswith("ETA 0.11 h (settling)") and held[0].endswith("ETA none (held)")
    assert settled[5].endswith("multi-turn; turns 253/270")
