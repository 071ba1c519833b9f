"""The dispatcher's traffic through the real sglang-router (PyPI `sglang-router`) in front of simulators."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.model_identity import QWEN3_6_27B
from tests.support.sglang_fixtures import call, running_router, wait_until

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


def test_dispatcher_through_sglang_router_gets_every_answer_once(sim_fleet, tmp_path, caplog):
    fleet = sim_fleet(3, max_running_requests=CAP, decode_step_s=0.002, output_len="uniform:20:120")
    with running_router(fleet.urls, tmp_path / "router") as router:
        with pytest.raises(ValueError, match="cannot size the window"):
            collect(Dispatcher([router]), 1)  # a router reports no scheduler cap of its own
        # Its workers unnamed, the router's model cannot be checked (it has no info routes and drops logit_bias):
        # the run log says so, and requests are still checked against the job's vocabulary.
        dispatcher = Dispatcher([router], DispatchOptions(default_window=3 * CAP), expected_model=QWEN3_6_27B)
        with caplog.at_level(logging.WARNING, logger="dagster_project.generation.server_checks"):
            outcomes = collect(dispatcher, 240)
    assert any("its model is not checked (set the fleet resource's router_workers)" in r.getMessage()
               for r in caplog.records)  # fmt: skip
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


def test_behind_the_router_the_workers_load_from_another_client_counts(sim_fleet, tmp_path):
    """The router exposes no load of its own worth reading (no /metrics on its port, and its `smg_*` metrics count
    only what it routed): the dispatcher reads the workers' /metrics, where every client's requests show."""
    fleet = sim_fleet(
        2, max_running_requests=CAP, decode_step_s=0.002, output_len="uniform:150:450", enable_metrics=True
    )
    window = 2 * CAP + 2  # the two workers' caps x 1.25
    stop = threading.Event()
    totals: list[int] = []

    def other_client(worker: int, client: int) -> None:
        sent = 0
        while not stop.is_set():
            body = {
                "input_ids": [248045, 846, 7000 + client, sent],
                "sampling_params": PARAMS,
                "rid": f"o{worker}-{client}-{sent}",
            }
            assert call(fleet.url(worker) + "/generate", body)[0] == 200
            sent += 1

    def sample() -> None:
        while not stop.is_set():
            totals.append(sum(fleet.state(i)["running"] + fleet.state(i)["queued"] for i in range(2)))

    with running_router(fleet.urls, tmp_path / "router") as router, ThreadPoolExecutor(5) as pool:
        others = [pool.submit(other_client, worker, client) for worker in range(2) for client in range(2)]
        wait_until(lambda: sum(fleet.state(i)["running"] for i in range(2)) == 4, what="the other client's load")
        sampler = pool.submit(sample)
        dispatcher = Dispatcher(
            [router],
            DispatchOptions(load_read_interval_s=0.2),
            windows={router: window},
            load_sources={router: fleet.urls},
            expected_model=QWEN3_6_27B,  # checked on the workers the router sends to
        )
        try:
            outcomes = collect(dispatcher, 40)
        finally:
            stop.set()
        for done in (*others, sampler):
            done.result()
    assert len(outcomes) == 40 and all(o.ok and o.served_model == QWEN3_6_27B.label for o in outcomes.values())
    assert all(any(e["input_hash"] == proto.input_hash([0]) for e in fleet.requests(i)) for i in range(2))  # probed
    view = dispatcher.snapshot()["servers"][router]
    assert view["load_unreported"] is None
    # The other client's four requests took four slots of the window: both workers together stayed near it.
    assert max(totals) <= window + 2
