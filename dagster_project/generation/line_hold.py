"""Stop the line: the hold a watched quality figure puts on generation, in the store for every node to read.

When the quality watch (`generation.line_stop`, its figures from `training.watch_figures`) finds a blocking gate
failing over the answers so far, one run writes `holds/active.json`: the gate, its figure, threshold and sample
size, example answers, the servers, runs and shards involved. Every shard run reads it within its poll interval
and stops admitting requests (what is in flight finishes and is journaled); no shard starts while it stands.

`dflash hold release` moves it into `holds/released.json` with who, when and why, and the gates released with
`--override` (a known false alarm): the watch then no longer holds on those, and the shards generated after
record them in their manifests (`CompletionsShardManifest.hold_overrides`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from dagster_project.store.dataclass_json import from_json, read_record, to_json
from dagster_project.store.layout import COMPLETIONS, hold_key, hold_log_key, regenerate_command
from dagster_project.store.storage import PreconditionFailed, Store

RELEASE_COMMAND = "dflash hold release --reason TEXT"
# The held shards' commands a hold's text spells out; past this many, the rest by their shard numbers.
SHOWN_COMMANDS = 3


def gate_label(gate: str, limit: str) -> str:
    """A gate, and which of its limits for a gate of several: "short_answers (empty)"; each label has one
    threshold (the watch's figures and the hold name them so)."""
    return f"{gate} ({limit})" if limit else gate


@dataclass(frozen=True)
class HoldExample:
    event_id: str
    answer_head: str  # the first characters of the answer as the model wrote it
    server: str = ""


@dataclass(frozen=True)
class Hold:
    gate: str
    message: str  # the gate's own verdict
    figure: float
    threshold: float
    sample_size: int  # answers the figure was taken over
    scope: str  # "run" (one shard run's answers) or "fleet" (every running shard's, summed through the store)
    held_at: float
    settings_fingerprint: str = ""
    examples: list[HoldExample] = field(default_factory=list)
    servers: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    shards: list[int] = field(default_factory=list)
    released_at: float | None = None
    released_by: str | None = None
    release_reason: str | None = None
    overridden: list[str] = field(default_factory=list)  # gates released as a known false alarm
    limit: str = ""  # which of the gate's limits failed, for a gate of several (`WatchFigure.limit`)
    # A run's hold: when the first of its answers that failed the gate on its own finished (`Judgement.onset`); a
    # release without --override condemns its shard's answers from there (`line_stop.condemned_answers`). None: unknown
    # (a fleet's hold), from the runs' starts.
    onset: float | None = None
    drop_all: bool = False  # released with --drop-all: the held runs' answers condemned whole, onset or not

    def headline(self) -> str:
        """One line: what holds the line, on what evidence, and what to do."""
        at = datetime.fromtimestamp(self.held_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        gate = gate_label(self.gate, self.limit)
        return (
            f"LINE HELD since {at}: gate {gate} at {self.figure:.1%} (threshold {self.threshold:.1%}, "
            f"{self.sample_size} answers, {self.scope}); no shard run admits requests. Look at the examples "
            f"(`dflash hold`), fix the fleet, then `{RELEASE_COMMAND}` (a known false alarm: "
            f"`dflash hold release --override {self.gate} --reason TEXT`); then {self.rerun()}"
        )

    def rerun(self) -> str:
        """What brings the held shards back once released: each one's command (it resumes from its journal)."""
        if not self.shards:
            return "materialize the held shards again (each resumes from its journal)"
        commands = "; ".join(f"`{regenerate_command(COMPLETIONS, shard)}`" for shard in self.shards[:SHOWN_COMMANDS])
        rest = self.shards[SHOWN_COMMANDS:]
        more = f"; the same with --partition for shards {', '.join(map(str, rest))}" if rest else ""
        held = ", ".join(map(str, self.shards))
        return f"materialize the held shards {held} again, each resumes from its journal: {commands}{more}"


@dataclass
class HoldLog:
    """Every released hold, oldest first."""

    released: list[Hold] = field(default_factory=list)

    @property
    def overridden(self) -> set[str]:
        return {gate for hold in self.released for gate in hold.overridden}

    @property
    def override_records(self) -> dict[str, str]:
        """Gate → who overrode it, when and why: what the manifests and the dataset card record."""
        return {
            gate: f"watch hold released as a false alarm by {hold.released_by} at "
            f"{datetime.fromtimestamp(hold.released_at or 0, UTC):%Y-%m-%d %H:%M UTC}: {hold.release_reason}"
            for hold in self.released
            for gate in hold.overridden
        }

    @property
    def last_release_at(self) -> float:
        """Answers before this were judged already: the watch counts only answers after it."""
        return max((hold.released_at or 0.0 for hold in self.released), default=0.0)


class LineHeld(RuntimeError):
    """Generation stopped on a hold; the shard resumes from its journal once the hold is released."""

    def __init__(self, hold: Hold, shard: int | None = None):
        self.hold, self.shard = hold, shard
        where = f"shard {shard}: " if shard is not None else ""
        super().__init__(f"{where}{hold.headline()}")


def read_hold(store: Store) -> Hold | None:
    return read_record(store, hold_key(), Hold)


def read_hold_log(store: Store) -> HoldLog:
    return read_record(store, hold_log_key(), HoldLog) or HoldLog()


def put_hold(store: Store, hold: Hold) -> Hold:
    """Hold the line, unless a hold stands already: the first one written is the one in force (returned)."""
    try:
        store.put_if(hold_key(), to_json(hold), None)
        return hold
    except PreconditionFailed:
        return read_hold(store) or hold


def release_hold(
    store: Store,
    *,
    by: str,
    reason: str,
    override: list[str] = (),
    drop_all: bool = False,
    now: float | None = None,
) -> Hold:
    """Release the hold in force, recorded with who, when, why, the gates overridden and whether the held runs'
    answers are dropped whole (`drop_all`) rather than from the onset; `LookupError` if none."""
    current = store.get_versioned(hold_key())
    if current is None:
        raise LookupError("no hold is in force (`dflash hold` shows the last ones released)")
    hold = from_json(Hold, current[0])
    released = replace(
        hold,
        released_at=time.time() if now is None else now,
        released_by=by,
        release_reason=reason,
        overridden=sorted(set(override)),
        drop_all=drop_all,
    )
    log = read_hold_log(store)
    log.released.append(released)
    store.put_bytes(hold_log_key(), to_json(log))  # the record first: a crash here leaves the hold in force
    store.delete(hold_key())
    return released
