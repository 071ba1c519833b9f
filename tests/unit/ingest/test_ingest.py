"""Exact accounting on an adversarial file (one row per rule), ids, sharding, budget, S3 sources."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto import mock_aws

from dagster_project.conversations.drafts import content_id
from dagster_project.conversations.sharding import shard_of
from dagster_project.conversations.shards import SHARD_FILE, ShardBuffers, SourceTotals
from dagster_project.ingest.quarantine import Accounting
from dagster_project.ingest.readers import row_ranges
from dagster_project.ingest.shards import IngestedFile
from dagster_project.ingest.sources import SourceError, resolve_sources
from dagster_project.ingest.stage import RANGE_BYTES, ingest_files
from dagster_project.records import Conversation
from dagster_project.store import layout
from dagster_project.store.jsonl import JsonlZstWriter, read_jsonl_zst
from tests.support.ingest_helpers import run_stages

BUDGET = 300  # tokens; small so that one test row can exceed it


def user(content: object) -> dict:
    return {"role": "user", "content": content}


def assistant(content: object) -> dict:
    return {"role": "assistant", "content": content}


def adversarial_rows() -> list[tuple[bytes, str | None, str]]:
    """(JSON line, id it should end with, expected outcome) — one line per rule, plus rows that pass."""
    stolen_messages = [user("A question whose hash id an earlier row already uses as its own id.")]

    def line(row: dict) -> bytes:
        return json.dumps(row, ensure_ascii=False).encode("utf-8")

    return [
        (
            line({"id": "ok_single", "messages": [user("What is a prime number?"), assistant("A number ...")]}),
            "ok_single",
            "kept",
        ),
        (
            line(
                {
                    "id": "ok_system_multi",
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        user("Hi"),
                        assistant("Hello"),
                        user("Bye"),
                    ],
                }
            ),
            "ok_system_multi",
            "kept",
        ),
        (line({"id": "empty", "messages": [user("  \t ")]}), "empty", "empty_content"),
        (
            line({"id": "non_string", "messages": [user([{"type": "image_url", "image_url": {"url": "x"}}])]}),
            "non_string",
            "image_content",
        ),
        (
            line({"id": "unknown_role", "messages": [{"role": "narrator", "content": "x"}, user("y")]}),
            "unknown_role",
            "unknown_role",
        ),
        (
            line({"id": "no_user", "messages": [{"role": "system", "content": "s"}, assistant("a")]}),
            "no_user",
            "no_user_turn",
        ),
        (
            line({"id": "starts_assistant", "messages": [assistant("Hello!"), user("Hi")]}),
            "starts_assistant",
            "starts_with_assistant",
        ),
        (
            line({"id": "late_system", "messages": [user("q"), {"role": "system", "content": "s"}]}),
            "late_system",
            "misplaced_system",
        ),
        (
            line({"id": "tool_result", "messages": [user("2+2?"), {"role": "tool", "content": "4"}]}),
            "tool_result",
            "orphan_tool_result",
        ),
        (
            line(
                {
                    "id": "tool_call",
                    "messages": [
                        user("2+2?"),
                        {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]},
                    ],
                }
            ),
            "tool_call",
            "bad_tool_call",
        ),
        (line({"id": "too_long", "messages": [user("word " * 2000)]}), "too_long", "too_long"),
        (b'{"id": "bad_utf8", "messages": [{"role": "user", "content": "caf\xe9"}]}', "bad_utf8", "invalid_utf8"),
        (b'{"id": "cut_short", "messages": [{"role": "user", "content": "where', "cut_short", "invalid_json"),
        (line({"id": "not_messages", "text": "hello"}), "not_messages", "unrecognized_format"),
        (b"", None, "blank line: not a row"),
        (
            line(
                {"id": "dup_of_ok_single", "messages": [user("What is a prime number?"), assistant("Another answer")]}
            ),
            "dup_of_ok_single",
            "duplicate",
        ),
        (
            line({"id": "ok_single", "messages": [user("Same id as row 0, other content.")]}),
            content_id([user("Same id as row 0, other content.")]),
            "kept",
        ),
        (
            line(
                {
                    "id": content_id(stolen_messages),
                    "messages": [user("This row's source id is another row's hash id.")],
                }
            ),
            content_id(stolen_messages),
            "kept",
        ),
        (line({"id": "ok_single", "messages": stolen_messages}), "ok_single", "duplicate_id"),
        (line({"messages": [user("No id at all.")]}), content_id([user("No id at all.")]), "kept"),
    ]


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("adversarial")
    path = root / "adversarial.jsonl"
    rows = adversarial_rows()
    path.write_bytes(b"\n".join(line for line, _, _ in rows) + b"\n")
    return path, rows, run_stages(root, [f"evil={path}"], max_prompt_tokens=BUDGET)


def test_adversarial_file_every_row_has_the_expected_outcome(adversarial) -> None:
    path, rows, outcome = adversarial
    expected = {
        (str(path), index): result for index, (_, _, result) in enumerate(rows) if result != "blank line: not a row"
    }
    assert outcome.by_row() == expected


def test_adversarial_file_accounting_by_id(adversarial) -> None:
    _, rows, outcome = adversarial
    kept_ids = sorted(c.id for c in outcome.conversations)
    assert kept_ids == sorted(row_id for _, row_id, result in rows if result == "kept")
    quarantined = sorted((q["id"], q["reason"]) for q in outcome.quarantined)
    assert quarantined == sorted(
        (row_id, result) for _, row_id, result in rows if result not in ("kept", "blank line: not a row")
    )
    manifest = outcome.manifest
    assert manifest.input_rows == len(rows) - 1 == manifest.rows + manifest.quarantined
    evil = manifest.by_source["evil"]
    assert (evil.input_rows, evil.conversations, evil.quarantined) == (19, 5, 14)
    assert evil.quarantined_by_reason == manifest.quarantined_by_reason
    assert manifest.quarantined_by_reason["bad_tool_call"] == 1 and manifest.quarantined_by_stage == {
        "ingest": 11,
        "conversations": 3,
    }


def test_quarantine_records_say_where_and_why(adversarial) -> None:
    path, _, outcome = adversarial
    records = {q["id"]: q for q in outcome.quarantined}
    assert records["cut_short"]["source_row"] == 12 and records["cut_short"]["source_file"] == str(path)
    assert "line 13" in records["cut_short"]["detail"] and records["cut_short"]["raw"].startswith('{"id": "cut_short"')
    assert records["dup_of_ok_single"]["duplicate_of"] == "ok_single"
    assert f"> budget {BUDGET}" in records["too_long"]["detail"]
    assert records["unknown_role"]["detail"] == "message 0 has role 'narrator'"


def test_ids_shards_and_provenance_of_kept_rows(adversarial) -> None:
    path, _, outcome = adversarial
    by_id = {c.id: c for c in outcome.conversations}
    assert by_id["ok_system_multi"].generate_after == [1, 3]
    assert by_id["ok_system_multi"].extra == {
        "format": "openai",
        "source_id": "ok_system_multi",
        "source_user_turns": 2,
    }
    renamed = by_id[content_id([user("Same id as row 0, other content.")])]
    assert (renamed.extra["source_id"], renamed.source_row, renamed.source_file) == ("ok_single", 16, str(path))
    for conversation in outcome.conversations:
        assert conversation.shard == shard_of(conversation.id, 3)
        assert conversation.source == "evil" and conversation.policy == "all_turns"


def test_every_shard_is_published_with_its_manifest_fields(adversarial) -> None:
    _, _, outcome = adversarial
    for shard in range(3):
        manifest = json.loads(outcome.store.get_bytes(layout.shard_manifest_key(layout.CONVERSATIONS, shard)))
        held = [c for c in outcome.conversations if c.shard == shard]
        assert manifest["rows"] == len(held) and manifest["num_shards"] == 3 and manifest["policy"] == "all_turns"
        assert manifest["turns"] == sum(c.num_turns for c in held)
        assert manifest["multi_turn"] == sum(c.extra["source_user_turns"] > 1 for c in held)
        assert [o["key"] for o in manifest["objects"]] == [
            layout.shard_prefix(layout.CONVERSATIONS, shard) + SHARD_FILE
        ]


def test_fewer_shards_on_a_rebuild_removes_the_stale_ones(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"question {i}"}) for i in range(20)))
    run_stages(tmp_path, [str(path)], num_shards=5)
    outcome = run_stages(tmp_path, [str(path)], num_shards=2)
    shards = {info.key.split("/")[1] for info in outcome.store.list(f"{layout.CONVERSATIONS}/shard=")}
    assert shards == {"shard=00000", "shard=00001"}
    assert outcome.manifest.stale_shards_removed == 6  # 3 shards x (data + manifest)
    assert len(outcome.conversations) == 20


def test_a_file_of_unknown_format_has_its_rows_quarantined_saying_how_to_set_it(tmp_path: Path) -> None:
    mystery, chat = tmp_path / "mystery.jsonl", tmp_path / "chat.jsonl"
    mystery.write_text(json.dumps({"foo": 1}) + "\n" + json.dumps({"foo": 2}) + "\n")
    chat.write_text(json.dumps({"prompt": "hello"}) + "\n")
    outcome = run_stages(tmp_path, [str(mystery), str(chat)])
    assert sorted(outcome.by_row().values()) == ["kept", "unrecognized_format", "unrecognized_format"]
    detail = next(q["detail"] for q in outcome.quarantined)
    assert "cannot tell the file's format" in detail and "NAME@FORMAT=URI" in detail
    assert [(f.format, f.note) for f in outcome.raw_manifest.files] == [
        ("unknown", "format unknown: every row quarantined"),
        ("prompt", ""),
    ]


def test_format_override_quarantines_rows_without_its_fields(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"prompt": "a"}, {"instruction": "b"}, {"prompt": "c"}]))
    outcome = run_stages(tmp_path, [str(path)], fmt="alpaca")
    assert sorted(outcome.by_row().values()) == ["kept", "unrecognized_format", "unrecognized_format"]


def test_missing_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        resolve_sources([str(tmp_path / "absent.jsonl")])
    with pytest.raises(SourceError, match="matched no"):
        resolve_sources([str(tmp_path / "*.parquet")])


def test_s3_sources_by_glob_and_prefix(tmp_path: Path) -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="prompts-bucket")
        for name, count in [("chat/a.jsonl", 3), ("chat/b.jsonl", 2), ("code/c.jsonl", 4), ("chat/readme.txt", 0)]:
            body = "\n".join(json.dumps({"prompt": f"{name} {i}"}) for i in range(count))
            client.put_object(Bucket="prompts-bucket", Key=f"sets/{name}", Body=body.encode())
        outcome = run_stages(
            tmp_path,
            ["chat=s3://prompts-bucket/sets/chat/*.jsonl", "s3://prompts-bucket/sets/code/"],
            s3_client=lambda: client,
        )
    assert outcome.manifest.by_source == {
        "c": SourceTotals(input_rows=4, conversations=4, quarantined=0),
        "chat": SourceTotals(input_rows=5, conversations=5, quarantined=0),
    }
    assert {c.source_file for c in outcome.conversations} == {
        "s3://prompts-bucket/sets/chat/a.jsonl",
        "s3://prompts-bucket/sets/chat/b.jsonl",
        "s3://prompts-bucket/sets/code/c.jsonl",
    }
    assert not list((tmp_path / "work" / "source_downloads").iterdir()), "downloads are removed after reading"


def test_shard_buffers_flush_often_and_keep_every_shard(tmp_path: Path) -> None:
    buffers = ShardBuffers(tmp_path / "shards", num_shards=4, max_buffered_bytes=16)
    written = {0: [b"a" * 10, b"b"], 2: [b"c" * 20, b"d", b"e"]}
    ids = {0: ["x\ny", "b"], 2: ["c\u2028", "d", "e"]}  # ids hold any text, line breaks too
    for index in range(3):
        for shard, lines in written.items():
            if index < len(lines):
                conversation = Conversation(ids[shard][index], [], [1] * (index + 1), shard=shard)
                buffers.write(conversation, lines[index])
    buffers.flush()
    assert [buffers.path(s).read_bytes().splitlines() for s in range(4)] == [written[0], [], written[2], []]
    assert buffers.block_ids(0) == ids  # the four shards are in object-index block 0
    assert [(c.conversations, c.turns) for c in buffers.counts] == [(2, 3), (0, 0), (3, 6), (0, 0)]


def test_a_shard_file_that_cannot_be_created_fails_the_flush(tmp_path: Path) -> None:
    """The empty shard files are created in a thread: what stops it must stop the stage, not pass unseen."""
    (tmp_path / "shards" / "shard=00001.jsonl").mkdir(parents=True)  # a directory where shard 1's file goes
    buffers = ShardBuffers(tmp_path / "shards", num_shards=4)
    buffers.write(Conversation("a", [], [1], shard=0), b"{}")
    with pytest.raises(IsADirectoryError):
        buffers.flush()


def test_files_read_in_worker_processes_give_the_same_snapshot_as_one_process(tmp_path: Path) -> None:
    """Each file (or each range of a JSON Lines file) read side by side into its own parts, appended in file order:
    the records, their order and the accounting are those of one process reading the files one after the other."""
    sources = tmp_path / "sources"
    sources.mkdir()
    rows = adversarial_rows()
    (sources / "a.jsonl").write_bytes(b"\n".join(line for line, _, _ in rows) + b"\n")
    (sources / "b.jsonl").write_bytes(b"\n".join(line for line, _, _ in reversed(rows)) + b"\nnot json\n")
    (sources / "c.json").write_text(json.dumps([{"instruction": "Name a prime.", "output": "7"}, {"output": "x"}]))
    chats = [{"id": f"pq-{i}", "messages": [{"role": "user", "content": f"Question {i % 5}?"}]} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(chats), sources / "d.parquet", row_group_size=7)  # 6 row groups
    files = resolve_sources([f"first={sources}", f"second={sources / 'c.json'}"])

    def ingest(
        parallel_min_bytes: int, range_bytes: int = RANGE_BYTES
    ) -> tuple[list[dict], list[dict], Accounting, list[IngestedFile]]:
        out = tmp_path / f"min-{parallel_min_bytes}-{range_bytes}"
        with JsonlZstWriter(out / "p.jsonl.zst") as prompts, JsonlZstWriter(out / "q.jsonl.zst") as quarantine:
            result = ingest_files(
                files,
                prompts,
                quarantine,
                work_dir=out / "work",
                parallel_min_bytes=parallel_min_bytes,
                range_bytes=range_bytes,
            )
        assert not list((out / "work").iterdir()), "no part file is left behind"
        return (
            list(read_jsonl_zst(prompts.path)),
            list(read_jsonl_zst(quarantine.path)),
            result.accounting,
            result.files,
        )

    one_process, side_by_side = ingest(parallel_min_bytes=1 << 40), ingest(parallel_min_bytes=0)
    assert side_by_side == one_process
    assert len(list(row_ranges(sources / "a.jsonl", "a.jsonl", 500))) > 3
    assert len(list(row_ranges(sources / "d.parquet", "d.parquet", 500))) > 2
    assert ingest(parallel_min_bytes=0, range_bytes=500) == one_process
    prompts, quarantined, accounting, ingested = side_by_side
    names = ("a.jsonl", "b.jsonl", "c.json", "d.parquet")
    assert {row["source_file"] for row in prompts} == {str(sources / name) for name in names}
    assert [(Path(file.uri).name, file.format, file.rows) for file in ingested][2:] == [
        ("c.json", "alpaca", 2),
        ("d.parquet", "openai", 40),
        ("c.json", "alpaca", 2),
    ]
    assert [(Path(file.uri).name, file.format) for file in ingested][:2] == [
        ("a.jsonl", "openai"),
        ("b.jsonl", "openai"),
    ]
    assert ingested[1].rows == ingested[0].rows + 1 and ingested[1].quarantined == ingested[0].quarantined + 1
    assert accounting.rows == len(prompts) + len(quarantined)
