"""The supervised head node of deploy/head/ as an operator starts it: `deploy/head/run-head` (the instance initialised
once, then supervisord running the code server, the daemon and the webserver, each restarted when it dies), on free
ports, its state read through supervisord's XML-RPC interface (what `supervisorctl` calls).
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import xmlrpc.client
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.xmlrpc import SupervisorTransport

from dagster_project.sglang.launch import free_ports
from tests.support.dagster_helpers import BIN_DIR, DagsterUI
from tests.support.paths import PROJECT_ROOT

HEAD_DIR = PROJECT_ROOT / "deploy" / "head"
RUN_HEAD = HEAD_DIR / "run-head"
PROGRAMS = ("code-server", "daemon", "webserver")  # supervisord.conf's programs


@dataclass
class SupervisedHead(DagsterUI):
    """deploy/head/run-head: `process` is run-head, then supervisord (it execs it); `state_dir` its DFLASH_HEAD_DIR."""

    state_dir: Path
    name = "the supervised head node"
    # The webserver may ask the code server for the location before it listens (all three start at once): it shows
    # a load error until the code server's start makes it load the location again.
    load_errors_are_final = False

    def log(self) -> str:
        """run-head's output, then each program's log, then supervisord's (its starts, exits and restarts)."""
        parts = [("run-head", self.log_path)]
        parts += [(name, self.state_dir / f"{name}.log") for name in (*PROGRAMS, "supervisord")]
        return "\n".join(
            f"--- {name}\n{path.read_text(errors='replace')[-3000:]}" for name, path in parts if path.exists()
        )

    def supervisor(self) -> Any:
        """supervisord's XML-RPC interface on its unix socket (`supervisor.getProcessInfo(name)`, ...)."""
        transport = SupervisorTransport(None, None, f"unix://{self.state_dir / 'supervisor.sock'}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor

    def program(self, name: str) -> dict:
        """supervisord's record of one program: `statename` (RUNNING, STARTING, BACKOFF, EXITED, FATAL...), `pid`."""
        return self.supervisor().getProcessInfo(name)

    @classmethod
    @contextlib.contextmanager
    def running(cls, env: Mapping[str, str], cwd: Path, startup_timeout_s: float = 180.0) -> Iterator[SupervisedHead]:
        webserver_port, code_server_port = free_ports(2)
        # Its own short directory: supervisord's unix socket lives there, and a socket's path may not pass 107 bytes.
        with tempfile.TemporaryDirectory(prefix="dflash-head-") as state_dir:
            env = {
                **env,
                "PATH": f"{BIN_DIR}:{env['PATH']}",  # supervisord and the three commands: this environment's
                "DFLASH_HEAD_DIR": state_dir,
                "DFLASH_CODE_SERVER_PORT": str(code_server_port),
                "DFLASH_WEBSERVER_PORT": str(webserver_port),
            }
            log_path = cwd / "run-head.log"
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    [str(RUN_HEAD)], env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            head = cls(
                process=process,
                port=webserver_port,
                log_path=log_path,
                workspace=HEAD_DIR / "workspace.yaml",
                state_dir=Path(state_dir),
            )
            with head.serving(startup_timeout_s):
                yield head
