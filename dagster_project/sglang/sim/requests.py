"""The `/generate` request contract: what is checked, in the server's order, and the error shapes.

Stage A checks the request types (E1), stage B the closed `sampling_params` schema (E2), stage C the
prompt against the model and the server (E3). A full queue is a 503 with the E4 shape.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.config import SimConfig


class RequestError(Exception):
    """A request the server refuses: its HTTP status and JSON body."""

    def __init__(self, status: int, body: dict):
        self.status, self.body = status, body


def queue_full() -> RequestError:
    return RequestError(503, proto.e4_body(503, proto.MSG_QUEUE_FULL))


@dataclass(frozen=True, slots=True)
class GenerateItem:
    """One prompt of a `/generate` body (a batch has several), with the options that shape its response."""

    rid: str
    prompt: list[int] | str  # input_ids, or text to tokenize
    params: dict
    require_reasoning: bool
    return_prompt_token_ids: bool


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = _e1_message("json_invalid", (("error", str(exc).split(":")[0]),), "JSON decode error", {}, exc.pos)
        raise RequestError(400, proto.e1_body(message)) from None


def parse_generate(body: Any) -> list[GenerateItem]:
    """Stages A and B: request types (E1), then the sampling_params contract (E2)."""
    if not isinstance(body, dict):
        raise RequestError(
            400, proto.e1_body(_e1_message("model_attributes_type", (), "Input should be a valid dictionary", body))
        )
    for name, check, expected in _TOP_LEVEL_TYPES:
        if body.get(name) is not None and not check(body[name]):
            raise RequestError(400, proto.e1_body(_e1_message(*expected, body[name], loc=name)))
    prompts: list[Any]
    input_ids = body.get("input_ids")
    if input_ids is not None:
        batched = bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if batched else [input_ids]
        for prompt in prompts:
            tokens = prompt if isinstance(prompt, list) else [prompt]
            if set(map(type, tokens)) - {int}:  # one C-level pass; the slow path finds the culprit
                culprit = next(token for token in tokens if not proto._is_int(token))
                raise RequestError(400, proto.e2_body(str(proto._invalid_type(culprit, "i32"))))
    elif body.get("text") is not None:
        batched = isinstance(body["text"], list)
        prompts = body["text"] if batched else [body["text"]]
    else:
        raise RequestError(400, proto.e3_body(proto.MSG_NO_INPUT))
    params = body.get("sampling_params")
    params_list = params if isinstance(params, list) else [params or {}] * len(prompts)
    for item in params_list:
        try:
            proto.check_sampling_contract(item)
        except proto.ContractError as exc:
            raise RequestError(400, proto.e2_body(str(exc))) from None
    if len(params_list) != len(prompts):
        raise RequestError(400, proto.e3_body("The length of sampling_params and the batch size mismatch."))
    rid = body.get("rid")
    if batched:
        # A string rid is the batch's prefix: item i gets `<rid>_<i>`.
        rids = (
            rid if isinstance(rid, list) else [f"{rid}_{i}" if rid else uuid.uuid4().hex for i in range(len(prompts))]
        )
        if len(rids) != len(prompts):
            raise RequestError(
                400, proto.e3_body("The specified rids length mismatch with the batch_size for batch processing.")
            )
    else:
        rids = [(rid if isinstance(rid, str) else (rid or [None])[0]) or uuid.uuid4().hex]
    require_reasoning = bool(body.get("require_reasoning"))
    return_prompt_token_ids = bool(body.get("return_prompt_token_ids"))
    return [
        GenerateItem(r, p, s, require_reasoning, return_prompt_token_ids) for r, p, s in zip(rids, prompts, params_list)
    ]


def check_request(input_ids: list[int], params: dict, rid: str, config: SimConfig, in_flight: Container[str]) -> int:
    """Stage C (E3), in the server's order; returns the effective max_new_tokens."""
    if not input_ids:
        raise RequestError(400, proto.e3_body(proto.MSG_EMPTY_INPUT_IDS))
    prompt_tokens = len(input_ids)
    counted = prompt_tokens + config.reserved_prompt_tokens  # EAGLE keeps room for its drafts in every prompt
    context = config.context_length
    if counted >= context:
        raise RequestError(400, proto.e3_body(proto.msg_input_too_long(counted, context)))
    requested = params.get("max_new_tokens", proto.DEFAULT_MAX_NEW_TOKENS)  # present but null: no cap
    if requested is not None and requested + counted > context:
        raise RequestError(400, proto.e3_body(proto.msg_total_too_long(context, counted, requested)))
    try:
        proto.check_sampling_values(params, config.vocab_size)
    except ValueError as exc:
        raise RequestError(400, proto.e3_body(str(exc))) from None
    if rid in in_flight:
        raise RequestError(400, proto.e3_body(proto.msg_duplicate_rid(rid)))
    if prompt_tokens >= config.max_req_input_len:
        raise RequestError(400, proto.e3_body(proto.msg_input_exceeds_max(prompt_tokens, config.max_req_input_len)))
    cap = proto.UNCAPPED_MAX_NEW_TOKENS if requested is None else requested
    # The scheduler silently clips to what the context leaves.
    return max(0, min(cap, config.max_req_len - prompt_tokens - 1))


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
    """FastAPI's validation text as SGLang words it: `<str(exc)> <exc.errors()>` (E1; wording approximate)."""
    error = {"type": error_type, "loc": ("body", loc), "msg": message, "input": value}
    if ctx:
        error["ctx"] = dict(ctx)
    return f"1 validation error:\n  {error}\n {[error]}"
