"""What a pilot decides for the shards (the fingerprint gate), what it records, and the plan it becomes."""

from __future__ import annotations

import numpy as np
import pytest

from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.plan import Plan
from dagster_project.pilot.stage import plan_from_pilot
from dagster_project.pilot_record import (
    PILOT_COMMAND,
    LengthDistribution,
    PilotRecord,
    clearance,
    read_latest_pilot,
    read_pilot,
    read_pilot_runs,
    write_pilot,
)
from dagster_project.settings import SettingsError, skip_pilot
from dagster_project.store.storage import LocalStore

SETTINGS = GenerationSettings()
FINGERPRINT = SETTINGS.fingerprint()


def _record(passed: bool = True, fingerprint: str = FINGERPRINT, **fields) -> PilotRecord:
    return PilotRecord(
        passed=passed,
        settings_fingerprint=fingerprint,
        finished_at=1_796_000_000.0,
        answers=40,
        ok=39,
        errors=1,
        req_per_s=2.5,
        output_tok_per_s=750.0,
        avg_prompt_tokens=120.0,
        servers=["http://127.0.0.1:1", "http://127.0.0.1:2"],
        output_lengths=LengthDistribution.of(np.arange(1, 40) * 10),
        failed_gates={} if passed else {"completions/short_answers": "BLOCKED: 87% empty"},
        **fields,
    )


def test_no_pilot_refuses_in_one_line_naming_the_command(tmp_path):
    decision = clearance(LocalStore(tmp_path), FINGERPRINT)
    assert not decision.allowed and not decision.skipped
    assert "\n" not in decision.message and PILOT_COMMAND in decision.message and FINGERPRINT in decision.message
    assert "DFLASH_SKIP_PILOT=1" in decision.message


def test_only_a_passed_pilot_of_the_same_fingerprint_clears(tmp_path):
    store = LocalStore(tmp_path)
    write_pilot(store, _record(fingerprint="other-settings"))
    assert not clearance(store, FINGERPRINT).allowed  # a pilot of other settings says nothing of these

    write_pilot(store, _record(passed=False))
    blocked = clearance(store, FINGERPRINT)
    assert not blocked.allowed and "blocked by completions/short_answers" in blocked.message

    write_pilot(store, _record())
    cleared = clearance(store, FINGERPRINT)
    assert cleared.allowed and cleared.message.startswith("pilot of 40 answers at ") and not cleared.skipped
    assert read_pilot(store, FINGERPRINT) == read_latest_pilot(store) == _record()


def test_a_pilot_under_another_tokenizer_clears_nothing_of_this_model(tmp_path):
    store = LocalStore(tmp_path)
    write_pilot(store, _record(tokenizer="qwen3.6-fingerprint"))
    refused = clearance(store, FINGERPRINT, tokenizer="deepseek-fingerprint")
    assert not refused.allowed and PILOT_COMMAND in refused.message
    assert "ran under tokenizer qwen3.6-fingerprint, not deepseek-fingerprint" in refused.message
    assert clearance(store, FINGERPRINT, tokenizer="qwen3.6-fingerprint").allowed
    write_pilot(store, _record())  # a record from before tokenizers were recorded: unknown, not a mismatch
    assert clearance(store, FINGERPRINT, tokenizer="deepseek-fingerprint").allowed


def test_every_pilot_run_is_kept_for_the_ledger_though_the_next_of_its_settings_replaces_it(tmp_path):
    store = LocalStore(tmp_path)
    runs = [_record(passed=False, started_at=10.0, output_tokens=300), _record(started_at=20.0, output_tokens=310)]
    for run in runs:
        write_pilot(store, run)
    assert read_pilot(store, FINGERPRINT) == runs[-1]  # what clears the shards: the last one
    assert read_pilot_runs(store) == runs  # what the fleet generated: both


def test_the_skip_switch_clears_and_says_so(tmp_path):
    decision = clearance(LocalStore(tmp_path), FINGERPRINT, skip=True)
    assert decision.allowed and decision.skipped and "skipped" in decision.message


def test_length_distribution_percentiles_and_power_of_two_histogram():
    lengths = LengthDistribution.of(np.array([1, 2, 3, 100, 129, 256, 257, 4000]))
    assert lengths.answers == 8 and lengths.percentiles["max"] == 4000.0
    assert lengths.histogram == {"<=1": 1, "<=2": 1, "<=4": 1, "<=128": 1, "<=256": 2, "<=512": 1, "<=4096": 1}
    assert LengthDistribution.of(np.array([], dtype=np.int64)).describe() == "no answers"


def test_a_passed_pilot_becomes_the_plan_keeping_the_fleet_and_price_of_the_earlier_one():
    record = _record(accept_length=2.75)
    earlier = Plan("operator estimate", 5.0, 2000, 10000, gpus=7, cost_per_hour=27.0, prompts=913_786)
    plan = plan_from_pilot(record, earlier)
    assert plan.source == record.label() and plan.req_per_s == 2.5 and plan.avg_output_tokens == 200.0
    assert (plan.gpus, plan.cost_per_hour, plan.prompts) == (7, 27.0, 913_786)
    assert plan.accept_length == 2.75 and plan.error_share == 0.025
    assert plan.output_tokens_percentiles["p50"] == 200.0
    assert plan.sample_answers == record.answers
    assert plan_from_pilot(record, None).gpus == 2  # a GPU per server the pilot used


@pytest.mark.parametrize(("value", "skips"), [("", False), ("0", False), ("1", True), ("true", True)])
def test_the_skip_switch_is_read_from_the_environment_when_a_run_starts(monkeypatch, value, skips):
    monkeypatch.setenv("DFLASH_SKIP_PILOT", value)
    assert skip_pilot() is skips


def test_a_skip_switch_that_is_neither_on_nor_off_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("DFLASH_SKIP_PILOT", "maybe")
    with pytest.raises(SettingsError, match="DFLASH_SKIP_PILOT must be 1 or 0"):
        skip_pilot()
