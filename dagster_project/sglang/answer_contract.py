"""The answer contract: what a finished `/generate` answer must be before anything counts it as an answer.

A server (or a proxy in front of it) can answer HTTP 200 with a well-formed body that is still not an answer to the
request: more output ids than the request's `max_new_tokens`, the end-of-turn id in the middle of the answer, a stop
that does not end the ids, ids outside the served vocabulary, a length stop short of the budget, the "NaN happened"
stop, or a body far larger than any answer could be. Each such answer is a fault of its server: the client raises it
as an `SGLangError` of the breach's kind (retryable), so the dispatcher sends the request elsewhere and counts the
breach on the server, `dflash tune` records it as a failed request, and no row, rate, accept length or tuning figure
is ever made of it. Every sender goes through `SGLangClient.generate`, which applies `breach` to every answer.

The server's `text` is never trusted: what the pipeline stores is `answer_text`, the decoding of the checked ids
(SGLang's `text` is their decoding with the matched stop token trimmed, so nothing is lost).

No aiohttp here: `dflash status` reads the breach descriptions without the client.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster_project.sglang.protocol import (
    DEFAULT_MAX_NEW_TOKENS,
    NAN_STOP,
    UNCAPPED_MAX_NEW_TOKENS,
    length_stop_short_of_budget,
)

# The breaches, each an error kind of the client (retryable: the server is at fault, not the request).
OVER_BUDGET = "over_budget"
END_MID_ANSWER = "end_mid_answer"
STOP_NOT_AT_END = "stop_not_at_end"
ANSWER_OUT_OF_VOCAB = "answer_out_of_vocab"
SAMPLING_FAILED = "sampling_failed"
CUT_SHORT = "cut_short"
OVERSIZED_BODY = "oversized_body"

# What each breach is, as the operator reads it ("11 answers broke the contract: end-of-turn mid-answer 11").
BREACHES: dict[str, str] = {
    OVER_BUDGET: "more output ids than max_new_tokens",
    END_MID_ANSWER: "end-of-turn mid-answer",
    STOP_NOT_AT_END: "a stop that does not end the ids",
    ANSWER_OUT_OF_VOCAB: "ids outside the served vocabulary",
    SAMPLING_FAILED: "NaN happened",
    CUT_SHORT: "a length stop short of max_new_tokens",
    OVERSIZED_BODY: "a body larger than any answer",
}
# Breaches a healthy server of the job's model never makes: the dispatcher sets a server aside after a few
# (`ANSWER_OUT_OF_VOCAB` is another model's answer and sets it aside at once; NaN and a short length stop happen on a
# healthy server under memory pressure, so only a run of them in a row does).
MALFORMED_ANSWER_KINDS = frozenset({OVER_BUDGET, END_MID_ANSWER, STOP_NOT_AT_END, OVERSIZED_BODY})

# A body bound far above any answer: per requested token its id (at most 7 digits and a comma) and its text
# (JSON-escaped, a few dozen bytes at most), plus the meta_info. A body past it is refused unread.
_BODY_BYTES_PER_TOKEN = 256
_BODY_BYTES_BASE = 1 << 20
# A request without a cap runs to the context; no context SGLang serves reaches this.
_CONTEXT_BOUND = 1 << 20


def body_limit(sampling_params: Mapping[str, Any] | None) -> int:
    """The most bytes an answer to a request of these sampling params may take (several times the largest legal
    answer's)."""
    tokens = requested_tokens(sampling_params)
    tokens = _CONTEXT_BOUND if tokens is None or tokens >= UNCAPPED_MAX_NEW_TOKENS else tokens
    return _BODY_BYTES_BASE + _BODY_BYTES_PER_TOKEN * tokens


def requested_tokens(sampling_params: Mapping[str, Any] | None) -> int | None:
    """The request's `max_new_tokens` as the server applies it (absent: 128; null: no cap, None; no params known:
    None)."""
    if sampling_params is None:
        return None
    return sampling_params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)


@dataclass(frozen=True)
class Served:
    """What the contract knows of the served model: its vocabulary and the ids that end an answer."""

    vocab_size: int | None = None
    end_ids: frozenset[int] = frozenset()


UNKNOWN = Served()  # nothing known of the served model: only the request bounds its answers


@dataclass(frozen=True)
class Breach:
    """One broken rule of an answer: its kind (`BREACHES`) and what was found."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{BREACHES[self.kind]}: {self.detail}"


def out_of_vocab(ids: Sequence[int], vocab_size: int) -> str | None:
    """Where `ids` leave [0, vocab_size), or None when every id lies in it."""
    for position, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            return f"id {token} at position {position} lies outside the vocabulary [0, {vocab_size:,})"
    return None


def breach(
    output_ids: Sequence[int],
    finish: Mapping[str, Any],
    sampling_params: Mapping[str, Any] | None,
    served: Served = UNKNOWN,
) -> Breach | None:
    """The first rule a finished answer (`finish` type stop or length) breaks, or None when it keeps them all.

    * at most the request's `max_new_tokens` output ids;
    * every id inside the served vocabulary;
    * an end id (the served model's end-of-turn, the request's `stop_token_ids`, the id a stop matched) only as the
      last id, unless the request set `ignore_eos` (then the model's end id may be written anywhere);
    * a stop on a token ends the ids with that token (a stop on a string may end anywhere: SGLang trims only `text`);
    * not the "NaN happened" stop (the sampler drew an id outside the vocabulary and overwrote the last id);
    * a length stop only at the request's `max_new_tokens`.
    """
    requested = requested_tokens(sampling_params)
    if requested is not None and len(output_ids) > requested:
        return Breach(OVER_BUDGET, f"{len(output_ids):,} output ids for a request of max_new_tokens {requested:,}")
    if served.vocab_size is not None:
        where = out_of_vocab(output_ids, served.vocab_size)
        if where is not None:
            return Breach(ANSWER_OUT_OF_VOCAB, f"the answer's {where}: not an answer of the served model")
    matched = finish.get("matched")
    if finish.get("type") == "stop" and matched == NAN_STOP:
        return Breach(
            SAMPLING_FAILED,
            f"finish_reason matched {NAN_STOP!r}: the sampler drew an id outside the vocabulary and the server "
            "overwrote the last output id; the answer is not usable",
        )
    if finish.get("type") == "stop" and isinstance(matched, int) and (not output_ids or output_ids[-1] != matched):
        last = output_ids[-1] if output_ids else "nothing"
        return Breach(STOP_NOT_AT_END, f"finish_reason stop on id {matched} but the ids end with {last}")
    found = _end_mid_answer(output_ids, finish, sampling_params, served)
    if found is not None:
        return found
    short = sampling_params is not None and length_stop_short_of_budget(finish, output_ids, sampling_params)
    if short:
        return Breach(
            CUT_SHORT,
            f"{short}: the server cut the answer off on its own (its KV pool, or a fault); the fragment is not an "
            "answer",
        )
    return None


def _end_mid_answer(
    output_ids: Sequence[int],
    finish: Mapping[str, Any],
    sampling_params: Mapping[str, Any] | None,
    served: Served,
) -> Breach | None:
    params = sampling_params or {}
    end_ids = set(params.get("stop_token_ids") or ())
    if not params.get("ignore_eos"):
        end_ids |= served.end_ids
    if isinstance(finish.get("matched"), int):
        end_ids.add(finish["matched"])
    if not end_ids:
        return None
    for position in range(len(output_ids) - 1):
        if output_ids[position] in end_ids:
            return Breach(
                END_MID_ANSWER,
                f"end id {output_ids[position]} at position {position} of {len(output_ids)} output ids",
            )
    return None


def answer_text(decode: Callable[[list[int]], str], output_ids: Sequence[int], finish: Mapping[str, Any]) -> str:
    """The answer's text from its checked ids, as SGLang words it: the decoding, the matched stop token trimmed."""
    ids = list(output_ids)
    if finish.get("type") == "stop" and isinstance(finish.get("matched"), int) and ids:
        ids = ids[:-1]
    return decode(ids)


def describe(counts: Mapping[str, int]) -> str:
    """`{kind: count}` of breaches as the operator reads them: "end-of-turn mid-answer 11, ..."."""
    return ", ".join(f"{BREACHES.get(kind, kind)} {count}" for kind, count in counts.items())


def breaches_of(errors: Mapping[str, int], kinds: Collection[str] = tuple(BREACHES)) -> dict[str, int]:
    """The breach counts among a server's error counts (kind → count), in `BREACHES`' order."""
    return {kind: int(errors[kind]) for kind in kinds if errors.get(kind)}
