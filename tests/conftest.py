from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.s3_server import running_s3_server

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

# Hermetic tests: a production store, fleet or Dagster instance configured in the shell must never be touched.
for _name in [n for n in os.environ if n.startswith(("DFLASH_", "SGLANG_")) or n == "DAGSTER_HOME"]:
    if _name != "DFLASH_CACHE_DIR":  # the tokenizer cache is safe to share, and slow to rebuild
        del os.environ[_name]


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


@pytest.fixture(scope="session")
def s3_server():
    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the session's S3 server; the environment points boto3 and S3Resource at it."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    bucket = f"dflash-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    return bucket
