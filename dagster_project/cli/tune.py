"""`dflash tune` (sweep concurrency and server settings, launching servers or simulators per setting) and
`dflash plan` (the estimates `status` compares against, the shard count)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Any

from dagster_project.cli.common import add_flags, given_flags, open_configured_store, option_flag
from dagster_project.cli.fleet import job_simulator_options, sim_option_help


def cmd_tune(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation.served_model import ExpectedModel
    from dagster_project.ops import tune, tune_render
    from dagster_project.sglang import launch, launch_plan

    options = tune.TuneOptions(**given_flags(args, tune.TuneOptions))
    store = resources.store.open()
    settings = resources.generation.to_dataclass()
    if options.synthetic_prompt_tokens:
        tokens, seed = options.synthetic_prompt_tokens, options.seed
        prompts = tune.synthetic_prompts(resources.tokenizer.load(), options.sample, tokens, seed)
        source = f"synthetic, {options.synthetic_prompt_tokens} tokens each"
    else:
        prompts = tune.conversation_prompts(store, resources.tokenizer.load(), settings, options.sample, options.seed)
        source = "published conversations, first turns rendered as generation renders them"
    params = tune.request_params(settings, options)
    target = launch_plan.CapacityTarget(**given_flags(args, launch_plan.CapacityTarget))
    fleet = resources.fleet
    endpoints: list[str] = []
    launcher = spec_options = None
    if args.simulate:
        base, served = job_simulator_options(args.sim_option)  # simulators of the job's model, as `fleet up` starts
        settings_grid = tune.launch_settings_grid(_sweeps(args.sweep, None), _launch_flag)
        run_dir = Path(fleet.fleet_dir).with_name("tune-fleet")
        launcher = _simulator_launcher(args.simulate, run_dir, base, target, served)
        spec_options = launch_plan.sim_spec_options
    elif args.gpus:
        base_options = launch.ServerOptions(
            **given_flags(args, launch.ServerOptions), api_key=fleet.api_key, extra_args=tuple(args.extra_arg)
        )
        allowed = {f.name for f in dataclasses.fields(launch.ServerOptions)} - {"api_key", "extra_args"}
        settings_grid = tune.launch_settings_grid(_sweeps(args.sweep, allowed), _launch_flag)
        gpus = [int(g) for g in args.gpus.split(",")]
        launcher = _gpu_launcher(gpus, Path(fleet.fleet_dir), base_options, target)
        spec_options = launch_plan.server_spec_options
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
        spec_options=spec_options,
        expected_model=fleet.to_dataclass(ExpectedModel).identity(),
    )
    out = Path(args.out) if args.out else Path(resources.store.local_dir()) / "tune"
    written = tune_render.write_local(report, out)
    tune_render.write_report(store, report)
    print(report.recommendation)
    if report.recommended_flags:
        print(f"recommended flags: {' '.join(report.recommended_flags)}")
    if report.speculative is not None:
        print(f"speculative decoding: {report.speculative.verdict}")
    print(f"report: {written} (chart beside it); in the store: {store.url(tune.REPORT_KEY)}")
    return 0


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
        return [option_flag(name)] if value else []
    return [option_flag(name), str(value)]


def _launcher(run_dir: Path, plan: Any, start: Any) -> Any:
    """A context manager per sweep setting: plan the servers for it, start them, yield their URLs, stop them."""
    from dagster_project.sglang import launch, launch_plan

    @contextlib.contextmanager
    def serve(setting: Any) -> Any:
        options, planned = plan(setting)
        print(f"tune [{setting.label}]: {launch_plan.describe_plan(planned)}", flush=True)
        fleet = start(options)
        try:
            yield fleet.urls
        finally:
            launch.stop_fleet(run_dir)

    return serve


def _simulator_launcher(count: int, run_dir: Path, base: dict, target: Any, served: dict[str, str]) -> Any:
    from dagster_project.sglang import launch, launch_plan

    return _launcher(
        run_dir,
        lambda setting: launch_plan.plan_simulators({**base, **setting.options}, target),
        lambda options: launch.launch_simulators(count, run_dir, options, **served),
    )


def _gpu_launcher(gpus: list[int], run_dir: Path, base: Any, target: Any) -> Any:
    from dagster_project.sglang import launch, launch_plan

    # The fleet's own run directory: a fleet already running on these GPUs is refused, not doubled.
    return _launcher(
        run_dir,
        lambda setting: launch_plan.plan_capacity(
            dataclasses.replace(base, **setting.options), target, launch_plan.fleet_gpu(gpus, target)
        ),
        lambda options: launch.launch_fleet(gpus, run_dir, options),
    )


def cmd_plan(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.plan import BRIEF_PLAN, Plan, ShardSizing, advise_shards, read_plan, write_plan

    if args.shards:
        print(advise_shards(ShardSizing(**given_flags(args, ShardSizing))))
        return 0
    if args.project:
        return _project(args)
    store = open_configured_store()  # without the Dagster resources: nothing else here needs them
    if args.show:
        recorded = read_plan(store)
        print(json.dumps(dataclasses.asdict(recorded) if recorded else None, indent=2))
        return 0
    if args.brief:
        plan = BRIEF_PLAN
    else:
        given = {"source": "operator estimate", **given_flags(args, Plan)}
        missing = [
            option_flag(f.name)
            for f in dataclasses.fields(Plan)
            if f.default is dataclasses.MISSING and f.name not in given
        ]
        if missing:
            raise SystemExit(f"plan needs --brief, or {', '.join(missing)}")
        plan = Plan(**given)
    write_plan(store, plan)
    print(f"plan written to {store.url('plan.json')}: {plan}")
    print(plan.cost_summary())
    return 0


def _project(args: argparse.Namespace) -> int:
    from dagster_project.ops.length_fit import FitOptions, LengthSample, project_caps
    from dagster_project.ops.projection import Job, project
    from dagster_project.pilot_record import PILOT_COMMAND, read_latest_pilot
    from dagster_project.store.storage import StoreError

    try:
        pilot = read_latest_pilot(open_configured_store())
    except (StoreError, OSError) as exc:  # the projection needs no store: without one it takes the seed's figures
        print(f"no pilot read ({exc})")
        pilot = None
    measured = pilot.job_inputs() if pilot is not None and pilot.passed else {}
    try:
        job = Job(**{**measured, **given_flags(args, Job)})
        projection = project(job)
        caps = FitOptions(**given_flags(args, FitOptions))
        by_cap = project_caps(job, caps, LengthSample.configured(caps.output_len))
    except (ValueError, KeyError, OSError) as exc:
        raise SystemExit(f"dflash plan --project: {exc}") from None
    print(projection.describe())
    if measured:
        print(f"inputs from the {pilot.summary()}")
        print(
            f"answer lengths and prompt tokens are the pilot's (flags override them); accept length: the pilot "
            f"measured {pilot.accept_length or '— (MTP off)'}, the profile assumes {projection.seed.accept_length:.2f}"
        )
    else:
        print(f"inputs: the seed run's figures (no passed pilot in the store: `{PILOT_COMMAND}`)")
    print(f"\n{by_cap.table()}")
    return 0


def tune_flags(tune: argparse.ArgumentParser) -> None:
    from dagster_project.ops.tune import TuneOptions
    from dagster_project.sglang import launch, launch_plan

    tune.add_argument("--endpoints", help="servers to tune (default: the recorded fleet or DFLASH_SGLANG_ENDPOINTS)")
    tune.add_argument("--simulate", type=int, metavar="N", help="launch N simulators per server setting")
    tune.add_argument("--sim-option", action="append", default=[], metavar="NAME=VALUE", help=sim_option_help())
    tune.add_argument("--gpus", help="launch one SGLang server per GPU per server setting (stop the fleet first)")
    tune.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a server option to sweep in launch mode (several: every combination), e.g. max_running_requests=48,69",
    )
    add_flags(tune, TuneOptions)
    add_flags(tune, launch.ServerOptions, skip={"api_key", "extra_args"}, aliases={"model_path": ["--model"]})
    add_flags(tune, launch_plan.CapacityTarget)
    tune.add_argument(
        "--extra-arg", action="append", default=[], help="passed to sglang.launch_server as is (repeat for several)"
    )
    tune.add_argument("--out", help="directory for report.json, report.md and throughput.svg (default: work dir)")
    tune.set_defaults(func=cmd_tune)


def plan_flags(plan: argparse.ArgumentParser) -> None:
    from dagster_project.ops.length_fit import FitOptions
    from dagster_project.ops.plan import BRIEF_PLAN, Plan, ShardSizing
    from dagster_project.ops.projection import Job

    plan.add_argument(
        "--brief",
        action="store_true",
        help=f"record the planned figures of the reference run ({BRIEF_PLAN.prompts:,} prompts on "
        f"{BRIEF_PLAN.gpus} GPUs: {BRIEF_PLAN.req_per_s} req/s, {BRIEF_PLAN.avg_output_tokens:,.0f} output tokens "
        f"per answer, {BRIEF_PLAN.output_tok_per_s:,.0f} tok/s, ${BRIEF_PLAN.cost_per_hour:.0f}/hour)",
    )
    plan.add_argument("--show", action="store_true", help="print the plan recorded in the store, change nothing")
    add_flags(plan, Plan, skip={"source", "output_tokens_percentiles"})
    plan.add_argument("--shards", action="store_true", help="how many shards to use (the flags below; nothing written)")
    add_flags(plan, ShardSizing)
    plan.add_argument(
        "--project",
        action="store_true",
        help="project the whole job from a GPU profile at the seed's and tuned settings: hours, $, what binds "
        "(--events, --gpus and the flags below; nothing written)",
    )
    add_flags(plan, Job, skip={"events", "gpus"})  # --events and --gpus are the shard sizing's and the plan's
    add_flags(plan, FitOptions)
    plan.set_defaults(func=cmd_plan)
