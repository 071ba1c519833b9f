"""The real-SGLang tier: SGLang 0.5.23 itself on the CPU with a tiny random-weight model, and the simulator
answering the same tests (`make test-sglang`; `make test` does not collect this folder).

`server` is parametrized over the two: `real` (one CPU server per module, launched through the project's own
launch path, `tests/support/sglang_real.py`) and `sim` (one simulator launched as its twin: the same context
length, KV pool, metrics and no speculative decoding). `pytest tests/sglang_real -k sim` runs the simulator half
anywhere; without the SGLang environment the real half skips, naming it, unless `REQUIRE_SGLANG=1` (`make
test-sglang`), where it fails: in CI a skipped real test never counts as passing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dagster_project.sglang.launch import free_ports, stop_fleet
from tests.support import sglang_real
from tests.support.sglang_fixtures import SimFleet

TIER_DIR = Path(__file__).resolve().parent

# The simulator launched as the real CPU server's twin (sglang_real.CPU_OPTIONS): what the real one serves.
SIM_TWIN = {
    "speculative": False,
    "context_length": sglang_real.CONTEXT_LENGTH,
    "token_capacity": sglang_real.MAX_TOTAL_TOKENS,
    "enable_metrics": True,
    "output_len": "uniform:8:48",
    "decode_step_s": 0.01,
    "max_running_requests": 8,
    # The tiny model's identity, as the real server reports it in /server_info and /model_info.
    "model_path": sglang_real.TINY_MODEL_NAME,
    "model_type": sglang_real.TINY_CONFIG["model_type"],
    "architecture": sglang_real.TINY_CONFIG["architectures"][0],
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TIER_DIR in item.path.parents:
            item.add_marker(pytest.mark.sglang_real)


@dataclass(frozen=True)
class Server:
    """One server under test: its URL and which kind it is."""

    kind: str  # "real" or "sim"
    url: str

    @property
    def real(self) -> bool:
        return self.kind == "real"


def require_sglang() -> Path:
    """The SGLang environment's python; skips (or fails under REQUIRE_SGLANG=1) without it."""
    python = sglang_real.sglang_python()
    if python is None:
        reason = "no SGLang 0.5.23 environment (make sglang-cpu; SGLANG_PYTHON points at its python)"
        if os.environ.get("REQUIRE_SGLANG") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return python


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    return require_sglang()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, sglang_python) -> Path:
    return sglang_real.build_tiny_model(tmp_path_factory.mktemp("model") / sglang_real.TINY_MODEL_NAME, sglang_python)


@pytest.fixture(scope="module")
def real_server(request, tmp_path_factory) -> Iterator[Server]:
    """One real CPU server for a module (86-190 s to start); stopped, even if a test killed it, at its end.
    `SGLANG_TEST_SERVER_URL` names one started elsewhere with the tier's flags (`sglang_real.CPU_OPTIONS`)
    instead: quicker while writing tests; the test that kills the server then kills that one."""
    if os.environ.get("SGLANG_TEST_SERVER_URL"):
        yield Server("real", os.environ["SGLANG_TEST_SERVER_URL"].rstrip("/"))
        return
    sglang_python = request.getfixturevalue("sglang_python")
    tiny_model = request.getfixturevalue("tiny_model")
    run_dir = tmp_path_factory.mktemp("real-fleet")
    fleet = sglang_real.launch_cpu_server(run_dir, tiny_model, sglang_python, free_ports(1)[0])
    try:
        yield Server("real", fleet.urls[0])
    finally:
        stop_fleet(run_dir, timeout_s=30)


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory) -> Iterator[Server]:
    with SimFleet.start(1, tmp_path_factory.mktemp("sim-fleet"), SIM_TWIN) as fleet:
        yield Server("sim", fleet.url(0))


@pytest.fixture(params=["real", "sim"])
def server(request) -> Server:
    return request.getfixturevalue(f"{request.param}_server")
