"""The SpecForge export meets the pre-tokenized JSONL contract its trainer reads as is.

The rules checked are those of SpecForge's `prepare_prompt_tasks` fast path (reference drafter_data.md
§2.4): a file is pre-tokenized when its first record has both `input_ids` and `loss_mask`; each record
holds two one-dimensional integer sequences of equal, non-zero length, the mask in {0, 1}; and DFlash keeps
a row only with two consecutive supervised tokens.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.store.storage import LocalStore, StoreError
from dagster_project.training.export import (
    REQUIRED_VERDICTS,
    ExportOptions,
    LossMaskTooSmall,
    ShardNotCleared,
    export_shard,
    record_verdict,
    specforge_key,
)
from dagster_project.training.hf_export import (
    CARD_ATTEMPTS,
    CARD_KEY,
    DATA_PATTERN,
    data_key,
    export_hf_shard,
    write_dataset_card,
)
from dagster_project.training.shards import TrainingShardNotPublished, iter_training_batches, training_manifest
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.published import republish_as_edited
from tests.support.training_shards import healthy_rows, publish_completions


def _specforge_rejects(record: dict) -> str | None:
    """Why SpecForge's pre-tokenized reader (with the DFlash filter) would refuse the record, or None."""
    ids, mask = record.get("input_ids"), record.get("loss_mask")
    if not isinstance(ids, list) or not isinstance(mask, list):
        return "input_ids and loss_mask must both be sequences"
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        return "input_ids must be integers"
    if any(m not in (0, 1) or isinstance(m, bool) for m in mask):
        return "loss_mask must be 0 or 1"
    if len(ids) != len(mask) or not ids:
        return "lengths differ or the row is empty"
    if not any(a == b == 1 for a, b in zip(mask[:-1], mask[1:], strict=True)):
        return "no two consecutive supervised tokens"
    return None


def _clear(store: LocalStore, shard: int) -> None:
    """What the training checks record when every gate passes."""
    for check in REQUIRED_VERDICTS:
        record_verdict(store, training_manifest(store, shard), check, {})


@pytest.fixture
def store(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    for shard in (0, 2):
        publish_completions(store, shard, healthy_rows(12, shard=shard))
        assemble_shard(store, shard, AssemblyOptions(), tmp_path / "staging")
        _clear(store, shard)
    return store


def test_each_line_is_a_training_row_in_the_pre_tokenized_contract(store, tmp_path):
    written = export_shard(store, 2, tmp_path / "staging")
    lines = store.get_bytes(specforge_key(2)).decode().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(set(record) == {"input_ids", "loss_mask"} for record in records)
    assert [_specforge_rejects(record) for record in records] == [None] * 12
    training = [row for batch in iter_training_batches(store, 2) for row in batch.to_pylist()]
    assert [(r["input_ids"], r["loss_mask"]) for r in records] == [(r["input_ids"], r["loss_mask"]) for r in training]
    assert written.rows == 12 and written.loss_tokens == sum(sum(r["loss_mask"]) for r in training)
    assert specforge_key(2) == "exports/specforge/shard=00002.jsonl"


def test_shard_files_concatenate_into_one_training_file_in_shard_order(store, tmp_path):
    for shard in (2, 0):
        export_shard(store, shard, tmp_path / "staging")
    keys = sorted(info.key for info in store.list("exports/specforge/"))
    assert keys == [specforge_key(0), specforge_key(2)]
    joined = b"".join(store.get_bytes(key) for key in keys).decode().splitlines()
    assert len(joined) == 24 and all(_specforge_rejects(json.loads(line)) is None for line in joined)


def test_an_unassembled_shard_is_not_exported(store, tmp_path):
    with pytest.raises(TrainingShardNotPublished, match="training_set shard 1 has no manifest"):
        export_shard(store, 1, tmp_path / "staging")


def test_a_shard_that_failed_or_skipped_its_checks_is_not_exported(store, tmp_path):
    manifest = training_manifest(store, 0)
    record_verdict(
        store,
        manifest,
        "gates",
        {"loss_sum_concentration": "BLOCKED: 87% of rows (87/100) have loss_mask sum exactly 6"},
    )
    with pytest.raises(ShardNotCleared, match="gates/loss_sum_concentration: BLOCKED: 87% of rows"):
        export_shard(store, 0, tmp_path / "staging")
    # Re-assembling publishes the shard anew: verdicts on the old publication no longer count.
    _clear(store, 0)
    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    with pytest.raises(ShardNotCleared, match="gates has not run on this publication"):
        export_shard(store, 0, tmp_path / "staging")
    assert not store.exists(specforge_key(0))


def test_an_operator_may_export_a_shard_that_failed_a_gate_but_not_one_never_checked(store, tmp_path):
    failure = {"loss_sum_concentration": "BLOCKED: 87% of rows (87/100) have loss_mask sum exactly 6"}
    record_verdict(store, training_manifest(store, 0), "gates", failure)
    with pytest.raises(ShardNotCleared, match="set override_failed_gates: true in specforge_export's config"):
        export_shard(store, 0, tmp_path / "staging")
    written = export_shard(store, 0, tmp_path / "staging", override_failed_gates=True)
    assert written.rows == 12 and written.overridden == {
        "gates/loss_sum_concentration": failure["loss_sum_concentration"]
    }

    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")  # a new publication: no verdict yet
    with pytest.raises(ShardNotCleared, match="gates has not run .*To export it: run the training_set checks"):
        export_shard(store, 0, tmp_path / "staging", override_failed_gates=True)


def _zero_the_mask_of(store: LocalStore, shard: int, row: int) -> str:
    """Publish the shard again with one row's loss mask all zeros (what a bug upstream would publish), its checks
    passed on it."""
    manifest = training_manifest(store, shard)
    key = manifest.data_keys[0]
    table = pq.read_table(store.root / key)
    masks = table.column("loss_mask").to_pylist()
    masks[row] = [0] * len(masks[row])
    column = table.schema.get_field_index("loss_mask")
    pq.write_table(table.set_column(column, "loss_mask", pa.array(masks, pa.list_(pa.int8()))), store.root / key)
    republish_as_edited(store, manifest)
    _clear(store, shard)
    return table.column("event_id")[row].as_py()


def test_a_row_with_an_all_zero_loss_mask_is_never_exported_even_with_gates_overridden(store, tmp_path):
    event = _zero_the_mask_of(store, 0, 4)
    record_verdict(store, training_manifest(store, 0), "gates", {"consecutive_supervised": "BLOCKED: 1/12 rows"})
    with pytest.raises(
        LossMaskTooSmall,
        match=rf"holds 1 rows whose loss mask sums to less than 2 \(1 all zero\), "
        rf"e.g. \['{event}'\]",
    ):
        export_shard(store, 0, tmp_path / "staging", override_failed_gates=True)
    assert not store.exists(specforge_key(0))


def test_the_loss_token_minimum_is_configurable(store, tmp_path):
    smallest = min(sum(row["loss_mask"]) for batch in iter_training_batches(store, 2) for row in batch.to_pylist())
    assert export_shard(store, 2, tmp_path / "staging", options=ExportOptions(min_loss_tokens=smallest)).rows == 12
    with pytest.raises(LossMaskTooSmall, match=rf"holds 1 rows whose loss mask sums to less than {smallest + 1} "):
        export_shard(store, 2, tmp_path / "staging", options=ExportOptions(min_loss_tokens=smallest + 1))
    with pytest.raises(ValueError, match="an all-zero mask is never exported"):
        ExportOptions(min_loss_tokens=0)


def test_the_parquet_export_loads_with_datasets_and_its_card_describes_it(store, tmp_path):
    import datasets  # a [dev] dependency, loaded as a trainer loads it

    for shard in (0, 2):
        export_hf_shard(store, shard, tmp_path / "staging")
    write_dataset_card(store)
    root = store.root / "exports" / "hf"
    training = [row for shard in (0, 2) for batch in iter_training_batches(store, shard) for row in batch.to_pylist()]

    loaded = datasets.load_dataset(
        "parquet", data_files=str(root / DATA_PATTERN), split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    assert loaded.num_rows == 24 and loaded.to_list() == training
    assert {"input_ids", "loss_mask", "server", "weight_version", "spec_accept_length"} <= set(loaded.column_names)
    # A copy of the prefix loads by its card alone: the YAML header names the files and the split.
    by_card = datasets.load_dataset(str(root), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert by_card["event_id"] == [row["event_id"] for row in training]

    card = store.get_bytes(CARD_KEY).decode()
    assert card.startswith("---\nconfigs:\n- config_name: default\n")
    assert "| 2 | 24 |" in card  # shards, rows
    assert "| demo | 24 | 100.0% |" in card  # sources
    assert 'a spec the source gave bare, as `{name, description, parameters}`, was wrapped as `{"type": ' in card
    assert "2 of 2 shards passed every check (gates, gx_suite" in card
    assert "| 4096 | keep | 2 |" in card
    # Where the generated output tokens went, as the training manifests counted them (the waste ledger's source).
    trained = sum(training_manifest(store, shard).output_tokens_by_outcome["trained"] for shard in (0, 2))
    assert "## Generated, not trained" in card and f"| trained | {trained:,} |" in card
    assert data_key(2) == "exports/hf/data/train-00002.parquet"


def test_the_parquet_export_refuses_what_the_jsonl_export_refuses(store, tmp_path):
    _zero_the_mask_of(store, 2, 0)
    with pytest.raises(LossMaskTooSmall, match="training_set shard 2 holds 1 rows"):
        export_hf_shard(store, 2, tmp_path / "staging")
    record_verdict(store, training_manifest(store, 0), "gates", {"short_answers": "BLOCKED: 30% short"})
    with pytest.raises(ShardNotCleared, match="set override_failed_gates: true in hf_export's config"):
        export_hf_shard(store, 0, tmp_path / "staging")
    assert not store.exists(data_key(2)) and not store.exists(data_key(0)) and not store.exists(CARD_KEY)


def test_the_card_is_rebuilt_when_another_runs_card_replaced_it_and_a_lasting_failure_still_fails(store, tmp_path):
    export_hf_shard(store, 0, tmp_path / "staging")
    put_bytes = store.put_bytes
    replaced = {"times": 1}

    def another_run_wrote_the_card_first(key, data):
        put_bytes(key, data)
        if key == CARD_KEY and replaced["times"]:
            replaced["times"] -= 1
            raise StoreError(f"upload of {key} did not verify")

    store.put_bytes = another_run_wrote_the_card_first
    assert "| 1 | 12 |" in write_dataset_card(store) and replaced["times"] == 0
    replaced["times"] = CARD_ATTEMPTS
    with pytest.raises(StoreError, match="did not verify"):
        write_dataset_card(store)


def test_the_card_names_the_quality_watch_gates_a_released_hold_overrode():
    from dagster_project.training.hf_export import HfShardExport, dataset_card

    why = "watch hold released as a false alarm by ana at 2026-12-04 21:30 UTC: known"
    card = dataset_card([HfShardExport(shard=3, key="k", rows=1, hold_overrides={"short_answers": why})])
    assert f"- short_answers: {why}" in card and "a hold of the line released as a false alarm" in card
    assert "released as a false alarm" not in dataset_card([HfShardExport(shard=3, key="k", rows=1)])
