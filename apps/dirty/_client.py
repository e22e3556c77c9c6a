"""Clients of the pool: ``DirtyClient`` (sync and async), found through ``GUNICORN_DIRTY_SOCKET``.

The API of ``gunicorn.dirty.client`` (``execute``, ``stream``, ``execute_async``,
``stream_async``, ``get_dirty_client``, ``get_dirty_client_async``), without its limits: one
client object may be shared by threads (sync calls) and by tasks (async calls, on asyncio or
trio); every call has its own request id, so many are in flight on one connection. Abandoning a
stream (breaking out of the loop) sends the pool an END for it, which stops the generator in the
worker; the client stays usable. A call that exceeds the client's ``timeout`` raises
``DirtyTimeoutError`` and is abandoned the same way.

The transports live in modules of their own: ``_client_sync`` (threads), ``_client_asyncio``
and ``_client_trio`` (one connection per event loop), and ``_client_shared`` (what they share).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import sniffio
import trio

import wire

from ._client_asyncio import _AsyncioConn
from ._client_shared import (
    _AsyncConn,
    _frame_bytes,
    _getpid,
    _peer_gone,
    _request,
    _result,
    _Slot,
    _streamed,
)
from ._client_sync import _SyncCalls, _SyncConn
from ._client_trio import _TrioConn
from ._errors import DirtyConnectionError, DirtyError
from ._protocol import CHUNK, END

__all__ = [
    "DirtyClient",
    "close_dirty_client",
    "get_dirty_client",
    "get_dirty_client_async",
    "get_dirty_socket_path",
    "set_dirty_socket_path",
    "close_dirty_client_async",
]

_ENV = "GUNICORN_DIRTY_SOCKET"


_socket_path: str | None = None


def set_dirty_socket_path(path: str | None) -> None:
    """Set the pool's socket path for this process (Gunicorn's API); it wins over
    ``GUNICORN_DIRTY_SOCKET``. None goes back to the variable."""
    global _socket_path
    _socket_path = path


def get_dirty_socket_path() -> str:
    """The pool's socket path: the one :func:`set_dirty_socket_path` set, else
    ``GUNICORN_DIRTY_SOCKET``.

    Raises:
        DirtyError: Neither is set.
    """
    if _socket_path:
        return _socket_path
    path = os.environ.get(_ENV)
    if not path:
        raise DirtyError(
            f"Dirty socket path not configured: set {_ENV} to the pool's socket (the node"
            " prints it at start) or pass the path to DirtyClient(path)"
        )
    return path


class DirtyClient(_SyncCalls):
    """A client of a dirty pool (Gunicorn's ``DirtyClient`` API).

    Args:
        socket_path: The pool's Unix socket; None reads ``GUNICORN_DIRTY_SOCKET``.
        timeout: Seconds a call may take (each wait for the next chunk of a stream, too)
            before it raises :class:`DirtyTimeoutError`; None waits forever.

    Thread- and task-safe. Sync calls share one connection, async calls another per event
    loop (per asyncio loop or trio run). Closing the client fails the calls in flight with
    :class:`DirtyConnectionError`.
    """

    def __init__(self, socket_path: str | None = None, timeout: float | None = 30.0) -> None:
        self.socket_path = socket_path or get_dirty_socket_path()
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._connect_lock = threading.Lock()
        self._sync: _SyncConn | None = None
        #: The async connection of each event loop (asyncio loop, or trio run's token).
        self._conns: dict[Any, _AsyncConn] = {}
        #: The one of them used last: a caller on the same loop as the last finds it at once.
        self._async: _AsyncConn | None = None

    # ------------------------------------------------------------------------ sync calls

    def connect(self) -> None:
        """Connect now (calls connect on first use anyway).

        Raises:
            DirtyConnectionError: The socket cannot be reached.
        """
        self._sync_conn()

    def execute(self, app_path: str, action: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``action`` of the app at ``app_path`` in a worker; return its result.

        Raises:
            DirtyAppError: The action raised, whatever it raised (``traceback`` has the
                worker's traceback, which names the exception's class).
            DirtyAppNotFoundError, DirtyNoWorkersAvailableError, DirtyWorkerError,
            DirtyTimeoutError, DirtyConnectionError, DirtyProtocolError: as named.
            DirtyError: The action streams (it returns a generator): use :meth:`stream`. The
                stream is abandoned, so its generator stops in the worker.
        """
        rid = next(self._ids)
        return self._call_parts(rid, _request(rid, app_path, action, args, kwargs))

    def stream(self, app_path: str, action: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Run a streaming action; iterate its chunks. Breaking out of the loop (or closing the
        iterator) abandons the stream: the worker's generator is stopped. An error mid-stream
        is raised from the iteration as its typed error."""
        rid = next(self._ids)
        return self._stream(rid, _request(rid, app_path, action, args, kwargs))

    def stash_request(
        self, op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
    ) -> Any:
        """Send one STASH operation; return its result (see :mod:`apps.dirty.stash`)."""
        return self._call(wire.make_stash(next(self._ids), op, table, key, value, pattern))

    def status(self) -> dict[str, Any]:
        """The pool's STATUS: its OS pid, workers (pid, apps, ...) and apps."""
        return self._call(wire.make_status(next(self._ids)))

    def manage(self, op: str | int, count: int = 1) -> dict[str, Any]:
        """MANAGE: ``"add"`` (1) or ``"remove"`` (2) ``count`` workers; returns the outcome."""
        code = {"add": 1, "remove": 2}[op] if isinstance(op, str) else op
        return self._call(wire.make_manage(next(self._ids), code, count))

    def close(self) -> None:
        """Close the sync connection; calls in flight on it fail with DirtyConnectionError."""
        self._close_sync()

    def __enter__(self) -> DirtyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------- async calls

    async def connect_async(self) -> None:
        """Connect the async connection now (done on first use anyway)."""
        await self._async_conn()

    async def _async_conn(self) -> _AsyncConn:
        # The one place that asks which event loop runs: its transport does the rest.
        transport = _AsyncioConn if sniffio.current_async_library() == "asyncio" else _TrioConn
        loop = transport.current_loop()
        conn = self._async
        if conn is not None and conn.broken is None and conn.loop is loop and conn.pid == _getpid():
            return conn
        conn = self._conns.get(loop)
        if conn is not None and conn.broken is None and conn.pid == _getpid():
            self._async = conn  # (event loops taking turns: each keeps its connection)
            return conn
        conn = await transport.open(loop, self.socket_path, self._lost)
        with self._connect_lock:
            current = self._conns.get(loop)
            if current is not None and current.broken is None and current.pid == conn.pid:
                # Another task of this loop connected meanwhile: one connection per loop.
                conn.discard()
                return current
            ended = self._prune(loop)
            self._conns[loop] = self._async = conn
        for old in ended:
            old.discard()
        return conn

    def _prune(self, loop: Any) -> list[_AsyncConn]:
        """Drop the connections of event loops that have ended (and, for a forked child, its
        parent's); return those to close (connect lock held)."""
        pid = _getpid()
        ended: list[_AsyncConn] = []
        for key, conn in list(self._conns.items()):
            if conn.pid != pid:
                del self._conns[key]  # the parent's: not ours to close
            elif key is not loop and conn.loop_ended():
                del self._conns[key]
                ended.append(conn)
        return ended

    async def _send_async(self, conn: _AsyncConn, parts: list[Any]) -> None:
        """Send a request; a pool that takes none of it within the client's timeout fails the
        connection (part of the frame may be out) and the call raises DirtyTimeoutError."""
        timed_out = False
        try:
            timed_out = await conn.send(parts, self.timeout)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            conn.fail(self._lost(exc))
            raise self._lost(exc) from exc
        if timed_out:
            raise self._timed_out()

    async def _open_async(
        self, rid: int, parts: list[Any], retry: bool = True
    ) -> tuple[_AsyncConn, _Slot]:
        conn = await self._async_conn()
        if conn.broken is not None:
            raise conn.broken
        slot = _Slot()
        conn.slots[rid] = slot
        try:
            await self._send_async(conn, parts)
        except DirtyConnectionError as exc:
            conn.slots.pop(rid, None)
            cause = exc.__cause__
            if retry and not conn.slots and _peer_gone(cause):
                # The pool closed this idle connection (it restarted) before any byte of the
                # request went out: it goes on a new connection.
                return await self._open_async(rid, parts, retry=False)
            raise
        except BaseException:
            conn.slots.pop(rid, None)
            raise
        return conn, slot

    async def _next_async(
        self, conn: _AsyncConn, slot: _Slot, deadline: float | None
    ) -> tuple[int, Any]:
        """The next frame for ``slot``'s call, within ``deadline``."""
        while True:
            if slot.frames:
                return slot.frames.popleft()
            if conn.broken is not None:
                raise conn.broken
            remaining = self._time_left(deadline)
            await conn.wait(slot, remaining)

    async def _call_async(self, rid: int, parts: list[Any]) -> Any:
        conn, slot = await self._open_async(rid, parts)
        done = False
        try:
            mtype, payload = await self._next_async(conn, slot, self._deadline())
            done = True
        finally:
            conn.slots.pop(rid, None)
            if not done or mtype == CHUNK or mtype == END:
                if done and mtype == CHUNK:
                    conn.took(payload)
                conn.drop(slot)
                await _send_end(conn, rid, self.timeout)
        if mtype == CHUNK or mtype == END:
            raise _streamed(rid)
        return _result(mtype, payload)

    async def execute_async(self, app_path: str, action: str, *args: Any, **kwargs: Any) -> Any:
        """Async :meth:`execute` (asyncio or trio). Cancelling it abandons the call."""
        rid = next(self._ids)
        return await self._call_async(rid, _request(rid, app_path, action, args, kwargs))

    def stream_async(
        self, app_path: str, action: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Async :meth:`stream`; ``aclose()`` or breaking out of ``async for`` abandons it."""
        rid = next(self._ids)
        return self._stream_async(rid, _request(rid, app_path, action, args, kwargs))

    async def _stream_async(self, rid: int, parts: list[Any]) -> AsyncIterator[Any]:
        conn, slot = await self._open_async(rid, parts)
        finished = False
        try:
            while True:
                mtype, payload = await self._next_async(conn, slot, self._deadline())
                if mtype == END:
                    finished = True
                    return
                if mtype != CHUNK:
                    finished = True
                    result = _result(mtype, payload)
                    if result is not None:
                        yield result
                    return
                conn.took(payload)
                yield _result(mtype, payload)
        finally:
            conn.slots.pop(rid, None)
            conn.drop(slot)
            if not finished:
                await _send_end(conn, rid, self.timeout)

    async def _frame_async(self, frame: wire.Frame) -> Any:
        return await self._call_async(frame.request_id, [_frame_bytes(frame)])

    async def stash_request_async(
        self, op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
    ) -> Any:
        """Async :meth:`stash_request`."""
        return await self._frame_async(
            wire.make_stash(next(self._ids), op, table, key, value, pattern)
        )

    async def status_async(self) -> dict[str, Any]:
        """Async :meth:`status`."""
        return await self._frame_async(wire.make_status(next(self._ids)))

    async def close_async(self) -> None:
        """Close the async connections (every event loop's: each on its own loop, at once if
        it has ended); calls in flight on them fail with DirtyConnectionError. The next async
        call connects again."""
        self._close_async_conns()

    def _close_async_conns(self) -> None:
        with self._connect_lock:
            conns = list(self._conns.values())
            self._conns.clear()
            self._async = None
        for conn in conns:
            conn.close(DirtyConnectionError("the client was closed", self.socket_path))

    async def __aenter__(self) -> DirtyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()


async def _send_end(conn: _AsyncConn, rid: int, timeout: float | None) -> None:
    """Tell the pool a request is abandoned; safe in cleanup after a cancellation, and never
    longer than ``timeout`` (a pool that stopped reading then loses the connection)."""
    if conn.broken is not None:
        return
    await conn.send_end(wire.encode_header(END, 0, rid), timeout)


_clients: dict[tuple[int, str], DirtyClient] = {}
_clients_lock = threading.Lock()


def get_dirty_client(timeout: float | None = 30.0) -> DirtyClient:
    """The process's shared client of the pool at ``GUNICORN_DIRTY_SOCKET`` (thread-safe).

    Raises:
        DirtyError: ``GUNICORN_DIRTY_SOCKET`` is not set.
    """
    path = get_dirty_socket_path()
    key = (os.getpid(), path)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = DirtyClient(path, timeout=timeout)
        return client


async def get_dirty_client_async(timeout: float | None = 30.0) -> DirtyClient:
    """The shared client, for async code (its async calls use their own connection)."""
    await trio.lowlevel.checkpoint() if sniffio.current_async_library() == "trio" else None
    return get_dirty_client(timeout)


async def close_dirty_client_async() -> None:
    """Close the async connections of this process's shared clients (Gunicorn's name: call it
    when the app stops, e.g. at the end of a FastAPI lifespan); the clients stay usable."""
    with _clients_lock:
        clients = [c for (pid, _), c in _clients.items() if pid == os.getpid()]
    for client in clients:
        await client.close_async()


def close_dirty_client() -> None:
    """Let go of this process's shared clients (Gunicorn's name: call it when a worker or a
    thread is done). The next :func:`get_dirty_client` makes a new one. A client's sync
    connection is closed at once if no call is in flight on it; calls other threads still have
    in flight finish first (its socket then closes with it). Its async connections are closed
    too (each on its own event loop), as :func:`close_dirty_client_async` would: once the
    client is let go, nothing else could close them."""
    with _clients_lock:
        clients = [c for (pid, _), c in _clients.items() if pid == os.getpid()]
        _clients.clear()
    for client in clients:
        client._close_async_conns()
        conn = client._sync
        if conn is None or not conn.waiters:
            client.close()
        else:
            client._sync = None  # (the callers in flight hold the connection until they end)
