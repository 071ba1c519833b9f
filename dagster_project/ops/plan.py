"""The estimates a run is compared against: from a pilot sweep or from configuration.

The plan lives in the store (`plan.json`) so every `status` reader compares against the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.storage import Store

PLAN_KEY = "plan.json"


@dataclass(frozen=True)
class Plan:
    source: str
    req_per_s: float
    avg_output_tokens: float
    output_tok_per_s: float
    gpus: int = 1
    cost_per_hour: float | None = None
    prompts: int | None = None

    def eta_hours(self, remaining_requests: int) -> float:
        return remaining_requests / self.req_per_s / 3600 if self.req_per_s else float("inf")


# The real run's planned figures (BRIEF.md): 7 GPUs at ~$27/hour, 913,786 prompts.
BRIEF_PLAN = Plan(
    source="brief: planned figures of the 913,786-prompt Qwen3.6-27B run",
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
