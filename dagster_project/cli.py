"""`dflash`: the operator's command line.

dflash status [--json] [--by-id]       the six answers: progress, MTP, concurrency, storage, coverage, multi-turn
dflash fleet up|down|status            the SGLang fleet (real servers per GPU, or simulators)
dflash plan --brief | --req-per-s ...  the estimates `status` compares against
dflash demo                            the whole pipeline on the embedded demo (`make demo`)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from dagster_project import settings
from dagster_project.ops.plan import BRIEF_PLAN, Plan, read_plan, write_plan
from dagster_project.sglang import launch
from dagster_project.store import layout
from dagster_project.store.storage import Store, open_store

# What `fleet up --simulate` starts unless told otherwise: thinking-shaped ~300-token answers, MTP on,
# a server-side cap of 16 running requests with a queue behind it, metrics on.
DEMO_SIMULATOR = {
    "enable_metrics": True,
    "max_running_requests": 16,
    "output_len": "lognormal:300:0.6",
    "decode_step_s": 0.004,
    "ttft_s": 0.02,
}


def _store() -> Store:
    def s3_client():
        from dagster_aws.s3 import S3Resource

        return S3Resource().get_client()

    return open_store(settings.store_uri(), s3_client)


def _endpoints() -> list[str]:
    if settings.sglang_router():
        return [settings.sglang_router()]
    if settings.sglang_endpoints():
        return settings.sglang_endpoints()
    fleet = launch.Fleet.load(settings.fleet_dir())
    return fleet.urls if fleet else []


def _api_key() -> str | None:
    return os.environ.get("SGLANG_API_KEY") or None


def _materialized_shards() -> set[int] | None:
    """Completions shards the Dagster instance recorded as materialized (None without an instance)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home or not Path(home).is_dir():
        return None
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        return {
            layout.shard_index(key) for key in instance.get_materialized_partitions(dg.AssetKey(layout.COMPLETIONS))
        }


def cmd_status(args: argparse.Namespace) -> int:
    from dagster_project.ops.coverage import dataset_coverage, write_coverage
    from dagster_project.ops.status import collect_status, render_text

    store = _store()
    if args.by_id:
        write_coverage(store, dataset_coverage(store, settings.num_shards()))
    status = collect_status(
        store, _endpoints(), api_key=_api_key(), num_shards=settings.num_shards(), materialized=_materialized_shards()
    )
    print(json.dumps(asdict(status), indent=2, default=str) if args.json else render_text(status))
    return 0


def _parse_sim_options(pairs: list[str]) -> dict:
    options = dict(DEMO_SIMULATOR)
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not value:
            raise SystemExit(f"--sim-option wants NAME=VALUE, got {pair!r}")
        try:
            options[name.replace("-", "_")] = json.loads(value)  # numbers, true/false, lists, objects
        except json.JSONDecodeError:
            options[name.replace("-", "_")] = value  # plain strings such as lognormal:300:0.6
    return options


def cmd_fleet(args: argparse.Namespace) -> int:
    run_dir = settings.fleet_dir()
    if args.action == "down":
        stopped = launch.stop_fleet(run_dir)
        print(f"stopped {', '.join(stopped) or 'nothing (no fleet recorded)'}")
        return 0
    if args.action == "status":
        endpoints = _endpoints()
        if not endpoints:
            print(f"no fleet: nothing recorded in {run_dir} and no endpoints configured")
            return 1
        for server in launch.fleet_status(endpoints, api_key=_api_key()):
            print(json.dumps(server))
        return 0
    if args.simulate:
        options = _parse_sim_options(args.sim_option)
        if _api_key():  # simulators guard their routes like servers started with --api-key
            options["api_key"] = _api_key()
        fleet = launch.launch_simulators(args.simulate, run_dir, options)
    else:
        if not args.gpus:
            raise SystemExit("fleet up needs --gpus 0,1,... (real servers) or --simulate N")
        options = launch.ServerOptions(
            model_path=args.model,
            context_length=args.context_length,
            max_running_requests=args.max_running_requests,
            mem_fraction_static=args.mem_fraction_static,
            mamba_full_memory_ratio=args.mamba_full_memory_ratio,
            kv_cache_dtype=args.kv_cache_dtype,
            disable_radix_cache=args.disable_radix_cache,
            api_key=_api_key(),
            extra_args=tuple(args.extra_arg),
        )
        gpus = [int(g) for g in args.gpus.split(",")]
        fleet = launch.launch_fleet(
            gpus, run_dir, options, base_port=args.base_port, startup_timeout_s=args.startup_timeout_s
        )
    print(f"fleet up ({fleet.kind}): {', '.join(fleet.urls)}; record and logs in {run_dir}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    store = _store()
    if args.show:
        recorded = read_plan(store)
        print(json.dumps(asdict(recorded) if recorded else None, indent=2))
        return 0
    if args.brief:
        plan = BRIEF_PLAN
    else:
        if not (args.req_per_s and args.avg_output_tokens and args.output_tok_per_s):
            raise SystemExit("plan needs --brief, or --req-per-s, --avg-output-tokens and --output-tok-per-s")
        plan = Plan(
            source=args.source,
            req_per_s=args.req_per_s,
            avg_output_tokens=args.avg_output_tokens,
            output_tok_per_s=args.output_tok_per_s,
            gpus=args.gpus,
            cost_per_hour=args.cost_per_hour,
            prompts=args.prompts,
        )
    write_plan(store, plan)
    print(f"plan written to {store.url('plan.json')}: {plan}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dagster_project.ops.demo import run_demo

    return run_demo(Path.cwd())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    status = commands.add_parser("status", help="the six operator answers")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--by-id", action="store_true", help="recompute coverage by id across every shard first")
    status.set_defaults(func=cmd_status)

    fleet = commands.add_parser("fleet", help="start, stop or inspect the SGLang fleet")
    fleet.add_argument("action", choices=["up", "down", "status"])
    fleet.add_argument(
        "--simulate", type=int, metavar="N", help="start N SGLang-protocol simulators instead of servers"
    )
    fleet.add_argument("--sim-option", action="append", default=[], metavar="NAME=VALUE", help="simulator setting")
    fleet.add_argument("--gpus", help="comma-separated GPU indices: one server per GPU")
    fleet.add_argument("--model", default=launch.DEFAULT_MODEL)
    fleet.add_argument("--base-port", type=int, default=30000)
    fleet.add_argument("--context-length", type=int, default=65536)
    fleet.add_argument("--max-running-requests", type=int)
    fleet.add_argument("--mem-fraction-static", type=float)
    fleet.add_argument("--mamba-full-memory-ratio", type=float)
    fleet.add_argument("--kv-cache-dtype")
    fleet.add_argument("--disable-radix-cache", action="store_true")
    fleet.add_argument("--extra-arg", action="append", default=[], help="passed to sglang.launch_server as is")
    fleet.add_argument("--startup-timeout-s", type=float, default=1800.0)
    fleet.set_defaults(func=cmd_fleet)

    plan = commands.add_parser("plan", help="record the estimates the run is compared against")
    plan.add_argument("--brief", action="store_true", help="the brief's planned figures for the 914K run")
    plan.add_argument("--show", action="store_true")
    plan.add_argument("--req-per-s", type=float)
    plan.add_argument("--avg-output-tokens", type=float)
    plan.add_argument("--output-tok-per-s", type=float)
    plan.add_argument("--gpus", type=int, default=1)
    plan.add_argument("--cost-per-hour", type=float)
    plan.add_argument("--prompts", type=int)
    plan.add_argument("--source", default="operator estimate")
    plan.set_defaults(func=cmd_plan)

    demo = commands.add_parser("demo", help="run the whole pipeline on the embedded demo")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
