"""Exactly-once across a crash, on real simulator processes: the fleet dies mid-shard, a new fleet finishes it.

Nothing journaled is requested again, every planned event ends with exactly one record, and a multi-turn
conversation resumes at the turn where it stopped, its prompt carrying the journaled answer before it.
"""

import json

import pyarrow.parquet as pq
import pytest

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, FleetDownError
from dagster_project.generation.shards import shard_coverage
from dagster_project.generation.stage import generate_shard, journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import split_event_id
from dagster_project.sglang.protocol import input_hash
from dagster_project.store.transfer import local_copy
from dagster_project.tokenizer import load_tokenizer, special_ids
from tests.support.ingest_helpers import run_stages
from tests.support.journal_files import journal_records

SETTINGS = GenerationSettings(max_new_tokens=256)
SIM = {"output_len": "fixed:24", "max_running_requests": 2}


def write_multi_turn_prompts(path, conversations: int = 4, turns: int = 3) -> None:
    with open(path, "w") as handle:
        for c in range(conversations):
            messages = []
            for t in range(turns):
                messages += [
                    {"role": "user", "content": f"Conversation {c}, question {t}: what is {c} + {t}?"},
                    {"role": "assistant", "content": f"The source's answer {c + t}."},
                ]
            handle.write(json.dumps({"id": f"conv{c}", "messages": messages}) + "\n")


def dispatcher(fleet) -> Dispatcher:
    return Dispatcher(fleet.urls, DispatchOptions(fleet_down_grace_s=0.5, probe_interval_s=0.1, max_attempts=2))


def visible_answer(tokenizer, output_ids: list[int]) -> str:
    special = special_ids(tokenizer)
    answer = output_ids[output_ids.index(special.think_end) + 1 :]
    return tokenizer.decode([i for i in answer if i not in special.eos_ids], skip_special_tokens=True).strip()


def test_a_crash_mid_shard_then_a_rerun_gives_every_event_exactly_once(tmp_path, sim_fleet):
    source = tmp_path / "prompts.jsonl"
    write_multi_turn_prompts(source)
    store = run_stages(tmp_path, [str(source)], num_shards=1).store
    tokenizer = load_tokenizer()
    work = tmp_path / "work"

    # The only server dies when the 10th request arrives: 12 events (4 conversations x 3 turns) are planned.
    doomed = sim_fleet(1, faults={"crash_after_requests": 9}, **SIM)
    with pytest.raises(FleetDownError):
        generate_shard(store, 0, tokenizer=tokenizer, settings=SETTINGS, dispatcher=dispatcher(doomed), work_dir=work)

    before = journal_records(journal_path(work, 0, SETTINGS.fingerprint()))
    assert 4 <= len(before) < 12
    stopped_mid_conversation = {
        conversation: max(split_event_id(e)[1] for e in before if split_event_id(e)[0] == conversation)
        for conversation in {split_event_id(e)[0] for e in before}
    }
    assert any(last < 2 for last in stopped_mid_conversation.values())

    fresh = sim_fleet(1, **SIM)
    manifest = generate_shard(
        store, 0, tokenizer=tokenizer, settings=SETTINGS, dispatcher=dispatcher(fresh), work_dir=work
    )

    coverage = shard_coverage(store, 0)
    assert coverage.exact and coverage.expected == 12 and manifest.ok == 12
    sent_again = {entry["input_hash"] for entry in fresh.requests(0)}
    assert not sent_again & {input_hash(record["prompt_ids"]) for record in before.values()}
    assert len(fresh.requests(0)) == 12 - len(before)

    with local_copy(store, manifest.data_keys[0]) as path:
        rows = {row["event_id"]: row for row in pq.read_table(path).to_pylist()}
    for event_id, record in before.items():  # journaled answers are published as they were, not regenerated
        assert rows[event_id]["output_ids"] == record["output_ids"]
    for conversation, last in stopped_mid_conversation.items():
        if last == 2:
            continue
        resumed = rows[f"{conversation}#turn{last + 1}"]
        assert input_hash(resumed["prompt_ids"]) in sent_again
        history = tokenizer.decode(resumed["prompt_ids"])
        assert visible_answer(tokenizer, before[f"{conversation}#turn{last}"]["output_ids"]) in history
        assert "The source's answer" not in history  # all_turns: the model's own history, not the source's


def test_with_thinking_off_each_answer_is_the_next_turns_history(tmp_path, sim_fleet):
    source = tmp_path / "prompts.jsonl"
    write_multi_turn_prompts(source, conversations=2)
    settings = GenerationSettings(max_new_tokens=256, enable_thinking=False)
    store = run_stages(tmp_path, [str(source)], num_shards=1).store
    tokenizer = load_tokenizer()
    fleet = sim_fleet(1, **SIM)
    manifest = generate_shard(
        store, 0, tokenizer=tokenizer, settings=settings, dispatcher=dispatcher(fleet), work_dir=tmp_path / "w"
    )
    assert manifest.ok == 6 and manifest.errors == 0
    with local_copy(store, manifest.data_keys[0]) as path:
        rows = {row["event_id"]: row for row in pq.read_table(path).to_pylist()}
    special = special_ids(tokenizer)
    first, second = rows["conv0#turn0"], rows["conv0#turn1"]
    assert special.think_end not in first["output_ids"]  # the prompt closed the think block itself
    answer = tokenizer.decode([i for i in first["output_ids"] if i not in special.eos_ids], skip_special_tokens=True)
    assert answer.strip() in tokenizer.decode(second["prompt_ids"])
