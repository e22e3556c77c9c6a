"""Clients of the pool: ``DirtyClient`` (sync and async), found through ``GUNICORN_DIRTY_SOCKET``.

The API of ``gunicorn.dirty.client`` (``execute``, ``stream``, ``execute_async``,
``stream_async``, ``get_dirty_client``, ``get_dirty_client_async``), without its limits: one
client object may be shared by threads (sync calls) and by tasks (async calls, on asyncio or
trio); every call has its own request id, so many are in flight on one connection. Abandoning a
stream (breaking out of the loop) sends the pool an END for it, which stops the generator in the
worker; the client stays usable. A call that exceeds the client's ``timeout`` raises
``DirtyTimeoutError`` and is abandoned the same way.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import math
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import sniffio
import trio

import wire

from ._errors import (
    DirtyConnectionError,
    DirtyError,
    DirtyProtocolError,
    DirtyTimeoutError,
    error_from_dict,
)
from ._frames import (
    BIG,
    CHUNK,
    END,
    ERROR,
    RESPONSE,
    FrameBuffer,
    FrameSplitter,
    big_value,
    decode_payload,
    encode,
    header,
    request_parts,
    send_parts,
    sent_from,
    tune_socket,
)

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


class _Slot:
    """One async call's frames; ``waiter`` is set while its task sleeps (an asyncio future or a
    trio event)."""

    __slots__ = ("frames", "waiter")

    def __init__(self) -> None:
        self.frames: deque[tuple[int, Any]] = deque()
        self.waiter: Any = None


class _Conn:
    """The async connection: its frame splitter and the calls waiting on it.

    On asyncio the connection is a protocol: the event loop hands it each read and it wakes the
    calls it completes, so a call costs one send and one wake-up. On trio (which has no
    callbacks) one waiting task at a time reads for all of them (leader/follower, as the sync
    connection does)."""

    def __init__(self, backend: str, loop: Any) -> None:
        self.backend = backend
        self.loop = loop
        self.splitter = FrameSplitter()
        self.slots: dict[int, _Slot] = {}
        self.broken: DirtyError | None = None
        # trio: the stream, its send lock, and whether a task is reading.
        self.stream: Any = None
        self.raw: socket.socket | None = None
        self.send_lock: Any = None
        self.reading = False
        #: Bytes of CHUNK frames read but not yet taken by their streams; asyncio: whether
        #: reading is paused for them (flow control: a slow consumer leaves its stream in the
        #: socket, holding the pool back, as the sync and trio clients do).
        self.queued = 0
        self.held = False
        #: trio: ENDs of abandoned calls, for the task holding the send lock to send after its
        #: frame (an abandoning task never waits behind another task's send).
        self.ends: list[bytes] = []
        #: The process that connected (a forked child must not use the parent's socket).
        self.pid = _getpid()

    def dispatch(self, data: bytes) -> None:
        try:
            frames = self.splitter.feed(data)
        except DirtyProtocolError as exc:
            self.fail(exc)
            return
        slots = self.slots
        for mtype, rid, payload in frames:
            slot = slots.get(rid)
            if slot is not None:
                slot.frames.append((mtype, payload))
                if mtype == CHUNK:
                    self.queued += len(payload)
                _wake(slot)
            elif rid == 0 and mtype == ERROR:
                self.fail(_error_of(payload))

    def fail(self, error: DirtyError) -> None:
        if self.broken is None:
            self.broken = error
        self.wake_all()

    def wake_all(self) -> None:
        for slot in self.slots.values():
            _wake(slot)

    def took(self, payload: bytes) -> None:
        """A stream took a chunk of ``payload`` bytes (or dropped it with the stream)."""
        self.queued -= len(payload)
        if self.held and self.queued < _STREAM_LOW:
            self.release()

    def hold(self) -> None:
        """asyncio: stop reading while streams lag, unless a call waits for a frame (it would
        wait on the held-back stream: a consumer awaiting another call mid-stream)."""
        for slot in self.slots.values():
            waiter = slot.waiter
            if waiter is not None and not waiter.done():
                return
        transport = self.stream.transport
        if not transport.is_closing():
            self.held = True
            transport.pause_reading()

    def release(self) -> None:
        """asyncio: read again."""
        self.held = False
        transport = self.stream.transport
        if not transport.is_closing():
            transport.resume_reading()

    def wake_reader(self) -> None:
        """trio: pass the reading role to one sleeping call still waiting for its frame (one
        whose waiter is set already has been handed the role, or its frame)."""
        for slot in self.slots.values():
            waiter = slot.waiter
            if waiter is not None and not slot.frames and not waiter.is_set():
                waiter.set()
                return


def _wake(slot: _Slot) -> None:
    waiter = slot.waiter
    if waiter is not None:
        if type(waiter) is trio.Event:
            waiter.set()
        elif not waiter.done():
            waiter.set_result(None)


class _Protocol(asyncio.BufferedProtocol):
    """The asyncio side of a :class:`_Conn`: reads go straight to its calls."""

    def __init__(self, conn: _Conn, lost: Any) -> None:
        self.conn = conn
        self.lost = lost
        self.transport: Any = None
        self.buffer = bytearray(262144)
        self.view = memoryview(self.buffer)
        self.paused = False
        self.drained: list[asyncio.Future[None]] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        conn = self.conn
        conn.dispatch(bytes(self.view[:nbytes]))
        if conn.broken is not None and self.transport is not None:
            self.transport.close()
        elif conn.queued > _STREAM_HIGH and not conn.held:
            conn.hold()

    def eof_received(self) -> bool:
        self.conn.fail(self.lost("the pool closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.fail(self.lost(exc or "the connection was closed"))
        self._resume(exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self._resume(None)

    def _resume(self, exc: Exception | None) -> None:
        self.paused = False
        for waiter in self.drained:
            if not waiter.done():
                waiter.set_result(None)
        self.drained.clear()

    async def drain(self) -> None:
        """Wait until the transport takes writes again (its buffer went under the limit)."""
        if self.paused:
            waiter = asyncio.get_running_loop().create_future()
            self.drained.append(waiter)
            await waiter


#: An asyncio connection stops reading while more than this many bytes of stream chunks wait
#: for their consumers (and no call waits for a frame), and reads again under ``_STREAM_LOW``.
_STREAM_HIGH = 1 << 20
_STREAM_LOW = 256 << 10


def _error_of(payload: bytes) -> DirtyError:
    try:
        body = decode_payload(payload) or {}
        error = body.get("error")
        return error_from_dict(error if isinstance(error, dict) else {})
    except DirtyProtocolError as exc:
        return exc


_CHUNK_HEAD = b"\x21\x00\x00\x00\x01" + wire.tlv_encode("data", version=1)
_CHUNK_HEAD_LEN = len(_CHUNK_HEAD)
#: The value sits one level inside the payload's dict (its key and value count as two items).
_V1_LIMITS = wire.Limits(
    max_depth=wire.Limits().max_depth - 1, max_total_items=wire.Limits().max_total_items - 2
)


def _decode_value(payload: bytes) -> Any:
    """The value of a ``{data: value}`` CHUNK payload (decoded after its fixed head).

    Raises:
        DirtyProtocolError: The value is not valid TLV.
    """
    try:
        return wire.tlv_decode(payload[_CHUNK_HEAD_LEN:], version=1, limits=_V1_LIMITS)
    except wire.WireError as exc:
        raise DirtyProtocolError(f"malformed payload: {exc}") from exc


class _Value:
    """A reply's value, taken out of its payload already (see ``big_value``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _result(mtype: int, payload: Any) -> Any:
    """The value a final frame carries, or raise the error it carries."""
    if type(payload) is _Value:
        return payload.value
    if mtype == ERROR:
        raise _error_of(payload)
    body = decode_payload(payload)
    if mtype == RESPONSE:
        return (body or {}).get("result")
    if mtype == CHUNK:
        return (body or {}).get("data")
    raise DirtyProtocolError(f"unexpected message type 0x{mtype:02x} in a reply")


_allocate_lock = threading.Lock
_pid = os.getpid()


def _getpid() -> int:
    """This process's pid, without a system call per call (updated in a forked child)."""
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
#: A send's errors that say the pool closed the connection before any byte went out.
_PEER_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})
#: How far SO_RCVTIMEO may be from a reading call's time left before it is set again (s).
_RCVTIMEO_SLACK = 0.002
_WAITALL = socket.MSG_WAITALL


class _Waiter:
    """One sync call's frames; while its thread sleeps, ``lock`` is held and released to wake it.
    ``conn`` is the connection it was last registered on (what an interrupted call abandons)."""

    __slots__ = ("conn", "frames", "lock")

    def __init__(self) -> None:
        self.frames: deque[tuple[int, Any]] = deque()
        self.lock: Any = None
        self.conn: _SyncConn | None = None


class _SyncConn:
    """The sync connection, shared by threads.

    Writes: a thread queues its frame; if no thread is sending, it becomes the sender and sends
    everything queued (its frame and those queued meanwhile by others) until the queue is empty,
    so concurrent callers share sends. Reads (leader/follower): one waiting thread at a time
    reads the socket, hands every frame of the read to its waiter (waking that thread only) and,
    once its own reply is in, passes the reading role to a sleeping waiter. A lone caller so
    reads its own reply with no thread switch. ``lock`` guards everything but the socket I/O.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: The socket's SO_RCVTIMEO in seconds (None: reads block until data comes).
        self.rcvtimeo: float | None = None
        self.lock = threading.Lock()
        #: The process that connected (a forked child must not use the parent's socket).
        self.pid = _getpid()
        self.buffer = FrameBuffer()
        self.waiters: dict[int, _Waiter] = {}
        #: Waiters whose thread sleeps on its ``lock``, by request id.
        self.sleeping: dict[int, _Waiter] = {}
        self.out: list[Any] = []
        self.sending = False
        #: The request id of the call whose thread reads the socket now (0: none does).
        self.reader = 0
        self.broken: DirtyError | None = None

    def fail(self, error: DirtyError) -> None:
        """Break the connection (lock held): every call on it raises ``error``."""
        if self.broken is None:
            self.broken = error
        self.out.clear()
        self.wake_all()

    def wake_all(self) -> None:
        for waiter in self.sleeping.values():
            waiter.lock.release()
        self.sleeping.clear()

    def wake_reader(self) -> None:
        """Pass the reading role to a sleeping waiter, if any (lock held)."""
        if self.sleeping:
            waiter = self.sleeping.pop(next(iter(self.sleeping)))
            waiter.lock.release()

    def bound_reads(self, remaining: float) -> None:
        """Make a blocking read give up after about ``remaining`` seconds (the reading call's
        time left). The socket option is changed only when it is off by more than
        ``_RCVTIMEO_SLACK``: a lone caller, whose time left is the client's timeout, never
        changes it."""
        current = self.rcvtimeo
        if current is not None and abs(current - remaining) <= _RCVTIMEO_SLACK:
            return
        seconds = max(0.001, remaining)
        timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        self.rcvtimeo = seconds

    def take(self, n: int) -> None:
        """Hand the frames completed by ``n`` received bytes to their waiters (lock held).

        Raises:
            DirtyProtocolError: The pool sent bytes that are not GD v1 frames.
        """
        buffer = self.buffer
        view = buffer.view
        waiters = self.waiters
        sleeping = self.sleeping
        for mtype, rid, start, stop in buffer.frames(n):
            waiter = waiters.get(rid)
            if waiter is not None:
                value = big_value(mtype, view, start, stop) if stop - start >= BIG else None
                waiter.frames.append(
                    (mtype, bytes(view[start:stop]) if value is None else _Value(value))
                )
                if rid in sleeping:
                    del sleeping[rid]
                    waiter.lock.release()
            elif rid == 0 and mtype == ERROR:
                self.fail(_error_of(bytes(view[start:stop])))

    def send(self, parts: list[Any], rid: int = 0, waiter: _Waiter | None = None) -> None:
        """Register ``waiter`` for ``rid`` (if given) and send ``parts``, or queue them for the
        thread sending now.

        Raises:
            DirtyError: The connection is broken.
            OSError: Sending failed (the connection is then broken).
        """
        lock = self.lock
        with lock:
            if self.broken is not None:
                raise self.broken
            if waiter is not None:
                waiter.conn = self  # (first: an interrupt between the two leaves nothing to end)
                self.waiters[rid] = waiter
            if self.sending:
                self.out += parts
                return
            self.sending = True
        # ``whole``: no frame is half-sent and none taken from ``out`` is unsent. An interrupt
        # (KeyboardInterrupt, between any two bytecodes) keeps the connection only then.
        whole = False
        try:
            while True:
                send_parts(self.sock, parts)
                whole = True
                with lock:
                    if not self.out:
                        self.sending = False
                        return
                    whole = False
                    parts, self.out = self.out, []
        except BaseException as exc:
            with lock:
                self.sending = False
                interrupted = not isinstance(exc, OSError) and (not whole or bool(self.out))
                if interrupted:
                    # Part of a frame may be sent (the next bytes would be read as its rest),
                    # or frames of other threads are left unsent: the connection goes.
                    self.fail(_interrupted())
            if interrupted:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            raise


def _request(rid: int, app_path: str, action: str, args: Any, kwargs: Any) -> list[Any]:
    try:
        return request_parts(rid, app_path, action, args, kwargs)
    except wire.WireError as exc:
        raise _unsendable(exc) from exc


def _frame_bytes(frame: wire.Frame) -> bytes:
    try:
        return encode(frame)
    except wire.WireError as exc:
        raise _unsendable(exc) from exc


def _end(conn: _SyncConn, rid: int) -> None:
    """Tell the pool a request is abandoned (if the connection still works)."""
    try:
        conn.send([header(END, 0, rid)])
    except (DirtyError, OSError):
        pass


def _streamed(rid: int) -> DirtyError:
    """The error of an execute() whose action streams (Gunicorn's client raises DirtyError)."""
    return DirtyError(
        f"request {rid} was answered with a stream: the action is a streaming action (it"
        " returns a generator); call stream() or stream_async() for it, not execute()"
    )


def _unsendable(exc: wire.WireError) -> DirtyProtocolError:
    """A request the protocol cannot carry (a set, an object, an int past 64 bits, too deep,
    too large): the caller's own error, as Gunicorn's client says; nothing was sent."""
    return DirtyProtocolError(f"the request cannot be sent to the dirty pool: {exc}")


def _peer_gone(exc: BaseException | None) -> bool:
    """Whether a send failed because the pool had closed the connection (nothing went out)."""
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or exc.__context__
    return exc is not None and exc.errno in _PEER_GONE


def _discard(conn: _Conn) -> None:
    """Close an async connection's socket now, without its event loop (it may have ended)."""
    if conn.backend == "asyncio":
        sock = conn.stream.transport.get_extra_info("socket") if conn.stream else None
        raw = getattr(sock, "_sock", None)  # (asyncio's TransportSocket hides the socket)
        if raw is not None and conn.loop.is_closed():
            raw.close()
        elif conn.stream is not None:
            conn.stream.transport.abort()
    elif conn.stream is not None:
        sock = conn.stream.socket
        if trio.lowlevel.in_trio_run():
            sock.close()
        elif sock.fileno() != -1:
            # Out of a trio run (its run ended, we are on asyncio): close() would tell the
            # current run's I/O manager, and there is none.
            os.close(sock.detach())


def _current_loop() -> Any:
    """The running asyncio loop, or the current trio run's token; None outside both."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    return trio.lowlevel.current_trio_token() if trio.lowlevel.in_trio_run() else None


def _loop_ended(conn: _Conn) -> bool:
    """Whether the event loop (asyncio) or run (trio) of ``conn`` is over."""
    if conn.backend == "asyncio":
        return bool(conn.loop.is_closed())
    try:
        conn.loop.run_sync_soon(_nothing)
    except trio.RunFinishedError:
        return True
    return False


def _nothing() -> None:
    pass


def _shut(conn: _Conn, error: DirtyError) -> None:
    """Close ``conn`` on its own event loop; its calls in flight fail with ``error``."""
    conn.fail(error)
    if conn.backend == "asyncio":
        conn.stream.transport.close()  # (what is queued goes out first: the ENDs)
    else:
        conn.stream.socket.close()


def _close_conn(conn: _Conn, error: DirtyError) -> None:
    """Close an async connection from any thread or event loop: on its own loop if that
    still runs (futures and trio events are woken only from their own loop), at once if it
    has ended. One inherited across a fork is the parent's: it is left alone."""
    if conn.pid != _getpid():
        return
    if _current_loop() is conn.loop:
        _shut(conn, error)
        return
    try:
        if conn.backend == "asyncio":
            conn.loop.call_soon_threadsafe(_shut, conn, error)
        else:
            conn.loop.run_sync_soon(_shut, conn, error)
        return
    except (RuntimeError, trio.RunFinishedError):  # (asyncio: "Event loop is closed")
        pass
    if conn.broken is None:
        conn.broken = error  # (no call waits: its loop is over)
    _discard(conn)


def _interrupted() -> DirtyConnectionError:
    return DirtyConnectionError(
        "a send to the dirty pool was interrupted mid-frame; the connection was dropped (the"
        " next call opens a new one)"
    )


class DirtyClient:
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
        self._conns: dict[Any, _Conn] = {}
        #: The one of them used last: a caller on the same loop as the last finds it at once.
        self._async: _Conn | None = None

    # ------------------------------------------------------------------------ sync calls

    def connect(self) -> None:
        """Connect now (calls connect on first use anyway).

        Raises:
            DirtyConnectionError: The socket cannot be reached.
        """
        self._sync_conn()

    def _sync_conn(self) -> _SyncConn:
        conn = self._sync
        if conn is not None and conn.broken is None and conn.pid == _getpid():
            return conn
        with self._connect_lock:
            conn = self._sync
            if conn is not None and conn.pid != _getpid():
                # Inherited across a fork (gunicorn --preload): the parent's socket is not
                # ours to use or shut down; this process gets its own connection.
                self._sync = None
                conn.sock.close()
                conn = None
            if conn is not None and conn.broken is None:
                return conn
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                tune_socket(sock)
                if self.timeout is not None:
                    # Blocking sends give up after the timeout too (reads: see bound_reads).
                    seconds = max(0.001, self.timeout)
                    timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
                sock.connect(self.socket_path)
            except OSError as exc:
                sock.close()
                raise DirtyConnectionError(
                    f"cannot connect to the dirty pool at {self.socket_path}: {exc}; is the"
                    " node running, and is GUNICORN_DIRTY_SOCKET right?",
                    socket_path=self.socket_path,
                ) from exc
            conn = self._sync = _SyncConn(sock)
            return conn

    def _lost(self, exc: Any) -> DirtyConnectionError:
        return DirtyConnectionError(
            f"lost the connection to the dirty pool at {self.socket_path}: {exc}",
            socket_path=self.socket_path,
        )

    def _open(self, rid: int, parts: list[Any], waiter: _Waiter, retry: bool = True) -> _SyncConn:
        """Register ``waiter`` for ``rid`` and send the request. Interrupted, the waiter stays
        registered (``waiter.conn``) for the caller's :meth:`_abandon`, which ends the call."""
        conn = self._sync_conn()
        try:
            conn.send(parts, rid, waiter)
        except OSError as exc:
            error = self._lost(exc)
            with conn.lock:
                conn.waiters.pop(rid, None)
                idle = not conn.waiters
                closed = conn.broken  # (by close() from another thread, say: no retry then)
                conn.fail(error)
            if closed is not None:
                raise closed from exc
            if retry and idle and exc.errno in _PEER_GONE:
                # The pool closed this idle connection (it restarted): nothing of the request
                # was delivered (a Unix socket refuses the first byte), so it goes on a new one.
                return self._open(rid, parts, waiter, retry=False)
            raise error from exc
        return conn

    def _next(
        self, conn: _SyncConn, rid: int, waiter: _Waiter, deadline: float | None, last: bool
    ) -> tuple[int, Any]:
        """The next frame for ``rid`` (``last``: the call ends with it). The calling thread
        reads the socket for every waiting call when no other thread does."""
        frames = waiter.frames
        if frames and not last:
            return frames.popleft()  # only this thread takes from its waiter
        lock = conn.lock
        while True:
            # (``with``, not acquire/release: a KeyboardInterrupt can land between any two
            # bytecodes, and must never leave the lock held.)
            with lock:
                if waiter.frames:
                    if last:
                        conn.waiters.pop(rid, None)
                    return waiter.frames.popleft()
                if conn.broken is not None:
                    raise conn.broken
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise self._timed_out()
                if conn.reader:
                    sleeper = waiter.lock = _allocate_lock()
                    sleeper.acquire()
                    conn.sleeping[rid] = waiter
                else:
                    conn.reader = rid
                    sleeper = None
            if sleeper is not None:
                if not sleeper.acquire(True, -1 if remaining is None else remaining):
                    with lock:
                        conn.sleeping.pop(rid, None)
                continue
            read = self._read(conn, remaining, waiter, rid, last)
            if read is not None:
                return read

    def _read(
        self, conn: _SyncConn, remaining: float | None, waiter: _Waiter, rid: int, last: bool
    ) -> tuple[int, Any] | None:
        """One read for every waiting call (this thread has the reading role): a blocking
        ``recv_into`` that gives up when this call's time is up (SO_RCVTIMEO), so a read costs
        one system call and a lone caller reads its reply as soon as it comes. Returns this
        call's next frame if the read brought it (as :meth:`_next` would)."""
        n = 0
        error: DirtyError | None = None
        timed_out = False
        try:
            if remaining is not None:
                conn.bound_reads(remaining)
            missing = conn.buffer.missing()
            if missing >= BIG:
                # The rest of a large frame, in one read.
                n = conn.sock.recv_into(conn.buffer.space(), missing, _WAITALL)
            else:
                n = conn.sock.recv_into(conn.buffer.space())
            if not n:
                error = self._lost("the pool closed the connection")
        except (BlockingIOError, InterruptedError):  # SO_RCVTIMEO expired
            timed_out = True
        except OSError as exc:
            error = self._lost(exc)
        except DirtyProtocolError as exc:
            error = exc
        except BaseException:  # (KeyboardInterrupt, ...): another waiter reads on
            with conn.lock:
                conn.reader = 0
                conn.wake_reader()
            raise
        with conn.lock:
            conn.reader = 0
            if n:
                try:
                    conn.take(n)
                except DirtyProtocolError as exc:
                    error = exc
            if error is not None:
                conn.fail(error)
            frames = waiter.frames
            if frames:
                conn.wake_reader()  # this thread is done reading: another waiter takes over
                if last:
                    conn.waiters.pop(rid, None)
                return frames.popleft()
            if timed_out:
                conn.wake_reader()
        return None

    def _timed_out(self) -> DirtyTimeoutError:
        return DirtyTimeoutError(
            f"the dirty call did not finish within the client's timeout={self.timeout}s",
            timeout=self.timeout,
        )

    def _abandon(self, waiter: _Waiter, rid: int) -> None:
        """End a call left early (timeout, error, interrupt, a stream closed): unregister it
        and, if its request went out on a working connection, send the pool its END."""
        conn = waiter.conn
        if conn is None:
            return  # interrupted before it was registered: nothing was sent
        with conn.lock:
            had = conn.waiters.get(rid) is waiter
            if had:
                del conn.waiters[rid]
            conn.sleeping.pop(rid, None)
            if conn.reader == rid:
                conn.reader = 0  # interrupted with the reading role (before its read began)
            if not conn.reader:
                conn.wake_reader()  # the role may have been passed to this call as it ended
            if not had or conn.broken is not None:
                return
        _end(conn, rid)

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _call(self, frame: wire.Frame) -> Any:
        return self._call_parts(frame.request_id, [_frame_bytes(frame)])

    def _call_parts(self, rid: int, parts: list[Any]) -> Any:
        waiter = _Waiter()
        done = False
        try:  # (from the send on: an interrupt anywhere in it still ends the call)
            conn = self._open(rid, parts, waiter)
            mtype, payload = self._next(conn, rid, waiter, self._deadline(), True)
            done = True
        finally:
            if not done:
                self._abandon(waiter, rid)
        if mtype == CHUNK or mtype == END:
            # The rest of the stream is dropped (the call is over); END stops its generator.
            _end(conn, rid)
            raise _streamed(rid)
        return _result(mtype, payload)

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

    def _stream(self, rid: int, parts: list[Any]) -> Iterator[Any]:
        waiter = _Waiter()
        finished = False
        frames = waiter.frames
        try:
            conn = self._open(rid, parts, waiter)
            while True:
                if frames:  # chunks already read: no lock (only this thread takes them)
                    mtype, payload = frames.popleft()
                else:
                    mtype, payload = self._next(conn, rid, waiter, self._deadline(), False)
                if mtype == CHUNK:
                    if type(payload) is bytes and payload[:_CHUNK_HEAD_LEN] == _CHUNK_HEAD:
                        yield _decode_value(payload)
                    else:
                        yield _result(mtype, payload)
                    continue
                finished = True
                with conn.lock:
                    conn.waiters.pop(rid, None)
                if mtype != END:
                    result = _result(mtype, payload)
                    if result is not None:
                        yield result
                return
        finally:
            if not finished:
                self._abandon(waiter, rid)

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
        with self._connect_lock:
            conn, self._sync = self._sync, None
        if conn is not None and conn.pid != _getpid():
            conn.sock.close()  # inherited across a fork: the parent's calls go on
        elif conn is not None:
            with conn.lock:
                conn.fail(DirtyConnectionError("the client was closed", self.socket_path))
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.sock.close()

    def __enter__(self) -> DirtyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------- async calls

    async def connect_async(self) -> None:
        """Connect the async connection now (done on first use anyway)."""
        await self._async_conn()

    async def _async_conn(self) -> _Conn:
        backend = sniffio.current_async_library()
        loop: Any = (
            asyncio.get_running_loop()
            if backend == "asyncio"
            else trio.lowlevel.current_trio_token()
        )
        conn = self._async
        if conn is not None and conn.broken is None and conn.loop is loop and conn.pid == _getpid():
            return conn
        conn = self._conns.get(loop)
        if conn is not None and conn.broken is None and conn.pid == _getpid():
            self._async = conn  # (event loops taking turns: each keeps its connection)
            return conn
        conn = await self._connect_async(backend, loop)
        with self._connect_lock:
            current = self._conns.get(loop)
            if current is not None and current.broken is None and current.pid == conn.pid:
                # Another task of this loop connected meanwhile: one connection per loop.
                _discard(conn)
                return current
            ended = self._prune(loop)
            self._conns[loop] = self._async = conn
        for old in ended:
            _discard(old)
        return conn

    def _prune(self, loop: Any) -> list[_Conn]:
        """Drop the connections of event loops that have ended (and, for a forked child, its
        parent's); return those to close (connect lock held)."""
        pid = _getpid()
        ended: list[_Conn] = []
        for key, conn in list(self._conns.items()):
            if conn.pid != pid:
                del self._conns[key]  # the parent's: not ours to close
            elif key is not loop and _loop_ended(conn):
                del self._conns[key]
                ended.append(conn)
        return ended

    async def _connect_async(self, backend: str, loop: Any) -> _Conn:
        """A new async connection on the current event loop.

        Raises:
            DirtyConnectionError: The socket cannot be reached.
        """
        conn = _Conn(backend, loop)
        try:
            if backend == "asyncio":
                _, conn.stream = await loop.create_unix_connection(
                    lambda: _Protocol(conn, self._lost), self.socket_path
                )
            else:
                conn.raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock = trio.socket.from_stdlib_socket(conn.raw)
                try:
                    await sock.connect(self.socket_path)
                except BaseException:
                    sock.close()
                    raise
                tune_socket(conn.raw)
                conn.stream = trio.SocketStream(sock)
                conn.send_lock = trio.Lock()
        except OSError as exc:
            raise DirtyConnectionError(
                f"cannot connect to the dirty pool at {self.socket_path}: {exc}; is the node"
                " running, and is GUNICORN_DIRTY_SOCKET right?",
                socket_path=self.socket_path,
            ) from exc
        return conn

    async def _send_async(self, conn: _Conn, parts: list[Any]) -> None:
        """Send a request; a pool that takes none of it within the client's timeout fails the
        connection (part of the frame may be out) and the call raises DirtyTimeoutError."""
        timed_out = False
        try:
            if conn.backend == "asyncio":
                protocol = conn.stream
                if protocol.transport.is_closing():
                    raise ConnectionResetError("the connection is closing")
                protocol.transport.writelines(parts)
                if protocol.paused:
                    timed_out = await _drain(protocol, self.timeout)
            else:
                timed_out = await self._send_trio(conn, parts)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            conn.fail(self._lost(exc))
            raise self._lost(exc) from exc
        if timed_out:
            raise self._timed_out()

    async def _send_trio(self, conn: _Conn, parts: list[Any]) -> bool:
        """trio: send ``parts``; True if the client's timeout passed first. What the socket
        takes at once goes out with no wait (and no cancel scope to pay for)."""
        lock = conn.send_lock
        held = not lock.locked()
        if held:
            parts = _send_nowait(conn.raw, parts)
            if not parts:
                return False
            lock.acquire_nowait()  # (part of the frame may be out: its rest goes next)
        with trio.move_on_after(math.inf if self.timeout is None else self.timeout) as scope:
            if held:
                try:
                    await _send_locked(conn, parts)
                finally:
                    lock.release()
            else:
                async with lock:
                    await _send_locked(conn, parts)
        return scope.cancelled_caught

    async def _open_async(
        self, rid: int, parts: list[Any], retry: bool = True
    ) -> tuple[_Conn, _Slot]:
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
        self, conn: _Conn, slot: _Slot, deadline: float | None
    ) -> tuple[int, Any]:
        """The next frame for ``slot``'s call, within ``deadline``."""
        while True:
            if slot.frames:
                return slot.frames.popleft()
            if conn.broken is not None:
                raise conn.broken
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self._timed_out()
            if conn.backend == "asyncio":
                if conn.held:
                    conn.release()  # (its frame may be behind the held-back streams)
                slot.waiter = conn.loop.create_future()
                try:
                    async with asyncio.timeout(remaining):
                        await slot.waiter
                except TimeoutError:
                    pass
                finally:
                    slot.waiter = None
            elif conn.reading:
                slot.waiter = trio.Event()
                try:
                    with trio.move_on_after(remaining if remaining is not None else math.inf):
                        await slot.waiter.wait()
                except BaseException:
                    # Cancelled, perhaps just as the reading role was handed to this call: it
                    # goes on to another waiting call, or their replies sit unread.
                    if not conn.reading:
                        conn.wake_reader()
                    raise
                finally:
                    slot.waiter = None
            else:
                await self._read_trio(conn, slot, remaining)

    async def _read_trio(self, conn: _Conn, slot: _Slot, remaining: float | None) -> None:
        """One read for every waiting call (this task has the reading role). Only the calls
        whose frames came are woken; when this task stops reading (its own frame came, or its
        wait ended), one other waiting call takes the role over."""
        conn.reading = True
        data: bytes | None = None
        try:
            with trio.move_on_after(remaining if remaining is not None else math.inf):
                data = await conn.stream.receive_some(262144)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            conn.fail(self._lost(exc))
        finally:
            conn.reading = False
            if data:
                conn.dispatch(data)
            elif data == b"":
                conn.fail(self._lost("the pool closed the connection"))
            if conn.broken is None and (slot.frames or data is None):
                conn.wake_reader()

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
                _drop(conn, slot)
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
            _drop(conn, slot)
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
            _close_conn(conn, DirtyConnectionError("the client was closed", self.socket_path))

    async def __aenter__(self) -> DirtyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()


def _send_nowait(sock: Any, parts: list[Any]) -> list[Any]:
    """Send what the (non-blocking) socket takes of ``parts`` at once; return the rest, as
    byte views (none: all went out).

    Raises:
        OSError: The socket failed.
    """
    views = [memoryview(p).cast("B") for p in parts]
    try:
        n = sock.sendmsg(views[:512])
    except BlockingIOError:
        return views
    sent_from(views, n)
    return views


def _drop(conn: _Conn, slot: _Slot) -> None:
    """Let go of the chunks an ended call leaves unread (for flow control)."""
    for mtype, payload in slot.frames:
        if mtype == CHUNK:
            conn.took(payload)
    slot.frames.clear()


async def _drain(protocol: _Protocol, timeout: float | None) -> bool:
    """Wait until the transport takes writes again; True if ``timeout`` passed first (the
    connection is then dropped: part of a frame may be out)."""
    try:
        async with asyncio.timeout(timeout):
            await protocol.drain()
    except TimeoutError:
        protocol.conn.fail(_interrupted())
        protocol.transport.abort()
        return True
    return False


async def _send_locked(conn: _Conn, parts: list[Any]) -> None:
    """Send ``parts``, then the ENDs queued meanwhile (the send lock held). Interrupted
    mid-frame (cancelled, timed out), the connection goes: the next bytes would be read as the
    frame's rest."""
    stream = conn.stream
    ends = conn.ends
    try:
        for part in parts:
            await stream.send_all(part)
        while ends:
            data = b"".join(ends)
            ends.clear()
            await stream.send_all(data)
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        raise
    except BaseException:
        conn.fail(_interrupted())
        _discard(conn)
        raise


async def _send_end(conn: _Conn, rid: int, timeout: float | None) -> None:
    """Tell the pool a request is abandoned; safe in cleanup after a cancellation, and never
    longer than ``timeout`` (a pool that stopped reading then loses the connection)."""
    if conn.broken is not None:
        return
    data = header(END, 0, rid)
    if conn.backend == "asyncio":
        try:
            conn.stream.transport.write(data)  # in order with other writes; no await needed
        except (OSError, RuntimeError):
            pass
        return
    if conn.send_lock.locked():
        conn.ends.append(data)  # the task sending now sends it after its frame
        return
    with trio.CancelScope(shield=True) as scope:
        if timeout is not None:
            scope.deadline = trio.current_time() + timeout
        try:
            async with conn.send_lock:
                await _send_locked(conn, [data])
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


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
