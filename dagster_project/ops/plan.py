"""The estimates a run is compared against: measured by the pilot (`pilot.stage.plan_from_pilot`: "pilot of N
answers at TIME"), or from configuration (`dflash plan`).

The plan lives in the store (`plan.json`) so every `status` reader compares against the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dagster_project.sglang.capacity import SPEC_DEFAULT_MAX_RUNNING_REQUESTS
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.storage import Store

PLAN_KEY = "plan.json"


@dataclass(frozen=True)
class Plan:
    source: str
    req_per_s: float = field(metadata={"help": "planned requests (generated answers) per second, whole fleet"})
    avg_output_tokens: float = field(metadata={"help": "planned mean output tokens per answer"})
    output_tok_per_s: float = field(metadata={"help": "planned output tokens per second, whole fleet"})
    gpus: int = field(default=1, metadata={"help": "GPUs the fleet holds"})
    cost_per_hour: float | None = field(default=None, metadata={"help": "US$ per hour of the whole fleet"})
    prompts: int | None = field(default=None, metadata={"help": "prompts in the whole job (for its cost and ETA)"})
    # Measured by a pilot: what the job's answers should look like.
    accept_length: float | None = field(default=None, metadata={"help": "planned spec-decoding accept length"})
    error_share: float | None = field(default=None, metadata={"help": "planned share of events ending in an error"})
    output_tokens_percentiles: dict[str, float] = field(default_factory=dict)  # "p10" ... "max"
    sample_answers: int | None = field(default=None, metadata={"help": "answers the pilot measured the plan on"})

    def floor_reason(self, fleet_slots: int) -> str | None:
        """Why the plan's rates are only a floor for a fleet of `fleet_slots` request slots, or None: a pilot of
        fewer answers than the fleet runs at once never filled it, so its rates are not a full fleet's pace."""
        if self.sample_answers is None or fleet_slots <= self.sample_answers:
            return None
        return (
            f"the pilot's {self.sample_answers:,} answers never filled the fleet's {fleet_slots:,} request slots: "
            "its rates are a floor, not a full fleet's pace"
        )

    def eta_hours(self, remaining_requests: int) -> float:
        return remaining_requests / self.req_per_s / 3600 if self.req_per_s else float("inf")

    def cost_summary(self) -> str:
        """What the plan costs: the whole job, per 1M output tokens, GPU-hours per 1K rows."""
        if self.cost_per_hour is None:
            return "cost: no --cost-per-hour in the plan"
        per_million = self.cost_per_hour / (self.output_tok_per_s * 3600) * 1e6 if self.output_tok_per_s else None
        gpu_hours_per_1k = self.gpus / (self.req_per_s * 3600) * 1000 if self.req_per_s else None
        whole = (
            f"{self.prompts:,} prompts in {self.eta_hours(self.prompts):,.1f} h: "
            f"${self.cost_per_hour * self.eta_hours(self.prompts):,.0f}; "
            if self.prompts
            else ""
        )
        return (
            f"cost at ${self.cost_per_hour:,.2f}/hour ({self.gpus} GPUs): {whole}"
            + (f"${per_million:,.2f} per 1M output tokens; " if per_million is not None else "")
            + (f"{gpu_hours_per_1k:,.3f} GPU-hours per 1K rows" if gpu_hours_per_1k is not None else "")
        )


# The real run's planned figures: 7 GPUs at ~$27/hour, 913,786 prompts.
BRIEF_PLAN = Plan(
    source="reference run: planned figures of the 913,786-prompt Qwen3.6-27B run",
    req_per_s=5.6,
    avg_output_tokens=2306,
    output_tok_per_s=15900,
    gpus=7,
    cost_per_hour=27.0,
    prompts=913786,
)


def write_plan(store: Store, plan: Plan) -> None:
    store.put_bytes(PLAN_KEY, to_json(plan))


def read_plan(store: Store) -> Plan | None:
    return read_record(store, PLAN_KEY, Plan)


# ---- how many shards ---------------------------------------------------------------------------------------

# A run's last answers finish with few requests of its own in flight: its tail lasts about this many mean
# request latencies (the long answers of a lognormal). The other runs fill the fleet meanwhile, but the run
# keeps its pool slot, so a run should be long next to its tail.
TAIL_LATENCIES = 3.0
MAX_TAIL_SHARE = 0.1


@dataclass(frozen=True)
class ShardSizing:
    """What decides the shard count: the job, the fleet, and the fixed cost of one shard run."""

    events: int = field(default=BRIEF_PLAN.prompts, metadata={"help": "Generation events in the whole job."})
    fleet_cap: int = field(
        default=BRIEF_PLAN.gpus * SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
        metadata={"help": "Running-request cap summed over the fleet's servers."},
    )
    seconds_per_event: float = field(
        default=BRIEF_PLAN.gpus * SPEC_DEFAULT_MAX_RUNNING_REQUESTS / BRIEF_PLAN.req_per_s,
        metadata={"help": "Mean latency of one request at cap (fleet cap / fleet requests per second)."},
    )
    # The whole run process on 2 cores (BENCHMARKS.md): what the fleet loses per run when runs are not started
    # ahead of free pool slots; with them started ahead, only the ~0.2 s inside the slot.
    run_overhead_s: float = field(
        default=8.0, metadata={"help": "Fixed seconds of one shard run (benchmarks/bench_run_overhead.py)."}
    )
    runs_at_once: int = field(default=4, metadata={"help": "The sglang_fleet pool's limit."})
    max_overhead_share: float = field(
        default=0.01, metadata={"help": "Share of GPU time the runs' fixed cost may take."}
    )


@dataclass(frozen=True)
class ShardAdvice:
    shards: int
    events_per_shard: int
    run_minutes: float  # generation time of one run while `runs_at_once` share the fleet
    overhead_share: float  # fixed seconds of a run / its whole time
    tail_share: float  # a run's tail / its generation time
    bound: str  # what decided the count

    def __str__(self) -> str:
        return (
            f"{self.shards} shards of ~{self.events_per_shard:,} events: ~{self.run_minutes:.1f} min of generation per "
            f"run, fixed cost {self.overhead_share:.2%} of a run, tail {self.tail_share:.1%} of a run ({self.bound})"
        )


def advise_shards(sizing: ShardSizing) -> ShardAdvice:
    """The most shards (short runs: small resumes, tails that rarely overlap at the job's end) for which the
    runs' fixed cost stays within `max_overhead_share` and a run's tail within `MAX_TAIL_SHARE` of it; never
    fewer than twice the runs at once, so a run in its tail always has a next run to hand its slots to."""
    s = sizing
    # R runs at once share the fleet: one run's events advance at fleet_cap / R requests per latency.
    seconds_per_run_event = s.seconds_per_event * s.runs_at_once / s.fleet_cap
    for_overhead = s.run_overhead_s * (1 / s.max_overhead_share - 1) / seconds_per_run_event
    for_tail = TAIL_LATENCIES * s.seconds_per_event / MAX_TAIL_SHARE / seconds_per_run_event
    bound = "fixed cost per run" if for_overhead >= for_tail else "tail per run"
    shards = max(1, math.floor(s.events / max(for_overhead, for_tail, 1)))
    if shards < 2 * s.runs_at_once:
        shards, bound = 2 * s.runs_at_once, "twice the runs at once"
    events_per_shard = math.ceil(s.events / shards)
    run_s = events_per_shard * seconds_per_run_event
    return ShardAdvice(
        shards=shards,
        events_per_shard=events_per_shard,
        run_minutes=run_s / 60,
        overhead_share=s.run_overhead_s / (s.run_overhead_s + run_s),
        tail_share=TAIL_LATENCIES * s.seconds_per_event / run_s,
        bound=bound,
    )
