"""An HTTP proxy in front of the S3 server that answers a share of the requests as S3 does when it throttles:
`503 SlowDown`, with S3's XML error body. The others go through unchanged. Deterministic: every `every`-th request
is throttled, so a test knows how many were — but never the same call twice: a retry of a throttled call goes through.
(Throttling by count alone starves a caller whose retries keep landing on the `every`-th slot while other threads
fill the slots between, as a store reading several keys at once does.)"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class ThrottlingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, target: str, every: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target = urlsplit(target)
        self.every = every
        self.requests = 0
        self.throttled = 0
        self._throttled_calls: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def throttles_next(self, method: str, path: str) -> bool:
        with self.lock:
            self.requests += 1
            call = (method, path)
            throttle = self.requests % self.every == 0 and call not in self._throttled_calls
            if throttle:
                self._throttled_calls.add(call)
                self.throttled += 1
            return throttle


class _Handler(BaseHTTPRequestHandler):
    server: ThrottlingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (BaseHTTPRequestHandler's name)
        pass

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.throttles_next(self.command, self.path):
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOW_DOWN)))
            self.end_headers()
            self.wfile.write(SLOW_DOWN)
            return
        target = self.server.target
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
        connection.request(self.command, self.path, body=body or None, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        # A HEAD answer has no body but the object's length.
        length = answer.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


@contextmanager
def throttling_proxy(endpoint: str, every: int) -> Iterator[ThrottlingProxy]:
    """A proxy to `endpoint` answering every `every`-th request (each call once at most) with 503 SlowDown, for the
    `with` block."""
    proxy = ThrottlingProxy(endpoint, every)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
