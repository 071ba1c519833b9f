"""`dflash profile`: a GPU run's measured curve in the GPU-profile format (`measure`, from a `dflash tune` report),
and its comparison with a profile (`compare`): per point the measured decode step over the profile's, and a
verdict."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from dagster_project.cli.common import add_flags, given_flags


def cmd_profile(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops import profile_check
    from dagster_project.ops.tune import TuneReport
    from dagster_project.sglang.profiles.profile import GpuProfile, profile_named
    from dagster_project.store.dataclass_json import from_json

    try:
        if args.action == "measure":
            report = from_json(TuneReport, Path(args.tune_report).read_bytes())
            run = profile_check.MeasuredRun(**given_flags(args, profile_check.MeasuredRun))
            measured = profile_check.measured_profile(report, run)
            written = measured.save(Path(args.out))
            points = ", ".join(f"{c.spec.label}: {len(c.points)} point(s)" for c in measured.curves)
            print(f"measured profile {measured.name} ({points}) written to {written}")
            return 0
        measured = GpuProfile.load(Path(args.measured))
        reference = GpuProfile.load(Path(args.profile)) if Path(args.profile).is_file() else profile_named(args.profile)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"dflash profile {args.action}: {exc}") from None
    comparison = profile_check.compare(measured, reference)
    print(comparison.render(), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(comparison), indent=2))
    return 0


def profile_flags(profile: argparse.ArgumentParser) -> None:
    from dagster_project.ops.profile_check import MeasuredRun

    actions = profile.add_subparsers(dest="action", required=True, metavar="ACTION")
    measure = actions.add_parser(
        "measure",
        help="write a `dflash tune` report's measured curve in the GPU-profile format",
        description="Turn the knee setting's points of a tune report (and its speculative settings, if compared) "
        "into a GPU profile: at each running count, the decode step that gives the measured rate per GPU.",
    )
    measure.add_argument("--tune-report", required=True, help="the report.json `dflash tune --out` wrote")
    measure.add_argument("--gpu", required=True, help="the GPU, as the profiles name it (h200, b200)")
    add_flags(measure, MeasuredRun, skip={"gpu"})
    measure.add_argument("--out", required=True, help="where to write the measured profile (JSON)")
    compare = actions.add_parser(
        "compare",
        help="compare a measured profile with a GPU profile: per point ratio and a verdict",
        description="Per measured point, the decode step and decode rate over the profile's at the same running "
        "count, and whether the profile holds (within 15%).",
    )
    compare.add_argument("measured", help="a measured profile (`dflash profile measure`, scripts/gpu_check.sh)")
    compare.add_argument(
        "--profile", required=True, help="a built-in profile (h200-bf16, h200-fp8, b200-bf16, b200-fp8) or a file"
    )
    compare.add_argument("--json", help="also write the comparison as JSON to this file")
    profile.set_defaults(func=cmd_profile)
