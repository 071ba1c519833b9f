"""Writing the conversations of many shards to local disk, then publishing them (DESIGN §3, §4).

Rows arrive in input order, each for some shard. `ShardBuffers` keeps a bounded amount in memory and
appends it to one local file per shard, opening one file at a time, so 1,830 shards never hit the
open-file limit and memory does not grow with the dataset. `publish_shards` then uploads each shard's
file and its manifest, several shards at a time. `scan_shards` reads them back for the checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster_project.conversations.sharding import shard_of
from dagster_project.records import Conversation
from dagster_project.store import layout
from dagster_project.store.manifest import data_keys, ids_digest, publish_shard, read_shard_manifest
from dagster_project.store.storage import Store

SHARD_FILE = "conversations.jsonl"
BUFFERED_BYTES = 32 << 20
PUBLISH_WORKERS = 8


class ShardBuffers:
    def __init__(self, directory: Path, num_shards: int, max_buffered_bytes: int = BUFFERED_BYTES):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.num_shards = num_shards
        self.max_buffered_bytes = max_buffered_bytes
        self._buffers: list[list[bytes]] = [[] for _ in range(num_shards)]
        self._buffered = 0
        for shard in range(num_shards):
            self.path(shard).write_bytes(b"")  # every shard exists, even an empty one

    def path(self, shard: int) -> Path:
        return self.directory / f"shard={shard:0{layout.SHARD_DIGITS}d}.jsonl"

    def write(self, shard: int, line: bytes) -> None:
        self._buffers[shard].append(line)
        self._buffered += len(line) + 1
        if self._buffered >= self.max_buffered_bytes:
            self.flush()

    def flush(self) -> None:
        for shard, lines in enumerate(self._buffers):
            if lines:
                with open(self.path(shard), "ab") as handle:
                    handle.write(b"\n".join(lines) + b"\n")
                lines.clear()
        self._buffered = 0


def shard_stats(conversations: Iterable[Conversation]) -> dict[str, Any]:
    """Rows, ids digest, multi-turn conversations and generated turns of one shard."""
    ids, multi_turn, turns = [], 0, 0
    for conversation in conversations:
        ids.append(conversation.id)
        multi_turn += conversation.extra.get("source_user_turns", 1) > 1
        turns += conversation.num_turns
    return {"rows": len(ids), "ids_digest": ids_digest(ids), "multi_turn": multi_turn, "turns": turns}


def conversations_in(store: Store, manifest: dict[str, Any]) -> Iterator[Conversation]:
    """The conversations of the shard that `manifest` describes."""
    for key in data_keys(manifest):
        for line in store.get_bytes(key).splitlines():
            if line.strip():
                yield Conversation.from_json(line)


def read_conversations(store: Store, shard: int) -> Iterator[Conversation]:
    """The conversations of a published shard (one shard in memory at most)."""
    manifest = read_shard_manifest(store, layout.CONVERSATIONS, shard)
    if manifest is None:
        raise LookupError(
            f"conversations shard {shard} is not published (no {store.url(layout.shard_manifest_key(layout.CONVERSATIONS, shard))}); "
            "materialize the conversations asset first"
        )
    yield from conversations_in(store, manifest)


def read_local_shard(path: Path) -> Iterable[Conversation]:
    with open(path, "rb") as handle:
        for line in handle:
            yield Conversation.from_json(line)


def publish_shards(
    store: Store, buffers: ShardBuffers, fields: dict[str, Any], log: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Publish every shard (data, then manifest); return the manifests in shard order."""

    def publish(shard: int) -> dict[str, Any]:
        path = buffers.path(shard)
        stats = shard_stats(read_local_shard(path))
        manifest = publish_shard(store, layout.CONVERSATIONS, shard, [(SHARD_FILE, path)], {**fields, **stats})
        path.unlink()
        return manifest

    with ThreadPoolExecutor(max_workers=PUBLISH_WORKERS) as pool:
        manifests = []
        for manifest in pool.map(publish, range(buffers.num_shards)):
            manifests.append(manifest)
            if len(manifests) % 200 == 0:
                log(f"published {len(manifests)}/{buffers.num_shards} shards")
    return manifests


def remove_stale_shards(store: Store, num_shards: int) -> int:
    """Delete shards numbered num_shards and above, left by an earlier run with more shards."""
    stale = []
    for info in store.list(f"{layout.CONVERSATIONS}/shard="):
        number = info.key.split("shard=", 1)[1].split("/", 1)[0]
        if number.isdigit() and int(number) >= num_shards:
            stale.append(info.key)
    # Manifests first: a shard without a manifest does not exist for readers.
    for key in sorted(stale, key=lambda k: not k.endswith(layout.MANIFEST_NAME)):
        store.delete(key)
    return len(stale)


@dataclass
class ShardScan:
    """What the published shards really hold, compared with their manifests."""

    rows: int = 0
    missing_shards: list[int] = field(default_factory=list)
    other_build_shards: list[int] = field(default_factory=list)
    digest_mismatches: list[int] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    misplaced_ids: list[str] = field(default_factory=list)
    by_policy: dict[str, Counter] = field(default_factory=dict)


def scan_shards(store: Store, stage_manifest: dict[str, Any], examples: int = 20) -> ShardScan:
    """Read every shard once (one in memory at a time) and check ids, placement and manifests."""
    scan = ShardScan()
    num_shards = stage_manifest["num_shards"]
    for shard in range(num_shards):
        manifest = read_shard_manifest(store, layout.CONVERSATIONS, shard)
        if manifest is None:
            scan.missing_shards.append(shard)
            continue
        if manifest.get("build_id") != stage_manifest.get("build_id"):
            scan.other_build_shards.append(shard)
        conversations = list(conversations_in(store, manifest))
        if shard_stats(conversations)["ids_digest"] != manifest.get("ids_digest"):
            scan.digest_mismatches.append(shard)
        seen: set[str] = set()
        for conversation in conversations:
            scan.rows += 1
            if conversation.id in seen and len(scan.duplicate_ids) < examples:
                scan.duplicate_ids.append(conversation.id)
            seen.add(conversation.id)
            if shard_of(conversation.id, num_shards) != shard and len(scan.misplaced_ids) < examples:
                scan.misplaced_ids.append(conversation.id)
            counts = scan.by_policy.setdefault(conversation.policy, Counter())
            counts["conversations"] += 1
            counts["multi_turn"] += conversation.extra.get("source_user_turns", 1) > 1
            counts["turns"] += conversation.num_turns
    return scan
