"""The pipeline against the real SGLang 0.5.23 on the CPU: `dflash fleet up --cpu` launches it through the
project's own launch path, and Dagster materializes shards through it (`dagster asset materialize`).

* One shard end to end (completions → training_set → both exports): coverage by id exact, every training row
  its event's prompt ids and output ids with the loss mask over exactly the output, and those output ids what
  the server answers that prompt (greedy decoding: the same request sent again gets the same ids).
* A SIGKILL of the server mid-shard, then `dflash fleet up` again: the shard ends with every event exactly once.
* A SIGSTOP of its scheduler process mid-shard (the real way a server hangs: its HTTP front still accepts
  requests), then SIGCONT once the run set it aside: again every event exactly once.

Random weights answer noise, which the quality gates rightly block (every answer hits the length cap, none
closes a think block, all repeat one token). The runs here lift those thresholds through the gates' own run
config (`RUN_CONFIG`): what is tested is the plumbing and exactly-once, never the data.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from dagster_project.generation.shards import iter_completion_batches, shard_coverage
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.launch import free_ports
from dagster_project.store.storage import LocalStore
from dagster_project.training.export import specforge_key
from dagster_project.training.hf_export import data_key as hf_data_key
from dagster_project.training.shards import iter_training_batches
from tests.support import sglang_real
from tests.support.dagster_helpers import (
    BIN_DIR,
    DEFS_MODULE,
    LIFTED_ANSWER_GATES,
    dagster_home,
    materialize,
    pipeline_env,
    run_cli,
)
from tests.support.journal_files import journal_records
from tests.support.sglang_fixtures import call, wait_until

NUM_SHARDS = 3
PROMPTS = 24  # single-turn: about 8 events a shard
MAX_NEW_TOKENS = 24
SHARD_ASSETS = "completions,training_set,specforge_export,hf_export"
# Lenient where random weights must fail; strict where the pipeline itself could (errors, ids, exactly-once).
RUN_CONFIG = {
    "resources": {"generation": {"config": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}}},
    "ops": {
        "completions_quality": {"config": {**LIFTED_ANSWER_GATES, "max_length_capped_share": 1.0}},
        "training_set_gates": {"config": {**LIFTED_ANSWER_GATES, "min_supervised_pairs": 1}},
        "training_set": {"config": {"exclude_length_capped": False}},  # every answer hits the cap
    },
}
# The fault runs write long answers (tens of seconds a shard on the CPU), so the fault lands mid-shard.
FAULT_CONFIG = {
    **RUN_CONFIG,
    "resources": {"generation": {"config": {"max_new_tokens": 512, "temperature": 0.0}}},
}
# The pilot of each of those settings, through the same server, before any shard of them (as in production), its
# gates lifted as the shards' are.
PILOT_GATES = {
    **LIFTED_ANSWER_GATES,
    "max_length_capped_share": 1.0,
    "min_supervised_pairs": 1,
    "exclude_length_capped": False,
}
SERVER_TIMEOUT_S = sglang_real.STARTUP_TIMEOUT_S + 60
RUN_TIMEOUT_S = 900


@dataclass
class Pipeline:
    root: Path
    env: dict[str, str]
    store: LocalStore
    work_dir: Path
    port: int
    fleet_up: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fleet_members(self) -> list[dict]:
        return json.loads((self.work_dir / "fleet" / "fleet.json").read_text())["members"]


def _prompts(path: Path) -> Path:
    with path.open("w") as handle:
        for index in range(PROMPTS):
            question = f"Question {index}: name {index + 2} things that are blue, one per line."
            handle.write(json.dumps({"id": f"real-{index:03d}", "messages": [{"role": "user", "content": question}]}))
            handle.write("\n")
    return path


def dflash(pipeline_or_env, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = pipeline_or_env.env if isinstance(pipeline_or_env, Pipeline) else pipeline_or_env
    return run_cli(
        [str(BIN_DIR / "dflash"), *args], env=env, cwd=Path(env["DFLASH_WORK_DIR"]).parent, timeout_s=timeout_s
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, tiny_model, sglang_python) -> Iterator[Pipeline]:
    root = tmp_path_factory.mktemp("real-pipeline")
    port = free_ports(1)[0]
    work_dir = root / "work"
    env = pipeline_env(
        home=dagster_home(root / "home"),
        store=root / "store",
        work_dir=work_dir,
        num_shards=NUM_SHARDS,
        extra={
            "DFLASH_SOURCES": str(_prompts(root / "prompts.jsonl")),
            **sglang_real.cpu_server_env(),
            **sglang_real.TINY_MODEL_ENV,
        },
    )
    fleet_up = [
        "fleet", "up", "--cpu", "--model-path", str(tiny_model), "--python", str(sglang_python),
        "--speculative", "off", "--context-length", str(sglang_real.CONTEXT_LENGTH),
        "--max-total-tokens", str(sglang_real.MAX_TOTAL_TOKENS), "--host", "127.0.0.1", "--base-port", str(port),
        "--advertise-host", "127.0.0.1", "--startup-timeout-s", str(sglang_real.STARTUP_TIMEOUT_S),
    ]  # fmt: skip
    pipeline = Pipeline(root, env, LocalStore(root / "store"), work_dir, port, fleet_up)
    try:
        dflash(pipeline, *fleet_up, timeout_s=SERVER_TIMEOUT_S)
        prompts = {"ops": {"conversations": {"config": {"max_prompt_tokens": 2048}}}}
        materialize(env, root, "raw_prompts,conversations", run_config=prompts)
        for settings in (RUN_CONFIG, FAULT_CONFIG):
            pilot = {"resources": settings["resources"], "ops": {"pilot": {"config": PILOT_GATES}}}
            materialize(env, root, "pilot", run_config=pilot, timeout_s=RUN_TIMEOUT_S)
        yield pipeline
    finally:
        dflash(pipeline, "fleet", "down", timeout_s=120)


def _events(store: LocalStore, shard: int) -> dict[str, dict]:
    columns = ["event_id", "status", "prompt_ids", "output_ids", "finish_reason", "server"]
    return {
        row["event_id"]: row for batch in iter_completion_batches(store, shard, columns) for row in batch.to_pylist()
    }


def _assert_exactly_once(store: LocalStore, shard: int) -> dict[str, dict]:
    coverage = shard_coverage(store, shard)
    assert coverage.exact and coverage.expected > 0, coverage.describe()
    events = _events(store, shard)
    assert all(event["status"] == "ok" for event in events.values()), [
        e for e in events.values() if e["status"] != "ok"
    ]
    return events


def test_a_shard_goes_through_the_real_server_to_both_exports(pipeline):
    materialize(
        pipeline.env, pipeline.root, SHARD_ASSETS, "shard-00000", run_config=RUN_CONFIG, timeout_s=RUN_TIMEOUT_S
    )
    events = _assert_exactly_once(pipeline.store, 0)
    assert {event["server"] for event in events.values()} == {pipeline.url}
    rows = [row for batch in iter_training_batches(pipeline.store, 0) for row in batch.to_pylist()]
    assert len(rows) == len(events)
    for row in rows:
        event = events[row["event_id"]]
        assert row["input_ids"] == event["prompt_ids"] + event["output_ids"]
        assert row["loss_mask"] == [0] * len(event["prompt_ids"]) + [1] * len(event["output_ids"])
    # The output ids are SGLang's: asked again (greedy), the server answers each prompt with the same ids.
    params = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}
    for event in list(events.values())[:3]:
        status, body = call(pipeline.url + "/generate", {"input_ids": event["prompt_ids"], "sampling_params": params})
        assert status == 200 and body["output_ids"] == event["output_ids"], event["event_id"]
    assert pipeline.store.exists(specforge_key(0))
    assert pipeline.store.exists(hf_data_key(0))


def _journaled(pipeline: Pipeline, shard: int) -> int:
    journals = list((pipeline.work_dir / "journal").rglob(f"shard={shard:05d}/*.jsonl"))
    return sum(len(journal_records(path)) for path in journals)


def _start_run(pipeline: Pipeline, shard: int, name: str) -> tuple[subprocess.Popen, Path]:
    log = pipeline.root / f"{name}.log"
    command = [
        str(BIN_DIR / "dagster"), "asset", "materialize", "-m", DEFS_MODULE, "--select", "completions",
        "--partition", f"shard-{shard:05d}", "--config-json", json.dumps(FAULT_CONFIG),
    ]  # fmt: skip
    with log.open("w") as handle:
        process = subprocess.Popen(
            command,
            env=pipeline.env,
            cwd=pipeline.root,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def _finish(pipeline: Pipeline, process: subprocess.Popen, shard: int) -> None:
    """The run ends on its own (it may fail: the fleet was down past its grace); a failed run is run again."""
    process.wait(timeout=RUN_TIMEOUT_S)
    if process.returncode != 0:
        materialize(
            pipeline.env,
            pipeline.root,
            "completions",
            f"shard-{shard:05d}",
            run_config=FAULT_CONFIG,
            timeout_s=RUN_TIMEOUT_S,
        )


def _mid_shard(pipeline: Pipeline, shard: int) -> int:
    """Once the server runs the shard's requests; returns the answers journaled by then (fewer than the shard's
    events, asserted at the end). The CPU server runs the whole shard as one batch, so its answers all end
    together: mid-shard is while they run."""
    wait_until(
        lambda: proto.parse_metrics(call(pipeline.url + "/metrics")[1]).get(proto.RUNNING_REQS, 0) >= 1,
        timeout_s=RUN_TIMEOUT_S,
        interval_s=0.2,
        what="the shard's requests running on the server",
    )
    return _journaled(pipeline, shard)


# The test's own deadlines bound it (the run, the server's restart, the rerun): the suite's 600 s limit alone would
# stop it mid-way on a busy machine, where the CPU server's restart takes 5 minutes.
@pytest.mark.timeout(RUN_TIMEOUT_S + SERVER_TIMEOUT_S + RUN_TIMEOUT_S)
def test_a_sigkill_of_the_server_mid_shard_loses_and_duplicates_nothing(pipeline):
    process, _ = _start_run(pipeline, 1, "sigkill")
    done_at_kill = _mid_shard(pipeline, 1)
    (member,) = pipeline.fleet_members()
    os.killpg(member["pid"], signal.SIGKILL)  # the server and every process of its group, at once
    wait_until(lambda: _gone(member["pid"]), timeout_s=60, what="the server to die")
    dflash(pipeline, *pipeline.fleet_up, timeout_s=SERVER_TIMEOUT_S)  # the node's operator starts it again
    _finish(pipeline, process, 1)
    events = _assert_exactly_once(pipeline.store, 1)
    assert done_at_kill < len(events), "the kill came after the shard's last answer"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _scheduler(member: dict) -> psutil.Process:
    (scheduler,) = [child for child in psutil.Process(member["pid"]).children() if child.name() == "sglang::scheduler"]
    return scheduler


def _set_aside(pipeline: Pipeline) -> bool:
    """Some run on the node set a server aside: the verdict in the node's shared ledger (`generation.ledger`)."""
    for path in (pipeline.work_dir / "fleet" / "ledger").glob("*.json"):
        try:
            if json.loads(path.read_bytes() or b"{}").get("set_aside_reason"):
                return True
        except ValueError:  # read between a writer's write and its truncate: read again
            pass
    return False


def test_a_sigstop_of_the_scheduler_mid_shard_loses_and_duplicates_nothing(pipeline):
    process, _ = _start_run(pipeline, 2, "sigstop")
    done_at_stop = _mid_shard(pipeline, 2)
    (member,) = pipeline.fleet_members()
    scheduler = _scheduler(member)
    # The stop is of a server in service: the SIGKILL test's verdict clears on its return, and a busy CPU server's
    # /health (one token behind the running batch, 20 s at most) may set it aside for a while on a loaded machine.
    wait_until(lambda: not _set_aside(pipeline), timeout_s=300, interval_s=1, what="the server in service")
    scheduler.send_signal(signal.SIGSTOP)
    try:
        # The HTTP front still answers (/metrics at once, /health 503 after 20 s): the run's checks find the hang.
        wait_until(lambda: _set_aside(pipeline), timeout_s=300, interval_s=1, what="the run to set the server aside")
    finally:
        scheduler.send_signal(signal.SIGCONT)
    _finish(pipeline, process, 2)
    events = _assert_exactly_once(pipeline.store, 2)
    assert done_at_stop < len(events), "the stop came after the shard's last answer"
