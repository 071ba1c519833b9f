"""What `dflash status` last read from the store, kept on this node (its work directory, one file per store): what
it shows, marked as of then, when the store does not answer within the status budget (`store.read_budget`).

Every status that reads the whole store in time replaces it. It holds the readings as they were taken (their time
included, so the answers made from it again are the answers of then: a run alive then is not shown dead for the
age of the snapshot), the Dagster view and stale node records read with them, and what to materialize first.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from dagster_project.generation.fleet_registry import NodeRecord
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.dagster_view import DagsterView
from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.storage import LocalStore, StoreError

SNAPSHOT_DIR = "status"


@dataclass(frozen=True)
class StoreSnapshot:
    store: str  # its URI: a snapshot answers only for the store it was read from
    readings: Readings
    view: DagsterView | None = None  # the Dagster view the run_report asset recorded (plain `status` reads it)
    stale_nodes: list[NodeRecord] = field(default_factory=list)
    first: str | None = None  # what to materialize before the answers mean anything (None: nothing)


def empty_snapshot(store: str, now: float) -> StoreSnapshot:
    """What is known of a store this node never read in time: nothing."""
    return StoreSnapshot(store, Readings(now, 0, None, None, 0, {}, [], {}, None, None))


def _snapshot_file(work_dir: Path, store: str) -> tuple[LocalStore, str]:
    """The directory of this node's snapshots (as a local store: written whole, as every record is), and the name
    of `store`'s snapshot in it."""
    return LocalStore(work_dir / SNAPSHOT_DIR), f"{hashlib.sha256(store.encode()).hexdigest()[:16]}.json"


def save_snapshot(work_dir: Path, snapshot: StoreSnapshot) -> str | None:
    """What went wrong keeping it, or None. A status that cannot keep its snapshot still answers: the reason is a
    note, not a failure. Not synced on its own: a snapshot lost with the machine is only an older one."""
    try:
        directory, name = _snapshot_file(work_dir, snapshot.store)
        directory.put_bytes(name, to_json(snapshot, int_keys=True), synced=False)
    except StoreError as exc:
        return f"status snapshot not kept: {exc} (while the store is slow, status then has no figures to show)"
    return None


def load_snapshot(work_dir: Path, store: str) -> StoreSnapshot | None:
    """The last snapshot of `store` on this node; None when there is none, or it cannot be read as one (a snapshot
    written by another version: the next status in time replaces it)."""
    try:
        directory, name = _snapshot_file(work_dir, store)
        snapshot = from_json(StoreSnapshot, directory.get_bytes(name))
    except (StoreError, ValueError, TypeError):
        return None
    return snapshot if snapshot.store == store else None
