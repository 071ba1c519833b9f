"""The pilot before the job: without a passed pilot of their settings the shards refuse to start, in one line naming
the command to run; the pilot passes on the demo data with a simulator fleet, becomes the plan, and then the shards
generate, their manifests naming the pilot that cleared them. A fleet of empty answers blocks the pilot, and the
shards still refuse, naming the gates.

`dg.materialize` with the real resources against simulator processes; the tests' skip of the pilot
(tests/conftest.py) is taken away here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.pilot import pilot
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.generation.shards import read_completions_manifest
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.plan import read_plan
from dagster_project.ops.status import collect_status
from dagster_project.pilot_record import PILOT_COMMAND, read_pilot
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import FAST_ANSWERS

FINGERPRINT = GenerationSettings().fingerprint()


@dataclass
class Prepared:
    store: LocalStore
    instance: dg.DagsterInstance


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Iterator[Prepared]:
    """The demo's conversations, published once for the module (the shards' pilot required, as in every test)."""
    root = tmp_path_factory.mktemp("pilot")
    with dg.instance_for_test() as instance:
        store = LocalStore(root / "store")
        assert dg.materialize([raw_prompts, conversations], resources=_resources(store, []), instance=instance).success
        yield Prepared(store, instance)


def _resources(store: LocalStore, endpoints: list[str], generation: GenerationConfig | None = None) -> dict:
    return {
        "store": DatasetStore(root=store.uri, work_dir=str(store.root.parent / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": generation or GenerationConfig(),
        "fleet": SGLangFleet(endpoints=endpoints),
    }


def _materialize(prepared: Prepared, asset: dg.AssetsDefinition, endpoints: list[str], generation=None, **kwargs):
    return dg.materialize(
        [asset],
        resources=_resources(prepared.store, endpoints, generation),
        instance=prepared.instance,
        raise_on_error=False,
        **kwargs,
    )


def _failure(result: dg.ExecuteInProcessResult) -> str:
    (failure,) = result.get_step_failure_events()
    return failure.step_failure_data.user_failure_data.description


def test_shards_refuse_without_a_pilot_and_generate_after_it_passed(prepared, sim_fleet):
    fleet = sim_fleet(2, **FAST_ANSWERS)
    shard = layout.partition_key(0)

    refused = _materialize(prepared, completions, fleet.urls, partition_key=shard)
    assert not refused.success
    line = _failure(refused)
    assert "\n" not in line and PILOT_COMMAND in line and FINGERPRINT in line, line
    assert read_completions_manifest(prepared.store, 0) is None  # nothing was generated

    piloted = _materialize(prepared, pilot, fleet.urls)
    assert piloted.success
    record = read_pilot(prepared.store, FINGERPRINT)
    assert record.passed and not record.failed_gates, record.failed_gates
    assert record.answers >= record.conversations >= len({s.split(" / ")[0] for s in record.strata})
    assert not record.uncovered_strata and all(count >= 1 for count in record.strata.values())
    assert record.req_per_s > 0 and record.output_lengths.answers == record.ok > 0
    assert "completions/error_rate" in record.gates and "training_set/gx_suite" in record.gates
    (materialization,) = piloted.asset_materializations_for_node("pilot")
    assert materialization.metadata["answers"].value == record.answers
    plan = read_plan(prepared.store)
    assert plan.source == record.label() and plan.source.startswith(f"pilot of {record.answers} answers at ")
    assert plan.output_tokens_percentiles == record.output_lengths.percentiles

    generated = _materialize(prepared, completions, fleet.urls, partition_key=shard)
    assert generated.success
    manifest = read_completions_manifest(prepared.store, 0)
    assert manifest.pilot.startswith(record.label()) and not manifest.pilot_skipped


def test_a_pilot_of_empty_answers_is_blocked_and_the_shards_still_refuse(prepared, sim_fleet):
    fleet = sim_fleet(1, **FAST_ANSWERS)
    assert fleet.set_faults(0, empty=True)["empty"] is True
    other = GenerationConfig(temperature=0.7)  # other settings: their own pilot, whatever ran before
    plan_before = read_plan(prepared.store)

    blocked = _materialize(prepared, pilot, fleet.urls, other)
    assert not blocked.success
    record = read_pilot(prepared.store, other.to_dataclass().fingerprint())
    assert not record.passed and "completions/short_answers" in record.failed_gates, record.failed_gates
    assert "BLOCKED by" in _failure(blocked)
    assert read_plan(prepared.store) == plan_before  # a blocked pilot's figures are not a plan
    # `dflash status` says so before any shard is tried: its `pilot` alert names the gate and the command.
    (alert,) = [alert for alert in collect_status(prepared.store, []).alerts if alert.kind == "pilot"]
    assert (
        "BLOCKED by" in alert.message
        and "completions/short_answers" in alert.message
        and PILOT_COMMAND in alert.message
    )

    refused = _materialize(prepared, completions, fleet.urls, other, partition_key=layout.partition_key(1))
    line = _failure(refused)
    assert "blocked by" in line and "completions/short_answers" in line and PILOT_COMMAND in line, line


def test_a_pilot_failing_only_a_training_set_gate_is_blocked_and_its_config_thresholds_judge(prepared, sim_fleet):
    """Answers of one length pass every completions gate, and fail the training set's loss-mask concentration: the
    pilot blocks on it all the same, and the shards refuse. Its config's threshold (not the default) is the one
    judged: lifted there, the same answers pass."""
    fleet = sim_fleet(1, output_len="fixed:120", max_running_requests=8)
    one_length = GenerationConfig(temperature=0.6)  # its own settings: its own pilot
    fingerprint = one_length.to_dataclass().fingerprint()
    sample = {"share": 0.1}

    blocked = _materialize(prepared, pilot, fleet.urls, one_length, run_config=_pilot_config(sample))
    assert not blocked.success
    record = read_pilot(prepared.store, fingerprint)
    assert not record.passed and list(record.failed_gates) == ["training_set/loss_sum_concentration"], record.gates
    refused = _materialize(prepared, completions, fleet.urls, one_length, partition_key=layout.partition_key(2))
    assert "training_set/loss_sum_concentration" in _failure(refused) and PILOT_COMMAND in _failure(refused)

    lifted = _materialize(
        prepared, pilot, fleet.urls, one_length, run_config=_pilot_config({**sample, "max_top_loss_sum_share": 1.0})
    )
    assert lifted.success and read_pilot(prepared.store, fingerprint).passed


def _pilot_config(config: dict) -> dict:
    return {"ops": {"pilot": {"config": config}}}
