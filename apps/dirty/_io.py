"""Socket I/O of the dirty pool's node side and its clients: batched writes to non-blocking
sockets (:class:`Outbox`, :class:`Batch`), the read loop's pacing (:class:`SocketReader`), and
socket tuning. One frame goes from the process that has it straight into the destination's
socket (a connection's reader into a worker's socket, a worker proxy's reader into a client's),
with no mailbox hop and one ``writev`` per destination per read.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Coroutine
from typing import Any

import trio

import wire

from ._config import DirtyConfig

#: The request id's place in a frame header (bytes 8..16).
RID = struct.Struct(">Q")
BIG = wire.BIG_BYTES
_append = wire.append_readdressed
_wait_readable = trio.lowlevel.wait_readable
_checkpoint = trio.lowlevel.checkpoint

#: Socket buffer size asked for on every pool socket, so a 1 MiB frame moves in one write
#: (Linux caps it at ``net.core.wmem_max``/``rmem_max``; failure is harmless).
SOCKET_BUFFER = 4 << 20
_IOV_MAX = 1024
#: A client connection holding more than this, unsent, is a slow reader: its connection takes
#: no more of its requests until it is down to ``LOW_WATER``, for at most ``SEND_TIMEOUT``;
#: past its budget (``dirty_client_buffer``) the worker proxy that wrote it reads no more from
#: its worker meanwhile (the kernel then pushes back on the worker's streams).
HIGH_WATER = 8 << 20
LOW_WATER = 2 << 20
#: How long one slow client may hold up a worker (Ranch's ``send_timeout`` default): it is
#: then dropped, its requests abandoned, so the worker's other callers are not held longer.
#: Never longer than ``dirty_timeout``, the longest the pool otherwise lets a call wait.
SEND_TIMEOUT = 30.0
#: Reads a socket's reader takes back to back (while the socket has data, skipping the wait
#: for readiness) before it lets the node's other tasks run.
BUSY_READS = 8


class Batch:
    """Frames for one destination, gathered while one read's frames are handled and written
    with one ``writev``. Small frames are copied into one buffer; a large payload is kept as a
    view of the receive buffer (no copy), so the batch must be written before the next read.
    """

    __slots__ = ("parts", "small")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.small = bytearray()

    def frame(self, view: memoryview, start: int, stop: int, rid: int) -> None:
        """Add the frame whose payload is ``view[start:stop]``, re-addressed to ``rid``."""
        if stop - start < BIG:
            # (One C call where wire's fast paths are built: a slice, an append and a pack cost
            # a forwarded frame ~8% of the node's time at 8 callers.)
            if _append(self.small, view, start, stop, rid) is None:
                wire.readdress_into(self.small, view, start, stop, rid)
        else:
            head = bytearray(view[start - 16 : start])
            RID.pack_into(head, 8, rid)
            if self.small:
                self.parts.append(self.small)
                self.small = bytearray()
            self.parts.append(head)
            self.parts.append(view[start:stop])

    def run(self, view: memoryview, frames: list[Any], first: int, last: int, rid: int) -> None:
        """Add ``frames[first:last]`` (back to back in ``view``, all small), re-addressed to
        ``rid``, with one copy."""
        begin = frames[first][2] - 16
        small = self.small
        base = len(small) - begin - 8
        small += view[begin : frames[last - 1][3]]
        pack_into = RID.pack_into
        for k in range(first, last):
            pack_into(small, base + frames[k][2], rid)

    def add(self, data: bytes) -> None:
        """Add encoded frames."""
        self.small += data

    def take(self) -> list[Any]:
        """The buffers to write (the batch is then empty)."""
        parts = self.parts
        if self.small:
            parts.append(self.small)
            self.small = bytearray()
        self.parts = []
        return parts


class Outbox:
    """Ordered, synchronous writes to a non-blocking socket.

    ``write``/``writev`` send at once (one ``writev``) while nothing is queued; what the socket
    does not take is copied and queued for ``run`` (a task of the owner) to send when it is
    writable. Any task of the node may write (trio runs them on one thread), so a frame goes
    from one process straight to another's socket without a mailbox hop.

    ``size`` counts the queued bytes: a writer that must not outrun the reader waits, once it
    is over ``HIGH_WATER``, with :meth:`wait_room` (writes themselves never block or refuse).
    """

    __slots__ = ("_idle", "_room", "_wake", "broken", "buf", "closed", "fd", "on_broken", "size")

    def __init__(self, fd: int, on_broken: Any = None) -> None:
        self.fd = fd
        self.buf: list[Any] = []
        self.size = 0
        self.closed = False
        self.broken = False
        self.on_broken = on_broken
        self._wake = trio.Event()
        self._idle: trio.Event | None = None
        self._room: trio.Event | None = None

    def write(self, data: bytes) -> None:
        """Send ``data`` (or queue it behind what is queued)."""
        if self.closed or not data:
            return
        if self.buf:
            self.buf.append(data)
            self.size += len(data)
            return
        self.writev([data])

    def writev(self, parts: list[Any]) -> None:
        """Send the buffers in order; views (of a receive buffer) are copied if queued."""
        if self.closed or not parts:
            return
        if self.buf:
            self._queue(parts, 0)
            return
        fd = self.fd
        i = 0
        while i < len(parts):
            chunk = parts[i : i + _IOV_MAX] if i or len(parts) > _IOV_MAX else parts
            try:
                n = os.writev(fd, chunk)
            except BlockingIOError:
                n = 0
            except OSError:
                self._break()
                return
            for part in chunk:
                size = len(part)
                if n >= size:
                    n -= size
                    i += 1
                    continue
                # The socket is full: queue the rest (copied: views die with the next read).
                rest = bytes(memoryview(part)[n:])
                self.buf.append(rest)
                self.size += len(rest)
                self._queue(parts, i + 1)
                self._wake.set()
                return

    def _queue(self, parts: list[Any], first: int) -> None:
        buf = self.buf
        size = self.size
        for k in range(first, len(parts)):
            data = bytes(parts[k])  # (a view of a receive buffer dies with its next read)
            buf.append(data)
            size += len(data)
        self.size = size

    def _break(self) -> None:
        self.closed = self.broken = True
        self._drop()
        if self.on_broken is not None:
            self.on_broken()

    def abort(self) -> None:
        """Drop what is queued and stop writing, as if the socket broke (``on_broken`` runs)."""
        if not self.closed:
            self._break()

    def close(self) -> None:
        """No more writes (before the socket is closed: its fd number may be reused)."""
        self.closed = True
        self._drop()

    def _drop(self) -> None:
        self.buf.clear()
        self.size = 0
        self._wake.set()
        self._idled()
        self._roomy()

    def _idled(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    def _roomy(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    async def run(self) -> None:
        """Send what ``write`` queued, as the socket takes it."""
        buf = self.buf
        while not self.closed:
            if not buf:
                self._idled()
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            await trio.lowlevel.wait_writable(self.fd)
            while buf and not self.closed:
                chunk = buf[:_IOV_MAX]
                try:
                    n = os.writev(self.fd, chunk)
                except BlockingIOError:
                    break
                except OSError:
                    self._break()
                    return
                self.size -= n
                if self._room is not None and self.size <= LOW_WATER:
                    self._roomy()
                done = 0
                for data in chunk:
                    if n < len(data):
                        break
                    n -= len(data)
                    done += 1
                del buf[:done]
                if n:
                    buf[0] = memoryview(buf[0])[n:]
                if done < len(chunk):
                    break

    async def flush(self) -> None:
        """Wait until everything written has been sent (or the socket broke)."""
        while self.buf and not self.closed:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    async def wait_room(self) -> None:
        """Wait until at most ``LOW_WATER`` bytes are queued (or the outbox is closed).
        Cancelling the wait leaves the outbox as it is."""
        while self.size > LOW_WATER and not self.closed:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()


class SocketReader:
    """The read side of one socket into a :class:`wire.FrameBuffer`: one ``readv`` at a time,
    waiting for readiness only when the last read drained the socket, and letting the node's
    other tasks run after ``BUSY_READS`` reads back to back.

    The owner's loop::

        if (wait := reader.pace()) is not None:
            await wait               # (the wait, when the socket was drained)
        n = reader.read()            # -1: nothing was there; 0: the peer's end of input
        frames = reader.buffer.frames(n)
    """

    __slots__ = ("buffer", "busy", "drained", "fd")

    def __init__(self, fd: int, buffer: wire.FrameBuffer) -> None:
        self.fd = fd
        self.buffer = buffer
        self.busy = 0
        #: The last read did not fill the buffer: the next waits for the socket.
        self.drained = True

    def pace(self) -> Coroutine[Any, Any, None] | None:
        """What to await before the next read, or None: read at once. The socket's readiness
        if the last read drained it; else, after ``BUSY_READS`` reads in a row, a checkpoint
        (the other tasks run). (A wait to await, not a coroutine of its own: one coroutine
        less to enter and resume on every wake-up.)

        Awaiting it raises:
            trio.ClosedResourceError: The socket was closed meanwhile.
        """
        if self.drained:
            return self.readable()
        if self.busy == BUSY_READS:
            self.busy = 0
            return _checkpoint()
        return None

    def readable(self) -> Coroutine[Any, Any, None]:
        """The wait for the socket to be readable (:meth:`pace` when the last read drained it).

        Awaiting it raises:
            trio.ClosedResourceError: The socket was closed meanwhile.
        """
        self.busy = 0
        return _wait_readable(self.fd)

    def read(self) -> int:
        """Read once into the buffer's free space: the bytes read, 0 at the end of the peer's
        input, -1 if nothing was waiting.

        Raises:
            OSError: The socket failed.
            Exception: The buffer's ``error`` for a bad frame header at its front.
        """
        space = self.buffer.space()
        try:
            n = os.readv(self.fd, [space])
        except BlockingIOError:
            self.drained = True
            return -1
        self.busy += 1
        self.drained = n < len(space)
        return n


def send_timeout(config: DirtyConfig) -> float:
    """How long a client that takes nothing of its replies is waited for before it is dropped:
    ``SEND_TIMEOUT``, or ``dirty_timeout`` if shorter."""
    timeout = config.dirty_timeout
    return min(SEND_TIMEOUT, timeout) if timeout else SEND_TIMEOUT


def tune_socket(sock: Any) -> None:
    """Ask for large send/receive buffers on a (stdlib or trio) Unix socket."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


def send_parts(sock: socket.socket, parts: list[Any]) -> None:
    """``sendall`` of the buffers' concatenation with ``sendmsg`` (no joining copy).

    Raises:
        OSError: The socket failed (or timed out).
    """
    if len(parts) == 1:
        sock.sendall(parts[0])
        return
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent_from(views, sock.sendmsg(views[:512]))


def sent_from(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes (just sent) from ``views``, in place."""
    while n:
        first = views[0]
        if n >= len(first):
            n -= len(first)
            views.pop(0)
        else:
            views[0] = first[n:]
            n = 0
