"""Acceptance: a server whose context or KV pool cannot hold the configured budget stops the run before any
request, with the flag to change (the prompt budget from the conversations manifest, max_new_tokens from the
generation settings, the EAGLE draft reserve from the server)."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.preflight import BudgetError
from dagster_project.generation.stage import generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.partitions import NUM_SHARDS
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.settings import DEMO_DATA_DIR
from tests.support.ingest_helpers import run_stages

# The conversations are built with max_prompt_tokens 2,048; answers may run to 1,024 tokens: a request of the
# full budget needs 2,048 + 1,024 + 4 reserved draft tokens = 3,076 tokens of context.
MAX_PROMPT_TOKENS = 2048
SETTINGS = GenerationSettings(max_new_tokens=1024)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # As many shards as the definitions' partitions, so the asset accepts the store.
    return run_stages(tmp_path_factory.mktemp("preflight"), [str(DEMO_DATA_DIR)], num_shards=NUM_SHARDS,
                      max_prompt_tokens=MAX_PROMPT_TOKENS).store  # fmt: skip


def dispatcher(fleet) -> Dispatcher:
    return Dispatcher(fleet.urls, DispatchOptions(fleet_down_grace_s=1, probe_interval_s=0.1))


@pytest.mark.parametrize(
    ("limits", "flag"),
    [
        # 3,072 tokens of context: four short of the budget with its draft reserve.
        ({"context_length": 3072}, "--context-length 3,076"),
        # A KV pool of 3,000 tokens (the memory a large state pool leaves, say).
        ({"token_capacity": 3000}, "--mem-fraction-static"),
    ],
    ids=["context", "kv-pool"],
)
def test_a_server_that_cannot_hold_the_budget_stops_the_shard_before_any_request(
    store, tokenizer, sim_fleet, tmp_path, limits, flag
):
    fleet = sim_fleet(2, [{}, limits], enable_metrics=True)
    with pytest.raises(BudgetError) as caught:
        generate_shard(
            store, 0, tokenizer=tokenizer, settings=SETTINGS, dispatcher=dispatcher(fleet), work_dir=tmp_path
        )
    message = str(caught.value)
    assert flag in message and fleet.url(1) in message and fleet.url(0) not in message
    assert "nothing was sent" in message
    assert fleet.requests(0) == [] and fleet.requests(1) == []  # not one request reached either server
    # The same servers hold a budget that fits.
    roomy = sim_fleet(1)
    manifest = generate_shard(
        store, 0, tokenizer=tokenizer, settings=SETTINGS, dispatcher=dispatcher(roomy), work_dir=tmp_path / "ok"
    )
    assert manifest.ok == manifest.rows > 0


# The shard's own checks before its first request are under test: a pilot on these fleets runs the same checks and
# stops at them first (tests/integration/test_pilot.py passes one on a fleet that holds the budget).
WITHOUT_PILOT = pytest.mark.without_pilot(reason="the shard's preflight is under test; a pilot would stop at it first")


@WITHOUT_PILOT
def test_the_completions_asset_fails_with_the_flag_and_sends_nothing(store, sim_fleet, tmp_path):
    fleet = sim_fleet(1, context_length=3072)
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "fleet": SGLangFleet(endpoints=fleet.urls),
        "generation": GenerationConfig(max_new_tokens=SETTINGS.max_new_tokens),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [completions], partition_key="shard-00000", resources=resources, instance=instance, raise_on_error=False
        )
    assert not result.success
    failure = next(event for event in result.all_events if event.is_step_failure)
    assert "--context-length 3,076" in str(failure.step_failure_data.error)
    assert fleet.requests(0) == []


@WITHOUT_PILOT
def test_a_fleet_of_another_model_fails_the_completions_asset_naming_the_server_before_any_request(
    store, sim_fleet, tmp_path
):
    """The trial of issue 36: a simulator declaring Llama in /server_info and /model_info. The fleet resource checks
    the served model by default (Qwen3.6-27B): the shard fails naming the server and what differs, and not one of
    the shard's requests reached it (its log holds only the one-token probes)."""
    fleet = sim_fleet(1, model_path="meta-llama/Llama-3.1-8B-Instruct")
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "fleet": SGLangFleet(endpoints=fleet.urls),
        "generation": GenerationConfig(max_new_tokens=SETTINGS.max_new_tokens),
    }
    # The project's loggers reach the run log, as dagster.yaml sets it.
    with dg.instance_for_test(overrides={"python_logs": {"managed_python_loggers": ["dagster_project"]}}) as instance:
        result = dg.materialize(
            [completions], partition_key="shard-00000", resources=resources, instance=instance, raise_on_error=False
        )
        logged = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any(f"server {fleet.url(0)} set aside (served_model_mismatch" in line for line in logged)
    assert not result.success
    error = str(next(event for event in result.all_events if event.is_step_failure).step_failure_data.error)
    assert "ServedModelMismatch" in error and "no server serves Qwen/Qwen3.6-27B" in error
    assert f"{fleet.url(0)}: served_model_mismatch" in error and "meta-llama/Llama-3.1-8B-Instruct" in error
    assert fleet.job_requests(0) == [] and fleet.requests(0)  # probed, never asked
