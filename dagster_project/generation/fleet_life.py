"""The fleet's life: when each node's servers were up, on how many GPUs, at what price — what the GPUs cost.

GPUs are paid while they are up, not while they generate. So every `dflash fleet up` records one life of its
node (`fleet_life/<node>/<start>.json`: the node, its GPUs, the price per GPU-hour configured where it started)
and `dflash fleet down` records its end. The records stay after `fleet down`, so what was spent is still known
with the fleet down, in every process and on every node, at the price the fleet was started with.

A life still open (its node was not brought down) runs until now. A node lost without `fleet down` is closed
by `dflash fleet forget`, and a new `fleet up` of the same node closes the node's earlier open life at its start.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, replace

from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.storage import PreconditionFailed, Store

LIFE_PREFIX = "fleet_life/"


@dataclass(frozen=True)
class FleetLife:
    """One node's servers from one `fleet up` to its `fleet down` (`stopped_at` None: still up)."""

    node: str
    host: str
    kind: str  # "sglang" or "simulator"
    started_at: float
    gpus: int  # one server per GPU (a simulator stands for one)
    cost_per_gpu_hour: float | None = None  # the price configured where `fleet up` ran; None: none was
    stopped_at: float | None = None

    def up_interval(self, now: float) -> tuple[float, float]:
        return self.started_at, self.stopped_at if self.stopped_at is not None else max(now, self.started_at)

    def gpu_hours(self, now: float) -> float:
        start, end = self.up_interval(now)
        return self.gpus * (end - start) / 3600


def life_key(node: str, started_at: float) -> str:
    return f"{LIFE_PREFIX}{node}/{int(started_at * 1000):015d}.json"


def record_fleet_up(
    store: Store, node: str, kind: str, gpus: int, cost_per_gpu_hour: float | None, now: float | None = None
) -> FleetLife:
    """A new life of `node` from now; an earlier one still open (a node restarted without `fleet down`) ends now."""
    now = time.time() if now is None else now
    close_lives(store, node, now)
    life = FleetLife(node, socket.gethostname(), kind, now, gpus, cost_per_gpu_hour)
    store.put_if(life_key(node, now), to_json(life), None)
    return life


def close_lives(store: Store, node: str, now: float | None = None) -> list[FleetLife]:
    """End every open life of `node` at `now` (`fleet down`, `fleet forget`); the lives it closed."""
    now = time.time() if now is None else now
    closed = []
    for info in list(store.list(f"{LIFE_PREFIX}{node}/")):
        current = store.get_versioned(info.key)
        if current is None:
            continue
        life = from_json(FleetLife, current[0])
        if life.stopped_at is not None:
            continue
        ended = replace(life, stopped_at=max(now, life.started_at))
        try:
            store.put_if(info.key, to_json(ended), current[1])
        except PreconditionFailed:
            continue  # another `fleet down` of the node closed it meanwhile
        closed.append(ended)
    return closed


def read_fleet_lives(store: Store) -> list[FleetLife]:
    """Every node's lives, oldest first."""
    lives = [from_json(FleetLife, store.get_bytes(info.key)) for info in store.list(LIFE_PREFIX)]
    return sorted(lives, key=lambda life: (life.started_at, life.node))
