"""The live watch judges answers by the gates' own code: on the same rows it gives the gate's verdict, figure by
figure, and the line stop holds on the first blocking figure that fails."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from dagster_project.assets.completions import TRAINING_CHECK, quality_watch
from dagster_project.checks import training_set as training_set_checks
from dagster_project.generation.line_hold import Hold, put_hold, read_hold, release_hold
from dagster_project.generation.line_stop import LineStop, WatchOptions, condemned_answers, read_watch_reports
from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import special_ids
from dagster_project.training import distribution_gates, gates
from dagster_project.training.gate_sets import share_gate
from dagster_project.training.watch_figures import WATCHED_ANSWER_GATES, AnswerQualityWatch
from tests.support.training_shards import disaster_rows, error_row, healthy_rows, templated_rows, tokenizer


def _watch() -> AnswerQualityWatch:
    tok = tokenizer()
    return AnswerQualityWatch(special_ids(tok), tok.decode, settings=GenerationSettings())


def _gate_verdicts(rows: list[dict]) -> dict[str, bool]:
    """What the completions gates decide on these rows as a shard."""
    tok = tokenizer()
    columns = {name: [row[name] for row in rows] for name in gates.COMPLETION_GATE_COLUMNS}
    batch = pa.RecordBatch.from_pydict(columns)
    profile = gates.profile_completion_batches([batch], special_ids(tok), tok.decode)
    results = gates.shard_gates(profile, vocab_size=special_ids(tok).vocab_size, enable_thinking=True)
    verdicts = {r.name: r.passed for r in results if r.name in WATCHED_ANSWER_GATES}
    errors = sum(row["status"] != "ok" for row in rows)
    capped = sum(row["finish_reason"] == "length" for row in rows)
    verdicts["error_rate"] = share_gate("error_rate", errors, len(rows), 0.02, "", {}).passed
    verdicts["length_capped_rate"] = share_gate("length_capped_rate", capped, len(rows), 0.10, "", {}).passed
    return verdicts


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param(lambda: healthy_rows(60), id="healthy"),
        pytest.param(lambda: disaster_rows(60), id="disaster"),
        pytest.param(lambda: disaster_rows(60, broken_share=0.1), id="disaster-10pct"),
        pytest.param(lambda: templated_rows(60, 20), id="templated"),
        pytest.param(
            lambda: healthy_rows(58) + [error_row("e-1#turn0", [1, 2]), error_row("e-2#turn0", [1, 2])], id="errors"
        ),
    ],
)
def test_the_watch_gives_each_gates_own_verdict_on_the_same_rows(rows):
    rows = rows()
    watch = _watch()
    for row in rows:
        watch.observe(row)
    judged = watch.judge(watch.rows())
    verdicts: dict[str, bool] = {}
    for figure in judged.figures:  # a gate of several limits (short_answers) passes when each of them does
        if figure.blocking:
            verdicts[figure.gate] = verdicts.get(figure.gate, True) and figure.passed
    assert verdicts == _gate_verdicts(rows)
    assert (judged.failed is None) == all(verdicts.values())


def _judged(watch: AnswerQualityWatch, rows: list[dict]):
    for row in rows:
        watch.observe(row)
    return watch.judge(watch.rows())


def test_the_watch_holds_on_answers_of_one_supervised_length_and_not_on_varied_ones(tmp_path):
    """The seed's signature, every answer one loss_mask sum, held the line only where another gate failed with it:
    a fleet whose answers differ in text but all have one supervised length (40 tokens) fails only the training
    set's `loss_sum_concentration`, and the watch now holds on it, at its configured 5%; varied lengths do not."""
    one_length = templated_rows(20, 20)
    assert len({len(row["output_ids"]) for row in one_length}) == 1
    store = LocalStore(tmp_path)
    stop = LineStop(store, 1, _watch(), "fp", run_id="run-1", options=WatchOptions(watch_min_answers=20))
    for row in one_length:
        stop.observe(row)
    hold = stop.poll()
    assert hold is not None and hold.gate == "loss_sum_concentration"
    assert (
        hold.threshold == distribution_gates.MAX_TOP_LOSS_SUM_SHARE and hold.figure == 1.0 and len(hold.examples) == 5
    )

    varied = LineStop(LocalStore(tmp_path / "varied"), 1, _watch(), "fp", options=WatchOptions(watch_min_answers=20))
    for row in healthy_rows(60):
        varied.observe(row)
    assert varied.poll() is None and varied.admitting()


def test_the_concentration_the_watch_holds_by_is_the_training_set_gates_threshold(tmp_path):
    """One definition: the watch judges the supervised length's concentration by the `training_set_gates` check's
    run config (the gate that blocks those rows a stage later), not by the completions check's copy of the field."""
    tok = tokenizer()
    rows = templated_rows(60, 20)  # a third of the answers on one supervised length: over 5%, under 50%
    lifted = {"max_top_loss_sum_share": 0.5}

    def verdict(run_config: dict) -> str | None:
        failed = _judged(quality_watch(run_config, tok, GenerationSettings()), rows).failed
        return failed.gate if failed else None

    assert verdict({}) == "loss_sum_concentration"
    assert verdict({"ops": {TRAINING_CHECK: {"config": lifted}}}) is None
    assert verdict({"ops": {"completions_quality": {"config": lifted}}}) == "loss_sum_concentration"
    assert verdict({"ops": {TRAINING_CHECK: {"config": {"min_repeats": 21}}}}) is None  # its other key, too
    assert training_set_checks.training_set_gates.node_def.name == TRAINING_CHECK  # the name the watch reads


def test_each_limit_of_short_answers_is_a_figure_of_its_own_with_one_threshold_whatever_the_answers():
    """short_answers has two limits (empty answers 1%, short ones 10%): one figure showed whichever was nearer, so
    its threshold read 1.0% on a healthy fleet and 10.0% on a failing one. Each limit is now a figure with its own."""
    for rows in (healthy_rows(60), disaster_rows(60)):
        watch = _watch()
        for row in rows:
            watch.observe(row)
        figures = {f.label: f for f in watch.judge(watch.rows()).figures if f.gate == "short_answers"}
        assert {label: f.threshold for label, f in figures.items()} == {
            "short_answers (empty)": distribution_gates.MAX_EMPTY_ANSWER_SHARE,
            "short_answers (short)": distribution_gates.MAX_SHORT_ANSWER_SHARE,
        }
    # The disaster's "OK." answers are short, none empty: only the short limit fails.
    assert figures["short_answers (empty)"].passed and figures["short_answers (empty)"].figure == 0.0
    assert not figures["short_answers (short)"].passed and figures["short_answers (short)"].figure > 0.8


def test_a_disaster_holds_the_line_with_its_evidence_and_stops_admission(tmp_path):
    store = LocalStore(tmp_path)
    watch = _watch()
    seen = []
    stop = LineStop(
        store, 3, watch, "fp", run_id="run-1", options=WatchOptions(watch_min_answers=50), on_hold=seen.append
    )
    for row in disaster_rows(40):
        stop.observe(row)
    assert stop.poll() is None and stop.admitting() and not seen  # failing, but too few answers to hold on
    for row in disaster_rows(60, shard=1)[40:]:
        stop.observe(row)
    hold = stop.poll()
    assert hold is not None and not stop.admitting()
    stop.poll()
    assert seen == [hold]  # told once, as the hold is first seen (the Dagster side stops launching then)
    assert read_hold(store) == hold and hold.scope == "run" and hold.runs == ["run-1"] and hold.shards == [3]
    assert hold.gate == "thinking_structure" and hold.figure > hold.threshold and hold.sample_size == 60
    assert hold.examples and hold.examples[0].answer_head == "\n</think>\n\nOK.<|im_end|>"
    (report,) = read_watch_reports(store)
    assert report.held and report.answers == 60 and {f.gate for f in report.figures} >= set(WATCHED_ANSWER_GATES)


def test_a_shard_smaller_than_the_watch_minimum_holds_the_line_once_all_of_it_is_answered(tmp_path):
    """A shard of 30 answers never reaches `watch_min_answers` (100): answered whole, its figures are its gates'
    verdicts on it, before it is published, and they hold the line; a run that ended short of it does not."""
    store = LocalStore(tmp_path)
    cut_short = LineStop(store, 1, _watch(), "fp", run_id="run-1")
    for row in disaster_rows(30):
        cut_short.observe(row)
    cut_short.close()  # ended before all of its shard was answered (a failure): too few answers to hold on
    assert read_hold(store) is None and cut_short.admitting()

    whole = LineStop(store, 2, _watch(), "fp", run_id="run-2")
    for row in disaster_rows(30, shard=2):
        whole.observe(row)
    whole.close(whole_shard=True)
    hold = read_hold(store)
    assert hold is not None and not whole.admitting()
    assert hold.shards == [2] and hold.sample_size == 30 and hold.scope == "run" and hold.figure > hold.threshold

    healthy_store = LocalStore(tmp_path / "healthy")
    healthy = LineStop(healthy_store, 3, _watch(), "fp", run_id="run-3")
    for row in healthy_rows(30):
        healthy.observe(row)
    healthy.close(whole_shard=True)
    assert read_hold(healthy_store) is None and healthy.admitting()


def test_a_release_without_override_condemns_what_the_held_run_journaled_and_a_false_alarm_keeps_it(tmp_path):
    """The held run's answers, from its start to the release, are generated again when the hold is released as
    right (the fleet was wrong), kept when it is released with --override (a false alarm)."""
    store = LocalStore(tmp_path)
    stop = LineStop(store, 4, _watch(), "fp", run_id="run-1", clock=lambda: 1000.0)
    for row in disaster_rows(30, shard=4):
        stop.observe(row)
    assert condemned_answers(store, 4, "fp") is None  # no report yet
    stop.close(whole_shard=True)
    assert read_hold(store) is not None
    assert condemned_answers(store, 4, "fp") is None  # held, not released: nothing is decided yet
    release_hold(store, by="test", reason="restarted the fleet", now=2000.0)
    assert condemned_answers(store, 4, "fp") == (1000.0, 2000.0)
    assert condemned_answers(store, 4, "other-settings") is None and condemned_answers(store, 5, "fp") is None

    false_alarm = LocalStore(tmp_path / "false-alarm")
    stop = LineStop(false_alarm, 4, _watch(), "fp", run_id="run-1", clock=lambda: 1000.0)
    for row in disaster_rows(30, shard=4):
        stop.observe(row)
    stop.close(whole_shard=True)
    release_hold(false_alarm, by="test", reason="terse task", override=[read_hold(false_alarm).gate], now=2000.0)
    assert condemned_answers(false_alarm, 4, "fp") is None


def test_an_overridden_gate_is_shown_failing_but_does_not_hold_the_line():
    watch = _watch()
    for row in disaster_rows(60):
        watch.observe(row)
    failing = {f.gate for f in watch.judge(watch.rows()).figures if f.blocking and not f.passed}
    judged = watch.judge(watch.rows(), overridden=failing)
    assert judged.failed is None and {f.gate for f in judged.figures if not f.passed} >= failing


def test_a_run_is_told_of_another_runs_hold_once_at_its_next_full_poll(tmp_path):
    store = LocalStore(tmp_path)
    seen = []
    healthy = LineStop(store, 1, _watch(), "fp", run_id="run-1", on_hold=seen.append)
    for row in healthy_rows(30):
        healthy.observe(row)
    assert healthy.poll() is None and not seen
    bad = LineStop(store, 2, _watch(), "fp", run_id="run-2", options=WatchOptions(watch_min_answers=50))
    for row in disaster_rows(60, shard=2):
        bad.observe(row)
    hold = bad.poll()
    assert hold is not None
    assert healthy.poll(full=False) is None and healthy.admitting()  # a quick poll reads no hold from the store
    assert healthy.poll() == hold and not healthy.admitting()
    healthy.poll()
    assert seen == [hold]


def test_a_gate_released_with_override_does_not_hold_the_same_run_again(tmp_path):
    """`dflash hold release --override GATE`: the run that held, polled again on the same answers, is not held again
    by the gates released as a false alarm (its own figures are judged with the overrides, as the fleet's are)."""
    store = LocalStore(tmp_path)
    stop = LineStop(store, 1, _watch(), "fp", run_id="run-1", options=WatchOptions(watch_min_answers=50))
    for row in disaster_rows(60):
        stop.observe(row)
    assert stop.poll() is not None
    failing = sorted({f.gate for f in stop.watch.judge(stop.watch.rows()).figures if f.blocking and not f.passed})
    release_hold(store, by="test", reason="a terse task: known false alarm", override=failing)
    again = LineStop(store, 1, stop.watch, "fp", run_id="run-2", options=WatchOptions(watch_min_answers=50))
    assert again.poll() is None and again.admitting() and read_hold(store) is None


def test_a_report_of_a_run_started_before_the_release_is_not_counted_again(tmp_path):
    """Answers from before a release were judged already: a run started before it (still running, its report
    current) is left out of the fleet's figure after it, so it cannot hold the line a second time."""
    store = LocalStore(tmp_path)
    options = WatchOptions(watch_min_answers=100)
    earlier = LineStop(store, 2, _watch(), "fp", run_id="run-early", options=options, clock=lambda: 1000.0)
    for row in disaster_rows(30, shard=2):
        earlier.observe(row)
    assert earlier.poll() is None  # 30 answers: under the minimum, run and fleet
    held = LineStop(store, 4, _watch(), "fp", run_id="run-held", clock=lambda: 1000.0)
    for row in disaster_rows(30, shard=4):
        held.observe(row)
    held.close(whole_shard=True)
    release_hold(store, by="test", reason="fixed the fleet", now=1001.0)

    later = LineStop(store, 3, _watch(), "fp", run_id="run-late", options=options, clock=lambda: 1002.0)
    for row in healthy_rows(80, shard=3):
        later.observe(row)
    # Counted with the earlier run's 30 disaster answers the fleet would hold at 110 answers; without, 80 is too few.
    assert later.poll() is None and later.admitting() and read_hold(store) is None
    (report,) = [r for r in read_watch_reports(store, now=1002.0) if r.shard == 3]
    assert report.fleet_answers == 80 and report.fleet_runs == 1


def test_the_first_hold_written_stands_and_a_second_is_told_of_it(tmp_path):
    store = LocalStore(tmp_path)
    first = Hold(gate="thinking_structure", message="m1", figure=0.8, threshold=0.01, sample_size=60, scope="run",
                 held_at=1000.0, shards=[1])  # fmt: skip
    second = replace(first, gate="short_answers", message="m2", held_at=1001.0, shards=[2])
    assert put_hold(store, first) == first
    assert put_hold(store, second) == first  # the one in force, returned to the second writer
    assert read_hold(store) == first
