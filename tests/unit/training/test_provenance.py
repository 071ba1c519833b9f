"""Each training row says where it came from, and one DuckDB line over the store answers "which server, model
revision and settings made these rows" (the query docs/TRAINING_DATA.md documents)."""

from __future__ import annotations

import duckdb

from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import render_prompt_ids
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.training_shards import completion_row, healthy_output, publish_completions, question, tokenizer

BY_SERVER = (
    "SELECT server, weight_version, settings_fingerprint, count(*) AS rows, "
    "round(avg(spec_accept_length), 3) AS accept "
    "FROM '{root}/training_set/shard=*/*.parquet' GROUP BY ALL ORDER BY server"
)


def test_provenance_is_carried_into_every_row_and_queryable_in_one_duckdb_line(tmp_path):
    store = LocalStore(tmp_path / "store")
    tok = tokenizer()
    servers = ["http://gpu-0:30000", "http://gpu-1:30000"]
    for shard in (0, 1):
        rows = [
            completion_row(
                f"c{shard}-{i}#turn0",
                render_prompt_ids(tok, question(i)),
                healthy_output(i),
                shard=shard,
                server=servers[i % 2],
                source=f"source-{shard}",
            )
            for i in range(6)
        ]
        publish_completions(store, shard, rows)
        assemble_shard(store, shard, AssemblyOptions(), tmp_path / "staging")

    found = duckdb.sql(BY_SERVER.format(root=store.root)).fetchall()

    expected = []
    for server in servers:
        made = [i for i in range(6) if servers[i % 2] == server]
        accepts = [len(healthy_output(i)) / max(len(healthy_output(i)) // 3, 1) for i in made] * 2
        fingerprint = completion_row("x#turn0", [1], [2])["settings_fingerprint"]
        expected.append((server, "default", fingerprint, 2 * len(made), round(sum(accepts) / len(accepts), 3)))
    assert found == expected
    sources = duckdb.sql(f"SELECT DISTINCT source FROM '{store.root}/training_set/shard=*/*.parquet' ORDER BY 1")
    assert sources.fetchall() == [("source-0",), ("source-1",)]
