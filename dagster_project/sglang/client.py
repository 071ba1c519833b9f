"""Client for one SGLang server (or one router): native `/generate` with typed errors.

Every failure ends as an `SGLangError` whose `kind` is a stable code and whose `retryable` says whether
sending the same request again (to this or another server) can succeed. A response that is not a
finished answer (an abort, a malformed body) is an error too, never a result.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import aiohttp
import orjson

from dagster_project.sglang.answer_contract import (  # the breach kinds are error kinds of the client too
    ANSWER_OUT_OF_VOCAB as ANSWER_OUT_OF_VOCAB,
)
from dagster_project.sglang.answer_contract import (
    BREACHES,
    OVERSIZED_BODY,
    UNKNOWN,
    Served,
    body_limit,
    breach,
    out_of_vocab,
)
from dagster_project.sglang.answer_contract import CUT_SHORT as CUT_SHORT
from dagster_project.sglang.answer_contract import SAMPLING_FAILED as SAMPLING_FAILED
from dagster_project.sglang.protocol import CONTEXT_LENGTH_MESSAGE, MSG_QUEUE_FULL

# Error kinds. Not retryable: the request itself is wrong, or the client is misconfigured.
CONTEXT_LENGTH = "context_length"
BAD_REQUEST = "bad_request"
UNAUTHORIZED = "unauthorized"
NOT_FOUND = "not_found"
# Retryable: the server (or the path to it) failed, not the request.
DUPLICATE_RID = "duplicate_rid"  # retry with a fresh rid
QUEUE_FULL = "queue_full"
SERVER_UNAVAILABLE = "server_unavailable"
SERVER_ERROR = "server_error"
CONNECTION_DROPPED = "connection_dropped"
TIMEOUT = "timeout"
ABORTED = "aborted"
BAD_RESPONSE = "bad_response"
# An answer that breaks the answer contract (`answer_contract.BREACHES`: SAMPLING_FAILED, CUT_SHORT,
# ANSWER_OUT_OF_VOCAB, OVERSIZED_BODY and the rest) is the server's fault too.
# Not retryable: an input id outside the served vocabulary, refused before sending (it kills a real server).
INPUT_OUT_OF_VOCAB = "input_out_of_vocab"

RETRYABLE_KINDS = frozenset(
    {
        DUPLICATE_RID,
        QUEUE_FULL,
        SERVER_UNAVAILABLE,
        SERVER_ERROR,
        CONNECTION_DROPPED,
        TIMEOUT,
        ABORTED,
        BAD_RESPONSE,
        *BREACHES,
    }
)
_GET_BODY_LIMIT = 64 << 20  # /server_info, /metrics: far above what any server reports
_MAX_MESSAGE_CHARS = 2000
_REDACTED = "<redacted>"


class SGLangError(Exception):
    """A request that did not produce an answer; `kind` and `retryable` say what to do about it."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        url: str | None = None,
        rid: str | None = None,
        partial: GenerateResult | None = None,
    ):
        self.kind = kind
        self.retryable = kind in RETRYABLE_KINDS
        self.message = message
        self.status = status
        self.url = url
        self.rid = rid
        self.partial = partial  # what an aborted request had produced, for diagnostics only
        super().__init__(str(self))

    def __str__(self) -> str:
        status = f" HTTP {self.status}" if self.status is not None else ""
        where = f" from {self.url}" if self.url else ""
        return f"{self.kind}{status}{where}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"SGLangError(kind={self.kind!r}, status={self.status!r}, "
            f"retryable={self.retryable}, message={self.message!r})"
        )

    def __reduce__(self):  # keeps the error picklable despite keyword-only arguments
        return _rebuild_error, (self.kind, self.message, self.status, self.url, self.rid)


def _rebuild_error(kind: str, message: str, status: int | None, url: str | None, rid: str | None) -> SGLangError:
    return SGLangError(kind, message, status=status, url=url, rid=rid)


@dataclass(slots=True)
class GenerateResult:
    """A finished answer (`finish_reason.type` is `stop` or `length`) exactly as the server returned it."""

    rid: str
    text: str
    output_ids: list[int]
    finish_reason: dict
    meta_info: dict
    prompt_tokens: int
    completion_tokens: int

    @property
    def finish_type(self) -> str:
        return self.finish_reason["type"]

    @property
    def truncated(self) -> bool:
        """Stopped by the token cap (requested or clipped by the server), not by the model."""
        return self.finish_reason["type"] == "length"

    @property
    def e2e_latency(self) -> float | None:
        return self.meta_info.get("e2e_latency")

    @property
    def spec_verify_ct(self) -> int | None:
        return self.meta_info.get("spec_verify_ct")

    @property
    def spec_accept_length(self) -> float | None:
        return self.meta_info.get("spec_accept_length")

    @property
    def spec_accept_rate(self) -> float | None:
        return self.meta_info.get("spec_accept_rate")

    @property
    def spec_num_correct_drafts(self) -> int | None:
        return self.meta_info.get("spec_num_correct_drafts")

    @property
    def spec_num_proposed_drafts(self) -> int | None:
        return self.meta_info.get("spec_num_proposed_drafts")

    @property
    def spec_histogram(self) -> list[int] | None:
        return self.meta_info.get("spec_correct_drafts_histogram")


def _result_from_body(
    body: Any, rid: str, url: str, sampling_params: dict | None = None, served: Served = UNKNOWN
) -> GenerateResult:
    """Turn one response object into a result, or raise: aborts, malformed bodies and answers that break the answer
    contract (`answer_contract.breach`, against the request's `sampling_params` and what is known of the `served`
    model) are errors."""
    try:
        meta = body["meta_info"]
        output_ids = body["output_ids"]
        finish = meta["finish_reason"]
        result = GenerateResult(
            rid=meta.get("id", rid),
            text=body["text"],
            output_ids=output_ids,
            finish_reason=finish,
            meta_info=meta,
            prompt_tokens=meta["prompt_tokens"],
            completion_tokens=meta["completion_tokens"],
        )
        kind = finish["type"]
    except (KeyError, TypeError) as exc:
        raise SGLangError(BAD_RESPONSE, f"response lacks {exc}", url=url, rid=rid) from None
    if not isinstance(output_ids, list) or result.completion_tokens != len(output_ids):
        raise SGLangError(
            BAD_RESPONSE,
            f"completion_tokens={result.completion_tokens} but {len(output_ids)} output ids",
            url=url,
            rid=rid,
        )
    if kind == "abort":
        status = finish.get("status_code")
        error = classify_http_error(status, finish.get("message") or "Aborted", url=url) if status else None
        if error is not None:
            raise error
        raise SGLangError(ABORTED, finish.get("message") or "Aborted", url=url, rid=rid, partial=result)
    if kind not in ("stop", "length"):
        raise SGLangError(BAD_RESPONSE, f"unknown finish_reason {finish!r}", url=url, rid=rid)
    broken = breach(output_ids, finish, sampling_params, served)
    if broken is not None:
        raise SGLangError(broken.kind, broken.detail, url=url, rid=rid, partial=result)
    return result


def _error_message(body: Any) -> str:
    """The human text of any of the error shapes E1-E4 (see `protocol.e1_body`...`e4_body`), or the raw body."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, str):
            return error
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(body)


def classify_http_error(
    status: int, body: bytes | str | Any, *, url: str | None = None, rid: str | None = None
) -> SGLangError:
    """Map a non-200 answer to a typed error."""
    if isinstance(body, (bytes, str)):
        try:
            parsed: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    else:
        parsed = body
    message = _error_message(parsed).strip()[:_MAX_MESSAGE_CHARS] or f"HTTP {status}"
    if status == 401:
        kind = UNAUTHORIZED
    elif status == 404:
        kind = NOT_FOUND
    elif status == 400 and CONTEXT_LENGTH_MESSAGE.search(message):
        kind = CONTEXT_LENGTH
    elif status == 400 and message.startswith("Duplicate request ID"):
        kind = DUPLICATE_RID
    elif status == 408:
        kind = TIMEOUT
    elif status == 429 or (status == 503 and message == MSG_QUEUE_FULL):
        kind = QUEUE_FULL
    elif status in (502, 503, 504):
        kind = SERVER_UNAVAILABLE
    elif status >= 500:
        kind = SERVER_ERROR
    else:
        kind = BAD_REQUEST
    return SGLangError(kind, message, status=status, url=url, rid=rid)


def _redact(value: Any, secret: str) -> Any:
    """Replace the API key wherever a server echoes it (`/server_info` includes `api_key`)."""
    if isinstance(value, dict):
        return {
            k: (_REDACTED if k in ("api_key", "admin_api_key") and v else _redact(v, secret)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact(v, secret) for v in value]
    if isinstance(value, str) and secret and secret in value:
        return value.replace(secret, _REDACTED)
    return value


async def _read_capped(response: aiohttp.ClientResponse, limit: int, url: str, rid: str | None) -> bytes:
    """The body, or `OVERSIZED_BODY` as soon as it passes `limit` bytes (the connection is closed, not drained)."""
    declared = response.content_length
    if declared is not None and declared > limit:
        response.close()
        raise SGLangError(OVERSIZED_BODY, f"{declared:,} bytes declared, over the bound of {limit:,}", url=url, rid=rid)
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            response.close()
            raise SGLangError(OVERSIZED_BODY, f"past {limit:,} bytes, not read further", url=url, rid=rid)
    return bytes(body)


def new_session() -> aiohttp.ClientSession:
    """A session without aiohttp's default cap of 100 connections: the dispatcher bounds concurrency."""
    # Idle connections are dropped before the server drops them (uvicorn closes them after 5 s): a POST sent on a
    # connection the server just closed fails for nothing.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4))


class SGLangClient:
    """One SGLang endpoint. Pass a shared `session` to pool connections across clients."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        session: aiohttp.ClientSession | None = None,
        *,
        connect_timeout_s: float = 10.0,
        probe_timeout_s: float = 30.0,
    ):
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or ""
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._json_headers = {**self._auth, "Content-Type": "application/json"}
        self._session = session
        self._owns_session = session is None
        self._connect_timeout_s = connect_timeout_s
        self._probe_timeout_s = probe_timeout_s

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _clean(self, error: SGLangError) -> SGLangError:
        if self._api_key and self._api_key in error.message:
            error.message = error.message.replace(self._api_key, _REDACTED)
            error.args = (str(error),)
        return error

    async def _call(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        timeout: float | None,
        rid: str | None = None,
        limit: int = _GET_BODY_LIMIT,
        on_answer_begun: Callable[[], None] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body); a body past `limit` bytes is refused (`OVERSIZED_BODY`) as soon as it passes it, never
        read whole. `on_answer_begun` is called when the status and headers are in, before the body is read."""
        if self._session is None:
            self._session = new_session()
        url = self.base_url + path
        client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=self._connect_timeout_s)
        headers = self._json_headers if data is not None else self._auth
        try:
            async with self._session.request(
                method, url, data=data, headers=headers, timeout=client_timeout
            ) as response:
                if on_answer_begun is not None:
                    on_answer_begun()
                return response.status, await _read_capped(response, limit, self.base_url, rid)
        except TimeoutError:
            raise SGLangError(TIMEOUT, f"no complete answer within {timeout}s", url=self.base_url, rid=rid) from None
        except aiohttp.ClientConnectorError as exc:
            raise self._clean(
                SGLangError(SERVER_UNAVAILABLE, f"cannot connect: {exc.os_error}", url=self.base_url, rid=rid)
            ) from None
        except aiohttp.ClientError as exc:
            # ServerDisconnectedError, ClientPayloadError (truncated body), ClientOSError (reset): the
            # server died or dropped us mid-request.
            raise SGLangError(CONNECTION_DROPPED, f"{type(exc).__name__}: {exc}", url=self.base_url, rid=rid) from None

    async def _get_ok(self, path: str, timeout: float | None) -> bytes:
        status, body = await self._call("GET", path, timeout=timeout)
        if status != 200:
            raise self._clean(classify_http_error(status, body, url=self.base_url))
        return body

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: dict,
        rid: str | None = None,
        timeout: float | None = None,
        *,
        require_reasoning: bool = True,
        served: Served = UNKNOWN,
        on_answer_begun: Callable[[], None] | None = None,
    ) -> GenerateResult:
        """One non-streamed native `/generate` call; raises `SGLangError` unless the answer finished.

        With the `served` vocabulary, input ids outside it are refused before anything is sent (such an id kills a
        real SGLang server: an IndexError in its embedding). Every answer is held to the answer contract
        (`answer_contract.breach`); a body past `answer_contract.body_limit` is refused unread. `on_answer_begun` is
        told when the answer's status and headers arrive: the server is done with the request, and its body follows
        (a body that trickles in is the path's fault, or a proxy's, not the generation's)."""
        rid = rid or uuid.uuid4().hex
        where = out_of_vocab(input_ids, served.vocab_size) if served.vocab_size is not None else None
        if where is not None:
            raise SGLangError(INPUT_OUT_OF_VOCAB, f"input {where}: not sent", url=self.base_url, rid=rid)
        request = {"rid": rid, "input_ids": input_ids, "sampling_params": sampling_params, "stream": False}
        if require_reasoning:
            # Makes the server count meta_info.reasoning_tokens up to </think>.
            request["require_reasoning"] = True
        limit = body_limit(sampling_params)
        data = orjson.dumps(request)
        status, body = await self._call(
            "POST", "/generate", data=data, timeout=timeout, rid=rid, limit=limit, on_answer_begun=on_answer_begun
        )
        if status != 200:
            raise self._clean(classify_http_error(status, body, url=self.base_url, rid=rid))
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise SGLangError(
                BAD_RESPONSE, f"invalid JSON body ({len(body)} bytes)", url=self.base_url, rid=rid
            ) from None
        return _result_from_body(parsed, rid, self.base_url, sampling_params, served)

    async def _get_json(self, path: str, timeout: float | None) -> dict:
        body = await self._get_ok(path, timeout or self._probe_timeout_s)
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            excerpt = body[:80].decode("utf-8", "replace")
            raise SGLangError(BAD_RESPONSE, f"{path} is not a JSON object: {excerpt!r}", url=self.base_url)
        return parsed

    async def server_info(self, timeout: float | None = None) -> dict:
        """`/server_info` with any echoed API key redacted."""
        return _redact(await self._get_json("/server_info", timeout), self._api_key)

    async def model_info(self, timeout: float | None = None) -> dict:
        return await self._get_json("/model_info", timeout)

    async def health(self, timeout: float | None = None) -> bool:
        return await self._probe("/health", timeout)

    async def health_generate(self, timeout: float | None = None) -> bool:
        return await self._probe("/health_generate", timeout)

    async def _probe(self, path: str, timeout: float | None) -> bool:
        try:
            status, _ = await self._call("GET", path, timeout=timeout or self._probe_timeout_s)
        except SGLangError:
            return False
        return status == 200

    async def metrics(self, timeout: float | None = None) -> str:
        """Prometheus exposition text; `not_found` when the server runs without `--enable-metrics`."""
        return (await self._get_ok("/metrics", timeout or self._probe_timeout_s)).decode()

    async def flush_cache(self, timeout: float | None = None) -> bool:
        """True when flushed; False when the server refused because requests are in flight."""
        status, body = await self._call("POST", "/flush_cache", timeout=timeout or self._probe_timeout_s)
        if status in (200, 400):
            return status == 200
        raise self._clean(classify_http_error(status, body, url=self.base_url))

    async def abort(self, rid: str, timeout: float | None = None) -> None:
        """Abort the in-flight request `rid`. Only the exact rid aborts: SGLang 0.5.23 ignores an rid it does not
        hold (a prefix, an unknown or finished rid) and still answers 200."""
        payload = orjson.dumps({"rid": rid, "abort_all": False})
        status, body = await self._call(
            "POST", "/abort_request", data=payload, timeout=timeout or self._probe_timeout_s
        )
        if status != 200:
            raise self._clean(classify_http_error(status, body, url=self.base_url, rid=rid))
