"""Same-named objects in different prefixes (`a/train.jsonl`, `b/train.jsonl`: the Hugging Face layout) are each read
from their own local copy, by the serial reader and by the worker processes: every row credited to its own file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from dagster_project.ingest.sources import SourceFile, local_copy, resolve_sources
from dagster_project.ingest.stage import ingest_files
from dagster_project.store.jsonl import JsonlZstWriter, read_jsonl_zst

BUCKET = "hf-datasets"
ROWS = {"a": 300, "b": 200, "c": 100}  # a different count per folder: a file read twice, or lost, shows


def _put_train_files(client) -> None:
    client.create_bucket(Bucket=BUCKET)
    for folder, count in ROWS.items():
        body = "\n".join(json.dumps({"prompt": f"{folder} question {i}?"}) for i in range(count)) + "\n"
        client.put_object(Bucket=BUCKET, Key=f"set/{folder}/train.jsonl", Body=body.encode())


def test_copies_of_same_named_objects_held_at_once_are_distinct(tmp_path: Path) -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        _put_train_files(client)
        with (
            local_copy(SourceFile("a", f"s3://{BUCKET}/set/a/train.jsonl"), tmp_path, lambda: client) as first,
            local_copy(SourceFile("b", f"s3://{BUCKET}/set/b/train.jsonl"), tmp_path, lambda: client) as second,
        ):
            assert first != second
            assert first.read_text().startswith("{") and "a question 0?" in first.read_text()
            assert "b question 0?" in second.read_text()
        assert not list((tmp_path / "source_downloads").iterdir()), "each copy is removed after reading"


@pytest.mark.parametrize("parallel_min_bytes", [1 << 40, 0], ids=["serial", "worker_pool"])
def test_same_named_objects_in_different_prefixes_are_each_read_once(tmp_path: Path, parallel_min_bytes: int) -> None:
    """In the worker pool each file is read in many small ranges, the later ones while the next file downloads."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        _put_train_files(client)
        files = resolve_sources([f"s3://{BUCKET}/set/*/train.jsonl"], lambda: client)
        assert len(files) == 3
        with (
            JsonlZstWriter(tmp_path / "p.jsonl.zst") as prompts,
            JsonlZstWriter(tmp_path / "q.jsonl.zst") as quarantine,
        ):
            result = ingest_files(
                files,
                prompts,
                quarantine,
                work_dir=tmp_path / "work",
                s3_client=lambda: client,
                parallel_min_bytes=parallel_min_bytes,
                range_bytes=256,
            )
    rows = list(read_jsonl_zst(prompts.path))
    assert list(read_jsonl_zst(quarantine.path)) == []
    by_file = Counter(row["source_file"] for row in rows)
    assert by_file == {f"s3://{BUCKET}/set/{folder}/train.jsonl": count for folder, count in ROWS.items()}
    for row in rows:  # each row's text names the folder it came from
        folder = row["source_file"].split("/")[-2]
        assert row["messages"][0]["content"].startswith(f"{folder} question")
    assert [(Path(f.uri).parent.name, f.rows, f.kept) for f in result.files] == [
        (folder, count, count) for folder, count in ROWS.items()
    ]
    assert result.accounting.rows == sum(ROWS.values())


def test_same_named_local_files_through_a_glob_are_each_read(tmp_path: Path) -> None:
    """Local same-named files are read where they are (large enough for the worker pool here)."""
    for folder, count in ROWS.items():
        (tmp_path / "set" / folder).mkdir(parents=True)
        lines = [json.dumps({"prompt": f"{folder} question {i}?"}) for i in range(count)]
        (tmp_path / "set" / folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    files = resolve_sources([f"{tmp_path}/set/*/train.jsonl"])
    with JsonlZstWriter(tmp_path / "p.jsonl.zst") as prompts, JsonlZstWriter(tmp_path / "q.jsonl.zst") as quarantine:
        ingest_files(files, prompts, quarantine, work_dir=tmp_path / "work", parallel_min_bytes=0, range_bytes=64)
    by_file = Counter(row["source_file"] for row in read_jsonl_zst(prompts.path))
    assert by_file == {str(tmp_path / "set" / folder / "train.jsonl"): count for folder, count in ROWS.items()}
