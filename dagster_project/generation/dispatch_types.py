"""What the dispatcher takes and gives: requests, their outcomes, run statistics, the errors that stop a run,
and the options (the `fleet` resource's config)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dagster_project.generation.unrecorded import RESENT_ORIGINAL, Unrecorded
from dagster_project.sglang.client import GenerateResult, SGLangError


@dataclass
class GenRequest:
    key: str  # unique per request (the generation event id)
    input_ids: list[int]
    sampling_params: dict
    payload: Any = None  # the caller's, returned untouched in the Outcome


@dataclass
class Outcome:
    """How one request ended: exactly one of `result` and `error` is set."""

    request: GenRequest
    result: GenerateResult | None
    error: SGLangError | None
    server: str  # the server that produced the result or the final error
    attempts: int  # attempts started for this request, hedged ones included
    latency_s: float  # of the attempt that ended the request
    served_model: str | None = None  # the model the answering server was checked to serve (`ModelIdentity.label`)

    @property
    def ok(self) -> bool:
        return self.result is not None


@dataclass
class DispatchStats:
    outcomes: int = 0
    results: int = 0
    errors: Counter = field(default_factory=Counter)  # by error kind
    attempts: int = 0
    retries: int = 0
    hedges: int = 0  # requests sent again because their server stopped making progress
    late_results: int = 0  # results that arrived after their request had ended (dropped)
    unrecorded: Unrecorded = field(default_factory=Unrecorded)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0

    @property
    def resent_original_tokens(self) -> int:
        return self.unrecorded.tokens[RESENT_ORIGINAL]

    def as_dict(self) -> dict:
        return {**self.__dict__, "errors": dict(self.errors), "unrecorded": self.unrecorded.as_dict()}


class FleetDownError(RuntimeError):
    """No server was usable for longer than the grace period; the run stops instead of failing its work."""


class FleetRefusesKey(RuntimeError):
    """A server answered 401: the run's API key is not the fleet's."""


@dataclass(frozen=True)
class DispatchOptions:
    """How the dispatcher sizes windows, retries requests and watches servers (the `fleet` resource's config)."""

    oversubscription: float = field(
        default=1.25, metadata={"help": "In-flight window per server = its effective running-request cap x this."}
    )
    request_timeout_s: float = field(
        default=3600.0, metadata={"help": "Seconds one request may take; thinking answers can take many minutes."}
    )
    max_attempts: int = field(
        default=4, metadata={"help": "Attempts per request (refused ones not counted) before it ends as an error."}
    )
    default_window: int | None = field(
        default=None, metadata={"help": "Window of an endpoint whose /server_info reports no cap; none: refuse it."}
    )
    probe_interval_s: float = field(default=5.0, metadata={"help": "Health probe period of each server."})
    watchdog_s: float = field(
        default=120.0,
        metadata={
            "help": "A server with our requests in flight and no sign of progress on them for this long (no answer, "
            "no /metrics read showing them there) is set aside; a passing health check is not progress."
        },
    )
    unserved_after_s: float = field(
        default=15.0,
        metadata={
            "help": "A server whose /metrics report nothing running or queued for this long while our requests "
            "are in flight there (lost before reaching it) is set aside."
        },
    )
    silence_s: float = field(
        default=45.0,
        metadata={
            "help": "A server with our requests in flight that answers none for this long while other servers "
            "answer is set aside (its requests go elsewhere; the originals keep running)."
        },
    )
    trickle_after_s: float = field(
        default=15.0,
        metadata={
            "help": "A server whose answer has begun (its status and headers in) and is not complete after this long "
            "is set aside (its body trickles: a throttled link, a proxy); its requests go elsewhere."
        },
    )
    fleet_down_grace_s: float = field(
        default=300.0, metadata={"help": "With no usable server for this long, the run stops (FleetDownError)."}
    )
    probe_timeout_s: float = field(default=30.0, metadata={"help": "Timeout of /health and /server_info."})
    canary_timeout_s: float = field(
        default=120.0, metadata={"help": "Timeout of the one-token request a set-aside server must answer to rejoin."}
    )
    max_probe_backoff_s: float = field(
        default=60.0, metadata={"help": "Longest pause between probes of a set-aside server."}
    )
    require_reasoning: bool = field(
        default=True, metadata={"help": "Ask servers to count reasoning tokens (meta_info.reasoning_tokens)."}
    )
    discovery_interval_s: float = field(
        default=10.0, metadata={"help": "How often the fleet registry is re-read for servers of nodes that joined."}
    )
    load_read_interval_s: float = field(
        default=1.0,
        metadata={
            "help": "Period of reading each server's /metrics (running + queued requests), so that runs on other "
            "nodes and other clients count against its window; 0: only this node's runs count."
        },
    )

    def __post_init__(self) -> None:
        if self.oversubscription <= 0 or self.max_attempts < 1 or self.load_read_interval_s < 0:
            raise ValueError("oversubscription must be > 0, max_attempts >= 1 and load_read_interval_s >= 0")
        if min(self.watchdog_s, self.unserved_after_s, self.silence_s, self.trickle_after_s) <= 0:
            raise ValueError("watchdog_s, unserved_after_s, silence_s and trickle_after_s must be > 0")
