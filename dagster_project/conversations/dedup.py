"""Exact-duplicate and id-collision detection without holding the dataset in memory.

`SeenIndex` lives in a directory on local disk: every id given out is appended to one file (`ids.bin`), and
two indexes map 64-bit keys to the offset of an id in that file: content digests → the id of the first row
that had the content, and id hashes → the id itself (an id hash that matches is confirmed against the id's
bytes, so two different ids never count as one). Each index is a set of sorted runs of keys (numpy arrays,
`_SortedRuns`): a batch's additions become a new run, merged with the run before it while that one is at
most twice its size (up to `MAX_MERGED_KEYS`), so there are about log2(rows / batch) runs; a run past
`IN_MEMORY_KEYS` keys is written to disk and read through a memory map. Memory stays at one batch of rows,
the small runs and one merge (32 MiB at most) whatever the row count; the files grow by about 32 bytes per
row plus the ids (≈ 45 MB at 1M rows with 12-character ids).

Rows are decided one at a time, in input order, but the index is read and written a batch at a time: the
caller `prefetch`es a batch's digests and candidate ids (a few vectorized searches per run), decides its rows
against what came back plus what the batch itself added, then `commit`s the batch's additions as one run per
index. A lookup per row (or an SQLite statement per row, as this index once used) would cost more than
everything else the stage does with the row.

A 64-bit digest collision between different contents has probability ≈ n²/2⁶⁵ (3·10⁻⁸ at 1M rows);
it would quarantine one row as a duplicate, visibly, never merge two rows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

# Runs up to this many keys stay in memory (16 bytes each with their offsets); longer ones are on disk.
IN_MEMORY_KEYS = 1 << 16
# Runs are merged up to this many keys (a merge holds both in memory: 32 MiB at most); past it they accumulate.
MAX_MERGED_KEYS = 1 << 20
_END = b"\xff"  # ends each id in the ids file: no UTF-8 text holds this byte


# The key of an id: hash() varies between processes, never within one, and the index lives in one process.
_id_key = hash


class _SortedRuns:
    """64-bit keys → int64 values, as sorted runs; a key may appear more than once (values of equal id hashes)."""

    def __init__(self, directory: Path, name: str):
        self.directory, self.name = directory, name
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._files = 0

    def add(self, keys: np.ndarray, values: np.ndarray) -> None:
        if not keys.size:
            return
        self._runs.append(self._sorted(keys, values))
        # Merge the newest run into the one before while that is at most twice its size: runs stay few.
        while len(self._runs) > 1 and self._mergeable(self._runs[-2][0].size, self._runs[-1][0].size):
            newer, older = self._runs.pop(), self._runs.pop()
            self._runs.append(self._sorted(*(np.concatenate([o, n]) for o, n in zip(older, newer, strict=True))))
            self._release(older)
            self._release(newer)

    @staticmethod
    def _mergeable(older: int, newer: int) -> bool:
        return older <= 2 * newer and older + newer <= MAX_MERGED_KEYS

    def find(self, keys: np.ndarray) -> Iterator[tuple[int, int]]:
        """(position in `keys`, value) of every stored entry whose key is one of `keys`."""
        order = np.argsort(keys)
        needles = keys[order]  # sorted: each search starts from the one before, not from the whole run
        for run_keys, run_values in self._runs:
            first = np.searchsorted(run_keys, needles)
            hits = np.flatnonzero(run_keys[np.minimum(first, run_keys.size - 1)] == needles)
            for found, at in zip(hits.tolist(), first[hits].tolist(), strict=True):
                while at < run_keys.size and run_keys[at] == needles[found]:  # equal keys lie side by side
                    yield int(order[found]), int(run_values[at])
                    at += 1

    def _sorted(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Stable: two concatenated sorted runs are merged in one pass.
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
        if keys.size <= IN_MEMORY_KEYS:
            return keys, values
        self._files += 1
        stored = []
        for kind, array in (("keys", keys), ("values", values)):
            path = self.directory / f"{self.name}-{self._files:06d}-{kind}.npy"
            np.save(path, array)
            stored.append(np.load(path, mmap_mode="r"))
        return stored[0], stored[1]

    @staticmethod
    def _release(run: tuple[np.ndarray, np.ndarray]) -> None:
        for array in run:
            if isinstance(array, np.memmap):
                Path(array.filename).unlink()


class SeenIndex:
    def __init__(self, directory: Path):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        self.directory = directory
        # Scratch data: rebuilt on every run, never synced.
        self._ids_file = open(directory / "ids.bin", "w+b")  # noqa: SIM115 - closed by close()
        self._ids_end = 0
        self._contents = _SortedRuns(directory, "contents")
        self._id_hashes = _SortedRuns(directory, "ids")
        # The current batch: what the index held for its prefetched keys, and what the batch added.
        self._stored_contents: dict[int, str] = {}
        self._looked_up_contents: set[int] = set()
        self._stored_ids: set[str] = set()
        self._looked_up_ids: set[str] = set()
        self._new_contents: dict[int, str] = {}
        self._new_ids: dict[str, None] = {}  # in the order they were claimed

    def prefetch(self, digests: Iterable[int], ids: Iterable[str]) -> None:
        """Read what the index holds for a batch's digests and candidate ids (a few searches per run)."""
        digests, ids = list(set(digests) - self._looked_up_contents), list(set(ids) - self._looked_up_ids)
        self._looked_up_contents.update(digests)
        self._looked_up_ids.update(ids)
        if digests:
            keys = np.fromiter(digests, np.int64, len(digests))
            for position, offset in self._contents.find(keys):
                self._stored_contents[digests[position]] = self._read_id(offset)
        if ids:
            keys = np.fromiter(map(_id_key, ids), np.int64, len(ids))
            for position, offset in self._id_hashes.find(keys):
                if self._read_id(offset) == ids[position]:  # the same hash may be another id
                    self._stored_ids.add(ids[position])

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
        self._new_ids[row_id] = None
        return True

    def commit(self) -> None:
        """Write the batch's additions to the index and forget the batch."""
        claimed = list(self._new_ids)
        ids = claimed + list(dict.fromkeys(i for i in self._new_contents.values() if i not in self._new_ids))
        offsets = self._append_ids(ids)
        if claimed:
            hashes = np.fromiter(map(_id_key, claimed), np.int64, len(claimed))
            self._id_hashes.add(hashes, offsets[: len(claimed)])
        if self._new_contents:
            offset_of = dict(zip(ids, offsets.tolist(), strict=True))
            count = len(self._new_contents)
            digests = np.fromiter(self._new_contents, np.int64, count)
            self._contents.add(digests, np.fromiter(map(offset_of.get, self._new_contents.values()), np.int64, count))
        for batch_state in (self._stored_contents, self._looked_up_contents, self._stored_ids, self._looked_up_ids):
            batch_state.clear()
        self._new_contents.clear()
        self._new_ids.clear()

    def _append_ids(self, ids: list[str]) -> np.ndarray:
        """Append `ids` to the ids file, each ended by a byte UTF-8 never holds; the offset of each."""
        encoded = [row_id.encode("utf-8", "surrogatepass") for row_id in ids]
        ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)) + 1) + self._ids_end
        self._ids_file.seek(0, os.SEEK_END)
        self._ids_file.write(_END.join(encoded) + _END if encoded else b"")
        starts = np.concatenate([[self._ids_end], ends[:-1]])
        self._ids_end = int(ends[-1]) if encoded else self._ids_end
        return starts[: len(encoded)]

    def _read_id(self, offset: int) -> str:
        self._ids_file.flush()
        fd, size = self._ids_file.fileno(), 256
        while True:
            data = os.pread(fd, size, offset)
            end = data.find(_END)
            if end >= 0:
                return data[:end].decode("utf-8", "surrogatepass")
            if len(data) < size:  # the file ends before the id does: never written so
                raise RuntimeError(f"the dedup index's ids file {self._ids_file.name} ends inside an id at {offset}")
            size *= 4

    def close(self) -> None:
        self._ids_file.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SeenIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
