"""One bad file never takes the ingest down, and no row costs more memory than `max_line_bytes`: a compressed file
cut short keeps its complete rows, a line nested too deep or too long is quarantined with its reason, a gzip bomb
is skipped in bounded pieces."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from dagster_project.ingest.quarantine import Accounting
from dagster_project.ingest.shards import IngestedFile
from dagster_project.ingest.sources import resolve_sources
from dagster_project.ingest.stage import ingest_files
from dagster_project.store.jsonl import JsonlZstWriter, read_jsonl_zst

SERIAL, WORKER_POOL = 1 << 40, 0  # parallel_min_bytes: never, always


def _line(index: int) -> bytes:
    return json.dumps({"id": f"r{index}", "prompt": f"Question {index}: " + "why " * 20}).encode() + b"\n"


def _ingest(
    tmp_path: Path, specs: list[str], parallel_min_bytes: int = SERIAL, **options: int
) -> tuple[list[dict], list[dict], Accounting, list[IngestedFile]]:
    out = tmp_path / "out"
    with JsonlZstWriter(out / "p.jsonl.zst") as prompts, JsonlZstWriter(out / "q.jsonl.zst") as quarantine:
        result = ingest_files(
            resolve_sources(specs),
            prompts,
            quarantine,
            work_dir=out / "work",
            parallel_min_bytes=parallel_min_bytes,
            **options,
        )
    kept, quarantined = list(read_jsonl_zst(prompts.path)), list(read_jsonl_zst(quarantine.path))
    assert result.accounting.rows == len(kept) + len(quarantined)
    return kept, quarantined, result.accounting, result.files


def _compress(data: bytes, suffix: str) -> bytes:
    return gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("parallel_min_bytes", [SERIAL, WORKER_POOL], ids=["serial", "worker_pool"])
@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_compressed_file_cut_short_keeps_its_complete_rows_and_the_other_files(
    tmp_path: Path, suffix: str, parallel_min_bytes: int
) -> None:
    data = b"".join(_line(i) for i in range(2000))
    compressed = _compress(data, suffix)
    (tmp_path / f"cut.jsonl{suffix}").write_bytes(compressed[: len(compressed) * 2 // 3])
    (tmp_path / "whole.jsonl").write_bytes(b"".join(_line(i) for i in range(5)))
    kept, quarantined, accounting, files = _ingest(
        tmp_path, [f"cut={tmp_path}/cut.jsonl{suffix}", f"whole={tmp_path}/whole.jsonl"], parallel_min_bytes
    )
    cut_rows = [row for row in kept if row["source"] == "cut"]
    assert 500 < len(cut_rows) < 2000
    # Complete rows only, in order: the row cut by the break is not among them.
    assert [row["source_row"] for row in cut_rows] == list(range(len(cut_rows)))
    assert [row["messages"][0]["content"] for row in cut_rows] == [
        json.loads(_line(i))["prompt"] for i in range(len(cut_rows))
    ]
    (record,) = quarantined
    assert (record["reason"], record["source"], record["source_row"]) == ("unreadable_file", "cut", -1)
    assert "cut short or corrupt" in record["detail"] and f"after {len(cut_rows)} rows" in record["detail"]
    assert [row["source_row"] for row in kept if row["source"] == "whole"] == list(range(5))
    assert [(f.source, f.rows, f.kept) for f in files] == [("cut", len(cut_rows) + 1, len(cut_rows)), ("whole", 5, 5)]
    assert accounting.by_reason == {"unreadable_file": 1}


def test_a_line_nested_thousands_deep_is_quarantined_and_the_rest_read(tmp_path: Path) -> None:
    deep = b'{"prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}\n"
    (tmp_path / "deep.jsonl").write_bytes(_line(0) + deep + _line(2))
    kept, quarantined, _, _ = _ingest(tmp_path, [str(tmp_path / "deep.jsonl")])
    assert [row["source_row"] for row in kept] == [0, 2]
    (record,) = quarantined
    assert (record["reason"], record["source_row"]) == ("too_deep", 1)
    assert record["raw"].startswith('{"prompt": [[[')


@pytest.mark.parametrize(
    ("parallel_min_bytes", "range_bytes"),
    [(SERIAL, 1 << 20), (WORKER_POOL, 1 << 20), (WORKER_POOL, 300)],
    ids=["serial", "worker_pool", "worker_pool_ranges"],
)
def test_a_line_over_max_line_bytes_is_quarantined_unread(
    tmp_path: Path, parallel_min_bytes: int, range_bytes: int
) -> None:
    long_line = b'{"id": "huge", "prompt": "' + b"x" * 50_000 + b'"}\n'
    lines = [_line(0), _line(1), long_line, _line(3), long_line.rstrip(b"\n")]  # the last one ends the file
    (tmp_path / "long.jsonl").write_bytes(b"".join(lines[:-1]) + b"\n" + lines[-1])
    (tmp_path / "other.jsonl").write_bytes(_line(0))  # two files: the worker pool reads them side by side
    kept, quarantined, _, _ = _ingest(
        tmp_path,
        [f"long={tmp_path}/long.jsonl", f"other={tmp_path}/other.jsonl"],
        parallel_min_bytes,
        range_bytes=range_bytes,
        max_line_bytes=10_000,
    )
    assert [(row["source"], row["source_row"]) for row in kept] == [("long", 0), ("long", 1), ("long", 3), ("other", 0)]
    assert [(q["reason"], q["source_row"], q["id"]) for q in quarantined] == [
        ("line_too_long", 2, "huge"),
        ("line_too_long", 5, "huge"),
    ]
    assert f"{len(long_line):,} bytes, over max_line_bytes 10,000" in quarantined[0]["detail"]
    assert len(quarantined[0]["raw"]) <= 4000


def test_a_gzip_bomb_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """64 MiB of one line inflating from 64 KiB: read and skipped in pieces, never held (the rows after it count)."""
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as handle:
        handle.write(_line(0) + b'{"prompt": "')
        for _ in range(64):
            handle.write(b"a" * (1 << 20))
        handle.write(b'"}\n' + _line(2))
    tracemalloc.start()
    try:
        kept, quarantined, _, _ = _ingest(tmp_path, [str(bomb)], max_line_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [row["source_row"] for row in kept] == [0, 2]
    assert [(q["reason"], q["source_row"]) for q in quarantined] == [("line_too_long", 1)]
    assert peak < 16 << 20, f"reading peaked at {peak / 2**20:.0f} MiB of Python memory"


def test_a_json_array_element_over_max_line_bytes_ends_the_file_after_the_earlier_elements(tmp_path: Path) -> None:
    elements = [{"instruction": "Name a prime."}, {"instruction": "z" * 50_000}, {"instruction": "Name a color."}]
    (tmp_path / "array.json").write_text(json.dumps(elements))
    kept, quarantined, _, _ = _ingest(tmp_path, [str(tmp_path / "array.json")], max_line_bytes=10_000)
    assert [row["source_row"] for row in kept] == [0]
    (record,) = quarantined
    assert record["reason"] == "unreadable_file" and "element 1 is longer than max_line_bytes" in record["detail"]


def test_a_single_object_json_file_over_max_line_bytes_is_unreadable_not_read_whole(tmp_path: Path) -> None:
    (tmp_path / "one.json").write_text(json.dumps({"instruction": "z" * 50_000}, indent=2))
    kept, quarantined, _, _ = _ingest(tmp_path, [str(tmp_path / "one.json")], max_line_bytes=10_000)
    assert kept == []
    assert [q["reason"] for q in quarantined] == ["unreadable_file"]
    assert "longer than max_line_bytes" in quarantined[0]["detail"]


def test_max_line_bytes_must_be_positive(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(_line(0))
    with pytest.raises(ValueError, match="max_line_bytes must be >= 1"):
        _ingest(tmp_path, [str(tmp_path / "a.jsonl")], max_line_bytes=0)


def test_every_frame_of_a_zst_file_is_read(tmp_path: Path) -> None:
    """A `.zst` file of several frames (`cat a.zst b.zst`, pzstd, an appended file) is read to its last frame (the
    reader feeds the frames to the decompressor itself, to see where the input ends)."""
    compressor = zstandard.ZstdCompressor()
    frames = [compressor.compress(b"".join(_line(i) for i in range(start, start + 50))) for start in (0, 50, 100)]
    (tmp_path / "frames.jsonl.zst").write_bytes(b"".join(frames))
    kept, quarantined, _, _ = _ingest(tmp_path, [str(tmp_path / "frames.jsonl.zst")])
    assert [row["source_row"] for row in kept] == list(range(150)) and quarantined == []
