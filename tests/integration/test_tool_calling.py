"""Tool calling end to end on the simulator: LLaMA-Factory's glaive_toolcall_en_demo.json → conversations →
completions → training set, every turn's prompt the official Qwen3.6 template's render of its recorded context with
the tools (the template from the shared fixtures, not the project's own: a change to its rendering fails here).

The simulator answers a share of the prompts that declare tools with a `<tool_call>` (some malformed on purpose):
each finished row, its answer parsed back into `reasoning_content`, `content` and `tool_calls`, is the official
template's render of the whole exchange, and the training gate counts exactly the malformed calls."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import RawPromptsConfig, raw_prompts
from dagster_project.assets.training_set import training_set
from dagster_project.checks.training_set import training_set_gates
from dagster_project.conversations.shards import read_conversations
from dagster_project.conversations.stage import QUARANTINE_KEY
from dagster_project.conversations.turns import prompt_messages
from dagster_project.generation.shards import iter_completion_batches
from dagster_project.ingest.shards import QUARANTINE_KEY as INGEST_QUARANTINE_KEY
from dagster_project.partitions import NUM_SHARDS
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.jsonl import read_jsonl_zst
from dagster_project.store.storage import LocalStore
from dagster_project.tool_calls import parse_tool_calls
from dagster_project.training.shards import iter_training_batches
from tests.support.chat_templates import official_prompt_ids, official_template
from tests.support.dagster_helpers import evaluations_by_check
from tests.support.paths import SHARED_DATA, require_shared
from tests.support.pilots import pass_pilot
from tests.support.training_shards import tokenizer


@pytest.fixture
def glaive() -> str:
    require_shared("data", "LLaMA-Factory", "glaive_toolcall_en_demo.json")
    return str(SHARED_DATA / "LLaMA-Factory" / "glaive_toolcall_en_demo.json")


def test_glaive_tool_calls_reach_the_training_set_token_exact(sim_fleet, tmp_path, glaive) -> None:
    official = official_template()
    fleet = sim_fleet(2, output_len="uniform:16:96", tool_call_share=0.5, malformed_tool_call_share=0.2)
    store = LocalStore(tmp_path / "store")
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(max_new_tokens=256),
        "fleet": SGLangFleet(endpoints=fleet.urls),
    }
    config = dg.RunConfig(ops={"raw_prompts": RawPromptsConfig(sources=[glaive])})
    # Other gates judge the simulator's short answers too: only this gate's count is read, under a loose limit.
    gate_config = {"ops": {"training_set_gates": {"config": {"max_malformed_tool_call_share": 0.5}}}}
    gated: dict[str, dict] = {}
    with dg.instance_for_test() as instance:
        prepared = dg.materialize(
            [raw_prompts, conversations], resources=resources, instance=instance, run_config=config
        )
        assert prepared.success
        # Passed on a healthy fleet of its own: this one writes malformed calls on purpose, which the pilot blocks.
        pass_pilot(resources, instance, own_fleet=tmp_path / "pilot_fleet")
        for partition in layout.partition_keys(NUM_SHARDS):
            assert dg.materialize(
                [completions], partition_key=partition, resources=resources, instance=instance
            ).success
            built = dg.materialize(
                [training_set, training_set_gates],
                partition_key=partition,
                resources=resources,
                instance=instance,
                run_config=gate_config,
                raise_on_error=False,
            )
            gated[partition] = evaluations_by_check(built)["malformed_tool_calls"]

    rows = json.loads(open(glaive).read())
    quarantined = [
        record
        for key in (INGEST_QUARANTINE_KEY, QUARANTINE_KEY)
        for record in read_jsonl_zst(store.download(key, tmp_path / "q" / key))
    ]
    # The only rows set aside repeat an earlier row's requests (35 of the 300 are exact copies), each naming it.
    assert {q["reason"] for q in quarantined} == {"duplicate"}

    tok = tokenizer()
    shards = range(NUM_SHARDS)
    held = [conversation for shard in shards for conversation in read_conversations(store, shard)]
    sent = {
        row["event_id"]: (row["prompt_ids"], row["output_ids"])
        for shard in shards
        for batch in iter_completion_batches(store, shard)
        for row in batch.to_pylist()
    }
    trained = {
        row["event_id"]: row
        for shard in shards
        for batch in iter_training_batches(store, shard)
        for row in batch.to_pylist()
    }
    complete: set[str] = set()
    tool_turns = 0
    calls = {"well_formed": 0, "malformed": 0, "after_text": 0, "typed_arguments": 0}
    rerendered = 0
    for conversation in held:
        events = [conversation.event_id(turn) for turn in range(conversation.num_turns)]
        if all(event in trained for event in events):
            complete.add(conversation.id)
        for turn, event in enumerate(events):
            if event not in trained:
                continue
            prompt_ids, output_ids = sent[event]
            assert trained[event]["input_ids"] == prompt_ids + output_ids
            finished = trained[event]["finish_reason"] == "stop" and not trained[event]["truncated"]
            reasoning, _, answer = tok.decode(output_ids[:-1]).rpartition("\n</think>\n\n")
            parsed = parse_tool_calls(answer)
            if finished:
                calls["malformed"] += parsed.malformed
                calls["well_formed"] += len(parsed.calls)
                calls["after_text"] += bool(parsed.calls and parsed.content)
                calls["typed_arguments"] += sum(
                    bool(value) and (value[0] in "[{0123456789-" or value in ("true", "false"))
                    for call in parsed.calls
                    for value in call["function"]["arguments"].values()
                )
            if conversation.history == "source":
                # The recorded context, calls and results included, rendered with the tools by the official template.
                recorded = prompt_messages(conversation, turn, [])
                assert prompt_ids == official_prompt_ids(tok, official, recorded, tools=conversation.tools)
                tool_turns += "<tool_response>" in tok.decode(prompt_ids)
                if finished and not parsed.malformed:
                    # The whole row, generated words and calls included, is the template's render of the exchange.
                    reply = {"role": "assistant", "reasoning_content": reasoning, "content": parsed.content}
                    reply.update({"tool_calls": parsed.calls} if parsed.calls else {})
                    exchange = tok.apply_chat_template(
                        [*recorded, reply], tools=conversation.tools, chat_template=official, tokenize=False
                    )
                    assert prompt_ids + output_ids + tok.encode("\n") == tok.encode(exchange, add_special_tokens=False)
                    rerendered += 1
    assert len(held) + len(quarantined) == len(rows)
    reached = len(complete) + sum(q["duplicate_of"] in complete for q in quarantined)
    assert reached / len(rows) >= 0.95, f"{reached} of {len(rows)} rows in the training set (or their first copy)"
    assert len(complete) / len(held) >= 0.95
    assert tool_turns > 100, "the answers to recorded tool results were generated"
    assert calls["well_formed"] > 50 and calls["malformed"] > 10 and rerendered > 200, (calls, rerendered)
    # Some calls follow a sentence, and some arguments are numbers, booleans, arrays or objects: re-rendered exactly.
    assert calls["after_text"] > 5 and calls["typed_arguments"] > 10, calls
    # The gate counts every malformed generated call, and blocks none of these shards at a 50% limit.
    counted = sum(evaluation.metadata["malformed_tool_calls"].value for evaluation in gated.values())
    assert counted == calls["malformed"]
    assert all(evaluation.passed for evaluation in gated.values())
