"""A fleet across nodes: `dflash fleet up` on each node registers its servers in the store, and a running
dispatcher takes on the servers of a node that joins, without restarting anything: in the dispatcher alone, and
in a shard run through Dagster.

The "nodes" are separate work directories on this machine whose simulators listen on different loopback
addresses (127.0.0.2, 127.0.0.3), sharing one store.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import psutil

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
from dagster_project.generation.fleet_registry import fleet_servers as registry_entries
from dagster_project.generation.fleet_registry import follow_registry, register_node, registered_nodes
from dagster_project.generation.shards import shard_coverage
from dagster_project.generation.stage import journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang import protocol as proto
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import (
    DAGSTER,
    DEFS_MODULE,
    dagster_home,
    kill_process_group,
    pipeline_env,
    publish_conversations,
)
from tests.support.journal_files import journal_records
from tests.support.pilots import pass_pilot_of_env
from tests.support.sglang_fixtures import wait_until

NODE_CAP = 4
SLOW = {"output_len": "uniform:20:60", "decode_step_s": 0.01, "max_running_requests": NODE_CAP}


def dflash(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"dflash {' '.join(args)}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def node_env(tmp_path: Path, store: LocalStore, node: str) -> dict[str, str]:
    return pipeline_env(
        home=tmp_path / node / "dagster_home",
        store=store.uri,
        work_dir=tmp_path / node / "work",
        num_shards=2,
        extra={"DFLASH_NODE": node},
    )


def test_fleet_up_on_two_nodes_registers_both_and_fleet_down_removes_one(tmp_path):
    store = LocalStore(tmp_path / "store")
    nodes = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}
    envs = {node: node_env(tmp_path, store, node) for node in nodes}
    try:
        for node, host in nodes.items():
            out = dflash(
                envs[node], "fleet", "up", "--simulate", "2", "--host", host, "--sim-option", "max_running_requests=6"
            )
            assert f"registered node {node}" in out
        records = {record.node: record for record in registered_nodes(store)}
        assert set(records) == set(nodes)
        for node, host in nodes.items():
            record = records[node]
            assert record.kind == "simulator" and len(record.servers) == 2
            for server in record.servers:
                assert server.url == f"http://{host}:{server.port}" and server.cap == 6
                assert "--host" in server.command and host in server.command

        # A third host, with no fleet of its own, sees every node's servers.
        elsewhere = node_env(tmp_path, store, "head")
        probed = [orjson.loads(line) for line in dflash(elsewhere, "fleet", "status", "--json").splitlines()]
        assert sorted(p["url"] for p in probed) == sorted(s.url for r in records.values() for s in r.servers)
        assert all(p["healthy"] for p in probed)

        out = dflash(envs["node-b"], "fleet", "down")
        assert "node node-b removed from the fleet registry" in out
        assert [record.node for record in registered_nodes(store)] == ["node-a"]
    finally:
        for node in nodes:
            dflash(envs[node], "fleet", "down")
    assert registered_nodes(store) == []


def _requests(count: int):
    params = proto.sampling_params(max_new_tokens=4096)
    for i in range(count):
        yield GenRequest(f"e{i}#turn0", [248045, 846, 198, 1000 + i, 30, 248046, 198], params, payload=i)


def test_a_node_that_joins_mid_run_takes_load_up_to_its_cap_without_a_restart(sim_fleet, tmp_path):
    store = LocalStore(tmp_path / "store")
    first = sim_fleet(1, host="127.0.0.2", **SLOW)
    joining = sim_fleet(2, host="127.0.0.3", **SLOW)  # up, but not registered yet: the run cannot know it
    register_node(store, "node-a", "simulator", registry_entries(first.fleet, "127.0.0.2", {}))
    dispatcher = Dispatcher(
        [first.urls[0]],
        DispatchOptions(oversubscription=1.0, discovery_interval_s=0.2),
        discover=follow_registry(store),
    )
    total, join_after = 240, 20
    outcomes: dict[str, Outcome] = {}

    def on_outcome(outcome: Outcome) -> None:
        assert outcome.request.key not in outcomes, f"{outcome.request.key} delivered twice"
        outcomes[outcome.request.key] = outcome
        if len(outcomes) == join_after:  # the second node's `fleet up` registers while the run is under way
            register_node(store, "node-b", "simulator", registry_entries(joining.fleet, "127.0.0.3", {}))

    asyncio.run(dispatcher.run(_requests(total), on_outcome))

    assert len(outcomes) == total and all(o.ok for o in outcomes.values())
    assert dispatcher.endpoints == [first.urls[0], *joining.urls]
    by_server = {url: 0 for url in dispatcher.endpoints}
    for outcome in outcomes.values():
        by_server[outcome.server] += 1
    for index, url in enumerate(joining.urls):
        assert by_server[url] > 0, by_server
        assert joining.state(index)["peaks"]["running"] == NODE_CAP, (url, joining.state(index))
    # Nothing the first node answered before the join was sent again: one request per event in all.
    received = sum(len(fleet.requests(i)) for fleet in (first, joining) for i in range(len(fleet.urls)))
    assert received == total


def test_a_node_that_joins_while_a_shard_runs_through_dagster_reaches_its_cap_without_a_restart(sim_fleet, tmp_path):
    """Node A's one slow server generates shard 0 in a `dagster asset materialize` run; mid-shard node B's
    servers start and register (what its `fleet up` writes). The same run process takes them on at its next
    registry read and fills each to its running cap, and finishes the shard exactly once."""
    store = LocalStore(tmp_path / "store")
    first = sim_fleet(
        1, host="127.0.0.2", output_len="uniform:20:60", decode_step_s=0.03, max_running_requests=NODE_CAP
    )
    register_node(store, "node-a", "simulator", registry_entries(first.fleet, "127.0.0.2", {}))
    env = node_env(tmp_path, store, "node-a")
    home = dagster_home(Path(env["DAGSTER_HOME"]))
    publish_conversations(home, store.root, env)
    pass_pilot_of_env(home, env)  # on node A's server, the registry's one
    # Registry read every second (10 s by default): the join is seen well before the shard ends.
    config = {"resources": {"fleet": {"config": {"discovery_interval_s": 1.0}}}}
    command = [DAGSTER, "asset", "materialize", "-m", DEFS_MODULE, "--select", "completions"]
    command += ["--partition", "shard-00000", "--config-json", orjson.dumps(config).decode()]
    run = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        journal = journal_path(Path(env["DFLASH_WORK_DIR"]), 0, GenerationSettings().fingerprint())
        wait_until(
            lambda: journal.exists() and len(journal_records(journal)) >= 5 or run.poll() is not None,
            timeout_s=300,
            interval_s=0.2,
            what="the shard run to generate",
        )
        assert run.poll() is None, run.stdout.read()
        processes = {p.pid for p in psutil.Process(run.pid).children(recursive=True)} | {run.pid}

        joining = sim_fleet(2, host="127.0.0.3", **SLOW)
        register_node(store, "node-b", "simulator", registry_entries(joining.fleet, "127.0.0.3", {}))
        wait_until(
            lambda: all(joining.state(i)["peaks"]["running"] == NODE_CAP for i in range(2)) or run.poll() is not None,
            timeout_s=120,
            interval_s=0.2,
            what="node B's servers to reach their running cap",
        )
        done_at_cap = len(journal_records(journal))
        assert [joining.state(i)["peaks"]["running"] for i in range(2)] == [NODE_CAP, NODE_CAP]
        # Nothing was restarted: the run process and its step process are the ones that started the shard.
        assert run.poll() is None and all(psutil.pid_exists(pid) for pid in processes)
        output, _ = run.communicate(timeout=300)
    finally:
        kill_process_group(run)
    assert run.returncode == 0, output[-4000:]
    coverage = shard_coverage(store, 0)
    assert coverage.exact and done_at_cap < coverage.expected, (coverage, done_at_cap)
