"""The quality watch of a running shard, and the line it stops (`generation.line_hold`).

A shard run shows every answer it journals to its `QualityWatch` (the figures of each answer-level blocking gate,
computed by the gates' own code in `training.watch_figures`; this stage only carries them). Every poll interval
it writes its watch report next to its heartbeat (`progress/watch/shard=NNNNN.json`: its answers' figures and the
compact rows they were taken from), reads the other running shards' reports, and judges its own answers and the
fleet's (all of them summed, so a job spread over nodes sees one figure). A blocking figure crossing its gate's
threshold, once `min_answers` answers are in, writes the hold; a hold from any run stops this run admitting
requests at its next poll. What is in flight then has `drain_s` to finish and be journaled; the run then ends
with `LineHeld`, and the shard resumes from its journal after the release.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dagster_project.generation.line_hold import (
    Hold,
    HoldExample,
    HoldLog,
    LineHeld,
    gate_label,
    put_hold,
    read_hold,
    read_hold_log,
)
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import WATCH, dropped_key, watch_key
from dagster_project.store.storage import CorruptObject, Store, StoreError

SCOPE_RUN, SCOPE_FLEET = "run", "fleet"
# A report not updated for this many of its poll intervals belongs to a run that ended: left out of the fleet's.
STALE_POLLS = 3


@dataclass(frozen=True)
class WatchFigure:
    """One gate's figure over the answers so far, judged by the gate itself."""

    gate: str
    figure: float  # the share the gate compares with its threshold
    threshold: float
    sample_size: int
    passed: bool
    message: str
    blocking: bool = True  # a warning-only figure (the accept length) is shown and never holds the line
    limit: str = ""  # which of its gate's limits, for a gate of several (short_answers: "empty", "short")
    # The answers the watch needs (`watch_min_answers`) before it holds the line on this figure: under it the figure
    # is shown, not judged.
    min_sample: int = 0

    @property
    def label(self) -> str:
        return gate_label(self.gate, self.limit)

    @property
    def judged(self) -> bool:
        return self.sample_size >= self.min_sample


@dataclass(frozen=True)
class Judgement:
    figures: list[WatchFigure]
    failed: WatchFigure | None  # the first blocking figure that failed, not overridden
    examples: list[HoldExample] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)
    # When the first answer that fails a failed gate on its own finished (journal `finished_at`): what a release
    # condemns starts there. None: unknown.
    onset: float | None = None


class QualityWatch(Protocol):
    """What a shard run needs of the watch: take each journaled row, hand back compact rows (`complete`: all of
    the run's, none dropped from its window), judge rows."""

    def observe(self, row: Mapping[str, Any]) -> None: ...
    def rows(self) -> list[list]: ...
    def complete(self) -> bool: ...
    def judge(self, rows: Sequence[list], overridden: set[str]) -> Judgement: ...


@dataclass(frozen=True)
class WatchOptions:
    """How the watch polls and when it may hold the line (the `completions` op config)."""

    watch_poll_interval_s: float = field(
        default=5.0, metadata={"help": "Seconds between the watch's reads of the hold and the fleet's figures."}
    )
    watch_min_answers: int = field(
        default=100, metadata={"help": "Answers the watch must have seen (in its scope) before it may hold the line."}
    )
    watch_judge_every: int = field(
        default=25,
        metadata={
            "help": "Also judge this run's answers (and the fleet's, as last read) every this many answers, between "
            "polls: a bad model answers fast."
        },
    )
    hold_drain_s: float = field(
        default=300.0,
        metadata={
            "help": "After a hold, seconds in-flight requests may take to finish before they are aborted (what they "
            "wrote is counted: the waste ledger's stopped_in_flight)."
        },
    )


@dataclass
class WatchReport:
    """A running shard's watch, as the store holds it next to its heartbeat."""

    shard: int
    settings_fingerprint: str
    started_at: float
    updated_at: float
    poll_interval_s: float
    run_id: str | None = None
    host: str = ""
    answers: int = 0
    rows: list[list] = field(default_factory=list)
    figures: list[WatchFigure] = field(default_factory=list)
    fleet_figures: list[WatchFigure] = field(default_factory=list)
    fleet_answers: int = 0
    fleet_runs: int = 0
    held: bool = False
    running: bool = True  # false once the run ended: its answers were judged, and no longer count as the fleet's

    def is_current(self, now: float) -> bool:
        return now - self.updated_at <= STALE_POLLS * self.poll_interval_s


# Reports older than this by the store's clock are not read at all: their runs ended (a live run rewrites its report
# every poll), and a store of 1,830 shards would otherwise cost a read of each per poll. Generous, for clock skew.
RECENT_S = 300.0


def read_watch_reports(store: Store, now: float | None = None) -> list[WatchReport]:
    """The shards' watch reports written in the last `RECENT_S` (a damaged one is skipped: it is only a figure,
    never data)."""
    since = (time.time() if now is None else now) - RECENT_S
    reports = []
    for info in store.list(WATCH + "/"):
        if info.modified is not None and info.modified < since:
            continue
        try:
            report = read_record(store, info.key, WatchReport)
        except (CorruptObject, StoreError):
            continue
        if report is not None:
            reports.append(report)
    return reports


def condemned_answers(store: Store, shard: int, fingerprint: str) -> tuple[float, float] | None:
    """When the answers a hold condemned in the shard's journal were written: from the hold's onset (the finish of
    the first answer that failed the gate on its own: those before it were good, and are kept) to the release of
    the hold that stood while the shard's last run ran, released without `--override` (the answers were wrong: the
    shard generates them again). From that run's start instead where the onset is unknown (a fleet's hold, or a
    shard other than the one whose answers the onset was found in), or the release said `--drop-all`. None where
    nothing is condemned: the shard's last run was not held, its hold stands or was released as a false alarm (its
    answers are kept), or the report is of other settings."""
    report = read_record(store, watch_key(shard), WatchReport)
    if report is None or not report.held or report.settings_fingerprint != fingerprint:
        return None
    release = next((h for h in read_hold_log(store).released if (h.released_at or 0.0) > report.started_at), None)
    if release is None or release.overridden or release.released_at is None:
        return None
    onset_known = release.onset is not None and release.shards == [shard] and not release.drop_all
    since = release.onset if onset_known else report.started_at
    return since, release.released_at


@dataclass(frozen=True)
class DroppedAtRelease:
    """What releases of holds dropped from a shard's journal under its settings, all of them summed: answers paid for
    and generated again (the waste ledger's `dropped_at_release`)."""

    settings_fingerprint: str
    answers: int = 0
    output_tokens: int = 0


def read_dropped_at_release(store: Store, shard: int, fingerprint: str) -> DroppedAtRelease:
    """The shard's drops under these settings (none recorded, or under other settings: zero)."""
    recorded = read_record(store, dropped_key(shard), DroppedAtRelease)
    if recorded is None or recorded.settings_fingerprint != fingerprint:
        return DroppedAtRelease(fingerprint)
    return recorded


def record_dropped_at_release(store: Store, shard: int, fingerprint: str, answers: int, output_tokens: int) -> None:
    """Add a drop to the shard's record (one writer: the run holding the shard's lease)."""
    earlier = read_dropped_at_release(store, shard, fingerprint)
    total = replace(earlier, answers=earlier.answers + answers, output_tokens=earlier.output_tokens + output_tokens)
    store.put_bytes(dropped_key(shard), to_json(total))


class LineStop:
    """One shard run's watch loop and whether it may admit requests."""

    def __init__(
        self,
        store: Store,
        shard: int,
        watch: QualityWatch,
        fingerprint: str,
        *,
        run_id: str | None = None,
        options: WatchOptions = WatchOptions(),
        log: Callable[[str], None] = lambda message: None,
        on_hold: Callable[[Hold], None] = lambda hold: None,
        clock: Callable[[], float] = time.time,
    ):
        self.store, self.shard, self.watch, self.fingerprint = store, shard, watch, fingerprint
        self.run_id, self.options, self.log, self.clock = run_id, options, log, clock
        # Called once, in the poll that first sees a hold (this run's or another's), before the drain: what else
        # must stop launching (the Dagster side) need not wait `hold_drain_s` for this run to end.
        self.on_hold = on_hold
        self.started_at = clock()
        self.held: Hold | None = None
        self.answers = 0
        self._last: tuple[Judgement, Judgement, int, int] | None = None  # the last poll's, for `close`
        # What the last full poll read: the other running shards' reports, and the hold log.
        self._others: list[WatchReport] = []
        self._log = HoldLog()
        self._unjudged = 0
        self._wake: asyncio.Event | None = None  # set once `watch_judge_every` answers arrived since the last look

    def admitting(self) -> bool:
        return self.held is None

    def observe(self, row: Mapping[str, Any]) -> None:
        self.answers += 1
        self.watch.observe(row)
        self._unjudged += 1
        if self._wake is not None and self._unjudged >= self.options.watch_judge_every:
            self._wake.set()

    def _hold(
        self, judgement: Judgement, scope: str, sample: int, runs: list[str], shards: list[int], onset: float | None
    ) -> Hold:
        """`onset`: the judgement's, where the rows judged held every answer of `shards` before it (else None)."""
        failed = judgement.failed
        assert failed is not None
        hold = Hold(
            gate=failed.gate,
            limit=failed.limit,
            message=failed.message,
            figure=failed.figure,
            threshold=failed.threshold,
            sample_size=sample,
            scope=scope,
            held_at=self.clock(),
            settings_fingerprint=self.fingerprint,
            examples=judgement.examples,
            servers=judgement.servers,
            runs=sorted({run for run in runs if run}),
            shards=sorted(set(shards)),
            onset=onset,
        )
        return put_hold(self.store, hold)

    def poll(self, full: bool = True, own: list[list] | None = None, *, whole_shard: bool = False) -> Hold | None:
        """Judge this run's answers and the fleet's, holding the line on a failed figure. A full poll first reads
        the hold and the other running shards' reports, and then writes this run's report; a quick one (between
        polls) judges with what the last full poll read and writes only a hold. `own`: this run's rows, taken on the
        event loop that adds to them (a poll runs in a worker thread). `whole_shard`: every event of the shard has
        its answer, so this run's figures may hold under `watch_min_answers` (see `close`). Returns the hold in
        force, if any."""
        now = self.clock()
        self._unjudged = 0
        hold = read_hold(self.store) if full else self.held
        if full:
            self._log = read_hold_log(self.store)
            self._others = [
                report
                for report in read_watch_reports(self.store, now)
                if report.shard != self.shard
                and report.settings_fingerprint == self.fingerprint
                and report.started_at >= self._log.last_release_at
                and report.running
                and report.is_current(now)
                and not report.held
            ]
        log, others = self._log, self._others
        own = self.watch.rows() if own is None else own
        mine = self.watch.judge(own, log.overridden)
        fleet_rows = own + [row for report in others for row in report.rows]
        fleet = self.watch.judge(fleet_rows, log.overridden) if others else mine
        if hold is None:
            runs, shards = (
                [self.run_id or "", *(r.run_id or "" for r in others)],
                [self.shard, *(r.shard for r in others)],
            )
            if mine.failed is not None and (whole_shard or len(own) >= self.options.watch_min_answers):
                # Complete now (after `own` was taken): `own` held every answer of the run too.
                onset = mine.onset if self.watch.complete() else None
                hold = self._hold(mine, SCOPE_RUN, len(own), [self.run_id or ""], [self.shard], onset)
            elif fleet.failed is not None and len(fleet_rows) >= self.options.watch_min_answers:
                # No onset: another run's answers after its report was written, before the onset, were not seen.
                hold = self._hold(fleet, SCOPE_FLEET, len(fleet_rows), runs, shards, None)
        if hold is not None and self.held is None:
            self.held = hold  # admission stops first
            self.log(f"shard {self.shard}: {hold.headline()}")
            self.on_hold(hold)
        self.held = hold
        if full:
            self._write_report(now, own, mine, fleet, len(fleet_rows), 1 + len(others), hold is not None)
        return hold

    def _write_report(
        self,
        now: float,
        own: list[list],
        mine: Judgement,
        fleet: Judgement,
        answers: int,
        runs: int,
        held: bool,
        *,
        running: bool = True,
        whole_shard: bool = False,
    ) -> None:
        needs = 0 if whole_shard else self.options.watch_min_answers  # a whole shard's figures are its gates' verdicts
        report = WatchReport(
            shard=self.shard,
            settings_fingerprint=self.fingerprint,
            started_at=self.started_at,
            updated_at=now,
            poll_interval_s=self.options.watch_poll_interval_s,
            run_id=self.run_id,
            host=socket.gethostname(),
            answers=self.answers,
            rows=own,
            figures=[replace(figure, min_sample=needs) for figure in mine.figures],
            fleet_figures=[replace(figure, min_sample=self.options.watch_min_answers) for figure in fleet.figures],
            fleet_answers=answers,
            fleet_runs=runs,
            held=held,
            running=running,
        )
        self.store.put_bytes(watch_key(self.shard), to_json(report))
        self._last = (mine, fleet, answers, runs)

    def close(self, whole_shard: bool = False) -> None:
        """The run ended: its last answers are judged (a shard a bad model answered within one poll holds the line
        all the same, and is not published), and its report stays for `status` to show, without its rows (no
        longer counted in the fleet's figures). `whole_shard`: the run answered every event of its shard, so its
        figures are the shard's gates' verdicts on it, taken on those rows before they are published: they hold the
        line whatever their number (a shard smaller than `watch_min_answers`, which no figure of the run or the fleet
        could otherwise reach, would be generated through to its gates, and every shard after it)."""
        self.poll(whole_shard=whole_shard)
        assert self._last is not None
        mine, fleet, answers, runs = self._last
        self._write_report(
            self.clock(), [], mine, fleet, answers, runs, self.held is not None, running=False, whole_shard=whole_shard
        )

    async def run(self) -> None:
        """Until cancelled: poll. On a hold, let what is in flight drain for `hold_drain_s`, then raise
        `LineHeld` (a run whose requests all ended sooner stops by itself: nothing more is admitted)."""
        self._wake = asyncio.Event()
        next_full = 0.0
        while True:
            full = time.monotonic() >= next_full
            try:
                held = await asyncio.to_thread(self.poll, full, self.watch.rows())
            except (StoreError, OSError) as exc:  # the next poll may succeed; a watch hiccup stops nothing
                self.log(f"quality watch of shard {self.shard}: store read/write failed: {exc}")
                held = self.held
            if full:
                next_full = time.monotonic() + self.options.watch_poll_interval_s
            if held is not None:
                await asyncio.sleep(self.options.hold_drain_s)
                raise LineHeld(held, self.shard)
            with contextlib.suppress(TimeoutError):  # a poll's time, or enough answers since the last look
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, next_full - time.monotonic()))
            self._wake.clear()

    async def close_quietly(self, whole_shard: bool = False) -> None:
        try:
            await asyncio.to_thread(self.close, whole_shard)
        except (StoreError, OSError) as exc:  # a report left "running" goes stale within a few polls anyway
            self.log(f"quality watch of shard {self.shard}: final report not written: {exc}")
