"""The dispatcher's traffic through the real sglang-router (PyPI `sglang-router`) in front of simulators."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
from dagster_project.sglang import protocol as proto
from tests.support.sglang_fixtures import running_router

pytest.importorskip("sglang_router")

CAP = 4
PARAMS = proto.sampling_params(max_new_tokens=1024)


def requests(count: int) -> list[GenRequest]:
    return [
        GenRequest(f"r{i}", [248045, 846, 198, 2000 + i, 248046, 198, 248045, 74455, 198, 248068, 198], PARAMS)
        for i in range(count)
    ]


def collect(dispatcher: Dispatcher, count: int) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}

    def on_outcome(outcome: Outcome) -> None:
        assert outcome.request.key not in outcomes
        outcomes[outcome.request.key] = outcome

    asyncio.run(dispatcher.run(requests(count), on_outcome))
    return outcomes


def test_dispatcher_through_sglang_router_gets_every_answer_once(sim_fleet, tmp_path):
    fleet = sim_fleet(3, max_running_requests=CAP, decode_step_s=0.002, output_len="uniform:20:120")
    with running_router(fleet.urls, tmp_path / "router") as router:
        with pytest.raises(ValueError, match="cannot size the window"):
            collect(Dispatcher([router]), 1)  # a router reports no scheduler cap of its own
        dispatcher = Dispatcher([router], DispatchOptions(default_window=3 * CAP))
        outcomes = collect(dispatcher, 240)
    assert len(outcomes) == 240 and all(o.ok for o in outcomes.values())
    for outcome in outcomes.values():
        result = outcome.result
        body = {"text": result.text, "output_ids": result.output_ids, "meta_info": result.meta_info}
        assert proto.check_generate_response(body, input_ids=outcome.request.input_ids, sampling=PARAMS) == []
    served = [entry for index in range(3) for entry in fleet.requests(index)]
    per_worker = Counter(entry["rid"] for index in range(3) for entry in fleet.requests(index))
    assert all(len(fleet.requests(index)) >= 60 for index in range(3))  # round robin spread the work
    assert max(per_worker.values()) == 1 and len(served) == 240  # the router retried nothing
    assert {o.result.rid for o in outcomes.values()} == set(per_worker)  # our rids reached the workers
    assert fleet.state(0)["peaks"]["running"] <= CAP


def test_a_worker_dying_behind_the_router_loses_nothing(sim_fleet, tmp_path):
    fleet = sim_fleet(3, max_running_requests=CAP, decode_step_s=0.004, output_len="uniform:50:150")
    with running_router(fleet.urls, tmp_path / "router") as router:
        dispatcher = Dispatcher([router], DispatchOptions(default_window=3 * CAP, max_attempts=5))
        outcomes: dict[str, Outcome] = {}

        def on_outcome(outcome: Outcome) -> None:
            assert outcome.request.key not in outcomes
            outcomes[outcome.request.key] = outcome
            if len(outcomes) == 40:
                fleet.kill(1)

        stats = asyncio.run(dispatcher.run(requests(200), on_outcome))
    assert len(outcomes) == 200 and all(o.ok for o in outcomes.values()), Counter(
        o.error.kind for o in outcomes.values() if o.error
    )
    assert stats.retries > 0 and sum(stats.errors.values()) == 0
