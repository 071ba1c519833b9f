"""Training Parquet layout: list<int32> ids, int8 mask, zstd, row groups bounded by rows and by tokens."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.records import TRAINING_SCHEMA
from dagster_project.store.manifest import ShardManifest, iter_parquet_batches, publish_shard
from dagster_project.store.storage import LocalStore
from dagster_project.training.shards import TrainingShardWriter


def _rows(lengths: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "event_id": f"c{i}#turn0",
                "conversation_id": f"c{i}",
                "turn_index": 0,
                "shard": 0,
                "input_ids": list(range(length)),
                "loss_mask": [0] + [1] * (length - 1),
                "num_tokens": length,
                "num_loss_tokens": length - 1,
                "prompt_tokens": 1,
                "completion_tokens": length - 1,
                "finish_reason": "stop",
                "truncated": False,
            }
            for i, length in enumerate(lengths)
        ],
        schema=TRAINING_SCHEMA,
    )


def test_row_groups_close_on_rows_or_on_tokens_whichever_comes_first(tmp_path):
    path = tmp_path / "training.parquet"
    with TrainingShardWriter(path, rows_per_group=4, tokens_per_group=100) as writer:
        writer.write(_rows([10] * 6))  # 4 rows fill a group; 2 rows (20 tokens) wait
        writer.write(_rows([90, 10]))  # 20 + 90 tokens pass 100 after 3 rows; 1 row waits
        writer.write(_rows([5]))  # closing writes the last, partial group
    parquet = pq.ParquetFile(path)
    assert [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)] == [4, 3, 2]
    assert writer.rows == 9 and writer.row_groups == 3
    assert parquet.schema_arrow.field("input_ids").type == pa.list_(pa.int32())
    assert parquet.schema_arrow.field("loss_mask").type == pa.list_(pa.int8())


def test_reading_streams_one_row_group_at_a_time(tmp_path):
    with TrainingShardWriter(tmp_path / "a.parquet", rows_per_group=2) as writer:
        writer.write(_rows([3, 4, 5, 6, 7]))
    store = LocalStore(tmp_path / "store")
    manifest = publish_shard(
        store, ShardManifest(stage="training_set", shard=0, rows=5), [("a.parquet", tmp_path / "a.parquet")]
    )
    batches = list(iter_parquet_batches(store, manifest, ["event_id", "num_tokens"]))
    assert [batch.num_rows for batch in batches] == [2, 2, 1]
    assert [batch.schema.names for batch in batches][0] == ["event_id", "num_tokens"]
    assert [n for batch in batches for n in batch.column("num_tokens").to_pylist()] == [3, 4, 5, 6, 7]
