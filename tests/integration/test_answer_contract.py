"""#43 items 2 and 3 on simulator processes: answers that break the request's contract never become rows or figures,
and `dflash tune` sends nothing to a server of another vocabulary.

One server of two alters a share of its answers as a broken proxy would (more ids than max_new_tokens, the end-of-turn
id mid-answer, a foreign text, a 50 MB body); the shard publishes only answers that keep the contract, with their text
the decoding of their ids, and status names the server with the rules its answers broke.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pyarrow.parquet as pq

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest, Outcome
from dagster_project.generation.stage import generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.status import collect_status, render_text
from dagster_project.sglang import answer_contract as contract
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.model_identity import QWEN3_6_27B
from dagster_project.store.transfer import local_copy
from dagster_project.tokenizer import load_tokenizer, special_ids
from tests.integration.test_generation_resume import write_multi_turn_prompts
from tests.support.ingest_helpers import run_stages

SETTINGS = GenerationSettings(max_new_tokens=256)
SIM = {"output_len": "uniform:16:48", "max_running_requests": 4}
BROKEN = {"eos_mid_answer_share": 0.4, "overlong_answer_share": 0.2, "foreign_text_share": 1.0}
FAST = {"probe_interval_s": 0.2, "max_probe_backoff_s": 0.5, "fleet_down_grace_s": 30.0}


def test_a_server_breaking_the_answer_contract_publishes_nothing_and_is_named_in_status(tmp_path, sim_fleet):
    source = tmp_path / "prompts.jsonl"
    write_multi_turn_prompts(source, conversations=12, turns=2)
    store = run_stages(tmp_path, [str(source)], num_shards=1).store
    tokenizer = load_tokenizer()
    fleet = sim_fleet(2, **SIM)
    fleet.set_faults(1, **BROKEN)
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(**FAST), expected_model=QWEN3_6_27B)

    manifest = generate_shard(
        store, 0, tokenizer=tokenizer, settings=SETTINGS, dispatcher=dispatcher, work_dir=tmp_path
    )

    assert manifest.ok == manifest.rows == 24  # every turn answered, none with a broken answer
    with local_copy(store, manifest.data_keys[0]) as path:
        rows = pq.read_table(path).to_pylist()
    end = special_ids(tokenizer).turn_end
    for row in rows:
        ids = row["output_ids"]
        assert len(ids) <= SETTINGS.max_new_tokens and end not in ids[:-1], row["event_id"]
        finish = proto.finish_stop(int(row["finish_matched"])) if row["finish_matched"] else {"type": "length"}
        assert row["text"] == contract.answer_text(tokenizer.decode, ids, finish)  # never the foreign text
        assert "foreign text" not in row["text"]
    faulty = dispatcher.snapshot()["servers"][fleet.url(1)]
    broken = contract.breaches_of(faulty["errors"])
    # Which rules its altered answers broke before it was set aside is the simulator's draw: at least one, each named.
    assert broken and set(broken) <= {contract.END_MID_ANSWER, contract.OVER_BUDGET}, faulty
    assert not contract.breaches_of(dispatcher.snapshot()["servers"][fleet.url(0)]["errors"])
    # Each refused answer was generated and paid for: the run summary counts it, and the waste ledger's `refused`.
    refused = contract.breaches_of(faulty["errors"], contract.MALFORMED_ANSWER_KINDS)
    assert manifest.generation.unrecorded_answers["refused"] == sum(refused.values())
    assert manifest.generation.unrecorded_output_tokens["refused"] >= sum(refused.values())

    status = collect_status(store, [])
    assert status.waste.answers["refused"] == sum(refused.values())
    text = render_text(status)
    named = f"SERVER {fleet.url(1)}: {sum(broken.values())} answers broke the contract: {contract.describe(broken)}"
    assert named in text, text
    assert "end-of-turn mid-answer" in named and fleet.url(0) not in text.split("broke the contract")[0]


def test_a_body_past_its_bound_is_refused_unread_and_the_request_answered_elsewhere(sim_fleet):
    fleet = sim_fleet(2, **SIM)
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(**FAST), expected_model=QWEN3_6_27B)
    params = proto.sampling_params(max_new_tokens=256)
    outcomes: list[Outcome] = []

    def on_outcome(outcome: Outcome) -> None:
        outcomes.append(outcome)
        # Server 1 checked and answering (its first answer: on a loaded machine server 0 can take the first dozens
        # before server 1's checks end): from now on 50 MB bodies (the bound: 1.06 MB).
        if outcome.server == fleet.url(1) and sum(o.server == fleet.url(1) for o in outcomes) == 1:
            fleet.set_faults(1, huge_body_share=1.0)

    count = 120  # work left for server 1 after its first answer, however many server 0 answered first
    requests = [GenRequest(f"c{i}#turn0", [248045, 846, 198, 3000 + i, 248046, 198], params) for i in range(count)]
    asyncio.run(dispatcher.run(requests, on_outcome))
    assert len(outcomes) == count and all(o.ok for o in outcomes)
    assert any(o.server == fleet.url(1) for o in outcomes), "server 1 never answered: the test proves nothing"
    faulty = dispatcher.snapshot()["servers"][fleet.url(1)]
    assert faulty["errors"].get(contract.OVERSIZED_BODY, 0) >= 1 and faulty["state"] == "quarantined", faulty
    assert "answers broke the contract: a body larger than any answer" in faulty["reason"]


def test_tune_against_a_server_of_another_vocabulary_refuses_and_sends_no_prompt(tmp_path, sim_fleet):
    other = sim_fleet(1, vocab_size=151936, **SIM)  # a server of a 151,936-id vocabulary
    env = {**os.environ, "DFLASH_STORE": str(tmp_path / "store"), "DFLASH_WORK_DIR": str(tmp_path / "work")}
    sweep = ["--synthetic-prompt-tokens", "100", "--concurrencies", "1", "--refine", "0", "--rounds", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", "tune", "--endpoints", other.url(0), *sweep],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()
    assert len(message) == 1, result.stderr  # one line, no traceback
    assert message[0].startswith(f"dflash tune: {other.url(0)}: served_model_mismatch")
    assert "its vocabulary has 151,936 ids, not 248,320" in message[0] and "no prompt was sent" in message[0]
    # Only the one-token probes reached it (id 0, in every vocabulary): no prompt of the sweep.
    assert other.requests(0) and other.job_requests(0) == []
    assert other.alive(0)
