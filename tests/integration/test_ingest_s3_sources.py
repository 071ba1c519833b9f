"""Same-named S3 objects in different prefixes (`hf/a/train.jsonl`, `hf/b/…`, `hf/c/…`: the Hugging Face layout)
beside a local file large enough for the worker pool, through both stages on the moto S3 server: every row is
read from its own object and accounted to its own file and source."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

from dagster_aws.s3 import S3Resource

from dagster_project.conversations.shards import SourceTotals
from dagster_project.ingest.stage import PARALLEL_MIN_BYTES
from tests.support.ingest_helpers import run_stages

ROWS = {"a": 3000, "b": 2000, "c": 1000}  # a count per prefix: a file lost, doubled or swapped shows


def test_same_named_objects_under_a_glob_are_each_read_beside_a_large_local_file(s3_bucket, tmp_path: Path) -> None:
    client = S3Resource().get_client()
    for folder, count in ROWS.items():
        body = "".join(json.dumps({"prompt": f"{folder}: question {i}?"}) + "\n" for i in range(count))
        client.put_object(Bucket=s3_bucket, Key=f"hf/{folder}/train.jsonl", Body=body.encode())
    local = tmp_path / "local.jsonl"
    with open(local, "w") as handle:  # over PARALLEL_MIN_BYTES: the files are read in the worker pool
        for i in range(10_000):
            handle.write(json.dumps({"prompt": f"local {i}: " + "word " * 340}) + "\n")
    assert local.stat().st_size > PARALLEL_MIN_BYTES

    outcome = run_stages(
        tmp_path / "run",
        [f"s3://{s3_bucket}/hf/*/train.jsonl", f"local={local}"],
        s3_client=functools.cache(S3Resource().get_client),
    )

    uris = {folder: f"s3://{s3_bucket}/hf/{folder}/train.jsonl" for folder in ROWS}
    assert [(f.uri, f.rows, f.kept) for f in outcome.raw_manifest.files] == [
        *((uris[folder], count, count) for folder, count in ROWS.items()),
        (str(local), 10_000, 10_000),
    ]
    assert outcome.quarantined == []
    by_file = Counter(c.source_file for c in outcome.conversations)
    assert by_file == {**{uris[folder]: count for folder, count in ROWS.items()}, str(local): 10_000}
    for conversation in outcome.conversations:  # each row's text names the prefix it was put under
        if conversation.source_file != str(local):
            folder = conversation.source_file.split("/")[-2]
            assert conversation.messages[0]["content"].startswith(f"{folder}: question")
    assert outcome.manifest.by_source == {
        "local": SourceTotals(input_rows=10_000, conversations=10_000, quarantined=0),
        "train": SourceTotals(input_rows=sum(ROWS.values()), conversations=sum(ROWS.values()), quarantined=0),
    }
    assert not list((tmp_path / "run" / "work" / "source_downloads").iterdir())
