"""What a job's shards are made from is part of its identity: the tokenizer with its chat template, and the
conversations as published. A shard made under another tokenizer is refused, a store holding two is an alert,
and a shard made from conversations edited since is an alert and is not exported until it is regenerated or
accepted (issue #43, items 4 and 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.hf_export import hf_export
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks.training_set import training_set_gates, training_set_gx_suite
from dagster_project.generation.shards import completions_manifest
from dagster_project.partitions import NUM_SHARDS
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import BUILTIN_TOKENIZER, load_tokenizer, tokenizer_identity
from dagster_project.training.export import specforge_key
from dagster_project.training.shards import training_manifest
from tests.support.dagster_helpers import FAST_ANSWERS, pipeline_env
from tests.support.pilots import pass_pilot
from tests.support.tokenizer_copies import USER_TURNS_PREFIXED, tokenizer_copy

SHARD_0, SHARD_1 = layout.partition_keys(2)
TRAINING = [training_set, training_set_gates, training_set_gx_suite]


class Job:
    """A local store, a fleet, and each stage materialized in this process under a given tokenizer."""

    def __init__(
        self, tmp_path: Path, fleet_urls: list[str], instance: dg.DagsterInstance, prompts: Path | None = None
    ):
        self.tmp_path = tmp_path
        self.store = LocalStore(tmp_path / "store")
        self.fleet_urls = fleet_urls
        self.instance = instance
        self.prompts = prompts

    def resources(self, tokenizer: str) -> dict:
        return {
            "store": DatasetStore(root=self.store.uri, work_dir=str(self.tmp_path / "work"), s3=S3Resource()),
            "tokenizer": TokenizerResource(name_or_path=tokenizer),
            "fleet": SGLangFleet(endpoints=self.fleet_urls),
            "generation": GenerationConfig(),
        }

    def materialize(
        self, assets: list, tokenizer: str = BUILTIN_TOKENIZER, partition: str | None = None, run_config=None
    ) -> dg.ExecuteInProcessResult:
        if self.prompts is not None and raw_prompts in assets:
            run_config = {"ops": {"raw_prompts": {"config": {"sources": [str(self.prompts)]}}}}
        return dg.materialize(
            assets,
            partition_key=partition,
            resources=self.resources(tokenizer),
            instance=self.instance,
            run_config=run_config,
            raise_on_error=False,
        )

    def status(self) -> str:
        """`dflash status`, as the operator runs it against the store."""
        env = pipeline_env(
            home=self.tmp_path / "home", store=self.store.root, work_dir=self.tmp_path / "work", num_shards=NUM_SHARDS
        )
        done = subprocess.run(
            [sys.executable, "-m", "dagster_project.cli", "status"], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout


def refusal(result: dg.ExecuteInProcessResult) -> str:
    """The one line a refused step fails with."""
    assert not result.success
    (failure,) = result.get_step_failure_events()
    error = failure.step_failure_data.error
    assert error.cls_name == "Failure" and error.cause is None, error.to_string()
    return error.message


def alerts(status: str) -> list[str]:
    return [line.strip() for line in status.split("\n") if line.strip().startswith("ALERT [")]


@pytest.fixture
def edited_tokenizer(tmp_path) -> str:
    """`DFLASH_TOKENIZER` pointing at a local copy of the tokenizer whose chat template was edited."""
    return str(tokenizer_copy(tmp_path / "edited-tokenizer", template_edit=USER_TURNS_PREFIXED))


def fingerprints(edited: str) -> tuple[str, str]:
    return (
        tokenizer_identity(load_tokenizer(BUILTIN_TOKENIZER)).fingerprint,
        tokenizer_identity(load_tokenizer(edited)).fingerprint,
    )


@pytest.fixture
def shard_0_built_in(tmp_path, sim_fleet) -> Iterator[Job]:
    """A job whose conversations and completions shard 0 were made under the built-in tokenizer."""
    fleet = sim_fleet(1, **FAST_ANSWERS)
    with dg.instance_for_test() as instance:
        job = Job(tmp_path, fleet.urls, instance)
        assert job.materialize([raw_prompts, conversations]).success
        pass_pilot(job.resources(BUILTIN_TOKENIZER), instance)
        assert job.materialize([completions], partition=SHARD_0).success
        yield job


def test_a_shard_under_an_edited_chat_template_is_refused_naming_both_fingerprints(shard_0_built_in, edited_tokenizer):
    job = shard_0_built_in
    builtin, edited = fingerprints(edited_tokenizer)
    # The built-in tokenizer's pilot clears nothing under the edited one: the refusal names the pilot first.
    first = refusal(job.materialize([completions], tokenizer=edited_tokenizer, partition=SHARD_1))
    assert f"ran under tokenizer {builtin}, not {edited}" in first

    pass_pilot(job.resources(edited_tokenizer), job.instance)
    message = refusal(job.materialize([completions], tokenizer=edited_tokenizer, partition=SHARD_1))

    assert f"conversations shard 1 was made under tokenizer {builtin} ({BUILTIN_TOKENIZER})" in message
    assert f"this run's is {edited} ({edited_tokenizer}) (chat template differs)" in message
    assert not job.store.exists(layout.shard_manifest_key(layout.COMPLETIONS, 1))  # nothing generated, nothing mixed
    assert completions_manifest(job.store, 0).tokenizer.fingerprint == builtin


def test_status_alerts_on_two_tokenizers_and_training_refuses_the_other_ones_shard(shard_0_built_in, edited_tokenizer):
    """The trial: shard 0 made under the built-in tokenizer, shard 1 under an edited copy (the conversations built
    again under it): both publish, but the store holds two renderings."""
    job = shard_0_built_in
    builtin, edited = fingerprints(edited_tokenizer)
    assert job.materialize([conversations], tokenizer=edited_tokenizer).success
    pass_pilot(job.resources(edited_tokenizer), job.instance)  # the edited tokenizer's own pilot
    assert job.materialize([completions], tokenizer=edited_tokenizer, partition=SHARD_1).success

    (alert,) = [line for line in alerts(job.status()) if line.startswith("ALERT [tokenizer]")]
    assert f"{builtin} ({BUILTIN_TOKENIZER}): completions 0" in alert
    assert f"{edited} ({edited_tokenizer}): conversations 0-{NUM_SHARDS - 1}; completions 1" in alert

    message = refusal(job.materialize([training_set], tokenizer=edited_tokenizer, partition=SHARD_0))
    assert f"completions shard 0 was made under tokenizer {builtin} ({BUILTIN_TOKENIZER})" in message
    assert f"this run's is {edited} ({edited_tokenizer})" in message
    assert "--select 'completions, training_set, specforge_export, hf_export' --partition shard-00000" in message

    assert job.materialize([training_set], tokenizer=edited_tokenizer, partition=SHARD_1).success
    assert training_manifest(job.store, 1).source.tokenizer.fingerprint == edited


def write_prompts(path: Path, wording: str) -> Path:
    """Ten questions with their own ids: an edit changes their text, not their ids."""
    with open(path, "w") as handle:
        for i in range(10):
            handle.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": wording.format(i)}]}))
            handle.write("\n")
    return path


def test_edited_conversations_are_an_alert_and_their_shard_is_not_exported_until_accepted(tmp_path, sim_fleet):
    fleet = sim_fleet(1, **FAST_ANSWERS)
    prompts = write_prompts(tmp_path / "prompts.jsonl", "Question {}: how do tides work?")
    with dg.instance_for_test() as instance:
        job = Job(tmp_path, fleet.urls, instance, prompts=prompts)
        assert job.materialize([raw_prompts, conversations]).success
        pass_pilot(job.resources(BUILTIN_TOKENIZER), instance)
        assert job.materialize([completions, *TRAINING], partition=SHARD_0).success
        assert alerts(job.status()) == []

        write_prompts(prompts, "Question {}: why is the sky blue?")  # edited after the shard was published
        assert job.materialize([raw_prompts, conversations]).success

        stale = [line for line in alerts(job.status()) if line.startswith("ALERT [conversations]")]
        assert stale and "completions 0; training_set 0" in stale[0]
        assert "--select 'completions, training_set, specforge_export, hf_export' --partition shard-00000" in stale[0]
        for export in (specforge_export, hf_export):
            message = refusal(job.materialize([export], partition=SHARD_0))
            assert "training_set shard 0 was made from conversations shard 0 as it was before its" in message
            assert "accept_stale_conversations: true" in message
        assert not job.store.exists(specforge_key(0))
        message = refusal(job.materialize([training_set], partition=SHARD_0))
        assert "completions shard 0 was made from conversations shard 0 as it was before its" in message

        accepted = {"ops": {"training_set": {"config": {"accept_stale_conversations": True}}}}
        assert job.materialize([*TRAINING, specforge_export], partition=SHARD_0, run_config=accepted).success
        assert training_manifest(job.store, 0).source.stale_conversations_accepted
        assert job.store.exists(specforge_key(0))
        assert [line for line in alerts(job.status()) if "training_set 0" in line] == []
