"""Stable assignment of conversations to shards: a hash of the id, never the file order."""

from __future__ import annotations

import hashlib


def shard_of(conversation_id: str, num_shards: int) -> int:
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    digest = hashlib.blake2b(conversation_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards
