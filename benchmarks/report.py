"""Write one benchmark's section of BENCHMARKS.md, leaving the other sections as they are."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the benchmark named in it (`python -m benchmarks.<name>`), which measures the\n"
    "project's code next to a baseline in the same run. Figures depend on the machine; the machine is noted.\n"
)


def machine() -> str:
    import os

    return (
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, {platform.machine()}"
    )


def write_section(name: str, body: str) -> Path:
    """Replace (or append) the section delimited by `<!-- bench:name -->` markers."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = f"{start}\n{body.rstrip()}\n\n_Measured {stamp} on {machine()}._\n{end}"
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    BENCHMARKS_MD.write_text(text)
    return BENCHMARKS_MD
