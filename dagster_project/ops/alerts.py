"""What the run costs, and what an operator must be told without asking: the last two parts of `status`.

Both are computed from the six answers (`ops.status`), so the terminal, the report page and its checks agree.
The fleet's price is configuration (`FleetCost`, on the fleet resource); the alert thresholds too
(`AlertThresholds`, the `run_report` config).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster_project.ops.status import ConcurrencyAnswer, MtpAnswer, ProgressAnswer, StorageAnswer


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
        f"{_number(cost.gpu_hours_per_1k_rows, 3)} GPU-hours per 1K kept rows",
    ]


# ---- alerts ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertThresholds:
    accept_length_floor: float = field(
        default=2.0, metadata={"help": "Alert when MTP's accept length (our window, or a server's) falls below this."}
    )
    eta_slip: float = field(
        default=0.25, metadata={"help": "Alert when the measured ETA exceeds the plan's by more than this fraction."}
    )


DEFAULT_THRESHOLDS = AlertThresholds()


@dataclass(frozen=True)
class Alert:
    kind: str  # mtp, server, eta, shards, fleet, storage
    message: str


def raise_alerts(
    progress: ProgressAnswer,
    mtp: MtpAnswer,
    concurrency: ConcurrencyAnswer,
    storage: StorageAnswer,
    *,
    endpoints_known: bool,
    thresholds: AlertThresholds,
) -> list[Alert]:
    """Every condition that needs an operator now, each in one sentence that says what to look at."""
    return [
        *_mtp_alerts(mtp, thresholds.accept_length_floor),
        *_server_alerts(progress, concurrency),
        *_eta_alerts(progress, thresholds.eta_slip),
        *_shard_alerts(progress, storage),
        *_fleet_alerts(concurrency, endpoints_known),
    ]


def _mtp_alerts(mtp: MtpAnswer, floor: float) -> list[Alert]:
    off = sorted(url for url, algorithm in mtp.speculative_algorithm.items() if not algorithm)
    if off:
        return [Alert("mtp", f"MTP is off on {', '.join(off)}: restart them with speculative decoding (NEXTN)")]
    if mtp.accept_length_window is not None and mtp.accept_length_window < floor:
        return [
            Alert(
                "mtp",
                f"accept length {mtp.accept_length_window:.2f} on our recent requests is below {floor}: "
                "MTP is barely accepting drafts (check the servers' speculative settings and logs)",
            )
        ]
    if mtp.accept_length_window is None and mtp.accept_length_published_shards is not None:
        if mtp.accept_length_published_shards < floor:
            return [
                Alert(
                    "mtp",
                    f"accept length {mtp.accept_length_published_shards:.2f} of the published shards is below {floor}",
                )
            ]
    return []


def _server_alerts(progress: ProgressAnswer, concurrency: ConcurrencyAnswer) -> list[Alert]:
    alerts = []
    work_waits = bool(progress.shards_running) and progress.events_remaining > 0
    for url, row in concurrency.servers.items():
        cap, running, queued = row.effective_cap, row.running, row.queued
        if cap is None or running is None:
            continue
        # A queue longer than a whole batch waits more than one batch's latency: more client concurrency
        # only adds latency (and timeouts) there, never throughput.
        if running >= cap and queued is not None and queued >= cap:
            alerts.append(
                Alert(
                    "server",
                    f"{url} is at its cap ({cap}) with {queued:.0f} queued, more than a whole batch: "
                    "lower the fleet resource's oversubscription or raise the server's cap",
                )
            )
        elif running == 0 and work_waits:
            alerts.append(Alert("server", f"{url} is idle while shards {progress.shards_running} have work waiting"))
    return alerts


def _eta_alerts(progress: ProgressAnswer, slip: float) -> list[Alert]:
    eta, planned = progress.eta_hours, progress.plan_eta_hours
    if eta is None or not planned or eta <= planned * (1 + slip):
        return []
    return [
        Alert(
            "eta",
            f"ETA {eta:,.2f} h is {eta / planned - 1:.0%} past the plan's {planned:,.2f} h (alert above {slip:.0%})",
        )
    ]


def _shard_alerts(progress: ProgressAnswer, storage: StorageAnswer) -> list[Alert]:
    alerts = []
    if progress.shards_dead:
        dead = progress.shards_dead
        alerts.append(Alert("shards", f"shard runs killed, not running: {dead} (materialize them again)"))
    if progress.shards_failed:
        alerts.append(Alert("shards", f"shard runs failed and unpublished: {progress.shards_failed}"))
    if storage.materialized_not_in_store:
        missing = storage.materialized_not_in_store
        alerts.append(Alert("storage", f"materialized in Dagster but not intact in the store: {missing}"))
    if storage.failed_uploads:
        alerts.append(Alert("storage", f"{storage.failed_uploads} uploads to the store failed (retried)"))
    if len(storage.settings_fingerprints) > 1:
        alerts.append(Alert("storage", f"published shards mix generation settings: {storage.settings_fingerprints}"))
    return alerts


def _fleet_alerts(concurrency: ConcurrencyAnswer, endpoints_known: bool) -> list[Alert]:
    down = sorted(url for url, row in concurrency.servers.items() if row.limited_by == "unreachable")
    if endpoints_known and not concurrency.servers:
        return [Alert("fleet", "no server answered")]
    if down and len(down) == len(concurrency.servers):
        return [Alert("fleet", f"the fleet is unreachable: {', '.join(down)}")]
    return [Alert("fleet", f"unreachable: {', '.join(down)}")] if down else []


def render_alerts(alerts: list[Alert]) -> list[str]:
    if not alerts:
        return ["Alerts: none"]
    return [f"Alerts ({len(alerts)}):", *(f"   ALERT [{alert.kind}]: {alert.message}" for alert in alerts)]


def dollars(value: float | None) -> str:
    """$1,234.57, or — when unknown."""
    return "—" if value is None else f"${value:,.2f}"


def _number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"
