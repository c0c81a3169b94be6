"""A delaying TCP relay on 127.0.0.1: a network's round trip on one machine, for `localspec bench --rpc`.

Every chunk is forwarded half the round trip after it arrived, in both directions, without holding up the chunks
behind it (bandwidth stays that of loopback; only latency is added). The round trip can change between
measurements. The relay counts request/response turns, so the benchmark can report the round trips per decode it
really saw. It serves at most `max_connections` clients and ends after `lifetime` seconds, whatever happens.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque

from localspec.llama.rpc import Endpoint


class DelayRelay:
    """Relay 127.0.0.1:<port> → `target`, adding `rtt_ms` to every round trip."""

    def __init__(
        self, target: Endpoint, *, rtt_ms: float = 0.0, max_connections: int = 8, lifetime: float = 3600.0
    ) -> None:
        self.target = target
        self.rtt_ms = rtt_ms
        self.turns = 0  # client→worker sends that follow a worker→client reply: one per round trip
        self._last_from_worker = True
        self._max = max_connections
        self._deadline = time.monotonic() + lifetime
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = Endpoint("127.0.0.1", self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def __enter__(self) -> DelayRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for s in self._sockets + [self._listener]:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        served = 0
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            if served == self._max:  # no more clients; the ones connected keep their connections
                with contextlib.suppress(OSError):
                    self._listener.close()
                self._stop.wait(max(0.0, self._deadline - time.monotonic()))
                break
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                worker = socket.create_connection((self.target.host, self.target.port), timeout=10)
            except OSError:
                client.close()
                continue
            served += 1
            for s in (client, worker):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, worker]
            for src, dst, from_worker in ((client, worker, False), (worker, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, from_worker), daemon=True).start()
        self.close()

    def _pump(self, src: socket.socket, dst: socket.socket, from_worker: bool) -> None:
        """Read from src; a sender thread writes each chunk to dst once its delay has passed."""
        due: deque[tuple[float, bytes]] = deque()  # in arrival order; due times never decrease
        ready = threading.Condition()
        done = threading.Event()
        last_due = 0.0

        def send() -> None:
            while True:
                with ready:
                    while not due and not done.is_set():
                        ready.wait(0.2)
                    if not due:
                        return
                    at, chunk = due[0]
                    wait = at - time.monotonic()
                    if wait > 0:
                        ready.wait(wait)
                        continue
                    due.popleft()
                try:
                    dst.sendall(chunk)
                except OSError:
                    return

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                chunk = src.recv(1 << 16)
                if not chunk:
                    break
                with self._lock:
                    if not from_worker and self._last_from_worker:
                        self.turns += 1
                    self._last_from_worker = from_worker
                # Never before the chunk ahead of it, even when the round trip was just shortened.
                last_due = max(last_due, time.monotonic() + self.rtt_ms / 2000.0)
                with ready:
                    due.append((last_due, chunk))
                    ready.notify()
        except OSError:
            pass
        finally:
            done.set()
            with ready:
                ready.notify()
            sender.join(timeout=5)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
