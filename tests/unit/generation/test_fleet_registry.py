"""The fleet registry in the store: nodes register, list, replace and leave; a name held elsewhere is refused."""

import socket

import pytest

from dagster_project.generation.fleet_registry import (
    NodeRecord,
    RegisteredServer,
    RegistryError,
    deregister_node,
    node_key,
    register_node,
    registered_endpoints,
    registered_nodes,
)
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
