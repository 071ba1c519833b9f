"""Four runs started at once on a fresh DAGSTER_HOME, after the initialisation `make demo` (and `make dev`) do.

Without it, processes that first use a fresh SQLite instance together race to create its schema: some crash
("table alembic_version already exists", "UNIQUE constraint failed: alembic_version.version_num") and the instance
may be left with two schema versions stamped, failing every later command ("more than one head present").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from dagster_project.ops.demo import initialize_instance

ROOT = Path(__file__).resolve().parents[2]

# A real run on the instance, as cheap as one gets: what matters is each process's first use of the instance.
_ONE_RUN = textwrap.dedent(
    """
    import dagster as dg

    @dg.asset
    def tiny() -> int:
        return 1

    with dg.DagsterInstance.get() as instance:
        assert dg.materialize([tiny], instance=instance).success
    """
)
_COUNT_RUNS = textwrap.dedent(
    """
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        print(sorted(str(run.status) for run in instance.get_runs()))
    """
)


def _python(env: dict[str, str], code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_four_runs_at_once_on_a_fresh_instance_all_succeed(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    initialize_instance(env)
    runs = [_python(env, _ONE_RUN) for _ in range(4)]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert [run.returncode for run in runs] == [0] * 4, "\n".join(output[-2000:] for output in outputs)
    later = _python(env, _COUNT_RUNS)
    output = later.communicate(timeout=300)[0]
    assert later.returncode == 0 and output.strip() == str(["DagsterRunStatus.SUCCESS"] * 4), output[-2000:]
