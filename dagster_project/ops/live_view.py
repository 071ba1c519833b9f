"""`dflash status --watch`: the answers live in the operator's terminal, ranked to fit it. On a terminal of 80x24
the verdict comes first, then progress, rate and ETA, then the alerts summarized to the lines left, then as much
of the other answers as fits; no line wraps. Each view is a plain function of what was read, so tests render it
without a terminal; `watch` is the loop."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dagster_project.ops.alerts import render_alerts
from dagster_project.ops.answers.progress import render_progress
from dagster_project.ops.answers.shards import render_shards
from dagster_project.ops.status import Status, render_text
from dagster_project.shown_text import shown as safe

# The progress answer's lines the live view keeps on screen: events done, the rate, average output and ETA.
_PROGRESS_LINES = 4
_VERDICT_STYLE = "bold"


@dataclass(frozen=True)
class WatchReading:
    """One reading of the answers as the live view ranks them: the verdict, progress, alerts, then the rest."""

    verdict: list[str]  # what the job's state is, and what to run when it needs the operator
    progress: list[str]  # events done, rate, average output and ETA
    alerts: list[str]
    rest: list[str]  # the other answers, shown as far as the terminal has lines left
    notes: list[str] = field(default_factory=list)  # what reading did (Dagster runs marked failed)


def watch_reading(
    status: Status, *, first: str | None = None, notes: list[str] | None = None, more: str = ""
) -> WatchReading:
    """The live view's reading of `status` (`first`: what to materialize before anything can be answered; `more`:
    text shown after the answers, Dagster's recorded view)."""
    hold = status.quality.hold if status.quality else None
    if first:
        verdict = [first]
    elif hold:
        verdict = [hold.headline()]
    else:
        verdict = render_shards(status.shards)[:1] if status.shards else []
    progress_lines = render_progress(status.progress, status.collected_at)
    shown_progress = progress_lines[1:_PROGRESS_LINES]  # its heading's words are in each line already
    # Held, the hold is the verdict: its alert would say it again, cut to a line.
    alerts = [
        f"ALERT [{alert.kind}]: {alert.message}" for alert in status.alerts if not (hold and alert.kind == "hold")
    ]
    shown = {*verdict, *shown_progress, *render_alerts(status.alerts)}
    answers = render_text(status).splitlines() + more.splitlines()
    rest = [line for line in answers if line not in shown and line.strip() not in alerts]
    # Every line may hold text from the data or a server (ids, file names, model names): escaped for the terminal.
    return WatchReading(
        *([safe(line) for line in lines] for lines in (verdict, shown_progress, alerts, rest, notes or []))
    )


def fit_screen(reading: WatchReading, *, width: int, height: int) -> list[tuple[str, str]]:
    """The lines of one screen of `width` x `height`, each with its style: the verdict and progress first (a short
    terminal never loses them), then the alerts summarized to the lines left, then as much of the rest as fits.
    The verdict is folded onto as many lines as it needs, leaving the progress its lines (the hold's names the held
    shards and the commands that bring them back: cut to one line, it named neither); every other line is cut to
    the width, so none wraps into the next."""
    verdict = [part for line in reading.verdict for part in textwrap.wrap(line, width, subsequent_indent="   ")]
    room = max(height - len(reading.progress), 1)
    if len(verdict) > room:
        verdict = [*verdict[: room - 1], verdict[room - 1] + "…"]
    screen = [(line, _VERDICT_STYLE) for line in verdict] + [(line, "") for line in reading.progress]
    screen += [(note, "yellow") for note in reading.notes]
    left = height - len(screen)
    if reading.alerts and left > 0:
        if len(reading.alerts) <= left:
            shown = reading.alerts
        else:
            shown = reading.alerts[: max(left - 1, 0)]
        screen += [(line, "bold red") for line in shown]
        hidden = len(reading.alerts) - len(shown)
        if hidden:
            screen.append((f"… {hidden} more alert{'s' * (hidden > 1)}: `dflash status` lists every one", "bold red"))
    elif not reading.alerts:
        screen.append(("Alerts: none", ""))
    left = height - len(screen)
    if left > 1:
        screen += [("", ""), *((line, _heading_style(line)) for line in reading.rest[: left - 1])]
    return [(_cut(line, width), style) for line, style in screen[:height]]


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _heading_style(line: str) -> str:
    return "bold" if line[:1].isdigit() and ". " in line[:4] else ""


def watch_view(reading: WatchReading, *, where: str, every_s: float, read_at: float, width: int, height: int) -> Any:
    """The live view of one reading on a terminal of `width` x `height`: a header (the store, when it was read,
    how often), then the screen `fit_screen` ranks."""
    from rich.console import Group
    from rich.text import Text

    stamp = datetime.fromtimestamp(read_at, UTC).strftime("%H:%M:%S UTC")
    header = _cut(f"dflash status  {where}  read at {stamp}, every {every_s:g} s  (Ctrl-C leaves)", width)
    lines = [Text(header, style="bold", no_wrap=True)]
    # One line short of the height: a live display as tall as the terminal scrolls its first line away.
    for line, style in fit_screen(reading, width=width, height=max(height - 2, 1)):
        lines.append(Text(line, style=style, no_wrap=True, overflow="crop"))
    return Group(*lines)


def watch(read: Callable[[], WatchReading], every_s: float, where: str) -> int:
    """Show `read()`'s answers, read again every `every_s` seconds, until Ctrl-C (exit status 0)."""
    from rich.console import Console
    from rich.live import Live

    console = Console()

    def view() -> Any:
        reading = read()
        width, height = console.size
        return watch_view(reading, where=where, every_s=every_s, read_at=time.time(), width=width, height=height)

    try:
        with Live(view(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(every_s)  # the refresh period the operator asked for, not a synchronization
                live.update(view())
                live.refresh()
    except KeyboardInterrupt:
        console.print("stopped watching")
        return 0
