"""Publishing a shard: data objects first, the manifest last.

A shard without a manifest does not exist for downstream assets. Replacing a shard first withdraws its
old manifest, so a reader never pairs a new manifest with old objects or the reverse.

Every manifest is a dataclass: `ShardManifest` (or `StageManifest` for a stage published as a whole)
holds what all of them record, and each stage's `shards` module adds its own fields in a subclass.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from dagster_project.store import object_index
from dagster_project.store.dataclass_json import parse_record, read_record, to_json
from dagster_project.store.layout import (
    MANIFEST_NAME,
    regenerate_command,
    shard_manifest_key,
    shard_prefix,
    stage_manifest_key,
)
from dagster_project.store.storage import (
    CorruptObject,
    LocalStore,
    ObjectInfo,
    Store,
    StoreError,
    sha256_bytes,
    sha256_file,
)
from dagster_project.store.transfer import arrow_filesystem, local_copy, map_in_order, put_file_moving

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class StoredObject:
    """An object a manifest vouches for: its key, and the size and checksum it had when it was uploaded."""

    key: str
    size: int
    sha256: str | None = None
    etag: str | None = None  # on S3: checked against a listing, so verifying needs no request per object

    @classmethod
    def of(cls, info: ObjectInfo) -> StoredObject:
        return cls(key=info.key, size=info.size, sha256=info.sha256, etag=info.etag)


@dataclass(frozen=True, kw_only=True)
class ShardManifest:
    """What every published shard records. `objects` and `published_at` are filled in by `publish_shard`."""

    stage: str
    shard: int
    rows: int
    ids_digest: str = ""
    objects: tuple[StoredObject, ...] = ()
    published_at: float = 0.0

    @property
    def data_objects(self) -> list[StoredObject]:
        return [o for o in self.objects if not o.key.endswith(MANIFEST_NAME)]

    @property
    def data_keys(self) -> list[str]:
        return [o.key for o in self.data_objects]

    @property
    def stored_bytes(self) -> int:
        return sum(o.size for o in self.objects)


@dataclass(frozen=True, kw_only=True)
class StageManifest:
    """What a stage published as a whole records. `published_at` is filled in by `write_stage_manifest`."""

    stage: str
    published_at: float = 0.0


ShardManifestT = TypeVar("ShardManifestT", bound=ShardManifest)
StageManifestT = TypeVar("StageManifestT", bound=StageManifest)


def ids_digest(ids: Iterable[str]) -> str:
    """Order-independent digest of a set of ids: two shards with the same ids have the same digest."""
    # Each id followed by a line break, hashed in one call (two calls per id were most of publishing's hashing).
    ordered = sorted(ids)
    ordered.append("")
    return hashlib.sha256("\n".join(ordered).encode("utf-8")).hexdigest()


def put_object(store: Store, key: str, path: Path, *, synced: bool = True, consume: bool = False) -> StoredObject:
    """Upload the local file at `path` as `key`; `consume`: the file is given up (`put_file_moving`)."""
    info = put_file_moving(store, key, path, synced=synced) if consume else store.put_file(key, path, synced=synced)
    return StoredObject.of(info)


def publish_shard(store: Store, manifest: ShardManifestT, files: list[tuple[str, Path]]) -> ShardManifestT:
    """Upload `files` (names relative to the shard prefix) then the manifest; return the manifest as published."""
    return publish_shards_together(store, [(manifest, files)])[0]


def publish_shards_together(
    store: Store, shards: list[tuple[ShardManifestT, list[tuple[str, Path]]]], *, consume_files: bool = False
) -> list[ShardManifestT]:
    """`publish_shard` for each of `shards` (each shard's files, then its manifest), with the object index
    updated once per index block for all of them rather than twice per shard: a stage that publishes 1,830
    shards at once would otherwise rewrite each 128-shard index block hundreds of times.

    A republish replaces a published shard, never hides it: the new objects are written beside the ones the
    published manifest names (under another name where the name is taken, `_free_key`), the new manifest
    replaces the old one in one write, and only then, once the index names it too, are the earlier objects
    removed. Until then every reader, of the objects or of the index, reads the earlier publication whole.

    Durability is paid once per phase, not once per object (`Store.sync`; on a local disk one syncfs instead of
    an fsync per file, each of which waits for its own journal commit): every shard's files are written, then
    made durable together, and only then are the manifests written, then made durable together, before the
    index names them. So a manifest that survives a crash always describes files that survived it (a reader
    never trusts a shard whose data is not durable), and the caller's commit point that follows (a stage
    manifest, written synced) is durable only after every manifest it sums up. A crash in between leaves the
    earlier publication (or none) in place with objects no manifest names (the next publish removes them), or
    a manifest torn by the crash, which its reader reports as damaged, naming the object to re-materialize
    (`parse_record`); never a manifest that names missing or partial data. `consume_files`: the local files are
    given up (moved into a local store, not copied)."""
    shard_key = {manifest.shard: shard_manifest_key(manifest.stage, manifest.shard) for manifest, _ in shards}
    taken = dict(
        zip(shard_key.values(), map_in_order(store, lambda key: _published_keys(store, key), shard_key.values()))
    )

    def put_files(shard: tuple[ShardManifestT, list[tuple[str, Path]]]) -> ShardManifestT:
        manifest, files = shard
        prefix, published = shard_prefix(manifest.stage, manifest.shard), taken[shard_key[manifest.shard]]
        objects = tuple(
            put_object(store, _free_key(prefix + name, published), path, synced=False, consume=consume_files)
            for name, path in files
        )
        return replace(manifest, objects=objects)

    def put_manifest(manifest: ShardManifestT) -> tuple[ShardManifestT, bytes, str | None]:
        done = replace(manifest, published_at=time.time())
        data = to_json(done)
        return done, data, store.put_bytes(shard_key[manifest.shard], data, synced=False).etag

    def remove_earlier(manifest: ShardManifestT) -> None:
        prefix = shard_prefix(manifest.stage, manifest.shard)
        _remove_unlisted(store, prefix, {o.key for o in manifest.objects} | {shard_key[manifest.shard]})

    # Each phase's requests side by side on S3.
    with_objects = list(map_in_order(store, put_files, shards))
    store.sync()
    done = list(map_in_order(store, put_manifest, with_objects))
    store.sync()
    object_index.record_all(store, {shard_key[m.shard]: (data, etag) for m, data, etag in done})
    list(map_in_order(store, remove_earlier, [manifest for manifest, _, _ in done]))
    return [manifest for manifest, _, _ in done]


def _published_keys(store: Store, manifest_key: str) -> set[str]:
    """The object keys the shard's published manifest names (none when unpublished or unreadable)."""
    found = store.get_versioned(manifest_key)
    try:
        return {obj["key"] for obj in orjson.loads(found[0]).get("objects", ())} if found else set()
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return set()  # a torn manifest names nothing a reader trusts: its objects may be overwritten


# Where a published object already holds a name, the replacement takes this one (and the next, the name again).
_REPLACEMENT = ".replacement"


def _free_key(key: str, published: set[str]) -> str:
    """`key`, or where the published manifest names it, `key` with `_REPLACEMENT` before its extensions."""
    if key not in published:
        return key
    folder, _, name = key.rpartition("/")
    stem, dot, extensions = name.partition(".")
    return f"{folder}/{stem}{_REPLACEMENT}{dot}{extensions}"


def _remove_unlisted(store: Store, prefix: str, keep: set[str]) -> None:
    """Objects of an earlier publication that the new manifest does not list would only confuse readers."""
    for info in list(store.list(prefix)):
        if info.key not in keep:
            store.delete(info.key)


def published_shards(store: Store, stage: str) -> list[int]:
    """The shards of `stage` that have a manifest, found by listing (whatever the shard count says)."""
    shards = []
    for info in store.list(f"{stage}/shard="):
        number, _, name = info.key[len(stage) + len("/shard=") :].partition("/")
        if name == MANIFEST_NAME and number.isdigit():
            shards.append(int(number))
    return sorted(shards)


def withdraw_shards(store: Store, stage: str) -> list[int]:
    """Unpublish every shard of `stage`: its manifest goes, so no reader uses it; the objects stay until the
    shard is published again (which removes what the new manifest does not list). Returns the shards."""
    shards = published_shards(store, stage)
    keys = [shard_manifest_key(stage, shard) for shard in shards]
    for key in keys:
        store.delete(key)
    object_index.forget(store, keys)
    return shards


def read_published_manifests(store: Store, stage: str, kind: type[ShardManifestT]) -> dict[int, ShardManifestT]:
    """Shard → manifest of every published shard of `stage`, in a few requests (from the store's index of
    manifests; see `object_index`)."""
    found = object_index.read_records(store, f"{stage}/shard=", kind, lambda key: key.endswith(MANIFEST_NAME))
    return {manifest.shard: manifest for manifest in found.values()}


def read_manifests_from_objects(
    store: Store, stage: str, kind: type[ShardManifestT]
) -> tuple[dict[int, ShardManifestT], dict[str, ObjectInfo]]:
    """Every published manifest of `stage` as its own object holds it (not as the index may have it), and every
    object under the stage's shards as listed; the index is made to agree with the objects. A manifest is read
    from its object unless the listing shows it unchanged since its index copy was made (the same ETag, on S3):
    on S3 a check of 1,830 shards then costs a listing instead of 1,830 requests."""
    listed = {info.key: info for info in store.list(f"{stage}/shard=")}
    keys = [key for key in listed if key.endswith(MANIFEST_NAME)]
    entries = object_index.read_entries(store, stage)
    copies = object_index.copies_as_listed(entries, {key: listed[key].etag for key in keys})
    to_read = [key for key in keys if key not in copies]
    raws = {key: raw for key, raw in zip(to_read, object_index.fetch_all(store, to_read)) if raw is not None}
    found = [object_index.from_copy(store, key, kind, body) for key, body in copies.items()]
    found += [parse_record(store, key, kind, raw) for key, raw in raws.items()]
    # Index copies of the shards' other records (the checks' verdicts) stay while their objects are listed.
    object_index.reconcile(store, stage, raws, as_listed=[key for key in listed if key not in raws], entries=entries)
    return {manifest.shard: manifest for manifest in found}, listed


def listing_problems(manifest: ShardManifest, listed: dict[str, ObjectInfo]) -> list[str]:
    """What a listing shows wrong with a published shard's objects: missing, another size, or (on S3, where the
    manifest recorded the ETag) other bytes. Checksums of local objects are `verify_shard`'s."""
    problems = []
    for obj in manifest.objects:
        info = listed.get(obj.key)
        if info is None:
            problems.append(f"missing {obj.key}")
        elif info.size != obj.size:
            problems.append(f"{obj.key}: {info.size} bytes in the store, manifest says {obj.size}")
        elif info.etag and obj.etag and info.etag != obj.etag:
            problems.append(f"{obj.key}: other bytes than published (its ETag changed)")
    return problems


def read_shard_manifest(store: Store, stage: str, shard: int, kind: type[ShardManifestT]) -> ShardManifestT | None:
    """The shard's manifest as `kind` (any `ShardManifest` reads any stage's), or None when it is not published."""
    return read_record(store, shard_manifest_key(stage, shard), kind)


def write_stage_manifest(store: Store, manifest: StageManifestT) -> StageManifestT:
    published = replace(manifest, published_at=time.time())
    store.put_bytes(stage_manifest_key(manifest.stage), to_json(published))
    return published


def read_stage_manifest(store: Store, stage: str, kind: type[StageManifestT]) -> StageManifestT | None:
    return read_record(store, stage_manifest_key(stage), kind)


# ---- integrity on read: every reader of a published object checks it against its manifest first ----------------


class DamagedObject(CorruptObject):
    """A published object whose bytes are not those its manifest recorded (rewritten, truncated, bit rot)."""


_MISSING = "missing"
_OTHER_BYTES = "checksum differs from the manifest"


def object_problem(store: Store, obj: StoredObject, copy: Path | None = None) -> str | None:
    """What is wrong with a published object against its manifest's record (None: it is as published).

    A local object, or `copy` (an S3 object downloaded whole), is checked by size and SHA-256 over all its bytes.
    An S3 object read in place (some columns by ranged GETs) is checked by one HEAD: size and the ETag, which S3
    computes from the bytes it holds, against those recorded at publication (hashing it would need the whole
    object downloaded); one published before ETags were recorded is downloaded and hashed."""
    if isinstance(store, LocalStore) or copy is not None:
        path = copy if copy is not None else store._path(obj.key)
        if not path.is_file():
            return _MISSING
        return _size_problem(path.stat().st_size, obj) or (
            _OTHER_BYTES if obj.sha256 and sha256_file(path) != obj.sha256 else None
        )
    if not obj.etag:
        with local_copy(store, obj.key) as path:
            return object_problem(store, obj, path)
    info = store.head(obj.key)
    if info is None:
        return _MISSING
    return _size_problem(info.size, obj) or (_OTHER_BYTES if info.etag != obj.etag else None)


def _size_problem(size: int, obj: StoredObject) -> str | None:
    return f"{size} bytes in the store, manifest says {obj.size}" if size != obj.size else None


def verify_shard(store: Store, manifest: ShardManifest) -> list[str]:
    """Problems with a published shard's objects in the store (empty when it is intact), each naming its key."""
    return [
        f"missing {obj.key}" if problem == _MISSING else f"{obj.key}: {problem}"
        for obj in manifest.objects
        if (problem := object_problem(store, obj))
    ]


def damage_remedy(manifest: ShardManifest) -> str:
    """What to do about a damaged object of the shard `manifest` describes: the command that makes it again."""
    return f"withdraw and regenerate the shard: {regenerate_command(manifest.stage, manifest.shard)}"


def _damaged(store: Store, manifest: ShardManifest, key: str, problem: str) -> DamagedObject:
    """The error for an object of a published shard that is not as published: the object, what is wrong, the fix."""
    return DamagedObject(f"{store.url(key)} is damaged: {problem}; {damage_remedy(manifest)}")


def rows_mismatch(store: Store, manifest: ShardManifest, rows_read: int) -> DamagedObject:
    """The error for a shard whose objects hold other rows than its manifest counts (they passed their checksum:
    the shard was republished while it was read, or its manifest does not describe them)."""
    return DamagedObject(
        f"{store.url(shard_prefix(manifest.stage, manifest.shard))} does not match its manifest: {rows_read} rows "
        f"read, the manifest says {manifest.rows}; if it was being republished, run again once it is, otherwise "
        f"{damage_remedy(manifest)}"
    )


def check_object(store: Store, manifest: ShardManifest, obj: StoredObject, copy: Path | None = None) -> None:
    """Raise `DamagedObject` naming the object and the remedy unless it is as `manifest` published it."""
    problem = object_problem(store, obj, copy)
    if problem is not None:
        raise _damaged(store, manifest, obj.key, problem)


def verified_bytes(store: Store, manifest: ShardManifest, obj: StoredObject) -> bytes:
    """The object's bytes, once their size and SHA-256 are those `manifest` recorded."""
    data = store.get_bytes(obj.key)
    problem = _size_problem(len(data), obj) or (
        _OTHER_BYTES if obj.sha256 and sha256_bytes(data) != obj.sha256 else None
    )
    if problem is not None:
        raise _damaged(store, manifest, obj.key, problem)
    return data


def iter_parquet_batches(
    store: Store, manifest: ShardManifest, columns: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """Stream the rows of a published shard's Parquet objects one row group at a time (memory bounded by a row
    group), each object checked against the manifest first (`check_object`).

    An object that is not as published raises `DamagedObject`, one that is not readable Parquet `CorruptObject`,
    both naming it. Some columns of an S3 object are read by ranged GETs (its footer and those column chunks),
    not a download.
    """
    import pyarrow.parquet as pq  # here: readers of manifests alone (`dflash status`) never load pyarrow

    for obj in manifest.data_objects:
        key = obj.key
        ranged = columns is not None and not isinstance(store, LocalStore)
        with _parquet_source(store, key, ranged=ranged) as source:
            check_object(store, manifest, obj, None if ranged or isinstance(store, LocalStore) else source)
            with _parquet_errors(store, manifest, key):
                parquet = pq.ParquetFile(source)
            for group in range(parquet.num_row_groups):
                with _parquet_errors(store, manifest, key):
                    table = parquet.read_row_group(group, columns=columns)
                yield from table.to_batches()


@contextmanager
def _parquet_source(store: Store, key: str, *, ranged: bool) -> Iterator[Any]:
    if not ranged or isinstance(store, LocalStore):
        with local_copy(store, key) as path:
            yield path
        return
    filesystem, root = arrow_filesystem(store)
    try:
        source = filesystem.open_input_file(f"{root}/{key}")
    except FileNotFoundError as exc:
        raise StoreError(f"no object {store.url(key)}") from exc
    except OSError as exc:  # pyarrow's S3 client already retried it
        raise StoreError(f"reading {store.url(key)} failed: {exc}") from exc
    with source:
        yield source


@contextmanager
def _parquet_errors(store: Store, manifest: ShardManifest, key: str) -> Iterator[None]:
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        raise CorruptObject(
            f"{store.url(key)} is damaged: not readable as Parquet ({exc}); {damage_remedy(manifest)}"
        ) from exc
