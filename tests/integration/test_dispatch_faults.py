"""Acceptance: under every injected fault each request ends exactly once, as a result or an explicit error.

Faults are set on one server of a running fleet of simulator processes while a shard is in flight.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, FleetDownError, GenRequest, Outcome
from dagster_project.generation.ledger import FleetLedger
from dagster_project.sglang import protocol as proto
from tests.support.sglang_fixtures import SimFleet, call, wait_until

EOS = 248046
PARAMS = proto.sampling_params(max_new_tokens=1024)
# Probes every 0.2 s; a hung server set aside after 2 s without an answer, far past a healthy one's pause between
# answers (tenths of a second) even on a loaded machine, so only the faults set servers aside.
FAST_HEALTH = {"probe_interval_s": 0.2, "watchdog_s": 2.0, "canary_timeout_s": 2.0, "max_probe_backoff_s": 0.5}


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
    recovering: list[asyncio.Future] = []  # held: the loop keeps only a weak reference to a task

    class HungUntilWrittenOff(Shard):
        """Server 1 hangs at the trigger and comes back at the first outcome after the dispatcher wrote it off (its
        requests hedged elsewhere): the originals answer late or are aborted."""

        def on_outcome(self, outcome: Outcome) -> None:
            super().on_outcome(outcome)
            if self.after_fault and not recovering and self.server(1)["state"] == "quarantined":
                recovering.append(asyncio.ensure_future(asyncio.to_thread(fleet.set_faults, 1, hang=False)))

    shard = HungUntilWrittenOff(fleet, 200, lambda: fleet.set_faults(1, hang=True), 30)
    stats = shard.run()
    assert recovering, "the hung server was never written off while outcomes came: the test proves nothing"
    assert all(o.ok for o in shard.outcomes.values()) and stats.hedges > 0
    # The server notices a client gone at its next step: wait until it has settled every request it received.
    log = wait_until(
        lambda: (entries := fleet.requests(1)) and all(e["outcome"] != "pending" for e in entries) and entries,
        timeout_s=60,
        what="the server to settle its requests",
    )
    outcomes = Counter(entry["outcome"] for entry in log)
    # A hedged original that answered first after the server recovered (on a loaded machine the hang can end
    # before the hedge's answer comes) won its race: its hedge elsewhere was the loser.
    originals_won = sum(1 for o in shard.outcomes.values() if o.server == fleet.url(1) and o.attempts > 1)
    # Every original that lost the race was aborted there by its rid, or answered late and was discarded (not
    # delivered).
    assert outcomes["abort"] + stats.late_results >= stats.hedges - originals_won, (outcomes, stats)


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


def test_empty_answers_are_results_the_gates_can_see(sim_fleet):
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 120, lambda: fleet.set_faults(1, empty=5), 20)
    shard.run()
    assert all(o.ok for o in shard.outcomes.values())
    assert sum(o.result.output_ids == [EOS] and o.result.text == "" for o in shard.outcomes.values()) == 5


def test_answers_cut_short_of_their_budget_are_retried_elsewhere_counted_and_the_server_named(sim_fleet):
    """HTTP 200, finish_reason length after a third of the answer, far below max_new_tokens (1,024 here): not an
    answer. Each is retried on another server, and the server that cut them is counted under `cut_short`.

    Cut answers come back early, so on a loaded machine the five can arrive in a row and set their server aside
    (consecutive faults): its other requests are then hedged elsewhere. Those hedges are relaunches too, so the
    retries are the five cut answers plus at most the hedges."""
    fleet = slow_fleet(sim_fleet)
    shard = Shard(fleet, 120, lambda: fleet.set_faults(1, truncate=5), 20)
    stats = shard.run()
    results = [o.result for o in shard.outcomes.values()]
    assert all(o.ok for o in shard.outcomes.values()) and not [r for r in results if r.truncated]
    assert shard.server(1)["errors"] == {"cut_short": 5} and 5 <= stats.retries <= 5 + stats.hedges, stats
    retried = [o for o in shard.outcomes.values() if o.attempts > 1]
    assert 5 <= len(retried) <= 5 + stats.hedges
    # A hedged original may still win on the set-aside server; each cut answer was answered elsewhere.
    assert sum(o.server != fleet.url(1) for o in retried) >= 5


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
    fleet = sim_fleet(2)
    for server in range(2):  # /generate never answers while /health does: every attempt ends at its timeout
        fleet.set_faults(server, hang_generate=True)
    shard = Shard(fleet, 6, lambda: None, 0, request_timeout_s=1.0, max_attempts=2, watchdog_s=60)
    shard.run()
    assert {o.error.kind for o in shard.outcomes.values()} == {"timeout"}
    assert all(o.attempts == 2 and o.error.retryable for o in shard.outcomes.values())


def test_a_dead_fleet_fails_the_run_instead_of_filling_it_with_errors(sim_fleet):
    fleet = slow_fleet(sim_fleet, 2)
    shard = Shard(fleet, 300, lambda: [fleet.kill(i) for i in range(2)], 20, fleet_down_grace_s=1.0)
    with pytest.raises(FleetDownError, match="no usable server"):
        shard.run()
    assert len(shard.outcomes) < 300 and all(o.ok for o in shard.outcomes.values())


def test_a_server_answering_garbage_is_set_aside_and_its_work_finishes_elsewhere(sim_fleet):
    fleet = slow_fleet(sim_fleet, 2)
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, garbage=True), 20)
    shard.run()
    assert all(o.ok for o in shard.outcomes.values())  # no request ended as an error
    bad = shard.server(1)
    assert bad["state"] == "quarantined" and bad["reason"].startswith("bad_response")
    # Set aside after a few in a row (answers it had already started still finish there and may interleave),
    # not after every request was tried on it up to four times.
    assert 5 <= bad["errors"]["bad_response"] <= 2 * bad["window"]
    # A request that got garbage went to the healthy server next, never back to the bad one.
    assert max(o.attempts for o in shard.outcomes.values()) == 2


def test_a_hung_server_is_found_by_its_health_check_and_its_work_moves_at_once(sim_fleet):
    fleet = slow_fleet(sim_fleet, 2, health_check_timeout_s=0.5)
    # The watchdog is a minute away: only the health check can find the hang within this test.
    shard = Shard(fleet, 150, lambda: fleet.set_faults(1, hang=True), 30, watchdog_s=60)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values()) and stats.hedges > 0
    assert shard.server(1)["state"] == "quarantined" and shard.server(1)["reason"].startswith("health_failed")


def test_a_server_busy_with_long_answers_is_not_written_off(sim_fleet):
    # Every answer takes longer than the watchdog, twice over; the server keeps generating, and its /metrics, read
    # thirty times within the watchdog's limit (a loaded machine delays a read by far less), show our requests
    # running there: that is progress. Counting only answers as progress, the watchdog would set it aside.
    watchdog_s = 3.0
    fleet = sim_fleet(1, max_running_requests=4, decode_step_s=0.025, output_len="fixed:900", enable_metrics=True)
    shard = Shard(fleet, 4, lambda: None, 0, watchdog_s=watchdog_s, load_read_interval_s=0.1)
    stats = shard.run()
    assert all(o.ok for o in shard.outcomes.values())
    # What the test stands on (the simulator's step times make it a floor, which a loaded machine only raises).
    assert min(o.latency_s for o in shard.outcomes.values()) > 2 * watchdog_s
    assert stats.hedges == 0 and shard.server(0)["state"] == "healthy"


def run_together(*runs: tuple[Dispatcher, list[GenRequest], Callable[[Outcome], None]]) -> None:
    async def all_runs() -> None:
        await asyncio.gather(*(dispatcher.run(batch, on_outcome) for dispatcher, batch, on_outcome in runs))

    asyncio.run(all_runs())


def test_a_server_set_aside_by_one_run_is_set_aside_for_the_next(sim_fleet, tmp_path):
    fleet = slow_fleet(sim_fleet, 2)
    first = Shard(fleet, 60, lambda: fleet.set_faults(1, garbage=True), 10)
    first.dispatcher.ledger = FleetLedger(tmp_path)
    first.run()
    assert first.server(1)["state"] == "quarantined"
    second = Dispatcher(fleet.urls, DispatchOptions(**FAST_HEALTH), ledger=FleetLedger(tmp_path))
    ended: list[Outcome] = []
    asyncio.run(second.run(requests(40), ended.append))
    assert len(ended) == 40 and all(o.ok and o.server == fleet.url(0) for o in ended)
    view = second.snapshot()["servers"][fleet.url(1)]
    # It never sent that server a request: the verdict came from the first run (its canaries still fail).
    assert view["state"] == "quarantined" and view["reason"].startswith("bad_response") and not view["errors"]


def test_runs_sharing_a_ledger_keep_one_window_at_the_server(sim_fleet, tmp_path):
    fleet = sim_fleet(1, max_running_requests=4, decode_step_s=0.002, output_len="uniform:20:80")
    options = DispatchOptions(**FAST_HEALTH, oversubscription=1.0)
    ended: list[Outcome] = []
    runs = [Dispatcher(fleet.urls, options, ledger=FleetLedger(tmp_path)) for _ in range(3)]
    fleet.reset_occupancy(0)
    batches = [[GenRequest(f"run{r}-{r_.key}", r_.input_ids, PARAMS) for r_ in requests(40)] for r in range(3)]
    run_together(*((dispatcher, batch, ended.append) for dispatcher, batch in zip(runs, batches)))
    assert len(ended) == 120 and all(o.ok for o in ended)
    # Three runs, each sized for the whole server: together they never queued anything behind its cap.
    assert fleet.state(0)["peaks"] == {"running": 4, "queued": 0}


def test_the_run_nearest_its_end_takes_the_freed_slots_first(sim_fleet, tmp_path):
    fleet = sim_fleet(1, max_running_requests=4, decode_step_s=0.002, output_len="uniform:20:80")
    options = DispatchOptions(**FAST_HEALTH, oversubscription=1.0)
    long_ended: list[Outcome] = []
    short_ended: list[Outcome] = []
    marks: dict[str, int] = {}

    class ShortRunLedger(FleetLedger):
        """Notes how far the long run was when the short run first asked for slots (after probing the server,
        which takes longer on a loaded machine: the long run keeps its whole window meanwhile)."""

        def acquire(self, server: str, want: int, limit: int) -> int:
            marks.setdefault("long_done_when_short_asked", len(long_ended))
            return super().acquire(server, want, limit)

    long_run = Dispatcher(fleet.urls, options, ledger=FleetLedger(tmp_path))
    short_run = Dispatcher(fleet.urls, options, ledger=ShortRunLedger(tmp_path))
    short_batch = [GenRequest(f"short-{r.key}", r.input_ids, PARAMS) for r in requests(24)]

    def on_short(outcome: Outcome) -> None:
        short_ended.append(outcome)
        if len(short_ended) == len(short_batch):
            marks["long_done_when_short_finished"] = len(long_ended)

    async def scenario() -> None:
        long_task = asyncio.create_task(
            long_run.run(requests(120), long_ended.append, remaining=lambda: 120 - len(long_ended))
        )
        while len(long_ended) < 10:
            await asyncio.sleep(0.01)  # polling a count in the same loop, not timing anything
        await short_run.run(short_batch, on_short, remaining=lambda: 24 - len(short_ended))
        await long_task

    asyncio.run(scenario())
    assert len(long_ended) == 120 and len(short_ended) == 24
    # Once the short run asks, every freed slot but one is its: the long run finishes what it had in flight (one
    # window of 4) and keeps one slot of the 4 (a run holding a pool slot always has a request in flight), so about
    # 24 / 3 = 8 more while the short run's 24 go through three slots: 12, and 2 of slack for answers of uneven
    # length. Sharing slots evenly, it would finish 24 or more.
    assert marks["long_done_when_short_finished"] - marks["long_done_when_short_asked"] <= 14


# ---- load from other nodes: the servers' own running + queued counts ------------------------------------------

ADMISSION = {"max_running_requests": 4, "decode_step_s": 0.002, "output_len": "uniform:150:450", "enable_metrics": True}
WINDOW = 5  # cap 4 x oversubscription 1.25
SLACK = 2  # what another client sends between two reads of the server's load
# Longer than a refill takes on a loaded test machine (a slot freed and taken again shows as room meanwhile).
READ_INTERVAL_S = 0.2


@contextmanager
def another_node(url: str, clients: int) -> Iterator[None]:
    """`clients` plain loops sending requests straight to the server, one at a time each, no ledger, no window."""
    stop = threading.Event()

    def loop(client: int) -> None:
        sent = 0
        while not stop.is_set():
            body = {
                "input_ids": [248045, 846, 5000 + client, sent],
                "sampling_params": PARAMS,
                "rid": f"other{client}-{sent}",
            }
            assert call(url + "/generate", body)[0] == 200
            sent += 1

    with ThreadPoolExecutor(clients) as pool:
        loops = [pool.submit(loop, client) for client in range(clients)]
        try:
            yield
        finally:
            stop.set()
            for running in loops:
                running.result()


def peak_load(fleet: SimFleet) -> int:
    peaks = fleet.state(0)["peaks"]
    return peaks["running"] + peaks["queued"]


@pytest.mark.parametrize("read_interval_s", [READ_INTERVAL_S, 0.0])
def test_load_from_another_node_makes_the_dispatcher_hold_back(sim_fleet, tmp_path, read_interval_s):
    fleet = sim_fleet(1, **ADMISSION)
    options = DispatchOptions(**FAST_HEALTH, load_read_interval_s=read_interval_s)
    ended: list[Outcome] = []
    with another_node(fleet.url(0), clients=4):
        wait_until(lambda: fleet.state(0)["running"] == 4, what="the other node's four requests running")
        fleet.reset_occupancy(0)
        dispatcher = Dispatcher(fleet.urls, options, ledger=FleetLedger(tmp_path))
        asyncio.run(dispatcher.run(requests(30), ended.append))
    assert len(ended) == 30 and all(o.ok for o in ended)
    if read_interval_s:
        # Reading what the server runs and queues, the run fills only what the other node leaves of the window.
        assert peak_load(fleet) <= WINDOW + SLACK
    else:
        # Counting only its own node, it opens a whole window on top of the other node's requests.
        assert peak_load(fleet) >= WINDOW + 4


def test_runs_on_two_nodes_keep_about_one_window_at_the_server(sim_fleet, tmp_path):
    fleet = sim_fleet(1, **ADMISSION)
    options = DispatchOptions(**FAST_HEALTH, load_read_interval_s=READ_INTERVAL_S)
    ended: list[Outcome] = []
    # Two runs on each of two nodes: a ledger per node, so each node sees the other only through the server.
    nodes = [
        [Dispatcher(fleet.urls, options, ledger=FleetLedger(tmp_path / f"node{n}")) for _ in range(2)] for n in (0, 1)
    ]
    batches = [[GenRequest(f"run{r}-{r_.key}", r_.input_ids, PARAMS) for r_ in requests(20)] for r in range(4)]
    fleet.reset_occupancy(0)

    async def scenario() -> None:
        first = [asyncio.create_task(run.run(batch, ended.append)) for run, batch in zip(nodes[0], batches)]
        while not ended:
            await asyncio.sleep(0.01)  # polling a count in the same loop, not timing anything
        # The second node starts while the first one is generating: it sees the first one's load at the server.
        second = [run.run(batch, ended.append) for run, batch in zip(nodes[1], batches[2:])]
        await asyncio.gather(*first, *second)

    asyncio.run(scenario())
    assert len(ended) == 80 and all(o.ok for o in ended)
    assert peak_load(fleet) <= WINDOW + SLACK
    # Each node got its turn: the second one did not wait for the first to finish everything.
    assert {o.request.key.split("-")[0] for o in ended[:60]} >= {"run2", "run3"}
