"""The dirty client's trio transport: trio has no read callbacks, so one waiting task at a time
reads the socket for every call on the connection and wakes only the calls whose frames came
(leader/follower, as the sync transport does); sends share a lock, and what the socket takes at
once goes out with no wait.
"""

from __future__ import annotations

import math
import os
import socket
from typing import Any

import trio

from ._client_shared import _AsyncConn, _connect_error, _interrupted, _Slot
from ._io import sent_from, tune_socket


class _TrioConn(_AsyncConn):
    """A trio run's connection: its stream, its send lock, and whether a task is reading."""

    def __init__(self, loop: Any, lost: Any) -> None:
        super().__init__(loop, lost)
        self.stream: Any = None
        self.raw: socket.socket | None = None
        self.send_lock: Any = None
        self.reading = False
        #: ENDs of abandoned calls, for the task holding the send lock to send after its
        #: frame (an abandoning task never waits behind another task's send).
        self.ends: list[bytes] = []

    @staticmethod
    def current_loop() -> Any:
        return trio.lowlevel.current_trio_token()

    @classmethod
    async def open(cls, loop: Any, socket_path: str, lost: Any) -> _TrioConn:
        conn = cls(loop, lost)
        try:
            conn.raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock = trio.socket.from_stdlib_socket(conn.raw)
            try:
                await sock.connect(socket_path)
            except BaseException:
                sock.close()
                raise
            tune_socket(conn.raw)
            conn.stream = trio.SocketStream(sock)
            conn.send_lock = trio.Lock()
        except OSError as exc:
            raise _connect_error(socket_path, exc) from exc
        return conn

    async def send(self, parts: list[Any], timeout: float | None) -> bool:
        lock = self.send_lock
        held = not lock.locked()
        if held:
            parts = _send_nowait(self.raw, parts)
            if not parts:
                return False
            lock.acquire_nowait()  # (part of the frame may be out: its rest goes next)
        with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
            if held:
                try:
                    await self._send_locked(parts)
                finally:
                    lock.release()
            else:
                async with lock:
                    await self._send_locked(parts)
        return scope.cancelled_caught

    async def _send_locked(self, parts: list[Any]) -> None:
        """Send ``parts``, then the ENDs queued meanwhile (the send lock held). Interrupted
        mid-frame (cancelled, timed out), the connection goes: the next bytes would be read as
        the frame's rest."""
        stream = self.stream
        ends = self.ends
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
            self.fail(_interrupted())
            self.discard()
            raise

    async def wait(self, slot: _Slot, remaining: float | None) -> None:
        if not self.reading:
            await self._read(slot, remaining)
            return
        slot.waiter = trio.Event()
        try:
            with trio.move_on_after(remaining if remaining is not None else math.inf):
                await slot.waiter.wait()
        except BaseException:
            # Cancelled, perhaps just as the reading role was handed to this call: it goes on
            # to another waiting call, or their replies sit unread.
            if not self.reading:
                self.wake_reader()
            raise
        finally:
            slot.waiter = None

    async def _read(self, slot: _Slot, remaining: float | None) -> None:
        """One read for every waiting call (this task has the reading role). Only the calls
        whose frames came are woken; when this task stops reading (its own frame came, or its
        wait ended), one other waiting call takes the role over."""
        self.reading = True
        data: bytes | None = None
        try:
            with trio.move_on_after(remaining if remaining is not None else math.inf):
                data = await self.stream.receive_some(262144)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.fail(self.lost(exc))
        finally:
            self.reading = False
            if data:
                self.dispatch(data)
            elif data == b"":
                self.fail(self.lost("the pool closed the connection"))
            if self.broken is None and (slot.frames or data is None):
                self.wake_reader()

    def wake_reader(self) -> None:
        """Pass the reading role to one sleeping call still waiting for its frame (one whose
        waiter is set already has been handed the role, or its frame)."""
        for slot in self.slots.values():
            waiter = slot.waiter
            if waiter is not None and not slot.frames and not waiter.is_set():
                waiter.set()
                return

    async def send_end(self, data: bytes, timeout: float | None) -> None:
        if self.send_lock.locked():
            self.ends.append(data)  # the task sending now sends it after its frame
            return
        with trio.CancelScope(shield=True) as scope:
            if timeout is not None:
                scope.deadline = trio.current_time() + timeout
            try:
                async with self.send_lock:
                    await self._send_locked([data])
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def wake(self, slot: _Slot) -> None:
        waiter = slot.waiter
        if waiter is not None:
            waiter.set()

    def close_transport(self) -> None:
        self.stream.socket.close()

    def discard(self) -> None:
        if self.stream is None:
            return
        sock = self.stream.socket
        if trio.lowlevel.in_trio_run():
            sock.close()
        elif sock.fileno() != -1:
            # Out of a trio run (its run ended, we are on asyncio): close() would tell the
            # current run's I/O manager, and there is none.
            os.close(sock.detach())

    def loop_ended(self) -> bool:
        try:
            self.loop.run_sync_soon(_nothing)
        except trio.RunFinishedError:
            return True
        return False

    def run_soon(self, fn: Any, *args: Any) -> None:
        self.loop.run_sync_soon(fn, *args)


def _nothing() -> None:
    pass


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
