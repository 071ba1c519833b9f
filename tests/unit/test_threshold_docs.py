"""Every gate threshold is documented with its config key and default (docs/OPERATIONS.md §7)."""

from __future__ import annotations

import re

import pytest

from dagster_project.assets.conversations import ConversationsConfig
from dagster_project.checks.completions import CompletionsGateConfig
from dagster_project.checks.training_set import TrainingGateConfig
from tests.support.paths import PROJECT_ROOT

SECTION = (PROJECT_ROOT / "docs" / "OPERATIONS.md").read_text().split("## 7. Gates and their thresholds")[1]
THRESHOLDS = [
    (config, name, field.default)
    for config in (ConversationsConfig, CompletionsGateConfig, TrainingGateConfig)
    for name, field in config.model_fields.items()
    if isinstance(field.default, int | float) and not isinstance(field.default, bool)
]


@pytest.mark.parametrize(("config", "name", "default"), THRESHOLDS, ids=[f"{c.__name__}.{n}" for c, n, _ in THRESHOLDS])
def test_threshold_is_documented_with_its_key_and_default(config: type, name: str, default: float) -> None:
    row = next((line for line in SECTION.splitlines() if re.search(rf"`{name}`", line)), None)
    assert row is not None, f"{config.__name__}.{name} is not in the thresholds table"
    defaults = row.rsplit("|", 2)[-2]
    assert f"{default:g}" in [value.strip() for value in defaults.split(",")], (name, default, row)
