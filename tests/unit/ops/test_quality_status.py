"""The quality watch and the line's hold as the operator reads them: `dflash status`'s first line, the alerts, the
page and the metrics, all from the same answer."""

from __future__ import annotations

import dataclasses
import time

from dagster_project.generation.line_hold import Hold, HoldExample
from dagster_project.generation.line_stop import WatchFigure, WatchReport
from dagster_project.ops.alerts import DEFAULT_THRESHOLDS
from dagster_project.ops.answers.cost import NO_PRICE
from dagster_project.ops.answers.quality import figure_verdict
from dagster_project.ops.metrics import render_metrics
from dagster_project.ops.report import report_sections
from dagster_project.ops.status import answer_all, render_text
from dagster_project.store.storage import LocalStore
from tests.support.full_status import full_readings
from tests.unit.ops.test_metrics import samples


def _status(tmp_path, **readings):
    return answer_all(
        LocalStore(str(tmp_path)),
        dataclasses.replace(full_readings(time.time()), **readings),
        current_fingerprint=None,
        materialized=None,
        cost=NO_PRICE,
        thresholds=DEFAULT_THRESHOLDS,
        endpoints_known=True,
    )


def test_the_watched_figures_show_with_threshold_and_sample_size_while_shards_run(tmp_path):
    status = _status(tmp_path)
    text = render_text(status)
    assert text.startswith("As of")
    assert "Quality watch (fleet: 4 answers of 1 shard runs" in text
    assert "short_answers 2.0% (threshold 10.0%, n=4) ok" in text
    assert not [a for a in status.alerts if a.kind in ("hold", "quality")]
    [watch] = [s for s in report_sections(status) if s.title == "Quality watch"]
    assert watch.tables[0][1].rows[0] == ("short_answers", "2.0% (threshold 10.0%, n=4)", "ok")  # as status says it


def test_a_figure_reads_ok_only_when_judged_and_within_its_threshold(tmp_path):
    """ "11.1% (threshold 5.0%, n=9) ok" was printed while 9 answers of the 100 the watch needs were in."""
    few = [
        WatchFigure("thinking_structure", 1 / 9, 0.05, 9, True, "too few to block", min_sample=100),
        WatchFigure("error_rate", 0.5, 0.05, 2, True, "too few to block", min_sample=100),
    ]
    watch = WatchReport(1, "fp", time.time() - 60, time.time(), 5.0, answers=9, figures=few, fleet_figures=few,
                        fleet_answers=9, fleet_runs=1)  # fmt: skip
    status = _status(tmp_path, watch=[watch])
    text = render_text(status)
    assert "9 answers of 1 shard runs, 0 s ago; none judged yet: the watch judges from n=100): " in text
    assert "thinking_structure 11.1% (threshold 5.0%, n=9); error_rate 50.0% (threshold 5.0%, n=2)\n" in text
    assert "shard 1: not judged yet (n=2 of 100)" in text and " ok" not in text.split("Quality watch")[1]
    [page] = [s for s in report_sections(status) if s.title == "Quality watch"]
    assert [row[2] for row in page.tables[0][1].rows] == ["not judged yet (n=9 of 100)", "not judged yet (n=2 of 100)"]
    # Judged: within its threshold it is ok; above it, without the evidence that blocks, it is said to be above.
    judged = [
        dataclasses.replace(few[0], sample_size=400, figure=0.01),
        dataclasses.replace(few[1], sample_size=400, figure=0.06),
    ]
    assert [figure_verdict(f) for f in judged] == ["ok", "above its threshold, not yet evidence of it"]
    assert figure_verdict(dataclasses.replace(judged[1], passed=False)) == "FAILED"


def test_a_hold_is_the_first_line_the_first_alert_the_top_of_the_page_and_a_metric(tmp_path):
    hold = Hold(
        "thinking_structure", "BLOCKED: 95% blank", 0.95, 0.01, 200, "fleet", time.time(),
        examples=[HoldExample("c-1#turn0", "\n</think>\n\nOK.", "http://127.0.0.1:30000")], shards=[1],
    )  # fmt: skip
    status = _status(tmp_path, hold=hold)
    first = render_text(status).splitlines()[0]
    assert first.startswith("LINE HELD") and "thinking_structure at 95.0% (threshold 1.0%, 200 answers" in first
    assert "dflash hold release" in first
    assert status.alerts[0].kind == "hold" and status.alerts[0].message == hold.headline()
    page = report_sections(status)
    # The verdict at a glance first, then the hold's evidence.
    assert page[0].title == "At a glance" and page[0].text.startswith("**LINE HELD**: gate thinking_structure")
    assert page[1].title == "LINE HELD" and page[1].tables[0][1].rows[0][0] == "c-1#turn0"
    assert samples(render_metrics(status))[("dflash_line_held", ())] == 1.0


def test_while_held_status_says_the_verdict_and_what_to_run_with_no_eta_stale_figures_or_idle_alert(tmp_path):
    """Held, the shards stop: the ETA, the quality watch's last figures and an idle server were noise beside it."""
    readings = full_readings(time.time())
    idle = {url: {**probe, "running": 0.0, "queued": 0.0} for url, probe in readings.fleet.items()}
    running = _status(tmp_path, fleet=idle)
    assert "ETA 0.09 h" in render_text(running) and [a for a in running.alerts if "idle" in a.message]
    assert "Quality watch (fleet" in render_text(running)

    hold = Hold("thinking_structure", "BLOCKED: 95% blank", 0.95, 0.01, 200, "fleet", time.time(), shards=[1, 4])
    held = _status(tmp_path, fleet=idle, hold=hold)
    text = render_text(held)
    first = text.splitlines()[0]
    assert first.startswith("LINE HELD") and "then materialize the held shards 1, 4 again" in first
    for shard in ("shard-00001", "shard-00004"):
        command = "dagster asset materialize -m dagster_project.definitions --select 'completions, training_set, "
        assert f"`{command}specforge_export, hf_export' --partition {shard}`" in first
    assert "ETA none while the line is held" in text and "0.09 h" not in text
    assert "Quality watch (fleet" not in text and not held.quality.fleet
    assert [alert.kind for alert in held.alerts] == ["hold"], held.alerts
    assert held.progress.eta_hours is None and held.progress.plan_eta_hours is None
    [watch] = [s for s in report_sections(held) if s.title == "Quality watch"]
    assert watch.text.startswith("None while the line is held") and not watch.tables


def test_an_ended_runs_last_figures_are_no_answers_arriving(tmp_path):
    """Seen by hand (issue 45): released after a hold, with no shard run alive, status raised four "quality drifting
    ... over the answers arriving" alerts from the held runs' last report (71.6% blank, n=81), and a finished job
    showed its last run's figures. Only the runs alive now have answers arriving."""
    drifting = [WatchFigure("thinking_structure", 0.716, 0.01, 81, False, "71.6% blank", min_sample=100)]
    now = time.time()
    ended = WatchReport(0, "fp", now - 120, now - 20, 5.0, answers=81, figures=drifting, fleet_figures=drifting,
                        fleet_answers=81, fleet_runs=2, held=True, running=False)  # fmt: skip
    status = _status(tmp_path, watch=[ended])
    assert not [alert for alert in status.alerts if alert.kind == "quality"]
    assert "Quality watch" not in render_text(status)
    # The same report of a run alive now: its figure drifting is an alert.
    alive = dataclasses.replace(ended, updated_at=now, held=False, running=True)
    assert [alert.kind for alert in _status(tmp_path, watch=[alive]).alerts].count("quality") == 1
