"""What the completions and training-set gate checks share: thresholds as run config, results as check results."""

import dagster as dg

from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.training import gates


class GateConfig(config_fields(gates.GateThresholds, dg.Config)):
    """Gate thresholds; their defaults and reasons are in dagster_project/training/gates.py. A share limit is the
    largest true share a healthy shard may have: a gate blocks only on evidence above it (training/evidence.py)."""


def check_result(asset_key: dg.AssetKey, result: gates.GateResult) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name=result.name,
        passed=result.passed,
        description=result.message,
        metadata={"message": result.message, **result.metadata},
    )


def reported(
    context: dg.AssetCheckExecutionContext, check: str, result: dg.AssetCheckResult, shard: int | None = None
) -> dg.AssetCheckResult:
    """The result, its failure also logged as an error (naming the shard it judged): the terminal of
    `dagster asset materialize` shows the reason, not only that a blocking check failed."""
    if not result.passed:
        where = f"{layout.partition_key(shard)} " if shard is not None else ""
        context.log.error(f"{where}{check} failed: {result.description}")
    return result
