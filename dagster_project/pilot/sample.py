"""The pilot's sample: a small, stratified, reproducible share of the published conversations.

Every kind of answer the job will generate is in it at least once — each source × turn position (a
conversation's first generated turn, or a later one) × tool use (the conversation declares tools) — so a
gate that would block some stratum of the job blocks the pilot first. Beyond that it is a plain random share.

The choice is a pure function of the conversation ids and a seed (each id's rank is a hash of both), so a
rerun of the pilot over the same conversations asks for the same ones, whichever order the shards are read.
Two reads of the store: one over every shard for the strata (ids and three small fields kept), one over the
shards that hold a chosen conversation.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from dagster_project.conversations.shards import published_num_shards, read_all_conversations, read_conversations
from dagster_project.records import Conversation
from dagster_project.store.storage import Store

FIRST_TURN = "first turn"
LATER_TURN = "later turn"


@dataclass(frozen=True)
class PilotSampleOptions:
    """How large the pilot is (the `pilot` asset's config)."""

    share: float = field(default=0.002, metadata={"help": "Share of the conversations the pilot generates."})
    min_per_stratum: int = field(
        default=1, metadata={"help": "Conversations at least of each source x turn position x tool use."}
    )
    max_conversations: int = field(
        default=2000, metadata={"help": "At most this many conversations (it bounds the pilot's time and cost)."}
    )
    seed: int = field(default=0, metadata={"help": "Another seed draws another sample of the same size."})

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise ValueError(f"the pilot's share must lie in [0, 1], got {self.share}")
        if self.min_per_stratum < 0 or self.max_conversations < 1:
            raise ValueError("the pilot needs min_per_stratum >= 0 and max_conversations >= 1")


@dataclass(frozen=True, order=True)
class Stratum:
    source: str
    turn: str  # FIRST_TURN or LATER_TURN
    tools: bool

    def __str__(self) -> str:
        return f"{self.source or '(no source)'} / {self.turn} / {'tools' if self.tools else 'no tools'}"


@dataclass(frozen=True)
class Candidate:
    """What the sampler needs of one conversation."""

    id: str
    shard: int
    strata: tuple[Stratum, ...]


def strata_of(conversation: Conversation) -> tuple[Stratum, ...]:
    """The strata a conversation's generated turns fall in: its first turn's, and a later turn's if it has one."""
    tools = bool(conversation.tools)
    turns = (FIRST_TURN, LATER_TURN)[: min(conversation.num_turns, 2)]
    return tuple(Stratum(conversation.source, turn, tools) for turn in turns)


def candidate(conversation: Conversation) -> Candidate:
    return Candidate(conversation.id, conversation.shard, strata_of(conversation))


@dataclass(frozen=True)
class SampleChoice:
    """Which conversations the pilot generates, and how they cover the job's strata."""

    ids: tuple[str, ...]  # in rank order
    shards: frozenset[int]  # the shards that hold them
    population: int  # conversations published
    target: int  # the share's count, within its bounds
    strata: dict[str, int]  # conversations chosen per stratum (str(Stratum))
    uncovered: tuple[str, ...]  # strata left under min_per_stratum by max_conversations


def _rank(seed: int, conversation_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}:{conversation_id}".encode(), digest_size=8).digest()


def choose_sample(candidates: Iterable[Candidate], options: PilotSampleOptions = PilotSampleOptions()) -> SampleChoice:
    """First the lowest-ranked conversations of each stratum until it holds `min_per_stratum` (the rarest strata
    first, since a conversation chosen for one may cover another), then the lowest-ranked of the rest up to the
    share; never more than `max_conversations`."""
    ranked = sorted(candidates, key=lambda c: _rank(options.seed, c.id))
    by_stratum: dict[Stratum, list[Candidate]] = defaultdict(list)
    for c in ranked:
        for stratum in c.strata:
            by_stratum[stratum].append(c)
    target = min(max(math.ceil(options.share * len(ranked)), 1 if ranked else 0), options.max_conversations)
    chosen: dict[str, Candidate] = {}
    covered: dict[Stratum, int] = defaultdict(int)

    def take(c: Candidate) -> None:
        chosen[c.id] = c
        for stratum in c.strata:
            covered[stratum] += 1

    for stratum in sorted(by_stratum, key=lambda s: (len(by_stratum[s]), s)):
        for c in by_stratum[stratum]:
            if covered[stratum] >= options.min_per_stratum or len(chosen) >= options.max_conversations:
                break
            if c.id not in chosen:
                take(c)
    for c in ranked:
        if len(chosen) >= max(target, 0) or len(chosen) >= options.max_conversations:
            break
        if c.id not in chosen:
            take(c)
    uncovered = tuple(
        str(s) for s in sorted(by_stratum) if covered[s] < min(options.min_per_stratum, len(by_stratum[s]))
    )
    order = {c.id: i for i, c in enumerate(ranked)}
    return SampleChoice(
        ids=tuple(sorted(chosen, key=order.__getitem__)),
        shards=frozenset(c.shard for c in chosen.values()),
        population=len(ranked),
        target=target,
        strata={str(s): covered[s] for s in sorted(by_stratum)},
        uncovered=uncovered,
    )


def sample_conversations(
    store: Store, options: PilotSampleOptions = PilotSampleOptions()
) -> tuple[list[Conversation], SampleChoice]:
    """The pilot's conversations from the published ones, in rank order, and the choice that picked them."""
    num_shards = published_num_shards(store)
    if num_shards is None:
        raise LookupError("conversations are not published: materialize raw_prompts and conversations first")
    candidates = [
        candidate(conversation)
        for contents in read_all_conversations(store, num_shards)
        for conversation in contents.conversations
    ]
    choice = choose_sample(candidates, options)
    wanted = set(choice.ids)
    found = {
        conversation.id: conversation
        for shard in sorted(choice.shards)
        for conversation in read_conversations(store, shard)
        if conversation.id in wanted
    }
    return [found[conversation_id] for conversation_id in choice.ids], choice
