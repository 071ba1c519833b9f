"""Dagster's PostgreSQL storages, keeping their connections open.

dagster-postgres opens a new connection for every query (SQLAlchemy's `NullPool`) in every process but the
webserver, so that many short-lived instances never pile up connections. Each connection is a new PostgreSQL
backend process to start and warm up. In a backfill that churn is most of what the server does: in a 128-partition
rehearsal PostgreSQL spent ~110 CPU-s for ~6 s of statements, and each run worker spent a tenth of its time in
`psycopg2.connect`. It also re-asks the catalog whether a table exists before writing each materialization's tags.

These storages keep what dagster-webserver keeps for itself (`optimize_for_webserver`): one connection per storage
and process, more while threads need them (closed again when returned), each recycled after an hour and checked
before use, so a restarted server costs a reconnect, not a failed query. A table known to exist is not asked for
again. Configured in deploy/dagster-postgres.yaml as `run_storage`, `event_log_storage` and `schedule_storage`;
the configuration is dagster-postgres's own (`postgres_db` or `postgres_url`).

A process holds at most one idle connection per storage: a daemon, a webserver and eight run workers hold ~30.
"""

from __future__ import annotations

from typing import Any

from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from dagster_postgres.utils import create_pg_engine, get_token_provider_from_config, pg_url_from_config

ENGINE_OPTIONS: dict[str, Any] = {
    "isolation_level": "AUTOCOMMIT",
    "pool_size": 1,
    "max_overflow": 20,
    "pool_recycle": 3600,
    "pool_pre_ping": True,
}


class _HoldingConnections:
    """Built like its dagster-postgres storage, then given an engine that keeps a connection (same URL and
    credentials) in place of the NullPool one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._engine.dispose()
        self._engine = create_pg_engine(self.postgres_url, self._token_provider, **ENGINE_OPTIONS)

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # Dagster's ConfigurableClass hook
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )


class PooledPostgresRunStorage(_HoldingConnections, PostgresRunStorage):
    pass


class PooledPostgresScheduleStorage(_HoldingConnections, PostgresScheduleStorage):
    pass


class PooledPostgresEventLogStorage(_HoldingConnections, PostgresEventLogStorage):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._tables_seen: set[str] = set()
        super().__init__(*args, **kwargs)

    def has_table(self, table_name: str) -> bool:
        """From memory once the table was seen: migrations create tables, nothing drops one while the instance
        runs (a missing table is asked for again)."""
        if table_name not in self._tables_seen and super().has_table(table_name):
            self._tables_seen.add(table_name)
        return table_name in self._tables_seen
