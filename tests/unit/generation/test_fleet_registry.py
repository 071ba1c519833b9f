"""The fleet registry in the store: nodes register, list, replace and leave; a name held elsewhere is refused;
a lost node's record goes stale."""

import shlex
import socket
import time

import pytest

from dagster_project import cli
from dagster_project.generation.fleet_registry import (
    NodeRecord,
    RegisteredServer,
    RegistryError,
    accepts_connections,
    deregister_node,
    live_nodes,
    node_key,
    register_node,
    registered_endpoints,
    registered_nodes,
)
from dagster_project.sglang.launch import free_ports
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.storage import LocalStore


def servers(host: str, *ports: int) -> list[RegisteredServer]:
    return [
        RegisteredServer(f"http://{host}:{port}", port, gpu, 48, ["sglang", "--port", str(port)])
        for gpu, port in enumerate(ports)
    ]


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def test_every_nodes_servers_are_seen_and_a_node_that_leaves_is_gone(store):
    register_node(store, "gpu-a", "sglang", servers("10.0.0.1", 30000, 30001))
    register_node(store, "gpu-b", "sglang", servers("10.0.0.2", 30000))
    assert registered_endpoints(store) == ["http://10.0.0.1:30000", "http://10.0.0.1:30001", "http://10.0.0.2:30000"]
    record = {r.node: r for r in registered_nodes(store)}["gpu-a"]
    assert record.host == socket.gethostname() and record.servers[1].gpu == 1 and record.servers[1].cap == 48
    assert deregister_node(store, "gpu-a") and not deregister_node(store, "gpu-a")
    assert registered_endpoints(store) == ["http://10.0.0.2:30000"]


def test_a_node_registering_again_replaces_its_servers(store):
    register_node(store, "gpu-a", "sglang", servers("10.0.0.1", 30000, 30001))
    register_node(store, "gpu-a", "sglang", servers("10.0.0.1", 31000))
    assert registered_endpoints(store) == ["http://10.0.0.1:31000"]


def test_a_node_name_held_by_another_host_is_refused_naming_it(store):
    other = NodeRecord("gpu-a", "other-host", "sglang", 0.0, servers("10.0.0.9", 30000))
    store.put_bytes(node_key("gpu-a"), to_json(other))
    with pytest.raises(RegistryError, match="registered by host other-host"):
        register_node(store, "gpu-a", "sglang", servers("10.0.0.1", 30000))
    assert registered_nodes(store) == [other]


@pytest.mark.parametrize("name", ["", "a/b"])
def test_node_names_must_name_one_object(name):
    with pytest.raises(RegistryError, match="invalid node name"):
        node_key(name)


def test_records_round_trip_through_the_store(store):
    written = register_node(store, "gpu-a", "simulator", servers("127.0.0.2", 40000))
    assert registered_nodes(store) == [written]


def registered_long_ago(store, node: str, host: str, port: int, age_s: float) -> None:
    """A record as `fleet up` wrote it `age_s` ago (this host holds it)."""
    record = NodeRecord(node, socket.gethostname(), "sglang", time.time() - age_s, servers(host, port))
    store.put_bytes(node_key(node), to_json(record))


def test_a_record_unrefreshed_past_the_limit_whose_servers_do_not_answer_is_stale_and_not_dispatched_to(store):
    answering = {"http://10.0.0.2:30000"}
    registered_long_ago(store, "lost", "10.0.0.1", 30000, age_s=900)  # no `fleet down`: its node is gone
    registered_long_ago(store, "up", "10.0.0.2", 30000, age_s=900)  # old, but its server answers
    register_node(store, "restarting", "sglang", servers("10.0.0.3", 30000))  # just refreshed, not answering yet

    live, stale = live_nodes(store, stale_after_s=300, reachable=answering.__contains__)
    assert [r.node for r in stale] == ["lost"] and [r.node for r in live] == ["restarting", "up"]
    endpoints = registered_endpoints(store, stale_after_s=300, reachable=answering.__contains__)
    assert endpoints == ["http://10.0.0.3:30000", "http://10.0.0.2:30000"]
    # A longer limit keeps the record; the node's next `fleet up` refreshes it.
    assert not live_nodes(store, stale_after_s=1000, reachable=answering.__contains__)[1]
    register_node(store, "lost", "sglang", servers("10.0.0.1", 30000))
    assert not live_nodes(store, stale_after_s=300, reachable=answering.__contains__)[1]


def test_a_port_nobody_listens_on_does_not_accept_connections():
    assert not accepts_connections(f"http://127.0.0.1:{free_ports(1)[0]}")


def test_fleet_router_prints_the_router_command_for_the_live_nodes_servers(store, monkeypatch, capsys):
    register_node(store, "gpu-a", "sglang", servers("10.0.0.1", 30000, 30001))
    registered_long_ago(store, "lost", "127.0.0.1", free_ports(1)[0], age_s=900)  # nobody listens there
    monkeypatch.setenv("DFLASH_STORE", store.uri)
    monkeypatch.setenv("DFLASH_WORK_DIR", str(store.root.parent / "work"))

    assert cli.main(["fleet", "router", "--router-port", "31000"]) == 0
    command = shlex.split(capsys.readouterr().out)
    workers = command[command.index("--worker-urls") + 1 : command.index("--policy")]
    assert workers == ["http://10.0.0.1:30000", "http://10.0.0.1:30001"]
    assert command[command.index("--port") + 1] == "31000" and "--disable-retries" in command
    # The router's metrics beside it, on the port given: never a second router's default.
    assert command[command.index("--prometheus-host") + 1] == "0.0.0.0"
    assert command[command.index("--prometheus-port") + 1] == "29000"
