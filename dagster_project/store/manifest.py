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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.layout import MANIFEST_NAME, shard_manifest_key, shard_prefix, stage_manifest_key
from dagster_project.store.storage import ObjectInfo, Store, local_copy


@dataclass(frozen=True)
class StoredObject:
    """An object a manifest vouches for: its key, and the size and checksum it had when it was uploaded."""

    key: str
    size: int
    sha256: str | None = None

    @classmethod
    def of(cls, info: ObjectInfo) -> StoredObject:
        return cls(key=info.key, size=info.size, sha256=info.sha256)


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
    def data_keys(self) -> list[str]:
        return [o.key for o in self.objects if not o.key.endswith(MANIFEST_NAME)]

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
    digest = hashlib.sha256()
    for item in sorted(ids):
        digest.update(item.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def put_object(store: Store, key: str, path: Path) -> StoredObject:
    return StoredObject.of(store.put_file(key, path))


def publish_shard(store: Store, manifest: ShardManifestT, files: list[tuple[str, Path]]) -> ShardManifestT:
    """Upload `files` (names relative to the shard prefix) then the manifest; return the manifest as published."""
    prefix = shard_prefix(manifest.stage, manifest.shard)
    manifest_key = shard_manifest_key(manifest.stage, manifest.shard)
    store.delete(manifest_key)
    objects = tuple(put_object(store, prefix + name, path) for name, path in files)
    published = replace(manifest, objects=objects, published_at=time.time())
    store.put_bytes(manifest_key, to_json(published))
    _remove_unlisted(store, prefix, {o.key for o in objects} | {manifest_key})
    return published


def _remove_unlisted(store: Store, prefix: str, keep: set[str]) -> None:
    """Objects of an earlier publication that the new manifest does not list would only confuse readers."""
    for info in list(store.list(prefix)):
        if info.key not in keep:
            store.delete(info.key)


def read_shard_manifest(store: Store, stage: str, shard: int, kind: type[ShardManifestT]) -> ShardManifestT | None:
    """The shard's manifest as `kind` (any `ShardManifest` reads any stage's), or None when it is not published."""
    key = shard_manifest_key(stage, shard)
    return from_json(kind, store.get_bytes(key)) if store.exists(key) else None


def write_stage_manifest(store: Store, manifest: StageManifestT) -> StageManifestT:
    published = replace(manifest, published_at=time.time())
    store.put_bytes(stage_manifest_key(manifest.stage), to_json(published))
    return published


def read_stage_manifest(store: Store, stage: str, kind: type[StageManifestT]) -> StageManifestT | None:
    key = stage_manifest_key(stage)
    return from_json(kind, store.get_bytes(key)) if store.exists(key) else None


def verify_shard(store: Store, manifest: ShardManifest) -> list[str]:
    """Problems with a published shard's objects in the store (empty when it is intact)."""
    problems = []
    for obj in manifest.objects:
        info = store.head(obj.key)
        if info is None:
            problems.append(f"missing {obj.key}")
        elif info.size != obj.size:
            problems.append(f"{obj.key}: {info.size} bytes in the store, manifest says {obj.size}")
        elif info.sha256 and obj.sha256 and info.sha256 != obj.sha256:
            problems.append(f"{obj.key}: checksum differs from the manifest")
    return problems


def iter_parquet_batches(store: Store, keys: list[str], columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream the objects' rows one Parquet row group at a time (memory bounded by a row group)."""
    for key in keys:
        with local_copy(store, key) as path:
            parquet = pq.ParquetFile(path)
            for group in range(parquet.num_row_groups):
                yield from parquet.read_row_group(group, columns=columns).to_batches()
