"""Where things are: the checkout, and the shared fixtures folder that sits beside it (`../shared`)."""

from __future__ import annotations

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py -> the checkout
SHARED = PROJECT_ROOT.parent / "shared"
SHARED_DATA = SHARED / "data"


def require_shared(*relative: str) -> Path:
    """A file from ../shared (beside the checkout); the test fails, naming it, when it is absent (`make test-fast`
    alone lets it skip: tests.support.required_tools), so a test that reads it never passes by being skipped."""
    from tests.support.required_tools import SHARED_FIXTURES, require

    path = SHARED.joinpath(*relative)
    if not path.exists():
        require(SHARED_FIXTURES)  # the folder is there: the file itself is missing, which no install fixes
        pytest.fail(f"{path} is absent from the shared fixtures that sit beside the repository")
    return path
