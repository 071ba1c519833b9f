"""Publishing a shard: data objects first, the manifest last.

A shard without a manifest does not exist for downstream assets. Replacing a shard first withdraws its
old manifest, so a reader never pairs a new manifest with old objects or the reverse.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.store.layout import MANIFEST_NAME, shard_manifest_key, shard_prefix, stage_manifest_key
from dagster_project.store.storage import Store, local_copy


def ids_digest(ids: Iterable[str]) -> str:
    """Order-independent digest of a set of ids: two shards with the same ids have the same digest."""
    digest = hashlib.sha256()
    for item in sorted(ids):
        digest.update(item.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def publish_shard(
    store: Store, stage: str, shard: int, files: list[tuple[str, Path]], fields: dict[str, Any]
) -> dict[str, Any]:
    """Upload `files` (names relative to the shard prefix) then the manifest; return the manifest."""
    prefix = shard_prefix(stage, shard)
    manifest_key = shard_manifest_key(stage, shard)
    store.delete(manifest_key)
    objects = []
    for name, path in files:
        info = store.put_file(prefix + name, path)
        objects.append({"key": info.key, "size": info.size, "sha256": info.sha256})
    manifest = {"stage": stage, "shard": shard, **fields, "objects": objects, "published_at": time.time()}
    store.put_bytes(manifest_key, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    _remove_unlisted(store, prefix, {o["key"] for o in objects} | {manifest_key})
    return manifest


def _remove_unlisted(store: Store, prefix: str, keep: set[str]) -> None:
    """Objects of an earlier publication that the new manifest does not list would only confuse readers."""
    for info in list(store.list(prefix)):
        if info.key not in keep:
            store.delete(info.key)


def read_shard_manifest(store: Store, stage: str, shard: int) -> dict[str, Any] | None:
    key = shard_manifest_key(stage, shard)
    return orjson.loads(store.get_bytes(key)) if store.exists(key) else None


def write_stage_manifest(store: Store, stage: str, fields: dict[str, Any]) -> dict[str, Any]:
    manifest = {"stage": stage, **fields, "published_at": time.time()}
    store.put_bytes(stage_manifest_key(stage), orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return manifest


def read_stage_manifest(store: Store, stage: str) -> dict[str, Any] | None:
    key = stage_manifest_key(stage)
    return orjson.loads(store.get_bytes(key)) if store.exists(key) else None


def verify_shard(store: Store, manifest: dict[str, Any]) -> list[str]:
    """Problems with a published shard's objects in the store (empty when it is intact)."""
    problems = []
    for obj in manifest.get("objects", []):
        info = store.head(obj["key"])
        if info is None:
            problems.append(f"missing {obj['key']}")
        elif info.size != obj["size"]:
            problems.append(f"{obj['key']}: {info.size} bytes in the store, manifest says {obj['size']}")
        elif info.sha256 and obj.get("sha256") and info.sha256 != obj["sha256"]:
            problems.append(f"{obj['key']}: checksum differs from the manifest")
    return problems


def data_keys(manifest: dict[str, Any]) -> list[str]:
    return [o["key"] for o in manifest.get("objects", []) if not o["key"].endswith(MANIFEST_NAME)]


def iter_parquet_batches(store: Store, keys: list[str], columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream the objects' rows one Parquet row group at a time (memory bounded by a row group)."""
    for key in keys:
        with local_copy(store, key) as path:
            parquet = pq.ParquetFile(path)
            for group in range(parquet.num_row_groups):
                yield from parquet.read_row_group(group, columns=columns).to_batches()
