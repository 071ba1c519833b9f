"""The fleet across nodes: each GPU node's servers, registered in the store so every shard run sees them all.

`dflash fleet up` on a node writes `fleet/<node>.json` (its host, and per server the URL other nodes reach it
at, GPU, running cap and launch command); `dflash fleet down` removes it. A shard run on any host reads every
record, and its dispatcher re-reads them while it runs, so a node that joins mid-backfill takes load within
one refresh interval and a node that leaves is dropped like any unreachable server.

A node lost without `fleet down` leaves its record behind. Each record carries when its node last registered
(`registered_at`, refreshed by every `fleet up`); a record none of whose servers accepts a connection and that was
not refreshed for `stale_after_s` is stale: `dflash status` lists it, and no run dispatches to its servers. A
record just refreshed is never stale, so a node whose servers are still loading is not dropped.

Writes are conditional puts (the store's `put_if`): two processes registering the same node never silently
overwrite each other, and a node name already held by another host is refused with that host's name.
"""

from __future__ import annotations

import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dagster_project.settings import DEFAULT_FLEET_STALE_AFTER_S
from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.storage import PreconditionFailed, Store, StoreError

if TYPE_CHECKING:  # the launcher imports the SGLang client: readers of the registry (`dflash status`) need neither
    from dagster_project.sglang.launch import Fleet

FLEET_PREFIX = "fleet/"
_MAX_CONFLICTS = 5
_CONNECT_TIMEOUT_S = 2.0


class RegistryError(RuntimeError):
    pass


@dataclass(frozen=True)
class RegisteredServer:
    url: str  # how other nodes reach it
    port: int
    gpu: int | None
    cap: int | None  # its effective running cap from /server_info when it registered (None: not reported)
    command: list[str] = field(default_factory=list)  # the launch command, secrets redacted


@dataclass(frozen=True)
class NodeRecord:
    node: str
    host: str  # the machine that registered it (socket.gethostname())
    kind: str  # "sglang" or "simulator"
    registered_at: float  # the node's last `fleet up`: every one rewrites the record
    servers: list[RegisteredServer] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]


def fleet_servers(fleet: Fleet, advertise_host: str, caps: Mapping[str, int | None]) -> list[RegisteredServer]:
    """The fleet's servers as other nodes reach them (`advertise_host`), with the cap each reported."""
    return [
        RegisteredServer(f"http://{advertise_host}:{m.port}", m.port, m.gpu, caps.get(m.url), list(m.command))
        for m in fleet.members
    ]


def node_key(node: str) -> str:
    if not node or "/" in node:
        raise RegistryError(f"invalid node name {node!r}: it names the store object fleet/<node>.json")
    return f"{FLEET_PREFIX}{node}.json"


def register_node(store: Store, node: str, kind: str, servers: list[RegisteredServer]) -> NodeRecord:
    """Record (or replace) this host's servers under `node`; refuse a name another host holds."""
    record = NodeRecord(node, socket.gethostname(), kind, time.time(), list(servers))
    key = node_key(node)
    for _ in range(_MAX_CONFLICTS):
        current = store.get_versioned(key)
        if current is not None:
            held = from_json(NodeRecord, current[0])
            if held.host != record.host:
                raise RegistryError(
                    f"node name {node!r} is registered by host {held.host} ({', '.join(held.urls)}): "
                    "choose another --node, or run `dflash fleet down` there"
                )
        try:
            store.put_if(key, to_json(record), current[1] if current else None)
            return record
        except PreconditionFailed:
            continue  # another process wrote it between our read and write: read again
    raise RegistryError(f"{store.url(key)} kept changing while this node registered")


def deregister_node(store: Store, node: str) -> bool:
    """Remove the node's record; False when there was none."""
    key = node_key(node)
    if not store.exists(key):
        return False
    store.delete(key)
    return True


def registered_nodes(store: Store) -> list[NodeRecord]:
    """Every node's record, by node name."""
    keys = sorted(info.key for info in store.list(FLEET_PREFIX) if info.key.endswith(".json"))
    records = []
    for key in keys:
        current = store.get_versioned(key)
        if current is not None:  # else removed by `fleet down` between the listing and the read
            records.append(from_json(NodeRecord, current[0]))
    return records


def accepts_connections(url: str) -> bool:
    """Whether the server at `url` accepts a TCP connection within a short timeout. Not /health: SGLang's runs a
    generation, which a busy server may answer late, and a busy node is not a lost one."""
    address = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((address.hostname, address.port or 80), timeout=_CONNECT_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def is_stale(
    record: NodeRecord, *, now: float, stale_after_s: float, reachable: Callable[[str], bool] = accepts_connections
) -> bool:
    """Not refreshed for `stale_after_s` and none of its servers reachable (only then are they probed)."""
    return now - record.registered_at > stale_after_s and not any(reachable(url) for url in record.urls)


def live_nodes(
    store: Store, stale_after_s: float, reachable: Callable[[str], bool] = accepts_connections
) -> tuple[list[NodeRecord], list[NodeRecord]]:
    """(live, stale) node records: a stale record's servers are not dispatched to."""
    now = time.time()
    live, stale = [], []
    for record in registered_nodes(store):
        (stale if is_stale(record, now=now, stale_after_s=stale_after_s, reachable=reachable) else live).append(record)
    return live, stale


def registered_endpoints(
    store: Store,
    stale_after_s: float = DEFAULT_FLEET_STALE_AFTER_S,
    reachable: Callable[[str], bool] = accepts_connections,
) -> list[str]:
    """The URLs of every registered server of a node whose record is not stale, once each, in node order."""
    live, _ = live_nodes(store, stale_after_s, reachable)
    return list(dict.fromkeys(url for record in live for url in record.urls))


def known_endpoints(
    configured: list[str], registry: Store | None, stale_after_s: float, fleet_dir: str | None
) -> list[str]:
    """The `configured` endpoints (a router, or a list of servers), else every live registered node's servers in
    `registry`, else this node's fleet recorded in `fleet_dir`; empty when none is known."""
    if configured:
        return list(configured)
    registered = registered_endpoints(registry, stale_after_s) if registry is not None else []
    if registered:
        return registered
    from dagster_project.sglang.launch import Fleet

    fleet = Fleet.load(Path(fleet_dir)) if fleet_dir else None
    return fleet.urls if fleet is not None and fleet.members else []


def follow_registry(store: Store, stale_after_s: float = DEFAULT_FLEET_STALE_AFTER_S) -> Callable[[], list[str]]:
    """What a running dispatcher calls to find servers of nodes that joined: the registered URLs of nodes whose
    record is not stale, or none while the store cannot be read (the servers it already has keep working)."""

    def discover() -> list[str]:
        try:
            return registered_endpoints(store, stale_after_s)
        except StoreError:
            return []

    return discover
