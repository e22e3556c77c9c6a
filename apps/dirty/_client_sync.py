"""The dirty client's sync transport: one connection shared by threads. Concurrent callers
share sends (one thread sends what the others queued) and reads (leader/follower: one waiting
thread reads for all and wakes only the calls whose frames came, one after the other), so a
lone caller reads its own reply with no thread switch. A call interrupted anywhere
(KeyboardInterrupt lands between any two bytecodes) still ends cleanly: the pool is told, or
the connection goes.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import wire

from ._client_shared import (
    _CHUNK_HEAD,
    _CHUNK_HEAD_LEN,
    _PEER_GONE,
    _ClientBase,
    _connect_error,
    _decode_value,
    _error_of,
    _frame_bytes,
    _getpid,
    _interrupted,
    _result,
    _streamed,
    _Value,
)
from ._errors import DirtyConnectionError, DirtyError, DirtyProtocolError
from ._io import BIG, send_parts, tune_socket
from ._protocol import CHUNK, END, ERROR

_allocate_lock = threading.Lock
_monotonic = time.monotonic

#: How far SO_RCVTIMEO may be from a reading call's time left before it is set again (s).
_RCVTIMEO_SLACK = 0.002
_WAITALL = socket.MSG_WAITALL
_DONTWAIT = socket.MSG_DONTWAIT


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
    reads the socket, hands every frame of the read to its waiter and, once its own reply is in,
    passes the reading role to a sleeping waiter. A lone caller so reads its own reply with no
    thread switch. The threads whose frames a read brought are woken one at a time (``ready``,
    :meth:`wake_one`): the reader wakes the first, and each woken thread the next as it takes its
    frame. Woken all at once, they would all wait for the GIL the reader holds, then for each
    other's (a futex wait and wake more per call, measured: ~10% of the client's CPU with 8
    callers). A dedicated reader thread (the hand-off of bench_dirty's shared-connection floor)
    would cost a lone caller a thread switch and, measured with 8 callers, saved nothing: futex
    calls and context switches per call the same within the host's swing (perf stat, 4
    alternated runs), client CPU per call lower in one run of 4-6 and higher in the other.
    The reading thread waits in ``poll`` for input and then reads without blocking (see
    ``poller``), not in a blocking read that the pool's taking our requests off the socket
    wakes for nothing; measured against that (the client process's rusage, alternated runs):
    a lone call's voluntary context switches 1.8-1.9 -> 0.92-0.94, its CPU 26-34 -> 25-26 us;
    with 8 callers, 1.94 -> 1.77 a call and 25.3 -> 23.5 us (medians of 8 runs each).
    ``lock`` guards everything but the socket I/O.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: The socket's SO_RCVTIMEO in seconds (None: reads block until data comes).
        self.rcvtimeo: float | None = None
        self.lock = threading.Lock()
        #: The process that connected (a forked child must not use the parent's socket).
        self.pid = _getpid()
        self.buffer = wire.FrameBuffer(error=DirtyProtocolError)
        self.waiters: dict[int, _Waiter] = {}
        #: Waiters whose thread sleeps on its ``lock``, by request id.
        self.sleeping: dict[int, _Waiter] = {}
        #: Sleeping waiters whose frames came, in the order they came, still to be woken: each
        #: thread that takes a frame wakes the first (:meth:`wake_one`), so none is left asleep.
        self.ready: deque[_Waiter] = deque()
        self.out: list[Any] = []
        self.sending = False
        #: The request id of the call whose thread reads the socket now (0: none does).
        self.reader = 0
        self.broken: DirtyError | None = None
        #: The reading thread waits here for input, then reads without blocking: a thread
        #: blocked in a read of a Unix socket is woken, for nothing, each time the pool takes
        #: bytes of ours off it (the kernel wakes every waiter of the socket when its write
        #: space grows), a lone call's once; ``poll`` for input wakes only when input comes.
        #: None: no ``poll`` on this platform (reads then block, bounded by SO_RCVTIMEO).
        self.poller: Any = None
        if hasattr(select, "poll"):
            self.poller = select.poll()
            self.poller.register(sock, select.POLLIN)

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
        for waiter in self.ready:
            waiter.lock.release()
        self.ready.clear()

    def wake_one(self) -> None:
        """Wake the next thread whose frames came while it slept, if any (lock held)."""
        if self.ready:
            self.ready.popleft().lock.release()

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
                value = wire.big_bytes(mtype, view, start, stop) if stop - start >= BIG else None
                waiter.frames.append(
                    (mtype, bytes(view[start:stop]) if value is None else _Value(value))
                )
                if rid in sleeping:
                    del sleeping[rid]
                    self.ready.append(waiter)  # (woken by ``wake_one``, in turn)
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


def _end(conn: _SyncConn, rid: int) -> None:
    """Tell the pool a request is abandoned (if the connection still works)."""
    try:
        conn.send([wire.encode_header(END, 0, rid)])
    except (DirtyError, OSError):
        pass


class _SyncCalls(_ClientBase):
    """The sync calls of a :class:`DirtyClient` (its ``_sync`` connection)."""

    _sync: _SyncConn | None

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
                raise _connect_error(self.socket_path, exc) from exc
            conn = self._sync = _SyncConn(sock)
            return conn

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
                    if conn.ready:
                        conn.wake_one()  # (the next thread whose frames came: see ``ready``)
                    return waiter.frames.popleft()
                if conn.broken is not None:
                    raise conn.broken
                # (``_time_left``, inline: this runs once per call at least)
                remaining = None
                if deadline is not None:
                    remaining = deadline - _monotonic()
                    if remaining <= 0:
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
                        if conn.sleeping.pop(rid, None) is None and waiter in conn.ready:
                            conn.ready.remove(waiter)  # (its frames came as it timed out)
                continue
            read = self._read(conn, remaining, waiter, rid, last)
            if read is not None:
                return read

    def _read(
        self, conn: _SyncConn, remaining: float | None, waiter: _Waiter, rid: int, last: bool
    ) -> tuple[int, Any] | None:
        """One read for every waiting call (this thread has the reading role): a wait in
        ``poll`` for input that gives up when this call's time is up, then a ``recv_into`` that
        does not block (see ``_SyncConn.poller``), so a lone caller reads its reply as soon as
        it comes. The rest of a large frame, and every read where there is no ``poll``, is a
        blocking ``recv_into`` bounded by SO_RCVTIMEO. Returns this call's next frame if the
        read brought it (as :meth:`_next` would)."""
        n = 0
        error: DirtyError | None = None
        timed_out = False
        try:
            buffer = conn.buffer
            # (``missing()`` only with a frame's head held: mostly the buffer is empty)
            missing = buffer.missing() if buffer.end - buffer.start >= 16 else 0
            poller = conn.poller
            if poller is not None and missing < BIG:
                # (a wait in ``poll`` for input, not in a blocking read: see ``poller``)
                poller.poll(-1 if remaining is None else remaining * 1000)
                n = conn.sock.recv_into(buffer.space(), 0, _DONTWAIT)
            else:
                if remaining is not None:
                    current = conn.rcvtimeo  # (``bound_reads``' own check first: mostly on)
                    if current is None or abs(current - remaining) > _RCVTIMEO_SLACK:
                        conn.bound_reads(remaining)
                if missing >= BIG:
                    # The rest of a large frame, in one read.
                    n = conn.sock.recv_into(buffer.space(), missing, _WAITALL)
                else:
                    n = conn.sock.recv_into(buffer.space())
            if not n:
                error = self._lost("the pool closed the connection")
        except (BlockingIOError, InterruptedError):  # the wait (or SO_RCVTIMEO) expired
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
            if conn.ready:
                conn.wake_one()  # (the first thread whose frames this read brought)
            frames = waiter.frames
            if frames:
                if conn.sleeping:
                    conn.wake_reader()  # this thread is done reading: another waiter takes over
                if last:
                    conn.waiters.pop(rid, None)
                return frames.popleft()
            if timed_out:
                conn.wake_reader()
        return None

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
            if conn.sleeping.pop(rid, None) is None and waiter in conn.ready:
                conn.ready.remove(waiter)
            conn.wake_one()  # (it may have been woken to wake the next: it does so here)
            if conn.reader == rid:
                conn.reader = 0  # interrupted with the reading role (before its read began)
            if not conn.reader:
                conn.wake_reader()  # the role may have been passed to this call as it ended
            if not had or conn.broken is not None:
                return
        _end(conn, rid)

    def _call(self, frame: wire.Frame) -> Any:
        return self._call_parts(frame.request_id, [_frame_bytes(frame)])

    def _call_parts(self, rid: int, parts: list[Any]) -> Any:
        waiter = _Waiter()
        done = False
        try:  # (from the send on: an interrupt anywhere in it still ends the call)
            conn = self._open(rid, parts, waiter)
            timeout = self.timeout
            deadline = None if timeout is None else _monotonic() + timeout
            mtype, payload = self._next(conn, rid, waiter, deadline, True)
            done = True
        finally:
            if not done:
                self._abandon(waiter, rid)
        if mtype == CHUNK or mtype == END:
            # The rest of the stream is dropped (the call is over); END stops its generator.
            _end(conn, rid)
            raise _streamed(rid)
        return _result(mtype, payload)

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

    def _close_sync(self) -> None:
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
