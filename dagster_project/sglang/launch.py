"""Fleet lifecycle: one `sglang.launch_server` per GPU (or N simulators), a pid file, logs, readiness, stop.

Launch mode starts servers detached in their own process groups and records them in
`<run_dir>/fleet.json` as each one is spawned, so a launcher killed mid-start leaves a record that the
next `launch_*` or `stop_fleet` cleans up. Connect mode (`connect`) only normalizes given endpoints or a
router URL: that is all the Dagster resource ever does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import psutil

from dagster_project.processes import live_process, process_start, this_process
from dagster_project.sglang import capacity
from dagster_project.sglang.model_identity import MODEL_NAME_FIELDS, QWEN3_6_27B
from dagster_project.sglang.protocol import parse_metrics
from dagster_project.sglang.speculative import RECIPE, parse_setting
from dagster_project.store.dataclass_json import from_dict

if TYPE_CHECKING:  # the client imports aiohttp: only what talks to servers imports it, when it does
    pass

DEFAULT_MODEL = QWEN3_6_27B.model
PID_FILE = "fleet.json"
SIM_VOCAB_FILE = "sim_vocab.json"
_LOG_TAIL_LINES = 40

# Flags that 0.5.23 removed, deprecated or refuses for this model, with what to use.
REJECTED_FLAGS = {
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
    "--mamba-scheduler-strategy": "--mamba-radix-cache-strategy",
    "--disable-cuda-graph": "--cuda-graph-backend-decode disabled",
    "--enable-dp-attention": "--attn-dp-size",
    "--language-model-only": "nothing: it rejects Qwen3_5ForConditionalGeneration",
}


class FleetError(RuntimeError):
    """The fleet could not be started, found, or stopped as asked."""


# Flags that size the pools: with any of them given, the operator sizes the server and nothing is planned.
CAPACITY_FLAGS = ("max_running_requests", "mamba_full_memory_ratio", "max_mamba_cache_size")
# sglang-router's default (1800 s) would cut a long thinking generation short.
ROUTER_REQUEST_TIMEOUT_S = 24 * 3600


# Where a server listens by default: this host only. Listening wider (`--host 0.0.0.0`, for shard runs on other
# hosts, or in a pod behind a Service) is asked for, and without an API key anyone who reaches the port may use it.
LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = "0.0.0.0"


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning a launch listening beyond this host without an API key prints; None when it does not."""
    if not listens_beyond_this_host(host) or api_key:
        return None
    return (
        f"WARNING: the servers listen on {host} (beyond this host) WITHOUT an API key: anyone who reaches their "
        "ports can generate on your GPUs and read what they serve. Set SGLANG_API_KEY (the pipeline sends it), or "
        f"leave --host out to listen on {LOOPBACK} only"
    )


def listens_beyond_this_host(host: str) -> bool:
    """Whether other hosts may reach a server listening on `host`: anything but a loopback address."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: one of this host's interfaces
        return True


@dataclass(frozen=True)
class ServerOptions:
    """Knobs of one `sglang.launch_server`.

    The mamba state pool, more than `max_running_requests`, caps a hybrid model's concurrency. By default a
    launch runs at the ceiling: the radix cache off (one state slot per request instead of five) and
    `--max-running-requests` planned from the GPU's memory and the expected request length
    (`plan_capacity`), so that neither the state pool nor the KV pool is left idle. Giving
    `max_running_requests`, `mamba_full_memory_ratio` or `max_mamba_cache_size` sizes the server by hand;
    SGLang's own sizing is `radix_cache=True, max_running_requests=48`.
    """

    model_path: str = field(default=DEFAULT_MODEL, metadata={"help": "model to serve: a local path or a Hub name"})
    host: str = field(
        default=LOOPBACK,
        metadata={
            "help": f"interface the servers listen on (default {LOOPBACK}: this host only; {EVERY_INTERFACE} for shard "
            "runs on other hosts, with SGLANG_API_KEY set)"
        },
    )
    context_length: int = field(default=65536, metadata={"help": "longest prompt + answer a request may have"})
    max_running_requests: int | None = field(
        default=None,
        metadata={
            "help": "requests each server runs at once (default: planned from GPU memory and the request length)"
        },
    )
    mem_fraction_static: float | None = field(
        default=None, metadata={"help": "share of GPU memory for weights and pools (default: SGLang's automatic one)"}
    )
    mamba_full_memory_ratio: float | None = field(
        default=None, metadata={"help": "share of the pool memory for mamba states (default: SGLang's 0.9)"}
    )
    max_mamba_cache_size: int | None = field(default=None, metadata={"help": "mamba state slots, fixed"})
    mamba_ssm_dtype: str | None = field(
        default=None, metadata={"help": "bfloat16 halves the state (about 1.7x the requests) but changes numerics"}
    )
    kv_cache_dtype: str | None = field(default=None, metadata={"help": "e.g. fp8_e4m3 (default: the model's)"})
    radix_cache: bool = field(
        default=False,
        metadata={"help": "keep SGLang's radix cache (prefix reuse; 5 state slots per running request instead of 1)"},
    )
    load_format: str | None = field(default=None, metadata={"help": "dummy: random weights (memory and speed only)"})
    served_model_name: str | None = field(
        default=None, metadata={"help": "the model name the servers report (default: --model-path)"}
    )
    random_seed: int | None = field(default=0, metadata={"help": "the servers' sampling seed"})
    speculative: str = field(
        default=RECIPE.label,
        metadata={"help": "MTP as steps/topk/draft-tokens (NEXTN; the model card's 3/1/4), or off"},
    )
    cpu: bool = field(
        default=False,
        metadata={
            "help": "serve on the CPU (a tiny model, no GPU: README): SGLANG_USE_CPU_ENGINE=1, --device cpu, "
            "torch-native attention, no speculative decoding, CPU stand-ins of the CUDA-only sgl_kernel ops first "
            "on PYTHONPATH"
        },
    )
    max_total_tokens: int | None = field(
        default=None,
        metadata={"help": "KV pool size in tokens (default: SGLang's, from memory; required with --cpu)"},
    )
    api_key: str | None = field(default=None, repr=False)
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        spec = parse_setting(self.speculative)  # a setting SGLang would refuse fails before any server starts
        if self.cpu and spec is not None:
            # 0.5.23 accepts no CPU draft backend but intel_amx: EAGLE stops at startup on torch_native.
            raise ValueError("speculative decoding does not run on the CPU: pass --speculative off with --cpu")
        if self.cpu and self.max_total_tokens is None:
            # Without it SGLang sizes the KV pool at ~70% of the host's RAM.
            raise ValueError("--cpu needs --max-total-tokens (SGLang would take ~70% of the host's RAM)")

    @property
    def sized_by_hand(self) -> bool:
        return any(getattr(self, name) is not None for name in CAPACITY_FLAGS)

    def launch_settings(self) -> capacity.LaunchSettings:
        """The capacity model's view of these flags."""
        spec = parse_setting(self.speculative)
        return capacity.LaunchSettings(
            speculative_draft_tokens=spec.draft_tokens if spec is not None else 0,
            max_running_requests=self.max_running_requests,
            mamba_full_memory_ratio=self.mamba_full_memory_ratio or capacity.LaunchSettings.mamba_full_memory_ratio,
            max_mamba_cache_size=self.max_mamba_cache_size,
            disable_radix_cache=not self.radix_cache,
            mamba_ssm_dtype=self.mamba_ssm_dtype or "float32",
            kv_cache_dtype=self.kv_cache_dtype or "auto",
            context_length=self.context_length,
        )


def server_command(
    options: ServerOptions, port: int, *, python: str = sys.executable, config_file: str | None = None
) -> list[str]:
    """The `python -m sglang.launch_server ...` command line of one server: the model card's MTP recipe, metrics on.

    The API key is never on it (a command line is readable by every user of the host, in `ps`): it goes in
    `config_file`, SGLang's `--config` YAML (see `write_secrets_config`), which the caller writes."""
    keyed = any(arg.split("=")[0] in ("--api-key", "--admin-api-key") for arg in options.extra_args)
    if keyed or (options.api_key is not None and config_file is None):
        raise ValueError("an API key is passed in a --config file (write_secrets_config), never on the command line")
    rejected = [arg.split("=")[0] for arg in options.extra_args if arg.split("=")[0] in REJECTED_FLAGS]
    if rejected:
        raise ValueError(
            ", ".join(f"{flag} is not an sglang 0.5.23 flag; use {REJECTED_FLAGS[flag]}" for flag in rejected)
        )
    spec = parse_setting(options.speculative)
    spec_args = spec.launch_args() if spec is not None else []  # NEXTN is resolved to EAGLE
    command = [
        python, "-m", "sglang.launch_server",
        "--model-path", options.model_path,
        "--host", options.host,
        "--port", str(port),
        "--tp-size", "1",
        "--context-length", str(options.context_length),
        "--reasoning-parser", "qwen3",
        *spec_args,
        "--enable-metrics",
    ]  # fmt: skip
    if options.cpu:
        command += ["--device", "cpu", "--attention-backend", "torch_native"]
    valued = {
        "--max-total-tokens": options.max_total_tokens,
        "--max-running-requests": options.max_running_requests,
        "--mem-fraction-static": options.mem_fraction_static,
        "--mamba-full-memory-ratio": options.mamba_full_memory_ratio,
        "--max-mamba-cache-size": options.max_mamba_cache_size,
        "--mamba-ssm-dtype": options.mamba_ssm_dtype,
        "--kv-cache-dtype": options.kv_cache_dtype,
        "--load-format": options.load_format,
        "--served-model-name": options.served_model_name,
        "--random-seed": options.random_seed,
        "--config": config_file,
    }
    for flag, value in valued.items():
        if value is not None:
            command += [flag, str(value)]
    if not options.radix_cache:
        command.append("--disable-radix-cache")
    return command + list(options.extra_args)


def simulator_command(
    port: int,
    options: Mapping[str, Any],
    *,
    vocab_file: Path | None,
    host: str,
    python: str = sys.executable,
    config_file: str | None = None,
) -> list[str]:
    """`python -m dagster_project.sglang.sim.server ...`; `options` are SimConfig fields (e.g. `decode_step_s`),
    less the API key, which goes in `config_file` as for a real server (`write_secrets_config`)."""
    if "api_key" in options:
        raise ValueError("an API key is passed in a --config file (write_secrets_config), never on the command line")
    command = [python, "-m", "dagster_project.sglang.sim.server", "--host", host, "--port", str(port)]
    if vocab_file is not None:
        command += ["--vocab-file", str(vocab_file)]
    if config_file is not None:
        command += ["--config", config_file]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "speculative":
            command += [] if value else ["--no-speculative"]
        elif isinstance(value, bool):
            command += [flag] if value else []
        elif isinstance(value, (tuple, list)):
            command += [flag, ",".join(map(str, value))]
        elif isinstance(value, dict):
            command += [flag, orjson.dumps(value).decode()]
        elif value is not None:
            command += [flag, str(value)]
        elif name == "reasoning_parser":  # none, not the simulator's default (a model that does not reason)
            command += [flag, ""]
    return command


def router_command(
    worker_urls: Sequence[str], *, host: str, port: int, metrics_port: int, python: str = sys.executable
) -> list[str]:
    """`sglang-router` in front of `worker_urls` as one endpoint for this pipeline: round robin (no prefix is
    shared, so cache-aware routing buys nothing), no router retries (a retried generation would be requested
    twice: exactly-once stays with the dispatcher), and a request timeout above the longest thinking answer.
    Its Prometheus exporter listens on `host` too, at `metrics_port`: left to the router, it binds every interface
    at 29000 whatever `host` says, and a second router on the node dies at its start on the taken port."""
    return [
        python, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
        "--policy", "round_robin", "--host", host, "--port", str(port),
        "--prometheus-host", host, "--prometheus-port", str(metrics_port),
        "--disable-retries", "--request-timeout-secs", str(ROUTER_REQUEST_TIMEOUT_S),
    ]  # fmt: skip


SECRETS_SUFFIX = ".secrets.yaml"


def write_secrets_config(path: Path, api_key: str) -> Path:
    """SGLang's `--config` YAML (0.5.23 merges it into the flags, `prepare_server_args`) holding the API key, made
    readable by this user alone before the key is written: the key stays off every process's command line."""
    import yaml  # here: readers of fleet records (`dflash status`) never write one

    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        yaml.safe_dump({"api-key": api_key}, handle)
    return path


def _remove_secrets(run_dir: Path) -> None:
    for path in run_dir.glob(f"*{SECRETS_SUFFIX}"):
        path.unlink(missing_ok=True)


# ---- fleet record ---------------------------------------------------------------------------------------------


@dataclass
class Member:
    name: str
    url: str
    port: int
    pid: int
    log: str
    command: list[str]
    gpu: int | None = None
    start: str = ""  # the process's start mark (`processes`): a recycled pid is never mistaken for our server

    def process(self) -> psutil.Process | None:
        """The live server process, or None if it is gone."""
        return live_process(self.pid, self.start)


@dataclass
class Fleet:
    run_dir: Path
    kind: str  # "sglang" or "simulator"
    members: list[Member] = field(default_factory=list)
    state: str = "starting"  # "up" once every member answered its readiness probe
    launcher_pid: int = field(default_factory=lambda: this_process()[1])
    launcher_start: str = field(default_factory=lambda: this_process()[2])  # `processes`: its pid may be reused

    @property
    def urls(self) -> list[str]:
        return [member.url for member in self.members]

    @property
    def pid_file(self) -> Path:
        return self.run_dir / PID_FILE

    def save(self) -> None:
        record = asdict(self)
        record["run_dir"] = str(self.run_dir)
        staging = self.pid_file.with_name(f".{PID_FILE}.{os.getpid()}")
        staging.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
        os.replace(staging, self.pid_file)

    @classmethod
    def load(cls, run_dir: Path) -> Fleet | None:
        path = Path(run_dir) / PID_FILE
        if not path.is_file():
            return None
        record = orjson.loads(path.read_bytes())
        members = [from_dict(Member, member) for member in record.pop("members")]
        # A record written before launchers had a start mark is judged by the pid alone.
        return cls(**{"launcher_start": "", **record, "run_dir": Path(record["run_dir"]), "members": members})

    def alive(self) -> list[Member]:
        return [member for member in self.members if member.process() is not None]

    def launcher_alive(self) -> bool:
        return self.launcher_pid != os.getpid() and live_process(self.launcher_pid, self.launcher_start) is not None


# ---- processes --------------------------------------------------------------------------------------------------


def log_tail(path: str | Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# Servers this process started, kept so that stopping them also reaps them (no zombies, no warnings).
_children: dict[int, subprocess.Popen] = {}


# CPU stand-ins for the two `sgl_kernel` ops SGLang 0.5.23 calls on a CPU (PyPI's kernel wheel is CUDA-only): first
# on a CPU server's PYTHONPATH.
CPU_KERNELS = Path(__file__).with_name("cpu_kernels")


def cpu_server_environment() -> dict[str, str]:
    """What a CPU server adds to its environment: the CPU engine, and the kernel stand-ins first on its import path."""
    path = os.pathsep.join(p for p in (str(CPU_KERNELS), os.environ.get("PYTHONPATH", "")) if p)
    return {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": path}


def server_environment() -> dict[str, str]:
    """This process's environment less its secrets: a server outlives the shell and needs no store credentials."""
    return {name: value for name, value in os.environ.items() if not _is_secret(name)}


def _is_secret(name: str) -> bool:
    upper = name.upper()
    return (upper.startswith("AWS_") and upper.endswith(("_KEY", "_KEY_ID", "_TOKEN"))) or "SECRET" in upper


def _spawn(command: list[str], log_path: Path, env: Mapping[str, str]) -> psutil.Process:
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )
    _children[child.pid] = child
    return psutil.Process(child.pid)


def _reap(pid: int) -> None:
    child = _children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)


def _port_free(host: str, port: int) -> bool:
    """Nothing listens on the port. SO_REUSEADDR, as the servers bind (uvicorn, aiohttp): the connections a killed
    server leaves in TIME_WAIT do not stop its restart on the same port, a live listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Ports the OS reports free right now (held open together, so they are distinct)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _http_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _wait_ready(fleet: Fleet, path: str, timeout_s: float, poll_s: float) -> None:
    """Poll every member's readiness route until all answer 200; fail with the log tail of the laggard."""
    deadline = time.monotonic() + timeout_s
    pending = list(fleet.members)
    with ThreadPoolExecutor(max_workers=max(1, len(pending))) as pool:
        while pending:
            for member in pending:
                if member.process() is None:
                    raise FleetError(
                        f"{member.name} ({member.url}) exited during startup. "
                        f"Last log lines of {member.log}:\n{log_tail(member.log)}"
                    )
            ready = list(pool.map(lambda m: _http_ok(m.url + path, timeout_s=min(30.0, timeout_s)), pending))
            pending = [member for member, ok in zip(pending, ready) if not ok]
            if not pending:
                return
            if time.monotonic() > deadline:
                member = pending[0]
                raise FleetError(
                    f"{member.name} ({member.url}) not ready after {timeout_s:.0f}s "
                    f"({len(pending)} of {len(fleet.members)} servers pending). "
                    f"Last log lines of {member.log}:\n{log_tail(member.log)}"
                )
            time.sleep(poll_s)


def _terminate(members: Sequence[Member], timeout_s: float) -> list[str]:
    """SIGTERM each member's process group, then SIGKILL what is left after `timeout_s`."""
    live = [(member, member.process()) for member in members]
    live = [(member, process) for member, process in live if process is not None]
    for member, _ in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(member.pid, signal.SIGTERM)  # own session: the group id is the server's pid
    deadline = time.monotonic() + timeout_s
    for member, process in live:
        with contextlib.suppress(psutil.Error):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(member.pid, signal.SIGKILL)  # children the server left behind, or a server that ignored SIGTERM
    for member in members:
        _reap(member.pid)
    # A SIGKILLed process is gone only once the kernel has torn it down: callers may check at once.
    gone_by = time.monotonic() + 5.0
    while any(member.process() is not None for member, _ in live) and time.monotonic() < gone_by:
        time.sleep(0.05)
    return [member.name for member, _ in live]


def cleanup_stale(run_dir: Path) -> list[str]:
    """Stop the servers of a launch whose launcher died before the fleet was up; returns their names."""
    fleet = Fleet.load(run_dir)
    if fleet is None or fleet.state == "up" or fleet.launcher_alive():
        return []
    stopped = _terminate(fleet.members, timeout_s=10)
    fleet.pid_file.unlink(missing_ok=True)
    _remove_secrets(run_dir)
    return stopped


def _prepare(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    cleanup_stale(run_dir)
    fleet = Fleet.load(run_dir)
    if fleet is None:
        return
    if fleet.alive():
        raise FleetError(
            f"a {fleet.kind} fleet is already running from {run_dir} ({', '.join(fleet.urls)}): "
            "stop it first (`dflash fleet down`)"
        )
    fleet.pid_file.unlink()


def _start(
    fleet: Fleet,
    specs: Sequence[tuple[str, int, list[str], dict[str, str], int | None]],
    *,
    connect_host: str,
    ready_path: str,
    startup_timeout_s: float,
    poll_s: float,
) -> Fleet:
    """Spawn each (name, port, command, env, gpu), recording it at once; wait until all are ready."""
    busy = [port for _, port, *_ in specs if not _port_free(connect_host, port)]
    if busy:
        raise FleetError(f"ports already in use: {busy}")
    fleet.save()
    try:
        for name, port, command, env, gpu in specs:
            log = fleet.run_dir / f"{name}.log"
            process = _spawn(command, log, env)
            fleet.members.append(
                Member(
                    name,
                    f"http://{connect_host}:{port}",
                    port,
                    process.pid,
                    str(log),
                    command,
                    gpu,
                    process_start(process.pid),
                )
            )
            fleet.save()
        _wait_ready(fleet, ready_path, startup_timeout_s, poll_s)
    except BaseException:
        _terminate(fleet.members, timeout_s=10)
        fleet.pid_file.unlink(missing_ok=True)
        raise
    finally:
        _remove_secrets(fleet.run_dir)  # a server reads its --config file once, at startup
    fleet.state = "up"
    fleet.save()
    return fleet


def launch_fleet(
    gpus: Sequence[int],
    run_dir: Path,
    options: ServerOptions = ServerOptions(),
    *,
    base_port: int = 30000,
    connect_host: str = LOOPBACK,
    startup_timeout_s: float = 1800.0,
    python: str = sys.executable,
) -> Fleet:
    """One SGLang server per GPU (`CUDA_VISIBLE_DEVICES=<gpu>`, port `base_port + i`), ready via `/health_generate`;
    with `options.cpu`, one CPU server per index given (tests)."""
    run_dir = Path(run_dir)
    _prepare(run_dir)
    specs = []
    for index, gpu in enumerate(gpus):
        port = base_port + index
        # On the CPU the index only names the server: SGLang detects the CPU engine from this variable alone, and
        # imports the CPU stand-ins of the CUDA-only kernel wheel's ops first.
        device = cpu_server_environment() if options.cpu else {"CUDA_VISIBLE_DEVICES": str(gpu)}
        name = f"{'cpu' if options.cpu else 'gpu'}{gpu}"
        secrets = _secrets_config(run_dir, name, options.api_key)
        command = server_command(options, port, python=python, config_file=secrets)
        specs.append((name, port, command, {**server_environment(), **device}, None if options.cpu else gpu))
    return _start(
        Fleet(run_dir, "sglang"),
        specs,
        connect_host=connect_host,
        ready_path="/health_generate",
        startup_timeout_s=startup_timeout_s,
        poll_s=5.0,
    )


def launch_simulators(
    count: int,
    run_dir: Path,
    options: Mapping[str, Any] | Sequence[Mapping[str, Any]] = (),
    *,
    ports: Sequence[int] | None = None,
    host: str = LOOPBACK,
    tokenizer: str | None = None,
    startup_timeout_s: float = 60.0,
    python: str = sys.executable,
) -> Fleet:
    """`count` simulator processes with the same pid file, logs and readiness checks as real servers.

    `options` holds SimConfig fields for every server, or one mapping per server. The tokenizer is read
    once here and shared with the servers as a small vocabulary file, so they start in well under a second.
    """
    from dagster_project.sglang.sim.server import load_sim_vocab

    run_dir = Path(run_dir)
    _prepare(run_dir)
    per_server = [dict(options)] * count if isinstance(options, Mapping) else [dict(o) for o in options] or [{}] * count
    if len(per_server) != count:
        raise ValueError(f"{len(per_server)} option sets for {count} simulators")
    ports = list(ports) if ports is not None else free_ports(count, host)
    vocab_file = load_sim_vocab(tokenizer).save(run_dir / SIM_VOCAB_FILE)
    specs = []
    for index, (port, opts) in enumerate(zip(ports, per_server)):
        secrets = _secrets_config(run_dir, f"sim{index}", opts.get("api_key"))
        flags = {name: value for name, value in opts.items() if name != "api_key"}
        command = simulator_command(port, flags, vocab_file=vocab_file, host=host, python=python, config_file=secrets)
        specs.append((f"sim{index}", port, command, server_environment(), None))
    return _start(
        Fleet(run_dir, "simulator"),
        specs,
        connect_host=host,
        ready_path="/health",
        startup_timeout_s=startup_timeout_s,
        poll_s=0.05,
    )


def _secrets_config(run_dir: Path, name: str, api_key: str | None) -> str | None:
    return str(write_secrets_config(run_dir / f"{name}{SECRETS_SUFFIX}", api_key)) if api_key else None


def stop_fleet(run_dir: Path, timeout_s: float = 30.0) -> list[str]:
    """Stop every server recorded in `run_dir` (SIGTERM, then SIGKILL); returns the names stopped."""
    fleet = Fleet.load(Path(run_dir))
    if fleet is None:
        return []
    stopped = _terminate(fleet.members, timeout_s)
    fleet.pid_file.unlink(missing_ok=True)
    return stopped


# ---- connect mode and status -------------------------------------------------------------------------------------


def connect(endpoints: Sequence[str] | str | None = None, router_url: str | None = None) -> list[str]:
    """Normalized endpoint URLs: the given servers (any hosts), or one router URL. Nothing is started."""
    if (endpoints is None) == (router_url is None):
        raise ValueError("give either endpoints or router_url")
    urls = (
        [router_url]
        if router_url is not None
        else endpoints.split(",")
        if isinstance(endpoints, str)
        else list(endpoints)
    )
    normalized = []
    for url in (u.strip() for u in urls if u.strip()):
        normalized.append((url if "://" in url else f"http://{url}").rstrip("/"))
    if not normalized:
        raise ValueError("no endpoint given")
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"duplicate endpoints in {normalized}")
    return normalized


async def probe_endpoints(urls: Sequence[str], api_key: str | None = None, timeout_s: float = 5.0) -> list[dict]:
    """Live state of each endpoint: health, the model it serves (`/server_info`'s names of it, under their keys there:
    `model_identity.serves_other_model` judges a probe), speculative decoding, its running cap, load (`/metrics`)."""
    from dagster_project.sglang.client import SGLangClient, SGLangError, new_session

    async with new_session() as session:

        async def probe(url: str) -> dict:
            client = SGLangClient(url, api_key=api_key, session=session, probe_timeout_s=timeout_s)
            status: dict[str, Any] = {"url": url, "healthy": await client.health()}
            try:
                info = await client.server_info()
                states = info.get("internal_states") or [{}]
                status |= {name: info.get(name) for name in MODEL_NAME_FIELDS}
                status["speculative_algorithm"] = info.get("speculative_algorithm")
                status["max_running_requests_flag"] = info.get("max_running_requests")
                # The real cap: the mamba state pool can lower it below the flag, and only
                # internal_states shows it.
                status["max_running_requests"] = states[0].get("effective_max_running_requests_per_dp")
                status["avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
                status["last_gen_throughput"] = states[0].get("last_gen_throughput")
                # What `capacity.analyze` needs to say what binds the cap and what would raise it.
                status["server_info"] = capacity.capacity_fields(info)
            except SGLangError as error:
                status["error"] = str(error)
            with contextlib.suppress(SGLangError):
                metrics = parse_metrics(await client.metrics())
                for key, name in _PROBED_METRICS.items():
                    status[key] = metrics.get(name)
            return status

        return list(await asyncio.gather(*(probe(url) for url in urls)))


_PROBED_METRICS = {
    "running": "sglang:num_running_reqs",
    "queued": "sglang:num_queue_reqs",
    "token_usage": "sglang:token_usage",  # the fuller of the two pools: KV tokens or mamba state slots
    "kv_usage": "sglang:full_token_usage",  # the KV pool's own
    "mamba_usage": "sglang:mamba_usage",
    "spec_accept_length": "sglang:spec_accept_length",
    "gen_throughput": "sglang:gen_throughput",
    "generation_tokens_total": "sglang:generation_tokens_total",
}


def fleet_status(urls: Sequence[str], api_key: str | None = None, timeout_s: float = 5.0) -> list[dict]:
    """Blocking `probe_endpoints`, for the CLI."""
    return asyncio.run(probe_endpoints(urls, api_key, timeout_s))
