"""`dflash fleet up|down|status|forget|router`: this node's SGLang servers or simulators, and the store's fleet
registry; and the `--sim-option` settings of the simulators `fleet up` and `tune` start."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster_project import settings
from dagster_project.cli.common import add_flags, given_flags, known_fleet_endpoints, open_configured_store
from dagster_project.store.storage import Store, StoreError

if TYPE_CHECKING:
    from dagster_project.sglang import launch


# What `fleet up --simulate` starts unless told otherwise: thinking-shaped ~300-token answers, MTP on,
# a server-side cap of 16 running requests with a queue behind it, metrics on.
DEMO_SIMULATOR = {
    "enable_metrics": True,
    "max_running_requests": 16,
    "output_len": "lognormal:300:0.6",
    "decode_step_s": 0.004,
    "ttft_s": 0.02,
}


# Simulator settings a launch sets itself: the port of each, and the key (from SGLANG_API_KEY).
_SIM_OPTIONS_SET_BY_LAUNCH = {"port", "api_key"}


def _simulator_defaults() -> dict[str, Any]:
    """Every `--sim-option` NAME and what a simulator launched by `fleet up --simulate` starts with."""
    from dagster_project.sglang.sim.config import SimConfig

    defaults = {f.name: getattr(SimConfig(), f.name) for f in dataclasses.fields(SimConfig)}
    return {
        name: value for name, value in {**defaults, **DEMO_SIMULATOR}.items() if name not in _SIM_OPTIONS_SET_BY_LAUNCH
    }


def sim_option_help() -> str:
    listed = ", ".join(f"{name}={json.dumps(value)}" for name, value in _simulator_defaults().items())
    return f"a simulator setting (repeat for several); NAME=its default: {listed}"


def parse_sim_options(pairs: list[str], defaults: dict | None = None) -> dict:
    options = dict(DEMO_SIMULATOR if defaults is None else defaults)
    known = _simulator_defaults()
    for pair in pairs:
        name, _, value = pair.partition("=")
        name = name.replace("-", "_")
        if not value or name not in known:
            raise SystemExit(f"--sim-option wants NAME=VALUE with NAME one of {', '.join(known)}; got {pair!r}")
        try:
            options[name] = json.loads(value)  # numbers, true/false, lists, objects
        except json.JSONDecodeError:
            options[name] = value  # plain strings such as lognormal:300:0.6
    return options


def job_simulator_options(pairs: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """What simulators started for this job (`fleet up --simulate`, `tune --simulate`) run with: their `SimConfig`
    options (the `--sim-option` pairs over the demo's), and the `launch_simulators` arguments. Both serve the job's
    model (`DFLASH_TOKENIZER`, `DFLASH_SERVED_MODEL`): its name, its tokenizer's vocabulary and text, no reasoning
    parser unless its template reasons."""
    from dagster_project.sglang import launch_plan
    from dagster_project.sglang.sim.config import serving_options

    given = parse_sim_options(pairs, defaults={})
    options = parse_sim_options(pairs)
    if "gpu_memory_gb" in given and not set(given) & set(launch_plan.SIM_CAPACITY_OPTIONS):
        options.pop("max_running_requests", None)  # a memory model and no cap given: the plan sets it
    if settings.builtin_model():
        return options, {}
    options.update(serving_options(settings.tokenizer_name(), settings.served_model(), settings.served_architecture()))
    return options, {"tokenizer": settings.tokenizer_name()}


def cmd_fleet_up(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation import fleet_registry
    from dagster_project.sglang import launch, launch_plan

    fleet = resources.fleet
    run_dir = Path(fleet.fleet_dir)
    # The store the servers are registered in, opened and read before anything starts: a DFLASH_STORE that cannot
    # work stops here in one line, not after paid servers are up.
    store = open_configured_store()
    next(store.list(fleet_registry.FLEET_PREFIX), None)  # one listing: a bucket or credentials that cannot work
    target = launch_plan.CapacityTarget(**given_flags(args, launch_plan.CapacityTarget))
    if args.simulate:
        options, served = job_simulator_options(args.sim_option)
        if fleet.api_key:  # simulators guard their routes like servers started with --api-key
            options["api_key"] = fleet.api_key
        options, plan = launch_plan.plan_simulators(options, target)
        print(launch_plan.describe_plan(plan), flush=True)
        listen = getattr(args, "host", launch.LOOPBACK)
        _warn_if_exposed(launch.exposure_warning(listen, fleet.api_key))
        up = launch.launch_simulators(args.simulate, run_dir, options, **served, **given_flags(args, {"host"}))
    else:
        if not args.gpus and not getattr(args, "cpu", False):
            raise SystemExit("fleet up needs --gpus 0,1,... (real servers), --cpu (one CPU server) or --simulate N")
        try:
            options = launch.ServerOptions(
                **given_flags(args, launch.ServerOptions), api_key=fleet.api_key, extra_args=tuple(args.extra_arg)
            )
        except ValueError as exc:
            raise SystemExit(f"fleet up: {exc}") from None
        gpus = [int(g) for g in (args.gpus or "0").split(",")]
        if options.cpu:  # no GPU memory to plan for: the KV pool is --max-total-tokens, the cap SGLang's own
            plan = None
        else:
            options, plan = launch_plan.plan_capacity(options, target, launch_plan.fleet_gpu(gpus, target))
        print(launch_plan.describe_plan(plan), flush=True)
        listen = options.host
        _warn_if_exposed(launch.exposure_warning(listen, fleet.api_key))
        up = launch.launch_fleet(gpus, run_dir, options, **given_flags(args, LAUNCH_FLAGS))
    try:  # from here on, a failure stops the servers this command started: none is left running unregistered
        print(f"fleet up ({up.kind}): {', '.join(up.urls)}; record and logs in {run_dir}")
        # The cap each server computed, next to the plan's: a server that found other memory says so here.
        for line in launch_plan.capacity_report(up.urls, plan, target, api_key=fleet.api_key):
            print(f"  {line}")
        _register(args, resources, up, store, listen)
    except BaseException:
        stopped = launch.stop_fleet(run_dir)
        print(f"fleet up failed: stopped the servers it started ({', '.join(stopped) or 'none left'})", file=sys.stderr)
        raise
    return 0


def cmd_fleet_down(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation import fleet_life, fleet_registry
    from dagster_project.sglang import launch

    stopped = launch.stop_fleet(Path(resources.fleet.fleet_dir))
    print(f"stopped {', '.join(stopped) or 'nothing (no fleet recorded)'}")
    try:
        store = resources.store.open()
        fleet_life.close_lives(store, args.node)  # what the GPUs cost stays known: their life ends now
        if fleet_registry.deregister_node(store, args.node):
            print(f"node {args.node} removed from the fleet registry")
    except StoreError as exc:  # the servers are stopped; the record stays until a `fleet down` reaches the store
        print(f"node {args.node} could not be removed from the fleet registry: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_fleet_forget(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation import fleet_life, fleet_registry

    store = open_configured_store()
    fleet_life.close_lives(store, args.node)  # a lost node's GPUs are counted up to now, no further
    removed = fleet_registry.deregister_node(store, args.node)
    print(f"node {args.node} {'removed from' if removed else 'was not in'} the fleet registry")
    return 0


def cmd_fleet_status(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.terminal import fleet_table
    from dagster_project.sglang import launch

    # Read from the settings, not the fleet resource: no Dagster import, so a node without a fleet hears it at once.
    fleet_dir = settings.fleet_dir()
    endpoints = known_fleet_endpoints(open_configured_store())
    if not endpoints:
        # On stderr: `--json` prints nothing (no server, no line), so what reads it sees an empty fleet.
        print(
            f"no fleet: no node registered in the store, nothing recorded in {fleet_dir}, no endpoints "
            "configured (DFLASH_SGLANG_ENDPOINTS, DFLASH_SGLANG_ROUTER)",
            file=sys.stderr,
        )
        return 1
    probes = launch.fleet_status(endpoints, api_key=os.environ.get("SGLANG_API_KEY") or None)
    if args.json:
        for server in probes:
            print(json.dumps(server))
    else:
        local = launch.Fleet.load(fleet_dir)
        pids = {member.port: member.pid for member in local.members} if local else {}
        print(fleet_table(probes, pids, served_model=settings.served_model()))
    return 0


def cmd_fleet_router(args: argparse.Namespace, resources: Any) -> int:
    """The sglang-router command for the registry's live servers, and what points the pipeline at it. The router
    does not follow the registry: print and restart it when nodes join or leave."""
    from dagster_project.generation import fleet_registry
    from dagster_project.sglang import launch

    workers = fleet_registry.registered_endpoints(resources.store.open(), resources.fleet.stale_node_after_s)
    if not workers:
        print("no live node in the fleet registry: run `dflash fleet up` on the GPU nodes first", file=sys.stderr)
        return 1
    print(
        shlex.join(
            launch.router_command(workers, host="0.0.0.0", port=args.router_port, metrics_port=args.router_metrics_port)
        )
    )
    print(
        f"# then, for the pipeline: DFLASH_SGLANG_ROUTER=http://<this host>:{args.router_port}, and the fleet "
        f"resource's router_workers: {json.dumps(workers)}",
        file=sys.stderr,
    )
    return 0


def _warn_if_exposed(warning: str | None) -> None:
    if warning:
        print(f"\n{warning}\n", file=sys.stderr, flush=True)


def _register(args: argparse.Namespace, resources: Any, up: launch.Fleet, store: Store, listen: str) -> None:
    """Record this node's servers in the store's fleet registry, where shard runs on every host find them, and
    the start of their life with the price configured here (what `dflash status` counts as spent). The caller
    stops the servers if this fails."""
    from dagster_project.generation import fleet_life, fleet_registry
    from dagster_project.sglang import launch

    caps = {
        s["url"]: s.get("max_running_requests") for s in launch.fleet_status(up.urls, api_key=resources.fleet.api_key)
    }
    # Servers are reached where they listen; those listening on every interface by this host's name.
    advertise = args.advertise_host or (socket.getfqdn() if listen == launch.EVERY_INTERFACE else listen)
    servers = fleet_registry.fleet_servers(up, advertise, caps)
    try:
        record = fleet_registry.register_node(store, args.node, up.kind, servers)
    except fleet_registry.RegistryError as exc:
        raise SystemExit(f"fleet up: {exc}; the servers were stopped") from None
    key = store.url(fleet_registry.node_key(record.node))
    print(f"registered node {record.node} ({', '.join(record.urls)}) in {key}")
    price = resources.fleet.cost_per_gpu_hour
    fleet_life.record_fleet_up(store, record.node, up.kind, len(up.members), price)
    print(f"  its {len(up.members)} GPUs are counted from now at {f'${price:,.2f}/GPU-hour' if price else 'no price'}")


# `fleet up` flags passed to launch_fleet, when given; its own defaults apply otherwise.
LAUNCH_FLAGS = {"base_port", "startup_timeout_s", "python"}


def fleet_flags(fleet: argparse.ArgumentParser) -> None:
    from dagster_project.sglang import launch, launch_plan

    actions = fleet.add_subparsers(dest="action", required=True, metavar="ACTION")
    node = {
        "default": os.environ.get("DFLASH_NODE") or socket.gethostname(),
        "help": "this node's name in the store's fleet registry, fleet/<node>.json (default: $DFLASH_NODE or the "
        "host name)",
    }
    up = actions.add_parser(
        "up",
        help="start this node's servers (--gpus) or simulators (--simulate) and register them in the store",
        description="Start one SGLang server per GPU (or N simulators), sized for the expected request, wait until "
        "they answer, and register them in the store's fleet registry where shard runs on every host find them. "
        "Refused while a fleet started from this node's work directory still runs: `dflash fleet down` first.",
    )
    up.add_argument("--simulate", type=int, metavar="N", help="start N SGLang-protocol simulators instead of servers")
    up.add_argument("--sim-option", action="append", default=[], metavar="NAME=VALUE", help=sim_option_help())
    up.add_argument("--gpus", help="comma-separated GPU indices: one server per GPU")
    add_flags(up, launch.ServerOptions, skip={"api_key", "extra_args"}, aliases={"model_path": ["--model"]})
    add_flags(up, launch_plan.CapacityTarget)
    up.add_argument(
        "--extra-arg", action="append", default=[], help="passed to sglang.launch_server as is (repeat for several)"
    )
    up.add_argument(
        "--base-port", type=int, default=argparse.SUPPRESS, help="port of the first GPU's server (default 30000)"
    )
    up.add_argument(
        "--startup-timeout-s",
        type=float,
        default=argparse.SUPPRESS,
        help="seconds to wait for every server to answer (default 1800: loading 27B weights takes minutes)",
    )
    up.add_argument(
        "--python",
        default=argparse.SUPPRESS,
        help="the python whose sglang 0.5.23 runs the servers (default: this one), e.g. a separate environment",
    )
    up.add_argument("--node", **node)
    up.add_argument(
        "--advertise-host",
        help="host other nodes reach these servers at (default: the host name; simulators: where they listen)",
    )
    up.set_defaults(func=cmd_fleet_up)

    down = actions.add_parser(
        "down",
        help="stop this node's servers and remove its registry record",
        description="Stop the servers "
        "`fleet up` started from this node's work directory and remove the node's record from the fleet registry.",
    )
    down.add_argument("--node", **node)
    down.set_defaults(func=cmd_fleet_down)

    status = actions.add_parser(
        "status",
        help="probe every known server: pid, address, health, cap, running, queued",
        description="Probe every server the pipeline would use (configured endpoints or router, else the fleet "
        "registry, else this node's fleet) and print one row each; the pid is known for this node's servers.",
    )
    status.add_argument("--json", action="store_true", help="one JSON object per server: everything each reported")
    status.set_defaults(func=cmd_fleet_status)

    forget = actions.add_parser(
        "forget",
        help="remove a lost node's registry record, from any host, stopping nothing",
        description="Remove fleet/<node>.json from the fleet registry: for a node lost without `fleet down`. "
        "Nothing is stopped.",
    )
    forget.add_argument("--node", required=True, help="the node whose record to remove (as `dflash status` names it)")
    forget.set_defaults(func=cmd_fleet_forget)

    router = actions.add_parser(
        "router",
        help="print the sglang-router command in front of every live registered server",
        description="Print the sglang-router command for the registry's live servers, and the settings that point "
        "the pipeline at it. The router does not follow the registry: run it again when nodes join or leave.",
    )
    router.add_argument("--router-port", type=int, default=30000, help="port the router listens on (default 30000)")
    router.add_argument(
        "--router-metrics-port",
        type=int,
        default=29000,
        help="port of the router's Prometheus metrics (default 29000, the router's own)",
    )
    router.set_defaults(func=cmd_fleet_router)
