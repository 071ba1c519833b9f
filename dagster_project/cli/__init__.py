"""`dflash`: the operator's command line.

dflash status [--json] [--by-id] [--watch N]  the answers: progress, MTP, concurrency, storage, coverage, ...
dflash hold [release --reason ... [--override GATE]]  the line's hold (a gate failed while answers arrived)
dflash free-slots RUN_ID...                   give back the pool slots of dead runs (the "pool" alert names them)
dflash repair-instance                        repair a Dagster instance broken by processes that first used it at once
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
import os
import sys
from collections.abc import Callable
from typing import Any

# Only what every command needs is imported here and by the command modules at their top: `dflash status` must
# answer within about a second, and Dagster, the SGLang client (aiohttp), pyarrow and boto3 each take a good part
# of one to import. Each command imports what it uses.
from dagster_project.cli.demo import demo_flags
from dagster_project.cli.fleet import fleet_flags
from dagster_project.cli.hold import hold_flags
from dagster_project.cli.profile import profile_flags
from dagster_project.cli.status import free_slots_flags, metrics_flags, repair_instance_flags, status_flags
from dagster_project.cli.tune import plan_flags, tune_flags


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


# Per command: its one-line help, its description, and what adds its flags (imported only for the command run).
COMMANDS: dict[str, tuple[str, str | None, Callable[[argparse.ArgumentParser], None]]] = {
    "status": (
        "the operator's answers: progress, MTP, concurrency, storage, coverage, multi-turn, cost, alerts",
        "Read the store (heartbeats, manifests, the plan) and probe the fleet; print every answer with its alerts. "
        "With DAGSTER_HOME, also compare with the shards Dagster materialized and mark failed the runs whose "
        "process is gone.",
        status_flags,
    ),
    "hold": (
        "show the line's hold (a quality gate failed on the answers arriving) or release it",
        "While a hold stands no shard run admits requests. `dflash hold` shows the gate, its figure, threshold and "
        "sample size and example answers; `dflash hold release --reason TEXT` lets the line run again (who, when "
        "and why are recorded); add `--override GATE` for a known false alarm (recorded in the manifests).",
        hold_flags,
    ),
    "free-slots": (
        "give back the concurrency-pool slots of dead runs (marks a run still STARTED failed)",
        "A run killed while it held a slot of a pool (`sglang_fleet`) never gives it back, and runs queued behind "
        "it wait forever; `dflash status` and the run_report page name such runs in a `pool` alert. Dagster 1.13 "
        "has no command for it (only its UI's pool page, under Deployment > Concurrency). Needs DAGSTER_HOME.",
        free_slots_flags,
    ),
    "repair-instance": (
        'repair a SQLite Dagster instance that no command can open ("more than one head present")',
        "Processes that first used a fresh SQLite instance at once (before this project's dagster.yaml locked its "
        "creation) can leave a database with two schema versions stamped. This keeps the oldest and migrates the "
        "instance to the current schema, under the instance's lock. Needs DAGSTER_HOME.",
        repair_instance_flags,
    ),
    "fleet": (
        "start, stop or inspect the SGLang fleet",
        "`dflash fleet ACTION --help` lists each action's flags.",
        fleet_flags,
    ),
    "tune": (
        "sweep client concurrency (and, launching servers, their settings); find the knee",
        "Measure output tok/s, accept length, TTFT and latency per client concurrency on a sample of the real "
        "prompts, find the knee (the least concurrency within --knee-fraction of the best, on a curve fitted to "
        "the points; printed with its interval) and recommend launch "
        "flags. Without --simulate/--gpus it tunes the running fleet as it is.",
        tune_flags,
    ),
    "plan": (
        "record the estimates the run is compared against, size the shards, or project the job from a GPU profile",
        "Record the plan (--brief, or --req-per-s, --avg-output-tokens and --output-tok-per-s) in the store's "
        "plan.json, which `dflash status` compares the run against; --show prints it; --shards advises a shard "
        "count and --project projects the whole job's hours and cost from a GPU profile; both write nothing.",
        plan_flags,
    ),
    "profile": (
        "a GPU run's measured curve as a GPU profile, and how it compares with one",
        "`measure` writes a `dflash tune` report's curve in the GPU-profile format (scripts/gpu_check.sh does it "
        "on a GPU node); `compare` puts it next to a profile: per point the measured decode step over the "
        "profile's, and whether the profile holds.",
        profile_flags,
    ),
    "metrics": (
        "serve the status answers as Prometheus metrics (events, ETA, accept length, servers, shards, cost)",
        "Serve /metrics for Prometheus: each scrape reads the store and probes the fleet as `dflash status` does "
        "(without the Dagster instance) and exports its figures as dflash_* gauges.",
        metrics_flags,
    ),
    "demo": (
        "run the whole pipeline on the embedded demo (deletes ./.demo/ first)",
        "Run every stage on the embedded demo data against 2 simulators, through `dagster asset materialize` in "
        "the instance under ./.dagster_home (kept: `make dev` shows its runs). It first stops a demo fleet left "
        "running and DELETES ./.demo/ (the demo's store and work directory, the store `make dev` shows).",
        demo_flags,
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
        "dagster_project.generation.served_model": "ServedModelMismatch",
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
