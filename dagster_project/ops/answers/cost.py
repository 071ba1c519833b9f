"""7. What the run costs. GPUs are paid while they are up: the fleet's life (`generation.fleet_life`, recorded by
`dflash fleet up`/`down` with the price configured where the fleet started) gives the GPU-hours and the dollars,
so what was spent stays known with the fleet down. A store with no life recorded (servers started by hand, or
named by DFLASH_SGLANG_ENDPOINTS) is priced over the hours some shard was generating, at the configured price
(`FleetCost`, on the fleet resource), and says so."""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.generation.fleet_life import FleetLife
from dagster_project.ops.answers.progress import ProgressAnswer
from dagster_project.ops.answers.text import dollars, number

FLEET_LIFE = "fleet_life"  # GPU-hours from `fleet up` to `fleet down`
GENERATION_TIME = "generation_time"  # no life recorded: the hours some shard generated


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
    cost_per_hour: float  # of the nodes up now; with the fleet down, of the last nodes up
    gpus: int
    spent: float
    to_finish: float | None  # at the measured rate
    to_finish_plan: float | None  # at the plan's rate
    per_million_output_tokens: float | None  # spent per million output tokens generated so far
    gpu_hours_per_1k_rows: float | None  # per thousand answers kept (generated without error)
    basis: str = GENERATION_TIME  # FLEET_LIFE or GENERATION_TIME: what the hours are
    gpu_hours: float = 0.0
    fleet_up: bool = False  # some node's servers are up now
    per_million_trained_tokens: float | None = None  # spent per million supervised tokens of the training set
    idle_hours: float | None = None  # the fleet up while no shard was generating
    idle_cost: float | None = None
    idle_gpu_hours: float = 0.0


@dataclass(frozen=True)
class CostInputs:
    """What the cost is computed from besides the progress answer (read once with the other readings)."""

    lives: list[FleetLife]
    busy: list[tuple[float, float]]  # when some shard run was generating (its heartbeats' start and last beat)
    output_tokens: int  # generated so far
    trained_tokens: int  # supervised tokens of the published training shards
    now: float


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def _overlap(merged: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in merged)


def _per_million(dollars_spent: float, tokens: int) -> float | None:
    return dollars_spent / tokens * 1e6 if tokens else None


def answer_cost(
    cost: FleetCost, progress: ProgressAnswer, servers: int, inputs: CostInputs | None = None
) -> CostAnswer | None:
    """From the fleet's life when one is recorded; else over the generation hours at the configured price. A life
    recorded without a price takes the configured one; None when neither prices it."""
    if inputs is not None and inputs.lives:
        return _from_lives(cost, progress, inputs)
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
        gpu_hours=gpus * hours,
        fleet_up=bool(servers),
        per_million_trained_tokens=_per_million(per_hour * hours, inputs.trained_tokens) if inputs else None,
    )


def _from_lives(cost: FleetCost, progress: ProgressAnswer, inputs: CostInputs) -> CostAnswer | None:
    now, lives = inputs.now, inputs.lives
    prices = [
        life.cost_per_gpu_hour if life.cost_per_gpu_hour is not None else cost.cost_per_gpu_hour for life in lives
    ]
    if any(price is None for price in prices):
        return None
    busy = _union(inputs.busy)
    spent = idle_cost = gpu_hours = idle_gpu_hours = 0.0
    for life, price in zip(lives, prices, strict=True):
        start, end = life.up_interval(now)
        idle = life.gpus * (end - start - _overlap(busy, start, end)) / 3600
        gpu_hours += life.gpu_hours(now)
        idle_gpu_hours += idle
        spent += price * life.gpu_hours(now)
        idle_cost += price * idle
    up = _union([life.up_interval(now) for life in lives])
    idle_hours = sum(end - start - _overlap(busy, start, end) for start, end in up) / 3600
    # The rate to finish at: the nodes up now, or with the fleet down those up at its last moment.
    open_lives = [(life, price) for life, price in zip(lives, prices, strict=True) if life.stopped_at is None]
    last_end = max(life.up_interval(now)[1] for life in lives)
    rate_lives = open_lives or [
        (life, price) for life, price in zip(lives, prices, strict=True) if life.up_interval(now)[1] == last_end
    ]
    per_hour = sum(price * life.gpus for life, price in rate_lives)
    gpus = sum(life.gpus for life, _ in rate_lives)
    return CostAnswer(
        cost_per_hour=per_hour,
        gpus=gpus,
        spent=spent,
        to_finish=per_hour * progress.eta_hours if progress.eta_hours is not None else None,
        to_finish_plan=per_hour * progress.plan_eta_hours if progress.plan_eta_hours is not None else None,
        per_million_output_tokens=_per_million(spent, inputs.output_tokens),
        gpu_hours_per_1k_rows=gpu_hours / progress.events_ok * 1000 if progress.events_ok else None,
        basis=FLEET_LIFE,
        gpu_hours=gpu_hours,
        fleet_up=bool(open_lives),
        per_million_trained_tokens=_per_million(spent, inputs.trained_tokens),
        idle_hours=idle_hours,
        idle_cost=idle_cost,
        idle_gpu_hours=idle_gpu_hours,
    )


def spent_line(cost: CostAnswer) -> str:
    """What was spent and on what hours, as the text and the page both say it."""
    hours = "the fleet's up-time" if cost.basis == FLEET_LIFE else "generation time only (no `fleet up` recorded)"
    return f"spent ${cost.spent:,.2f} ({number(cost.gpu_hours, 2)} GPU-hours, {hours})"


def idle_line(cost: CostAnswer) -> str | None:
    if cost.idle_hours is None:
        return None
    return f"fleet idle {cost.idle_hours * 60:,.1f} min: {dollars(cost.idle_cost)}"


def render_cost(cost: CostAnswer | None) -> list[str]:
    if cost is None:
        return [
            "7. Cost: no price (none recorded at `fleet up`, and no cost_per_gpu_hour on the fleet resource "
            "or DFLASH_COST_PER_GPU_HOUR)"
        ]
    state = "" if cost.fleet_up or cost.basis != FLEET_LIFE else ", the fleet is down"
    idle = idle_line(cost)
    return [
        f"7. Cost at ${cost.cost_per_hour:,.2f}/hour ({cost.gpus} GPUs{state})",
        f"   {spent_line(cost)}{f'; {idle}' if idle else ''}",
        f"   to finish {dollars(cost.to_finish)} (plan {dollars(cost.to_finish_plan)}); "
        f"{dollars(cost.per_million_output_tokens)} per 1M output tokens, "
        f"{dollars(cost.per_million_trained_tokens)} per 1M trained (supervised) tokens; "
        f"{number(cost.gpu_hours_per_1k_rows, 3)} GPU-hours per 1K kept rows",
    ]
