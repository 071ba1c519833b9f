"""`dflash status` names a lost node's stale registry record and how to remove it."""

import dataclasses
import socket
import time

from dagster_project.generation.fleet_registry import NodeRecord, RegisteredServer, live_nodes, node_key
from dagster_project.ops.status import collect_status, render_text
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.storage import LocalStore


def test_status_lists_a_stale_node_record_with_the_command_that_removes_it(tmp_path):
    store = LocalStore(tmp_path / "store")
    server = RegisteredServer("http://10.0.0.1:30000", 30000, 0, 48)
    lost = NodeRecord("gpu-2", socket.gethostname(), "sglang", time.time() - 900, [server])
    store.put_bytes(node_key("gpu-2"), to_json(lost))

    _, stale = live_nodes(store, stale_after_s=300, reachable=lambda url: False)
    status = dataclasses.replace(collect_status(store, []), stale_nodes=stale)

    line = render_text(status).splitlines()[-1]
    assert line.startswith("stale node record gpu-2") and "http://10.0.0.1:30000" in line
    assert "`dflash fleet forget --node gpu-2`" in line
