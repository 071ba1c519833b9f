"""Exact-duplicate and id-collision detection without holding the dataset in memory.

`SeenIndex` is a SQLite file on local disk with two tables: 64-bit content digests (→ the id of the
first row that had it) and the ids already given out. Memory stays at SQLite's page cache
(`CACHE_KIB`) whatever the row count; the file grows by about 25 bytes per digest plus the ids
(≈ 50 MB at 914K rows with 16-character ids). A set of Python ints would cost about 70 bytes per row
in RAM (≈ 65 MB at 914K, 700 MB at 10M) and still need the ids. One insert takes a few microseconds.

A 64-bit digest collision between different contents has probability ≈ n²/2⁶⁵ (3·10⁻⁸ at 1M rows);
it would quarantine one row as a duplicate, visibly, never merge two rows.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

CACHE_KIB = 16 * 1024


def digest64(data: bytes) -> int:
    """A signed 64-bit digest (SQLite's INTEGER PRIMARY KEY range)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


class SeenIndex:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.path = path
        # Scratch data: rebuilt on every run, so durability settings are off.
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=OFF")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        self._db.execute("CREATE TABLE contents (digest INTEGER PRIMARY KEY, first_id TEXT NOT NULL)")
        self._db.execute("CREATE TABLE ids (id TEXT PRIMARY KEY) WITHOUT ROWID")
        self._db.execute("BEGIN")

    def first_with_content(self, digest: int) -> str | None:
        """The id of the kept row that had this content digest, if any."""
        found = self._db.execute("SELECT first_id FROM contents WHERE digest = ?", (digest,)).fetchone()
        return found[0] if found else None

    def add_content(self, digest: int, row_id: str) -> None:
        self._db.execute("INSERT INTO contents VALUES (?, ?)", (digest, row_id))

    def claim_id(self, row_id: str) -> bool:
        """Take `row_id`; False when an earlier row already has it."""
        return bool(self._db.execute("INSERT OR IGNORE INTO ids VALUES (?)", (row_id,)).rowcount)

    def close(self) -> None:
        self._db.execute("COMMIT")
        self._db.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SeenIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
