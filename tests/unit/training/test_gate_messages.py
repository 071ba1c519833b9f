"""A blocked gate's message says what to do: the threshold and its run config key, the override, example ids."""

from __future__ import annotations

import pyarrow as pa

from dagster_project.records import COMPLETION_SCHEMA
from dagster_project.tokenizer import special_ids
from dagster_project.training import gate_messages, gate_result, gates
from dagster_project.training.lengths import LengthGateOptions
from tests.support.training_shards import disaster_rows, healthy_rows, tokenizer

from .test_gates import _training_batch


def _actionable(
    profile: gates.ShardProfile, where: gate_messages.GateStage, limits
) -> dict[str, gate_result.GateResult]:
    special = special_ids(tokenizer())
    results = gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True)
    return {
        r.name: gate_messages.actionable(
            r, limits=limits, where=where, examples=gate_messages.example_ids(r, profile, limits)
        )
        for r in results
    }


def test_the_disaster_shard_is_blocked_naming_threshold_key_override_and_five_broken_rows():
    tok = tokenizer()
    rows = disaster_rows(100, broken_share=0.87)
    profile = gates.profile_training_batches([_training_batch(rows)], special_ids(tok), tok.decode)
    broken = {row["event_id"] for row in rows if len(row["output_ids"]) <= 6}
    results = _actionable(profile, gate_messages.TRAINING_GATES, gates.GateThresholds())

    concentration = results["loss_sum_concentration"]
    assert concentration.message.startswith("BLOCKED: 87% of rows (87/100) have loss_mask sum exactly 6")
    assert "threshold max_top_loss_sum_share=0.05, min_repeats=5 (run config of the training_set_gates check)" in (
        concentration.message
    )
    assert "override: once the failures are understood, materialize specforge_export and hf_export" in (
        concentration.message
    )
    examples = concentration.metadata["example_ids"]
    assert len(examples) == 5 and set(examples) <= broken
    assert f"examples: {', '.join(examples)}" in concentration.message
    for name in ("loss_sum_floor", "thinking_structure", "degenerate_answers", "short_answers"):
        assert not results[name].passed and set(results[name].metadata["example_ids"]) <= broken, name
        assert len(results[name].metadata["example_ids"]) == 5, name
    # A green gate keeps its message as it was.
    assert results["consecutive_supervised"].passed and "threshold" not in results["consecutive_supervised"].message


def test_completions_gates_point_at_the_training_set_override_and_name_answered_events():
    tok = tokenizer()
    rows = healthy_rows(20) + disaster_rows(40, broken_share=1.0)
    batches = pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA).to_batches(max_chunksize=16)
    profile = gates.profile_completion_batches(batches, special_ids(tok), tok.decode)
    short = _actionable(profile, gate_messages.COMPLETIONS_GATES, gates.GateThresholds())["short_answers"]
    assert not short.passed
    assert "(run config of the completions_quality check)" in short.message
    assert "materialize training_set for this shard with run config override_failed_gates: true" in short.message
    assert set(short.metadata["example_ids"]) <= {row["event_id"] for row in rows[20:]}


def test_a_gate_without_rows_to_show_still_names_its_key():
    failed = gate_result.GateResult("length_loss", False, "BLOCKED: 9.0% of supervised tokens were cut", {})
    message = gate_messages.actionable(failed, limits=LengthGateOptions(), where=gate_messages.TRAINING_GATES).message
    assert "threshold max_lost_supervised_share=" in message and "examples:" not in message


def test_a_gate_failing_on_answers_names_the_servers_that_wrote_them():
    tok = tokenizer()
    special = special_ids(tok)
    rows = healthy_rows(12)
    wrong = "http://127.0.0.1:30007"
    for row in rows[:3]:  # a server of a larger vocabulary answered these
        row.update(output_ids=[*row["output_ids"][:-1], special.vocab_size + 5], server=wrong)
    batches = pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA).to_batches(max_chunksize=5)
    profile = gates.profile_completion_batches(batches, special, tok.decode)
    (result,) = [r for r in gates.shard_gates(profile, vocab_size=special.vocab_size, enable_thinking=True)
                 if r.name == "ids_in_vocabulary"]  # fmt: skip
    limits = gates.GateThresholds()
    servers = gate_messages.writing_servers(result, profile, limits)
    assert servers == {wrong: 3}  # the healthy server wrote no failing row: not named
    message = gate_messages.actionable(
        result, limits=limits, where=gate_messages.COMPLETIONS_GATES, servers=servers
    ).message
    assert f"written by 1 server: {wrong} (3 rows)" in message
    assert "http://127.0.0.1:30000" not in message
