"""The pilot a test's shards need before they generate, as in production (`pilot_record.clearance`): the `pilot` asset
materialized in this process with the job's resources. It generates a stratified sample of the published
conversations (9 answers of the demo data's 5 conversations) and judges them by every gate: 1 s on a fast simulator
fleet, 3 s when it is the process's first (2 quiet cores; 4 and 8 s on busy ones)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from dagster_project.assets.pilot import pilot
from dagster_project.pilot_record import PilotRecord, read_pilot
from dagster_project.resources import SGLangFleet
from dagster_project.resources.environment import resources_from_env
from tests.support.dagster_helpers import FAST_ANSWERS
from tests.support.sglang_fixtures import SimFleet


def pass_pilot(
    resources: Mapping[str, Any],
    instance: dg.DagsterInstance,
    *,
    own_fleet: Path | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> PilotRecord:
    """The pilot of `resources`' generation settings, passed, on their fleet; with `own_fleet` (a directory), on a
    healthy simulator fleet of its own, started there and stopped after (the pilot passed before the test's fleet
    went bad, or where the test has no fleet yet)."""
    if own_fleet is not None:
        with SimFleet.start(2, own_fleet, **FAST_ANSWERS) as fleet:
            healthy = {**resources, "fleet": SGLangFleet(endpoints=fleet.urls)}
            return pass_pilot(healthy, instance, run_config=run_config)
    result = dg.materialize(
        [pilot], resources=resources, instance=instance, run_config=run_config, raise_on_error=False
    )
    failures = [event.step_failure_data.error.to_string() for event in result.get_step_failure_events()]
    assert result.success, failures
    record = read_pilot(resources["store"].open(), resources["generation"].to_dataclass().fingerprint())
    assert record is not None and record.passed, record
    return record


def pass_pilot_of_env(home: Path, env: Mapping[str, str], *, own_fleet: Path | None = None) -> PilotRecord:
    """OPERATIONS §4's pilot after the conversations, in this process, with the resources a pipeline process of `env`
    gets (its store, fleet and generation settings: what `dagster asset materialize --select pilot` would use),
    recorded in the instance at `home`; `own_fleet` as for `pass_pilot`."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            if name.startswith(("DFLASH_", "SGLANG_")):
                patch.setenv(name, value)
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            return pass_pilot(resources_from_env(resolve_secrets=True), instance, own_fleet=own_fleet)
        finally:
            instance.dispose()
