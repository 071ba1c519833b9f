"""`completions` refuses, in any later run, a conversations shard whose blocking check failed, naming the gate.

Dagster's blocking checks stop `completions` only in the run that fails them; the conversations checks also record
their verdict next to the shard (`store.verdicts`), and `generate_shard` reads it before it sends anything.
"""

from __future__ import annotations

import json

import pytest

from dagster_project.conversations.shards import read_shard_conversations_manifest
from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.stage import ConversationsGated, generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.verdicts import record_verdict
from dagster_project.tokenizer import load_tokenizer
from tests.support.ingest_helpers import run_stages

FORGED = "1 of 4 prompts have other control tokens than their turns"


def test_a_conversations_shard_that_failed_a_blocking_check_is_refused_before_any_request(tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Question {i}?"}) + "\n" for i in range(4)))
    store = run_stages(tmp_path, [str(source)], num_shards=1).store
    record_verdict(store, read_shard_conversations_manifest(store, 0), "turn_markers", {"turn_markers": FORGED})
    # Nothing listens on port 9. Were the refusal missing, the run would stop a second later with FleetDownError.
    dispatcher = Dispatcher(["http://127.0.0.1:9"], DispatchOptions(fleet_down_grace_s=1.0, probe_timeout_s=1.0))

    with pytest.raises(
        ConversationsGated,
        match=rf"conversations shard 0 failed blocking gates: turn_markers/turn_markers: {FORGED}\. .*"
        "set override_failed_gates: true in completions' config",
    ):
        generate_shard(
            store,
            0,
            tokenizer=load_tokenizer(),
            settings=GenerationSettings(),
            dispatcher=dispatcher,
            work_dir=tmp_path / "generation",
        )
    assert not (tmp_path / "generation").exists()  # no journal opened
    assert not list(store.list("leases/")) and not list(store.list("completions/"))
