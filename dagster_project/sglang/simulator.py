"""An SGLang 0.5.23 stand-in: one HTTP server process speaking the protocol of ../shared/reference/sglang.md.

It serves native `/generate` with `input_ids` and the ops routes (§1-§4, checklist §9) without a GPU:

* **Output** — real token ids of the Qwen3.6 vocabulary: a reasoning part, `\\n</think>\\n\\n`, an answer,
  then the EOS id when it stops. Ids and lengths are a deterministic function of `--seed` and the prompt
  ids, so every server of a fleet answers a prompt the same way. Words are ordinary vocabulary tokens, so
  `text` is exactly the tokenizer's decoding of `output_ids` (stop token trimmed, §1.3).
* **Scheduler** — at most `effective_max_running_requests` run at once, the rest wait in a FIFO queue
  (optionally bounded: 503 when full). A running request takes prefill time, then one decode step per
  speculative verify pass; each pass accepts k drafts with probability `accept_probs[k]`, degrading with
  context length when `accept_decay_tokens` is set. Spec stats obey every invariant of §1.3.
* **Faults**, settable at start (`--faults JSON`) and at run time (`POST /_sim/faults`): crash (the
  process exits, dropping every connection), drop (a connection closed before its answer, or mid-stream),
  hang (`/health` still 200, nothing progresses), slow, 503 bursts, empty answers, truncated answers,
  MTP off.
* **Streaming** (`"stream": true`): cumulative chunks after prefill and at each quarter of the decode,
  the finished response, then `data: [DONE]` (§1.5).
* **Admin routes** under `/_sim/` (never SGLang's): faults, a request log (`rid`, prompt hash, outcome)
  and scheduler state with the time spent at the running cap.

Start one with `python -m dagster_project.sglang.simulator --port 31000 [options]`; fleets are started by
`dagster_project.sglang.launch.launch_simulators`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import hashlib
import math
import os
import random
import re
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from itertools import accumulate
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from dagster_project.sglang import protocol as proto

MODEL_PATH = "Qwen/Qwen3.6-27B"
MODEL_VOCAB_SIZE = 248320  # padded embedding size: what the server range-checks input ids against (§7)
SGLANG_VERSION = "0.5.23"

# ---- configuration ------------------------------------------------------------------------------------


@dataclass
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = MODEL_PATH
    served_model_name: str | None = None
    tokenizer: str | None = None  # None: the project's built-in Qwen3.6 tokenizer
    vocab_file: str | None = None  # a sketch written by `SimVocab.save`, shared by a fleet (skips the tokenizer)
    api_key: str | None = field(default=None, repr=False)
    enable_metrics: bool = False
    speculative: bool = True  # launched with NEXTN (reported as EAGLE)
    spec_draft_tokens: int = proto.SPEC_DRAFT_TOKENS
    reasoning_parser: str | None = "qwen3"
    context_length: int = 65536
    token_capacity: int = 249344
    max_running_requests: int | None = 48  # the CLI value, as /server_info shows it
    effective_max_running_requests: int | None = None  # the real cap (mamba pool); default: max_running_requests
    max_queued_requests: int | None = None
    seed: int = 0
    output_len: str = "lognormal:2400:0.6"  # fixed:N | uniform:A:B | lognormal:MEDIAN:SIGMA
    max_output_len: int = 32768  # natural answers never exceed this
    answer_fraction: tuple[float, float] = (0.1, 0.3)  # share of the output after </think>
    accept_probs: tuple[float, ...] = (0.2, 0.2, 0.2, 0.4)  # P(k drafts accepted) per verify pass, k < D
    accept_decay_tokens: int = 0  # context length at which acceptance has fallen halfway to none; 0: no decay
    ttft_s: float = 0.0
    prefill_s_per_token: float = 0.0
    decode_step_s: float = 0.0
    startup_s: float = 0.0  # /health answers 503 this long after start (§3.1)
    health_latency_s: float = 0.0  # real /health takes >= 1 s; 0 keeps tests fast
    request_log_limit: int = 1_000_000
    faults: dict = field(default_factory=dict)

    @property
    def running_cap(self) -> int:
        cap = self.effective_max_running_requests or self.max_running_requests or 48
        return max(1, cap)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def max_req_len(self) -> int:
        return min(self.context_length - 1, self.token_capacity - 1)

    @property
    def max_req_input_len(self) -> int:
        return self.max_req_len - 5


# ---- vocabulary ------------------------------------------------------------------------------------------

_WORD_TOKEN = re.compile(r"^Ġ(?=[a-z]*[aeiouy])[a-z]{2,9}$")  # byte-level BPE " word" with a vowel: fewer fragments
_WORDS = 3000  # the lowest ids are the earliest merges, i.e. the most frequent words
_SKETCH_FORMAT = 1  # part of the cache file name: bump when SimVocab's fields change


@dataclass(frozen=True)
class SimVocab:
    """What the simulator needs of a tokenizer, small enough to share as a file across a fleet."""

    tokenizer: str
    think_end: int
    eos_ids: tuple[int, ...]
    special_ids: frozenset[int]
    texts: dict[int, str]  # decoded text of every id the simulator emits
    words: tuple[int, ...]
    punctuation: tuple[int, ...]
    newline: int
    paragraph: int

    @classmethod
    def from_tokenizer(cls, name: str, tokenizer: Any) -> SimVocab:
        from dagster_project.tokenizer import special_ids

        ids = special_ids(tokenizer)
        vocab = tokenizer.get_vocab()
        words = sorted(i for token, i in vocab.items() if _WORD_TOKEN.match(token))[:_WORDS]

        def single(text: str) -> int:
            (token_id,) = tokenizer.encode(text, add_special_tokens=False)
            return token_id

        punctuation = (single(","), single("."))
        newline, paragraph = single("\n"), single("\n\n")
        emitted = [*words, *punctuation, newline, paragraph, ids.think_end, *ids.eos_ids]
        return cls(
            tokenizer=name,
            think_end=ids.think_end,
            eos_ids=tuple(ids.eos_ids),
            special_ids=frozenset(i for i in emitted if not tokenizer.decode([i], skip_special_tokens=True)),
            texts={i: tokenizer.decode([i], skip_special_tokens=False) for i in emitted},
            words=tuple(words),
            punctuation=punctuation,
            newline=newline,
            paragraph=paragraph,
        )

    def to_json(self) -> bytes:
        data = asdict(self)
        data["special_ids"] = sorted(self.special_ids)
        data["texts"] = {str(k): v for k, v in self.texts.items()}
        return orjson.dumps(data)

    @classmethod
    def from_json(cls, raw: bytes) -> SimVocab:
        data = orjson.loads(raw)
        data["special_ids"] = frozenset(data["special_ids"])
        data["texts"] = {int(k): v for k, v in data["texts"].items()}
        for key in ("eos_ids", "words", "punctuation"):
            data[key] = tuple(data[key])
        return cls(**data)

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_bytes(self.to_json())
        os.replace(staging, path)
        return path


def load_sim_vocab(tokenizer: str | None = None) -> SimVocab:
    """The vocabulary sketch of `tokenizer` (default: built-in), cached on disk next to the tokenizer.

    Building it needs the tokenizer (seconds); the cached sketch loads in milliseconds, which is what
    makes a fleet of simulators start fast.
    """
    from dagster_project import tokenizer as tokenization

    name = tokenizer or tokenization.BUILTIN_TOKENIZER
    builtin = tokenization.builtin_tokenizer_dir()  # named after a digest of everything the build reads
    if name == tokenization.BUILTIN_TOKENIZER:
        cache = builtin.with_name(f"{builtin.name}.simvocab-v{_SKETCH_FORMAT}.json")
    else:
        cache = builtin.parent / f"simvocab-v{_SKETCH_FORMAT}-{hashlib.sha256(name.encode()).hexdigest()[:16]}.json"
    if cache.is_file():
        return SimVocab.from_json(cache.read_bytes())
    vocab = SimVocab.from_tokenizer(name, tokenization.load_tokenizer(name))
    vocab.save(cache)
    return vocab


# ---- output model ----------------------------------------------------------------------------------------


class WordPool:
    """A long, fixed stream of word tokens in sentences; answers are slices of it at prompt-derived offsets.

    Slicing a prebuilt list keeps a 2,000-token answer at microseconds, which is what lets a simulator
    serve thousands of zero-latency requests per second.
    """

    SIZE = 1 << 16

    def __init__(self, vocab: SimVocab, seed: int):
        rng = random.Random(f"pool:{seed}")
        ids: list[int] = []
        comma, period = vocab.punctuation
        while len(ids) < self.SIZE:
            sentence = rng.choices(vocab.words, k=rng.randint(4, 16))
            if len(sentence) > 8:
                sentence.insert(rng.randint(3, len(sentence) - 2), comma)
            ids += sentence
            ids.append(period)
            if rng.random() < 0.15:
                ids.append(vocab.paragraph)
        # Stored twice over, so any slice of up to SIZE tokens is contiguous; `offsets` maps a token
        # position to its first character in `text`, so an answer's text is one string slice.
        self.ids = ids[: self.SIZE] * 2
        self.text = "".join(vocab.texts[i] for i in self.ids)
        self.offsets = list(accumulate((len(vocab.texts[i]) for i in self.ids), initial=0))

    def take(self, start: int, count: int) -> tuple[list[int], str]:
        start %= self.SIZE
        if count <= self.SIZE:
            end = start + count
            return self.ids[start:end], self.text[self.offsets[start] : self.offsets[end]]
        head_ids, head_text = self.take(start, self.SIZE)
        tail_ids, tail_text = self.take(start, count - self.SIZE)
        return head_ids + tail_ids, head_text + tail_text


def parse_length_distribution(spec: str) -> Callable[[random.Random], int]:
    """`fixed:N`, `uniform:A:B` or `lognormal:MEDIAN:SIGMA` → a sampler of natural output lengths."""
    kind, *args = spec.split(":")
    try:
        if kind == "fixed":
            (n,) = map(int, args)
            return lambda rng: n
        if kind == "uniform":
            low, high = map(int, args)
            return lambda rng: rng.randint(low, high)
        if kind == "lognormal":
            median, sigma = map(float, args)
            return lambda rng: int(rng.lognormvariate(math.log(median), sigma))
    except ValueError:
        pass
    raise ValueError(f"bad output length distribution {spec!r}: use fixed:N, uniform:A:B or lognormal:MEDIAN:SIGMA")


@dataclass
class SpecDraw:
    """The verify passes behind `tokens` output tokens: segments of a precomputed pool of draws."""

    verify: int
    histogram: list[int]
    segments: list[tuple[Any, int, int]]  # (pool, start, steps)
    no_drafts: bool = False  # MTP off: every token took its own pass

    @property
    def correct(self) -> int:
        return sum(k * n for k, n in enumerate(self.histogram))

    def prefix(self, steps: int) -> tuple[int, list[int]]:
        """Tokens produced and histogram after the first `steps` passes (for an aborted request)."""
        if self.no_drafts:
            return steps, [steps] if steps else []
        tokens, histogram = 1, [0] * len(self.histogram)
        for pool, start, count in self.segments:
            take = min(steps, count)
            tokens += pool.tokens[start + take] - pool.tokens[start]
            for k in range(len(histogram)):
                histogram[k] += pool.counts[k][start + take] - pool.counts[k][start]
            steps -= take
            if steps <= 0:
                break
        return tokens, _trim(histogram)


def _trim(histogram: list[int]) -> list[int]:
    """The server grows the histogram only up to the largest accepted count seen."""
    while histogram and histogram[-1] == 0:
        histogram.pop()
    return histogram


class _DrawPool:
    """Accepted-draft counts of many verify passes at one acceptance level, with prefix sums."""

    STEPS = 1 << 13

    def __init__(self, probs: Sequence[float], rng: random.Random):
        draws = rng.choices(range(len(probs)), weights=probs, k=self.STEPS)
        self.tokens = list(accumulate((k + 1 for k in draws), initial=0))  # accepted drafts + bonus token
        self.counts = [list(accumulate((int(k == level) for k in draws), initial=0)) for level in range(len(probs))]


class AcceptModel:
    """Per-pass draft acceptance, piecewise constant over context buckets, degrading with context."""

    BUCKET = 1024  # tokens of context that share one acceptance level
    LEVELS = 32

    def __init__(self, probs: Sequence[float], decay_tokens: int, seed: int):
        if not probs or abs(sum(probs) - 1.0) > 1e-6 or min(probs) < 0:
            raise ValueError(f"accept_probs must be non-negative and sum to 1, got {list(probs)}")
        self.probs = tuple(probs)
        self.decay_tokens = decay_tokens
        self._seed = seed
        self._pools: dict[int, _DrawPool] = {}

    def _pool(self, context: int) -> _DrawPool:
        level = 0
        if self.decay_tokens:
            middle = (context // self.BUCKET + 0.5) * self.BUCKET
            level = round(self.LEVELS * middle / (middle + self.decay_tokens))
        pool = self._pools.get(level)
        if pool is None:
            weight = level / self.LEVELS  # share of passes that accept nothing, mixed in as context grows
            probs = [(1 - weight) * p for p in self.probs]
            probs[0] += weight
            pool = self._pools[level] = _DrawPool(probs, random.Random(f"accept:{self._seed}:{level}"))
        return pool

    def draw(self, prompt_tokens: int, tokens: int, rng: random.Random) -> SpecDraw:
        histogram = [0] * len(self.probs)
        segments = []
        verify = 0
        needed = tokens - 1  # the first token is sampled by the prefill pass
        context = prompt_tokens + 1
        while needed > 0:
            pool = self._pool(context)
            budget = min(needed, self.BUCKET - context % self.BUCKET)
            start = rng.randrange(_DrawPool.STEPS - self.BUCKET)
            end = bisect.bisect_left(pool.tokens, pool.tokens[start] + budget, start)
            produced = pool.tokens[end] - pool.tokens[start]
            for k in range(len(histogram)):
                histogram[k] += pool.counts[k][end] - pool.counts[k][start]
            segments.append((pool, start, end - start))
            verify += end - start
            needed -= produced  # overshoot past a stop is discarded: completion <= 1 + correct + verify
            context += produced
        return SpecDraw(verify, _trim(histogram), segments)


@dataclass
class Answer:
    """A planned response: the output, how it ended, and the work it costs the simulated GPU."""

    output_ids: list[int]
    text: str
    finish_reason: dict
    spec: SpecDraw | None
    prefill_s: float
    decode_s: float
    stop_text: str = ""  # the stop token's text, shown only with no_stop_trim


class OutputModel:
    def __init__(self, config: SimConfig, vocab: SimVocab):
        self.config = config
        self.vocab = vocab
        self.pool = WordPool(vocab, config.seed)
        self.lengths = parse_length_distribution(config.output_len)
        self.accept = AcceptModel(config.accept_probs, config.accept_decay_tokens, config.seed)
        self.eos = vocab.eos_ids[0]
        # `<think>\n\n</think>\n\n` closes the thinking block in the prompt (enable_thinking=False, §2.1).
        self.no_think_suffix = [vocab.think_end, vocab.paragraph]

    def plan(
        self,
        input_ids: list[int],
        prompt_hash: str,
        params: Mapping[str, Any],
        max_new_tokens: int,
        faults: Faults,
        sample: int = 0,
    ) -> Answer:
        rng = random.Random(f"{self.config.seed}:{prompt_hash}:{sample}")
        thinking = input_ids[-2:] != self.no_think_suffix
        natural = max(1, min(self.lengths(rng), self.config.max_output_len))
        natural = max(natural, int(params.get("min_new_tokens") or 0) + 1)
        if faults.take("empty"):
            natural = 1
        cap = max_new_tokens
        if faults.take("truncate") and natural > 1:
            cap = min(cap, max(1, natural // 3))  # as if the KV pool clipped the request
        if params.get("ignore_eos"):
            natural = cap + 1  # the model keeps writing until the cap
        with_eos = natural <= cap
        ids, text = self._compose(rng, thinking, natural, natural if with_eos else cap, with_eos)
        if with_eos:
            finish, stop_text = proto.finish_stop(self.eos), self.vocab.texts[self.eos]
        else:
            finish, stop_text = proto.finish_length(cap), ""
        ids, text, finish, stop_text = self._apply_stops(ids, text, finish, stop_text, params)
        spec = self._spec(len(input_ids), len(ids), rng, faults)
        steps = spec.verify if spec is not None else max(0, len(ids) - 1)
        return Answer(
            output_ids=ids,
            text=text,
            finish_reason=finish,
            spec=spec,
            prefill_s=self.config.ttft_s + len(input_ids) * self.config.prefill_s_per_token,
            decode_s=steps * self.config.decode_step_s,
            stop_text=stop_text,
        )

    def _compose(
        self, rng: random.Random, thinking: bool, natural: int, count: int, with_eos: bool
    ) -> tuple[list[int], str]:
        """The first `count` tokens of an answer whose natural length, its EOS included, is `natural`."""
        body = natural - 1
        parts: list[tuple[list[int], str]] = []
        if thinking and body >= 4:
            answer = max(1, round(body * rng.uniform(*self.config.answer_fraction)))
            reasoning = max(0, body - 3 - answer)
            answer = body - 3 - reasoning
            v = self.vocab
            parts.append(self.pool.take(rng.randrange(WordPool.SIZE), reasoning))
            close = [v.newline, v.think_end, v.paragraph]
            parts.append((close, "".join(v.texts[i] for i in close)))
            parts.append(self.pool.take(rng.randrange(WordPool.SIZE), answer))
        else:
            parts.append(self.pool.take(rng.randrange(WordPool.SIZE), body))
        ids: list[int] = []
        texts: list[str] = []
        for part_ids, part_text in parts:
            room = count - len(ids)
            if room <= 0:
                break
            if len(part_ids) <= room:
                ids += part_ids
                texts.append(part_text)
            else:
                ids += part_ids[:room]
                texts.append("".join(self.vocab.texts[i] for i in part_ids[:room]))
        if with_eos and len(ids) < count:
            ids.append(self.eos)  # its text is the stop token: trimmed from `text` (§1.3)
        return ids, "".join(texts)

    def _apply_stops(
        self, ids: list[int], text: str, finish: dict, stop_text: str, params: Mapping[str, Any]
    ) -> tuple[list[int], str, dict, str]:
        """`stop_token_ids` and `stop` strings end the answer at their first occurrence (§1.2, §1.4)."""
        stop_ids = set(params.get("stop_token_ids") or ())
        stops = params.get("stop") or ()
        if not stop_ids and not stops:
            return ids, text, finish, stop_text
        body = ids[:-1] if finish["type"] == "stop" else ids
        if not stop_ids.isdisjoint(body):
            index = min(body.index(token) for token in stop_ids if token in body)
            prefix, token = body[:index], body[index]
            return (
                prefix + [token],
                "".join(self.vocab.texts[i] for i in prefix),
                proto.finish_stop(token),
                self.vocab.texts[token],
            )
        stops = [stops] if isinstance(stops, str) else stops
        found = [(text.find(s), s) for s in stops if s and s in text]
        if not found:
            return ids, text, finish, stop_text
        position, matched = min(found)
        ends = list(accumulate(len(self.vocab.texts[i]) for i in body))
        last = bisect.bisect_left(ends, position + len(matched))
        return body[: last + 1], text[:position], proto.finish_stop(matched), matched

    def _spec(self, prompt_tokens: int, tokens: int, rng: random.Random, faults: Faults) -> SpecDraw | None:
        if not self.config.speculative:
            return None
        if faults.mtp_off:
            return SpecDraw(tokens, [tokens] if tokens else [], [], no_drafts=True)
        return self.accept.draw(prompt_tokens, tokens, rng)


# ---- faults ------------------------------------------------------------------------------------------------


@dataclass
class Faults:
    """Injected failures. Counted faults take an int (the next N requests) or true (every request)."""

    crash_after_requests: int | None = None  # exit the process when this many more requests have arrived
    crash_after_s: float | None = None  # exit the process this long after the fault is set
    drop: int | bool = 0  # close the connection before the answer (or mid-stream): no HTTP status
    hang: bool = False  # nothing progresses; /health still answers 200
    slow: float = 1.0  # every request takes this many times longer
    error_503: int | bool = 0  # answer 503 "The request queue is full." (E4)
    error_503_for_s: float | None = None  # ... for every request during this many seconds
    empty: int | bool = 0  # the answer is the EOS token alone
    truncate: int | bool = 0  # the answer is cut early with finish_reason length (a clipped request)
    mtp_off: bool = False  # no draft is accepted: spec_verify_ct equals the completion tokens
    _503_until: float = field(default=0.0, repr=False)

    def update(self, changes: Mapping[str, Any], now: float) -> None:
        known = {f.name for f in fields(self) if not f.name.startswith("_")}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
        if not isinstance(changes.get("slow", 1.0), (int, float)) or changes.get("slow", 1.0) < 1.0:
            raise ValueError("slow must be a number >= 1 (a slowdown factor)")
        for name, value in changes.items():
            setattr(self, name, value)
        if "error_503_for_s" in changes:
            self._503_until = now + (changes["error_503_for_s"] or 0.0)

    def take(self, name: str) -> bool:
        """Consume one occurrence of a counted fault; True when it applies to this request."""
        budget = getattr(self, name)
        if budget is True:
            return True
        if budget:
            setattr(self, name, budget - 1)
            return True
        return False

    def rejects_with_503(self, now: float) -> bool:
        return now < self._503_until or self.take("error_503")

    @property
    def speed(self) -> float:
        return 0.0 if self.hang else 1.0 / self.slow

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


# ---- the server ----------------------------------------------------------------------------------------------


class _RequestError(Exception):
    def __init__(self, status: int, body: dict):
        self.status, self.body = status, body


class _Job:
    """One request inside the simulated scheduler."""

    __slots__ = (
        "aborted",
        "admitted",
        "answer",
        "prompt_tokens",
        "received",
        "resumed",
        "rid",
        "speed",
        "started",
        "wake",
        "work_done",
    )

    def __init__(self, rid: str, answer: Answer, prompt_tokens: int, received: float):
        self.rid = rid
        self.answer = answer
        self.prompt_tokens = prompt_tokens
        self.received = received
        self.started = 0.0
        self.work_done = 0.0  # seconds of work at normal speed, as of `resumed`
        self.resumed: float | None = None  # loop time the current stretch of progress began
        self.speed = 0.0
        self.wake: asyncio.Future | None = None
        self.admitted: asyncio.Future | None = None
        self.aborted = False

    @property
    def work(self) -> float:
        return self.answer.prefill_s + self.answer.decode_s

    def progress(self, now: float) -> float:
        """Fraction of its work done by loop time `now`."""
        if self.work <= 0:
            return 1.0 if self.started else 0.0
        done = self.work_done + ((now - self.resumed) * self.speed if self.resumed is not None else 0.0)
        return min(1.0, done / self.work)

    def interrupt(self) -> None:
        for future in (self.wake, self.admitted):
            if future is not None and not future.done():
                future.set_result(None)


class _Occupancy:
    """Time-weighted scheduler occupancy since the last reset (for the saturation benchmark)."""

    def __init__(self, cap: int, now: float):
        self.cap = cap
        self.reset(now, 0)

    def reset(self, now: float, running: int) -> None:
        self.since = self.last = now
        self.running = running
        self.at_cap_s = self.running_s = 0.0

    def change(self, now: float, running: int) -> None:
        elapsed = now - self.last
        if self.running >= self.cap:
            self.at_cap_s += elapsed
        self.running_s += self.running * elapsed
        self.last, self.running = now, running

    def report(self, now: float) -> dict:
        self.change(now, self.running)
        window = max(now - self.since, 1e-9)
        return {
            "window_s": now - self.since,
            "at_cap_s": self.at_cap_s,
            "at_cap_fraction": self.at_cap_s / window,
            "mean_running": self.running_s / window,
        }


_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)


class Simulator:
    def __init__(self, config: SimConfig, vocab: SimVocab):
        self.config = config
        self.vocab = vocab
        self.model = OutputModel(config, vocab)
        self.loop = asyncio.get_running_loop()
        self.cap = config.running_cap
        self.faults = Faults()
        self.faults.update(config.faults, time.perf_counter())
        self.started_at = time.perf_counter()
        self.started_wall = time.time()
        self.jobs: dict[str, _Job] = {}
        self.running = 0
        self.waiting: deque[_Job] = deque()
        self.request_log: list[list] = []
        self.occupancy = _Occupancy(self.cap, self.started_at)
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "requests": 0, "aborted": 0, "verify_calls": 0}
        self.peaks = {"running": 0, "queued": 0}  # since start or the last occupancy reset
        self.e2e_counts = [0] * (len(_E2E_BUCKETS) + 1)
        self.e2e_sum = 0.0
        self.spec_totals = [0, 0]  # accepted tokens incl. bonus, verify passes: since start or last flush
        self.spec_window: deque[tuple[int, int, int]] = deque(maxlen=64)  # (tokens, verify, correct)
        self._crash_timer: asyncio.TimerHandle | None = None
        self._tokenizer: Any = None
        self._arm_crash_timer()

    # ---- scheduler ----

    def _set_running(self, running: int) -> None:
        self.running = running
        self.peaks["running"] = max(self.peaks["running"], running)
        self.occupancy.change(time.perf_counter(), running)

    async def _run(self, job: _Job, checkpoint: Callable[[_Job], Awaitable[None]] | None = None) -> None:
        """Admit `job` (or queue it), then let it make progress until done or aborted.

        With `checkpoint` (streaming), progress pauses after prefill and at each quarter of the decode
        to let it report the output so far.
        """
        if self.running < self.cap and not self.waiting:
            self._set_running(self.running + 1)
            job.started = time.perf_counter()
        else:
            if self.config.max_queued_requests is not None and len(self.waiting) >= self.config.max_queued_requests:
                raise _RequestError(503, proto.e4_body(503, proto.MSG_QUEUE_FULL))
            job.admitted = self.loop.create_future()
            self.waiting.append(job)
            self.peaks["queued"] = max(self.peaks["queued"], len(self.waiting))
            try:
                await job.admitted
            except asyncio.CancelledError:
                self._leave(job)
                raise
            finally:
                job.admitted = None
            if not job.started:  # aborted while queued: it never ran
                self._leave(job)
                return
        try:
            if checkpoint is not None:
                answer = job.answer
                for target in (answer.prefill_s, *(answer.prefill_s + answer.decode_s * q / 4 for q in (1, 2, 3))):
                    await self._progress(job, target)
                    if job.aborted:
                        return
                    await checkpoint(job)
            if job.work > 0 or self.faults.speed != 1.0:
                await self._progress(job, job.work)
        finally:
            self._leave(job)

    def _leave(self, job: _Job) -> None:
        if job.started:
            self._set_running(self.running - 1)
            self._admit()
        elif job in self.waiting:
            self.waiting.remove(job)

    def _admit(self) -> None:
        while self.waiting and self.running < self.cap:
            job = self.waiting.popleft()
            if job.admitted is None or job.admitted.done():  # its handler is being cancelled
                continue
            self._set_running(self.running + 1)
            job.started = time.perf_counter()
            job.admitted.set_result(None)

    async def _progress(self, job: _Job, target: float) -> None:
        """Advance `job` until `target` seconds of its work are done, at the speed the faults allow."""
        while not job.aborted:
            speed = self.faults.speed
            remaining = target - job.work_done
            if remaining <= 0 and speed > 0:
                return
            job.wake = self.loop.create_future()
            timer = self.loop.call_later(remaining / speed, _resolve, job.wake) if speed > 0 else None
            job.resumed, job.speed = self.loop.time(), speed
            try:
                await job.wake
            finally:
                if timer is not None:
                    timer.cancel()
                job.work_done += (self.loop.time() - job.resumed) * speed
                job.wake, job.resumed = None, None

    def _wake_all(self) -> None:
        for job in self.jobs.values():
            if job.wake is not None and not job.wake.done():
                job.wake.set_result(None)

    # ---- faults ----

    def _arm_crash_timer(self) -> None:
        if self._crash_timer is not None:
            self._crash_timer.cancel()
            self._crash_timer = None
        if self.faults.crash_after_s is not None:
            self._crash_timer = self.loop.call_later(self.faults.crash_after_s, _crash, "crash_after_s")

    def _count_arrival_for_crash(self) -> None:
        remaining = self.faults.crash_after_requests
        if remaining is None:
            return
        if remaining <= 1:
            _crash("crash_after_requests")
        self.faults.crash_after_requests = remaining - 1

    # ---- /generate ----

    def _authorized(self, request: web.Request) -> bool:
        key = self.config.api_key
        return not key or request.headers.get("Authorization") == f"Bearer {key}"

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _json(proto.UNAUTHORIZED_BODY, 401)
        received = time.perf_counter()
        try:
            body = await _read_json(request)
            batch = self._parse(body)
        except _RequestError as error:
            return _json(error.body, error.status)
        self._count_arrival_for_crash()
        if body.get("stream"):
            if len(batch) > 1 or int(batch[0]["params"].get("n") or 1) > 1:
                return _json(proto.e3_body("the simulator streams single requests only (no batch, n=1)"), 400)
            return await self._stream(request, batch[0], received)
        if len(batch) > 1:
            results = await asyncio.gather(
                *(self._generate_one(request, item, received) for item in batch), return_exceptions=True
            )
            for result in results:
                if isinstance(result, _RequestError):
                    return _json(result.body, result.status)
                if isinstance(result, BaseException):
                    raise result
            return _json(results, 200)
        try:
            return _json(await self._generate_one(request, batch[0], received), 200)
        except _RequestError as error:
            return _json(error.body, error.status)

    def _parse(self, body: Any) -> list[dict]:
        """Stages A and B of §1: request types (E1), then the sampling_params contract (E2)."""
        if not isinstance(body, dict):
            raise _RequestError(
                400, proto.e1_body(_e1_message("model_attributes_type", (), "Input should be a valid dictionary", body))
            )
        for name, check, expected in _TOP_LEVEL_TYPES:
            if body.get(name) is not None and not check(body[name]):
                raise _RequestError(400, proto.e1_body(_e1_message(*expected, body[name], loc=name)))
        prompts: list[Any]
        input_ids = body.get("input_ids")
        if input_ids is not None:
            batched = bool(input_ids) and isinstance(input_ids[0], list)
            prompts = input_ids if batched else [input_ids]
            for prompt in prompts:
                tokens = prompt if isinstance(prompt, list) else [prompt]
                if set(map(type, tokens)) - {int}:  # one C-level pass; the slow path finds the culprit
                    culprit = next(token for token in tokens if not proto._is_int(token))
                    raise _RequestError(400, proto.e2_body(str(proto._invalid_type(culprit, "i32"))))
        elif body.get("text") is not None:
            batched = isinstance(body["text"], list)
            prompts = body["text"] if batched else [body["text"]]
        else:
            raise _RequestError(400, proto.e3_body(proto.MSG_NO_INPUT))
        params = body.get("sampling_params")
        params_list = params if isinstance(params, list) else [params or {}] * len(prompts)
        for item in params_list:
            try:
                proto.check_sampling_contract(item)
            except proto.ContractError as exc:
                raise _RequestError(400, proto.e2_body(str(exc))) from None
        if len(params_list) != len(prompts):
            raise _RequestError(400, proto.e3_body("The length of sampling_params and the batch size mismatch."))
        rid = body.get("rid")
        if batched:
            rids = (
                rid
                if isinstance(rid, list)
                else [f"{rid}_{i}" if rid else uuid.uuid4().hex for i in range(len(prompts))]
            )
            if len(rids) != len(prompts):
                raise _RequestError(
                    400, proto.e3_body("The specified rids length mismatch with the batch_size for batch processing.")
                )
        else:
            rids = [(rid if isinstance(rid, str) else (rid or [None])[0]) or uuid.uuid4().hex]
        options = {key: bool(body.get(key)) for key in ("require_reasoning", "return_prompt_token_ids")}
        return [{"rid": r, "prompt": p, "params": s, **options} for r, p, s in zip(rids, prompts, params_list)]

    async def _prepare(self, item: dict, received: float) -> tuple[list[int], list, list[_Job]]:
        """Stage C checks, then one planned job per sample; every request is logged, rejected or not."""
        prompt, params = item["prompt"], item["params"]
        input_ids = prompt if isinstance(prompt, list) else await self._tokenize(prompt)
        prompt_hash = proto.input_hash(input_ids)
        log = [item["rid"], prompt_hash, len(input_ids), time.time(), "pending"]
        if len(self.request_log) < self.config.request_log_limit:
            self.request_log.append(log)
        try:
            max_new_tokens = self._validate(input_ids, params, item["rid"])
            if self.faults.rejects_with_503(time.perf_counter()):
                raise _RequestError(503, proto.e4_body(503, proto.MSG_QUEUE_FULL))
        except _RequestError as error:
            log[4] = f"error:{error.status}"
            raise
        samples = int(params.get("n") or 1)
        rids = [item["rid"]] if samples == 1 else [uuid.uuid4().hex for _ in range(samples)]
        jobs = [
            self._job(rid, input_ids, prompt_hash, params, max_new_tokens, index, received)
            for index, rid in enumerate(rids)
        ]
        return input_ids, log, jobs

    async def _execute(
        self, jobs: list[_Job], log: list, checkpoint: Callable[[_Job], Awaitable[None]] | None = None
    ) -> None:
        try:
            await asyncio.gather(*(self._run(job, checkpoint) for job in jobs))
        except _RequestError as error:
            log[4] = f"error:{error.status}"
            raise
        except asyncio.CancelledError:  # the client went away: the server aborts the request (§4)
            log[4] = "disconnected"
            for job in jobs:
                job.aborted = True
            self.counters["aborted"] += len(jobs)
            raise
        finally:
            for job in jobs:
                self.jobs.pop(job.rid, None)

    async def _generate_one(self, request: web.Request, item: dict, received: float) -> Any:
        input_ids, log, jobs = await self._prepare(item, received)
        drop = self.faults.take("drop")
        await self._execute(jobs, log)
        if drop:
            log[4] = "dropped"
            _drop_connection(request)
        responses = [self._respond(job, input_ids, item) for job in jobs]
        log[4] = responses[0]["meta_info"]["finish_reason"]["type"]
        return responses[0] if len(jobs) == 1 else responses

    async def _stream(self, request: web.Request, item: dict, received: float) -> web.StreamResponse:
        """Server-sent events (§1.5): cumulative output, `finish_reason` null until the last chunk, then [DONE].

        Chunks come after prefill and at each quarter of the decode, not after every token.
        """
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(body: dict) -> None:
            await response.write(b"data: " + orjson.dumps(body) + b"\n\n")

        try:
            input_ids, log, (job,) = await self._prepare(item, received)
        except _RequestError as error:
            if error.status == 503:  # a scheduler abort: a normal chunk with an abort finish_reason
                message = error.body["message"]
                await send(
                    {
                        "text": "",
                        "output_ids": [],
                        "meta_info": {"id": item["rid"], "finish_reason": proto.finish_abort(message, 503)},
                    }
                )
            else:  # a ValueError raised inside the stream
                message = (
                    error.body["error"]["message"] if isinstance(error.body.get("error"), dict) else str(error.body)
                )
                await send(
                    {
                        "error": {
                            "message": message,
                            "type": "invalid_request_error",
                            "code": error.status,
                            "retryable": False,
                        }
                    }
                )
            await response.write(b"data: [DONE]\n\n")
            return response
        drop = self.faults.take("drop")
        first = True

        async def checkpoint(job: _Job) -> None:
            nonlocal first
            ids = self._partial(job)[0]
            meta = {
                "id": job.rid,
                "finish_reason": None,
                "prompt_tokens": job.prompt_tokens,
                "weight_version": "default",
                "num_retractions": 0,
                "reasoning_tokens": self._reasoning_tokens(ids, item),
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "cached_tokens_details": None,
                "dp_rank": None,
            }
            if first:
                meta["response_sent_to_client_ts"] = time.time()
                first = False
            await send({"text": "".join(self.vocab.texts[i] for i in ids), "output_ids": ids, "meta_info": meta})
            if drop:
                log[4] = "dropped"
                _drop_connection(request)  # mid-stream: the client sees no [DONE]

        await self._execute([job], log, checkpoint)
        final = self._respond(job, input_ids, item)
        del final["meta_info"]["response_sent_to_client_ts"]  # only the first chunk carries it
        log[4] = final["meta_info"]["finish_reason"]["type"]
        await send(final)
        await response.write(b"data: [DONE]\n\n")
        return response

    def _job(
        self,
        rid: str,
        input_ids: list[int],
        prompt_hash: str,
        params: dict,
        max_new_tokens: int,
        sample: int,
        received: float,
    ) -> _Job:
        answer = self.model.plan(input_ids, prompt_hash, params, max_new_tokens, self.faults, sample)
        job = _Job(rid, answer, len(input_ids), received)
        self.jobs[rid] = job
        return job

    def _validate(self, input_ids: list[int], params: dict, rid: str) -> int:
        """Stage C of §1 (E3), in the server's order; returns the effective max_new_tokens."""
        if not input_ids:
            raise _RequestError(400, proto.e3_body(proto.MSG_EMPTY_INPUT_IDS))
        if max(input_ids) >= MODEL_VOCAB_SIZE:
            raise _RequestError(400, proto.e3_body(proto.msg_ids_out_of_vocab(input_ids, MODEL_VOCAB_SIZE)))
        prompt_tokens = len(input_ids)
        context = self.config.context_length
        if prompt_tokens >= context:
            raise _RequestError(400, proto.e3_body(proto.msg_input_too_long(prompt_tokens, context)))
        requested = params.get("max_new_tokens", proto.DEFAULT_MAX_NEW_TOKENS)  # present but null: no cap
        if requested is not None and requested + prompt_tokens > context:
            raise _RequestError(400, proto.e3_body(proto.msg_total_too_long(context, prompt_tokens, requested)))
        try:
            proto.check_sampling_values(params, MODEL_VOCAB_SIZE)
        except ValueError as exc:
            raise _RequestError(400, proto.e3_body(str(exc))) from None
        if rid in self.jobs:
            raise _RequestError(400, proto.e3_body(proto.msg_duplicate_rid(rid)))
        if prompt_tokens >= self.config.max_req_input_len:
            raise _RequestError(
                400, proto.e3_body(proto.msg_input_exceeds_max(prompt_tokens, self.config.max_req_input_len))
            )
        cap = proto.UNCAPPED_MAX_NEW_TOKENS if requested is None else requested
        # The scheduler silently clips to what the context leaves (§1.2).
        return max(0, min(cap, self.config.max_req_len - prompt_tokens - 1))

    async def _tokenize(self, text: str) -> list[int]:
        if self._tokenizer is None:
            from dagster_project.tokenizer import BUILTIN_TOKENIZER, load_tokenizer

            self._tokenizer = await asyncio.to_thread(load_tokenizer, self.config.tokenizer or BUILTIN_TOKENIZER)
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _respond(self, job: _Job, input_ids: list[int], item: dict) -> dict:
        answer, params = job.answer, item["params"]
        finished_at = time.perf_counter()
        if job.aborted:
            ids, spec_ct, histogram = self._partial(job)
            text = "".join(self.vocab.texts[i] for i in ids)
            finish = proto.finish_abort()
            self.counters["aborted"] += 1
        else:
            ids, text, finish = answer.output_ids, answer.text, answer.finish_reason
            spec_ct = answer.spec.verify if answer.spec is not None else 0
            histogram = answer.spec.histogram if answer.spec is not None else []
            if params.get("no_stop_trim") and finish["type"] == "stop":
                matched = finish["matched"]
                skip = params.get("skip_special_tokens", True) is not False and matched in self.vocab.special_ids
                text += "" if skip else answer.stop_text
        completion = len(ids)
        meta: dict[str, Any] = {
            "id": job.rid,
            "finish_reason": finish,
            "prompt_tokens": job.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        }
        queue_s = (job.started or finished_at) - job.received
        if self.config.enable_metrics:
            wall = self.started_wall - self.started_at
            meta["forward_entry_time"] = wall + (job.started or finished_at)
            meta["prefill_finished_time"] = wall + (job.started or finished_at) + answer.prefill_s
            meta["queue_time"] = queue_s
        meta["reasoning_tokens"] = self._reasoning_tokens(ids, item)
        meta["completion_tokens"] = completion
        meta["cached_tokens"] = 0
        meta["weight_versions"] = [{"version": "default", "start": 0, "end": completion}]
        meta["cached_tokens_details"] = None
        meta["dp_rank"] = None
        e2e = finished_at - job.received
        meta["e2e_latency"] = e2e
        if spec_ct > 0:
            correct = sum(k * n for k, n in enumerate(histogram))
            proposed = spec_ct * (self.config.spec_draft_tokens - 1)
            meta["spec_accept_rate"] = correct / proposed
            meta["spec_accept_length"] = completion / spec_ct
            meta["spec_num_correct_drafts"] = correct
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = spec_ct
            if histogram:
                meta["spec_correct_drafts_histogram"] = histogram
            self._record_spec(completion, spec_ct, correct)
        if self.config.enable_metrics:
            wall = self.started_wall - self.started_at
            decode_s = e2e - queue_s - answer.prefill_s
            meta["request_received_ts"] = wall + job.received
            meta["first_token_latency"] = queue_s + answer.prefill_s
            meta["api_server_dispatch_finish_ts"] = wall + job.received
            meta["request_finished_ts"] = wall + finished_at
            meta["decode_throughput"] = completion / decode_s if decode_s > 0 else 0.0
        meta["response_sent_to_client_ts"] = time.time()
        response: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": meta}
        if item["return_prompt_token_ids"]:
            response["prompt_token_ids"] = input_ids
        self._record_finish(job.prompt_tokens, completion, e2e)
        return response

    def _partial(self, job: _Job) -> tuple[list[int], int, list[int]]:
        """What an aborted request had produced: the tokens of the verify passes it completed."""
        answer = job.answer
        decoded_s = job.work_done - answer.prefill_s
        if decoded_s < 0 or not answer.output_ids:
            return [], 0, []
        total_steps = answer.spec.verify if answer.spec is not None else len(answer.output_ids) - 1
        steps = (
            total_steps if answer.decode_s <= 0 else min(total_steps, int(total_steps * decoded_s / answer.decode_s))
        )
        if answer.spec is None:
            return answer.output_ids[: steps + 1], 0, []
        tokens, histogram = answer.spec.prefix(steps)
        return answer.output_ids[: min(tokens, len(answer.output_ids))], steps, histogram

    def _reasoning_tokens(self, ids: list[int], item: dict) -> int:
        """Counted only on request (`require_reasoning`) with a reasoning parser: up to and including </think>."""
        if not (item["require_reasoning"] and self.config.reasoning_parser):
            return 0
        try:
            return ids.index(self.vocab.think_end) + 1
        except ValueError:
            return len(ids)

    def _record_spec(self, completion: int, verify: int, correct: int) -> None:
        self.counters["verify_calls"] += verify
        self.spec_totals[0] += completion
        self.spec_totals[1] += verify
        self.spec_window.append((completion, verify, correct))

    def _record_finish(self, prompt_tokens: int, completion: int, e2e: float) -> None:
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += prompt_tokens
        self.counters["generation_tokens"] += completion
        self.e2e_counts[bisect.bisect_left(_E2E_BUCKETS, e2e)] += 1
        self.e2e_sum += e2e

    # ---- ops routes ----

    async def health(self, request: web.Request) -> web.Response:
        if self.config.health_latency_s:
            await asyncio.sleep(self.config.health_latency_s)
        starting = time.perf_counter() - self.started_at < self.config.startup_s
        return web.Response(status=503 if starting else 200)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if time.perf_counter() - self.started_at < self.config.startup_s else 200)

    async def model_info(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json(proto.UNAUTHORIZED_BODY, 401)
        return _json(
            {
                "model_path": self.config.model_path,
                "served_model_name": self.config.model_name,
                "tokenizer_path": self.config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": self.config.reasoning_parser,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": True,
                "has_audio_understanding": False,
                "model_type": "qwen3_5",
                "architectures": ["Qwen3_5ForConditionalGeneration"],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json(proto.UNAUTHORIZED_BODY, 401)
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": int(self.started_wall),
            "owned_by": "sglang",
            "root": self.config.model_path,
            "parent": None,
            "max_model_len": self.config.context_length,
        }
        return _json({"object": "list", "data": [card]})

    def _gen_throughput(self) -> float:
        """Tokens per second of the running requests at the current speed (a decode-window estimate)."""
        speed = self.faults.speed
        return (
            sum(
                len(job.answer.output_ids) / job.answer.decode_s
                for job in self.jobs.values()
                if job.started and job.answer.decode_s > 0
            )
            * speed
        )

    def _used_tokens(self) -> int:
        now = self.loop.time()
        return sum(
            job.prompt_tokens + int(len(job.answer.output_ids) * job.progress(now))
            for job in self.jobs.values()
            if job.started and not job.aborted
        )

    async def server_info(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json(proto.UNAUTHORIZED_BODY, 401)
        c = self.config
        spec = "EAGLE" if c.speculative else None  # NEXTN resolves to EAGLE (TL;DR 6)
        state: dict[str, Any] = {
            "speculative_algorithm": spec,
            "max_mamba_cache_size": self.cap * 5,
            "world_size": 1,
            "effective_max_running_requests_per_dp": self.cap,
            "last_gen_throughput": self._gen_throughput(),
            "memory_usage": {
                "weight": 52.31,
                "kvcache": 16.2,
                "startup_available": 139.23,
                "token_capacity": c.token_capacity,
                "token_capacity_swa": None,
                "graph": {"decode": 0.0, "target_verify": 1.1, "draft_decode": 0.4, "draft_extend": 0.3},
            },
            "disaggregation_mode": "null",
            "decode_cuda_graph_bs": [bs for bs in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128) if bs <= self.cap],
            "decode_cuda_graph_memory_gb": 1.8,
        }
        if c.speculative and self.spec_totals[1]:
            state["avg_spec_accept_length"] = self.spec_totals[0] / self.spec_totals[1]
        info = {
            "model_path": c.model_path,
            "served_model_name": c.model_name,
            "tokenizer_path": c.model_path,
            "host": c.host,
            "port": c.port,
            "tp_size": 1,
            "dp_size": 1,
            "base_gpu_id": 0,
            "context_length": c.context_length,
            "mem_fraction_static": 0.88,
            "max_running_requests": c.max_running_requests,
            "max_queued_requests": c.max_queued_requests,
            "chunked_prefill_size": 8192,
            "kv_cache_dtype": "auto",
            "speculative_algorithm": spec,
            "speculative_num_steps": c.spec_draft_tokens - 1 if c.speculative else None,
            "speculative_eagle_topk": 1 if c.speculative else None,
            "speculative_num_draft_tokens": c.spec_draft_tokens if c.speculative else None,
            "mamba_ssm_dtype": None,
            "max_mamba_cache_size": None,
            "mamba_full_memory_ratio": 0.9,
            "mamba_radix_cache_strategy": "extra_buffer",
            "disable_radix_cache": False,
            "reasoning_parser": c.reasoning_parser,
            "enable_metrics": c.enable_metrics,
            "weight_version": "default",
            "api_key": c.api_key,  # the real server does not redact it either (§3.3)
            "launch_command": "python -m dagster_project.sglang.simulator " + " ".join(_redacted_argv()),
            "status": "ready",
            "max_total_num_tokens": c.token_capacity,
            "max_req_input_len": c.max_req_input_len,
            "startup_time": 0.0,
            "internal_states": [state],
            "version": SGLANG_VERSION,
            "frontend": "python",
        }
        return _json(info)

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json(proto.UNAUTHORIZED_BODY, 401)
        if self.jobs:
            return web.Response(status=400, text=proto.MSG_FLUSH_FAILED)
        self.spec_totals = [0, 0]
        self.spec_window.clear()
        return web.Response(text=proto.MSG_FLUSH_OK)

    async def abort_request(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json(proto.UNAUTHORIZED_BODY, 401)
        try:
            body = await _read_json(request)
        except _RequestError as error:
            return _json(error.body, error.status)
        prefix = body.get("rid") or ""
        abort_all = bool(body.get("abort_all"))
        for job in list(self.jobs.values()):
            if abort_all or job.rid.startswith(prefix):  # prefix semantics (TL;DR 8)
                job.aborted = True
                job.interrupt()
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.config.enable_metrics:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=self._exposition(), content_type="text/plain", charset="utf-8")

    def _exposition(self) -> str:
        name = self.config.model_name
        scheduler = {"engine_type": "unified", "model_name": name, "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}
        tokenizer = {"engine_type": "unified", "model_name": name}
        streaming = {**tokenizer, "is_streaming": "false"}
        used = self._used_tokens()
        full_usage = used / self.config.token_capacity
        mamba_usage = self.running / (self.cap * 5)
        out = proto.Exposition()
        out.gauge("num_running_reqs", self.running, scheduler)
        out.gauge("num_queue_reqs", len(self.waiting), scheduler)
        out.gauge("gen_throughput", self._gen_throughput(), scheduler)
        out.gauge("cache_hit_rate", 0.0, scheduler)
        out.gauge("token_usage", max(full_usage, mamba_usage), scheduler)
        out.gauge("full_token_usage", full_usage, scheduler)
        out.gauge("mamba_usage", mamba_usage, scheduler)
        out.gauge("num_used_tokens", used, scheduler)
        if self.config.speculative:
            tokens, verify, correct = (
                (sum(column) for column in zip(*self.spec_window)) if self.spec_window else (0, 0, 0)
            )
            draft = self.config.spec_draft_tokens
            out.gauge("spec_accept_length", tokens / verify if verify else 0.0, scheduler)
            out.gauge("spec_accept_rate", correct / (verify * (draft - 1)) if verify else 0.0, scheduler)
            out.gauge("spec_num_steps", draft - 1, scheduler)
            out.gauge("spec_num_draft_tokens", draft, scheduler)
        out.gauge("num_retracted_reqs", 0, {**scheduler, "pid": str(os.getpid())})  # mode "all": one series per process
        out.gauge("max_total_num_tokens", self.config.token_capacity, scheduler)
        out.gauge("context_len", self.config.context_length, scheduler)
        out.counter("prompt_tokens_total", self.counters["prompt_tokens"], streaming)
        out.counter("generation_tokens_total", self.counters["generation_tokens"], streaming)
        out.counter("num_requests_total", self.counters["requests"], streaming)
        out.counter("num_aborted_requests_total", self.counters["aborted"], tokenizer)
        if self.config.speculative:
            out.counter("spec_verify_calls_total", self.counters["verify_calls"], tokenizer)
        buckets = list(zip([*_E2E_BUCKETS, math.inf], accumulate(self.e2e_counts)))
        out.histogram("e2e_request_latency_seconds", buckets, self.e2e_sum, streaming)
        return out.text()

    # ---- /_sim admin routes ----

    async def sim_faults(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.faults = Faults()
        elif request.method == "POST":
            try:
                self.faults.update(await _read_json(request), time.perf_counter())
            except (ValueError, TypeError) as exc:
                return _json({"error": str(exc)}, 400)
            except _RequestError as error:
                return _json(error.body, error.status)
        self._arm_crash_timer()
        self._wake_all()  # hang / slow changes apply to requests already running
        return _json(self.faults.as_dict())

    async def sim_requests(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", 0))
        keys = ("rid", "input_hash", "prompt_tokens", "received_at", "outcome")
        entries = [dict(zip(keys, entry)) for entry in self.request_log[since:]]
        return _json({"total": len(self.request_log), "requests": entries})

    async def sim_state(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        if request.method == "POST" and request.query.get("reset_occupancy"):
            self.occupancy.reset(now, self.running)
            self.peaks = {"running": self.running, "queued": len(self.waiting)}
        return _json(
            {
                "pid": os.getpid(),
                "running": self.running,
                "queued": len(self.waiting),
                "cap": self.cap,
                "uptime_s": now - self.started_at,
                "counters": self.counters,
                "peaks": self.peaks,
                "faults": self.faults.as_dict(),
                "occupancy": self.occupancy.report(now),
            }
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024 * 1024)
        app.router.add_route("POST", "/generate", self.generate)
        app.router.add_route("PUT", "/generate", self.generate)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self.health)
        app.router.add_get("/ready", self.ready)
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, self.server_info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_route("GET", "/flush_cache", self.flush_cache)
        app.router.add_route("POST", "/flush_cache", self.flush_cache)
        app.router.add_post("/abort_request", self.abort_request)
        app.router.add_get("/metrics", self.metrics)
        for method in ("GET", "POST", "DELETE"):
            app.router.add_route(method, "/_sim/faults", self.sim_faults)
        app.router.add_get("/_sim/requests", self.sim_requests)
        app.router.add_route("GET", "/_sim/state", self.sim_state)
        app.router.add_route("POST", "/_sim/state", self.sim_state)
        return app


# ---- helpers ----------------------------------------------------------------------------------------------

_TOP_LEVEL_TYPES: tuple[tuple[str, Callable[[Any], bool], tuple[str, tuple, str]], ...] = (
    ("text", lambda v: isinstance(v, (str, list)), ("string_type", (), "Input should be a valid string")),
    ("input_ids", lambda v: isinstance(v, list), ("list_type", (), "Input should be a valid list")),
    ("rid", lambda v: isinstance(v, (str, list)), ("string_type", (), "Input should be a valid string")),
    ("sampling_params", lambda v: isinstance(v, (dict, list)), ("dict_type", (), "Input should be a valid dictionary")),
    ("stream", lambda v: isinstance(v, bool), ("bool_type", (), "Input should be a valid boolean")),
    ("require_reasoning", lambda v: isinstance(v, bool), ("bool_type", (), "Input should be a valid boolean")),
    ("return_prompt_token_ids", lambda v: isinstance(v, bool), ("bool_type", (), "Input should be a valid boolean")),
)


def _e1_message(error_type: str, ctx: tuple, message: str, value: Any, loc: str | int = 0) -> str:
    """FastAPI's validation text as SGLang words it: `<str(exc)> <exc.errors()>` (§4 E1; wording approximate)."""
    error = {"type": error_type, "loc": ("body", loc), "msg": message, "input": value}
    if ctx:
        error["ctx"] = dict(ctx)
    return f"1 validation error:\n  {error}\n {[error]}"


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = _e1_message("json_invalid", (("error", str(exc).split(":")[0]),), "JSON decode error", {}, exc.pos)
        raise _RequestError(400, proto.e1_body(message)) from None


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _crash(reason: str) -> None:
    """A crashed SGLang server: every connection drops without a status line, later connects are refused."""
    print(f"simulator: injected crash ({reason}), exiting", file=sys.stderr, flush=True)
    os._exit(1)


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()
    raise asyncio.CancelledError  # nothing may be written on a dropped connection


def _redacted_argv() -> list[str]:
    argv = list(sys.argv[1:])
    for index, arg in enumerate(argv[:-1]):
        if arg == "--api-key":
            argv[index + 1] = "<redacted>"
    return argv


# ---- command line -----------------------------------------------------------------------------------------


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    defaults = SimConfig()
    parser = argparse.ArgumentParser(
        prog="python -m dagster_project.sglang.simulator", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--model-path", default=defaults.model_path)
    parser.add_argument("--served-model-name")
    parser.add_argument(
        "--tokenizer", help="tokenizer name or path (default: the project's built-in Qwen3.6 tokenizer)"
    )
    parser.add_argument(
        "--vocab-file", help="vocabulary sketch written by the fleet launcher (skips loading the tokenizer)"
    )
    parser.add_argument("--api-key")
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument(
        "--no-speculative", dest="speculative", action="store_false", help="serve as if launched without MTP"
    )
    parser.add_argument(
        "--spec-draft-tokens", "--speculative-num-draft-tokens", type=int, default=defaults.spec_draft_tokens
    )
    parser.add_argument("--reasoning-parser", default=defaults.reasoning_parser)
    parser.add_argument("--context-length", type=int, default=defaults.context_length)
    parser.add_argument("--token-capacity", type=int, default=defaults.token_capacity)
    parser.add_argument("--max-running-requests", type=int, default=defaults.max_running_requests)
    parser.add_argument(
        "--effective-max-running-requests",
        type=int,
        help="the real cap (e.g. set by the mamba pool); default: --max-running-requests",
    )
    parser.add_argument("--max-queued-requests", type=int)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--output-len", default=defaults.output_len, help="fixed:N | uniform:A:B | lognormal:MEDIAN:SIGMA"
    )
    parser.add_argument("--max-output-len", type=int, default=defaults.max_output_len)
    parser.add_argument(
        "--answer-fraction",
        type=_floats,
        default=defaults.answer_fraction,
        help="LOW,HIGH share of the output after </think>",
    )
    parser.add_argument(
        "--accept-probs",
        type=_floats,
        default=defaults.accept_probs,
        help="P(k drafts accepted) per verify pass, k=0..D-1",
    )
    parser.add_argument("--accept-decay-tokens", type=int, default=defaults.accept_decay_tokens)
    parser.add_argument("--ttft-s", type=float, default=defaults.ttft_s)
    parser.add_argument("--prefill-s-per-token", type=float, default=defaults.prefill_s_per_token)
    parser.add_argument("--decode-step-s", type=float, default=defaults.decode_step_s)
    parser.add_argument("--startup-s", type=float, default=defaults.startup_s)
    parser.add_argument("--health-latency-s", type=float, default=defaults.health_latency_s)
    parser.add_argument("--request-log-limit", type=int, default=defaults.request_log_limit)
    parser.add_argument(
        "--faults", type=orjson.loads, default={}, help="initial faults as JSON, e.g. '{\"hang\": true}'"
    )
    args = parser.parse_args(argv)
    config = SimConfig(**vars(args))
    if len(config.accept_probs) != config.spec_draft_tokens:
        parser.error(f"--accept-probs needs {config.spec_draft_tokens} values (one per possible accepted-draft count)")
    parse_length_distribution(config.output_len)
    return config


async def serve(config: SimConfig, vocab: SimVocab) -> None:
    simulator = Simulator(config, vocab)
    # handler_cancellation: a client that disconnects cancels its handler, as SGLang aborts its rid.
    runner = web.AppRunner(simulator.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096, reuse_address=True)
    await site.start()
    print(f"simulator ready on http://{config.host}:{config.port} (pid {os.getpid()})", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    vocab = (
        SimVocab.from_json(Path(config.vocab_file).read_bytes())
        if config.vocab_file
        else load_sim_vocab(config.tokenizer)
    )
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config, vocab))
    else:
        uvloop.run(serve(config, vocab))


if __name__ == "__main__":
    main()
