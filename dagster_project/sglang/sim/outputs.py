"""What a simulated server answers: output ids, text, finish reason and spec-decoding stats.

An answer is a deterministic function of `--seed`, the prompt ids and the sampling params, so every server
of a fleet answers a prompt the same way. Thinking prompts get a reasoning part, `\\n</think>\\n\\n` and an
answer; words are ordinary vocabulary tokens, so `text` is exactly the tokenizer's decoding of `output_ids`.
Spec stats come from simulated verify passes and obey every invariant `protocol.check_spec_stats` checks.
How long an answer takes is the scheduler's business (`sim.scheduler`), not this module's.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from dagster_project import tool_calls
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.model_identity import forced_token
from dagster_project.sglang.sim.config import SimConfig, SimVocab


class WordPool:
    """A long, fixed stream of word tokens in sentences; answers are slices of it at prompt-derived offsets.

    Slicing a prebuilt list keeps a 2,000-token answer at microseconds, which is what lets a simulator
    serve thousands of zero-latency requests per second. Sentences start with ` Word`, paragraphs with `Word`
    (no space after a newline), so the ids are the tokenizer's own encoding of their text.
    """

    SIZE = 1 << 16

    def __init__(self, vocab: SimVocab, seed: int):
        rng = random.Random(f"pool:{seed}")
        ids: list[int] = []
        comma, period = vocab.punctuation
        while len(ids) < self.SIZE:
            sentence = rng.choices(vocab.words, k=rng.randint(4, 16))
            starts_paragraph = not ids or ids[-1] in (vocab.paragraph, vocab.period_paragraph)
            sentence[0] = (vocab.openings if starts_paragraph else vocab.capitals)[sentence[0]]
            if len(sentence) > 8:
                sentence.insert(rng.randint(3, len(sentence) - 2), comma)
            ids += sentence
            ids.append(period)
            if rng.random() < 0.15:
                # A tokenizer that merges ".\n\n" into one token (Qwen3's) writes a paragraph's end as that token.
                if vocab.period_paragraph is not None:
                    ids[-1] = vocab.period_paragraph
                else:
                    ids.append(vocab.paragraph)
        # Stored twice over, so any slice of up to SIZE tokens is contiguous; `offsets` maps a token
        # position to its first character in `text`, so an answer's text is one string slice.
        self.ids = ids[: self.SIZE] * 2
        self.text = vocab.decode(self.ids)
        self.offsets = list(accumulate((len(vocab.texts[i]) for i in self.ids), initial=0))
        self.vocab = vocab
        # Any form of a word → the form that opens a part; punctuation there becomes a word instead.
        self.opening = {form: vocab.openings[word] for word in vocab.words for form in (word, vocab.capitals[word])}
        self.opening.update((form, form) for form in vocab.openings.values())
        self.punctuation = {*vocab.punctuation, vocab.paragraph, vocab.period_paragraph}

    def take(self, start: int, count: int) -> tuple[list[int], str]:
        start %= self.SIZE
        if count <= self.SIZE:
            end = start + count
            return self.ids[start:end], self.text[self.offsets[start] : self.offsets[end]]
        head_ids, head_text = self.take(start, self.SIZE)
        tail_ids, tail_text = self.take(start, count - self.SIZE)
        return head_ids + tail_ids, head_text + tail_text

    def part(self, start: int, count: int) -> tuple[list[int], str]:
        """`count` tokens written as a whole part (a reasoning or an answer): opening with a word without a
        leading space, and never ending in a paragraph break, which the chat template would trim."""
        ids, text = self.take(start, count)
        if count > 1 and ids[-1] in (self.vocab.paragraph, self.vocab.period_paragraph):
            ids, text = self.take(start - 1, count)  # ends at the sentence's period instead
        # A tokenizer that merges punctuation with the newlines after it (Qwen3's: ".\n", ",\n") would read the
        # part's last mark and the next part's newline as one token: such a part ends on a word.
        while count > 1 and self.vocab.period_paragraph is not None and ids[-1] in self.punctuation:
            start -= 1
            ids, text = self.take(start, count)
        if not ids:
            return ids, text
        texts = self.vocab.texts
        first = self.opening.get(ids[0]) or self.vocab.openings[self.vocab.words[start % len(self.vocab.words)]]
        return [first, *ids[1:]], texts[first] + text[len(texts[ids[0]]) :]


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


# ---- speculative decoding --------------------------------------------------------------------------------


def correct_drafts(histogram: Sequence[int]) -> int:
    """`spec_num_correct_drafts` of a histogram: index k counts the passes that accepted k drafts."""
    return sum(k * n for k, n in enumerate(histogram))


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


@dataclass
class SpecDraw:
    """The verify passes behind `tokens` output tokens: segments of precomputed draw pools."""

    verify: int
    histogram: list[int]
    segments: list[tuple[_DrawPool, int, int]]  # (pool, start, steps)
    no_drafts: bool = False  # MTP off: every token took its own pass

    @property
    def correct(self) -> int:
        return correct_drafts(self.histogram)

    def prefix(self, steps: int) -> tuple[int, list[int]]:
        """Tokens produced and histogram after the first `steps` passes (for a partial answer)."""
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


class AcceptModel:
    """Per-pass draft acceptance, piecewise constant over context buckets, degrading with context and with
    the batch size.

    Either decay mixes passes that accept nothing into the drafts' own distribution: half of them at
    `decay_tokens` of context, or at `decay_batch` running requests beyond the first.
    """

    BUCKET = 1024  # tokens of context that share one acceptance level
    LEVELS = 32

    def __init__(self, probs: Sequence[float], decay_tokens: int, seed: int, decay_batch: int = 0):
        if not probs or abs(sum(probs) - 1.0) > 1e-6 or min(probs) < 0:
            raise ValueError(f"accept_probs must be non-negative and sum to 1, got {list(probs)}")
        self.probs = tuple(probs)
        self.decay_tokens = decay_tokens
        self.decay_batch = decay_batch
        self._seed = seed
        self._pools: dict[int, _DrawPool] = {}  # built on first use: most servers see few acceptance levels

    def _level(self, context: int, batch: int) -> int:
        """How many of the `LEVELS` shares of passes accept nothing at this context and batch."""
        kept = 1.0  # share of passes that keep the drafts' own acceptance
        if self.decay_tokens:
            middle = (context // self.BUCKET + 0.5) * self.BUCKET
            kept *= self.decay_tokens / (middle + self.decay_tokens)
        if self.decay_batch:
            kept *= self.decay_batch / (max(0, batch - 1) + self.decay_batch)
        return round(self.LEVELS * (1 - kept))

    def mean_tokens_per_pass(self, context: int, batch: int) -> float:
        """The expected tokens one verify pass writes (accepted drafts plus the verified one) at this context
        and batch: the accept length the draws average to."""
        drafts = sum(k * p for k, p in enumerate(self.probs))
        return 1 + (1 - self._level(context, batch) / self.LEVELS) * drafts

    def _pool(self, context: int, batch: int) -> _DrawPool:
        level = self._level(context, batch)
        pool = self._pools.get(level)
        if pool is None:
            weight = level / self.LEVELS  # share of passes that accept nothing
            probs = [(1 - weight) * p for p in self.probs]
            probs[0] += weight
            pool = self._pools[level] = _DrawPool(probs, random.Random(f"accept:{self._seed}:{level}"))
        return pool

    def draw(self, prompt_tokens: int, tokens: int, rng: random.Random, batch: int = 1) -> SpecDraw:
        histogram = [0] * len(self.probs)
        segments = []
        verify = 0
        needed = tokens - 1  # the first token is sampled by the prefill pass
        context = prompt_tokens + 1
        while needed > 0:
            pool = self._pool(context, batch)
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


# ---- answers ---------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """A planned response: the output and how it ended."""

    output_ids: list[int]
    text: str
    finish_reason: dict
    spec: SpecDraw | None  # None: the server runs without speculative decoding
    stop_text: str = ""  # the stop token's text, shown only with no_stop_trim

    @property
    def decode_steps(self) -> int:
        """Forward passes after prefill: one per verify pass, or one per token after the first."""
        return self.spec.verify if self.spec is not None else max(0, len(self.output_ids) - 1)

    def prefix(self, steps: int | None) -> tuple[list[int], int, list[int]]:
        """Output ids, verify passes and histogram after `steps` decode steps (None: prefill not done)."""
        if steps is None:
            return [], 0, []
        if self.spec is None:
            return self.output_ids[: steps + 1], 0, []
        tokens, histogram = self.spec.prefix(steps)
        return self.output_ids[: min(tokens, len(self.output_ids))], steps, histogram


# The generation prompt's last tokens, where the think markers that open or close reasoning are looked for.
_GENERATION_PROMPT_TAIL = 6
# The share of tool calls the simulator writes after a sentence of text (the rest start with `<tool_call>`).
_TEXT_BEFORE_CALL_SHARE = 0.3


class OutputModel:
    def __init__(self, config: SimConfig, vocab: SimVocab):
        self.config = config
        self.vocab = vocab
        self.pool = WordPool(vocab, config.seed)
        self.lengths = parse_length_distribution(config.output_len)
        self.accept = AcceptModel(
            config.draft_accept_probs, config.accept_decay_tokens, config.seed, decay_batch=config.accept_decay_batch
        )
        self.eos = vocab.eos_ids[0]
        close = [vocab.newline, vocab.think_end, vocab.paragraph] if vocab.think_end is not None else []
        self.think_close = (close, vocab.decode(close))
        # A model whose generation prompt leaves the think block to it (Qwen3) opens it first: `<think>\n`.
        opens = [vocab.think_start, vocab.newline] if vocab.think_end is not None else []
        self.think_open = (opens, vocab.decode(opens)) if not vocab.prompt_opens_reasoning else ([], "")
        # The full tokenizer, only for tool calls (reading the tools, writing a call): loaded at start, so no
        # request stalls the server for the seconds it takes. Calls are written in Qwen3.6's form only, so only for
        # a model whose template writes them so (`TokenizerProfile.tool_calls_known`); another model's answers to
        # prompts with tools are text, as `calls_note` says.
        self._tokenizer: Any = None
        self.calls_note = ""
        if config.tool_call_share:
            from dagster_project.tokenizer import load_tokenizer, tokenizer_profile

            tokenizer = load_tokenizer(vocab.tokenizer)
            if tokenizer_profile(tokenizer).tool_calls_known:
                self._tokenizer = tokenizer
            else:
                self.calls_note = (
                    f"tool_call_share {config.tool_call_share} ignored: the chat template of {vocab.tokenizer} writes "
                    "tool calls in another form than Qwen3.6's <tool_call>, the only one the simulator writes"
                )

    def _tool_call(self, input_ids: list[int], prompt_hash: str, sample: int) -> tuple[list[int], str] | None:
        """The `<tool_call>` that answers this sample, if its prompt declares tools and it draws one."""
        rng = random.Random(f"{self.config.seed}:{prompt_hash}:{sample}:tool")  # the answers' own draws stay put
        if self._tokenizer is None or rng.random() >= self.config.tool_call_share:
            return None
        tools = tool_calls.declared_tools(self._tokenizer.decode(input_ids))
        if not tools:
            return None
        name = rng.choice(sorted(tools))
        arguments = {key: self._argument(rng) for key in tools[name]}
        text = tool_calls.render_call(name, arguments)
        if rng.random() < self.config.malformed_tool_call_share:
            text = text.replace("</function>\n", "")  # the model forgot to close the function
        if rng.random() < _TEXT_BEFORE_CALL_SHARE:
            # A sentence before the call, as the template renders a reply then its call: `text\n\n<tool_call>`.
            text = self.pool.part(rng.randrange(WordPool.SIZE), rng.randint(3, 12))[1] + "\n\n" + text
        # Encoded whole, so the ids are the tokenizer's own encoding of the text, boundaries included.
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        # Streamed and cut answers are decoded token by token from the sketch: it learns the call's tokens
        # (ASCII here, so each decodes on its own).
        for token in ids:
            self.vocab.texts.setdefault(token, self._tokenizer.decode([token]))
        return ids, text

    def _argument(self, rng: random.Random) -> Any:
        """One argument's value, of a JSON type a model writes: mostly words, else a number, a boolean, an array or
        an object (written as JSON, as the template's `tojson` renders them)."""
        words = self.pool.part(rng.randrange(WordPool.SIZE), rng.randint(1, 4))[1]
        kind = rng.choice(("string", "string", "string", "integer", "number", "boolean", "array", "object"))
        if kind == "integer":
            return rng.randint(-5, 5000)
        if kind == "number":
            return round(rng.uniform(0, 100), 2)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "array":
            return [rng.randint(0, 99) for _ in range(rng.randint(1, 3))]
        if kind == "object":
            return {"value": words, "count": rng.randint(1, 9)}
        return words

    def plan(
        self,
        input_ids: list[int],
        prompt_hash: str,
        params: Mapping[str, Any],
        max_new_tokens: int,
        sample: int = 0,
        *,
        batch: int = 1,
        empty: bool = False,
        truncate: bool = False,
        mtp_off: bool = False,
        nan: bool = False,
        bad: bool = False,
    ) -> Answer:
        """The answer to one sample, decoded in a batch of `batch` requests (its acceptance may depend on it);
        `empty`, `truncate`, `mtp_off`, `nan` and `bad` (the bad model's answer) are the injected faults that
        shape it."""
        rng = random.Random(f"{self.config.seed}:{prompt_hash}:{sample}")
        thinking = self._thinking(input_ids)
        # A logit_bias that forces a token (the served-model probe) is the sampler's, not the weights': a bad model
        # writes that token as a good one does, and answers every other request badly.
        if bad and forced_token(params) is None:
            return self._bad_answer(thinking, len(input_ids), rng, mtp_off, batch)
        natural = max(1, min(self.lengths(rng), self.config.max_output_len))
        natural = max(natural, int(params.get("min_new_tokens") or 0) + 1)
        call = None if empty else self._tool_call(input_ids, prompt_hash, sample)
        if call is not None:  # room for the call, its EOS and (thinking) a reasoning and its close
            natural = max(natural, len(call[0]) + (5 if thinking else 1))
        if empty:
            natural = 1
        cap = max_new_tokens
        if truncate and natural > 1:
            cap = min(cap, max(1, natural // 3))  # as if the KV pool clipped the request
        if params.get("ignore_eos"):
            natural = cap + 1  # the model keeps writing until the cap
        with_eos = natural <= cap
        ids, text = self._compose(rng, thinking, natural, natural if with_eos else cap, with_eos, call)
        if with_eos:
            finish, stop_text = proto.finish_stop(self.eos), self.vocab.texts[self.eos]
        else:
            finish, stop_text = proto.finish_length(cap), ""
        ids, text, finish, stop_text = self._apply_stops(ids, text, finish, stop_text, params)
        forced = forced_token(params)
        if forced is not None and forced in self.vocab.texts:  # a token the sketch can write: it comes first
            ids, finish, stop_text = self._forced(forced, ids, cap)
            text = self.vocab.decode(ids[:-1] if finish["type"] == "stop" else ids)
        if nan:
            # The scheduler overwrites the out-of-vocabulary id with EOS and reports the NaN stop string.
            ids = [*ids[:-1], self.eos]
            text, finish, stop_text = self.vocab.decode(ids[:-1]), proto.finish_stop(proto.NAN_STOP), ""
        return Answer(ids, text, finish, self._spec(len(input_ids), len(ids), rng, mtp_off, batch), stop_text)

    def _thinking(self, input_ids: list[int]) -> bool:
        """Whether the prompt asks for reasoning: the model's template reasons, the generation prompt did not close the
        think block (`<think>\n\n</think>\n\n`: thinking off) and, where the template opens it, opened it."""
        vocab = self.vocab
        if vocab.think_end is None:
            return False
        tail = input_ids[-_GENERATION_PROMPT_TAIL:]
        return vocab.think_end not in tail and (not vocab.prompt_opens_reasoning or vocab.think_start in tail)

    def bad_draw(self, prompt_hash: str, sample: int = 0) -> float:
        """The uniform draw that decides whether the bad model spoils this sample (`Faults.bad_answer`): the
        same on every server, and apart from the answer's own draws."""
        return random.Random(f"{self.config.seed}:{prompt_hash}:{sample}:bad").random()

    def _bad_answer(self, thinking: bool, prompt_tokens: int, rng: random.Random, mtp_off: bool, batch: int) -> Answer:
        """The seed's disaster as the historical rows were: empty reasoning closed at once, "OK.", the end token."""
        close, close_text = self.think_close if thinking else ([], "")
        answer = list(self.vocab.ok_answer)
        ids = [*close, *answer, self.eos]
        text = close_text + self.vocab.decode(answer)
        spec = self._spec(prompt_tokens, len(ids), rng, mtp_off, batch)
        return Answer(ids, text, proto.finish_stop(self.eos), spec, self.vocab.texts[self.eos])

    def _forced(self, token: int, ids: list[int], cap: int) -> tuple[list[int], dict, str]:
        """The answer when a large `logit_bias` forces `token` first: it ends there if it ends answers."""
        if token in self.vocab.eos_ids:
            return [token], proto.finish_stop(token), self.vocab.texts[token]
        ids = [token, *ids][:cap]
        if ids[-1] in self.vocab.eos_ids:
            return ids, proto.finish_stop(ids[-1]), self.vocab.texts[ids[-1]]
        return ids, proto.finish_length(cap), ""

    def _compose(
        self,
        rng: random.Random,
        thinking: bool,
        natural: int,
        count: int,
        with_eos: bool,
        call: tuple[list[int], str] | None = None,
    ) -> tuple[list[int], str]:
        """The first `count` tokens of an answer whose natural length, its EOS included, is `natural`; with a
        `call`, the answer after the reasoning is that tool call."""
        body = natural - 1
        parts: list[tuple[list[int], str]] = []
        if thinking and body >= 4 + len(self.think_open[0]):
            answer = len(call[0]) if call else max(1, round(body * rng.uniform(*self.config.answer_fraction)))
            reasoning = max(1, body - 3 - answer)  # an empty reasoning would render as `<think>\n\n</think>`
            answer = body - 3 - reasoning
            if self.think_open[0]:
                reasoning = max(1, reasoning - len(self.think_open[0]))
                answer = body - 3 - len(self.think_open[0]) - reasoning
                parts.append(self.think_open)
            parts.append(self.pool.part(rng.randrange(WordPool.SIZE), reasoning))
            parts.append(self.think_close)
            parts.append(call or self.pool.part(rng.randrange(WordPool.SIZE), answer))
        else:
            parts.append(call or self.pool.part(rng.randrange(WordPool.SIZE), body))
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
                texts.append(self.vocab.decode(part_ids[:room]))
        if with_eos and len(ids) < count:
            ids.append(self.eos)  # its text is the stop token: trimmed from `text`
        return ids, "".join(texts)

    def _apply_stops(
        self, ids: list[int], text: str, finish: dict, stop_text: str, params: Mapping[str, Any]
    ) -> tuple[list[int], str, dict, str]:
        """`stop_token_ids` and `stop` strings end the answer at their first occurrence; under `ignore_eos` no token
        ends it, a requested stop id no more than EOS (0.5.23's `_check_token_based_finish`)."""
        stop_ids = set() if params.get("ignore_eos") else set(params.get("stop_token_ids") or ())
        stops = params.get("stop") or ()
        if not stop_ids and not stops:
            return ids, text, finish, stop_text
        body = ids[:-1] if finish["type"] == "stop" else ids
        if not stop_ids.isdisjoint(body):
            index = min(body.index(token) for token in stop_ids if token in body)
            prefix, token = body[:index], body[index]
            return prefix + [token], self.vocab.decode(prefix), proto.finish_stop(token), self.vocab.texts[token]
        stops = [stops] if isinstance(stops, str) else stops
        found = [(text.find(s), s) for s in stops if s and s in text]
        if not found:
            return ids, text, finish, stop_text
        position, matched = min(found)
        # The server cuts output_ids after the token that completes the stop string.
        ends = list(accumulate(len(self.vocab.texts[i]) for i in body))
        last = bisect.bisect_left(ends, position + len(matched))
        return body[: last + 1], text[:position], proto.finish_stop(matched), matched

    def _spec(self, prompt_tokens: int, tokens: int, rng: random.Random, mtp_off: bool, batch: int) -> SpecDraw | None:
        if not self.config.speculative:
            return None
        if mtp_off:
            return SpecDraw(tokens, [tokens] if tokens else [], [], no_drafts=True)
        return self.accept.draw(prompt_tokens, tokens, rng, batch)
