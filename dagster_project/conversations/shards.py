"""Writing the conversations of many shards to local disk, publishing them, and the manifests that describe them.

Rows arrive in input order, each for some shard. `ShardBuffers` keeps a bounded amount in memory and
appends it to one local file per shard, opening one file at a time, so 1,830 shards never hit the
open-file limit and memory does not grow with the dataset. `publish_shards` then uploads each shard's file
(a local store takes it by rename) and its manifest (`ConversationsShardManifest`), the shards of one
object-index block together (one index update per block) and several blocks at a time; the stage's own
manifest (`ConversationsManifest`) comes last. `shard_contents` and `scan_shards` read them back for the
checks, several shards at a time on S3.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import orjson

from dagster_project.conversations.sharding import shard_of
from dagster_project.ingest.quarantine import DUPLICATE
from dagster_project.records import Conversation
from dagster_project.store import layout, object_index
from dagster_project.store.manifest import (
    ShardManifest,
    StageManifest,
    StoredObject,
    ids_digest,
    publish_shards_together,
    read_shard_manifest,
    read_stage_manifest,
    verified_bytes,
)
from dagster_project.store.storage import CorruptObject, LocalStore, Store
from dagster_project.store.transfer import map_in_order
from dagster_project.store.verdicts import record_verdicts
from dagster_project.tokenizer import TokenizerIdentity

SHARD_FILE = "conversations.jsonl"
BUFFERED_BYTES = 64 << 20  # 64 MiB: each flush opens every shard file; fewer flushes, fewer opens
# Index blocks published side by side, each publishing its shards several at a time (`publish_shards_together`).
PUBLISH_WORKERS = 2


def is_multi_turn(conversation: Conversation) -> bool:
    """Whether the source conversation answered more than one user turn (what the manifests count as multi-turn)."""
    return conversation.extra.get("source_user_turns", 1) > 1


@dataclass
class PolicyCounts:
    """Conversations under one multi-turn policy, the multi-turn ones among them, and the turns to generate."""

    conversations: int = 0
    multi_turn: int = 0
    turns: int = 0

    def add(self, conversation: Conversation) -> None:
        self.count(is_multi_turn(conversation), conversation.num_turns)

    def count(self, multi_turn: bool, turns: int) -> None:
        self.conversations += 1
        self.multi_turn += multi_turn
        self.turns += turns


@dataclass(frozen=True)
class SourceTotals:
    """One source over both stages: input_rows = conversations + quarantined (exact duplicates included)."""

    input_rows: int
    conversations: int
    quarantined: int
    # Both stages' reasons, so a source whose rows are set aside (images, tool errors) is visible as such.
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0


@dataclass(frozen=True, kw_only=True)
class ConversationsShardManifest(ShardManifest):
    """One shard of one build (`build_id`; a shard of another build is stale): rows, multi-turn ones, turns."""

    stage: str = layout.CONVERSATIONS
    num_shards: int
    policy: str
    build_id: str
    multi_turn: int = 0
    turns: int = 0
    tokenizer: TokenizerIdentity = field(default_factory=TokenizerIdentity)  # what the budget measured prompts with


class ConversationsChanged(RuntimeError):
    """A shard was made from conversations that were edited since (rebuilt with other content): it is not trained
    on or exported unless the operator accepts it."""


def stale_conversations_fix(shard: int) -> str:
    """What to do about a shard made from conversations edited since: regenerate it, or accept it."""
    return (
        f"regenerate it: `{layout.regenerate_command(layout.COMPLETIONS, shard)}`; or, having looked, set "
        "accept_stale_conversations: true in training_set's config to train on it as it is"
    )


@dataclass(frozen=True)
class ConversationsUsed:
    """The conversations shard a completions or training shard was made from, as it was published then: its ids
    and its content (the checksums of its objects). An empty digest was not recorded (a shard made before it was)
    and is not compared."""

    ids_digest: str = ""
    content_digest: str = ""

    @classmethod
    def of(cls, manifest: ConversationsShardManifest) -> ConversationsUsed:
        checksums = [stored.sha256 for stored in manifest.data_objects]
        known = bool(checksums) and all(checksums)
        content = hashlib.sha256("\n".join(checksums).encode()).hexdigest() if known else ""  # type: ignore[arg-type]
        return cls(manifest.ids_digest, content)

    def changed_in(self, current: ConversationsShardManifest) -> bool:
        """Whether the conversations published now are other than these (other ids, or the same ids with other
        content: prompts edited after the shard was made). A rebuild of the same input publishes the same bytes."""
        now = ConversationsUsed.of(current)
        pairs = ((self.ids_digest, now.ids_digest), (self.content_digest, now.content_digest))
        return any(then and later and then != later for then, later in pairs)

    def refuse_if_changed(self, current: ConversationsShardManifest | None, what: str, fix: str) -> None:
        """`ConversationsChanged`, one line naming `what` was made from them and `fix`, when they changed."""
        if current is not None and self.changed_in(current):
            raise ConversationsChanged(
                f"{what} was made from conversations shard {current.shard} as it was before its conversations were "
                f"edited (rebuilt with other content since): {fix}"
            )


@dataclass(frozen=True, kw_only=True)
class ConversationsManifest(StageManifest):
    """The stage as a whole, with the accounting of both stages: input_rows = rows + quarantined."""

    stage: str = layout.CONVERSATIONS
    num_shards: int
    policy: str
    build_id: str
    input_rows: int
    rows: int
    normalized: int
    # Every row set aside by either stage, exact duplicates (the first copy kept) among them; `quarantine_rate`:
    # the share of input rows set aside for any other reason, the bad rows; duplicates have their own rate and limit.
    quarantined: int
    quarantine_rate: float
    duplicates: int = 0
    duplicate_rate: float = 0.0
    duplicate_rate_max: float = 1.0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    quarantined_by_stage: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, SourceTotals] = field(default_factory=dict)
    history: str
    multi_turn: int
    turns: int
    by_policy: dict[str, PolicyCounts] = field(default_factory=dict)
    # Conversations that call tools (always history `source`), and rows kept under their hash id because
    # their own id was taken by an earlier row (`extra.renamed_from` holds the source's id).
    tool_calling: int = 0
    renamed_ids: int = 0
    ids_digest: str
    quarantine_rate_max: float
    max_prompt_tokens: int
    tokenizer: TokenizerIdentity = field(default_factory=TokenizerIdentity)
    prompts_tokenized: int = 0
    enable_thinking: bool = True
    preserve_thinking: bool = False
    stale_shards_removed: int = 0
    # Shards made from conversations of another shard count, withdrawn by this build (`supersede_shards`).
    superseded: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    quarantine_object: StoredObject | None = None


def quarantine_verdict(manifest: ConversationsManifest) -> tuple[bool, str]:
    """The quarantine-rate gate: (passed, what it found). Bad rows (every reason but exact duplicates) against
    `quarantine_rate_max`, exact duplicates on their own against `duplicate_rate_max`, and every input row accounted
    for."""
    rate, limit = manifest.quarantine_rate, manifest.quarantine_rate_max
    accounted = manifest.input_rows == manifest.rows + manifest.quarantined
    bad_reasons = Counter({r: n for r, n in manifest.quarantined_by_reason.items() if r != DUPLICATE})
    top = ", ".join(f"{reason} {count}" for reason, count in bad_reasons.most_common(5))
    per_source = ", ".join(f"{name} {t.duplicates}" for name, t in manifest.by_source.items() if t.duplicates)
    description = (
        f"{manifest.quarantined - manifest.duplicates} of {manifest.input_rows} rows quarantined ({rate:.2%}, limit "
        f"{limit:.2%}, config key quarantine_rate_max of conversations); most: {top or 'none'}. "
        f"{manifest.duplicates} exact duplicates set aside, the first copy kept ({manifest.duplicate_rate:.2%}, limit "
        f"{manifest.duplicate_rate_max:.2%}, config key duplicate_rate_max)" + (f": {per_source}" if per_source else "")
    )
    if not accounted:
        description += "; input rows != conversations + quarantined"
    passed = accounted and rate <= limit and manifest.duplicate_rate <= manifest.duplicate_rate_max
    return passed, description


def read_conversations_manifest(store: Store) -> ConversationsManifest | None:
    return read_stage_manifest(store, layout.CONVERSATIONS, ConversationsManifest)


def read_shard_conversations_manifest(store: Store, shard: int) -> ConversationsShardManifest | None:
    return read_shard_manifest(store, layout.CONVERSATIONS, shard, ConversationsShardManifest)


def published_num_shards(store: Store) -> int | None:
    """How many shards the published conversations have (None before `conversations` is materialized).

    Every stage after `conversations`, and `dflash status`, takes the shard count from here: the environment
    decides it only when the conversations are built.
    """
    manifest = read_conversations_manifest(store)
    return manifest.num_shards if manifest is not None else None


class ShardBuffers:
    """Each shard's conversations on local disk, and what its manifest counts (kept as they are written, so
    publishing never parses a conversation again): its counts in memory, its ids in a file per object-index block
    (`object_index.BLOCK_SHARDS` shards: the shards published together; one file to create and remove per block,
    not per shard, on a file system where creating a file costs more than writing it)."""

    def __init__(self, directory: Path, num_shards: int, max_buffered_bytes: int = BUFFERED_BYTES):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.num_shards = num_shards
        self.max_buffered_bytes = max_buffered_bytes
        self.counts = [PolicyCounts() for _ in range(num_shards)]
        self._buffers: list[list[bytes]] = [[] for _ in range(num_shards)]
        self._ids: list[list[str]] = [[] for _ in range(num_shards)]
        self._buffered = 0
        # Each flush appends to most of the files: their names are made once, not per flush.
        self._paths = [str(self.path(shard)) for shard in range(num_shards)]
        blocks = object_index.shards_by_block(range(num_shards))
        self._ids_paths = [str(self.ids_path(block[0] // object_index.BLOCK_SHARDS)) for block in blocks]
        # Every shard exists, even an empty one. The files are created in a thread while the first rows are decided,
        # not before: on a disk still writing back the snapshot, creating 1,830 files can wait half a second on
        # its journal, which would hold up the stage's start.
        creating = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-files")
        self._created: Future[None] | None = creating.submit(_create_files, (*self._paths, *self._ids_paths))
        creating.shutdown(wait=False)  # the thread ends when they are made

    def path(self, shard: int) -> Path:
        return self.directory / f"shard={shard:0{layout.SHARD_DIGITS}d}.jsonl"

    def ids_path(self, block: int) -> Path:
        return self.directory / f"block={block:05d}.ids"

    def write(self, conversation: Conversation, line: bytes) -> None:
        """Append `line` (the conversation's JSON) to the conversation's shard."""
        self.append(conversation.shard, conversation.id, line, is_multi_turn(conversation), conversation.num_turns)

    def append(self, shard: int, row_id: str, line: bytes, multi_turn: bool, turns: int) -> None:
        """Append `line`, the JSON of conversation `row_id`, to `shard`."""
        self._buffers[shard].append(line)
        self._ids[shard].append(row_id)
        self.counts[shard].count(multi_turn, turns)
        self._buffered += len(line) + len(row_id) + 2
        if self._buffered >= self.max_buffered_bytes:
            self.flush()

    def flush(self) -> None:
        if self._created is not None:
            self._created.result()  # raises what creating them raised
            self._created = None  # (and sending the buffers to the publishing workers does not pickle a Future)
        ids_by_block: dict[int, list[tuple[int, list[str]]]] = {}
        for shard, (path, lines, ids) in enumerate(zip(self._paths, self._buffers, self._ids, strict=True)):
            if lines:
                lines.append(b"")
                _append(path, b"\n".join(lines))
                lines.clear()
                ids_by_block.setdefault(shard // object_index.BLOCK_SHARDS, []).append((shard, ids))
                self._ids[shard] = []
        for block, ids in ids_by_block.items():  # an id may hold any text: JSON, one line per flush
            _append(self._ids_paths[block], orjson.dumps(ids, option=orjson.OPT_APPEND_NEWLINE))
        self._buffered = 0

    def block_ids(self, block: int) -> dict[int, list[str]]:
        """The ids written to each shard of object-index block `block` (after `flush`)."""
        ids: dict[int, list[str]] = {}
        with open(self._ids_paths[block], "rb") as handle:
            for line in handle:
                for shard, written in orjson.loads(line):
                    ids.setdefault(shard, []).extend(written)
        return ids


def _create_files(paths: Iterable[str]) -> None:
    for path in paths:
        _append(path, b"")


def _append(path: str, data: bytes) -> None:
    # os-level: a buffered file object per write costs more than the write, and a flush makes thousands.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def conversations_in(store: Store, manifest: ShardManifest) -> Iterator[Conversation]:
    """The conversations of the shard that `manifest` describes."""
    for obj in manifest.data_objects:
        key = obj.key
        for number, line in enumerate(verified_bytes(store, manifest, obj).splitlines(), 1):
            if line.strip():
                try:
                    conversation = Conversation.from_json(line)
                except (ValueError, TypeError, KeyError) as exc:
                    raise CorruptObject(
                        f"{store.url(key)} is damaged: line {number} is not a conversation ({exc}); "
                        "re-materialize conversations"
                    ) from exc
                yield conversation


def read_conversations(store: Store, shard: int) -> Iterator[Conversation]:
    """The conversations of a published shard (one shard in memory at most)."""
    manifest = read_shard_conversations_manifest(store, shard)
    if manifest is None:
        raise _not_published(store, shard)
    yield from conversations_in(store, manifest)


def _not_published(store: Store, shard: int) -> LookupError:
    missing = store.url(layout.shard_manifest_key(layout.CONVERSATIONS, shard))
    return LookupError(
        f"conversations shard {shard} is not published (no {missing}); materialize the conversations asset first"
    )


@dataclass(frozen=True)
class ShardContents:
    shard: int
    manifest: ConversationsShardManifest | None  # None: the shard is not published
    conversations: list[Conversation]


def shard_contents(store: Store, num_shards: int) -> Iterator[ShardContents]:
    """Shards 0..num_shards-1 in order, each with its manifest and conversations as the store holds them (checked
    against the manifest's checksums, `conversations_in`). On S3 several shards are read at once, a bounded number
    ahead of the reader (`map_in_order`): 1,830 shards cost their 3,660 GETs side by side, not in turn (not a
    listing either: with the checks' verdicts beside them, listing the shards takes longer than reading them)."""

    def read(shard: int) -> ShardContents:
        manifest = read_shard_conversations_manifest(store, shard)
        return ShardContents(shard, manifest, list(conversations_in(store, manifest)) if manifest else [])

    yield from map_in_order(store, read, range(num_shards))


def read_all_conversations(store: Store, num_shards: int) -> Iterator[ShardContents]:
    """`shard_contents` of every shard, all published: a shard that is not raises LookupError."""
    for contents in shard_contents(store, num_shards):
        if contents.manifest is None:
            raise _not_published(store, contents.shard)
        yield contents


def publish_shards(
    store: Store,
    buffers: ShardBuffers,
    *,
    policy: str,
    build_id: str,
    tokenizer: TokenizerIdentity,
    pool: Executor | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> list[ConversationsShardManifest]:
    """Publish every shard (data, then manifest); return the manifests in shard order.

    The shards of one object-index block are published together (`publish_shards_together`), the blocks
    side by side (no two workers update one index block): on a local store in `pool`'s processes when one is
    given (the work is on this machine's CPU), else in threads (on S3 they wait on requests)."""
    blocks = object_index.shards_by_block(range(buffers.num_shards))
    publish = partial(_publish_block, store, buffers, policy=policy, build_id=build_id, tokenizer=tokenizer)
    manifests: list[ConversationsShardManifest] = []
    with ExitStack() as stack:
        if pool is None or not isinstance(store, LocalStore):
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=PUBLISH_WORKERS))
        for published in pool.map(publish, blocks):
            manifests.extend(published)
            log(f"published {len(manifests)}/{buffers.num_shards} shards")
    return sorted(manifests, key=lambda manifest: manifest.shard)


def _publish_block(
    store: Store,
    buffers: ShardBuffers,
    shards: list[int],
    *,
    policy: str,
    build_id: str,
    tokenizer: TokenizerIdentity,
) -> list[ConversationsShardManifest]:
    """Publish `shards`, the shards of one object-index block (in a worker process or thread)."""
    block = shards[0] // object_index.BLOCK_SHARDS
    ids = buffers.block_ids(block)
    together = []
    for shard in shards:
        counts = buffers.counts[shard]
        manifest = ConversationsShardManifest(
            shard=shard,
            rows=counts.conversations,
            ids_digest=ids_digest(ids.get(shard, [])),
            num_shards=buffers.num_shards,
            policy=policy,
            build_id=build_id,
            multi_turn=counts.multi_turn,
            turns=counts.turns,
            tokenizer=tokenizer,
        )
        together.append((manifest, [(SHARD_FILE, buffers.path(shard))]))
    published = publish_shards_together(store, together, consume_files=True)  # the files move, not copied
    buffers.ids_path(block).unlink()
    return published


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
    object_index.forget(store, [key for key in stale if key.endswith(layout.MANIFEST_NAME)])
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
    by_policy: dict[str, PolicyCounts] = field(default_factory=dict)
    manifests: list[ConversationsShardManifest] = field(default_factory=list)  # of the shards read


def scan_shards(store: Store, stage_manifest: ConversationsManifest, examples: int = 20) -> ShardScan:
    """Read every shard once (a bounded number in memory, `shard_contents`) and check ids, placement and manifests."""
    scan = ShardScan()
    num_shards = stage_manifest.num_shards
    for contents in shard_contents(store, num_shards):
        shard, manifest, conversations = contents.shard, contents.manifest, contents.conversations
        if manifest is None:
            scan.missing_shards.append(shard)
            continue
        scan.manifests.append(manifest)
        if manifest.build_id != stage_manifest.build_id:
            scan.other_build_shards.append(shard)
        if ids_digest(c.id for c in conversations) != manifest.ids_digest:
            scan.digest_mismatches.append(shard)
        seen: set[str] = set()
        for conversation in conversations:
            scan.rows += 1
            if conversation.id in seen and len(scan.duplicate_ids) < examples:
                scan.duplicate_ids.append(conversation.id)
            seen.add(conversation.id)
            if shard_of(conversation.id, num_shards) != shard and len(scan.misplaced_ids) < examples:
                scan.misplaced_ids.append(conversation.id)
            scan.by_policy.setdefault(conversation.policy, PolicyCounts()).add(conversation)
    return scan


def record_stage_verdict(
    store: Store,
    stage_manifest: ConversationsManifest,
    check: str,
    failures: dict[str, str],
    manifests: Iterable[ConversationsShardManifest | None] | None = None,
) -> int:
    """Record a check on the whole stage as its verdict on every shard of this build, so that completions refuses
    a shard of gated conversations in any later run (`store.verdicts`). `manifests`: those of the shards the check
    read (read here when not given). Returns the shards judged."""
    if manifests is None:
        shards = range(stage_manifest.num_shards)
        manifests = map_in_order(store, partial(read_shard_conversations_manifest, store), shards)
    judged = [m for m in manifests if m is not None and m.build_id == stage_manifest.build_id]
    return len(record_verdicts(store, judged, check, failures))
