"""Shared helpers for the tests that drive Dagster the way an operator does: its CLIs, `dagster dev` and GraphQL.

* `dagster_home` / `pipeline_env` / `materialize`: a persistent temp instance with the project's `dagster.yaml`,
  an environment that carries exactly the pipeline's settings (nothing leaks in from the developer's shell),
  and `dagster asset materialize` as a subprocess.
* `DagsterDev`: `dagster dev -w workspace.yaml` (webserver + daemon) as its own process group, readiness polled
  through GraphQL, the whole group killed at the end.
* `assert_token_exact`: every training row of a shard against what the simulators logged and the completions
  shard recorded.
* `check_evaluations`: asset-check evaluations of the instance, by (asset, check, partition).
* `in_process_resources`: the definitions' resources for `dg.materialize` in the test's own process.

Never sleep to synchronize: `wait_until` (from tests.support.sglang_fixtures) polls a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import dagster as dg
import psutil
import pytest
import yaml
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus,
)
from dagster_aws.s3 import S3Resource

from dagster_project.generation.shards import iter_completion_batches
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.sglang.launch import free_ports
from dagster_project.sglang.protocol import input_hash
from dagster_project.store.storage import LocalStore, Store
from dagster_project.training.shards import iter_training_batches
from tests.support.paths import PROJECT_ROOT
from tests.support.sglang_fixtures import wait_until

BIN_DIR = Path(sys.executable).parent  # the CLIs installed beside this interpreter (.venv/bin)
DAGSTER = str(BIN_DIR / "dagster")
DEFS_MODULE = "dagster_project.definitions"
# The code location `make dev` loads; absolute, since the tests run Dagster from a temp directory.
WORKSPACE = PROJECT_ROOT / "workspace.yaml"
SHARD_ASSETS = ("completions", "training_set", "specforge_export", "hf_export")

# Settings the pipeline reads from the environment; a test states every one it relies on.
_PIPELINE_PREFIXES = ("DFLASH_", "DAGSTER_", "SGLANG_")

# Simulator answers that are quick to generate yet pass every training gate: a fixed length would put every
# row at one loss_mask sum (the concentration gate blocks that), and < 32 tokens would hit the loss floor.
FAST_ANSWERS = {"output_len": "uniform:48:160", "max_running_requests": 8}

# The answer gates' share limits lifted (a check's or a run's config), for answers that must pass whatever they are:
# random weights' noise, or a disaster a test lets through on purpose.
LIFTED_ANSWER_GATES = {
    "max_bad_thinking_share": 1.0,
    "max_degenerate_share": 1.0,
    "max_short_answer_share": 1.0,
    "max_empty_answer_share": 1.0,
    "max_top_loss_sum_share": 1.0,
    "max_share_below_floor": 1.0,
}


# ---- what the definitions promise (README's table) -------------------------------------------------------

# asset -> (group, partitioned by shard, upstream assets). Three groups, so the lineage view shows the assets
# themselves: the prompts once, the per-shard stages, and what the operator looks at.
EXPECTED_ASSETS = {
    "raw_prompts": ("prompts", False, set()),
    "conversations": ("prompts", False, {"raw_prompts"}),
    "pilot": ("shards", False, {"conversations"}),
    "completions": ("shards", True, {"conversations", "pilot"}),
    "training_set": ("shards", True, {"completions"}),
    "specforge_export": ("shards", True, {"training_set"}),
    "hf_export": ("shards", True, {"training_set"}),
    "run_report": ("operations", False, {"completions"}),
    "mixture_report": ("operations", False, {"training_set", "conversations"}),
    "fleet_tuning": ("operations", False, {"conversations"}),
}

# asset -> {check name: blocking}. Besides the report's, only the two "how did it go" checks are warnings:
# the multi-turn recount of conversations and MTP's accept length (speculation changes speed, not the data).
EXPECTED_CHECKS = {
    "conversations": {
        "conversations_quarantine_rate": True,
        "conversations_unique_ids": True,
        "conversations_turn_markers": True,
        "conversations_gx_suite": True,
        "conversations_multi_turn_counts": False,
        "eval_contamination": False,
    },
    "completions": {
        "completions_exactly_once": True,
        "completions_published": True,
        "completions_spec_decoding": False,
        "error_rate": True,
        "length_capped_rate": True,
        "thinking_structure": True,
        "degenerate_answers": True,
        "short_answers": True,
        "ids_in_vocabulary": True,
    },
    "training_set": {
        name: True
        for name in (
            "loss_sum_floor",
            "loss_sum_concentration",
            "consecutive_supervised",
            "ids_in_vocabulary",
            "thinking_structure",
            "degenerate_answers",
            "short_answers",
            "malformed_tool_calls",
            "ids_match_completions",
            "length_loss",
            "source_is_current",
            "gx_suite",
        )
    },
    # Coverage by id across all shards; nothing is downstream of the report, so it has nothing to block.
    "run_report": {"dataset_exactly_once": False, "materialized_shards_in_store": False, "operator_alerts": False},
}


# ---- instance and environment ------------------------------------------------------------------------------


def in_process_resources(
    store: LocalStore, work_dir: Path, endpoints: Sequence[str], generation: GenerationConfig | None = None
) -> dict[str, Any]:
    """The resources `dg.materialize` needs, as the definitions name them: `store` (its journals under `work_dir`),
    the builtin tokenizer, `generation` (default: the default settings) and the fleet at `endpoints`."""
    return {
        "store": DatasetStore(root=store.uri, work_dir=str(work_dir), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": generation or GenerationConfig(),
        "fleet": SGLangFleet(endpoints=list(endpoints)),
    }


def dagster_home(path: Path) -> Path:
    """A persistent instance directory holding the project's dagster.yaml (what `make dev` and the demo use)."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", path / "dagster.yaml")
    return path


def pipeline_env(
    *,
    home: Path,
    store: str | Path,
    work_dir: Path,
    num_shards: int,
    endpoints: Sequence[str] = (),
    extra: Mapping[str, str] | None = None,
    without_pilot: str | None = None,
) -> dict[str, str]:
    """The environment of a pipeline process: this interpreter's, minus any DFLASH_/DAGSTER_/SGLANG_ setting
    inherited from the shell, plus the given ones. Its shards generate only after a pilot of their settings passed,
    as in production (materialize `pilot` first); `without_pilot`: why they must generate without one here
    (`DFLASH_SKIP_PILOT=1`, recorded in their manifests)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(_PIPELINE_PREFIXES)}
    if without_pilot:
        env["DFLASH_SKIP_PILOT"] = "1"
    env.update(
        DAGSTER_HOME=str(home),
        DFLASH_STORE=str(store),
        DFLASH_WORK_DIR=str(work_dir),
        DFLASH_NUM_SHARDS=str(num_shards),
        PYTHONUNBUFFERED="1",
    )
    if endpoints:
        env["DFLASH_SGLANG_ENDPOINTS"] = ",".join(endpoints)
    env.update(extra or {})
    return env


def _tail(text: str, chars: int = 6000) -> str:
    return text if len(text) <= chars else "…" + text[-chars:]


def run_cli(
    args: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float = 300
) -> subprocess.CompletedProcess:
    """Run a CLI to completion in its own process group; fail the test with the end of its output when it
    exits non-zero. On timeout the whole group goes (a run may spawn processes of its own)."""
    process = subprocess.Popen(
        list(args),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_process_group(process)
        raise AssertionError(f"{' '.join(args)} did not finish within {timeout_s}s") from None
    result = subprocess.CompletedProcess(list(args), process.returncode, stdout, stderr)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}\n"
            f"--- stdout\n{_tail(result.stdout)}\n--- stderr\n{_tail(result.stderr)}"
        )
    return result


def materialize(
    env: Mapping[str, str],
    cwd: Path,
    select: str | Iterable[str],
    partition: str | None = None,
    *,
    run_config: Mapping[str, Any] | None = None,
    timeout_s: float = 300,
    dagster: str = DAGSTER,
) -> subprocess.CompletedProcess:
    """`dagster asset materialize -m dagster_project.definitions --select ... [--partition ...] [--config-json ...]`;
    `dagster`: the CLI of another checkout (run with `cwd` there), to measure its code."""
    select = select if isinstance(select, str) else ",".join(select)
    command = [dagster, "asset", "materialize", "-m", DEFS_MODULE, "--select", select]
    if partition is not None:
        command += ["--partition", partition]
    if run_config is not None:
        command += ["--config-json", json.dumps(run_config)]
    return run_cli(command, env=env, cwd=cwd, timeout_s=timeout_s)


def publish_conversations(home: Path, store: str | Path, env: Mapping[str, str]) -> None:
    """OPERATIONS §4 "Once": raw_prompts and conversations, in this process, recorded in the instance at `home`."""
    from dagster_aws.s3 import S3Resource

    from dagster_project.assets.conversations import conversations
    from dagster_project.assets.raw_prompts import raw_prompts
    from dagster_project.resources import DatasetStore, GenerationConfig, TokenizerResource

    resources = {
        "store": DatasetStore(root=str(store), work_dir=env["DFLASH_WORK_DIR"], s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DFLASH_NUM_SHARDS", env["DFLASH_NUM_SHARDS"])
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            assert dg.materialize([raw_prompts, conversations], resources=resources, instance=instance).success
        finally:
            instance.dispose()


# ---- process groups --------------------------------------------------------------------------------------------


def kill_process_group(process: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """Stop `process` (started with start_new_session=True) and everything it spawned.

    SIGTERM to the group first; whatever is still alive at the deadline (a process that inherited an ignored
    SIGTERM, reference §9.10, or one that left the group) gets SIGKILL by pid.
    """
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    _, alive = psutil.wait_procs(descendants, timeout=max(1.0, timeout_s / 3))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=5)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=5)


# ---- dagster dev and GraphQL -----------------------------------------------------------------------------------


# The Materialize dialog's "launch backfill", and the runs a backfill made.
LAUNCH_BACKFILL = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""

BACKFILL_RUNS = """
query Runs($backfill: String!) {
  runsOrError(filter: {tags: [{key: "dagster/backfill", value: $backfill}]}) {
    ... on Runs { results { runId status tags { key value } } }
  }
}
"""

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}

BACKFILL_STATUS = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status endTimestamp } }
}
"""
PAGE_REFRESHES = """
{
  runsOrError(filter: {pipelineName: "refresh_run_report"}) { ... on Runs { results { status creationTime } } }
}
"""
# A backfill's terminal states (Dagster's BulkActionStatus).
BACKFILL_ENDED = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
BACKFILL_IDS = "{ partitionBackfillsOrError { ... on PartitionBackfills { results { id } } } }"
COMPLETIONS_PARTITIONS = '{ assetNodes(assetKeys: [{path: ["completions"]}]) { partitionKeys } }'


class GraphQLError(AssertionError):
    pass


def graphql(url: str, query: str, variables: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> dict:
    """POST one GraphQL document; return `data`, failing on transport or GraphQL errors."""
    body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        payload = json.loads(response.read())
    if payload.get("errors"):
        raise GraphQLError(f"GraphQL errors: {payload['errors']}")
    return payload["data"]


WORKSPACE_QUERY = """
{
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
  }
}
"""


LAUNCH_TIMEOUT_S = "300"  # the Makefile's LAUNCH_TIMEOUT_S


@dataclass
class DagsterUI:
    """A Dagster webserver on a free port serving `workspace`'s code locations, readiness polled through GraphQL;
    `process` is the process group started for it (killed whole at the end)."""

    process: subprocess.Popen
    port: int
    log_path: Path
    workspace: Path

    # A code location's load error fails the start at once; False where the webserver loads it again by itself.
    load_errors_are_final = True
    name = "dagster"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/graphql"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def query(self, document: str, variables: Mapping[str, Any] | None = None) -> dict:
        return graphql(self.url, document, variables)

    @contextlib.contextmanager
    def serving(self, startup_timeout_s: float) -> Iterator[Self]:
        """Wait until the code locations are loaded, yield, and stop the process group whatever happens."""
        try:
            wait_until(
                self._loaded, timeout_s=startup_timeout_s, interval_s=0.5, what=f"{self.name} to load the code location"
            )
            yield self
        except BaseException as exc:
            exc.add_note(f"--- {self.name} log (end)\n{_tail(self.log(), 8000)}")
            raise
        finally:
            kill_process_group(self.process)

    def _loaded(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{_tail(self.log())}")
        try:
            data = self.query(WORKSPACE_QUERY)
        except (OSError, GraphQLError, ValueError):  # not listening yet, or the workspace is still loading
            return False
        entries = data["workspaceOrError"].get("locationEntries") or []
        for entry in entries:
            error = entry["locationOrLoadError"]
            if error and error["__typename"] == "PythonError":
                if not self.load_errors_are_final:
                    return False
                raise AssertionError(f"code location {entry['name']} failed to load: {error['message']}")
        loaded = bool(entries) and all(
            e["loadStatus"] == "LOADED" and (e["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation"
            for e in entries
        )
        if loaded:  # the code locations are the workspace's, by the names it gives them
            names = {e["name"] for e in entries}
            expected = workspace_locations(self.workspace)
            assert names == expected, f"{self.name} loaded {names}, not the locations of {self.workspace}"
        return loaded


@dataclass
class DagsterDev(DagsterUI):
    """`dagster dev -w workspace.yaml` (webserver, daemon, code server) on a free port: the repository's
    workspace.yaml, the one `make dev` uses, is what loads the code location."""

    name = "dagster dev"

    @classmethod
    @contextlib.contextmanager
    def running(cls, env: Mapping[str, str], cwd: Path, startup_timeout_s: float = 120.0) -> Iterator[DagsterDev]:
        port = free_ports(1)[0]
        log_path = cwd / "dagster_dev.log"
        command = [DAGSTER, "dev", "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(port)]
        # As `make dev` runs it: the daemon's wait for the code server to start a run, past Dagster's 60 s (a
        # launch is answered once the run's process has imported Dagster, which takes longer on busy cores).
        env = {"DAGSTER_GRPC_TIMEOUT_SECONDS": LAUNCH_TIMEOUT_S, **env}
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        with cls(process=process, port=port, log_path=log_path, workspace=WORKSPACE).serving(startup_timeout_s) as dev:
            yield dev


def materialize_all(dev: DagsterUI, title: str, run_config: Mapping[str, Any] | None = None) -> str:
    """The Materialize dialog of the shard assets over every partition, "launch backfill" (`launchPartitionBackfill`,
    one asset backfill at the backfill policy's shards per run); `run_config`: what the dialog's launchpad would
    add. Returns the backfill's id."""
    (completions,) = dev.query(COMPLETIONS_PARTITIONS)["assetNodes"]
    params: dict[str, Any] = {
        "partitionNames": completions["partitionKeys"],
        "assetSelection": [{"path": [asset]} for asset in SHARD_ASSETS],
        "title": title,
    }
    if run_config is not None:
        params["runConfigData"] = dict(run_config)
    launched = dev.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


def backfill_ids(dev: DagsterUI) -> set[str]:
    return {backfill["id"] for backfill in dev.query(BACKFILL_IDS)["partitionBackfillsOrError"]["results"]}


def backfill_ended(dev: DagsterUI, backfill: str) -> tuple[str, list[dict]] | None:
    """The backfill's status and its runs, once it ended and every run of it finished (for `wait_until`)."""
    status = dev.query(BACKFILL_STATUS, {"id": backfill})["partitionBackfillOrError"]["status"]
    runs = dev.query(BACKFILL_RUNS, {"backfill": backfill})["runsOrError"]["results"]
    if status in BACKFILL_ENDED and all(run["status"] in FINISHED for run in runs):
        return status, runs
    return None


def page_refreshed_after(dev: DagsterUI, backfill: str) -> list[dict] | None:
    """The page's refreshes (the run_report_refresh sensor's runs) created after the backfill ended and finished,
    once there is one (for `wait_until`). After it no refresh is owed: a test that materializes run_report with
    config of its own then, sees its own materialization stay the latest."""
    ended = dev.query(BACKFILL_STATUS, {"id": backfill})["partitionBackfillOrError"].get("endTimestamp")
    if not ended:
        return None
    runs = dev.query(PAGE_REFRESHES)["runsOrError"]["results"]
    return [run for run in runs if run["creationTime"] >= ended and run["status"] in FINISHED] or None


def workspace_locations(workspace: Path = WORKSPACE) -> set[str]:
    """The location names a workspace file declares (`load_from: - python_module|grpc_server: {location_name: ...}`)."""
    entries = yaml.safe_load(workspace.read_text())["load_from"]
    return {origin["location_name"] for entry in entries for origin in entry.values()}


# ---- token exactness -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoggedRequest:
    server: str
    rid: str
    input_hash: str
    prompt_tokens: int
    outcome: str


def request_logs(fleet: Any) -> dict[str, LoggedRequest]:
    """Every request of the job's events the fleet's simulators received (not the dispatcher's one-token probes),
    by rid (rids are unique across the fleet)."""
    logged: dict[str, LoggedRequest] = {}
    for index, url in enumerate(fleet.urls):
        for entry in fleet.job_requests(index):
            assert entry["rid"] not in logged, f"rid {entry['rid']} was received twice"
            logged[entry["rid"]] = LoggedRequest(
                url, entry["rid"], entry["input_hash"], entry["prompt_tokens"], entry["outcome"]
            )
    return logged


def assert_token_exact(store: Store, shard: int, logged: Mapping[str, LoggedRequest]) -> int:
    """Every training row of `shard` is exactly what the engine saw and said.

    For each row: its generation event (completions shard) names the request (`rid`) and the server; the
    simulator's log of that rid gives the hash and length of the `input_ids` it received. The row's
    `input_ids` must be those prompt ids (same length, same hash) followed by exactly the event's
    `output_ids`, and `loss_mask` must be 0 over exactly the prompt and 1 over exactly the output.
    Returns the number of rows checked.
    """
    events = {
        row["event_id"]: row
        for batch in iter_completion_batches(
            store, shard, ["event_id", "status", "rid", "server", "prompt_ids", "output_ids", "finish_reason"]
        )
        for row in batch.to_pylist()
    }
    rows = [row for batch in iter_training_batches(store, shard) for row in batch.to_pylist()]
    assert rows, f"shard {shard} has no training rows"
    problems: list[str] = []
    seen_rids: set[str] = set()
    for row in rows:
        event = events.get(row["event_id"])
        if event is None or event["status"] != "ok":
            problems.append(f"{row['event_id']}: no ok generation event in the completions shard")
            continue
        request = logged.get(event["rid"])
        if request is None:
            problems.append(f"{row['event_id']}: rid {event['rid']} was never received by a simulator")
            continue
        if event["rid"] in seen_rids:
            problems.append(f"{row['event_id']}: rid {event['rid']} backs two training rows")
        seen_rids.add(event["rid"])
        if request.server != event["server"]:
            problems.append(f"{row['event_id']}: answered by {request.server}, the event says {event['server']}")
        if request.outcome != event["finish_reason"]:
            problems.append(
                f"{row['event_id']}: server logged {request.outcome!r}, event says {event['finish_reason']!r}"
            )
        prompt_len, ids, mask = request.prompt_tokens, row["input_ids"], row["loss_mask"]
        prompt, output = ids[:prompt_len], ids[prompt_len:]
        if input_hash(prompt) != request.input_hash:
            problems.append(f"{row['event_id']}: the first {prompt_len} input_ids are not the ids the server received")
        if prompt != event["prompt_ids"]:
            problems.append(f"{row['event_id']}: prompt differs from the event's prompt_ids")
        if output != event["output_ids"]:
            problems.append(
                f"{row['event_id']}: the {len(output)} ids after the prompt are not the "
                f"{len(event['output_ids'])} output_ids returned"
            )
        expected_mask = [0] * prompt_len + [1] * len(event["output_ids"])
        if mask != expected_mask:
            zeros = next((i for i, m in enumerate(mask) if m), len(mask))
            problems.append(
                f"{row['event_id']}: loss_mask has {len(mask)} entries, first 1 at {zeros}; expected 0 over "
                f"{prompt_len} prompt ids then 1 over {len(event['output_ids'])} output ids"
            )
        if row["num_loss_tokens"] != len(event["output_ids"]) or row["prompt_tokens"] != prompt_len:
            problems.append(f"{row['event_id']}: counts disagree with the row's ids")
    assert not problems, f"shard {shard}: {len(problems)} of {len(rows)} rows are not token-exact:\n" + "\n".join(
        problems[:20]
    )
    return len(rows)


# ---- the instance ---------------------------------------------------------------------------------------------


def asset_check_keys(asset: str) -> list[dg.AssetCheckKey]:
    """The check keys the definitions declare for `asset` (what every shard run must evaluate)."""
    from dagster_project.definitions import defs

    graph = defs.resolve_asset_graph()
    return sorted((k for k in graph.asset_check_keys if k.asset_key == dg.AssetKey(asset)), key=lambda k: k.name)


def evaluations_by_check(
    result: dg.ExecuteInProcessResult, asset: str | None = None
) -> dict[str, dg.AssetCheckEvaluation]:
    """The check evaluations of an in-process run (`dg.materialize`), by check name; `asset`'s alone if given."""
    return {
        e.check_name: e
        for e in result.get_asset_check_evaluations()
        if asset is None or e.asset_key == dg.AssetKey(asset)
    }


def check_evaluations(instance: dg.DagsterInstance, asset: str, limit: int = 100) -> dict[tuple[str, str | None], list]:
    """Completed evaluations of every check of `asset`, by (check name, partition)."""
    completed = {AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED}
    by_key: dict[tuple[str, str | None], list] = defaultdict(list)
    for key in asset_check_keys(asset):
        for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=limit, status=completed):
            by_key[(key.name, record.partition)].append(record)
    return dict(by_key)


def step_windows(instance: dg.DagsterInstance, run_id: str, step_key: str) -> tuple[float, float]:
    """(start, end) timestamps of one step of a run, from its event log."""
    start = end = None
    for event in instance.all_logs(run_id):
        if event.step_key != step_key or not event.is_dagster_event:
            continue
        kind = event.dagster_event_type
        if kind == dg.DagsterEventType.STEP_START:
            start = event.timestamp
        elif kind in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            end = event.timestamp
    assert start is not None and end is not None, f"run {run_id} has no complete {step_key!r} step"
    return start, end


def shard_of_run(tags: Mapping[str, str]) -> str | None:
    """The one shard a run covers: its partition tag (a run of one shard), or a range of one (what a backfill
    launches under `BackfillPolicy.multi_run(1)`); None for a run of no shard or of several."""
    start, end = tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")
    return tags.get("dagster/partition") or (start if start == end else None)


def materialized_partitions(instance: dg.DagsterInstance, assets: Iterable[str]) -> dict[str, set[str]]:
    return {asset: set(instance.get_materialized_partitions(dg.AssetKey(asset))) for asset in assets}


def partition_colours(instance: dg.DagsterInstance, asset: str) -> dict[str, str]:
    """Each shard of `asset` as Dagster 1.13's partitions view colours it: "Failed" (red), "Materialized" (green), or
    absent (gray). The view reads GraphQL's `assetPartitionStatuses`, which comes from the asset status cache read
    here: failed = the latest planned materialization of the partition had none after it, in a run that failed;
    materialized = a materialization, less the failed ones (`dagster_graphql`'s `build_partition_statuses`)."""
    from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

    from dagster_project.partitions import shard_partitions

    value = get_and_update_asset_status_cache_value(instance, dg.AssetKey(asset), shard_partitions)
    if value is None:
        return {}
    failed = set(value.deserialize_failed_partition_subsets(shard_partitions).get_partition_keys())
    materialized = set(value.deserialize_materialized_partition_subsets(shard_partitions).get_partition_keys())
    return {**dict.fromkeys(materialized - failed, "Materialized"), **dict.fromkeys(failed, "Failed")}
