"""`dflash`: the operator's command line.

dflash status [--json] [--by-id] [--watch N]  the answers: progress, MTP, concurrency, storage, coverage, ...
dflash free-slots RUN_ID...                   give back the pool slots of dead runs (the "pool" alert names them)
dflash fleet up|down|status|forget|router    the SGLang fleet (real servers per GPU, or simulators)
dflash plan --brief | --req-per-s ...         the estimates `status` compares against
dflash plan --shards [--fleet-cap ...]        how many shards keep each run's fixed cost and tail small
dflash tune [--simulate N | --gpus ...]       sweep concurrency (and server settings), find the knee
dflash metrics [--port 9464] [--once]         the same answers as Prometheus gauges, served on /metrics
dflash demo                                   the whole pipeline on the embedded demo (`make demo`)

`dflash COMMAND --help` lists each command's own flags.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import socket
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only what every command needs is imported here: `dflash status` must answer within about a second, and
# Dagster, the SGLang client (aiohttp), pyarrow and boto3 each take a good part of one to import. Each command
# imports what it uses.
from dagster_project import settings
from dagster_project.store import layout
from dagster_project.store.storage import StoreError

if TYPE_CHECKING:
    import dagster as dg

    from dagster_project.sglang import launch
    from dagster_project.store.storage import Store

# What `fleet up --simulate` starts unless told otherwise: thinking-shaped ~300-token answers, MTP on,
# a server-side cap of 16 running requests with a queue behind it, metrics on.
DEMO_SIMULATOR = {
    "enable_metrics": True,
    "max_running_requests": 16,
    "output_len": "lognormal:300:0.6",
    "decode_step_s": 0.004,
    "ttft_s": 0.02,
}


class Resources:
    """The definitions' resources, configured from the environment as the definitions configure them, built when
    a command first asks for one: building them imports Dagster, which `dflash status` does without.

    They are used in this process as they are: Dagster's initialization would build an in-memory instance and
    copy every resource (most of a second of every command) for what this needs of them, `api_key` read from
    the environment (it is never printed). The tokenizer loads when a command first asks for it; the "s3"
    resource's client is never built (the store builds its own from the S3 settings nested in it)."""

    def __getattr__(self, name: str) -> Any:
        from dagster_project.resources import resources_from_env

        self.__dict__.update(resources_from_env(resolve_secrets=True))
        if name not in self.__dict__:
            raise AttributeError(name)
        return self.__dict__[name]


def cmd_free_slots(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.assets.dagster_instance import free_slots, open_instance

    with open_instance("free-slots") as instance:
        for run_id in args.run_ids:
            print(free_slots(instance, run_id))
    return 0


def _open_store() -> Store:
    """The store of `DFLASH_STORE`, opened as the `store` resource opens it with the configuration `dflash` gives
    it (none: the default retry policy, boto3's own settings chain), without building the Dagster resource."""
    from dagster_project.store.storage import RetryPolicy, bounded_client, open_store

    policy = RetryPolicy()
    return open_store(settings.store_uri(), lambda: bounded_client(policy), policy)


def cmd_status(args: argparse.Namespace, resources: Any) -> int:
    if args.watch is not None and (args.json or args.by_id):
        raise SystemExit("dflash status: --watch shows the answers live; give --json or --by-id without it")
    if args.watch is not None and args.watch <= 0:
        raise SystemExit(f"dflash status: --watch wants a positive number of seconds, got {args.watch}")
    store = _open_store()
    with _dagster_side(args.dagster) as instance:
        if args.by_id:
            from dagster_project.conversations.shards import published_num_shards
            from dagster_project.ops.coverage import dataset_coverage, write_coverage

            num_shards = published_num_shards(store)
            if num_shards is None:
                manifest = store.url(layout.stage_manifest_key(layout.CONVERSATIONS))
                raise SystemExit(f"no {manifest}: materialize conversations before asking for coverage by id")
            write_coverage(store, dataset_coverage(store, num_shards))
        if args.watch is not None:
            from dagster_project.ops.terminal import watch

            return watch(lambda: _status_text(store, instance), args.watch, store.uri)
        if args.json:
            status, notes, _ = _read_status(store, instance)
            print(json.dumps(dataclasses.asdict(status), indent=2, default=str))
        else:
            text, notes = _status_text(store, instance)
            print(text)
        for note in notes:
            print(note, file=sys.stderr)
    return 0


@contextlib.contextmanager
def _dagster_side(ask_instance: bool) -> typing.Iterator[dg.DagsterInstance | None]:
    """With `--dagster`, this node's instance; otherwise None: the answers use the view the run_report asset
    recorded in the store, and Dagster is not imported (5-7 CPU-s of a process that takes well under one)."""
    if not ask_instance:
        yield None
        return
    from dagster_project.assets.dagster_instance import open_instance

    with open_instance("status --dagster") as instance:
        yield instance


def _read_status(store: Store, instance: dg.DagsterInstance | None) -> tuple[Any, list[str], Any]:
    """The answers, what was done on the way (Dagster runs marked failed because their process is gone), and
    without an instance the view of Dagster recorded in the store (None when none is)."""
    from dagster_project.generation import fleet_registry
    from dagster_project.ops.answers.cost import FleetCost
    from dagster_project.ops.dagster_view import read_view, view_alerts
    from dagster_project.ops.status import collect_status

    stale_after_s = settings.fleet_stale_after_s()
    router = settings.sglang_router()
    endpoints = fleet_registry.known_endpoints(
        [router] if router else settings.sglang_endpoints(), store, stale_after_s, str(settings.fleet_dir())
    )
    view = None if instance else read_view(store)
    if instance:
        from dagster_project.assets.dagster_instance import materialized_shards

        materialized: set[int] | None = materialized_shards(instance)
    else:
        materialized = set(view.materialized) if view else None
    status = collect_status(
        store,
        endpoints,
        api_key=os.environ.get("SGLANG_API_KEY") or None,
        materialized=materialized,
        cost=FleetCost(cost_per_gpu_hour=settings.cost_per_gpu_hour()),
    )
    _, stale = fleet_registry.live_nodes(store, stale_after_s)
    dead_runs = status.progress.dead_runs
    if instance:
        from dagster_project.assets.dagster_instance import fail_dead_runs, instance_pool_alerts

        marked = fail_dead_runs(instance, dead_runs)
        # After the runs found dead here gave their slots back: what still blocks a run needs the operator.
        dagster_alerts = instance_pool_alerts(instance, dead_runs)
    else:
        marked, dagster_alerts = [], view_alerts(view, dead_runs, status.collected_at)
    status = dataclasses.replace(status, stale_nodes=stale, alerts=[*status.alerts, *dagster_alerts])
    return status, [f"marked Dagster run {run_id} failed: its process is gone" for run_id in marked], view


def _status_text(store: Store, instance: dg.DagsterInstance | None) -> tuple[str, list[str]]:
    from dagster_project.ops.dagster_view import render_view
    from dagster_project.ops.status import render_text

    status, notes, view = _read_status(store, instance)
    first = _what_to_materialize_first(store)
    text = (f"{first}\n\n" if first else "") + render_text(status)
    # With --dagster the storage line's materialized count is the instance's, read now.
    return (text if instance else f"{text}\n{render_view(view, status.collected_at)}"), notes


def cmd_metrics(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.metrics import render_metrics, serve_metrics

    store = _open_store()

    def read() -> Any:
        # Without the Dagster instance: a scrape reads, never marks runs failed (`dflash status --dagster` does).
        return _read_status(store, None)[0]

    if args.once:
        print(render_metrics(read()), end="")
        return 0
    server, thread = serve_metrics(read, args.host, args.port)
    print(f"dflash metrics: serving http://{args.host}:{server.server_port}/metrics for {store.uri}", file=sys.stderr)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _what_to_materialize_first(store: Store) -> str | None:
    """What an operator must materialize before the answers mean anything; None once conversations exist."""
    if store.exists(layout.stage_manifest_key(layout.CONVERSATIONS)):
        return None
    missing = "conversations" if store.exists(layout.stage_manifest_key(layout.RAW_PROMPTS)) else "raw_prompts"
    select = "conversations" if missing == "conversations" else "raw_prompts,conversations"
    return (
        f"NOTHING TO REPORT YET: {store.uri} has no {missing}. Materialize {select.replace(',', ' and ')} first "
        f"(`dagster asset materialize -m dagster_project.definitions --select {select}`, or Materialize in the "
        "UI), start a fleet (`dflash fleet up`), then materialize the completions shards."
    )


# Simulator settings a launch sets itself: the port of each, and the key (from SGLANG_API_KEY).
_SIM_OPTIONS_SET_BY_LAUNCH = {"port", "api_key"}


def _simulator_defaults() -> dict[str, Any]:
    """Every `--sim-option` NAME and what a simulator launched by `fleet up --simulate` starts with."""
    from dagster_project.sglang.sim.config import SimConfig

    defaults = {f.name: getattr(SimConfig(), f.name) for f in dataclasses.fields(SimConfig)}
    return {
        name: value for name, value in {**defaults, **DEMO_SIMULATOR}.items() if name not in _SIM_OPTIONS_SET_BY_LAUNCH
    }


def _sim_option_help() -> str:
    listed = ", ".join(f"{name}={json.dumps(value)}" for name, value in _simulator_defaults().items())
    return f"a simulator setting (repeat for several); NAME=its default: {listed}"


def _parse_sim_options(pairs: list[str], defaults: dict | None = None) -> dict:
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


def cmd_fleet_up(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.sglang import launch

    fleet = resources.fleet
    run_dir = Path(fleet.fleet_dir)
    target = launch.CapacityTarget(**_given(args, launch.CapacityTarget))
    if args.simulate:
        given = _parse_sim_options(args.sim_option, defaults={})
        options = _parse_sim_options(args.sim_option)
        if "gpu_memory_gb" in given and not set(given) & set(launch.SIM_CAPACITY_OPTIONS):
            options.pop("max_running_requests", None)  # a memory model and no cap given: the plan sets it
        if fleet.api_key:  # simulators guard their routes like servers started with --api-key
            options["api_key"] = fleet.api_key
        options, plan = launch.plan_simulators(options, target)
        print(launch.describe_plan(plan), flush=True)
        up = launch.launch_simulators(args.simulate, run_dir, options, **_given(args, {"host"}))
    else:
        if not args.gpus:
            raise SystemExit("fleet up needs --gpus 0,1,... (real servers) or --simulate N")
        options = launch.ServerOptions(
            **_given(args, launch.ServerOptions), api_key=fleet.api_key, extra_args=tuple(args.extra_arg)
        )
        gpus = [int(g) for g in args.gpus.split(",")]
        options, plan = launch.plan_capacity(options, target, launch.fleet_gpu(gpus, target))
        print(launch.describe_plan(plan), flush=True)
        up = launch.launch_fleet(gpus, run_dir, options, **_given(args, LAUNCH_FLAGS))
    print(f"fleet up ({up.kind}): {', '.join(up.urls)}; record and logs in {run_dir}")
    # The cap each server computed, next to the plan's: a server that found other memory says so here.
    for line in launch.capacity_report(up.urls, plan, target, api_key=fleet.api_key):
        print(f"  {line}")
    _register(args, resources, up)
    return 0


def cmd_fleet_down(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation import fleet_registry
    from dagster_project.sglang import launch

    stopped = launch.stop_fleet(Path(resources.fleet.fleet_dir))
    print(f"stopped {', '.join(stopped) or 'nothing (no fleet recorded)'}")
    try:
        if fleet_registry.deregister_node(resources.store.open(), args.node):
            print(f"node {args.node} removed from the fleet registry")
    except StoreError as exc:  # the servers are stopped; the record stays until a `fleet down` reaches the store
        print(f"node {args.node} could not be removed from the fleet registry: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_fleet_forget(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation import fleet_registry

    removed = fleet_registry.deregister_node(_open_store(), args.node)
    print(f"node {args.node} {'removed from' if removed else 'was not in'} the fleet registry")
    return 0


def cmd_fleet_status(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.terminal import fleet_table
    from dagster_project.sglang import launch

    fleet = resources.fleet
    endpoints = fleet.known_endpoints(resources.store.open())
    if not endpoints:
        print(
            f"no fleet: no node registered in the store, nothing recorded in {fleet.fleet_dir}, no endpoints "
            "configured (DFLASH_SGLANG_ENDPOINTS, DFLASH_SGLANG_ROUTER)",
            file=sys.stderr,
        )
        return 1
    probes = launch.fleet_status(endpoints, api_key=fleet.api_key)
    if args.json:
        for server in probes:
            print(json.dumps(server))
    else:
        local = launch.Fleet.load(Path(fleet.fleet_dir))
        print(fleet_table(probes, {member.port: member.pid for member in local.members} if local else {}))
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
    print(shlex.join(launch.router_command(workers, host="0.0.0.0", port=args.router_port)))
    print(
        f"# then, for the pipeline: DFLASH_SGLANG_ROUTER=http://<this host>:{args.router_port}, and the fleet "
        f"resource's router_workers: {json.dumps(workers)}",
        file=sys.stderr,
    )
    return 0


def _register(args: argparse.Namespace, resources: Any, up: launch.Fleet) -> None:
    """Record this node's servers in the store's fleet registry, where shard runs on every host find them."""
    from dagster_project.generation import fleet_registry
    from dagster_project.sglang import launch

    caps = {
        s["url"]: s.get("max_running_requests") for s in launch.fleet_status(up.urls, api_key=resources.fleet.api_key)
    }
    # Simulators are reached where they listen; real servers listen on every interface, reached by host name.
    advertise = args.advertise_host or (getattr(args, "host", None) if up.kind == "simulator" else None)
    servers = fleet_registry.fleet_servers(up, advertise or _default_advertise_host(up), caps)
    store = resources.store.open()
    try:
        record = fleet_registry.register_node(store, args.node, up.kind, servers)
    except fleet_registry.RegistryError as exc:
        launch.stop_fleet(Path(resources.fleet.fleet_dir))
        raise SystemExit(f"fleet up: {exc}; the servers were stopped") from None
    key = store.url(fleet_registry.node_key(record.node))
    print(f"registered node {record.node} ({', '.join(record.urls)}) in {key}")


def _default_advertise_host(up: launch.Fleet) -> str:
    return "127.0.0.1" if up.kind == "simulator" else socket.getfqdn()


def _sweeps(pairs: list[str], allowed: set[str] | None) -> dict[str, list[Any]]:
    """`--sweep NAME=V1,V2`: the values each swept option takes (JSON where it parses: numbers, true/false)."""
    sweeps: dict[str, list[Any]] = {}
    for pair in pairs:
        name, _, values = pair.partition("=")
        name = name.replace("-", "_")
        if not values or (allowed is not None and name not in allowed):
            raise SystemExit(f"--sweep wants NAME=V1,V2,... with NAME one of {sorted(allowed or [])}, got {pair!r}")
        sweeps[name] = [_json_or_text(value) for value in values.split(",")]
    return sweeps


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _launch_flag(name: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [_flag(name)] if value else []
    return [_flag(name), str(value)]


def cmd_tune(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops import tune
    from dagster_project.sglang import launch

    options = tune.TuneOptions(**_given(args, tune.TuneOptions))
    store = resources.store.open()
    settings = resources.generation.to_dataclass()
    if options.synthetic_prompt_tokens:
        prompts = tune.synthetic_prompts(options.sample, options.synthetic_prompt_tokens, options.seed)
        source = f"synthetic, {options.synthetic_prompt_tokens} tokens each"
    else:
        prompts = tune.conversation_prompts(store, resources.tokenizer.load(), settings, options.sample, options.seed)
        source = "published conversations, first turns rendered as generation renders them"
    params = tune.request_params(settings, options)
    target = launch.CapacityTarget(**_given(args, launch.CapacityTarget))
    fleet = resources.fleet
    endpoints: list[str] = []
    launcher = None
    if args.simulate:
        given = _parse_sim_options(args.sim_option, defaults={})
        base = _parse_sim_options(args.sim_option)
        if "gpu_memory_gb" in given and not set(given) & set(launch.SIM_CAPACITY_OPTIONS):
            base.pop("max_running_requests", None)
        settings_grid = tune.launch_settings_grid(_sweeps(args.sweep, None), _launch_flag)
        launcher = _simulator_launcher(args.simulate, Path(fleet.fleet_dir).with_name("tune-fleet"), base, target)
    elif args.gpus:
        base_options = launch.ServerOptions(
            **_given(args, launch.ServerOptions), api_key=fleet.api_key, extra_args=tuple(args.extra_arg)
        )
        allowed = {f.name for f in dataclasses.fields(launch.ServerOptions)} - {"api_key", "extra_args"}
        settings_grid = tune.launch_settings_grid(_sweeps(args.sweep, allowed), _launch_flag)
        gpus = [int(g) for g in args.gpus.split(",")]
        launcher = _gpu_launcher(gpus, Path(fleet.fleet_dir), base_options, target)
    else:
        if args.sweep:
            raise SystemExit("--sweep restarts servers: give --simulate N or --gpus to tune in launch mode")
        endpoints = launch.connect(args.endpoints) if args.endpoints else fleet.known_endpoints()
        if not endpoints:
            raise SystemExit("nothing to tune: no --endpoints, no fleet recorded; or launch with --simulate/--gpus")
        settings_grid = []
    report = tune.sweep(
        settings_grid,
        prompts,
        params,
        options,
        endpoints=endpoints,
        launcher=launcher,
        api_key=fleet.api_key,
        prompts_source=source,
    )
    out = Path(args.out) if args.out else Path(resources.store.local_dir()) / "tune"
    written = tune.write_local(report, out)
    tune.write_report(store, report)
    print(report.recommendation)
    if report.recommended_flags:
        print(f"recommended flags: {' '.join(report.recommended_flags)}")
    print(f"report: {written} (chart beside it); in the store: {store.url(tune.REPORT_KEY)}")
    return 0


def _launcher(run_dir: Path, plan: Any, start: Any) -> Any:
    """A context manager per sweep setting: plan the servers for it, start them, yield their URLs, stop them."""
    from dagster_project.sglang import launch

    @contextlib.contextmanager
    def serve(setting: Any) -> Any:
        options, launch_plan = plan(setting)
        print(f"tune [{setting.label}]: {launch.describe_plan(launch_plan)}", flush=True)
        fleet = start(options)
        try:
            yield fleet.urls
        finally:
            launch.stop_fleet(run_dir)

    return serve


def _simulator_launcher(count: int, run_dir: Path, base: dict, target: Any) -> Any:
    from dagster_project.sglang import launch

    return _launcher(
        run_dir,
        lambda setting: launch.plan_simulators({**base, **setting.options}, target),
        lambda options: launch.launch_simulators(count, run_dir, options),
    )


def _gpu_launcher(gpus: list[int], run_dir: Path, base: Any, target: Any) -> Any:
    from dagster_project.sglang import launch

    # The fleet's own run directory: a fleet already running on these GPUs is refused, not doubled.
    return _launcher(
        run_dir,
        lambda setting: launch.plan_capacity(
            dataclasses.replace(base, **setting.options), target, launch.fleet_gpu(gpus, target)
        ),
        lambda options: launch.launch_fleet(gpus, run_dir, options),
    )


def cmd_plan(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.plan import BRIEF_PLAN, Plan, ShardSizing, advise_shards, read_plan, write_plan

    if args.shards:
        print(advise_shards(ShardSizing(**_given(args, ShardSizing))))
        return 0
    store = _open_store()  # without the Dagster resources: nothing else here needs them
    if args.show:
        recorded = read_plan(store)
        print(json.dumps(dataclasses.asdict(recorded) if recorded else None, indent=2))
        return 0
    if args.brief:
        plan = BRIEF_PLAN
    else:
        given = {"source": "operator estimate", **_given(args, Plan)}
        missing = [
            _flag(f.name) for f in dataclasses.fields(Plan) if f.default is dataclasses.MISSING and f.name not in given
        ]
        if missing:
            raise SystemExit(f"plan needs --brief, or {', '.join(missing)}")
        plan = Plan(**given)
    write_plan(store, plan)
    print(f"plan written to {store.url('plan.json')}: {plan}")
    print(plan.cost_summary())
    return 0


def cmd_demo(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.demo import run_demo

    return run_demo(Path.cwd())


# `fleet up` flags passed to launch_fleet, when given; its own defaults apply otherwise.
LAUNCH_FLAGS = {"base_port", "startup_timeout_s"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_flags(
    parser: argparse.ArgumentParser,
    options: type,
    skip: set[str] = frozenset(),
    aliases: dict[str, list[str]] | None = None,
) -> None:
    """One flag per field of dataclass `options`, typed like it. A flag left out stays out of the parsed
    arguments, so the dataclass's own default applies (`_given`)."""
    types = typing.get_type_hints(options)
    for option in dataclasses.fields(options):
        if option.name in skip:
            continue
        flags = [_flag(option.name), *(aliases or {}).get(option.name, [])]
        # The flag's type is the field's, without the None of an optional one (`int | None` → int); a list
        # of ints is given comma-separated.
        hint = types[option.name]
        kind = (
            _comma_ints
            if typing.get_origin(hint) is list
            else next(t for t in typing.get_args(hint) or [hint] if t is not type(None))
        )
        help_ = option.metadata.get("help")
        if kind is bool:
            parser.add_argument(*flags, dest=option.name, action="store_true", default=argparse.SUPPRESS, help=help_)
        else:
            shown = option.default not in (dataclasses.MISSING, None) and "default" not in (help_ or "")
            help_ = f"{help_} (default: {option.default})" if help_ and shown else help_
            parser.add_argument(*flags, dest=option.name, type=kind, default=argparse.SUPPRESS, help=help_)


def _comma_ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def _given(args: argparse.Namespace, names: type | set[str]) -> dict[str, Any]:
    """The flags given on the command line among `names` (a set, or a dataclass's fields)."""
    if dataclasses.is_dataclass(names):
        names = {option.name for option in dataclasses.fields(names)}
    return {name: value for name, value in vars(args).items() if name in names}


def _status_flags(status: argparse.ArgumentParser) -> None:
    status.add_argument("--json", action="store_true", help="print the answers as JSON (machine-readable), once")
    status.add_argument(
        "--by-id",
        action="store_true",
        help="first recompute coverage by id across every shard (reads every shard's ids: minutes at full scale)",
    )
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=10.0,
        metavar="SECONDS",
        help="a live view in the terminal, read again every SECONDS (default 10); Ctrl-C leaves it",
    )
    status.add_argument(
        "--dagster",
        action="store_true",
        help="ask this node's Dagster instance (DAGSTER_HOME) now, rather than show what the run_report asset "
        "recorded at its last refresh: which shards it materialized, runs waiting on pool slots that dead runs "
        "hold; and mark the runs found dead failed and free their pool slots (imports Dagster: several seconds)",
    )
    status.set_defaults(func=cmd_status)


def _free_slots_flags(free_slots: argparse.ArgumentParser) -> None:
    free_slots.add_argument(
        "run_ids", nargs="+", metavar="RUN_ID", help="the Dagster run ids holding the slots (the alert names them)"
    )
    free_slots.set_defaults(func=cmd_free_slots)


def _fleet_flags(fleet: argparse.ArgumentParser) -> None:
    from dagster_project.sglang import launch

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
    up.add_argument("--sim-option", action="append", default=[], metavar="NAME=VALUE", help=_sim_option_help())
    up.add_argument("--gpus", help="comma-separated GPU indices: one server per GPU")
    _add_flags(up, launch.ServerOptions, skip={"api_key", "extra_args"}, aliases={"model_path": ["--model"]})
    _add_flags(up, launch.CapacityTarget)
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
    router.set_defaults(func=cmd_fleet_router)


def _tune_flags(tune: argparse.ArgumentParser) -> None:
    from dagster_project.ops.tune import TuneOptions
    from dagster_project.sglang import launch

    tune.add_argument("--endpoints", help="servers to tune (default: the recorded fleet or DFLASH_SGLANG_ENDPOINTS)")
    tune.add_argument("--simulate", type=int, metavar="N", help="launch N simulators per server setting")
    tune.add_argument("--sim-option", action="append", default=[], metavar="NAME=VALUE", help=_sim_option_help())
    tune.add_argument("--gpus", help="launch one SGLang server per GPU per server setting (stop the fleet first)")
    tune.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a server option to sweep in launch mode (several: every combination), e.g. max_running_requests=48,69",
    )
    _add_flags(tune, TuneOptions)
    _add_flags(tune, launch.ServerOptions, skip={"api_key", "extra_args"}, aliases={"model_path": ["--model"]})
    _add_flags(tune, launch.CapacityTarget)
    tune.add_argument(
        "--extra-arg", action="append", default=[], help="passed to sglang.launch_server as is (repeat for several)"
    )
    tune.add_argument("--out", help="directory for report.json, report.md and throughput.svg (default: work dir)")
    tune.set_defaults(func=cmd_tune)


def _plan_flags(plan: argparse.ArgumentParser) -> None:
    from dagster_project.ops.plan import BRIEF_PLAN, Plan, ShardSizing

    plan.add_argument(
        "--brief",
        action="store_true",
        help=f"record the planned figures of the reference run ({BRIEF_PLAN.prompts:,} prompts on "
        f"{BRIEF_PLAN.gpus} GPUs: {BRIEF_PLAN.req_per_s} req/s, {BRIEF_PLAN.avg_output_tokens:,.0f} output tokens "
        f"per answer, {BRIEF_PLAN.output_tok_per_s:,.0f} tok/s, ${BRIEF_PLAN.cost_per_hour:.0f}/hour)",
    )
    plan.add_argument("--show", action="store_true", help="print the plan recorded in the store, change nothing")
    _add_flags(plan, Plan, skip={"source"})
    plan.add_argument("--shards", action="store_true", help="how many shards to use (the flags below; nothing written)")
    _add_flags(plan, ShardSizing)
    plan.set_defaults(func=cmd_plan)


def _metrics_flags(metrics: argparse.ArgumentParser) -> None:
    from dagster_project.ops.metrics import DEFAULT_PORT

    metrics.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    metrics.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the port to serve /metrics on (default {DEFAULT_PORT}; 0: any)"
    )
    metrics.add_argument(
        "--once", action="store_true", help="print the metrics once in Prometheus' text format; serve nothing"
    )
    metrics.set_defaults(func=cmd_metrics)


def _demo_flags(demo: argparse.ArgumentParser) -> None:
    demo.set_defaults(func=cmd_demo)


# Per command: its one-line help, its description, and what adds its flags (imported only for the command run).
COMMANDS: dict[str, tuple[str, str | None, Callable[[argparse.ArgumentParser], None]]] = {
    "status": (
        "the operator's answers: progress, MTP, concurrency, storage, coverage, multi-turn, cost, alerts",
        "Read the store (heartbeats, manifests, the plan) and probe the fleet; print every answer with its alerts. "
        "With DAGSTER_HOME, also compare with the shards Dagster materialized and mark failed the runs whose "
        "process is gone.",
        _status_flags,
    ),
    "free-slots": (
        "give back the concurrency-pool slots of dead runs (marks a run still STARTED failed)",
        "A run killed while it held a slot of a pool (`sglang_fleet`) never gives it back, and runs queued behind "
        "it wait forever; `dflash status` and the run_report page name such runs in a `pool` alert. Dagster 1.13 "
        "has no command for it (only its UI's pool page, under Deployment > Concurrency). Needs DAGSTER_HOME.",
        _free_slots_flags,
    ),
    "fleet": (
        "start, stop or inspect the SGLang fleet",
        "`dflash fleet ACTION --help` lists each action's flags.",
        _fleet_flags,
    ),
    "tune": (
        "sweep client concurrency (and, launching servers, their settings); find the knee",
        "Measure output tok/s, accept length, TTFT and latency per client concurrency on a sample of the real "
        "prompts, find the knee (the least concurrency within --knee-fraction of the best, on a curve fitted to "
        "the points; printed with its interval) and recommend launch "
        "flags. Without --simulate/--gpus it tunes the running fleet as it is.",
        _tune_flags,
    ),
    "plan": (
        "record the estimates the run is compared against, or size the shards",
        "Record the plan (--brief, or --req-per-s, --avg-output-tokens and --output-tok-per-s) in the store's "
        "plan.json, which `dflash status` compares the run against; --show prints it; --shards advises a shard "
        "count and writes nothing.",
        _plan_flags,
    ),
    "metrics": (
        "serve the status answers as Prometheus metrics (events, ETA, accept length, servers, shards, cost)",
        "Serve /metrics for Prometheus: each scrape reads the store and probes the fleet as `dflash status` does "
        "(without the Dagster instance) and exports its figures as dflash_* gauges.",
        _metrics_flags,
    ),
    "demo": (
        "run the whole pipeline on the embedded demo (deletes ./.demo/ first)",
        "Run every stage on the embedded demo data against 2 simulators, through `dagster asset materialize` in "
        "the instance under ./.dagster_home (kept: `make dev` shows its runs). It first stops a demo fleet left "
        "running and DELETES ./.demo/ (the demo's store and work directory, the store `make dev` shows).",
        _demo_flags,
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command`, only that command's flags are added (the others import what they describe)."""
    parser = argparse.ArgumentParser(
        prog="dflash", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_, description, add_flags) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_, description=description)
        if command in (None, name):
            add_flags(sub)
    return parser


def _operator_errors() -> tuple[type[BaseException], ...]:
    """Errors that state the operator's mistake or the store's trouble in one line, where a traceback would bury
    it. Taken from the modules the command loaded: importing one only to name its error would cost the import."""
    errors = {
        "dagster_project.store.storage": "StoreError",
        "dagster_project.settings": "SettingsError",
        "dagster_project.sglang.launch": "FleetError",
        "dagster_project.generation.fleet_registry": "RegistryError",
    }
    return tuple(getattr(sys.modules[module], name) for module, name in errors.items() if module in sys.modules)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    try:
        return args.func(args, Resources())
    except BrokenPipeError:
        # The reader went away (`dflash status | head`): what it read is all it wanted. Point stdout at
        # /dev/null so the interpreter's final flush does not fail on the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if not isinstance(exc, _operator_errors()):
            raise
        name = " ".join(filter(None, [args.command, getattr(args, "action", None)]))
        raise SystemExit(f"dflash {name}: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
