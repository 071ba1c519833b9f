"""A backfill where one shard fails a blocking training gate: `dflash status` and the run_report page say which
shard, which gate, where its thresholds are configured and what lets it through, raise an alert, and do not
claim the job is done.

Small shards of real conversations (the ingest and conversations stages, in process, as many shards as the
definitions' partitions); their completions are written as a shard run publishes them (the largest shard is the
historical failure: most answers are empty reasoning and "OK."); then one run per shard of training_set, its
checks and specforge_export, as a backfill over every shard launches them.
"""

from __future__ import annotations

import json
import re

import dagster as dg
import numpy as np
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.run_report import run_report
from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks.training_set import training_set_gates, training_set_gx_suite
from dagster_project.cli import main
from dagster_project.conversations.shards import read_conversations
from dagster_project.partitions import NUM_SHARDS
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import render_prompt_ids
from dagster_project.training.distribution_gates import loss_sum_concentration
from tests.support.dagster_helpers import dagster_home, evaluations_by_check
from tests.support.ingest_helpers import run_stages
from tests.support.training_shards import (
    DISASTER_OUTPUT_TEXT,
    completion_row,
    healthy_output,
    publish_completions,
    question,
    tokenizer,
)

CONVERSATIONS = 40  # 6 to 14 a shard: enough for the gates to judge shares, few enough to stay cheap
SHARD_RUN = [training_set, training_set_gates, training_set_gx_suite, specforge_export]


@pytest.fixture
def backfilled(tmp_path, monkeypatch):
    """The blocked shard and the run_report's run after the backfill: every other shard is exported."""
    source = tmp_path / "questions.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": f"q-{i:03d}", "messages": [{"role": "user", "content": question(i)[1]["content"]}]})
            + "\n"
            for i in range(CONVERSATIONS)
        )
    )
    run_stages(tmp_path, [str(source)], num_shards=NUM_SHARDS)
    store = LocalStore(tmp_path / "store")
    tok = tokenizer()
    disaster = tok.encode(DISASTER_OUTPUT_TEXT, add_special_tokens=False)
    by_shard = {shard: list(read_conversations(store, shard)) for shard in range(NUM_SHARDS)}
    blocked = max(by_shard, key=lambda shard: len(by_shard[shard]))
    repeated = np.array([len(disaster)] * (len(by_shard[blocked]) - 1) + [1000])
    assert not loss_sum_concentration(repeated).passed, "too few rows for a repeated loss_mask sum to block"
    for shard, conversations in by_shard.items():
        rows = [
            completion_row(
                conversation.event_id(0),
                render_prompt_ids(tok, question(i)),
                disaster if shard == blocked and i < len(conversations) - 1 else healthy_output(i),
                shard=shard,
            )
            for i, conversation in enumerate(conversations)
        ]
        publish_completions(store, shard, rows)
    home = dagster_home(tmp_path / "dagster_home")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("DFLASH_STORE", store.uri)
    monkeypatch.setenv("DFLASH_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("DFLASH_SGLANG_ENDPOINTS", raising=False)
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
        "fleet": SGLangFleet(),
    }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        outcomes = [
            dg.materialize(
                SHARD_RUN,
                partition_key=layout.partition_key(shard),
                resources=resources,
                instance=instance,
                raise_on_error=False,
            ).success
            for shard in range(NUM_SHARDS)
        ]
        assert outcomes == [shard != blocked for shard in range(NUM_SHARDS)]  # its export did not run
        report = dg.materialize([run_report], resources=resources, instance=instance)
    return blocked, report


def test_a_shard_blocked_by_a_training_gate_is_named_with_its_keys_and_done_is_not_claimed(backfilled, capsys):
    blocked, report = backfilled
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    others = NUM_SHARDS - 1
    assert (
        f"Shards by stage ({NUM_SHARDS}): not done: {others} of {NUM_SHARDS} exported with every blocking gate green"
        in text
    )
    assert f"training set: passed {others}, blocked 1 [{blocked}]" in text
    assert f"export: exported {others}, not exported 1 [{blocked}]" in text
    blocked_line = next(line for line in text.splitlines() if f"BLOCKED shard {blocked} by training_set gate" in line)
    assert "gates/loss_sum_concentration" in text
    assert "training_set_gates config max_top_loss_sum_share" in text
    assert "override: override_failed_gates: true in specforge_export's config" in blocked_line
    assert f"ALERT [blocked]: shards {blocked} blocked by training_set gate gates/" in text
    assert "Alerts: none" not in text and "DONE" not in text
    # DAGSTER_HOME is set and Dagster is not asked: the view the run_report asset recorded is shown, with its age
    # (the completions were published without Dagster: it materialized none of them).
    assert re.search(r"Dagster \(as of \d+ s ago, recorded by run_report\): 0 completions shards materialized", text)

    assert main(["status", "--json"]) == 0
    shards = json.loads(capsys.readouterr().out)["shards"]
    assert shards["done"] is False and shards["not_green"]["training_set blocked"] == [blocked]
    (needs_a_look,) = shards["needs_a_look"]
    gates = {failure["gate"]: failure for failure in needs_a_look["blocked_by"]}
    assert gates["gates/loss_sum_concentration"]["thresholds"] == (
        "training_set_gates config max_top_loss_sum_share, min_repeats"
    )

    # The page: its shards section and table, the alerts table, and the Dagster-visible warning.
    page = report.asset_materializations_for_node("run_report")[0].metadata
    assert f"**Not done**: {others} of {NUM_SHARDS}" in page["Shards by stage"].value
    rows = [record.data for record in page["Shards needing a look"].records]
    concentration = next(row for row in rows if row["what"] == "loss_sum_concentration (training_set gates)")
    assert concentration["shard"] == str(blocked)
    # The gate's thresholds and override, once, in a table of their own.
    gates = {record.data["gate"]: record.data for record in page["Blocking gates"].records}
    said = gates["loss_sum_concentration (training_set gates)"]["thresholds; override"]
    assert "max_top_loss_sum_share" in said
    assert said.endswith("override_failed_gates: true in specforge_export's config")
    alerts = [record.data for record in page["Alerts"].records]
    blocked_alerts = [row["what needs the operator"] for row in alerts if row["alert"] == "blocked"]
    assert any("loss_sum_concentration" in alert for alert in blocked_alerts)
    warning = evaluations_by_check(report, "run_report")["operator_alerts"]
    assert not warning.passed and warning.severity == dg.AssetCheckSeverity.WARN
    assert f"[blocked] shards {blocked} blocked by training_set gate" in warning.description
