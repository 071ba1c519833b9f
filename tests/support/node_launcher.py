"""A run launcher that places each run on one of several "nodes" of this machine, as the K8s launcher places a
run's pod on a node of the cluster.

A node is a name and the environment its run workers get (its own `DFLASH_WORK_DIR`: the node's disk). Each
launched run becomes `dagster api execute_run` (the command the K8s launcher gives a pod) in a process session
of its own, on the node with the fewest live runs; its node and pid are written into the run's tags, so a test
can SIGKILL every run of a node. A node is lost once `<state_dir>/lost/<node>` exists: no run is placed there
any more, and run monitoring finds its runs' workers dead (what a cluster reports for pods of a lost node), so
the daemon fails those runs and run retries launch them again, on a node still up.

Configured in a test instance's dagster.yaml:

    run_launcher:
      module: tests.support.node_launcher
      class: NodeRunLauncher
      config:
        state_dir: /tmp/.../launcher
        nodes:
          node-a: {DFLASH_WORK_DIR: /tmp/.../node-a/work}
          node-b: {DFLASH_WORK_DIR: /tmp/.../node-b/work}
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import dagster as dg
import psutil
from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass
from dagster._serdes.config_class import ConfigurableClassData

NODE_TAG = "dflash/node"
PID_TAG = "dflash/pid"


class NodeRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(
        self, nodes: Mapping[str, Mapping[str, str]], state_dir: str, inst_data: ConfigurableClassData | None = None
    ):
        self._nodes = {name: dict(env) for name, env in nodes.items()}
        self._state_dir = Path(state_dir)
        self._inst_data = inst_data
        self._workers: dict[str, subprocess.Popen] = {}  # run id -> its worker, launched by this process
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {"nodes": dg.Field(dg.Permissive()), "state_dir": dg.Field(str)}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(config_value["nodes"], config_value["state_dir"], inst_data=inst_data)

    def lost(self, node: str) -> bool:
        return (self._state_dir / "lost" / node).exists()

    def _live_runs(self, node: str) -> int:
        return sum(
            1
            for run_id, worker in self._workers.items()
            if worker.poll() is None and self._instance.get_run_by_id(run_id).tags.get(NODE_TAG) == node
        )

    def _place(self) -> str:
        up = [node for node in self._nodes if not self.lost(node)]
        if not up:
            raise dg.DagsterError(f"no node left to place a run on: all of {sorted(self._nodes)} are lost")
        return min(up, key=self._live_runs)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        node = self._place()
        args = ExecuteRunArgs(
            job_origin=run.job_code_origin,
            run_id=run.run_id,
            instance_ref=self._instance.get_ref(),
            set_exit_code_on_failure=True,
        )
        self._state_dir.mkdir(parents=True, exist_ok=True)
        with open(self._state_dir / f"{run.run_id}.log", "ab") as log:
            worker = subprocess.Popen(
                list(args.get_command_args()),
                env={**os.environ, **self._nodes[node]},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the node's processes: one SIGKILL of the group takes them all
            )
        self._workers[run.run_id] = worker
        self._instance.add_run_tags(run.run_id, {NODE_TAG: node, PID_TAG: str(worker.pid)})
        self._instance.report_engine_event(f"run placed on node {node} (pid {worker.pid})", run, cls=type(self))

    def _alive(self, run: dg.DagsterRun) -> bool:
        worker = self._workers.get(run.run_id)
        if worker is not None:
            return worker.poll() is None
        # Launched by another process of the instance (the webserver, an earlier daemon): its pid tag.
        with contextlib.suppress(psutil.Error, KeyError, ValueError):
            return psutil.Process(int(run.tags[PID_TAG])).status() != psutil.STATUS_ZOMBIE
        return False

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        node = run.tags.get(NODE_TAG)
        if node is not None and self.lost(node):
            return CheckRunHealthResult(WorkerStatus.FAILED, f"node {node} is lost")
        if self._alive(run):
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        worker = self._workers.get(run.run_id)
        if worker is not None and worker.returncode == 0:
            return CheckRunHealthResult(WorkerStatus.SUCCESS)
        return CheckRunHealthResult(WorkerStatus.FAILED, f"the run worker on node {node} is gone")

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or not self._alive(run):
            return False
        self._instance.report_run_canceling(run)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(run.tags[PID_TAG]), signal.SIGTERM)
        return True
