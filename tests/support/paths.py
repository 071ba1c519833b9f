"""Where things are: the checkout, and the shared fixtures folder that sits beside it (`../shared`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py -> the checkout
SHARED = PROJECT_ROOT.parent / "shared"
SHARED_DATA = SHARED / "data"


def require_shared(*relative: str) -> Path:
    """A file from ../shared (beside the checkout); skip the test, saying why, when it is absent.

    CI has the folder and sets REQUIRE_SHARED_FIXTURES=1: there a missing file fails the test instead, so the
    tests that read it can never pass by being skipped."""
    path = SHARED.joinpath(*relative)
    if not path.exists():
        reason = f"{path} is absent: this test reads the shared fixtures that sit beside the repository"
        if os.environ.get("REQUIRE_SHARED_FIXTURES") == "1":
            pytest.fail(reason + " (REQUIRE_SHARED_FIXTURES=1)")
        pytest.skip(reason)
    return path
