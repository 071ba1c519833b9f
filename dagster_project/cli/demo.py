"""`dflash demo`: the whole pipeline on the embedded demo (`make demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_demo(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.demo import run_demo

    return run_demo(Path.cwd())


def demo_flags(demo: argparse.ArgumentParser) -> None:
    demo.set_defaults(func=cmd_demo)
