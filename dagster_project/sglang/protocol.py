"""SGLang 0.5.23 native `/generate` protocol: the facts both ends of the wire share.

The client builds requests and classifies errors with it, the simulator produces responses and errors
with it, and tests and pipeline gates validate responses against it. Message texts were checked against
the sglang 0.5.23 wheel.
"""

from __future__ import annotations

import hashlib
import math
import re
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128  # an absent max_new_tokens means 128 on /generate
UNCAPPED_MAX_NEW_TOKENS = 1 << 30  # an explicit null means "no cap", clipped to the context
TOP_K_ALL = 1 << 30
SPEC_DRAFT_TOKENS = 4  # D of the recommended NEXTN 3/1/4 configuration

# Closed sampling_params schema (api_types.py:1256), in the contract's order: the order is part of
# the E2 "unknown field" message.
_I64, _F64, _BOOL, _STR, _STR_OR_LIST, _I64_LIST, _F64_MAP, _ANY = range(8)
SAMPLING_TYPES: dict[str, int] = {
    "max_new_tokens": _I64,
    "stop": _STR_OR_LIST,
    "stop_token_ids": _I64_LIST,
    "stop_regex": _STR_OR_LIST,
    "temperature": _F64,
    "top_p": _F64,
    "top_k": _I64,
    "min_p": _F64,
    "frequency_penalty": _F64,
    "presence_penalty": _F64,
    "repetition_penalty": _F64,
    "min_new_tokens": _I64,
    "n": _I64,
    "json_schema": _STR,
    "regex": _STR,
    "ebnf": _STR,
    "structural_tag": _STR,
    "ignore_eos": _BOOL,
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "no_stop_trim": _BOOL,
    "stream_interval": _I64,
    "logit_bias": _F64_MAP,
    "sampling_seed": _I64,
    "custom_params": _ANY,
    "beam_width": _I64,
    "watermark": _ANY,
    "choice": _ANY,
}
SAMPLING_KEYS: tuple[str, ...] = tuple(SAMPLING_TYPES)

# The keys the pipeline always sends, so no server default can leak into the data: /generate ignores the
# model's generation_config and falls back to its own defaults (temperature 1.0, max_new_tokens 128).
EXPLICIT_SAMPLING_KEYS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "repetition_penalty",
    "skip_special_tokens",
    "no_stop_trim",
)

# ---- error bodies ------------------------------------------------------------------------------------

MSG_NO_INPUT = "Either text, input_ids or input_embeds should be provided."
MSG_EMPTY_INPUT_IDS = "input_ids cannot be empty."
MSG_QUEUE_FULL = "The request queue is full."
MSG_FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
MSG_FLUSH_FAILED = "Flush cache failed.\n"
UNAUTHORIZED_BODY = {"error": "Unauthorized"}


def msg_input_too_long(input_tokens: int, context_length: int) -> str:
    return f"The input ({input_tokens} tokens) is longer than the model's context length ({context_length} tokens)."


def msg_total_too_long(context_length: int, input_tokens: int, max_new_tokens: int) -> str:
    return (
        f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
        f"You requested a total of {input_tokens + max_new_tokens} tokens: {input_tokens} tokens from the input "
        f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the "
        "input messages or the completion to fit within the limit."
    )


def msg_input_exceeds_max(input_tokens: int, max_input_tokens: int) -> str:
    return (
        f"Input length ({input_tokens} tokens) exceeds the maximum allowed length ({max_input_tokens} tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


def msg_duplicate_rid(rid: str) -> str:
    return f"Duplicate request ID detected: {rid}"


# A context overflow is a property of the request, not of the server: retrying cannot help.
CONTEXT_LENGTH_MESSAGE = re.compile(
    r"is longer than the model's context length"
    r"|Requested token count exceeds the model's maximum context length"
    r"|exceeds the maximum allowed length"
)


def e1_body(message: str) -> dict:
    """FastAPI request validation (malformed JSON, wrong field types), rewritten to 400."""
    return {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}


def e2_body(message: str) -> dict:
    """`/generate` contract violation: `error` is a plain string."""
    return {"error": message}


def e3_body(message: str) -> dict:
    """`/generate` ValueError (length checks, duplicate rid, sampling values)."""
    return {"error": {"message": message}}


def e4_body(status: int, detail: str) -> dict:
    """HTTPException, e.g. 503 queue full."""
    return {"object": "error", "message": detail, "type": str(status), "param": None, "code": status}


# ---- sampling_params: contract (E2) and value checks (E3) ------------------------------------------


class ContractError(ValueError):
    """A `sampling_params` value the closed schema rejects; the text is the server's E2 message."""


def _unexpected(value: Any) -> str:
    """serde's display of an unexpected JSON value, as the server words it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def _invalid_type(value: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_unexpected(value)}, expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_value(kind: int, value: Any) -> None:
    if kind == _I64:
        if not _is_int(value):
            raise _invalid_type(value, "i64")
    elif kind == _F64:
        if not _is_number(value):
            raise _invalid_type(value, "f64")
    elif kind == _BOOL:
        if not isinstance(value, bool):
            raise _invalid_type(value, "a boolean")
    elif kind == _STR:
        if not isinstance(value, str):
            raise _invalid_type(value, "a string")
    elif kind == _STR_OR_LIST:
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, str):
                    raise _invalid_type(item, "a string")
        elif not isinstance(value, str):
            raise _invalid_type(value, "a value or an array of values for StringOrList")
    elif kind == _I64_LIST:
        if not isinstance(value, list):
            raise _invalid_type(value, "a sequence")
        for item in value:
            if not _is_int(item):
                raise _invalid_type(item, "i64")
    elif kind == _F64_MAP:
        if not isinstance(value, dict):
            raise _invalid_type(value, "a map")
        for item in value.values():
            if not _is_number(item):
                raise _invalid_type(item, "f64")


def check_sampling_contract(params: Any) -> None:
    """Raise `ContractError` with the server's E2 text if `params` breaks the closed schema.

    `null` is accepted for every key (it means the default, or no cap for max_new_tokens).
    """
    if not isinstance(params, dict):
        raise _invalid_type(params, "struct SamplingParams")
    for key, value in params.items():
        kind = SAMPLING_TYPES.get(key)
        if kind is None:
            listed = ", ".join(f"`{name}`" for name in SAMPLING_KEYS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
        if value is not None:
            _check_value(kind, value)


def _or_default(params: Mapping[str, Any], key: str, default: Any) -> Any:
    value = params.get(key)
    return default if value is None else value


def check_sampling_values(params: Mapping[str, Any], vocab_size: int) -> None:
    """Raise `ValueError` with the server's E3 text for out-of-range values (SamplingParams.verify)."""
    temperature = float(_or_default(params, "temperature", 1.0))
    top_k = int(_or_default(params, "top_k", -1))
    if 0 <= temperature < 1e-6:  # greedy: the server forces top_k to 1 before verifying
        temperature, top_k = 1.0, 1
    if top_k == -1:
        top_k = TOP_K_ALL
    top_p = float(_or_default(params, "top_p", 1.0))
    min_p = float(_or_default(params, "min_p", 0.0))
    frequency_penalty = float(_or_default(params, "frequency_penalty", 0.0))
    presence_penalty = float(_or_default(params, "presence_penalty", 0.0))
    repetition_penalty = float(_or_default(params, "repetition_penalty", 1.0))
    min_new_tokens = int(_or_default(params, "min_new_tokens", 0))
    max_new_tokens = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not math.isfinite(temperature) or temperature < 0.0:
        raise ValueError(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1:
        raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if not -2.0 <= frequency_penalty <= 2.0:
        raise ValueError(f"frequency_penalty must be in [-2, 2], got {frequency_penalty}.")
    if not -2.0 <= presence_penalty <= 2.0:
        raise ValueError(f"presence_penalty must be in [-2, 2], got {presence_penalty}.")
    if not 0.0 < repetition_penalty <= 2.0:
        raise ValueError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition_penalty}.")
    if min_new_tokens < 0:
        raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {min_new_tokens}.")
    if max_new_tokens is not None:
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
        if min_new_tokens > max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens({max_new_tokens})], got {min_new_tokens}.")
    for token_id in params.get("logit_bias") or {}:
        if not 0 <= int(token_id) < vocab_size:
            raise ValueError(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")
    if sum(params.get(key) is not None for key in ("json_schema", "regex", "ebnf")) > 1:
        raise ValueError("Only one of regex, json_schema, or ebnf can be set.")


def sampling_params(
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 0.95,
    top_k: int = 20,
    min_p: float = 0.0,
    presence_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    skip_special_tokens: bool = False,
    no_stop_trim: bool = False,
    **extra: Any,
) -> dict:
    """Every sampling key explicit (`/generate` applies no generation_config), checked like the server.

    Defaults are the Qwen3.6 model card's thinking-mode settings. `extra` takes any other key of the
    closed schema. Raises `ContractError` / `ValueError` with the text the server would answer.
    """
    params = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "presence_penalty": presence_penalty,
        "repetition_penalty": repetition_penalty,
        "skip_special_tokens": skip_special_tokens,
        "no_stop_trim": no_stop_trim,
        **extra,
    }
    # Python ints are valid f64 on the wire, but floats are not valid i64: normalize the float keys so
    # that `temperature=1` is sent as 1.0 like every other client does.
    for key, value in params.items():
        if SAMPLING_TYPES.get(key) == _F64 and _is_int(value):
            params[key] = float(value)
    check_sampling_contract(params)
    check_sampling_values(params, vocab_size=1 << 31)
    return params


# ---- responses ---------------------------------------------------------------------------------------


# What the scheduler reports when the sampler drew an id outside the vocabulary: it looks like a normal stop, with
# the last output id overwritten by EOS, but the answer is garbage and must be treated as a failed request.
NAN_STOP = "NaN happened"


def finish_stop(matched: int | str) -> dict:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict:
    return {"type": "length", "length": length}


def finish_abort(message: str = "Aborted", status_code: int | None = None, err_type: str | None = None) -> dict:
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


SPEC_KEYS = (
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)
# Insertion order of meta_info keys; optional keys keep their place relative to the others.
META_KEY_ORDER = (
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "storage_prefetch_wait",  # this and the next with --enable-metrics: seconds waiting on a hierarchical cache
    "storage_staging_wait",
    "forward_entry_time",
    "prefill_finished_time",
    "queue_time",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "weight_versions",
    "cached_tokens_details",
    "dp_rank",
    "e2e_latency",
    *SPEC_KEYS,
    "request_received_ts",
    "first_token_latency",
    "api_server_dispatch_finish_ts",
    "request_finished_ts",
    "decode_throughput",
    "response_sent_to_client_ts",
)
_ALWAYS_META = (
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "cached_tokens_details",
    "dp_rank",
)


def check_spec_stats(meta: Mapping[str, Any], spec_draft_tokens: int = SPEC_DRAFT_TOKENS) -> list[str]:
    """Violations of the spec-decoding invariants in `meta_info` (empty when they hold or no stats are present)."""
    if "spec_verify_ct" not in meta:
        return []
    problems = []
    completion = meta["completion_tokens"]
    verify = meta["spec_verify_ct"]
    correct = meta["spec_num_correct_drafts"]
    hist = meta.get("spec_correct_drafts_histogram", [])
    if verify <= 0:
        problems.append(f"spec stats present with spec_verify_ct={verify}")
        return problems
    if sum(hist) != verify:
        problems.append(f"sum(histogram)={sum(hist)} != spec_verify_ct={verify}")
    if sum(i * n for i, n in enumerate(hist)) != correct:
        problems.append(f"sum(i*hist[i]) != spec_num_correct_drafts={correct}")
    if len(hist) > spec_draft_tokens:
        problems.append(f"len(histogram)={len(hist)} > D={spec_draft_tokens}")
    if meta["spec_num_proposed_drafts"] != verify * (spec_draft_tokens - 1):
        problems.append(f"spec_num_proposed_drafts != spec_verify_ct*(D-1)={verify * (spec_draft_tokens - 1)}")
    if completion > 1 + correct + verify:
        problems.append(f"completion_tokens={completion} > 1 + correct + verify_ct={1 + correct + verify}")
    if meta["spec_accept_length"] != completion / verify:
        problems.append(
            f"spec_accept_length={meta['spec_accept_length']} != completion/verify_ct={completion / verify}"
        )
    proposed = meta["spec_num_proposed_drafts"]
    if proposed and meta["spec_accept_rate"] != correct / proposed:
        problems.append(f"spec_accept_rate={meta['spec_accept_rate']} != correct/proposed={correct / proposed}")
    return problems


def check_generate_response(
    body: Any,
    *,
    input_ids: Sequence[int] | None = None,
    sampling: Mapping[str, Any] | None = None,
    spec_draft_tokens: int | None = SPEC_DRAFT_TOKENS,
    eos_ids: Sequence[int] = (),
) -> list[str]:
    """Violations of the response contract in one non-streamed `/generate` response object (empty list = valid).

    `spec_draft_tokens=None` asserts a server launched without speculative decoding (no spec keys).
    `eos_ids` lets a token stop be checked against the model's EOS ids.
    """
    problems: list[str] = []
    if not isinstance(body, dict):
        return [f"response is {type(body).__name__}, not an object"]
    keys = list(body)
    if keys[:3] != ["text", "output_ids", "meta_info"] or set(keys) - {
        "text",
        "output_ids",
        "meta_info",
        "prompt_token_ids",
    }:
        problems.append(f"top-level keys {keys}")
    text, output_ids, meta = body.get("text"), body.get("output_ids"), body.get("meta_info")
    if not isinstance(text, str) or not isinstance(output_ids, list) or not isinstance(meta, dict):
        return problems + ["text/output_ids/meta_info have wrong types"]
    missing = [key for key in _ALWAYS_META if key not in meta]
    if missing:
        return problems + [f"meta_info lacks {missing}"]
    order = [key for key in meta if key in META_KEY_ORDER]
    if order != sorted(order, key=META_KEY_ORDER.index):
        problems.append(f"meta_info key order {list(meta)}")
    unknown = [key for key in meta if key not in META_KEY_ORDER]
    if unknown:
        problems.append(f"meta_info has unexpected keys {unknown}")
    finish = meta["finish_reason"]
    finished = finish is not None
    if meta["completion_tokens"] != len(output_ids):
        problems.append(f"completion_tokens={meta['completion_tokens']} != len(output_ids)={len(output_ids)}")
    if input_ids is not None and meta["prompt_tokens"] != len(input_ids):
        problems.append(f"prompt_tokens={meta['prompt_tokens']} != len(input_ids)={len(input_ids)}")
    problems += _check_finish_reason(finish, output_ids, sampling, eos_ids)
    if finished:
        for key in ("weight_versions", "e2e_latency"):
            if key not in meta:
                problems.append(f"finished response lacks {key}")
        if meta.get("weight_versions") not in (
            None,
            [{"version": meta["weight_version"], "start": 0, "end": meta["completion_tokens"]}],
        ):
            problems.append(f"weight_versions {meta.get('weight_versions')}")
    present_spec = [key for key in SPEC_KEYS if key in meta]
    if present_spec and (not finished or spec_draft_tokens is None):
        problems.append(f"spec keys {present_spec} on an unfinished response or a server without spec")
    if spec_draft_tokens is not None:
        problems += check_spec_stats(meta, spec_draft_tokens)
    if meta["cached_tokens"] > 0 and meta["cached_tokens_details"] is None:
        problems.append("cached_tokens > 0 without cached_tokens_details")
    return problems


def _check_finish_reason(
    finish: Any, output_ids: list[int], sampling: Mapping[str, Any] | None, eos_ids: Sequence[int]
) -> list[str]:
    if finish is None:
        return []
    if not isinstance(finish, dict):
        return [f"finish_reason {finish!r} is not an object"]
    kind = finish.get("type")
    if kind == "stop":
        if list(finish) != ["type", "matched"]:
            return [f"stop finish_reason keys {list(finish)}"]
        matched = finish["matched"]
        if not isinstance(matched, int):
            return []
        if not output_ids or output_ids[-1] != matched:
            return [f"stop on token {matched} but output_ids do not end with it"]
        stop_ids = set(eos_ids) | set((sampling or {}).get("stop_token_ids") or ())
        if eos_ids and matched not in stop_ids:
            return [f"stop on token {matched}, which is neither an EOS id nor a requested stop id"]
        return []
    if kind == "length":
        if list(finish) != ["type", "length"]:
            return [f"length finish_reason keys {list(finish)}"]
        problems = []
        if len(output_ids) != finish["length"]:
            problems.append(f"length stop at {finish['length']} but {len(output_ids)} output ids")
        requested = (sampling or {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if requested is not None and finish["length"] > requested:
            problems.append(f"length {finish['length']} above max_new_tokens {requested}")
        short = length_stop_short_of_budget(finish, output_ids, sampling)
        if short:
            problems.append(short)
        return problems
    if kind == "abort":
        if list(finish) != ["type", "message", "status_code", "err_type"]:
            return [f"abort finish_reason keys {list(finish)}"]
        return []
    return [f"unknown finish_reason type {kind!r}"]


def length_stop_short_of_budget(
    finish: Mapping[str, Any], output_ids: Sequence[int], sampling: Mapping[str, Any] | None
) -> str | None:
    """Why a `length` stop is not the request's: it ended short of the `max_new_tokens` it asked for (None when it
    is not a length stop, or it reached the budget, or the request set none).

    SGLang reports a length stop at the effective `max_new_tokens` (section 1.4 of the protocol notes) and refuses
    with 400 a request whose prompt and budget exceed the context, so a length stop short of the budget means the
    server clipped it on its own: a KV pool smaller than the request (which preflight rules out on a healthy
    server), or a fault. Its answer is a fragment, not an answer at the budget the run asked for."""
    if finish.get("type") != "length":
        return None
    requested = (sampling or {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if requested is None or len(output_ids) >= requested:
        return None
    return f"length stop after {len(output_ids)} tokens, short of the request's max_new_tokens {requested}"


def input_hash(input_ids: Sequence[int]) -> str:
    """A short, stable fingerprint of a prompt, used by the simulator's request log."""
    return hashlib.blake2b(array("q", input_ids).tobytes(), digest_size=8).hexdigest()


# ---- /metrics -------------------------------------------------------------------------------------------

# HELP texts of the metrics the simulator exposes (documentation strings in sglang 0.5.23's metrics_collector).
METRIC_HELP = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "cache_hit_rate": "The prefix cache hit rate.",
    "token_usage": "The token usage.",
    "full_token_usage": "The token usage for full attention layers.",
    "mamba_usage": "The token usage for Mamba layers.",
    "num_used_tokens": "The number of used tokens.",
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    "spec_accept_rate": "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
    "spec_num_steps": "Currently active speculative_num_steps.",
    "spec_num_draft_tokens": "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
    "num_retracted_reqs": "The number of retracted requests.",
    "num_retracted_requests_total": "Total number of retracted requests.",
    "new_token_ratio": "The new token ratio.",
    "max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "context_len": "Maximum context length.",
    "prompt_tokens_total": "Number of prefill tokens processed.",
    "generation_tokens_total": "Number of generation tokens processed.",
    "num_requests_total": "Number of requests processed.",
    "num_aborted_requests_total": "Number of requests aborted.",
    "spec_verify_calls_total": "Number of speculative decoding verification calls.",
    "e2e_request_latency_seconds": "Histogram of End-to-end request latency in seconds",
}


# The server's live load: requests it is running and requests waiting in its queue, whoever sent them.
RUNNING_REQS = "sglang:num_running_reqs"
QUEUED_REQS = "sglang:num_queue_reqs"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus exposition text → {sample name: value summed over its label sets} (e.g. across DP ranks).

    Sample names are the exposed ones (`sglang:generation_tokens_total`, `..._bucket`), not the family names
    the parser strips suffixes from. Raises `ValueError` on text that is not the Prometheus format.
    """
    from prometheus_client.parser import text_string_to_metric_families  # only where metrics are read

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def reported_load(metrics: Mapping[str, float]) -> int | None:
    """Running + queued requests a parsed `/metrics` reports; None when the server does not export them."""
    if RUNNING_REQS not in metrics or QUEUED_REQS not in metrics:
        return None
    return round(metrics[RUNNING_REQS] + metrics[QUEUED_REQS])
