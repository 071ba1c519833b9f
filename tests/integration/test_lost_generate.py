"""Acceptance: a server whose `/health` answers 200 while its `/generate` never answers, beside a healthy
simulator, is set aside by the rule that sees it (not the watchdog, minutes later) and the shard finishes there: every
request once, none lost.

The fault is an HTTP front (tests/support/lost_generate.py) that passes every route to a simulator but loses
`/generate`: its `/metrics` show nothing running or queued while our requests are in flight there. Behind
`sglang-router` (which has no `/metrics` of its own) the same front is set aside because it answers nothing
while the healthy simulator answers. The windows are set short through the `fleet` resource's options.
"""

from __future__ import annotations

import asyncio

from dagster_project.generation.dispatch import Dispatcher, GenRequest, Outcome
from dagster_project.generation.server_watch import NOT_RUNNING, SILENT
from dagster_project.resources.fleet import SGLangFleet
from dagster_project.sglang import protocol as proto
from tests.support.lost_generate import LostGenerate, lost_generate
from tests.support.sglang_fixtures import SimFleet, running_router

PARAMS = proto.sampling_params(max_new_tokens=1024)
SHORT_WINDOWS = {"unserved_after_s": 3.0, "silence_s": 5.0, "probe_interval_s": 0.5, "canary_timeout_s": 2.0}
HEALTHY, BEHIND = 0, 1


def requests(count: int) -> list[GenRequest]:
    return [
        GenRequest(f"conv{i}#turn0", [248045, 846, 198, 4000 + i, 248046, 198, 248045, 74455, 198, 248068, 198], PARAMS)
        for i in range(count)
    ]


def finish_shard(dispatcher: Dispatcher, count: int) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}

    def on_outcome(outcome: Outcome) -> None:
        assert outcome.request.key not in outcomes, f"{outcome.request.key} ended twice"
        outcomes[outcome.request.key] = outcome

    asyncio.run(dispatcher.run(requests(count), on_outcome))
    assert sorted(outcomes) == sorted(r.key for r in requests(count))  # 0 lost, 0 duplicated
    return outcomes


def time_to_detect(front: LostGenerate, fleet: SimFleet) -> tuple[float, float]:
    """(from the first request lost to the first of them reaching the healthy simulator; the longest any lost
    request took to reach it): the set-aside as seen from outside."""
    arrivals: dict[str, float] = {}
    for entry in fleet.requests(HEALTHY):
        arrivals.setdefault(entry["input_hash"], entry["received_at"])
    lost = [(at, prompt) for at, prompt in front.received if prompt != proto.input_hash([0])]  # not canaries
    assert lost, "the front lost no request"
    resent = [arrivals[prompt] - at for at, prompt in lost]  # KeyError: a lost request never moved
    onset = min(at for at, _ in lost)
    return min(arrivals[prompt] for _, prompt in lost) - onset, max(resent)


def simulators(sim_fleet) -> SimFleet:
    return sim_fleet(2, max_running_requests=4, decode_step_s=0.004, output_len="uniform:40:160", enable_metrics=True)


def test_a_server_losing_generate_behind_a_passing_health_is_set_aside(sim_fleet):
    fleet = simulators(sim_fleet)
    with lost_generate(fleet.url(BEHIND)) as front:
        # Not the served-model check's one-token probes: their timeout would set the front aside before its first
        # request, and this is the watchdog's case, a server whose /generate is lost once it has our requests.
        fleet_resource = SGLangFleet(endpoints=[front.endpoint, fleet.url(HEALTHY)], served_model="", **SHORT_WINDOWS)
        dispatcher = fleet_resource.dispatcher()
        outcomes = finish_shard(dispatcher, 80)
        detect_s, longest_s = time_to_detect(front, fleet)
    assert all(o.ok and o.server == fleet.url(HEALTHY) for o in outcomes.values())
    view = dispatcher.snapshot()["servers"][front.endpoint]
    # Set aside by the rule for requests not running there (the watchdog's, 120 s away, would name no_progress); the
    # times are printed, not asserted: a loaded machine stretches them, the rule that fired is what is tested.
    assert view["state"] == "quarantined" and view["reason"].startswith(NOT_RUNNING)
    print(f"lost /generate, direct: detected in {detect_s:.1f} s, every lost request moved within {longest_s:.1f} s")


def test_the_same_behind_sglang_router(sim_fleet, tmp_path):
    fleet = simulators(sim_fleet)
    with lost_generate(fleet.url(BEHIND)) as front, running_router([front.endpoint], tmp_path / "router") as router:
        # The router has no /server_info (its window is the default one) and no /metrics.
        fleet_resource = SGLangFleet(endpoints=[router, fleet.url(HEALTHY)], default_window=5, **SHORT_WINDOWS)
        dispatcher = fleet_resource.dispatcher()
        outcomes = finish_shard(dispatcher, 80)
        detect_s, longest_s = time_to_detect(front, fleet)
    assert all(o.ok and o.server == fleet.url(HEALTHY) for o in outcomes.values())
    view = dispatcher.snapshot()["servers"][router]
    assert view["state"] == "quarantined" and view["reason"].startswith(SILENT)  # not the watchdog's no_progress
    print(f"lost /generate, behind the router: detected in {detect_s:.1f} s, all moved within {longest_s:.1f} s")
