"""Journal checkpoints in the store: append-only segments, each holding only the lines new since the last one,
and a resume on another node (another work directory) that rebuilds the journal from them."""

import asyncio

import orjson
import pytest

from dagster_project.generation.heartbeat import ShardReporter, journal_segments_prefix, restore_journal
from dagster_project.generation.journal import Journal
from dagster_project.store.storage import LocalStore
from tests.support.journal_files import journal_records

SHARD, FINGERPRINT = 7, "f00d"


def record(event_id: str, status: str = "ok", retryable: bool = False) -> dict:
    return {"event_id": event_id, "status": status, "retryable": retryable, "finish_reason": "stop"}


def reporter(store: LocalStore, journal: Journal, checkpointed_bytes: int = 0) -> ShardReporter:
    return ShardReporter(
        store, SHARD, journal, FINGERPRINT, snapshot=lambda: None, checkpointed_bytes=checkpointed_bytes
    )


def segments(store: LocalStore) -> list[bytes]:
    return [
        store.get_bytes(info.key)
        for info in sorted(store.list(journal_segments_prefix(SHARD, FINGERPRINT)), key=lambda i: i.key)
    ]


@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def test_each_checkpoint_uploads_only_the_lines_new_since_the_last(store, tmp_path):
    with Journal(tmp_path / "node-a" / "j.jsonl") as journal:
        writer = reporter(store, journal)
        for event in ("a", "b", "c"):
            journal.append(record(event))
        asyncio.run(writer.checkpoint_journal())
        asyncio.run(writer.checkpoint_journal())  # nothing new: no segment
        for event in ("d", "e"):
            journal.append(record(event))
        asyncio.run(writer.checkpoint_journal())
        stored = segments(store)
        assert [len(segment.splitlines()) for segment in stored] == [3, 2]
        assert b"".join(stored) == journal.path.read_bytes()  # no byte uploaded twice, none missing
        assert writer.segments_written == 2 and writer.upload_failures == 0


def test_a_line_being_written_waits_for_the_next_checkpoint(store, tmp_path):
    with Journal(tmp_path / "j.jsonl") as journal:
        writer = reporter(store, journal)
        journal.append(record("a"))
        line = orjson.dumps(record("b")) + b"\n"
        with open(journal.path, "ab") as handle:  # another writer mid-line, as the journal's own write could be
            handle.write(line[:10])
            handle.flush()
            asyncio.run(writer.checkpoint_journal())
            handle.write(line[10:])
        asyncio.run(writer.checkpoint_journal())
    assert [orjson.loads(line)["event_id"] for seg in segments(store) for line in seg.splitlines()] == ["a", "b"]


def test_a_failed_upload_is_retried_whole_at_the_next_checkpoint(store, tmp_path):
    blocker = store.root / journal_segments_prefix(SHARD, FINGERPRINT).rstrip("/")
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the segments' directory must go")
    with Journal(tmp_path / "j.jsonl") as journal:
        writer = reporter(store, journal)
        journal.append(record("a"))
        asyncio.run(writer.checkpoint_journal())
        assert writer.upload_failures == 1 and writer.checkpointed_bytes == 0
        blocker.unlink()
        journal.append(record("b"))
        asyncio.run(writer.checkpoint_journal())
        assert segments(store) == [journal.path.read_bytes()]


def test_a_resume_on_another_node_restores_every_checkpointed_event_and_continues_the_segments(store, tmp_path):
    with Journal(tmp_path / "node-a" / "j.jsonl") as journal:
        first = reporter(store, journal)
        for event in ("a", "b"):
            journal.append(record(event))
        asyncio.run(first.checkpoint_journal())
        journal.append(record("c"))  # journaled after the last checkpoint: lost with node A

    on_b = tmp_path / "node-b" / "j.jsonl"
    restored = restore_journal(store, SHARD, FINGERPRINT, on_b)
    assert restored == on_b.stat().st_size and set(journal_records(on_b)) == {"a", "b"}
    assert restore_journal(store, SHARD, FINGERPRINT, on_b) == 0  # a local journal is never overwritten
    with Journal(on_b) as journal:
        second = reporter(store, journal, checkpointed_bytes=restored)
        journal.append(record("c"))
        journal.append(record("a"))  # refused: already final
        asyncio.run(second.checkpoint_journal())
    assert [len(segment.splitlines()) for segment in segments(store)] == [2, 1]

    on_c = tmp_path / "node-c" / "j.jsonl"
    restore_journal(store, SHARD, FINGERPRINT, on_c)
    assert set(journal_records(on_c)) == {"a", "b", "c"}


def test_when_two_runs_recorded_one_event_the_journal_rule_decides_after_a_restore(store, tmp_path):
    for node, status in (("node-a", "error"), ("node-b", "ok")):  # A's retryable error, then B's answer
        with Journal(tmp_path / node / "j.jsonl") as journal:
            writer = reporter(store, journal)
            journal.append(record("a", status=status, retryable=status == "error"))
            asyncio.run(writer.checkpoint_journal())
    on_c = tmp_path / "node-c" / "j.jsonl"
    restore_journal(store, SHARD, FINGERPRINT, on_c)
    with Journal(on_c) as journal:
        assert journal.entries["a"].status == "ok"


def test_nothing_checkpointed_restores_nothing(store, tmp_path):
    assert restore_journal(store, SHARD, FINGERPRINT, tmp_path / "j.jsonl") == 0
    assert not (tmp_path / "j.jsonl").exists()
