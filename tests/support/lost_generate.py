"""An HTTP front for one server that loses every `/generate`: what a broken router or load balancer looks like.

Every other route passes through to the server behind it, so `/health` answers 200, `/server_info` reports
its cap and `/metrics` its own (empty) queue; `POST /generate` is accepted and never answered. `received`
records when each lost request came and its prompt hash, to time how long it took to reach another server.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import orjson
from aiohttp import web

from dagster_project.sglang import protocol as proto

_PASSED_HEADERS = ("Authorization", "Content-Type")


class LostGenerate:
    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.received: list[tuple[float, str]] = []  # (wall-clock time, input hash) of each lost /generate
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the lost-generate front did not start")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def handle(request: web.Request) -> web.StreamResponse:
                body = await request.read()
                if request.method == "POST" and request.path == "/generate":
                    self.received.append((time.time(), proto.input_hash(orjson.loads(body)["input_ids"])))
                    await self._stop.wait()  # never answered while the front runs
                    raise web.HTTPServiceUnavailable()
                headers = {name: request.headers[name] for name in _PASSED_HEADERS if name in request.headers}
                async with session.request(
                    request.method, self.target + request.path_qs, data=body or None, headers=headers
                ) as answer:
                    content_type = answer.headers.get("Content-Type", "application/octet-stream")
                    return web.Response(
                        status=answer.status, body=await answer.read(), headers={"Content-Type": content_type}
                    )

            app = web.Application()
            app.router.add_route("*", "/{path:.*}", handle)
            runner = web.AppRunner(app, shutdown_timeout=1.0)
            await runner.setup()
            listener = socket.create_server(("127.0.0.1", 0))
            self.port = listener.getsockname()[1]
            await web.SockSite(runner, listener).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


@contextmanager
def lost_generate(target: str) -> Iterator[LostGenerate]:
    front = LostGenerate(target)
    try:
        yield front
    finally:
        front.close()
