"""Copies of many small JSON objects (shard manifests, heartbeats) in a few index objects, so that a reader of
1,830 shards makes a few requests instead of thousands (on S3 each is a round trip; listing costs one per key).

Whoever writes such an object records it here right after (`record`), and whoever removes it forgets it right
after (`forget`). One index object holds the entries of `BLOCK_SHARDS` consecutive shards of one top-level prefix,
`_index/<prefix>/block=NNNNN.json`, and is updated by compare-and-swap, so concurrent shard runs never lose each
other's entries. An entry that is not final (a running shard's heartbeat, rewritten every few seconds) only says
that the object exists: readers fetch the object itself.

The objects stay the truth and the index is a copy of them: a store written before the index existed has none,
and readers then list and fetch the objects (`read_records`). On S3 a final entry also records the ETag of the
object it copies, so a listing tells which copies are still the object (`copies_as_listed`) without fetching
it. The coverage check compares the copies with the objects and rewrites what differs (`reconcile`).
"""

from __future__ import annotations

import random
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson

from dagster_project.store.dataclass_json import from_dict, parse_record
from dagster_project.store.storage import CorruptObject, LocalStore, PreconditionFailed, Store, StoreError
from dagster_project.store.transfer import map_in_order

T = TypeVar("T")

INDEX_PREFIX = "_index"
BLOCK_SHARDS = 128
# Shard runs that publish at the same moment race for one block: each retry re-reads it.
CAS_ATTEMPTS = 50
_SHARD = re.compile(r"shard=(\d+)")

Entries = dict[str, dict[str, Any]]


def block_key(key: str) -> str:
    """The index object that holds `key`'s entry."""
    found = _SHARD.search(key)
    if found is None:
        raise ValueError(f"{key!r} names no shard: only shard objects are indexed")
    return f"{INDEX_PREFIX}/{key.split('/', 1)[0]}/block={int(found[1]) // BLOCK_SHARDS:05d}.json"


def spread_over_blocks(shards: Iterable[int]) -> list[int]:
    """`shards` reordered so that consecutive ones fall in different index blocks: publishers working through
    them side by side then rarely race for one block (each lost race re-reads and rewrites the whole block)."""
    return sorted(shards, key=lambda shard: (shard % BLOCK_SHARDS, shard))


def shards_by_block(shards: Iterable[int]) -> list[list[int]]:
    """`shards` grouped by the index block that holds their entries, in block order."""
    blocks: dict[int, list[int]] = defaultdict(list)
    for shard in shards:
        blocks[shard // BLOCK_SHARDS].append(shard)
    return [blocks[block] for block in sorted(blocks)]


def _update(store: Store, block: str, change: Callable[[Entries], None]) -> None:
    for attempt in range(CAS_ATTEMPTS):
        current = store.get_versioned(block)
        entries: Entries = orjson.loads(current[0]) if current else {}
        change(entries)
        try:
            store.put_if(block, orjson.dumps(entries), current[1] if current else None)
            return
        except PreconditionFailed:
            time.sleep(random.uniform(0, 0.02 * (attempt + 1)))  # backoff: spread the racing writers apart
    raise StoreError(f"could not update {store.url(block)}: {CAS_ATTEMPTS} concurrent writers changed it first")


def record(store: Store, key: str, data: bytes, *, final: bool = True, etag: str | None = None) -> None:
    """Copy the JSON object just written at `key` (with `etag`, the store's ETag of it) into its index
    (`final=False`: readers fetch it instead)."""
    entry = _entry(orjson.loads(data), etag) if final else {"final": False, "body": None}
    _update(store, block_key(key), lambda entries: entries.__setitem__(key, entry))


def record_all(store: Store, written: dict[str, tuple[bytes, str | None]]) -> None:
    """`record` for many objects just written (key → (data, ETag)): one update per index object, not per object."""
    by_block: dict[str, Entries] = defaultdict(dict)
    for key, (data, etag) in written.items():
        by_block[block_key(key)][key] = _entry(orjson.loads(data), etag)
    for block, added in by_block.items():
        _update(store, block, lambda entries, added=added: entries.update(added))


def _entry(body: Any, etag: str | None) -> dict[str, Any]:
    return {"final": True, "body": body, **({"etag": etag} if etag else {})}


def read_entries(store: Store, top: str) -> Entries:
    """Every entry under `_index/<top>/` (none for a store written before the index existed)."""
    return _read_blocks(store, top) or {}


def copies_as_listed(entries: Entries, listed: dict[str, str | None]) -> dict[str, Any]:
    """Key → copy (its JSON body) of each object in `listed` (key → ETag in a listing) whose final entry in
    `entries` was made from an object with that ETag: the object is what the copy says, unread."""
    return {
        key: entry["body"]
        for key, etag in listed.items()
        if etag and (entry := entries.get(key)) and entry["final"] and entry.get("etag") == etag
    }


def forget(store: Store, keys: Iterable[str]) -> None:
    """Drop the entries of objects just removed (one update per index object)."""
    by_block: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        by_block[block_key(key)].add(key)
    for block, gone in by_block.items():

        def drop(entries: Entries, gone: set[str] = gone) -> None:
            for key in gone:
                entries.pop(key, None)

        _update(store, block, drop)


def _read_blocks(store: Store, top: str) -> Entries | None:
    """Every entry under `_index/<top>/` (None: no index, a store written before it existed)."""
    blocks = [info.key for info in store.list(f"{INDEX_PREFIX}/{top}/") if info.key.endswith(".json")]
    if not blocks:
        return None
    entries: Entries = {}
    for block, raw in zip(blocks, fetch_all(store, blocks)):
        if raw is not None:
            try:
                entries.update(orjson.loads(raw))
            except ValueError as exc:
                raise CorruptObject(
                    f"{store.url(block)} is damaged: not a JSON index ({exc}). Delete it: `dflash status --by-id` "
                    "writes it again"
                ) from exc
    return entries


def fetch_all(store: Store, keys: list[str]) -> list[bytes | None]:
    """The objects' bytes, fetched concurrently from S3, in `keys` order (None where an object is gone)."""
    return [found[0] if found else None for found in fetch_all_versioned(store, keys)]


def fetch_all_versioned(store: Store, keys: list[str]) -> list[tuple[bytes, str] | None]:
    """The objects' bytes and versions (on S3, their ETags), fetched concurrently from S3, in `keys` order."""
    return list(map_in_order(store, store.get_versioned, keys))


def read_records(store: Store, prefix: str, kind: type[T], wanted: Callable[[str], bool]) -> dict[str, T]:
    """Key → record of every object under `prefix` that is `wanted`, from the index (fetching the objects of
    entries that are not final), or by listing and fetching where the store has no index."""
    return records_from(store, read_index(store, prefix.split("/", 1)[0]), prefix, kind, wanted)


def read_index(store: Store, top: str) -> Entries | None:
    """Every entry under `_index/<top>/`, for `records_from` (None: the store has no index there)."""
    return _read_blocks(store, top)


def records_from(
    store: Store, entries: Entries | None, prefix: str, kind: type[T], wanted: Callable[[str], bool]
) -> dict[str, T]:
    """`read_records` from the entries `read_index` returned: a reader of several kinds of record under one
    prefix reads the index once."""
    if entries is None:
        copies, to_fetch = {}, [info.key for info in store.list(prefix) if wanted(info.key)]
    else:
        chosen = {key: entry for key, entry in entries.items() if key.startswith(prefix) and wanted(key)}
        copies = {key: entry["body"] for key, entry in chosen.items() if entry["final"]}
        to_fetch = [key for key, entry in chosen.items() if not entry["final"]]
    records = {key: from_copy(store, key, kind, body) for key, body in copies.items()}
    for key, raw in zip(to_fetch, fetch_all(store, to_fetch)):
        if raw is not None:
            records[key] = parse_record(store, key, kind, raw)
    return dict(sorted(records.items()))


def from_copy(store: Store, key: str, kind: type[T], body: dict[str, Any]) -> T:
    try:
        return from_dict(kind, body)
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptObject(
            f"the index copy of {store.url(key)} in {store.url(block_key(key))} is not a valid {kind.__name__} "
            f"({exc}); `dflash status --by-id` rewrites it"
        ) from exc


def reconcile(
    store: Store, top: str, read: dict[str, bytes], as_listed: Iterable[str] = (), entries: Entries | None = None
) -> int:
    """Make the final entries under `_index/<top>/` copies of the objects, given `read` (key → bytes of each such
    object, as just listed and read), `as_listed` (the other ones, whose copies the listing showed right) and
    `entries` (the index as read with the listing; read here if not given). Shard runs may publish meanwhile, so
    an entry that disagrees with `read` is set from the object as it is now (or dropped if it is gone), not from
    `read`. On S3 an entry without its object's ETag gets it. Returns how many changed."""
    entries = read_entries(store, top) if entries is None else entries
    has_etags = not isinstance(store, LocalStore)
    differ = {
        key
        for key, raw in read.items()
        if (entry := entries.get(key, {})).get("body") != orjson.loads(raw) or (has_etags and "etag" not in entry)
    }
    present = set(read) | set(as_listed)
    differ |= {key for key, entry in entries.items() if entry["final"] and key not in present}
    keys = sorted(differ)
    now = dict(zip(keys, fetch_all_versioned(store, keys)))
    by_block: dict[str, set[str]] = defaultdict(set)
    for key in keys:
        by_block[block_key(key)].add(key)
    for block, block_keys in by_block.items():

        def repair(entries: Entries, block_keys: set[str] = block_keys) -> None:
            for key in block_keys:
                if now[key] is None:
                    entries.pop(key, None)
                else:
                    data, version = now[key]
                    entries[key] = _entry(orjson.loads(data), version if has_etags else None)

        _update(store, block, repair)
    return len(keys)
