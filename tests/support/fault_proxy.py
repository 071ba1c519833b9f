"""A TCP proxy on loopback that can be switched off: a real network fault between a client and a server.

While `down`, every new connection is accepted and reset at once (what a restarting endpoint looks like);
connections already open are cut. While `silent`, new connections are accepted and never answered (a hung
endpoint). `refused` and `held` count the connections turned away or left hanging, so a test can wait for
the client to have hit the fault before lifting it. `slow_s`: every chunk of an answer is held that long before
it is passed on (a slow endpoint: each call succeeds, late). `hold_answers`: every answer is held until
`release_answers` (an endpoint later than any budget), `answers_held` counting those that waited.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class FaultProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.down = threading.Event()
        self.silent = threading.Event()
        self.refused = 0
        self.held = 0
        self.slow_s = 0.0
        self.answers_held = 0
        self._answers_flow = threading.Event()
        self._answers_flow.set()
        self._hanging: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                with self._lock:
                    self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                client.close()  # linger 0: the client sees a reset, not a clean close
                continue
            if self.silent.is_set():
                with self._lock:
                    self.held += 1
                    self._hanging.append(client)
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self._lock:
            self._open.update({client, upstream})
        pump = threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True)
        pump.start()
        self._pipe(client, upstream)
        pump.join()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool = False) -> None:
        try:
            while data := source.recv(65536):
                if answers and not self._answers_flow.is_set():
                    with self._lock:
                        self.answers_held += 1
                    self._answers_flow.wait()
                if answers and self.slow_s:
                    time.sleep(self.slow_s)  # the fault itself: a late answer, not a wait for anything
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._open.discard(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def go_down(self) -> None:
        self.down.set()
        with self._lock:
            open_now = list(self._open)
        for sock in open_now:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def go_silent(self) -> None:
        self.silent.set()

    def hold_answers(self) -> None:
        self._answers_flow.clear()

    def release_answers(self) -> None:
        self._answers_flow.set()

    def come_back(self) -> None:
        self.down.clear()
        self.silent.clear()
        with self._lock:
            hanging, self._hanging = self._hanging, []
        for sock in hanging:
            sock.close()

    def close(self) -> None:
        self._closed = True
        self.release_answers()
        self.go_down()
        self.listener.close()


@contextmanager
def fault_proxy(endpoint: str) -> Iterator[FaultProxy]:
    host, port = endpoint.removeprefix("http://").split(":")
    proxy = FaultProxy(host, int(port))
    try:
        yield proxy
    finally:
        proxy.close()
