"""The pipeline's own figures in Prometheus' text format, for a Prometheus beside the SGLang servers' own /metrics.

Every figure is a gauge read from one `Status` (what `dflash status` computes): each scrape reads the store and
probes the fleet once, as `dflash status` does, so each value equals the one `dflash status --json` prints at the
same moment, in base units (seconds for the ETA's hours, dollars). A figure the status does not know (no ETA yet,
no price configured, a server that does not report) has no sample: Prometheus shows it absent, never a made-up 0.

`dflash metrics` serves them on a loopback port (`serve_metrics`); `render_metrics` gives the text of one status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dagster_project.generation.line_stop import WatchFigure

if TYPE_CHECKING:
    from threading import Thread
    from wsgiref.simple_server import WSGIServer

    from dagster_project.ops.answers.concurrency import ServerConcurrency
    from dagster_project.ops.answers.cost import CostAnswer
    from dagster_project.ops.answers.waste import WasteAnswer
    from dagster_project.ops.status import Status

PREFIX = "dflash_"
DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporters use; free beside SGLang's 30000+
HOURS = 3600.0


@dataclass(frozen=True)
class Figure:
    """One gauge of the whole job: its name (without the prefix), what it says, and where the status has it."""

    name: str
    help: str
    value: Callable[[Status], float | None]


def _count(items: list | None) -> int:
    return len(items or [])


def _seconds(hours: float | None) -> float | None:
    return None if hours is None else hours * HOURS


def _cost(read: Callable[[CostAnswer], float | None]) -> Callable[[Status], float | None]:
    """A cost figure: absent while no price is configured."""
    return lambda status: None if status.cost is None else read(status.cost)


def _waste(read: Callable[[WasteAnswer], float | None]) -> Callable[[Status], float | None]:
    return lambda status: None if status.waste is None else read(status.waste)


JOB_FIGURES = [
    Figure("status_collected_timestamp_seconds", "When the store and the fleet were read (Unix time).",
           lambda s: s.collected_at),
    Figure("events_planned", "Events (conversation turns) the job plans to generate.",
           lambda s: s.progress.events_planned),
    Figure("events_done", "Planned events with a record: published shards' rows and running shards' answers so far.",
           lambda s: s.progress.events_done),
    Figure("events_ok", "Events answered without error.", lambda s: s.progress.events_ok),
    Figure("events_remaining", "Planned events not done yet.", lambda s: s.progress.events_remaining),
    Figure("fraction_done", "events_done / events_planned.", lambda s: s.progress.fraction_done),
    Figure("eta_seconds", "Time to finish at the measured window rate; absent while the rate settles.",
           lambda s: _seconds(s.progress.eta_hours)),
    Figure("plan_eta_seconds", "Time to finish at the plan's rate (`dflash plan`); absent without a plan.",
           lambda s: _seconds(s.progress.plan_eta_hours)),
    Figure("window_requests_per_second", "Requests answered per second over the running shards' window.",
           lambda s: s.progress.window_req_per_s),
    Figure("window_output_tokens_per_second", "Output tokens per second over the running shards' window.",
           lambda s: s.progress.window_output_tok_per_s),
    Figure("lifetime_requests_per_second", "Requests answered per second over the hours some shard generated.",
           lambda s: s.progress.lifetime_req_per_s),
    Figure("lifetime_output_tokens_per_second", "Output tokens per second over the hours some shard generated.",
           lambda s: s.progress.lifetime_output_tok_per_s),
    Figure("shards_running", "Completions shard runs generating now.", lambda s: _count(s.progress.shards_running)),
    Figure("shards_dead", "Completions shard runs killed without saying so (their process is gone).",
           lambda s: _count(s.progress.shards_dead)),
    Figure("shards_failed", "Completions shards whose last run failed and which are not published.",
           lambda s: _count(s.progress.shards_failed)),
    Figure("shards_total", "Shards the conversations stage published.",
           lambda s: s.shards.shards if s.shards else None),
    Figure("job_done", "1 when every shard is exported with every blocking gate green.",
           lambda s: float(s.shards.done) if s.shards else None),
    Figure("line_held", "1 while the line is held (a quality gate failed on the answers arriving: `dflash hold`).",
           lambda s: float(s.quality.hold is not None) if s.quality else None),
    Figure("mtp_on", "1 when every healthy server runs speculative decoding (MTP).", lambda s: float(s.mtp.mtp_on)),
    Figure("accept_length_window", "MTP accept length over the running shards' window (tokens per verify pass).",
           lambda s: s.mtp.accept_length_window),
    Figure("accept_length_published_shards", "MTP accept length, the mean over published shards' lifetimes.",
           lambda s: s.mtp.accept_length_published_shards),
    Figure("cost_per_hour_dollars", "The fleet's price per hour; absent without a price.",
           _cost(lambda c: c.cost_per_hour)),
    Figure("cost_gpus", "GPUs the price counts.", _cost(lambda c: c.gpus)),
    Figure("cost_spent_dollars", "Spent: the fleet's GPU-hours at the price recorded at `fleet up`.",
           _cost(lambda c: c.spent)),
    Figure("cost_to_finish_dollars", "To finish at the measured rate.", _cost(lambda c: c.to_finish)),
    Figure("cost_to_finish_plan_dollars", "To finish at the plan's rate.", _cost(lambda c: c.to_finish_plan)),
    Figure("cost_per_million_output_tokens_dollars", "Spent per million output tokens generated.",
           _cost(lambda c: c.per_million_output_tokens)),
    Figure("cost_gpu_hours_per_1k_rows", "GPU-hours per thousand answers kept.",
           _cost(lambda c: c.gpu_hours_per_1k_rows)),
    Figure("cost_gpu_hours", "GPU-hours paid: the fleet's up-time (or, with no `fleet up` recorded, generation time).",
           _cost(lambda c: c.gpu_hours)),
    Figure("cost_per_million_trained_tokens_dollars", "Spent per million supervised tokens of the training set.",
           _cost(lambda c: c.per_million_trained_tokens)),
    Figure("cost_fleet_idle_seconds", "The fleet up while no shard was generating.",
           _cost(lambda c: _seconds(c.idle_hours))),
    Figure("cost_fleet_idle_dollars", "What the fleet's idle up-time cost.", _cost(lambda c: c.idle_cost)),
    Figure("generated_output_tokens", "Output tokens generated: trained + pending + every waste cause.",
           _waste(lambda w: w.generated_output_tokens)),
    Figure("trained_output_tokens", "Output tokens in the training set (within max_length).",
           _waste(lambda w: w.trained_output_tokens)),
    Figure("pending_output_tokens", "Output tokens of shards not assembled yet or still generating.",
           _waste(lambda w: w.pending_output_tokens)),
]  # fmt: skip

# Per server (label `server`, its URL): the dispatchers' view beside the server's own.
SERVER_FIGURES: list[tuple[str, str, Callable[[ServerConcurrency], float | None]]] = [
    ("server_client_window", "Requests the running shards' dispatchers allow in flight to the server, summed.",
     lambda row: row.client_window),
    ("server_in_flight", "Requests the running shards' dispatchers have in flight to the server, summed.",
     lambda row: row.in_flight),
    ("server_cap", "The server's effective cap on running requests (its /server_info).",
     lambda row: row.effective_cap),
    ("server_running", "Requests the server runs (its /metrics).", lambda row: row.running),
    ("server_queued", "Requests waiting in the server's queue (its /metrics).", lambda row: row.queued),
    ("server_kv_usage", "Fraction of the server's KV pool in use.", lambda row: row.kv_usage),
    ("server_mamba_usage", "Fraction of the server's mamba state slots in use.", lambda row: row.mamba_usage),
]  # fmt: skip


def status_metrics(status: Status) -> Iterator[GaugeMetricFamily]:
    """The status's figures as gauge families; a family with no known value has no sample."""
    for figure in JOB_FIGURES:
        family = GaugeMetricFamily(PREFIX + figure.name, figure.help)
        value = figure.value(status)
        if value is not None:
            family.add_metric([], value)
        yield family
    servers = status.concurrency.servers
    for name, help_, read in SERVER_FIGURES:
        family = GaugeMetricFamily(PREFIX + name, help_, labels=["server"])
        for url, row in servers.items():
            if (value := read(row)) is not None:
                family.add_metric([url], value)
        yield family
    accept = GaugeMetricFamily(
        PREFIX + "server_spec_accept_length", "The server's own average MTP accept length.", labels=["server"]
    )
    for url, value in status.mtp.server_avg_spec_accept_length.items():
        if value is not None:
            accept.add_metric([url], value)
    yield accept
    shards = GaugeMetricFamily(
        PREFIX + "shards", "Shards in each state at each stage (completions, training_set, export).",
        labels=["stage", "state"],
    )  # fmt: skip
    if status.shards:
        for stage in ("completions", "training_set", "export"):
            for state, count in getattr(status.shards, stage).items():
                shards.add_metric([stage, state], count)
    yield shards
    yield from waste_metrics(status)
    yield from _watch_metrics(status)
    alerts = GaugeMetricFamily(PREFIX + "alerts", "Alerts `dflash status` raises now, by kind.", labels=["kind"])
    for kind, count in sorted(Counter(alert.kind for alert in status.alerts).items()):
        alerts.add_metric([kind], count)
    yield alerts


def waste_metrics(status: Status) -> Iterator[GaugeMetricFamily]:
    """The waste ledger (`answers.waste`) by cause (its totals are job figures)."""
    waste = status.waste
    by_cause = [
        ("waste_output_tokens", "Output tokens generated and not trained, by cause.",
         waste.output_tokens if waste else {}),
        ("waste_answers", "Answers (rows, or answers in no row) generated and not trained, by cause.",
         waste.answers if waste else {}),
        ("waste_gpu_seconds", "Estimated GPU-seconds of the output tokens not trained, by cause.",
         waste.gpu_seconds if waste else {}),
        ("waste_dollars", "Estimated dollars of the output tokens not trained, by cause.",
         waste.dollars if waste else {}),
    ]  # fmt: skip
    for name, help_, values in by_cause:
        family = GaugeMetricFamily(PREFIX + name, help_, labels=["cause"])
        for cause, value in values.items():
            family.add_metric([cause], value)
        yield family


# The quality watch's fleet-wide figures (label `gate`: the gate, and which limit where it has several), each
# blocking answer gate over the answers so far.
WATCH_FIGURES: list[tuple[str, str, Callable[[WatchFigure], float]]] = [
    ("watch_figure", "The share the gate judges, over every running shard's answers so far (accept length: tokens "
     "per verify pass).", lambda f: f.figure),
    ("watch_threshold", "The gate's threshold (the accept length's floor).", lambda f: f.threshold),
    ("watch_sample_size", "Answers the figure was taken over.", lambda f: f.sample_size),
    ("watch_passed", "1 while the gate passes on the answers so far.", lambda f: float(f.passed)),
]  # fmt: skip


def _watch_metrics(status: Status) -> Iterator[GaugeMetricFamily]:
    figures = status.quality.fleet if status.quality else []
    for name, help_, read in WATCH_FIGURES:
        family = GaugeMetricFamily(PREFIX + name, help_, labels=["gate"])
        for figure in figures:
            family.add_metric([figure.label], read(figure))
        yield family


class StatusCollector(Collector):
    """Reads a fresh status at each scrape: a scrape that cannot read the store fails (HTTP 500), and Prometheus
    records the target down rather than stale figures."""

    def __init__(self, read_status: Callable[[], Status]) -> None:
        self.read_status = read_status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from status_metrics(self.read_status())


def registry_for(read_status: Callable[[], Status]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)  # describing would read the store once more at registration
    registry.register(StatusCollector(read_status))
    return registry


def render_metrics(status: Status) -> str:
    """The exposition text of one status."""
    return generate_latest(registry_for(lambda: status)).decode()


def serve_metrics(read_status: Callable[[], Status], host: str, port: int) -> tuple[WSGIServer, Thread]:
    """Serve /metrics on `host:port` in a daemon thread, reading a fresh status at each scrape."""
    return start_http_server(port, addr=host, registry=registry_for(read_status))
