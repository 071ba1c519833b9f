"""Acceptance: under every injected fault each request ends exactly once, as a result or an explicit error.

Faults are set on one server of a running fleet of simulator processes while a shard is in flight.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import pytest

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, FleetDownError, GenRequest, Outcome
from dagster_project.sglang import protocol as proto
from tests.support.sglang_fixtures import SimFleet

EOS = 248046
PARAMS = proto.sampling_params(max_new_tokens=1024)
FAST_HEALTH = {"probe_interval_s": 0.2, "watchdog_s": 0.5, "canary_timeout_s": 0.5, "max_probe_backoff_s": 0.5}


def requests(count: int) -> list[GenRequest]:
    return [
        GenRequest(f"conv{i}#turn0", [248045, 846, 198, 3000 + i, 248046, 198, 248045, 74455, 198, 248068, 198], PARAMS)
        for i in range(count)
    ]


class Shard:
    """Runs requests through a dispatcher, injecting a fault after `trigger_after` outcomes."""

    def __init__(
        self, fleet: SimFleet, count: int, inject: Callable[[], None], trigger_after: int, **dispatcher_options
    ):
        self.fleet = fleet
        self.count = count
        self.inject = inject
        self.trigger_after = trigger_after
        self.dispatcher = Dispatcher(fleet.urls, DispatchOptions(**{**FAST_HEALTH, **dispatcher_options}))
        self.outcomes: dict[str, Outcome] = {}
        self.after_fault: list[Outcome] = []

    def on_outcome(self, outcome: Outcome) -> None:
        key = outcome.request.key
        assert key not in self.outcomes, f"{key} ended twice"
        assert (outcome.result is None) != (outcome.error is None)
        if outcome.error is not None:
            assert outcome.error.kind and outcome.error.message  # an explicit record with its reason
        else:
            result = outcome.result
            body = {"text": result.text, "output_ids": result.output_ids, "meta_info": result.meta_info}
            assert proto.check_generate_response(body, input_ids=outcome.request.input_ids, sampling=PARAMS) == []
        self.outcomes[key] = outcome
        if len(self.outcomes) == self.trigger_after:
            self.inject()
        elif len(self.outcomes) > self.trigger_after:
            self.after_fault.append(outcome)

    def run(self):
        stats = asyncio.run(self.dispatcher.run(requests(self.count), self.on_outcome))
        assert sorted(self.outcomes) == sorted(r.key for r in requests(self.count))  # all ended, none twice
        return stats

    def server(self, index: int) -> dict:
        return self.dispatcher.snapshot()["servers"][self.fleet.url(index)]


def slow_fleet(sim_fleet, count: int = 3, **options) -> SimFleet:
    return sim_fleet(
        count, **{"max_running_requests": 6, "decode_step_s": 0.004, "output_len": "uniform:40:160", **options}
    )


def test_crash_mid_request(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, crash_after_requests=1), 30)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values()) and stats.retries > 0
    assert not fleet.alive(1) and shard.server(1)["state"] == "quarantined"
    assert shard.server(1)["errors"]["connection_dropped"] >= 1


def test_dropped_connections(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, drop=4), 30)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values()) and stats.retries >= 1
    assert shard.server(1)["errors"]["connection_dropped"] >= 1 and fleet.alive(1)


def test_hang_is_detected_by_the_watchdog_and_its_work_moves(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, hang=True), 30)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values()) and stats.hedges > 0
    assert shard.server(1)["state"] == "quarantined" and shard.server(1)["reason"].startswith("no_progress")
    assert not [o for o in shard.after_fault[10:] if o.server == fleet.url(1)]  # nothing more came from it


def test_a_late_answer_from_a_written_off_server_is_not_delivered_twice(sim_fleet):
    fleet = slow_fleet(sim_fleet)

    def hang_then_recover() -> None:
        fleet.set_faults(1, hang=True)
        asyncio.get_running_loop().call_later(
            1.0, lambda: asyncio.ensure_future(asyncio.to_thread(fleet.set_faults, 1, hang=False))
        )

    shard = Shard(fleet, 200, hang_then_recover, 30)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values()) and stats.hedges > 0
    outcomes = Counter(entry["outcome"] for entry in fleet.requests(1))
    assert outcomes["disconnected"] >= stats.hedges  # the originals lost the race and were aborted there


def test_slow_server(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, slow=8), 30, watchdog_s=5)
    shard.run()
    assert all(o.ok for o in shard.outcomes.values())
    by_server = Counter(o.server for o in shard.after_fault)
    assert by_server[fleet.url(1)] < by_server[fleet.url(0)]  # the slow one finished less


def test_503_bursts(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, error_503=6), 30)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values()) and stats.retries >= 1
    assert shard.server(1)["errors"]["queue_full"] >= 1


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("empty", lambda result: result.output_ids == [EOS] and result.text == ""),
        ("truncate", lambda result: result.truncated and result.completion_tokens < 160),
    ],
)
def test_empty_and_truncated_answers_are_results_the_gates_can_see(sim_fleet, fault, check):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 120, lambda: fleet.set_faults(1, **{fault: 5}), 20)
    shard.run()
    assert all(o.ok for o in shard.outcomes.values())
    assert sum(bool(check(o.result)) for o in shard.outcomes.values()) == 5


def test_mtp_off_shows_in_the_spec_stats(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 120, lambda: fleet.set_faults(1, mtp_off=True), 20)
    shard.run()
    assert all(o.ok for o in shard.outcomes.values())
    off = [o.result for o in shard.after_fault if o.server == fleet.url(1) and o.result.spec_accept_length == 1.0]
    assert off and all(r.spec_verify_ct == r.completion_tokens for r in off)
    assert all(o.result.spec_accept_length > 1.0 for o in shard.outcomes.values() if o.server != fleet.url(1))


def test_killing_one_of_four_servers_mid_shard_loses_nothing(sim_fleet):
    fleet = slow_fleet(sim_fleet, 4)
    shard = Shard(fleet, 400, lambda: fleet.kill(2), 100)
    stats = shard.run()
    assert len(shard.outcomes) == 400 and all(o.ok for o in shard.outcomes.values())
    assert stats.retries >= 1 and shard.server(2)["state"] == "quarantined"
    finished_on = Counter(o.server for o in shard.after_fault[20:])
    assert set(finished_on) == {fleet.url(i) for i in (0, 1, 3)}  # the shard finished on the other three


def test_timeouts_end_as_error_records_after_max_attempts(sim_fleet):
    fleet = sim_fleet(2, decode_step_s=0.05, output_len="fixed:200")
    shard = Shard(fleet, 6, lambda: None, 0, request_timeout_s=0.3, max_attempts=2, watchdog_s=60)
    shard.run()
    assert {o.error.kind for o in shard.outcomes.values()} == {"timeout"}
    assert all(o.attempts == 2 and o.error.retryable for o in shard.outcomes.values())


def test_a_dead_fleet_fails_the_run_instead_of_filling_it_with_errors(sim_fleet):
    fleet = slow_fleet(sim_fleet, 2)
    shard = Shard(fleet, 300, lambda: [fleet.kill(i) for i in range(2)], 20, fleet_down_grace_s=1.0)
    with pytest.raises(FleetDownError, match="no usable server"):
        shard.run()
    assert len(shard.outcomes) < 300 and all(o.ok for o in shard.outcomes.values())
