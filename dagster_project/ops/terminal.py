"""The fleet as a table in the operator's terminal (`dflash fleet status`): a plain function of the servers'
probes, so tests render it without a terminal. The answers' live view is `live_view`."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from dagster_project.sglang.model_identity import OTHER_MODEL, reported_model, serves_other_model

FLEET_COLUMNS = ("pid", "address", "health", "model", "cap", "running", "queued", "note")
# Hosts that name this machine: a server recorded by this node's `fleet up` there has a pid here.
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


def _health(probe: Mapping[str, Any]) -> str:
    if probe.get("healthy"):
        return "healthy"
    return "unreachable" if "error" in probe and probe.get("running") is None else "unhealthy"


def _figure(value: Any) -> str:
    return "—" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def served_model_cell(probe: Mapping[str, Any], served_model: str) -> str:
    """The model a probed server names, with OTHER MODEL after it when that is not the job's `served_model`."""
    named = reported_model(probe) or "—"
    return f"{named} ({OTHER_MODEL})" if serves_other_model(probe, served_model) else named


def fleet_rows(
    probes: list[Mapping[str, Any]], pids: Mapping[int, int], hostname: str, *, served_model: str
) -> list[tuple[str, ...]]:
    """One row per probed server (`launch.fleet_status`): `pids` are this node's servers by port, known for the
    addresses that name this host; a figure the server did not report is "—", never 0; its model judged against
    the job's `served_model`."""
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
                served_model_cell(probe, served_model),
                _figure(probe.get("max_running_requests")),
                _figure(probe.get("running")),
                _figure(probe.get("queued")),
                str(probe.get("error", "")),
            )
        )
    return rows


def fleet_table(
    probes: list[Mapping[str, Any]], pids: Mapping[int, int], hostname: str | None = None, *, served_model: str
) -> str:
    """`fleet_rows` as aligned text columns, the header first; the note column only when a server has one."""
    import socket

    from dagster_project.shown_text import shown

    # A server's address, model and error are what it (or the registry) wrote: escaped before they reach the terminal.
    found = fleet_rows(probes, pids, hostname or socket.gethostname(), served_model=served_model)
    rows = [tuple(map(shown, row)) for row in found]
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
