"""Dagster's SQLite storage with its databases made under a lock: the instance class `dagster.yaml` configures.

Dagster's SQLite storage creates its schema the first time a process opens a fresh instance, with no lock: four
shard runs started at once on a new `DAGSTER_HOME` (or the UI and the daemon) race to create the tables and stamp
the schema's version. Some crash ("UNIQUE constraint failed: alembic_version.version_num"), and a database can be
left with two versions stamped, after which every command on the instance fails ("more than one head present").
Every process that opens an instance of `LockedSqliteInstance` (the `dagster` CLI, `dagster dev`, its runs,
`dflash`) makes or checks the shared databases under one exclusive lock on the home (`LockedSqliteStorage`), so
they are made once, by the first. It is an instance class, not a `storage:` entry of dagster.yaml, because only
the class is told the instance's directory. A home broken that way before is detected when it is opened, naming
the command that repairs it (`dflash repair-instance`: `repair_instance`).
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import typing
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.runs.sqlite import sqlite_run_storage
from dagster._core.storage.sql import get_alembic_config
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage
from dagster._serdes import ConfigurableClassData

REPAIR_COMMAND = "dflash repair-instance"
_LOCK_NAME = ".dflash-instance.lock"
_MADE_NAME = ".dflash-instance.made"  # the shared databases were made (by the process that holds the lock first)
# The databases every process of an instance shares (each run's own event log database is written by that run).
_SHARED_DATABASES = ("history/runs.db", "history/runs/index.db", "schedules/schedules.db")


class BrokenInstance(RuntimeError):
    """A database of the instance has more than one schema version stamped: no command can open it."""


@contextlib.contextmanager
def instance_lock(base_dir: str | Path) -> typing.Iterator[None]:
    """The home's exclusive lock, held while its shared databases are made, checked or repaired."""
    Path(base_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(base_dir) / _LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        yield


def stamped_versions(base_dir: str | Path) -> dict[str, list[str]]:
    """Shared database (relative path) → the schema versions stamped in it, for the databases that exist."""
    found = {}
    for name in _SHARED_DATABASES:
        path = Path(base_dir) / name
        if not path.exists():
            continue
        with contextlib.closing(sqlite3.connect(path)) as connection:
            try:
                rows = connection.execute("SELECT version_num FROM alembic_version").fetchall()
            except sqlite3.OperationalError:  # no version table yet: made by a process that has not stamped it
                rows = []
        found[name] = [row[0] for row in rows]
    return found


def broken_databases(base_dir: str | Path) -> dict[str, list[str]]:
    return {name: versions for name, versions in stamped_versions(base_dir).items() if len(versions) > 1}


def _refuse_broken(base_dir: str) -> None:
    broken = broken_databases(base_dir)
    if broken:
        raise BrokenInstance(
            f"the Dagster instance at {base_dir} is broken: "
            + "; ".join(f"{name} has {len(v)} schema versions stamped ({', '.join(v)})" for name, v in broken.items())
            + " (processes that first used it at once, before this project locked its creation). Repair it: "
            f"DAGSTER_HOME={base_dir} {REPAIR_COMMAND}"
        )


class LockedSqliteStorage(DagsterSqliteStorage):
    """`DagsterSqliteStorage` whose shared databases are made by one process, under the home's lock: the first to
    open the home makes them and leaves a mark; the others, and every later process, see the mark and open them
    side by side as Dagster does (the lock is held only until the mark is there)."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        made = Path(base_dir) / _MADE_NAME
        if not made.exists():
            with instance_lock(base_dir):
                if not made.exists():
                    _refuse_broken(base_dir)
                    super().__init__(base_dir, inst_data)
                    made.touch()
                    return
        _refuse_broken(base_dir)
        super().__init__(base_dir, inst_data)

    @classmethod
    def from_config_value(  # ty: ignore[invalid-method-override]
        cls, inst_data: ConfigurableClassData, config_value: typing.Mapping[str, typing.Any]
    ) -> LockedSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)


class LockedSqliteInstance(dg.DagsterInstance):
    """Dagster's instance, whose default storage (where dagster.yaml names none) is `LockedSqliteStorage`."""

    @classmethod
    def config_schema(cls) -> dict[str, typing.Any]:
        return {}  # no settings of its own

    @classmethod
    def config_defaults(cls, base_dir: str) -> typing.Mapping[str, ConfigurableClassData | None]:
        storage = ConfigurableClassData(__name__, LockedSqliteStorage.__name__, yaml.dump({"base_dir": base_dir}))
        return {**InstanceRef.config_defaults(base_dir), "storage": storage}


def repair_instance(home: str | Path) -> list[str]:
    """Repair the instance at `home`, under its lock: a database with several schema versions stamped keeps the
    oldest of them, and the instance is then migrated from there to the current schema (Dagster's migrations
    check what they change, as they do for a database it finds made but not stamped). Returns what was done."""
    script = _alembic_script()
    order = {revision.revision: rank for rank, revision in enumerate(script.walk_revisions())}  # head first
    repaired = []
    with instance_lock(home):
        for name, versions in broken_databases(home).items():
            oldest = max(versions, key=lambda version: order.get(version, -1))
            with contextlib.closing(sqlite3.connect(Path(home) / name)) as connection, connection:
                connection.execute("DELETE FROM alembic_version WHERE version_num != ?", (oldest,))
            repaired.append(f"{name}: kept schema version {oldest} of {', '.join(versions)}")
    with dg.DagsterInstance.from_config(str(home)) as instance:  # locks the home itself while it opens
        instance.upgrade()
    return repaired + [f"migrated the instance at {home} to the current schema"]


def _alembic_script() -> typing.Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(get_alembic_config(sqlite_run_storage.__file__))
