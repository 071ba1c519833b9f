"""`make demo` end to end, as a new user runs it: every stage through the Dagster CLI, then the six answers."""

import shutil
import subprocess
import sys

from dagster_project.sglang.launch import Fleet
from tests.support.paths import PROJECT_ROOT as REPO


def test_the_demo_runs_every_stage_and_answers_the_six_questions(tmp_path):
    shutil.copyfile(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for heading in ("1. Progress", "2. MTP", "3. Concurrency", "4. Storage", "5. Coverage", "6. Multi-turn"):
        assert heading in result.stdout, result.stdout[-4000:]
    assert "ok: pilot" in result.stdout  # the pilot ran first and passed: the shards were cleared by it
    assert "   plan (pilot of " in result.stdout, result.stdout[-4000:]  # question 1 compares against it
    assert "4/4 shards published" in result.stdout and "failed uploads 0" in result.stdout
    # The summary agrees with the Dagster instance the UI shows (`make dev`): all four shards materialized.
    assert "(Dagster: 4 materialized)" in result.stdout, result.stdout[-4000:]
    assert "missing 0, duplicated 0, unexpected 0" in result.stdout
    assert Fleet.load(tmp_path / ".demo" / "work" / "fleet") is None  # the fleet was stopped
