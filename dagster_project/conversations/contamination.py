"""Evaluation-set contamination: which prompts share an n-gram with the sets drafter acceptance is measured on.

Acceptance is reported on MT-Bench, HumanEval, GSM8K and the like; a training set holding their prompts
overstates it. Every user message of every conversation is compared with every text of the configured
evaluation files (`ContaminationOptions.eval_files`: JSON Lines, optionally gzipped, a JSON list, or plain
text with one prompt per line; a record's text is its `turns` (each turn), or its first field among
`prompt`, `question`, `instruction`, `text`, `input`).

**Normalization.** Both sides are NFKC-normalized, lower-cased, and split into words at every run of
characters that are neither letters nor digits, so rewording in whitespace, case or punctuation alone
still matches. A message matches when it shares one run of `ngram` consecutive words (default 8) with an
evaluation text; an evaluation text shorter than that (MT-Bench's "What about …?" follow-ups) matches a
message made of exactly its words.

**Speed.** Whole batches of messages are split into words at once — ASCII messages by a byte table in
numpy, the others by Arrow's Unicode kernels — each word is mapped to its index in the evaluation
vocabulary (a word no evaluation text has can be in no shared n-gram), and every window's 64-bit
polynomial hash goes through a bitmap of hash suffixes, then the sorted evaluation hashes — no Python loop
per word. `benchmarks/bench_contamination.py` measures it against the
plain Python scan (`python_scan`: a dict of word tuples) on 1M prompts.

What happens to a match is `action`: `quarantine` (the default: the training set excludes the
conversation's rows as `eval_contamination`) or `report` (listed only).
"""

from __future__ import annotations

import glob
import gzip
import re
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dagster_project.conversations.shards import (
    read_conversations_manifest,
    read_shard_conversations_manifest,
    shard_contents,
)
from dagster_project.records import EVAL_CONTAMINATION as EVAL_CONTAMINATION  # its reason, named where all read it
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.storage import Store

QUARANTINE = "quarantine"
REPORT = "report"
ACTIONS = (QUARANTINE, REPORT)
DEFAULT_NGRAM = 8
TEXT_FIELDS = ("prompt", "question", "instruction", "text", "input")
NO_MATCH = -1

_SEPARATORS = r"[^\p{L}\p{N}]+"  # RE2 (Arrow): anything but letters and digits
_PY_SEPARATORS = re.compile(r"[\W_]+")  # the same in Python's `re`, for the baseline
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class ContaminationOptions:
    eval_files: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Evaluation-set files (paths or globs): JSON Lines (.gz too), a JSON list, or one prompt per "
            "line; none configured: nothing is checked."
        },
    )
    ngram: int = field(
        default=DEFAULT_NGRAM, metadata={"help": "Words in a shared run that make a prompt contaminated."}
    )
    action: str = field(
        default=QUARANTINE,
        metadata={
            "help": "'quarantine': the training set excludes matched conversations as eval_contamination; "
            "'report': they are only listed."
        },
    )

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        if self.ngram < 2:
            raise ValueError(f"ngram must be at least 2 words, got {self.ngram}")


@dataclass(frozen=True)
class EvalText:
    eval_set: str  # the file, as `<folder>/<name>`
    item: str  # the record's id field, or its line number
    text: str


def expand_files(patterns: Sequence[str]) -> list[Path]:
    """The files the patterns name, each once; a pattern that names nothing is an error, not a silent skip."""
    files: list[Path] = []
    for pattern in patterns:
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not found or not all(Path(path).is_file() for path in found):
            raise FileNotFoundError(f"evaluation set {pattern!r} names no readable file")
        files += [Path(path) for path in found if Path(path) not in files]
    return files


def _records(path: Path) -> Iterator[tuple[str, object]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        raw = handle.read()
    name = path.name.removesuffix(".gz")
    if name.endswith(".json"):
        yield from ((str(i), record) for i, record in enumerate(orjson.loads(raw)))
    elif name.endswith(".jsonl"):
        yield from ((str(i), orjson.loads(line)) for i, line in enumerate(raw.splitlines()) if line.strip())
    else:
        yield from ((str(i), line) for i, line in enumerate(raw.decode().splitlines()) if line.strip())


def _texts_of(record: object) -> list[str]:
    if isinstance(record, str):
        return [record]
    if not isinstance(record, dict):
        return []
    if isinstance(record.get("turns"), list):
        return [turn for turn in record["turns"] if isinstance(turn, str)]
    return next(([record[key]] for key in TEXT_FIELDS if isinstance(record.get(key), str)), [])


def load_eval_texts(patterns: Sequence[str]) -> list[EvalText]:
    texts = []
    for path in expand_files(patterns):
        eval_set = f"{path.parent.name}/{path.name}"
        for line, record in _records(path):
            item = next(
                (str(record[k]) for k in ("question_id", "task_id", "id") if isinstance(record, dict) and k in record),
                line,
            )
            texts.extend(EvalText(eval_set, item, text) for text in _texts_of(record))
    if patterns and not texts:
        raise ValueError(f"the evaluation sets {list(patterns)} hold no prompt text")
    return texts


def normalized_words(texts: pa.Array | Sequence[str]) -> pa.ListArray:
    """Each text as its list of words: NFKC, lower case, split at anything that is neither letter nor digit."""
    texts = pa.array(texts, pa.string()) if not isinstance(texts, pa.Array) else texts
    spaced = pc.replace_substring_regex(pc.utf8_lower(pc.utf8_normalize(texts, "NFKC")), _SEPARATORS, " ")
    split = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(spaced))
    # A blank text splits into one empty string, which is no word.
    flat, lengths = pc.list_flatten(split), pc.list_value_length(split).to_numpy(zero_copy_only=False)
    nonempty = pc.greater(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
    kept = np.bincount(np.repeat(np.arange(lengths.size), lengths)[nonempty], minlength=lengths.size)
    offsets = pa.array(np.concatenate([[0], np.cumsum(kept)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, flat.filter(pa.array(nonempty)))


def python_words(text: str) -> list[str]:
    """`normalized_words` of one text in plain Python (the baseline's, and the reference in tests)."""
    return _PY_SEPARATORS.sub(" ", unicodedata.normalize("NFKC", text).lower()).split()


def ascii_words(texts: pa.StringArray) -> tuple[pa.StringArray, np.ndarray]:
    """`normalized_words` of ASCII-only texts, as (every word in order, words per text), in numpy over the bytes
    (ASCII needs neither NFKC nor Unicode classes, and the general path's regular expression is most of its
    cost): letters are lower-cased, and words are the runs of letters and digits inside one text."""
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, np.uint8)[offsets[0] : offsets[-1]] if data_buffer else np.zeros(0, np.uint8)
    offsets -= offsets[0]
    lowered = data | np.uint8(32)  # ASCII letters differ from their lower case in bit 5 alone
    upper = (data - np.uint8(ord("A"))) < 26
    in_word = ((lowered - np.uint8(ord("a"))) < 26) | ((data - np.uint8(ord("0"))) < 10)
    text_starts = offsets[:-1][offsets[:-1] < data.size]
    text_ends = offsets[1:][offsets[1:] > 0] - 1
    before = np.concatenate([[False], in_word[:-1]])
    before[text_starts] = False  # a word never runs on from the previous text, nor into the next
    after = np.concatenate([in_word[1:], [False]])
    after[text_ends] = False
    word_starts = np.flatnonzero(in_word & ~before)
    word_lengths = np.flatnonzero(in_word & ~after) - word_starts + 1
    words_per_text = np.diff(np.searchsorted(word_starts, offsets))
    letters = np.where(upper, lowered, data).take(np.flatnonzero(in_word))
    word_offsets = np.concatenate([[0], np.cumsum(word_lengths)]).astype(np.int32)
    words = pa.StringArray.from_buffers(
        int(word_starts.size), pa.py_buffer(word_offsets.tobytes()), pa.py_buffer(letters.tobytes())
    )
    return words, words_per_text


def _window_hashes(ids: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hash of every n-word window inside one text, and the text it belongs to. A window holding a word outside
    the evaluation vocabulary (id -1) is left out: it cannot be shared."""
    total = ids.size - n + 1
    if total <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    unknown_before = np.concatenate([[0], np.cumsum(ids < 0)])
    text = np.repeat(np.arange(lengths.size), lengths)[:total]
    text_end = np.cumsum(lengths)
    keep = (unknown_before[n:] == unknown_before[:-n]) & (np.arange(total) + n <= text_end[text])
    codes = (ids + 1).astype(np.uint64)
    hashes = np.zeros(total, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            hashes = hashes * _MULTIPLIER + codes[k : k + total]
    return hashes[keep], text[keep]


def _whole_hashes(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Hash of each text's whole word sequence (the same hash as a window of its length); 0 where it holds an
    unknown word or no word."""
    result = np.zeros(lengths.size, np.uint64)
    nonempty = np.flatnonzero(lengths > 0)
    if not nonempty.size:
        return result
    starts = np.concatenate([[0], np.cumsum(lengths)])
    position_from_end = np.repeat(starts[1:], lengths) - 1 - np.arange(ids.size)
    powers = np.ones(int(lengths.max()), np.uint64)
    with np.errstate(over="ignore"):
        powers[1:] = np.cumprod(np.full(powers.size - 1, _MULTIPLIER, np.uint64))
        terms = (ids + 1).astype(np.uint64) * powers[position_from_end]
        sums = np.add.reduceat(terms, starts[nonempty])
    bad = np.add.reduceat((ids < 0).astype(np.int64), starts[nonempty]) > 0
    result[nonempty] = np.where(bad, 0, sums)
    return result


_FILTER_BITS = 24  # a 16 MiB bitmap of hash suffixes turns away nearly every window before the sorted lookup


class EvalIndex:
    """The evaluation texts' vocabulary and n-gram hashes, built once; `match` scans a batch of prompts."""

    def __init__(self, texts: Sequence[EvalText], ngram: int = DEFAULT_NGRAM):
        self.texts = list(texts)
        self.ngram = ngram
        words = normalized_words([t.text for t in self.texts])
        self.vocabulary = pc.unique(pc.list_flatten(words))
        lengths = pc.list_value_length(words).to_numpy(zero_copy_only=False).astype(np.int64)
        ids = self._ids(pc.list_flatten(words))
        grams, owner = _window_hashes(ids, lengths, ngram)
        short = np.flatnonzero((lengths > 0) & (lengths < ngram))
        keys = np.concatenate([grams, _whole_hashes(ids, lengths)[short]])
        owners = np.concatenate([owner, short])
        order = np.argsort(keys, kind="stable")
        self._keys, self._owners = keys[order], owners[order]
        self._filter = np.zeros(1 << _FILTER_BITS, bool)
        self._filter[self._suffix(self._keys)] = True
        self.short_texts = int(short.size)

    @staticmethod
    def _suffix(hashes: np.ndarray) -> np.ndarray:
        return (hashes & np.uint64((1 << _FILTER_BITS) - 1)).astype(np.int64)

    def _ids(self, words: pa.Array) -> np.ndarray:
        return pc.index_in(words, value_set=self.vocabulary).fill_null(-1).to_numpy(zero_copy_only=False)

    @property
    def grams(self) -> int:
        return int(self._keys.size)

    def _lookup(self, hashes: np.ndarray) -> np.ndarray:
        result = np.full(hashes.size, NO_MATCH, np.int64)
        candidates = np.flatnonzero(self._filter[self._suffix(hashes)])
        at = np.minimum(np.searchsorted(self._keys, hashes[candidates]), self._keys.size - 1)
        found = self._keys[at] == hashes[candidates]
        result[candidates[found]] = self._owners[at[found]]
        return result

    def _match_words(self, words: pa.Array, lengths: np.ndarray) -> np.ndarray:
        ids = self._ids(words).astype(np.int64)
        result = np.full(lengths.size, NO_MATCH, np.int64)
        hashes, text = _window_hashes(ids, lengths, self.ngram)
        hit = self._lookup(hashes)
        matched = hit != NO_MATCH
        result[text[matched][::-1]] = hit[matched][::-1]  # the first matching window of each text
        short = np.flatnonzero((lengths > 0) & (lengths < self.ngram) & (result == NO_MATCH))
        if short.size:
            result[short] = self._lookup(_whole_hashes(ids, lengths)[short])
        return result

    def match(self, prompts: pa.Array | Sequence[str]) -> np.ndarray:
        """Per prompt, the index in `texts` of an evaluation text it shares an n-gram with, or -1."""
        prompts = pa.array(prompts, pa.string()) if not isinstance(prompts, pa.Array) else prompts
        result = np.full(len(prompts), NO_MATCH, np.int64)
        if not self._keys.size or not len(prompts):
            return result
        is_ascii = pc.string_is_ascii(prompts).fill_null(True).to_numpy(zero_copy_only=False)
        plain = np.flatnonzero(is_ascii)
        if plain.size:
            result[plain] = self._match_words(*ascii_words(prompts.filter(pa.array(is_ascii))))
        other = np.flatnonzero(~is_ascii)
        if other.size:
            words = normalized_words(prompts.filter(pa.array(~is_ascii)))
            lengths = pc.list_value_length(words).to_numpy(zero_copy_only=False).astype(np.int64)
            result[other] = self._match_words(pc.list_flatten(words), lengths)
        return result


def python_grams(eval_texts: Sequence[EvalText], ngram: int = DEFAULT_NGRAM) -> dict[tuple[str, ...], int]:
    """The plain Python reference's index: every n-word tuple of the evaluation texts (a shorter text whole)."""
    grams: dict[tuple[str, ...], int] = {}
    for index, text in enumerate(eval_texts):
        words = python_words(text.text)
        if len(words) < ngram:
            grams.setdefault(tuple(words), index)
        for start in range(len(words) - ngram + 1):
            grams.setdefault(tuple(words[start : start + ngram]), index)
    return grams


def python_scan(grams: dict[tuple[str, ...], int], prompts: Iterable[str], ngram: int = DEFAULT_NGRAM) -> list[int]:
    """The plain Python reference scan: each prompt's n-word tuples probed in `python_grams`, prompt by prompt."""
    found = []
    for prompt in prompts:
        words = python_words(prompt)
        hit = grams.get(tuple(words), NO_MATCH) if 0 < len(words) < ngram else NO_MATCH
        for start in range(len(words) - ngram + 1):
            hit = grams.get(tuple(words[start : start + ngram]), NO_MATCH)
            if hit != NO_MATCH:
                break
        found.append(hit)
    return found


# ---- over the published conversations ---------------------------------------------------------------------

REPORT_KEY = "reports/contamination.json"
_MESSAGES_PER_BATCH = 16_384
_PREVIEW_CHARS = 200


@dataclass(frozen=True)
class ContaminatedConversation:
    conversation_id: str
    shard: int
    source: str
    eval_set: str
    eval_item: str
    message: str  # the head of the user message that matched


@dataclass(frozen=True, kw_only=True)
class ContaminationReport:
    """Every conversation with a user message sharing an n-gram with an evaluation text, over every shard."""

    options: ContaminationOptions = field(default_factory=ContaminationOptions)
    eval_texts: dict[str, int] = field(default_factory=dict)  # evaluation file → texts read from it
    eval_grams: int = 0
    conversations: int = 0
    messages: int = 0
    # Shard → the conversations shard's ids_digest when it was scanned (JSON keys are strings).
    shard_digests: dict[str, str] = field(default_factory=dict)
    matches: list[ContaminatedConversation] = field(default_factory=list)
    computed_at: float = 0.0

    def by(self, attribute: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for match in self.matches:
            counts[getattr(match, attribute)] = counts.get(getattr(match, attribute), 0) + 1
        return dict(sorted(counts.items()))

    def contaminated_ids(self, shard: int) -> set[str]:
        return {match.conversation_id for match in self.matches if match.shard == shard}


class _Scan:
    """User messages gathered across conversations and matched a batch at a time."""

    def __init__(self, index: EvalIndex):
        self.index = index
        self.pending: list[tuple[str, int, str, str]] = []  # conversation id, shard, source, message
        self.matched: dict[str, ContaminatedConversation] = {}
        self.messages = 0

    def add(self, conversation_id: str, shard: int, source: str, message: str) -> None:
        self.pending.append((conversation_id, shard, source, message))
        if len(self.pending) >= _MESSAGES_PER_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        hits = self.index.match([message for *_, message in self.pending])
        for (conversation_id, shard, source, message), hit in zip(self.pending, hits, strict=True):
            if hit != NO_MATCH and conversation_id not in self.matched:
                text = self.index.texts[hit]
                self.matched[conversation_id] = ContaminatedConversation(
                    conversation_id, shard, source, text.eval_set, text.item, message[:_PREVIEW_CHARS]
                )
        self.messages += len(self.pending)
        self.pending = []


def scan_conversations(store: Store, options: ContaminationOptions) -> ContaminationReport:
    """Match every user message of every published conversations shard against the evaluation sets."""
    texts = load_eval_texts(options.eval_files)
    index = EvalIndex(texts, options.ngram)
    scan = _Scan(index)
    stage = read_conversations_manifest(store)
    digests, conversations = {}, 0
    for contents in shard_contents(store, stage.num_shards if stage is not None else 0):
        if contents.manifest is None:
            continue
        shard = contents.shard
        digests[str(shard)] = contents.manifest.ids_digest
        for conversation in contents.conversations:
            conversations += 1
            for message in conversation.messages:
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    scan.add(conversation.id, shard, conversation.source, message["content"])
    scan.flush()
    per_file: dict[str, int] = {}
    for text in texts:
        per_file[text.eval_set] = per_file.get(text.eval_set, 0) + 1
    return ContaminationReport(
        options=options,
        eval_texts=per_file,
        eval_grams=index.grams,
        conversations=conversations,
        messages=scan.messages,
        shard_digests=digests,
        matches=sorted(scan.matched.values(), key=lambda m: (m.shard, m.conversation_id)),
        computed_at=time.time(),
    )


def write_report(store: Store, report: ContaminationReport) -> None:
    store.put_bytes(REPORT_KEY, to_json(report))


def read_report(store: Store) -> ContaminationReport | None:
    return read_record(store, REPORT_KEY, ContaminationReport)


class ContaminationReportStale(RuntimeError):
    """The conversations shard was republished after the contamination report scanned it."""


def quarantined_ids(store: Store, shard: int) -> tuple[set[str], ContaminationReport | None]:
    """The conversation ids of `shard` to exclude as `eval_contamination` (none when the action is `report` or
    no report exists), and the report they come from. A report that scanned another publication of the shard
    is refused: its ids would be those of other conversations."""
    report = read_report(store)
    if report is None:
        return set(), None
    shard_manifest = read_shard_conversations_manifest(store, shard)
    scanned = report.shard_digests.get(str(shard))
    if shard_manifest is not None and scanned != shard_manifest.ids_digest:
        raise ContaminationReportStale(
            f"the contamination report ({store.url(REPORT_KEY)}) did not scan the conversations shard {shard} now "
            "published: run the conversations check eval_contamination again, then training_set"
        )
    if report.options.action != QUARANTINE:
        return set(), report
    return report.contaminated_ids(shard), report
