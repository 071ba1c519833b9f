"""What the completions and training-set gate checks share: thresholds as run config, results as check results."""

import dagster as dg
from pydantic import Field

from dagster_project.training import gates


class GateConfig(dg.Config):
    """Gate thresholds; the defaults and their reasons are in dagster_project/gates.py."""

    loss_floor: int = Field(default=gates.LOSS_FLOOR, description="Supervised tokens a row should have at least.")
    max_share_below_floor: float = gates.MAX_SHARE_BELOW_FLOOR
    max_top_loss_sum_share: float = gates.MAX_TOP_LOSS_SUM_SHARE
    min_repeats: int = Field(
        default=gates.MIN_REPEATS, description="A sum or answer must recur this often before its share can block."
    )
    min_supervised_pairs: int = gates.MIN_SUPERVISED_PAIRS
    max_bad_thinking_share: float = gates.MAX_BAD_THINKING_SHARE
    max_degenerate_share: float = gates.MAX_DEGENERATE_SHARE
    short_answer_chars: int = gates.SHORT_ANSWER_CHARS
    max_short_answer_share: float = gates.MAX_SHORT_ANSWER_SHARE
    max_empty_answer_share: float = gates.MAX_EMPTY_ANSWER_SHARE

    def thresholds(self) -> gates.GateThresholds:
        fields = gates.GateThresholds.__dataclass_fields__
        return gates.GateThresholds(**{k: v for k, v in self.model_dump().items() if k in fields})


def check_result(asset_key: dg.AssetKey, result: gates.GateResult) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        asset_key=asset_key,
        check_name=result.name,
        passed=result.passed,
        description=result.message,
        metadata={"message": result.message, **result.metadata},
    )
