"""The worker's end of its socket (:class:`Output`): frames written from the loop and from
action threads, sent at once when nothing is queued, else batched by the loop.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

#: Pending output (bytes) above which a streaming generator waits for the socket to drain.
HIGH_WATER = 4 << 20


class Output:
    """The worker's end of its socket, written from the loop and from action threads.

    A frame is sent at once (one ``write``, or ``sendmsg`` of its parts, from the calling
    thread; the socket is non-blocking) when nothing is queued, nobody else is sending and the
    loop is not gathering a batch (``cork``); otherwise, and for stream chunks
    (``write_deferred``), it is queued and the loop sends the queue (one ``sendmsg`` of many
    frames) when the batch ends or the socket has room. Order is kept:
    nothing overtakes a queued frame or a send in progress. The lock guards the queue and the
    flags only; no thread holds it while sending.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        # (Every send must not block: ``write`` writes the descriptor itself.)
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.lock = threading.Lock()
        self.queue: list[Any] = []
        self.size = 0
        self.corked = False
        self.sending = False
        #: Notified whenever a send ends while ``write_through`` callers (``through``) wait.
        self.sent = threading.Condition(self.lock)
        self.through = 0
        self.scheduled = False
        self.watching = False
        self.closed = False
        self.room = threading.Event()
        self.room.set()
        #: Loop-side waits (set by ``flush`` only): room below the high-water mark; all sent.
        self.has_room = asyncio.Event()
        self.drained = asyncio.Event()
        self.loop_thread = threading.get_ident()

    def write(self, data: bytes) -> None:
        """Send ``data`` now if nothing is queued (any thread): :meth:`write_parts` of one
        buffer, with one ``write`` (a reply's common case; the socket is non-blocking)."""
        if not self._claim([data]):
            return
        try:
            n = _write(self.fd, data)  # (the socket is non-blocking)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            n = -1
        self._sent(n, [] if n < 0 or n == len(data) else [memoryview(data)[n:] if n else data])

    def write_parts(self, parts: list[Any]) -> None:
        """Send the buffers (one frame or more) now if nothing is queued (any thread)."""
        if not self._claim(parts):
            return
        try:
            n = self.sock.sendmsg(parts, (), _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            n = -1
        self._sent(n, [] if n < 0 else _rest(parts, n))

    def _claim(self, parts: list[Any]) -> bool:
        """Become the sending thread (True), or queue ``parts`` behind what is queued, being
        sent or gathered (False)."""
        with self.lock:
            if self.closed:
                return False
            if self.queue or self.corked or self.sending:
                self._enqueue(parts)
                return False
            self.sending = True
            return True

    def _sent(self, n: int, rest: list[Any]) -> None:
        """The sending thread's send is over: ``n`` bytes went (-1: the socket failed), and
        ``rest`` goes first in the queue, for the loop."""
        with self.lock:
            self.sending = False
            if self.through:
                self.sent.notify_all()
            if n < 0:
                self._close()
                return
            if rest:
                self.queue[:0] = rest
                for part in rest:
                    self.size += len(part)
            if self.queue:
                self._schedule()

    def write_through(self, data: bytes) -> None:
        """Send ``data`` (a thread's, never the loop's) and return once all of it is in the
        socket, or the socket failed: what the pool must know before the thread goes on."""
        self.write(data)
        with self.lock:
            self.through += 1
            while not self.closed and (self.sending or _holds(self.queue, data)):
                self.sent.wait(0.05)
            self.through -= 1

    def write_deferred(self, data: bytes) -> None:
        """Queue ``data``; the loop writes the queue soon, coalescing frames (any thread)."""
        with self.lock:
            if self.closed:
                return
            self.queue.append(data)
            self.size += len(data)
            if self.size >= HIGH_WATER:
                self.room.clear()
            if self.scheduled or self.watching or self.corked or self.sending:
                return
            self.scheduled = True
        if threading.get_ident() == self.loop_thread:
            self.loop.call_soon(self.flush)
        else:
            self.loop.call_soon_threadsafe(self.flush)

    def cork(self) -> None:
        """Reader side: gather what is written until :meth:`uncork` (one send for a batch)."""
        self.corked = True

    def uncork(self) -> None:
        """Reader side: send what was gathered since :meth:`cork`."""
        with self.lock:
            self.corked = False
            go = bool(self.queue) and not self.watching and not self.sending
        if go:
            self.flush()

    def _enqueue(self, parts: Any) -> None:
        # Called with the lock held.
        self.queue.extend(parts)
        for part in parts:
            self.size += len(part)
        if self.size >= HIGH_WATER:
            self.room.clear()
        if not self.corked and not self.sending:
            self._schedule()

    def _schedule(self) -> None:
        # Called with the lock held: the loop will flush the queue.
        if self.scheduled or self.watching:
            return
        self.scheduled = True
        if threading.get_ident() == self.loop_thread:
            self.loop.call_soon(self.flush)
        else:
            self.loop.call_soon_threadsafe(self.flush)

    def _close(self) -> None:
        # Called with the lock held: the socket failed.
        self.closed = True
        self.queue = []
        self.size = 0
        self._roomy(True)
        self._unwatch()

    def flush(self) -> None:
        """Write what is queued (the loop, or the reader thread ending a batch); if the socket
        is full, the loop waits for room and writes the rest."""
        with self.lock:
            self.scheduled = False
            if self.sending:
                return  # the sending thread schedules a flush when it is done
            if self.closed or not self.queue:
                self._unwatch()
                self._roomy(True)
                return
            queue, self.queue = self.queue, []
            self.sending = True
        failed = False
        sent = 0
        while queue:
            batch = queue[:_IOV_MAX]
            try:
                n = self.sock.sendmsg(batch, (), _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                failed = True
                break
            sent += n
            rest = _rest(batch, n)
            del queue[: len(batch)]
            if rest:
                queue[:0] = rest
                break
        with self.lock:
            self.sending = False
            if self.through:
                self.sent.notify_all()
            if failed:
                self._close()
                return
            self.size -= sent
            if queue:
                self.queue[:0] = queue
            if not self.queue:
                self.size = 0
                self._unwatch()
            elif not queue:
                self._schedule()  # written meanwhile by threads: the socket has room
            elif not self.watching:
                if threading.get_ident() == self.loop_thread:
                    self.watching = True
                    self.loop.add_writer(self.fd, self.flush)
                else:
                    self._schedule()  # the loop's flush waits for room
            if self.size < HIGH_WATER:
                self._roomy(not self.size)

    def _roomy(self, drained: bool) -> None:
        # Called with the lock held: below the high-water mark (and ``drained``: all sent).
        # The events are set only when cleared: setting a threading.Event takes its lock.
        if not self.room.is_set():
            self.room.set()
        if not self.has_room.is_set():
            self.has_room.set()
        if drained and not self.drained.is_set():
            self.drained.set()

    async def wait_room(self) -> None:
        """Loop side: wait until the queue is below the high-water mark."""
        if self.size > HIGH_WATER and not self.closed:
            self.has_room.clear()
            await self.has_room.wait()

    async def wait_drained(self, timeout: float) -> None:
        """Loop side: wait (at most ``timeout`` seconds) until everything queued is sent."""
        if self.size and not self.closed:
            self.drained.clear()
            try:
                await asyncio.wait_for(self.drained.wait(), timeout)
            except TimeoutError:
                pass

    def _unwatch(self) -> None:
        if self.watching:
            self.watching = False
            if threading.get_ident() == self.loop_thread:
                self.loop.remove_writer(self.fd)
            else:
                self.loop.call_soon_threadsafe(self.loop.remove_writer, self.fd)

    def backlog(self) -> int:
        return self.size


_IOV_MAX = 1024
_DONTWAIT = socket.MSG_DONTWAIT
#: (os.write takes its arguments positionally: socket.send parses a format, ~700 instructions)
_write = os.write


def _holds(queue: list[Any], data: bytes) -> bool:
    """Whether ``data`` (or what is left of it to send) is in ``queue``."""
    return any(part is data or (type(part) is memoryview and part.obj is data) for part in queue)


def _rest(parts: Any, n: int) -> list[Any]:
    """The part of ``parts`` not in the first ``n`` bytes sent."""
    for i, part in enumerate(parts):
        size = len(part)
        if n < size:
            return [memoryview(part)[n:] if n else part, *parts[i + 1 :]]
        n -= size
    return []
