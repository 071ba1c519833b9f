"""Dispatcher behaviour against simulator fleets: windows, laziness, follow-ups, errors, snapshots."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import pytest

from dagster_project.generation.dispatch import (
    Dispatcher,
    DispatchOptions,
    FleetRefusesKey,
    GenRequest,
    Outcome,
)
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.client import INPUT_OUT_OF_VOCAB
from dagster_project.sglang.model_identity import QWEN3_6_27B

PARAMS = proto.sampling_params(max_new_tokens=4096)


def prompt(i: int) -> list[int]:
    return [248045, 846, 198, 1000 + i % 5000, 30, 248046, 198, 248045, 74455, 198, 248068, 198]


def requests(count: int, prefix: str = "e", params: dict = PARAMS) -> Iterator[GenRequest]:
    for i in range(count):
        yield GenRequest(f"{prefix}{i}#turn0", prompt(i), params, payload=i)


class Recorder:
    """on_outcome that checks exactly-once delivery and every result against the protocol."""

    def __init__(self):
        self.outcomes: dict[str, Outcome] = {}

    def __call__(self, outcome: Outcome) -> None:
        key = outcome.request.key
        assert key not in self.outcomes, f"{key} delivered twice"
        assert (outcome.result is None) != (outcome.error is None)
        if outcome.result is not None:
            body = {
                "text": outcome.result.text,
                "output_ids": outcome.result.output_ids,
                "meta_info": outcome.result.meta_info,
            }
            assert (
                proto.check_generate_response(
                    body, input_ids=outcome.request.input_ids, sampling=outcome.request.sampling_params
                )
                == []
            )
        self.outcomes[key] = outcome

    def kinds(self) -> Counter:
        return Counter("ok" if o.ok else o.error.kind for o in self.outcomes.values())


def dispatch(dispatcher: Dispatcher, source, on_outcome) -> object:
    return asyncio.run(dispatcher.run(source, on_outcome))


def test_every_request_ends_once_and_windows_come_from_server_info(sim_fleet):
    windows = [{"effective_max_running_requests": cap} for cap in (3, 5, 7)]
    fleet = sim_fleet(3, windows, decode_step_s=0.001, output_len="uniform:20:80")
    recorder = Recorder()
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(oversubscription=1.0))
    stats = dispatch(dispatcher, requests(300), recorder)
    assert len(recorder.outcomes) == 300 and recorder.kinds() == {"ok": 300}
    assert (stats.outcomes, stats.results, stats.attempts, stats.late_results) == (300, 300, 300, 0)
    snapshot = dispatcher.snapshot()["servers"]
    assert [snapshot[url]["window"] for url in fleet.urls] == [3, 5, 7]
    for index in range(3):  # the window equals the cap: nothing ever waited in a server's queue
        state = fleet.state(index)
        assert state["peaks"]["queued"] == 0 and state["peaks"]["running"] == state["cap"]
    assert sum(s["done"] for s in snapshot.values()) == 300
    assert {o.attempts for o in recorder.outcomes.values()} == {1}


def test_oversubscription_queues_a_little_behind_each_cap(sim_fleet):
    fleet = sim_fleet(1, effective_max_running_requests=4, decode_step_s=0.002, output_len="fixed:60")
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(oversubscription=1.5))
    dispatch(dispatcher, requests(60), Recorder())
    assert dispatcher.snapshot()["servers"][fleet.url(0)]["window"] == 6
    assert fleet.state(0)["peaks"] == {"running": 4, "queued": 2}


def test_requests_are_pulled_lazily_so_memory_stays_bounded(sim_fleet):
    fleet = sim_fleet(2, effective_max_running_requests=4, decode_step_s=0.001)
    pulled, delivered, worst = 0, 0, 0

    def source() -> Iterator[GenRequest]:
        nonlocal pulled
        for request in requests(200):
            pulled += 1
            yield request

    def on_outcome(outcome: Outcome) -> None:
        nonlocal delivered, worst
        delivered += 1
        worst = max(worst, pulled - delivered)

    dispatch(Dispatcher(fleet.urls), source(), on_outcome)
    # In flight (two windows of 5 = 1.25 x 4) plus finished but not yet delivered (another fleet's worth).
    assert delivered == 200 and worst <= 20


def test_follow_ups_run_as_next_turns_and_async_sources_and_callbacks_work(sim_fleet):
    fleet = sim_fleet(2, decode_step_s=0.001)
    turns: dict[str, list[int]] = {}

    async def source() -> AsyncIterator[GenRequest]:
        for i in range(30):
            await asyncio.sleep(0)
            yield GenRequest(f"c{i}#turn0", prompt(i), PARAMS, payload=(f"c{i}", 0))

    async def on_outcome(outcome: Outcome) -> list[GenRequest]:
        conversation, turn = outcome.request.payload
        assert outcome.ok
        turns.setdefault(conversation, []).append(turn)
        if turn == 2:
            return []
        history = outcome.request.input_ids + outcome.result.output_ids
        return [
            GenRequest(
                f"{conversation}#turn{turn + 1}", history + [248045, 846], PARAMS, payload=(conversation, turn + 1)
            )
        ]

    stats = dispatch(Dispatcher(fleet.urls), source(), on_outcome)
    assert stats.outcomes == 90 and all(order == [0, 1, 2] for order in turns.values()) and len(turns) == 30


def test_request_errors_end_at_once_and_results_are_never_errors(sim_fleet):
    fleet = sim_fleet(2, context_length=400)
    recorder = Recorder()
    good = list(requests(20, params=proto.sampling_params(max_new_tokens=200)))
    too_long = [GenRequest(f"long{i}", [1] * 500, PARAMS) for i in range(3)]
    bad_params = [GenRequest("bad0", prompt(0), {"max_new_tokens": 1.5})]
    overflow = [GenRequest("overflow0", prompt(0), proto.sampling_params(max_new_tokens=1000))]
    stats = dispatch(Dispatcher(fleet.urls), good + too_long + bad_params + overflow, recorder)
    assert recorder.kinds() == {"ok": 20, "context_length": 4, "bad_request": 1}
    for key in ("long0", "overflow0"):
        error = recorder.outcomes[key].error
        assert not error.retryable and recorder.outcomes[key].attempts == 1 and "context length" in error.message
    assert stats.errors == {"context_length": 4, "bad_request": 1}


def test_duplicate_keys_are_refused(sim_fleet):
    fleet = sim_fleet(1, decode_step_s=0.01)
    with pytest.raises(ValueError, match="already in flight"):
        dispatch(
            Dispatcher(fleet.urls),
            [GenRequest("same", prompt(0), PARAMS), GenRequest("same", prompt(1), PARAMS)],
            Recorder(),
        )


def test_an_exception_in_on_outcome_stops_the_run(sim_fleet):
    fleet = sim_fleet(1)

    def explode(outcome: Outcome) -> None:
        raise RuntimeError("journal full")

    with pytest.raises(RuntimeError, match="journal full"):
        dispatch(Dispatcher(fleet.urls), requests(5), explode)


def test_snapshot_shows_live_per_server_state(sim_fleet):
    fleet = sim_fleet(2, decode_step_s=0.002, output_len="fixed:100")
    dispatcher = Dispatcher(fleet.urls)
    seen: list[dict] = []

    def on_outcome(outcome: Outcome) -> None:
        seen.append(dispatcher.snapshot())

    dispatch(dispatcher, requests(40), on_outcome)
    busy = seen[0]
    assert busy["running"] and busy["totals"]["in_flight"] > 0 and busy["totals"]["healthy_servers"] == 2
    server = busy["servers"][fleet.url(0)]
    assert (
        server["state"] == "healthy"
        and server["window"] == 10
        and set(server) >= {"in_flight", "done", "errors", "completion_tokens"}
    )
    final = dispatcher.snapshot()
    assert not final["running"] and final["totals"]["outcomes"] == 40 and final["totals"]["completion_tokens"] == 4000


def test_a_wrong_api_key_fails_the_run_at_once_without_showing_the_key(sim_fleet):
    fleet = sim_fleet(2, api_key="right-key")
    # A grace of an hour: the run must not wait for the fleet to look down, the first 401 ends it (a run that waited
    # would be stopped by pytest's timeout, 600 s, and fail).
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(fleet_down_grace_s=3600), api_key="wrong-key")
    recorder = Recorder()
    with pytest.raises(FleetRefusesKey, match="refused the API key.*SGLANG_API_KEY") as refused:
        dispatch(dispatcher, requests(10), recorder)
    assert "wrong-key" not in str(refused.value) and "right-key" not in str(refused.value)
    assert recorder.outcomes == {}  # nothing was turned into an error record


def test_another_models_server_and_an_out_of_vocabulary_request_are_never_sent_to(sim_fleet):
    """The trial of "never another model's answers": a simulator declaring Llama in /server_info and /model_info
    gets none of the requests, and a request holding an id past the vocabulary (what kills a real server) ends as
    an error without reaching any server."""
    fleet = sim_fleet(2, [{"model_path": "meta-llama/Llama-3.1-8B-Instruct"}, {}])
    bad = GenRequest("bad#turn0", [*prompt(0), QWEN3_6_27B.vocab_size + 3], PARAMS)
    recorder = Recorder()
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(), expected_model=QWEN3_6_27B)
    stats = dispatch(dispatcher, [*requests(12), bad], recorder)
    assert recorder.kinds() == Counter({"ok": 12, INPUT_OUT_OF_VOCAB: 1}) and stats.errors == {INPUT_OUT_OF_VOCAB: 1}
    refused = recorder.outcomes["bad#turn0"].error
    assert f"id {QWEN3_6_27B.vocab_size + 3} at position 12 lies outside the vocabulary" in refused.message
    assert {o.server for o in recorder.outcomes.values() if o.ok} == {fleet.url(1)}
    probe = proto.input_hash([0])  # the identity probes' and canaries' one-token prompt
    assert {entry["input_hash"] for entry in fleet.requests(0)} == {probe}  # Llama: probed, never asked
    seen = {entry["input_hash"] for server in (0, 1) for entry in fleet.requests(server)}
    assert proto.input_hash(bad.input_ids) not in seen
    view = dispatcher.snapshot()["servers"][fleet.url(0)]
    assert view["state"] == "quarantined"
    assert view["reason"].startswith("served_model_mismatch: it does not serve Qwen/Qwen3.6-27B")
