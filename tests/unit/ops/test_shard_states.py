"""Every shard's state at each stage, from the records the stages leave (manifests, verdicts, export outcomes), and
the alerts they raise: plain answers, no store or Dagster."""

from __future__ import annotations

import time

from dagster_project.generation import server_checks
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.alerts import DEFAULT_THRESHOLDS, raise_alerts
from dagster_project.ops.answers.concurrency import QUARANTINED, answer_concurrency
from dagster_project.ops.answers.mtp import MtpAnswer
from dagster_project.ops.answers.progress import answer_progress
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.shards import (
    BLOCKED,
    DAMAGED,
    EXPORTED,
    NOT_ASSEMBLED,
    NOT_EXPORTED,
    OVERRIDDEN,
    PASSED,
    REFUSED,
    UNCHECKED,
    answer_shards,
    render_shards,
)
from dagster_project.ops.answers.storage import answer_storage
from dagster_project.ops.answers.text import shard_list
from dagster_project.ops.coverage import DamagedShard, DatasetCoverage
from dagster_project.processes import this_process
from dagster_project.store.layout import COMPLETIONS, TRAINING_SET
from dagster_project.store.storage import LocalStore
from dagster_project.store.verdicts import ExportOutcome, Verdict
from dagster_project.training.shards import TrainingShardManifest, TrainingSource

HOST, PID, STARTED = this_process()
STORE = LocalStore("store")  # its URI only: nothing is read
ASIDE = "http://127.0.0.1:30001"
CONCENTRATION = "BLOCKED: 88% of rows (35/40) have loss_mask sum exactly 6"


def completions(shard: int) -> CompletionsShardManifest:
    return CompletionsShardManifest(shard=shard, rows=10, ids_digest=f"c{shard}", published_at=100.0)


def training(shard: int, overridden: dict[str, str] | None = None) -> TrainingShardManifest:
    source = TrainingSource(completions_ids_digest=f"c{shard}", gates_overridden=overridden or {})
    return TrainingShardManifest(
        shard=shard, rows=10, rows_in=10, tokens=0, loss_tokens=0, prompt_tokens=0, ids_digest=f"t{shard}",
        published_at=200.0, source=source,
    )  # fmt: skip


def verdict(check: str, manifest, **failures: str) -> Verdict:
    return Verdict(check, not failures, failures, manifest.published_at, manifest.ids_digest)


def GX(manifest) -> Verdict:  # noqa: N802 (reads as the check's name)
    return verdict("gx_suite", manifest)


def passed(manifest) -> list[Verdict]:
    return [verdict("gates", manifest), verdict("gx_suite", manifest)]


def exported(manifest, refused: str = "", **overridden: str) -> ExportOutcome:
    return ExportOutcome(
        "specforge", not refused, 300.0, manifest.published_at, manifest.ids_digest, "", overridden, refused
    )


def readings(num_shards: int, **records) -> Readings:
    return Readings(time.time(), num_shards, None, None, 10 * num_shards, plan=None, fleet={}, **records)


def store_of(shards: dict[int, tuple]) -> dict:
    """Readings' records from shard → (completions, completions verdicts, training, training verdicts, export)."""
    return {
        "published": {s: c for s, (c, *_) in shards.items() if c},
        "training_set": {s: t for s, (_, _, t, *_) in shards.items() if t},
        "verdicts": {
            COMPLETIONS: {s: v for s, (_, v, *_) in shards.items()},
            TRAINING_SET: {s: v for s, (*_, v, _) in shards.items()},
        },
        "exports": {s: e for s, (*_, e) in shards.items() if e},
        "heartbeats": [],
        "coverage_by_id": None,
    }


def test_each_stage_state_is_read_from_what_the_stages_recorded():
    c = {s: completions(s) for s in range(7)}
    t = {s: training(s) for s in range(7)}
    t[4] = training(4, {"quality/error_rate": "BLOCKED: 30% errors"})
    shards = store_of(
        {
            0: (c[0], [], t[0], passed(t[0]), exported(t[0])),  # green
            1: (
                c[1],
                [],
                t[1],
                [verdict("gates", t[1], loss_sum_concentration=CONCENTRATION), verdict("gx_suite", t[1])],
                None,
            ),
            2: (c[2], [verdict("quality", c[2], error_rate="BLOCKED: 30% errors")], None, [], None),
            3: (c[3], [], t[3], [verdict("gates", t[3])], None),  # gx_suite has not run
            4: (c[4], [], t[4], passed(t[4]), exported(t[4])),  # assembled over a failed completions gate
            5: (c[5], [], t[5], [verdict("gates", t[5], loss_sum_floor="BLOCKED")], exported(t[5], loss_sum_floor="x")),
            6: (c[6], [], t[6], passed(t[6]), exported(t[6], refused="2 rows whose loss mask sums to less than 2")),
        }
    )
    answer = answer_shards(readings(8, **shards))
    by_shard = {state.shard: state for state in answer.needs_a_look}

    assert answer.training_set == {PASSED: 2, BLOCKED: 2, UNCHECKED: 1, OVERRIDDEN: 2, "waiting for completions": 1}
    assert answer.export == {EXPORTED: 3, NOT_EXPORTED: 4, REFUSED: 1}
    assert answer.not_green["training_set blocked"] == [1, 2] and answer.not_green["completions not started"] == [7]
    assert not answer.done and sorted(by_shard) == [1, 2, 4, 5, 6]
    (training_gate,) = by_shard[1].blocked_by
    assert (training_gate.stage, training_gate.gate, training_gate.message) == (
        TRAINING_SET,
        "gates/loss_sum_concentration",
        CONCENTRATION,
    )
    assert training_gate.thresholds == "training_set_gates config max_top_loss_sum_share, min_repeats"
    assert training_gate.override == "override_failed_gates: true in specforge_export's config"
    (completions_gate,) = by_shard[2].blocked_by
    assert completions_gate.thresholds == "completions_quality config max_error_share"
    assert completions_gate.override == "override_failed_gates: true in training_set's config"
    assert by_shard[4].overridden == ["quality/error_rate"] and by_shard[5].overridden == ["loss_sum_floor"]
    assert by_shard[6].refused.startswith("2 rows") and by_shard[6].training_set == PASSED


def test_records_of_an_earlier_publication_do_not_count():
    c, t = completions(0), training(0)
    stale = training(0)
    stale_verdicts = [Verdict("gates", True, {}, 1.0, "old"), Verdict("gx_suite", True, {}, 1.0, "old")]
    old_export = ExportOutcome("specforge", True, 1.0, 1.0, "old")
    answer = answer_shards(readings(1, **store_of({0: (c, [], stale, stale_verdicts, old_export)})))
    assert (answer.training_set, answer.export) == ({UNCHECKED: 1}, {NOT_EXPORTED: 1}) and not answer.done
    # Completions published again since the training set was assembled: it is assembled again.
    republished = CompletionsShardManifest(shard=0, rows=10, ids_digest="other", published_at=150.0)
    answer = answer_shards(readings(1, **store_of({0: (republished, [], t, passed(t), exported(t))})))
    assert answer.training_set == {NOT_ASSEMBLED: 1}


def test_done_only_when_every_shard_is_exported_with_every_gate_green():
    c = {s: completions(s) for s in range(2)}
    t = {s: training(s) for s in range(2)}
    green = {s: (c[s], [], t[s], passed(t[s]), exported(t[s])) for s in range(2)}
    answer = answer_shards(readings(2, **store_of(green)))
    assert answer.done and answer.needs_a_look == [] and answer.not_green == {}
    assert render_shards(answer)[0] == "Shards by stage (2): DONE: every shard exported with every blocking gate green"
    overridden = {**green, 1: (c[1], [], t[1], passed(t[1]), exported(t[1], **{"gates/short_answers": "x"}))}
    answer = answer_shards(readings(2, **store_of(overridden)))
    assert not answer.done and "not done: 1 of 2" in render_shards(answer)[0]


def test_damaged_objects_are_named_by_file_until_the_shard_is_published_again():
    c = {s: completions(s) for s in range(2)}
    problem = "missing completions/shard=00001/completions.parquet"
    coverage = DatasetCoverage(
        computed_at=120.0, **dict.fromkeys(_COUNTS, 0), shards_damaged=[1], damaged=[DamagedShard(1, [problem])]
    )
    records = {**store_of({s: (c[s], [], None, [], None) for s in range(2)}), "coverage_by_id": coverage}
    answer = answer_shards(readings(2, **records))
    (damaged,) = answer.needs_a_look
    assert damaged.completions == DAMAGED and damaged.damaged_objects == [problem]
    alerts = _alerts(readings(2, **records))
    assert f"damaged objects in the store: {problem}" in alerts["damaged"]
    republished = {**records["published"], 1: CompletionsShardManifest(shard=1, rows=10, published_at=130.0)}
    assert answer_shards(readings(2, **{**records, "published": republished})).needs_a_look == []


def test_blocked_and_overridden_shards_raise_alerts_naming_gate_keys_and_override():
    c = {s: completions(s) for s in range(3)}
    t = {s: training(s) for s in range(3)}
    gates = [verdict("gates", t[1], loss_sum_concentration=CONCENTRATION), verdict("gx_suite", t[1])]
    gates2 = [verdict("gates", t[2], loss_sum_concentration="BLOCKED: 90%"), verdict("gx_suite", t[2])]
    records = store_of(
        {
            0: (c[0], [], training(0, {"quality/short_answers": "x"}), passed(t[0]), exported(t[0])),
            1: (c[1], [], t[1], gates, None),
            2: (c[2], [], t[2], gates2, None),
        }
    )
    records["training_set"][0] = training(0, {"quality/short_answers": "x"})
    alerts = _alerts(readings(3, **records))
    assert alerts["blocked"] == (
        f"shards 1-2 blocked by training_set gate gates/loss_sum_concentration (not exported); shard 1: "
        f"{CONCENTRATION}. Thresholds: training_set_gates config max_top_loss_sum_share, min_repeats. Having looked, "
        "to let them through: override_failed_gates: true in specforge_export's config"
    )
    assert alerts["overridden"].startswith("failed gates overridden on shards 0: quality/short_answers")


def test_a_server_set_aside_by_a_running_shard_is_named_with_why_and_when():
    assert QUARANTINED == server_checks.QUARANTINED
    now = time.time()
    view = {"state": QUARANTINED, "reason": "garbage (5 in a row)", "set_aside_at": 1_700_000_000.0}
    beat = Heartbeat(
        shard=3, state="running", settings_fingerprint="f", started_at=now - 60, updated_at=now, total_events=10,
        resumed_events=0, done_events=1, remaining_events=9, ok_events=1, host=HOST, pid=PID,
        process_start=STARTED, servers={ASIDE: view, "http://127.0.0.1:30002": {"state": "healthy"}},
    )  # fmt: skip
    concurrency = answer_concurrency(readings(4, **{**store_of({}), "heartbeats": [beat]}))
    (aside,) = concurrency.set_aside
    assert (aside.url, aside.reason, aside.since, aside.shards) == (
        ASIDE,
        "garbage (5 in a row)",
        1_700_000_000.0,
        [3],
    )
    alerts = _alerts(readings(4, **{**store_of({}), "heartbeats": [beat]}))
    assert alerts["server"].startswith(
        f"set aside: {ASIDE} (garbage (5 in a row)) since 2023-11-14 22:13:20 UTC by the runs of shards [3]"
    )


def test_shard_lists_read_as_ranges_and_stay_short():
    assert shard_list([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert shard_list(list(range(0, 60, 2)), limit=3) == "0, 2, 4 … (+27 more)"
    assert shard_list([]) == "none"


_COUNTS = [
    "shards",
    "shards_published",
    "conversations",
    "conversations_done",
    "conversations_partial",
    "conversations_missing",
    "conversations_with_errors",
    "conversations_in_several_shards",
    "events_planned",
    "events_recorded",
    "events_missing",
    "events_duplicated",
    "events_unexpected",
]


def _alerts(readings_: Readings) -> dict[str, str]:
    """The alerts of these readings, by kind (the last of each kind)."""
    progress = answer_progress(readings_)
    storage = answer_storage(STORE, readings_, None, None)
    alerts = raise_alerts(
        progress,
        MtpAnswer({}, False, None, None, {}),
        answer_concurrency(readings_),
        storage,
        answer_shards(readings_),
        endpoints_known=False,
        thresholds=DEFAULT_THRESHOLDS,
    )
    return {alert.kind: alert.message for alert in alerts}


def test_a_server_whose_answers_were_refused_as_not_answers_is_named_after_its_run_ended():
    """Fragments cut short were retried elsewhere (no error row is left): the dispatcher's count names the server."""
    now = time.time()
    faulty = {"state": "healthy", "errors": {"cut_short": 6, "timeout": 1}}
    healthy = {"state": "healthy", "errors": {}}
    beat = Heartbeat(
        shard=2, state="done", settings_fingerprint="f", started_at=now - 600, updated_at=now - 300, total_events=196,
        resumed_events=0, done_events=196, remaining_events=0, ok_events=196, host=HOST, pid=PID,
        process_start=STARTED, servers={ASIDE: faulty, "http://127.0.0.1:30002": healthy},
    )  # fmt: skip
    records = {**store_of({2: (completions(2), [], None, [], None)}), "heartbeats": [beat]}
    assert answer_concurrency(readings(4, **records)).refused_answers == {ASIDE: {"cut_short": 6}}
    assert _alerts(readings(4, **records))["server"] == (
        f"SERVER {ASIDE}: 6 answers broke the contract: a length stop short of max_new_tokens 6 (each retried, on "
        "another server where there is one; none stored): look at its log and KV pool"
    )


def test_a_shard_publishing_long_after_its_generation_ended_blames_the_store_not_an_idle_server():
    """S3 answering every call 5-20 s late: generation is over, the publish drags on. The fleet is idle because
    nothing is left for it; the alert names the store."""
    now = time.time()
    beat = Heartbeat(
        shard=0, state="generated", settings_fingerprint="f", started_at=now - 900, updated_at=now - 465,
        total_events=80, resumed_events=0, done_events=80, remaining_events=0, ok_events=80, host=HOST, pid=PID,
        process_start=STARTED, heartbeat_interval_s=5.0,
    )  # fmt: skip
    idle = {"healthy": True, "max_running_requests": 8, "running": 0, "queued": 0}
    records = {**store_of({}), "heartbeats": [beat]}
    found = Readings(time.time(), 2, None, None, 160, plan=None, fleet={ASIDE: idle}, **records)
    progress = answer_progress(found)
    assert progress.shards_running == [0] and round(progress.shards_publishing[0]) == 465
    alerts = _alerts(found)
    assert "server" not in alerts  # not "… is idle while shards [0] have work waiting"
    assert alerts["storage"] == (
        f"shards [0] still publishing 465 s after their generation ended: the store ({STORE.uri}) is slow or "
        "failing, not the fleet (each call is retried within the store's retry policy)"
    )


def test_a_server_idle_at_a_shards_tail_is_no_alert_but_one_the_runs_do_not_send_to_is():
    """A healthy run's tail (seen by hand, issue 45): the last events are later turns of conversations whose earlier
    turn is in flight on the other server, so one server has nothing to do. Its run sends to it, has room in its
    window there and nothing on it: the dispatcher has no request ready for it, and "idle while shards have work
    waiting" was a false alarm. A server the run does not send to at all, idle beside the same work, still is one."""
    now = time.time()
    busy, tail_idle, unused = "http://127.0.0.1:30010", "http://127.0.0.1:30011", "http://127.0.0.1:30012"
    views = {busy: {"window": 40, "in_flight": 3}, tail_idle: {"window": 40, "in_flight": 0}}
    beat = Heartbeat(
        shard=2, state="running", settings_fingerprint="f", started_at=now - 300, updated_at=now - 2,
        total_events=70, resumed_events=0, done_events=67, remaining_events=3, ok_events=67, host=HOST, pid=PID,
        process_start=STARTED, heartbeat_interval_s=5.0, servers=views,
    )  # fmt: skip
    probe = {"healthy": True, "max_running_requests": 16, "queued": 0}
    fleet = {busy: {**probe, "running": 3}, tail_idle: {**probe, "running": 0}, unused: {**probe, "running": 0}}
    records = {**store_of({}), "heartbeats": [beat]}
    found = Readings(now, 4, None, None, 280, plan=None, fleet=fleet, **records)
    progress, concurrency = answer_progress(found), answer_concurrency(found)
    assert progress.shards_running == [2] and concurrency.servers[tail_idle].client_window == 40
    storage = answer_storage(STORE, found, None, None)
    mtp = MtpAnswer({}, False, None, None, {})
    alerts = raise_alerts(progress, mtp, concurrency, storage, endpoints_known=False, thresholds=DEFAULT_THRESHOLDS)
    assert [alert.message for alert in alerts if alert.kind == "server"] == [
        f"{unused} is idle while shards [2] have work waiting"
    ]
