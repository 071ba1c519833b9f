"""Integrity on read: bytes changed inside a published object (the same size, so no listing shows it) are refused by
every stage that reads it, with a message naming the object and the command that withdraws and regenerates its
shard. The readers are the stages' own functions: training_set and the completions checks read completions;
generation reads conversations; the exports and the training checks read the training set; the mixture report
reads both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dagster_project.conversations.shards import read_conversations, read_shard_conversations_manifest
from dagster_project.generation.shards import iter_completion_batches, read_completions_manifest
from dagster_project.ops.answers.shards import (
    DAMAGED,
    EXPORTED,
    NOT_EXPORTED,
    ON_DAMAGED,
    PASSED,
    REFUSED,
    WAITING,
)
from dagster_project.ops.coverage import COVERAGE_KEY, dataset_coverage, write_coverage
from dagster_project.ops.status import collect_status
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, TRAINING_SET, regenerate_command
from dagster_project.store.manifest import DamagedObject, ShardManifest, publish_shard, verify_shard
from dagster_project.store.storage import LocalStore
from dagster_project.training.export import REQUIRED_VERDICTS, export_shard, record_verdict
from dagster_project.training.hf_export import export_hf_shard
from dagster_project.training.mixture import mixture_report
from dagster_project.training.shards import iter_training_batches, read_training_manifest, training_manifest
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.ingest_helpers import questions_in_shards
from tests.support.training_shards import healthy_rows, publish_completions


@pytest.fixture
def store(tmp_path) -> LocalStore:
    """Conversations in two shards; shard 0's completions and training shard published and cleared for export."""
    store = questions_in_shards(tmp_path)
    publish_completions(store, 0, healthy_rows(12))
    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    for check in REQUIRED_VERDICTS:
        record_verdict(store, training_manifest(store, 0), check, {})
    return store


def zero_bytes_inside(path: Path, column: str | None, count: int = 64) -> None:
    """Zero up to `count` bytes in the middle of a Parquet column's first chunk (of the file, for JSON Lines): the
    file keeps its size, and a reader of other columns never touches the damaged bytes."""
    start, size = 0, path.stat().st_size
    if column is not None:
        group = pq.ParquetFile(path).metadata.row_group(0)
        (chunk,) = [group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == column]
        start, size = chunk.dictionary_page_offset or chunk.data_page_offset, chunk.total_compressed_size
    count = min(count, size // 2)
    at = start + (size - count) // 2
    data = bytearray(path.read_bytes())
    assert data[at : at + count] != bytes(count)
    data[at : at + count] = bytes(count)
    path.write_bytes(bytes(data))


def _refused_by_every_reader(
    store: LocalStore, manifest: ShardManifest, column: str | None, readers: dict[str, Callable[[], object]]
) -> None:
    key = manifest.data_keys[0]
    size = (store.root / key).stat().st_size
    zero_bytes_inside(store.root / key, column)
    assert (store.root / key).stat().st_size == size
    expected = (
        f"{store.url(key)} is damaged: checksum differs from the manifest; withdraw and regenerate the shard: "
        f"{regenerate_command(manifest.stage, manifest.shard)}"
    )
    for name, read in readers.items():
        with pytest.raises(DamagedObject) as refused:
            read()
        assert str(refused.value) == expected, name
    # What the coverage check (and status) report for it: the object, by key.
    assert verify_shard(store, manifest) == [f"{key}: checksum differs from the manifest"]


def test_damaged_completions_are_refused_by_training_set_the_checks_and_the_mixture_report(store, tmp_path):
    _refused_by_every_reader(
        store,
        read_completions_manifest(store, 0),
        "text",  # a column training_set does not read: before this check, it published the shard
        {
            "training_set": lambda: assemble_shard(store, 0, AssemblyOptions(), tmp_path / "again"),
            "completions checks": lambda: list(iter_completion_batches(store, 0, ["status", "completion_tokens"])),
            "mixture_report": lambda: mixture_report(store),
        },
    )
    assert regenerate_command(COMPLETIONS, 0) == (
        "dagster asset materialize -m dagster_project.definitions "
        "--select 'completions, training_set, specforge_export, hf_export' --partition shard-00000"
    )


def test_a_damaged_training_shard_is_refused_by_both_exports_the_checks_and_the_mixture_report(store, tmp_path):
    _refused_by_every_reader(
        store,
        read_training_manifest(store, 0),
        "conversation_id",  # a column the SpecForge export does not read
        {
            "specforge_export": lambda: export_shard(store, 0, tmp_path / "export"),
            "hf_export": lambda: export_hf_shard(store, 0, tmp_path / "export"),
            "training checks": lambda: list(iter_training_batches(store, 0, ["input_ids", "loss_mask"])),
            "mixture_report": lambda: mixture_report(store),
        },
    )
    assert "--select 'training_set, specforge_export, hf_export' --partition shard-00000" in regenerate_command(
        TRAINING_SET, 0
    )


def test_damaged_conversations_are_refused_by_generation(store):
    _refused_by_every_reader(
        store,
        read_shard_conversations_manifest(store, 0),
        None,
        {
            "completions (generation reads its conversations)": lambda: list(read_conversations(store, 0)),
            "the coverage check (status --by-id, run_report)": lambda: dataset_coverage(store, 2),
        },
    )
    assert regenerate_command(CONVERSATIONS, 0).endswith("--select conversations")


def test_a_parquet_rewritten_with_fewer_rows_is_refused_with_the_command_that_regenerates_it(store, tmp_path):
    manifest = read_completions_manifest(store, 0)
    path = store.root / manifest.data_keys[0]
    pq.write_table(pq.read_table(path).slice(0, 2), path)  # 10 rows fewer: a rewritten, valid Parquet file
    with pytest.raises(DamagedObject, match="bytes in the store, manifest says") as refused:
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "again")
    assert str(refused.value).startswith(f"{store.url(manifest.data_keys[0])} is damaged")
    assert str(refused.value).endswith(regenerate_command(COMPLETIONS, 0))


def test_a_manifest_that_counts_other_rows_than_its_objects_hold_is_refused_with_the_remedy(store, tmp_path):
    """Objects that pass their checksums but hold other rows than the manifest counts (a manifest written by
    another publication): not "run again", which cannot fix it, but the command that regenerates the shard."""
    manifest = read_completions_manifest(store, 0)
    staged = tmp_path / "completions.parquet"
    staged.write_bytes((store.root / manifest.data_keys[0]).read_bytes())
    publish_shard(store, replace(manifest, rows=manifest.rows + 10), [(staged.name, staged)])
    with pytest.raises(DamagedObject, match="12 rows read, the manifest says 22") as refused:
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "again")
    assert str(refused.value).endswith(regenerate_command(COMPLETIONS, 0))


def _states(store: LocalStore) -> tuple[dict, dict, dict, dict[str, str]]:
    status = collect_status(store, [])
    alerts = {alert.kind: alert.message for alert in status.alerts}
    return status.shards.completions, status.shards.training_set, status.shards.export, alerts


def test_a_damaged_training_shard_is_shown_damaged_by_status_and_so_is_its_export(store, tmp_path):
    export_shard(store, 0, tmp_path / "export")
    assert _states(store)[1:3] == ({PASSED: 1, WAITING: 1}, {EXPORTED: 1, NOT_EXPORTED: 1})
    key = read_training_manifest(store, 0).data_keys[0]
    zero_bytes_inside(store.root / key, "conversation_id")

    # The coverage check (run_report, `status --by-id`) verifies the training shards too.
    write_coverage(store, dataset_coverage(store, 2))
    _, training, export, alerts = _states(store)
    assert training == {DAMAGED: 1, WAITING: 1} and export == {ON_DAMAGED: 1, NOT_EXPORTED: 1}
    assert f"{key}: checksum differs from the manifest" in alerts["damaged"]

    # Without it, an export that meets the damage records it, and status shows it the same way.
    store.delete(COVERAGE_KEY)
    with pytest.raises(DamagedObject):
        export_shard(store, 0, tmp_path / "export")
    _, training, export, alerts = _states(store)
    assert training == {DAMAGED: 1, WAITING: 1} and export == {REFUSED: 1, NOT_EXPORTED: 1}
    assert f"{store.url(key)} is damaged: checksum differs from the manifest" in alerts["damaged"]


def test_a_deleted_completions_object_flags_the_training_set_and_export_built_on_it(store, tmp_path):
    export_shard(store, 0, tmp_path / "export")
    key = read_completions_manifest(store, 0).data_keys[0]
    (store.root / key).unlink()
    write_coverage(store, dataset_coverage(store, 2))
    completions, training, export, alerts = _states(store)
    assert completions[DAMAGED] == 1 and PASSED not in training and EXPORTED not in export
    assert training[ON_DAMAGED] == 1 and export[ON_DAMAGED] == 1
    assert f"missing {key}" in alerts["damaged"]
