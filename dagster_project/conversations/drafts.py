"""Snapshot rows → draft conversations, in worker processes beside the stage's ordered decisions.

A row's draft (the multi-turn policy applied, its hash id, the digest of its generation requests, its
conversation under a provisional id) depends on the row alone. What depends on the rows before it (is it a
duplicate, which id it gets) is decided by the stage, in input order, in its own process. So the snapshot's
lines are handed out a batch at a time, raw, to the worker processes (`workers`) that parse and draft them while the
stage decides the batch before: drafting and deciding run on different cores. At most `BATCHES_AHEAD` batches
are in flight, so memory stays bounded by a few batches whatever the row count. A snapshot too small to repay
starting a process is drafted in the stage's own process, with the same results.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from dagster_project.conversations.budget import may_exceed
from dagster_project.conversations.sharding import shard_of
from dagster_project.conversations.shards import is_multi_turn
from dagster_project.conversations.turns import apply_policy, calls_tools, request_key, turn_ends
from dagster_project.ingest.shards import PromptRow, prompt_row
from dagster_project.records import HISTORY_SOURCE, Conversation
from dagster_project.store.jsonl import jsonl_zst_blocks
from dagster_project.workers import WORKERS, cycle_collector_paused, worker_processes

# The snapshot's lines handed out and decided against one batch of lookups in the on-disk dedup index
# (`dedup.SeenIndex.prefetch`) at a time: about 4,000 rows of the usual size.
BATCH_BYTES = 4 << 20
BATCHES_AHEAD = 2 * WORKERS
# A smaller snapshot (compressed bytes) is drafted in-process: starting a worker costs about a second.
PARALLEL_MIN_BYTES = 4 << 20


class Draft(NamedTuple):
    """A snapshot row as a conversation under its provisional id (the source's id, else its hash id), with what
    the stage's decisions about it read, so that the stage never parses it again (unless it is renamed or its
    prompt may exceed the token budget: a handful of rows)."""

    hashed_id: str
    digest: int  # of its generation requests (`turns.request_key`)
    source_id: str | None
    line: bytes  # the conversation's JSON, under its provisional id and that id's shard
    shard: int
    source: str
    source_file: str
    source_row: int
    history: str
    empty_shown: int | None  # the index of an empty source answer a prompt shows (`empty_shown_answer`)
    may_exceed_budget: bool  # its last prompt's byte bound exceeds the token budget (`budget.PromptBudget`)
    calls_tools: bool  # with history `source` (always, when it calls tools: `turns.apply_policy`)
    multi_turn: bool
    turns: int

    @property
    def provisional_id(self) -> str:
        return self.source_id or self.hashed_id

    def conversation(self) -> Conversation:
        return Conversation.from_json(self.line)


def digest64(data: bytes) -> int:
    """A signed 64-bit digest (the content key of `dedup.SeenIndex`; defined here, not there, so that the drafting
    workers never import numpy: that took longer than drafting a batch)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def content_id(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """`h-` + a hash of the normalized row (its tools too, when it has any: they are part of every prompt)."""
    hashed = orjson.dumps(messages if tools is None else [tools, messages])
    return "h-" + hashlib.blake2b(hashed, digest_size=8).hexdigest()


def draft(row: PromptRow, policy: str, num_shards: int, max_prompt_tokens: int) -> tuple:
    """The row's `Draft`, as the plain tuple of its fields in order: what a worker sends (`draft_block`); building
    the NamedTuple from keywords, then a tuple from it to send, took ~1.3 µs of the ~20 a row's drafting takes."""
    messages, generate_after, history = apply_policy(row.messages, policy)
    hashed_id = content_id(row.messages, row.tools)
    conversation = Conversation(
        id=row.source_id or hashed_id,
        messages=messages,
        generate_after=generate_after,
        policy=policy,
        history=history,
        source=row.source,
        source_file=row.source_file,
        source_row=row.source_row,
        extra={
            **row.extra,  # the source's own annotations first: the pipeline's keys win a clash
            "format": row.format,
            "source_id": row.source_id,
            "source_user_turns": _user_turns(row.messages, generate_after, policy),
        },
        tools=row.tools,
    )
    conversation.shard = shard_of(conversation.id, num_shards)
    prompt = messages[: generate_after[-1] + 1]
    return (
        hashed_id,
        digest64(request_key(conversation)),  # digest
        row.source_id,
        # line: the same bytes as conversation.to_json(); orjson serializes the dataclass without asdict's copy.
        orjson.dumps(conversation),
        conversation.shard,
        row.source,
        row.source_file,
        row.source_row,
        history,
        empty_shown_answer(conversation),
        may_exceed(prompt, row.tools, max_prompt_tokens),  # may_exceed_budget
        history == HISTORY_SOURCE and calls_tools(messages),  # calls_tools
        is_multi_turn(conversation),
        len(generate_after),  # turns
    )


def empty_shown_answer(conversation: Conversation) -> int | None:
    """The index of an empty source answer that a prompt of the conversation shows, if any."""
    if conversation.history != HISTORY_SOURCE:
        return None
    for index, message in enumerate(conversation.messages[: conversation.generate_after[-1]]):
        if message["role"] == "assistant" and not message["content"].strip() and not message.get("tool_calls"):
            return index
    return None


def draft_block(block: bytes, policy: str, num_shards: int, max_prompt_tokens: int) -> list[tuple]:
    """The drafts of a block of snapshot lines (run in the worker process), as plain tuples (`draft`): a NamedTuple
    is pickled and unpickled through Python calls, a tuple in C (4x faster, the most of what crossing costs).
    The source names of the block's rows are one object each, which pickle then sends once, not per row."""
    names: dict[str, str] = {}
    drafted = []
    with cycle_collector_paused():
        for line in block.splitlines():
            if line and not line.isspace():  # not line.strip(): that copies every line
                row = prompt_row(orjson.loads(line))
                row.source = names.setdefault(row.source, row.source)
                row.source_file = names.setdefault(row.source_file, row.source_file)
                drafted.append(draft(row, policy, num_shards, max_prompt_tokens))
    return drafted


@contextmanager
def worker_pool(snapshot: Path, *, parallel: bool | None = None) -> Iterator[ProcessPoolExecutor | None]:
    """The worker processes to draft the snapshot in (and publish its shards after: `shards.publish_shards`), or
    None to do it in this process. `parallel`: default, when the snapshot is at least `PARALLEL_MIN_BYTES`."""
    if parallel is None:
        parallel = snapshot.stat().st_size >= PARALLEL_MIN_BYTES
    if not parallel:
        yield None
        return
    with worker_processes() as pool:
        yield pool


def drafted_batches(
    snapshot: Path, policy: str, num_shards: int, max_prompt_tokens: int, *, pool: ProcessPoolExecutor | None
) -> Iterator[list[Draft]]:
    """The drafts of the snapshot's rows, in order, a block of `BATCH_BYTES` at a time, drafted in `pool` (at most
    `BATCHES_AHEAD` blocks ahead of the reader), or in this process when it is None (`worker_pool`)."""
    blocks = jsonl_zst_blocks(snapshot, BATCH_BYTES)
    if pool is None:
        for block in blocks:
            yield list(map(Draft._make, draft_block(block, policy, num_shards, max_prompt_tokens)))
        return
    pending: deque[Future[list[tuple]]] = deque()
    try:
        for block in blocks:
            pending.append(pool.submit(draft_block, block, policy, num_shards, max_prompt_tokens))
            if len(pending) > BATCHES_AHEAD:
                yield list(map(Draft._make, pending.popleft().result()))
        while pending:
            yield list(map(Draft._make, pending.popleft().result()))
    finally:
        for future in pending:  # the stage stopped early: drop what is queued
            future.cancel()


def _user_turns(source: list[dict[str, Any]], generate_after: list[int], policy: str) -> int:
    """How many of the source's turns answer a user (not a tool result); under `all_turns` (the default)
    the source's turn ends are `generate_after` already."""
    ends = generate_after if policy == "all_turns" else turn_ends(source)
    return [source[index]["role"] for index in ends].count("user")  # not sum(generator): this runs for every row
