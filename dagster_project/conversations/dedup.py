"""Exact-duplicate and id-collision detection without holding the dataset in memory.

`SeenIndex` is a SQLite file on local disk with two tables: 64-bit content digests (→ the id of the
first row that had it) and the ids already given out. Memory stays at SQLite's page cache
(`CACHE_KIB`) plus one batch of rows whatever the row count; the file grows by about 25 bytes per digest
plus the ids (≈ 50 MB at 914K rows with 16-character ids). A set of Python ints would cost about 70 bytes
per row in RAM (≈ 65 MB at 914K, 700 MB at 10M) and still need the ids.

Rows are decided one at a time, in input order, but the index is read and written a batch at a time: the
caller `prefetch`es a batch's digests and candidate ids (one query each), decides its rows against what
came back plus what the batch itself added, then `commit`s the batch's additions in one `executemany`.
One SQLite statement per row would cost more than everything else the stage does with the row.
A fixed-size bitmap of the keys written (`_KeyFilter`, 8 MiB whatever the row count) answers "never seen"
for almost every new key without a query: only keys whose bit is set are looked up in SQLite.

A 64-bit digest collision between different contents has probability ≈ n²/2⁶⁵ (3·10⁻⁸ at 1M rows);
it would quarantine one row as a duplicate, visibly, never merge two rows.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from pathlib import Path

CACHE_KIB = 16 * 1024
FILTER_BITS = 1 << 26  # 8 MiB: at 2M keys (1M rows) about 3% of new keys still need a lookup
# SQLite's default limit on the `?` of one statement is 32,766; lookups are split below it.
_LOOKUP_CHUNK = 16_000


def digest64(data: bytes) -> int:
    """A signed 64-bit digest (SQLite's INTEGER PRIMARY KEY range)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


class _KeyFilter:
    """One bit per key hash: clear means the key was never added; set means it may have been."""

    def __init__(self, bits: int = FILTER_BITS):
        self._mask = bits - 1
        self._bits = bytearray(bits // 8)

    def may_hold(self, key: int | str) -> bool:
        # hash() of a str varies between processes, never within one: the filter lives as long as the index.
        position = hash(key) & self._mask
        return bool(self._bits[position >> 3] & (1 << (position & 7)))

    def add(self, key: int | str) -> None:
        position = hash(key) & self._mask
        self._bits[position >> 3] |= 1 << (position & 7)


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
        # The current batch: what the index held for its prefetched keys, and what the batch added.
        self._stored_contents: dict[int, str] = {}
        self._looked_up_contents: set[int] = set()
        self._stored_ids: set[str] = set()
        self._looked_up_ids: set[str] = set()
        self._new_contents: dict[int, str] = {}
        self._new_ids: set[str] = set()
        self._written = _KeyFilter()

    def prefetch(self, digests: Iterable[int], ids: Iterable[str]) -> None:
        """Read what the index holds for a batch's digests and candidate ids, in a few queries."""
        digests, ids = set(digests) - self._looked_up_contents, set(ids) - self._looked_up_ids
        self._looked_up_contents |= digests
        self._looked_up_ids |= ids
        digests = [digest for digest in digests if self._written.may_hold(digest)]
        ids = [row_id for row_id in ids if self._written.may_hold(row_id)]
        for chunk in _chunks(sorted(digests)):
            query = f"SELECT digest, first_id FROM contents WHERE digest IN ({','.join('?' * len(chunk))})"
            self._stored_contents.update(self._db.execute(query, chunk).fetchall())
        for chunk in _chunks(sorted(ids)):
            query = f"SELECT id FROM ids WHERE id IN ({','.join('?' * len(chunk))})"
            self._stored_ids.update(found for (found,) in self._db.execute(query, chunk))

    def first_with_content(self, digest: int) -> str | None:
        """The id of the kept row that had this content digest, if any."""
        if digest in self._new_contents:
            return self._new_contents[digest]
        if digest not in self._looked_up_contents:
            self.prefetch([digest], [])
        return self._stored_contents.get(digest)

    def add_content(self, digest: int, row_id: str) -> None:
        self._new_contents[digest] = row_id

    def claim_id(self, row_id: str) -> bool:
        """Take `row_id`; False when an earlier row already has it."""
        if row_id not in self._looked_up_ids:
            self.prefetch([], [row_id])
        if row_id in self._stored_ids or row_id in self._new_ids:
            return False
        self._new_ids.add(row_id)
        return True

    def commit(self) -> None:
        """Write the batch's additions to the index and forget the batch."""
        # In key order: each insert lands next to the one before in the B-tree, not on a random page.
        self._db.executemany("INSERT INTO contents VALUES (?, ?)", sorted(self._new_contents.items()))
        self._db.executemany("INSERT INTO ids VALUES (?)", ((row_id,) for row_id in sorted(self._new_ids)))
        for key in (*self._new_contents, *self._new_ids):
            self._written.add(key)
        for batch_state in (self._stored_contents, self._looked_up_contents, self._stored_ids, self._looked_up_ids):
            batch_state.clear()
        self._new_contents.clear()
        self._new_ids.clear()

    def close(self) -> None:
        self.commit()
        self._db.execute("COMMIT")
        self._db.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SeenIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _chunks(items: list) -> Iterable[list]:
    for start in range(0, len(items), _LOOKUP_CHUNK):
        yield items[start : start + _LOOKUP_CHUNK]
