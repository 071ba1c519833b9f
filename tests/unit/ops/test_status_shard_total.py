"""`dflash status` counts the shards the conversations stage published, whatever the environment says now."""

from __future__ import annotations

import json

from dagster_project.ops.status import collect_status, render_text
from tests.support.ingest_helpers import run_stages


def test_the_shard_total_comes_from_the_conversations_manifest_not_the_environment(tmp_path, monkeypatch):
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"Question {i}?"}) + "\n" for i in range(6)))
    outcome = run_stages(tmp_path, [str(source)], num_shards=3)
    monkeypatch.setenv("DFLASH_NUM_SHARDS", "7")  # changed since: new runs would plan 7, the published plan is 3

    status = collect_status(outcome.store, [])
    assert status.storage.shards_total == 3 and status.storage.unpublished_shards == [0, 1, 2]
    assert status.progress.events_planned == 6
    assert "0/3 shards published" in render_text(status)
