"""Drafting snapshot rows in worker processes gives what drafting them in-process gives, in order."""

from __future__ import annotations

import orjson
import pytest

from dagster_project.conversations import drafts
from dagster_project.conversations.budget import SCAFFOLD_BYTES_FIXED, SCAFFOLD_BYTES_PER_MESSAGE, may_exceed
from dagster_project.conversations.sharding import shard_of
from dagster_project.conversations.turns import request_key
from dagster_project.ingest.shards import PromptRow
from dagster_project.store.jsonl import JsonlZstWriter, jsonl_zst_blocks


def _row(index: int) -> PromptRow:
    messages = [{"role": "user", "content": f"question {index % 7}"}]
    if index % 3 == 0:  # multi-turn, with an empty source answer shown under `last_turn`
        messages += [{"role": "assistant", "content": "" if index % 2 else "answer"}, {"role": "user", "content": "?"}]
    source_id = f"id-{index % 11}" if index % 5 else None
    return PromptRow("src", "f.jsonl", index, "sharegpt", source_id, messages, extra={"n": index})


def _snapshot(path, rows):
    with JsonlZstWriter(path) as writer:
        for row in rows:
            writer.write(row)
    return path


@pytest.mark.parametrize("policy", ["all_turns", "last_turn"])
def test_worker_drafts_equal_in_process_drafts_batch_for_batch(tmp_path, monkeypatch, policy) -> None:
    monkeypatch.setattr(drafts, "BATCH_BYTES", 500)  # several batches, more than the workers have in flight
    snapshot = _snapshot(tmp_path / "prompts.jsonl.zst", [_row(i) for i in range(41)])
    args = (snapshot, policy, 16, 120)  # a budget of 120 tokens: one-turn rows fit its byte bound, others not
    with drafts.worker_pool(snapshot, parallel=True) as pool:
        in_workers = list(drafts.drafted_batches(*args, pool=pool))
    with drafts.worker_pool(snapshot, parallel=False) as pool:
        assert pool is None
        in_process = list(drafts.drafted_batches(*args, pool=pool))
    assert in_workers == in_process
    assert len(in_process) > drafts.BATCHES_AHEAD and all(in_process)
    flat = [d for batch in in_process for d in batch]
    assert [d.source_row for d in flat] == list(range(41))
    assert {d.may_exceed_budget for d in flat} == {True, False}
    assert all(d.conversation().id == d.provisional_id and orjson.loads(d.line)["shard"] == d.shard for d in flat)
    if policy == "last_turn":
        assert {d.empty_shown for d in flat} == {None, 1}


def test_each_field_of_a_draft_holds_what_its_name_says() -> None:
    """A draft travels as a plain tuple: a field out of order would hand the stage another field's value."""
    row = PromptRow(
        "src",
        "f.jsonl",
        7,
        "openai",
        "id-7",
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "b"},
        ],
        extra={"n": 7},
    )
    draft = drafts.Draft._make(drafts.draft(row, "last_turn", 16, 10))
    conversation = draft.conversation()
    assert (draft.source_id, draft.provisional_id, conversation.id) == ("id-7", "id-7", "id-7")
    assert draft.hashed_id == drafts.content_id(row.messages) != draft.source_id
    assert draft.digest == drafts.digest64(request_key(conversation))
    assert draft.shard == conversation.shard == shard_of("id-7", 16)
    assert (draft.source, draft.source_file, draft.source_row) == ("src", "f.jsonl", 7)
    assert (draft.history, draft.empty_shown, draft.may_exceed_budget) == ("source", 1, True)
    assert (draft.calls_tools, draft.multi_turn, draft.turns) == (False, True, 1)


def test_a_damaged_snapshot_line_fails_the_stage_from_a_worker(tmp_path) -> None:
    snapshot = _snapshot(tmp_path / "prompts.jsonl.zst", [_row(0)])
    with JsonlZstWriter(tmp_path / "bad.jsonl.zst") as writer:
        writer.append_frames(snapshot)
        writer._stream.write(b"{not json\n")
    with pytest.raises(orjson.JSONDecodeError), drafts.worker_pool(snapshot, parallel=True) as pool:
        list(drafts.drafted_batches(tmp_path / "bad.jsonl.zst", "all_turns", 4, 100, pool=pool))


def test_may_exceed_is_the_scaffold_bound_against_the_budget_and_always_true_for_tools() -> None:
    messages = [{"role": "user", "content": "x" * 100}]
    bound = SCAFFOLD_BYTES_FIXED + SCAFFOLD_BYTES_PER_MESSAGE + 100
    assert not may_exceed(messages, None, bound)
    assert may_exceed(messages, None, bound - 1)
    assert may_exceed(messages, [{"type": "function", "function": {"name": "f"}}], 10**6)


def test_snapshot_blocks_are_whole_lines_across_frames_whatever_the_block_size(tmp_path) -> None:
    first = _snapshot(tmp_path / "first.jsonl.zst", [_row(i) for i in range(5)])
    with JsonlZstWriter(tmp_path / "both.jsonl.zst") as writer:
        writer.append_frames(first)  # a second frame after the first, as the ingest stage writes the snapshot
        writer.write({"long": "x" * 3000})
    expected = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in [*map(_row, range(5))])
    expected += b'{"long":"' + b"x" * 3000 + b'"}\n'
    for block_bytes in (1, 100, 1 << 20):
        blocks = list(jsonl_zst_blocks(tmp_path / "both.jsonl.zst", block_bytes))
        assert b"".join(blocks) == expected and all(block.endswith(b"\n") for block in blocks)
