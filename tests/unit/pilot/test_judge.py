"""The pilot's gates judge by its config: the completions gates and the training-set gates with the thresholds the
pilot was given (`PilotLimits`), not the stages' defaults; and a training-set gate failing alone fails the pilot."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.generation_settings import GenerationSettings
from dagster_project.pilot.stage import PilotLimits, _judge
from dagster_project.records import COMPLETION_SCHEMA
from dagster_project.training import gate_sets
from dagster_project.training.gates import GateThresholds
from tests.support.dagster_helpers import LIFTED_ANSWER_GATES
from tests.support.training_shards import disaster_rows, templated_rows, tokenizer


def _failed(rows: list[dict], limits: PilotLimits, tmp_path) -> set[str]:
    path = tmp_path / "completions.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA), path)
    counts = gate_sets.EventCounts(
        rows=len(rows), errors=0, errors_by_kind={}, length_capped=0, max_new_tokens=GenerationSettings().max_new_tokens
    )
    results, _ = _judge(pq.ParquetFile(path), counts, GenerationSettings(), tokenizer(), limits)
    return {result.name for result in results if not result.passed}


def test_the_completions_gates_judge_by_the_pilots_thresholds(tmp_path):
    rows = disaster_rows(60)
    assert "completions/thinking_structure" in _failed(rows, PilotLimits(), tmp_path)
    lifted = PilotLimits(thresholds=GateThresholds(**LIFTED_ANSWER_GATES))
    assert not {gate for gate in _failed(rows, lifted, tmp_path) if gate.startswith("completions/")}


def test_a_training_set_gate_failing_alone_fails_the_pilot_and_its_threshold_is_the_pilots(tmp_path):
    rows = templated_rows(60, 20)  # one answer shape repeated: only the loss-mask concentration fails
    assert _failed(rows, PilotLimits(), tmp_path) == {"training_set/loss_sum_concentration"}
    lifted = PilotLimits(thresholds=GateThresholds(max_top_loss_sum_share=1.0))
    assert _failed(rows, lifted, tmp_path) == set()
