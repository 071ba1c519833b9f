"""A real PostgreSQL server for tests: `initdb` into a temp directory, `postgres` on a free loopback port.

The binaries come from PATH or from Debian's `postgresql` package (`/usr/lib/postgresql/<version>/bin`,
which `.ci/run` installs when neither has them). PostgreSQL refuses to run as root, so under root the server
runs as an unprivileged account (`postgres` when the package created it, else `nobody`) through `setpriv`;
its data directory then lives outside root's private pytest directory, owned by that account.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from dagster_project.sglang.launch import free_ports

_SERVER_BINARIES = ("initdb", "postgres")
_UNPRIVILEGED_USERS = ("postgres", "nobody")
# What the instance connects as; trust authentication on loopback only, so no password exists to leak.
USER = "dagster"
DATABASE = "dagster"


def postgres_bin_dir() -> Path | None:
    """The directory holding initdb and postgres: from PATH, else the newest Debian package's."""
    on_path = shutil.which("initdb")
    candidates = [Path(on_path).resolve().parent] if on_path else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    for directory in candidates:
        if all((directory / name).is_file() for name in _SERVER_BINARIES):
            return directory
    return None


def _server_account() -> pwd.struct_passwd | None:
    """None when we are not root (the server runs as us); else an account that may run it."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError(f"running as root and none of the accounts {_UNPRIVILEGED_USERS} exists to run PostgreSQL")


def _as_account(command: list[str], account: pwd.struct_passwd | None) -> list[str]:
    if account is None:
        return command
    return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", *command]


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    data_dir: Path
    database: str = DATABASE

    def fresh_database(self, name: str) -> PostgresServer:
        """The same server with a new, empty database `name` (each test's instance starts from nothing: no
        runs, no pool slots held by another test's killed runs)."""
        import psycopg2

        connection = psycopg2.connect(self.psql_url("postgres"))
        try:
            connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
            connection.cursor().execute(f'CREATE DATABASE "{name}" OWNER {USER}')
        finally:
            connection.close()
        return replace(self, database=name)

    @property
    def env(self) -> dict[str, str]:
        """The variables deploy/dagster-postgres.yaml reads (the password is empty: trust on loopback)."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": USER,
            "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_PG_DB": self.database,
        }

    def psql_url(self, database: str | None = None) -> str:
        return f"postgresql://{USER}@{self.host}:{self.port}/{database or self.database}"


def _accepts_connections(server: PostgresServer, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            psycopg2.connect(server.psql_url("postgres"), connect_timeout=1).close()
            return
        except psycopg2.OperationalError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"postgres did not accept connections within {timeout_s}s ({exc}):\n"
                    f"{log.read_text(errors='replace')[-3000:]}"
                ) from None
            time.sleep(0.05)  # polling a condition with a deadline, not synchronising by sleep


@contextlib.contextmanager
def running_postgres(
    bin_dir: Path, host: str = "127.0.0.1", startup_timeout_s: float = 60.0
) -> Iterator[PostgresServer]:
    """A fresh cluster with database `dagster` owned by role `dagster`, listening on `host` only (no socket)."""
    account = _server_account()
    root = Path(tempfile.mkdtemp(prefix="dflash-pg-"))
    data_dir = root / "data"
    log = root / "postgres.log"
    if account is not None:
        os.chown(root, account.pw_uid, account.pw_gid)
    subprocess.run(
        _as_account(
            [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync"],
            account,
        ),
        check=True,
        capture_output=True,
        text=True,
    )
    port = free_ports(1, host)[0]
    server = PostgresServer(host, port, data_dir)
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            _as_account(
                [
                    str(bin_dir / "postgres"),
                    "-D",
                    str(data_dir),
                    "-h",
                    host,
                    "-p",
                    str(port),
                    "-k",
                    "",  # no Unix socket: loopback TCP only
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=200",  # a daemon, a webserver and a few run workers each hold a pool
                ],
                account,
            ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _accepts_connections(server, process, log, startup_timeout_s)
        import psycopg2

        with contextlib.closing(psycopg2.connect(server.psql_url("postgres"))) as connection:
            connection.autocommit = True
            connection.cursor().execute(f"CREATE DATABASE {DATABASE}")
        yield server
    finally:
        process.terminate()  # SIGTERM: PostgreSQL's smart shutdown
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
