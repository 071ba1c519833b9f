"""The Dagster instance of deploy/dagster-postgres.yaml on a real PostgreSQL server: the demo's stages and its pool.

A PostgreSQL server on loopback (tests/support/postgres_server.py) holds the instance; its connection comes
from the environment (DAGSTER_PG_*), as in production. `raw_prompts` and `conversations` run through
`dagster asset materialize`; then two shards' `completions` runs start at once, as `make demo` starts them,
against a simulator fleet, with the `sglang_fleet` pool set to one slot.

It checks, all read back from Postgres: the runs are in its tables; the pool (its slots are Postgres rows
too) let one `completions` step run at a time; every shard holds every planned event exactly once. The run
queue, run monitoring and run retries on this instance, with a backfill launched from the UI's GraphQL, are
tests/integration/test_node_loss.py.
"""

from __future__ import annotations

import contextlib
import shutil
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import psycopg2
import yaml

from dagster_project.generation.shards import read_completions_manifest, shard_coverage
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import (
    DAGSTER,
    materialize,
    pipeline_env,
    run_cli,
    step_windows,
)
from tests.support.paths import PROJECT_ROOT
from tests.support.sglang_fixtures import slow_until_cleared, wait_until

# The demo's four shards, two of them run: two runs are what the pool must keep apart, and a quarter of the demo
# data each keeps their steps short yet long enough to overlap without the pool.
NUM_SHARDS = 4
SHARDS = [f"shard-{i:05d}" for i in range(2)]
POOL = "sglang_fleet"
INSTANCE_YAML = PROJECT_ROOT / "deploy" / "dagster-postgres.yaml"
# Slow enough that the shards' completions steps, started at once, would overlap without the pool (until the first
# step ends: `slow_until_cleared`).
SLOW_FLEET = {"output_len": "uniform:44:84", "decode_step_s": 0.02, "max_running_requests": 2, "enable_metrics": True}
PARENT_RUN_TAG = "dagster/parent_run_id"


def test_the_postgres_instance_keeps_every_setting_of_the_repositorys_instance_but_storage():
    postgres = yaml.safe_load(INSTANCE_YAML.read_text())
    local = yaml.safe_load((PROJECT_ROOT / "dagster.yaml").read_text())
    storages = [postgres.pop(kind) for kind in ("run_storage", "event_log_storage", "schedule_storage")]
    # The instance class locks a SQLite home's first creation (its databases are files beside it); PostgreSQL's schema
    # lives in the server, made by `dagster instance migrate`.
    assert local.pop("instance_class")["class"] == "LockedSqliteInstance"
    assert postgres == local
    assert [storage["class"] for storage in storages] == [
        "PooledPostgresRunStorage",
        "PooledPostgresEventLogStorage",
        "PooledPostgresScheduleStorage",
    ]
    assert storages[0]["config"] == storages[1]["config"] == storages[2]["config"]
    db = storages[0]["config"]["postgres_db"]
    assert {name: db[name] for name in ("hostname", "port", "username", "password", "db_name")} == {
        "hostname": {"env": "DAGSTER_PG_HOST"},
        "port": {"env": "DAGSTER_PG_PORT"},
        "username": {"env": "DAGSTER_PG_USER"},
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "db_name": {"env": "DAGSTER_PG_DB"},
    }


def _scalar(server, query: str) -> int:
    with contextlib.closing(psycopg2.connect(server.psql_url())) as connection:
        cursor = connection.cursor()
        cursor.execute(query)
        return int(cursor.fetchone()[0])


def _run_table_count(server) -> int:
    return _scalar(server, "SELECT count(*) FROM runs")


def _sessions_opened(server) -> int:
    """Connections PostgreSQL has accepted since it started (one backend process each)."""
    return _scalar(server, "SELECT sum(sessions) FROM pg_stat_database")


def test_the_instance_keeps_its_connections_instead_of_connecting_per_query(postgres_server, tmp_path, monkeypatch):
    """dagster-postgres's own storages connect anew for every query; a backfill's thousands of queries each paid a
    PostgreSQL backend's start. The instance's storages keep one connection each."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(INSTANCE_YAML, home / "dagster.yaml")
    for name, value in postgres_server.env.items():
        monkeypatch.setenv(name, value)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)  # the tables exist and each storage has connected once
        instance.get_latest_materialization_event(dg.AssetKey("completions"))
        before = _sessions_opened(postgres_server)
        for _ in range(20):
            instance.get_runs(limit=1)
            instance.get_latest_materialization_event(dg.AssetKey("completions"))
            instance.event_log_storage.has_table("concurrency_slots")
        opened = _sessions_opened(postgres_server) - before
    assert opened <= 2, f"{opened} new connections for 60 queries: the storages connect per query"


def test_the_demos_stages_on_postgres_with_the_pool_of_one_slot(postgres_server, sim_fleet, tmp_path, monkeypatch):
    fleet = sim_fleet(2, **slow_until_cleared(SLOW_FLEET))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(INSTANCE_YAML, home / "dagster.yaml")
    store = LocalStore(tmp_path / "store")
    connection = {**postgres_server.env, "DAGSTER_PG_PASSWORD": "unused-with-trust-auth"}
    for name, value in connection.items():  # what this process needs to read the instance afterwards
        monkeypatch.setenv(name, value)
    env = pipeline_env(
        home=home,
        store=store.uri,
        work_dir=tmp_path / "work",
        num_shards=NUM_SHARDS,
        endpoints=fleet.urls,
        extra=connection,
    )
    run_cli([DAGSTER, "instance", "concurrency", "set", POOL, "1"], env=env, cwd=tmp_path)
    materialize(env, tmp_path, "raw_prompts,conversations")
    materialize(env, tmp_path, "pilot")  # as the demo: the shards generate once a pilot of their settings passed

    with ThreadPoolExecutor(len(SHARDS)) as pool:
        runs = [pool.submit(materialize, env, tmp_path, "completions", shard) for shard in SHARDS]
        # Once a step has ended (its shard published), the other's speed proves nothing: it may run at full speed.
        wait_until(
            lambda: (
                any(read_completions_manifest(store, shard) for shard in range(len(SHARDS)))
                or any(run.done() for run in runs)
            ),
            timeout_s=300,
            interval_s=0.2,
            what="a shard's completions to be published",
        )
        for index in range(2):
            fleet.clear_faults(index)
        for run in runs:
            run.result()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PooledPostgresRunStorage"
        assert _run_table_count(postgres_server) == len(instance.get_runs())
        assert set(instance.get_materialized_partitions(dg.AssetKey("completions"))) == set(SHARDS)
        # The pool: one slot, held by one completions step at a time.
        assert instance.event_log_storage.get_concurrency_info(POOL).slot_count == 1
        runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS]))
        shard_runs = [run for run in runs if run.tags.get("dagster/partition") in SHARDS]
        assert sorted(run.tags["dagster/partition"] for run in shard_runs) == SHARDS
        windows = sorted(step_windows(instance, run.run_id, "completions") for run in shard_runs)
        for (_, first_end), (second_start, _) in zip(windows, windows[1:]):
            assert second_start >= first_end, f"completions steps overlapped under a pool of 1: {windows}"

    for shard in range(len(SHARDS)):
        coverage = shard_coverage(store, shard)
        assert coverage.exact and coverage.expected > 0, (shard, coverage)
