"""What the operator's terminal shows beyond the answers' text: the fleet as a table (`dflash fleet status`) and
the answers as a live view (`dflash status --watch`).

Each view is a plain function of what was read, so tests render it without a terminal; `watch` is the loop.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

FLEET_COLUMNS = ("pid", "address", "health", "cap", "running", "queued", "note")
# Hosts that name this machine: a server recorded by this node's `fleet up` there has a pid here.
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


def _health(probe: Mapping[str, Any]) -> str:
    if probe.get("healthy"):
        return "healthy"
    return "unreachable" if "error" in probe and probe.get("running") is None else "unhealthy"


def _figure(value: Any) -> str:
    return "—" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def fleet_rows(probes: list[Mapping[str, Any]], pids: Mapping[int, int], hostname: str) -> list[tuple[str, ...]]:
    """One row per probed server (`launch.fleet_status`): `pids` are this node's servers by port, known for the
    addresses that name this host; a figure the server did not report is "—", never 0."""
    rows = []
    for probe in probes:
        address = urllib.parse.urlsplit(probe["url"])
        local = address.hostname in _LOCAL_HOSTS | {hostname}
        pid = pids.get(address.port) if local else None
        rows.append(
            (
                _figure(pid),
                f"{address.hostname}:{address.port}",
                _health(probe),
                _figure(probe.get("max_running_requests")),
                _figure(probe.get("running")),
                _figure(probe.get("queued")),
                str(probe.get("error", "")),
            )
        )
    return rows


def fleet_table(probes: list[Mapping[str, Any]], pids: Mapping[int, int], hostname: str | None = None) -> str:
    """`fleet_rows` as aligned text columns, the header first; the note column only when a server has one."""
    import socket

    from dagster_project.shown_text import shown

    # A server's address and its error are what it (or the registry) wrote: escaped before they reach the terminal.
    rows = [tuple(map(shown, row)) for row in fleet_rows(probes, pids, hostname or socket.gethostname())]
    columns = FLEET_COLUMNS if any(row[-1] for row in rows) else FLEET_COLUMNS[:-1]
    table = [columns, *(row[: len(columns)] for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    numeric = {"pid", "cap", "running", "queued"}
    return "\n".join(
        "  ".join(
            cell.rjust(width) if name in numeric else cell.ljust(width)
            for name, cell, width in zip(columns, row, widths)
        ).rstrip()
        for row in table
    )


def watch_view(text: str, *, where: str, every_s: float, read_at: float, notes: list[str] | None = None) -> Any:
    """The live view of one reading: a header (the store, when it was read, how often), the alerts in red right
    under it (a terminal shorter than the answers crops their end, never the alerts), then the answers' text
    with the section headings in bold, and any notes (runs marked failed) below."""
    from rich.console import Group
    from rich.text import Text

    stamp = datetime.fromtimestamp(read_at, UTC).strftime("%H:%M:%S UTC")
    header = Text.assemble(
        ("dflash status", "bold"), f"  {where}  read at {stamp}, again every {every_s:g} s  (Ctrl-C leaves)"
    )
    lines = text.splitlines()
    urgent = [line for line in lines if "ALERT" in line or line.startswith("NOTHING TO REPORT")]
    body = Text()
    for line in lines:
        if line in urgent:
            continue
        body.append(line + "\n", style="bold" if line[:1].isdigit() and ". " in line[:4] else "")
    parts = [header, *(Text(line.strip(), style="bold red") for line in urgent), Text(""), body]
    parts += [Text(note, style="yellow") for note in notes or []]
    return Group(*parts)


def watch(read: Callable[[], tuple[str, list[str]]], every_s: float, where: str) -> int:
    """Show `read()`'s text, read again every `every_s` seconds, until Ctrl-C (exit status 0)."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    try:
        text, notes = read()
        with Live(
            watch_view(text, where=where, every_s=every_s, read_at=time.time(), notes=notes),
            console=console,
            auto_refresh=False,
            screen=False,
        ) as live:
            while True:
                time.sleep(every_s)  # the refresh period the operator asked for, not a synchronization
                text, notes = read()
                live.update(watch_view(text, where=where, every_s=every_s, read_at=time.time(), notes=notes))
                live.refresh()
    except KeyboardInterrupt:
        console.print("stopped watching")
        return 0
