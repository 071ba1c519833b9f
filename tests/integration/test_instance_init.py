"""Processes started at once on a fresh DAGSTER_HOME configured by the project's dagster.yaml, with no
initialisation first, as `dagster asset materialize` by the README is run: four runs, and four processes opening
the instance in three rounds; and a home broken before, detected and repaired by `dflash repair-instance`.

Without the storage's lock, processes that first use a fresh SQLite instance together race to create its schema:
some crash ("table alembic_version already exists", "UNIQUE constraint failed: alembic_version.version_num") and
the instance may be left with two schema versions stamped, failing every later command ("more than one head
present").
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.assets.instance_storage import BrokenInstance, stamped_versions
from dagster_project.cli import main

ROOT = Path(__file__).resolve().parents[2]

# A real run on the instance, as cheap as one gets: what matters is each process's first use of the instance.
_ONE_RUN = textwrap.dedent(
    """
    import dagster as dg

    @dg.asset
    def tiny() -> int:
        return 1

    with dg.DagsterInstance.get() as instance:
        assert dg.materialize([tiny], instance=instance).success
    """
)
_COUNT_RUNS = textwrap.dedent(
    """
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        print(sorted(str(run.status) for run in instance.get_runs()))
    """
)


def _python(env: dict[str, str], code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def fresh_home(path: Path) -> Path:
    path.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", path / "dagster.yaml")
    return path


def test_four_runs_at_once_on_a_fresh_instance_all_succeed(tmp_path):
    home = fresh_home(tmp_path / "dagster_home")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    runs = [_python(env, _ONE_RUN) for _ in range(4)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0] * 4, "\n".join(output[-2000:] for output in outputs)
    later = _python(env, _COUNT_RUNS)
    output = later.communicate(timeout=300)[0]
    assert later.returncode == 0 and output.strip() == str(["DagsterRunStatus.SUCCESS"] * 4), output[-2000:]


def _open_when_all_are_ready(home: str, ready: typing.Any) -> None:
    os.environ["DAGSTER_HOME"] = home
    ready.wait(timeout=60)  # all four open the instance together
    with dg.DagsterInstance.get() as instance:
        instance.get_runs(limit=1)


def test_four_processes_opening_a_fresh_instance_at_once_make_it_once_every_round(tmp_path):
    """Forked from this process (Dagster imported once): the race is in opening the instance, not in importing."""
    context = multiprocessing.get_context("fork")
    for round_ in range(3):
        home = fresh_home(tmp_path / f"home-{round_}")
        ready = context.Barrier(4)
        openers = [context.Process(target=_open_when_all_are_ready, args=(str(home), ready)) for _ in range(4)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(timeout=120)
        assert [opener.exitcode for opener in openers] == [0] * 4, f"round {round_}"
        versions = stamped_versions(home)
        assert len(versions) == 3 and all(len(stamped) == 1 for stamped in versions.values()), versions
        assert len({stamped[0] for stamped in versions.values()}) == 1, versions  # every database at one version


def test_a_broken_home_is_named_with_its_repair_and_repaired_by_dflash(tmp_path, monkeypatch, capsys):
    home = fresh_home(tmp_path / "dagster_home")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)
    # What a race left before the lock: the runs database stamped with two schema versions.
    with contextlib.closing(sqlite3.connect(home / "history" / "runs.db")) as connection, connection:
        connection.execute("INSERT INTO alembic_version VALUES ('5771160a95ad')")
    with pytest.raises(
        BrokenInstance, match=r"history/runs.db has 2 schema versions stamped .* dflash repair-instance"
    ):
        dg.DagsterInstance.from_config(str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert main(["repair-instance"]) == 0  # `dflash repair-instance`, in this process (Dagster imported once)
    assert "history/runs.db: kept schema version 5771160a95ad" in capsys.readouterr().out
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_runs() == []
    assert all(len(stamped) == 1 for stamped in stamped_versions(home).values())
