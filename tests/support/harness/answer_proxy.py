"""An HTTP proxy in front of one simulator that breaks its /generate answers: what a faulty server, or a faulty
layer in front of it, looks like to the dispatcher. Every other route passes through unchanged.

It records every /abort_request it passes on (`aborts`: rid → when). Two modes, or neither (pass-through):

* `break_every=N`: every Nth answer to a job's request (the dispatcher's one-token probes pass untouched) breaks
  the request's contract, the kinds in turn: more output ids than `max_new_tokens` (`overlong`), the end-of-sequence
  id in the middle of the answer (`eos_mid`), a `text` that is not the decoding of `output_ids` (`foreign_text`).
  Each broken answer is otherwise consistent (`completion_tokens`, `finish_reason`), so only the contract tells it.
  `broken` records each one (rid, kind, prompt hash).
* `hang_generate=True`: /generate is never answered (held until the client gives up or the proxy closes) while
  /health and the info routes answer: a server whose scheduler is stuck behind a healthy HTTP front. `held` records
  when each request arrived and when its client went away.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.model_identity import PROBE_INPUT_IDS

BREAK_KINDS = ("overlong", "eos_mid", "foreign_text")
FOREIGN_TEXT = "An answer to some other prompt entirely."


@dataclass
class BrokenAnswer:
    rid: str
    kind: str
    input_hash: str


@dataclass
class HeldRequest:
    arrived_at: float  # time.time()
    job: bool  # a job's request (not a one-token probe)
    client_gone_at: float | None = None


@dataclass
class AnswerProxy:
    target: str
    decode: Callable[[list[int]], str]
    eos_id: int
    break_every: int = 0
    hang_generate: bool = False
    broken: list[BrokenAnswer] = field(default_factory=list)
    held: list[HeldRequest] = field(default_factory=list)
    aborts: dict[str, float] = field(default_factory=dict)  # rid → when its abort passed (time.time())
    _job_answers: int = 0

    def start(self) -> str:
        """Serve on a free loopback port in a thread of its own; return the proxy's URL."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(timeout=30)
        return self.url

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._open())
        ready.set()
        self._loop.run_forever()

    async def _open(self) -> None:
        self._stopping = asyncio.Event()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        async def shut() -> None:
            self._stopping.set()
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/generate" and self.hang_generate:
            return await self._hold(request, body)
        if request.path == "/abort_request" and body:
            self.aborts.setdefault(str(orjson.loads(body).get("rid")), time.time())
        async with self._session.request(
            request.method,
            self.target + request.path_qs,
            data=body or None,
            headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")},
        ) as upstream:
            answer = await upstream.read()
            status, content_type = upstream.status, upstream.content_type
        if request.path == "/generate" and status == 200 and self.break_every:
            answer = self._maybe_break(orjson.loads(body), answer)
        return web.Response(status=status, body=answer, content_type=content_type)

    async def _hold(self, request: web.Request, body: bytes) -> web.StreamResponse:
        held = HeldRequest(time.time(), orjson.loads(body).get("input_ids") != list(PROBE_INPUT_IDS))
        self.held.append(held)
        try:
            while not self._stopping.is_set():
                if request.transport is None or request.transport.is_closing():
                    break
                await asyncio.sleep(0.02)  # polling for the client's departure: the fault is never answering
        finally:  # the client went away (or aiohttp cancelled the handler when it did), unless the proxy closes
            if not self._stopping.is_set():
                held.client_gone_at = time.time()
        return web.Response(status=503)

    def _maybe_break(self, sent: dict[str, Any], raw: bytes) -> bytes:
        if sent.get("input_ids") == list(PROBE_INPUT_IDS):
            return raw
        self._job_answers += 1
        answer = orjson.loads(raw)
        if self._job_answers % self.break_every or not isinstance(answer, dict):
            return raw
        kind = BREAK_KINDS[len(self.broken) % len(BREAK_KINDS)]
        ids, meta = list(answer["output_ids"]), answer["meta_info"]
        max_new_tokens = sent["sampling_params"]["max_new_tokens"]
        if kind == "overlong":
            words = [i for i in ids if i != self.eos_id] or [self.eos_id - 1]
            ids = (words * (max_new_tokens // len(words) + 2))[: max_new_tokens + 3]
            meta["finish_reason"] = proto.finish_length(len(ids))
            answer["text"] = self.decode(ids)
        elif kind == "eos_mid":
            ids.insert(max(1, len(ids) // 2), self.eos_id)
            answer["text"] = self.decode([i for i in ids if i != self.eos_id])
        else:
            answer["text"] = FOREIGN_TEXT
        answer["output_ids"] = ids
        meta["completion_tokens"] = len(ids)
        self.broken.append(BrokenAnswer(str(sent.get("rid")), kind, proto.input_hash(sent["input_ids"])))
        return orjson.dumps(answer)
