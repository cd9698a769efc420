"""A fault-injecting object store for tests: latency, failed requests, lost replies (the put
landed, the caller was told it failed) and partial listings, on every ObjectStore call; and a
proxy to an S3 endpoint that stops answering (:class:`Tarpit`).

Example:
    ``with FaultyStore(seed=3, error=0.05, lost_reply=0.05, partial_list=0.1): tbl.upsert(...)``
"""

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Any
from urllib.parse import urlparse

from memwal_sql.errors import StorageError
from memwal_sql.storage import ObjectStore

_WRITES = ("put_if_not_exists", "put", "delete", "move")
_READS = ("get", "exists")


class InjectedFault(StorageError):
    """A failure the test injected (a StorageError, as a real store's would be)."""


class FaultyStore:
    """Patches :class:`ObjectStore` while entered; :attr:`enabled` switches faults on and off.

    ``error``: a request fails before it reaches the store; ``lost_reply``: a write lands but
    reports a failure; ``partial_list``: a listing leaves out a random part of its entries;
    ``latency``: each request first waits up to that many seconds.
    """

    def __init__(
        self,
        seed: int,
        *,
        error: float = 0.0,
        lost_reply: float = 0.0,
        partial_list: float = 0.0,
        latency: float = 0.0,
    ) -> None:
        self.rng = random.Random(seed)
        self.error, self.lost_reply = error, lost_reply
        self.partial_list, self.latency = partial_list, latency
        self.enabled = True
        self.injected: dict[str, int] = {"error": 0, "lost_reply": 0, "partial_list": 0}
        self._lock = threading.Lock()
        self._real: dict[str, Any] = {}

    def _draw(self) -> tuple[float, float]:
        with self._lock:
            return self.rng.random(), self.rng.random() * self.latency

    def _count(self, kind: str) -> None:
        with self._lock:
            self.injected[kind] += 1

    def __enter__(self) -> FaultyStore:
        for name in (*_WRITES, *_READS, "list"):
            self._real[name] = getattr(ObjectStore, name)
        faults = self

        def wrap(name: str) -> Any:
            real = self._real[name]

            def call(store: ObjectStore, *args: Any, **kwargs: Any) -> Any:
                if not faults.enabled:
                    return real(store, *args, **kwargs)
                r, wait = faults._draw()
                time.sleep(wait)
                if r < faults.error:
                    faults._count("error")
                    raise InjectedFault(f"injected: {name} {args[:1]} failed")
                out = real(store, *args, **kwargs)
                if name in _WRITES and r < faults.error + faults.lost_reply:
                    faults._count("lost_reply")
                    raise InjectedFault(f"injected: the reply of {name} {args[:1]} was lost")
                if name == "list" and r < faults.error + faults.partial_list and out:
                    faults._count("partial_list")
                    with faults._lock:
                        keep = faults.rng.randrange(len(out))
                    return out[:keep]
                return out

            return call

        for name in self._real:
            setattr(ObjectStore, name, wrap(name))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, real in self._real.items():
            setattr(ObjectStore, name, real)


class Tarpit:
    """A TCP proxy to an S3 endpoint that can be switched to accept and never answer, on new
    connections and on the ones already open (an endpoint that hangs, not one that refuses).

    Example:
        ``pit = Tarpit(opts["aws_endpoint"]); t = mw.open_table(uri, {**opts,
        "aws_endpoint": pit.endpoint}); pit.stop_answering(); t.count_rows()  # StorageError``
    """

    def __init__(self, upstream: str) -> None:
        host, port = urlparse(upstream).hostname, urlparse(upstream).port
        self._upstream = (host or "127.0.0.1", port or 80)
        self._silent = threading.Event()
        self._sockets: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.endpoint = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def stop_answering(self) -> None:
        self._silent.set()

    def close(self) -> None:
        """Close every connection: calls still waiting on the endpoint fail at once."""
        for s in [self._server, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self._silent.is_set():
                continue  # held open, never answered
            upstream = socket.create_connection(self._upstream)
            self._sockets.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                if not self._silent.is_set():  # once silent, nothing more gets through
                    sink.sendall(data)
            except OSError:
                return
