"""7. What the run costs. The fleet's price is configuration (`FleetCost`, on the fleet resource)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.ops.answers.progress import ProgressAnswer
from dagster_project.ops.answers.text import dollars, number


@dataclass(frozen=True)
class FleetCost:
    """The fleet's price: what turns hours into dollars."""

    cost_per_gpu_hour: float | None = field(
        default=None, metadata={"help": "US$ per GPU-hour of the fleet (e.g. 3.50 for an H200); unset: no cost figures"}
    )
    gpus: int | None = field(
        default=None, metadata={"help": "GPUs the fleet holds; unset: one per server known (tensor parallel 1)"}
    )

    def per_hour(self, servers: int) -> tuple[float, int] | None:
        """The fleet's $/hour and its GPU count; None when no price is configured or no GPU is known."""
        gpus = self.gpus or servers
        if self.cost_per_gpu_hour is None or not gpus:
            return None
        return self.cost_per_gpu_hour * gpus, gpus


NO_PRICE = FleetCost()


@dataclass(frozen=True)
class CostAnswer:
    cost_per_hour: float
    gpus: int
    spent: float  # over the hours some shard was generating
    to_finish: float | None  # at the measured rate
    to_finish_plan: float | None  # at the plan's rate
    per_million_output_tokens: float | None
    gpu_hours_per_1k_rows: float | None  # per thousand answers kept (generated without error)


def answer_cost(cost: FleetCost, progress: ProgressAnswer, servers: int) -> CostAnswer | None:
    priced = cost.per_hour(servers)
    if priced is None:
        return None
    per_hour, gpus = priced
    hours = progress.lifetime_span_hours
    tok_per_s = progress.window_output_tok_per_s or progress.lifetime_output_tok_per_s
    return CostAnswer(
        cost_per_hour=per_hour,
        gpus=gpus,
        spent=per_hour * hours,
        to_finish=per_hour * progress.eta_hours if progress.eta_hours is not None else None,
        to_finish_plan=per_hour * progress.plan_eta_hours if progress.plan_eta_hours is not None else None,
        per_million_output_tokens=per_hour / (tok_per_s * 3600) * 1e6 if tok_per_s else None,
        gpu_hours_per_1k_rows=gpus * hours / progress.events_ok * 1000 if progress.events_ok and hours else None,
    )


def render_cost(cost: CostAnswer | None) -> list[str]:
    if cost is None:
        return ["7. Cost: no price configured (the fleet resource's cost_per_gpu_hour, or DFLASH_COST_PER_GPU_HOUR)"]
    return [
        f"7. Cost at ${cost.cost_per_hour:,.2f}/hour ({cost.gpus} GPUs)",
        f"   spent ${cost.spent:,.2f}; to finish {dollars(cost.to_finish)} (plan {dollars(cost.to_finish_plan)}); "
        f"{dollars(cost.per_million_output_tokens)} per 1M output tokens; "
        f"{number(cost.gpu_hours_per_1k_rows, 3)} GPU-hours per 1K kept rows",
    ]
