"""Fleets of simulator processes for tests: free ports, readiness polled, faults and request logs at run time.

Use the `sim_fleet` fixture (a factory, registered in tests/conftest.py; every fleet it starts is stopped
after the test):

    def test_x(sim_fleet):
        fleet = sim_fleet(4, output_len="fixed:64", decode_step_s=0.001)
        fleet.set_faults(2, hang=True)
        ...

or `SimFleet.start(count, run_dir, ...)` as a context manager outside pytest. Never sleep to synchronize:
`wait_until(predicate)` polls a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import orjson

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.launch import (
    Fleet,
    free_ports,
    launch_simulators,
    router_command,
    stop_fleet,
)
from dagster_project.sglang.model_identity import PROBE_INPUT_IDS
from dagster_project.sglang.sim.config import serving_options

T = TypeVar("T")

# The one-token prompt of the dispatcher's own requests: the served-model probes and a set-aside server's canaries.
PROBE_HASH = proto.input_hash(PROBE_INPUT_IDS)

# Small answers and no latency unless a test asks for more: the suite stays fast.
FAST_DEFAULTS: dict[str, Any] = {"output_len": "uniform:8:48", "max_running_requests": 8}


def slow_until_cleared(options: Mapping[str, Any], speedup: float = 10.0) -> dict[str, Any]:
    """Simulator options that run `speedup` times faster than `options`, held back to their speed by a `slow`
    fault: a test that needs a slow fleet only up to some moment (a kill, a status read, a step that ended) clears
    the servers' faults then (`clear_faults`), and the rest of the work runs at full speed."""
    return {**options, "decode_step_s": options["decode_step_s"] / speedup, "faults": {"slow": speedup}}


def wait_until(
    predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.01, what: str = "condition"
) -> T:
    """Poll `predicate` until it returns something truthy; fail the test when the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def _refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def _call(method: str, url: str, body: Any = None, timeout_s: float = 10.0) -> Any:
    data = orjson.dumps(body) if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return orjson.loads(response.read())


def call(
    url: str, body: Any = None, method: str | None = None, headers: dict | None = None, timeout: float = 120
) -> tuple[int, Any]:
    """One HTTP call as a client sends it: (status, parsed JSON body or text), error statuses included."""
    data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    if headers is None:
        headers = {} if data is None or isinstance(body, bytes) else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return status, raw.decode()


def generation_tokens_total(url: str) -> int:
    """The server's own count of the output tokens it generated (`sglang:generation_tokens_total`): what the
    waste ledger is checked against."""
    status, text = call(url + "/metrics", timeout=10)
    assert status == 200, (url, status)
    return round(proto.parse_metrics(text).get("sglang:generation_tokens_total", 0.0))


class SimFleet:
    """A running fleet of simulator processes and the controls tests need over it."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    @classmethod
    def start(
        cls,
        count: int,
        run_dir: Path,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        host: str = "127.0.0.1",
        tokenizer: str | None = None,
        served_model: str | None = None,
        **common: Any,
    ) -> SimFleet:
        """`count` simulators listening on `host`; `common` options apply to all, `options` may give one mapping
        per server. With `tokenizer` (a `DFLASH_TOKENIZER` value) and `served_model` they serve that model as
        `fleet up --simulate` does under those settings: its vocabulary, end ids and name, answers in its text."""
        model: dict[str, Any] = {}
        if tokenizer is not None:
            model = serving_options(tokenizer, served_model or tokenizer)
        if options is None or isinstance(options, Mapping):
            per_server: Any = {**FAST_DEFAULTS, **model, **(options or {}), **common}
        else:
            per_server = [{**FAST_DEFAULTS, **model, **common, **o} for o in options]
        return cls(launch_simulators(count, run_dir, per_server, host=host, tokenizer=tokenizer))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def urls(self) -> list[str]:
        return self.fleet.urls

    def url(self, index: int) -> str:
        return self.fleet.members[index].url

    def set_faults(self, index: int, **faults: Any) -> dict:
        """Change faults of one server now (merged into its current faults), e.g. `hang=True`, `error_503=5`."""
        return _call("POST", self.url(index) + "/_sim/faults", faults)

    def clear_faults(self, index: int) -> dict:
        return _call("DELETE", self.url(index) + "/_sim/faults")

    def requests(self, index: int, since: int = 0) -> list[dict]:
        """The server's request log: rid, input_hash, prompt_tokens, received_at, outcome."""
        return _call("GET", f"{self.url(index)}/_sim/requests?since={since}")["requests"]

    def aborts(self, index: int) -> list[dict]:
        """The server's abort log: every /abort_request's rid, when it came (epoch s), how many requests it ended."""
        return _call("GET", self.url(index) + "/_sim/aborts")["aborts"]

    def job_requests(self, index: int, since: int = 0) -> list[dict]:
        """The request log less the dispatcher's own one-token probes: the requests of the job's events."""
        return [entry for entry in self.requests(index, since) if entry["input_hash"] != PROBE_HASH]

    def state(self, index: int) -> dict:
        """Scheduler state: running, queued, cap, counters, faults, occupancy."""
        return _call("GET", self.url(index) + "/_sim/state")

    def reset_occupancy(self, index: int) -> dict:
        return _call("POST", self.url(index) + "/_sim/state?reset_occupancy=1")

    def alive(self, index: int) -> bool:
        return self.fleet.members[index].process() is not None

    def kill(self, index: int, signum: int = signal.SIGKILL) -> None:
        """Kill one server the hard way (its process group), and wait until it is gone and its port refuses."""
        member = self.fleet.members[index]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(member.pid, signum)
        # A dead leader thread shows as a zombie while the other threads still hold the listening socket.
        wait_until(
            lambda: not self.alive(index) and _refuses(urllib.parse.urlsplit(member.url).hostname, member.port),
            what=f"{member.name} to exit",
        )

    def stop(self) -> None:
        stop_fleet(self.fleet.run_dir, timeout_s=10)


@contextlib.contextmanager
def running_router(worker_urls: Sequence[str], run_dir: Path, *extra_args: str) -> Iterator[str]:
    """The real `sglang-router` (PyPI, its Rust binary) in front of `worker_urls`; yields its URL.

    The command `dflash fleet router` prints (`launch.router_command`), quieter and with frequent health checks.
    """
    port, metrics_port = free_ports(2)
    command = [
        *router_command(worker_urls, host="127.0.0.1", port=port, metrics_port=metrics_port), "--log-level", "warn",
        # Probe workers every second (default 60 s) so the router sees them, or their death, promptly.
        "--health-check-interval-secs", "1", *extra_args,
    ]  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "router.log", "ab") as log:
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _healthy_workers(url) == len(worker_urls),
            timeout_s=60,
            interval_s=0.05,
            what="the router to see every worker healthy",
        )
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(router.pid, signal.SIGTERM)
        try:
            router.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(router.pid, signal.SIGKILL)
            router.wait()


def _healthy_workers(router_url: str) -> int:
    try:
        return _call("GET", router_url + "/readiness", timeout_s=2)["healthy_workers"]
    except (OSError, KeyError, ValueError):
        return -1
