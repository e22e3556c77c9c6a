"""Helpers shared by the dirty pool's tests: bounds, waits, a scripted pool, asyncio in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from apps import dirty
from apps.dirty import _client_sync
from apps.dirty._protocol import CHUNK, REQUEST, RESPONSE, decode_payload
from wire import FrameSplitter, reply_parts

BOUND = 10.0  # seconds: the generous bound on any wait for a condition


def _wait_for(
    condition: Callable[[], bool], changed: threading.Condition, bound: float = BOUND
) -> None:
    """Wait (in a plain thread) until ``condition()`` holds, woken by ``changed`` (which whatever
    the condition reads notifies when it changes); fail after ``bound`` seconds."""
    with changed:
        if not changed.wait_for(condition, bound):
            raise AssertionError("condition not reached in time")


def watch_sync_sends(monkeypatch: pytest.MonkeyPatch) -> threading.Condition:
    """A condition notified after each send of a sync client's connection: a call registers its
    waiter (``_SyncConn.waiters``) before its request goes out, so a wait on it for a number of
    waiters wakes when a call's waiter is in."""
    changed = threading.Condition()
    real = _client_sync._SyncConn.send

    def send(self: Any, *args: Any) -> None:
        try:
            real(self, *args)
        finally:
            with changed:
                changed.notify_all()

    monkeypatch.setattr(_client_sync._SyncConn, "send", send)
    return changed


async def _in_asyncio(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``scenario()`` with ``asyncio.run`` in a worker thread, with a deadline."""

    async def bounded() -> Any:
        async with asyncio.timeout(30):
            return await scenario()

    return await trio.to_thread.run_sync(asyncio.run, bounded())


class FakePool:
    """A scripted pool: answers each REQUEST with a RESPONSE carrying its first argument
    (``"hold"`` actions only once ``release`` is set). With ``stall_first``, the first
    connection reads ``stall_after`` bytes and then nothing until ``gate`` is set (a client's
    send stays blocked half-way). Records ``(connection, type, rid, action)`` per frame, the
    protocol errors met and the connections that ended."""

    def __init__(self, path: str, stall_first: bool = False, stall_after: int = 65536) -> None:
        self.path = path
        self.frames: list[tuple[int, int, int, str | None]] = []
        self.errors: list[str] = []
        self.ended: set[int] = set()  # connections whose client closed them (or that failed)
        self.started = threading.Event()  # the stalled connection has read its bytes
        self.gate = threading.Event()
        self.held = threading.Event()  # a "hold" request came in
        self.release = threading.Event()
        self.stall_first = stall_first
        self.stall_after = stall_after
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        #: Set by ``kill``: every connection, accepted before or after, is shut down.
        self.dead = False
        #: Notified (under ``lock``) when ``frames`` or ``ended`` change.
        self.changed = threading.Condition(self.lock)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        n = 0
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                if self.dead:
                    # Accepted after kill(): a blocked accept() outlives the listening socket's
                    # close(), so a client connecting late still gets here; it finds the pool
                    # dead too (left open, a "hold" request would hang its call).
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
                    conn.close()
                    continue
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()
            n += 1

    def _serve(self, conn: socket.socket, n: int) -> None:
        splitter = FrameSplitter()
        try:
            if n == 0 and self.stall_first:
                got = 0
                while got < self.stall_after:
                    data = conn.recv(self.stall_after - got)
                    if not data:
                        return
                    got += len(data)
                    splitter.feed(data)
                self.started.set()
                self.gate.wait(BOUND)
            while data := conn.recv(1 << 20):
                for mtype, rid, payload in splitter.feed(data):
                    action = None
                    if mtype == REQUEST:
                        body = decode_payload(payload)
                        action = body["action"]
                    with self.changed:
                        self.frames.append((n, mtype, rid, action))
                        self.changed.notify_all()
                    if mtype != REQUEST:
                        continue
                    if action == "hold":
                        self.held.set()
                        self.release.wait(BOUND)
                    args = body["args"]
                    value = args[0] if args and not isinstance(args[0], bytes) else "big"
                    conn.sendall(b"".join(bytes(p) for p in reply_parts(RESPONSE, rid, value)))
        except (OSError, dirty.DirtyProtocolError) as exc:
            with self.lock:
                self.errors.append(f"connection {n}: {exc!r}")
        finally:
            with self.changed:
                self.ended.add(n)
                self.changed.notify_all()
            conn.close()

    def kill(self) -> None:
        """The pool dies with its calls in flight: no answer comes, every connection it has,
        or accepts from now on, is shut down."""
        with self.lock:
            self.dead = True
            self.server.close()
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.gate.set()
        self.release.set()
        self.kill()


class StallingPool:
    """A pool that reads the first ``first`` bytes of its first connection, then nothing until
    ``close()``: a node whose connection stopped reading (its worker's socket is full, its
    scheduler is stuck). Counts the bytes it took."""

    def __init__(self, path: str, first: int = 0) -> None:
        self.path = path
        self.gate = threading.Event()
        self.conns: list[socket.socket] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(4)
        threading.Thread(target=self._serve, args=(first,), daemon=True).start()

    def _serve(self, first: int) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        self.conns.append(conn)
        got = 0
        while got < first:
            data = conn.recv(first - got)
            if not data:
                return
            got += len(data)
        self.gate.wait(BOUND)

    def close(self) -> None:
        self.gate.set()
        self.server.close()
        for conn in self.conns:
            conn.close()


class EchoPool:
    """A pool answering each REQUEST with its first argument; counts the connections it
    accepted and those still open (a connection the client closes ends at once)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.accepted = 0
        self.open = 0
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        splitter = FrameSplitter()
        try:
            while data := conn.recv(1 << 16):
                for mtype, rid, payload in splitter.feed(data):
                    if mtype == REQUEST:
                        value = decode_payload(payload)["args"][0]
                        conn.sendall(b"".join(bytes(p) for p in reply_parts(RESPONSE, rid, value)))
        except OSError:
            pass
        finally:
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.server.close()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


class FloodingPool:
    """Answers the first REQUEST with ``total`` bytes of 64 KiB CHUNKs as fast as the client
    takes them; ``taken`` is how many bytes went out before the client stopped taking any
    for ``stall`` seconds (or all of them)."""

    def __init__(self, path: str, total: int, stall: float = 0.3) -> None:
        self.path = path
        self.total = total
        self.stall = stall
        self.taken = 0
        self.finished = threading.Event()
        self.gate = threading.Event()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            self.finished.set()
            return
        try:
            splitter = FrameSplitter()
            rid = None
            while rid is None:
                for mtype, got, _ in splitter.feed(conn.recv(65536)):
                    if mtype == REQUEST:
                        rid = got
            chunk = b"".join(bytes(p) for p in reply_parts(CHUNK, rid, b"x" * 65536))
            conn.settimeout(self.stall)
            while self.taken < self.total:
                view = memoryview(chunk)
                while view:
                    n = conn.send(view)
                    self.taken += n
                    view = view[n:]
        except OSError:  # (socket.timeout: the client stopped reading)
            pass
        finally:
            self.finished.set()
            self.gate.wait(BOUND)
            conn.close()

    def close(self) -> None:
        self.gate.set()
        self.server.close()


async def _raw(socket_path: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(socket_path)
    return sock


ROOT = Path(__file__).resolve().parents[3]


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **extra)
