"""The write side of an SDK connection (``_sdk_connection.py``): frames written straight to a
plain socket when nobody else is writing, a backlog a flusher task writes in order otherwise,
writes from any thread (a worker's handler threads), and the cork that gathers the frames the
reader's deliveries of one read answer with into one write.

One write per read rather than per frame: under load a worker's read brings several TASKs,
and each quick call answers at once (``_worker_quick.py``); one system call for all of them,
and one wake-up of the server's connection instead of one each.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

import trio

import wire

from ._errors import ClientClosed, MatchingError
from ._sdk_calls import HeldCalls

__all__ = ["SdkWrites"]


class SdkWrites:
    """Writes of one connection, mixed into ``SdkConnection``, which sets these attributes
    and provides :meth:`_check_open` and :meth:`_lost`."""

    _frames: wire.FrameStream
    codec: wire.Codec
    _where: str
    #: The turn of a writer that waits (:meth:`send`, the flusher): it writes only what is
    #: in the backlog, so a frame it has half written is always the backlog's head.
    _write_lock: trio.Lock
    #: Encoded frames not written at once, in order (the head may be half written); a
    #: flusher task (or the next :meth:`send`) writes them before anything else.
    _backlog: deque[bytes | memoryview]
    #: A flusher will look at the backlog (a task is started, or a send flushes it).
    _flushing: bool
    #: Held (by any thread) to write at once or to touch the backlog or the cork: a frame is
    #: never written into the middle of another, whichever thread writes (see
    #: :meth:`send_threadsafe`). Re-entrant: an owner may hold it around its own writes.
    write_lock: threading.RLock
    #: Set (under :attr:`write_lock`) once the connection is lost: no thread writes after.
    _shut: bool
    _token: trio.lowlevel.TrioToken
    _nursery: trio.Nursery | None
    _closed: trio.Event
    _held: HeldCalls
    #: The descriptor of a plain socket (not TLS), written to directly by :meth:`send`.
    _fd: int | None
    #: While the reader delivers the frames of one read: the frames written meanwhile (by
    #: any thread, in order), written in one piece when it is done (:meth:`_uncork`).
    _cork: list[bytes] | None

    def _check_open(self) -> None:
        raise NotImplementedError

    def _lost(self, error: MatchingError | None) -> None:
        raise NotImplementedError

    async def send(self, message: wire.MatchMessage) -> None:
        """Write one frame (writers take turns).

        Raises:
            ClientClosed: The connection is closed or the write failed (the connection is
                then lost: everything waiting on it fails).
            WireError: ``message`` cannot be encoded (nothing was written).

        Cancellation while waiting for the writer's turn sends nothing; once writing, the
        frame is written whole (the write is shielded, and ends early only if the connection
        is closed). It is always a cancel point, but on a plain socket that takes the frame at
        once (the usual case) not a schedule point: every caller waits for something next.
        """
        self._check_open()
        data = message.encode(self.codec, limits=self._frames.limits)
        if self._held.frames:
            self._held.flush()  # (the calls held for the batch's end go first)
        # A cancelled caller sends nothing; when nobody is writing, a plain socket takes the
        # frame at once nearly always (no lock taken, no trip through the scheduler).
        await trio.lowlevel.checkpoint_if_cancelled()
        sent = self._write_here(data)
        if sent == len(data):
            return
        lock = self._write_lock
        # Partly written: the rest is queued first and must be written (shielded); else the
        # frame waits for the writer's turn (cancellable: then nothing is sent).
        with trio.CancelScope(shield=sent > 0):
            await lock.acquire()
        try:
            if sent == 0:
                self._check_open()
                with self.write_lock:
                    self._backlog.append(data)
            await self._flush_backlog()
        finally:
            lock.release()

    def _write_now(self, data: bytes) -> int:
        """(:attr:`write_lock` held.) Write what a plain socket takes of ``data`` now, if
        nobody else is writing (no writer holds the turn, nothing is queued); the rest of a
        partly written frame is queued first. Returns the bytes written (0: none, nothing
        queued).

        Raises:
            ClientClosed: The connection is lost (no thread writes after that).
            OSError: The write failed (the caller loses the connection).
        """
        if self._shut:
            raise ClientClosed(f"the connection to {self._where} is closed", retryable=True)
        cork = self._cork
        if cork is not None:
            cork.append(data)  # (written whole by _uncork, after what came before)
            return len(data)
        if self._fd is None or self._backlog or self._write_lock.locked():
            return 0
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            return 0
        if sent < len(data):
            self._backlog.append(memoryview(data)[sent:])
        return sent

    def _write_here(self, data: bytes) -> int:
        """(In the trio thread.) :meth:`_write_now` under the write lock.

        Raises:
            ClientClosed: The connection is lost, or the write failed (it is then lost).
        """
        with self.write_lock:
            try:
                return self._write_now(data)
            except OSError as exc:
                raise self._write_failed(exc) from exc

    def _write_failed(self, exc: BaseException) -> ClientClosed:
        """Lose the connection after a failed write; the error to raise to the writer."""
        self._lost(ClientClosed(f"a write failed: {exc}", retryable=True))
        return ClientClosed(
            f"the connection to {self._where} was lost while sending", retryable=True
        )

    def send_nowait(self, *messages: wire.MatchMessage) -> None:
        """Write frames without waiting, in one write (so the server reads them at once):
        straight to a plain socket when no writer is busy and it takes them whole (the usual
        case); otherwise they (or what the socket did not take) are queued and a flusher task
        writes them, in order, before any later frame. For the trio thread's synchronous code
        (the worker's stream frames and call outcomes).

        Raises:
            ClientClosed: The connection is closed, or the write failed (it is then lost).
            WireError: A message cannot be encoded (nothing was written).
        """
        self._check_open()
        codec, limits = self.codec, self._frames.limits
        if len(messages) == 1:
            data = messages[0].encode(codec, limits=limits)
        else:
            data = b"".join([m.encode(codec, limits=limits) for m in messages])
        if self._held.frames:
            self._held.flush()  # (the calls held for the batch's end go first)
        self._write_nowait(data)

    @property
    def limits(self) -> wire.Limits:
        """The limits frames are encoded under (:meth:`encode`'s)."""
        return self._frames.limits

    def send_encoded_nowait(self, data: bytes) -> None:
        """:meth:`send_nowait` of frames already encoded with :attr:`codec` and
        :attr:`limits` (the trio thread).

        Raises:
            ClientClosed: The connection is closed, or the write failed (it is then lost).
        """
        cork = self._cork
        if cork is not None and not self._shut and not self._held.frames:
            # (the reader delivers a read, the usual case: written with the read's other
            # answers. Only this thread takes the cork away; a handler thread appends to it
            # under the write lock, and an append is atomic)
            cork.append(data)
            return
        self._check_open()
        if self._held.frames:
            self._held.flush()  # (the calls held for the batch's end go first)
        self._write_nowait(data)

    def _write_nowait(self, data: bytes) -> None:
        """:meth:`send_nowait`'s write of encoded frames (raises as it does): what the socket
        does not take is queued, under the same hold of the write lock, for a flusher."""
        with self.write_lock:
            try:
                sent = self._write_now(data)
            except OSError as exc:
                failed: OSError | None = exc
            else:
                failed = None
                if sent == len(data):
                    return
                if sent == 0:
                    self._backlog.append(data)
                start = not self._flushing
                self._flushing = True
        if failed is not None:
            raise self._write_failed(failed) from failed
        if start:
            self._spawn_flusher()

    @property
    def threadsafe_writes(self) -> bool:
        """Whether :meth:`send_threadsafe` may be used (a plain socket: trio's TLS stream
        is written only from the trio thread)."""
        return self._fd is not None

    def encode(self, *messages: wire.MatchMessage) -> bytes:
        """``messages`` encoded with the connection's codec and limits, in order (safe from
        any thread).

        Raises:
            WireError: A message cannot be encoded.
        """
        codec, limits = self.codec, self._frames.limits
        return b"".join([m.encode(codec, limits=limits) for m in messages])

    def send_threadsafe(self, data: bytes) -> None:
        """From any thread (a worker's handler thread): write encoded frames (:meth:`encode`)
        at once, in one write, when no writer is busy; otherwise (or for what the socket
        does not take now) queue them, in order, for a flusher task the trio thread is asked
        to start. Never blocks on the socket. Only when :attr:`threadsafe_writes`.

        Raises:
            ClientClosed: The connection is closed, or the write failed (the trio thread is
                then asked to lose it).
        """
        with self.write_lock:
            try:
                sent = self._write_now(data)
            except OSError as exc:
                error = ClientClosed(f"a write failed: {exc}", retryable=True)
                self._shut = True  # (nothing more is written; the trio thread loses it)
                self._backlog.clear()
                self._run_soon(self._lost, error)
                raise ClientClosed(
                    f"the connection to {self._where} was lost while sending", retryable=True
                ) from exc
            if sent == len(data):
                return
            if sent == 0:
                self._backlog.append(data)
            if self._flushing:
                return
            self._flushing = True
        self._run_soon(self._spawn_flusher)

    def _run_soon(self, fn: Callable[..., object], *args: object) -> None:
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:  # pragma: no cover - the trio thread is gone
            pass

    def _spawn_flusher(self) -> None:
        if self._closed.is_set():
            self._flushing = False
            return
        if self._nursery is not None:
            try:
                self._nursery.start_soon(self._flusher)
                return
            except RuntimeError:  # (the nursery is closing: the link ends)
                pass
        trio.lowlevel.spawn_system_task(self._flusher)

    async def _flusher(self) -> None:
        """Write the backlog the writes that did not wait left (a task; it never raises: a
        failed write loses the connection)."""
        try:
            async with self._write_lock:
                if not self._closed.is_set():
                    await self._flush_backlog()
        except ClientClosed:
            pass
        finally:
            # (a write queued meanwhile that saw the flag asks for another flusher: harmless)
            self._flushing = False

    async def _flush_backlog(self) -> None:
        """Write the queued frames (the turn held), until none is left. Shielded, as
        :meth:`send`'s."""
        backlog = self._backlog
        try:
            with trio.CancelScope(shield=True):
                while True:
                    with self.write_lock:
                        if not backlog:
                            self._flushing = False
                            return
                        head = backlog[0]
                    await self._frames.stream.send_all(head)
                    with self.write_lock:
                        if backlog and backlog[0] is head:
                            backlog.popleft()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise self._write_failed(exc) from exc

    def _write_held(self, data: bytes) -> None:
        """Write held calls (never raises: a failed write loses the connection, which fails
        those calls)."""
        if not self._closed.is_set():
            try:
                self._write_nowait(data)
            except ClientClosed:
                pass

    def write_corked(self) -> None:
        """(The trio thread, the reader.) Write what the cork holds now, and go on corking the
        rest of the read: for a frame that must be on the wire before the reader goes on (an
        ACCEPT a worker sends at once, ``accept_delay=0``, is there before its handler starts,
        so a worker killed once the handler runs leaves the server an accepted call). Never
        raises: a failed write loses the connection."""
        if self._cork:
            self._uncork()
            with self.write_lock:
                if not self._shut:
                    self._cork = []

    def _uncork(self) -> None:
        """(The trio thread, the reader.) Write what was written while corked, in one write,
        and stop corking. Never raises: a failed write loses the connection."""
        with self.write_lock:
            cork, self._cork = self._cork, None
        if cork:
            try:
                self._write_nowait(cork[0] if len(cork) == 1 else b"".join(cork))
            except ClientClosed:
                pass
