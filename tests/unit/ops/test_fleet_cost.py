"""Cost from the fleet's life: GPU-hours from `fleet up` to `fleet down` at the price recorded at `fleet up`, the same
after `fleet down`; the idle up-time and its cost; MTP read from the accept length with the fleet down."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dagster_project.generation.fleet_life import close_lives, read_fleet_lives, record_fleet_up
from dagster_project.ops.alerts import DEFAULT_THRESHOLDS
from dagster_project.ops.answers.cost import FLEET_LIFE, NO_PRICE, FleetCost
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.metrics import render_metrics
from dagster_project.ops.report import render_markdown
from dagster_project.ops.status import answer_all, render_text
from dagster_project.store.storage import LocalStore
from tests.unit.ops.test_metrics import samples
from tests.unit.ops.test_report import beat

T0 = 1_800_000_000.0
MINUTE = 60.0


def status_at(store: LocalStore, now: float, beats: list, *, fleet: dict | None = None, cost: FleetCost = NO_PRICE):
    readings = Readings(
        now, 1, None, None, 100, {}, beats, fleet or {}, None, None, fleet_lives=read_fleet_lives(store)
    )
    return answer_all(
        store, readings, current_fingerprint=None, materialized=None, cost=cost, thresholds=DEFAULT_THRESHOLDS,
        endpoints_known=bool(fleet),
    )  # fmt: skip


def generating(start: float, end: float):
    """A finished shard run that generated from `start` to `end` (its heartbeats' first and last beat)."""
    return replace(beat(), state="done", started_at=start, updated_at=end, pid=0)


def test_spent_is_the_fleets_up_time_at_the_price_recorded_at_fleet_up_and_survives_fleet_down(tmp_path):
    store = LocalStore(tmp_path)
    record_fleet_up(store, "node-a", "sglang", gpus=2, cost_per_gpu_hour=13.5, now=T0)
    beats = [generating(T0 + 2 * MINUTE, T0 + 8 * MINUTE)]  # 6 of the fleet's 10 minutes
    before = status_at(store, T0 + 10 * MINUTE, beats).cost
    assert before.basis == FLEET_LIFE and before.fleet_up and before.gpus == 2
    assert before.spent == pytest.approx(2 * 13.5 * 10 / 60)  # paid while up, not while generating
    assert before.idle_hours * 60 == pytest.approx(4) and before.idle_cost == pytest.approx(2 * 13.5 * 4 / 60)
    close_lives(store, "node-a", now=T0 + 10 * MINUTE)  # `fleet down`
    # An hour later, in another process with no price configured: the same dollars, at the recorded price.
    after = status_at(store, T0 + 70 * MINUTE, beats)
    assert after.cost.spent == pytest.approx(before.spent) and not after.cost.fleet_up
    assert after.cost.cost_per_hour == pytest.approx(27.0)  # the last nodes up: what finishing would cost per hour
    text = render_text(after)
    assert f"spent ${before.spent:,.2f}" in text and "the fleet is down" in text and "fleet idle 4.0 min: $1.80" in text
    assert f"| spent | ${before.spent:,.2f} |" in render_markdown(after)
    assert samples(render_metrics(after))[("dflash_cost_spent_dollars", ())] == pytest.approx(after.cost.spent)


def test_nodes_priced_apart_add_up_and_a_life_without_a_price_takes_the_configured_one(tmp_path):
    store = LocalStore(tmp_path)
    record_fleet_up(store, "a", "sglang", gpus=8, cost_per_gpu_hour=3.5, now=T0)
    record_fleet_up(store, "b", "sglang", gpus=4, cost_per_gpu_hour=None, now=T0 + 30 * MINUTE)
    assert status_at(store, T0 + 60 * MINUTE, []).cost is None  # b has no price, and none is configured
    cost = status_at(store, T0 + 60 * MINUTE, [], cost=FleetCost(cost_per_gpu_hour=2.0)).cost
    assert cost.spent == pytest.approx(8 * 3.5 + 4 * 2.0 * 0.5) and cost.gpu_hours == pytest.approx(10)
    assert cost.idle_hours == pytest.approx(1.0)  # nothing generated: every up minute idle
    # `fleet up` again on a node whose life is still open (restarted without `fleet down`): the old life ends.
    record_fleet_up(store, "a", "sglang", gpus=8, cost_per_gpu_hour=3.5, now=T0 + 60 * MINUTE)
    lives = [life for life in read_fleet_lives(store) if life.node == "a"]
    assert [life.stopped_at for life in lives] == [T0 + 60 * MINUTE, None]


def test_mtp_on_with_the_fleet_down_comes_from_the_measured_accept_length_in_json_text_and_page(tmp_path):
    store = LocalStore(tmp_path)
    down = status_at(store, T0, [replace(beat(accept=2.76), pid=0, state="done")])
    live = status_at(store, T0, [beat(accept=2.76)])  # a live run's window measured 2.76 tokens per pass
    assert live.mtp.mtp_on and live.mtp.mtp_on_from == "accept_length"
    assert "MTP on" in render_text(live) and "MTP on" in render_markdown(live)
    assert samples(render_metrics(live))[("dflash_mtp_on", ())] == 1.0
    assert not down.mtp.mtp_on and down.mtp.mtp_on_from == "unknown"  # nothing measured: not claimed


def test_every_figure_of_question_7_is_the_same_in_the_text_the_page_and_prometheus(tmp_path):
    store = LocalStore(tmp_path)
    record_fleet_up(store, "node-a", "sglang", gpus=2, cost_per_gpu_hour=13.5, now=T0)
    running = replace(beat(), started_at=T0 + 2 * MINUTE, updated_at=T0 + 10 * MINUTE)  # generating now
    status = status_at(store, T0 + 10 * MINUTE, [running])
    cost = status.cost
    assert cost.per_million_output_tokens and cost.idle_cost  # every figure known: none compared as absent
    text, page, found = render_text(status), render_markdown(status), samples(render_metrics(status))
    for shown in (
        f"${cost.spent:,.2f}",
        f"${cost.cost_per_hour:,.2f}",
        f"({cost.gpus} GPUs",
        f"${cost.per_million_output_tokens:,.2f}",
        f"{cost.gpu_hours_per_1k_rows:,.3f}",
        f"${cost.idle_cost:,.2f}",
        f"{cost.gpu_hours:,.2f} GPU-hours",
        f"fleet idle {cost.idle_hours * 60:,.1f} min",
    ):
        assert shown in text and shown in page, shown
    gauges = {
        "spent_dollars": cost.spent,
        "per_hour_dollars": cost.cost_per_hour,
        "gpus": cost.gpus,
        "per_million_output_tokens_dollars": cost.per_million_output_tokens,
        "gpu_hours_per_1k_rows": cost.gpu_hours_per_1k_rows,
        "gpu_hours": cost.gpu_hours,
        "fleet_idle_dollars": cost.idle_cost,
        "fleet_idle_seconds": cost.idle_hours * 3600,
    }
    for name, value in gauges.items():
        assert found[(f"dflash_cost_{name}", ())] == pytest.approx(value), name
    for cause, tokens in status.waste.output_tokens.items():
        assert found[("dflash_waste_output_tokens", (("cause", cause),))] == tokens
        assert f"| {cause} | {tokens:,} |" in page


def test_generation_before_a_node_was_up_is_not_subtracted_from_its_idle_time(tmp_path):
    """Node b comes up after the only run ended: none of its 30 minutes were busy. The run's minutes outside b's life
    count as nothing for it (the overlap clamped at 0), not as negative busy time that inflates its idle cost."""
    store = LocalStore(tmp_path)
    record_fleet_up(store, "a", "sglang", gpus=8, cost_per_gpu_hour=3.5, now=T0)
    record_fleet_up(store, "b", "sglang", gpus=4, cost_per_gpu_hour=2.0, now=T0 + 30 * MINUTE)
    beats = [generating(T0 + 5 * MINUTE, T0 + 10 * MINUTE)]
    cost = status_at(store, T0 + 60 * MINUTE, beats).cost
    assert cost.idle_hours * 60 == pytest.approx(55)  # the fleet was up an hour and busy 5 minutes of it
    assert cost.idle_cost == pytest.approx(8 * 3.5 * 55 / 60 + 4 * 2.0 * 30 / 60)
