"""The tools outside the Python environment that the tests need, and what a test does when one is missing.

`make test` (and a plain `pytest`) runs every test: a missing tool fails the tests that need it, naming how to
install it, and `python -m tests.support.required_tools` (the first step of `make test`) fails before any test
runs, listing every missing tool. Only `make test-fast` (`TESTS_MAY_SKIP=1`) lets such a test skip with that
message instead. A skip never counts as passing: `tests/conftest.py` fails a run that skipped any test other
than one marked `gpu_only`, unless `TESTS_MAY_SKIP=1`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import SHARED
from tests.support.postgres_server import postgres_bin_dir

# Set by `make test-fast` only: there a test whose tool is missing skips, saying which and how to install it.
MAY_SKIP = "TESTS_MAY_SKIP"

CHROMIUM = Path(os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))


@dataclass(frozen=True)
class Tool:
    name: str
    present: Callable[[], bool]
    install: str

    def missing(self) -> str:
        return f"{self.name} is missing: {self.install}"


BROWSER = Tool(
    f"Chromium and its driver ({CHROMIUM}, {CHROMEDRIVER})",
    lambda: CHROMIUM.exists() and CHROMEDRIVER.exists(),
    "apt-get install -y chromium chromium-driver (or set CHROMIUM_BIN and CHROMEDRIVER_BIN)",
)
POSTGRES = Tool(
    "PostgreSQL's server binaries (initdb, postgres)",
    lambda: postgres_bin_dir() is not None,
    "apt-get install -y postgresql (found on PATH or under /usr/lib/postgresql/*/bin)",
)
SHARED_FIXTURES = Tool(
    f"the shared fixtures ({SHARED})",
    SHARED.is_dir,
    "check out the shared fixtures folder beside the repository, as ../shared",
)
TOOLS = (BROWSER, POSTGRES, SHARED_FIXTURES)


def may_skip() -> bool:
    return os.environ.get(MAY_SKIP) == "1"


def require(tool: Tool, detail: str = "") -> None:
    """Fail the test when `tool` is missing, naming how to install it; skip it instead under `make test-fast`."""
    if tool.present():
        return
    reason = tool.missing() + (f" ({detail})" if detail else "")
    if may_skip():
        pytest.skip(reason)
    pytest.fail(f"{reason}. `make test` needs it; `make test-fast` skips the tests that do ({MAY_SKIP}=1)")


def missing_tools() -> list[str]:
    return [tool.missing() for tool in TOOLS if not tool.present()]


def main() -> int:
    missing = missing_tools()
    for line in missing:
        print(f"make test: {line}", file=sys.stderr)
    if missing:
        print("make test runs every test and skips none; `make test-fast` runs the unit tests alone.", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
