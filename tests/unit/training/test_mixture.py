"""The mixture report's figures are those a DuckDB query over the published training set (and completions)
gives, per source and per turn position; a source whose share moved is flagged."""

from __future__ import annotations

import duckdb
import pytest

from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import render_prompt_ids
from dagster_project.training.mixture import MixtureOptions, markdown_table, mixture_report
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.training_shards import (
    completion_row,
    error_row,
    healthy_output,
    publish_completions,
    question,
    tokenizer,
)


@pytest.fixture
def store(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    tok = tokenizer()
    for shard in (0, 1):
        rows = []
        for i in range(10):
            source = "alpha" if i < 6 else "beta"
            prompt = render_prompt_ids(tok, question(i + 10 * shard))
            for turn in range(1 + i % 3):
                event = f"c{shard}-{i}#turn{turn}"
                rows.append(completion_row(event, prompt, healthy_output(i + turn), shard=shard, source=source))
        rows[-1] = error_row(rows[-1]["event_id"], rows[-1]["prompt_ids"], shard=shard) | {"source": "beta"}
        rows[-2]["finish_reason"] = "length"  # excluded as length_capped
        publish_completions(store, shard, rows)
        assemble_shard(store, shard, AssemblyOptions(max_length=150, length_policy="truncate"), tmp_path / "staging")
    return store


def test_the_report_equals_a_duckdb_query_over_the_training_set(store):
    report = mixture_report(store)
    training = f"'{store.root}/training_set/shard=*/*.parquet'"
    completions = f"'{store.root}/completions/shard=*/*.parquet'"
    expected = {
        row[0]: row[1:]
        for row in duckdb.sql(
            "SELECT source, count(*), count(*) / sum(count(*)) OVER (), avg(truncated::INT), "
            "quantile_cont(prompt_tokens, [0.1, 0.5, 0.9]), quantile_cont(completion_tokens, [0.1, 0.5, 0.9]), "
            "avg(spec_accept_length), quantile_cont(spec_accept_length, 0.1), "
            f"quantile_cont(num_loss_tokens, [0.1, 0.5, 0.9]) FROM {training} GROUP BY source"
        ).fetchall()
    }
    events = dict(duckdb.sql(f"SELECT source, count(*) FROM {completions} GROUP BY 1").fetchall())
    errors = dict(duckdb.sql(f"SELECT source, avg((status <> 'ok')::INT) FROM {completions} GROUP BY 1").fetchall())

    assert [g.name for g in report.by_source] == ["alpha", "beta"]
    for group in report.by_source:
        rows, share, truncated, prompt, answer, accept_mean, accept_p10, loss = expected[group.name]
        assert (group.training_rows, group.share, group.truncation_rate) == (rows, share, truncated)
        assert (group.prompt_tokens, group.answer_tokens, group.loss_mask_sum) == (prompt, answer, loss)
        # The mean is summed in another order than the query's: equal to the last bits.
        assert (group.accept_length_mean, group.accept_length_p10) == (
            pytest.approx(accept_mean, rel=1e-12),
            accept_p10,
        )
        assert (group.input_rows, group.error_rate) == (events[group.name], errors[group.name])
    assert 0 < sum(g.truncation_rate for g in report.by_source)
    assert report.by_source[1].excluded_by_reason == {"error": 2, "length_capped": 2}
    assert report.training_rows == sum(row[0] for row in expected.values())
    assert report.lengths.rows_over == duckdb.sql(f"SELECT count(*) FROM {training} WHERE truncated").fetchall()[0][0]

    by_turn = dict(duckdb.sql(f"SELECT (turn_index + 1)::VARCHAR, count(*) FROM {training} GROUP BY 1").fetchall())
    assert {g.name: g.training_rows for g in report.by_turn} == by_turn
    assert {g.name: g.input_rows for g in report.by_turn} == {"1": 20, "2": 12, "3": 6}


def test_a_source_whose_share_moved_is_flagged(store):
    strict = mixture_report(store, MixtureOptions(max_share_shift_points=0.5))
    beta = next(g for g in strict.by_source if g.name == "beta")
    assert beta.share < beta.input_share and beta.flagged and "source beta" in strict.flagged
    assert "beta ⚠" in markdown_table(strict.by_source, "source")
    assert mixture_report(store, MixtureOptions(max_share_shift_points=50)).flagged == []
