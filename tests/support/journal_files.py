"""Reading a shard journal file the way a reviewer would, without the project's `Journal` class.

End-to-end resume tests build their expectations from this, so a bug in `Journal`'s own recovery (say,
forgetting the last record) cannot make the expectation and the code under test agree by accident.
"""

from __future__ import annotations

from pathlib import Path

import orjson


def journal_records(path: Path) -> dict[str, dict]:
    """The record that stands for each event: its first final one (ok, or an error not worth retrying),
    else its latest. Bytes after the last newline are a write torn by a kill and are ignored."""
    standing: dict[str, dict] = {}
    data = path.read_bytes() if path.exists() else b""
    for line in data.split(b"\n")[:-1]:
        record = orjson.loads(line)
        previous = standing.get(record["event_id"])
        if previous is None or not _final(previous):
            standing[record["event_id"]] = record
    return standing


def _final(record: dict) -> bool:
    return record["status"] == "ok" or not record.get("retryable")
