"""The blocking client's connection: a plain blocking socket shared by threads, with no event
loop between a caller and the socket (``_sdk_connection`` is the trio one). The connection's
protocol is ``_sdk_protocol``'s, shared with the trio connection; only the bytes move otherwise.

Sends: a thread that finds nobody sending writes its frame and then whatever other threads
queued meanwhile. Reads (leader/follower): one waiting thread at a time reads the socket, hands
each answer to its call (waking that thread only) and, once its own answer is in, passes the
reading role to a sleeping caller; a lone caller so reads its own answer with no thread switch.
A lone call (none other in flight, the usual case) writes its frame under the lock and keeps
the reading role: the lock twice a call (once to send, once to take its answer), not five
times.
TLS runs on memory BIOs (``ssl.SSLObject``) under the connection's lock, since an ``SSLSocket``
must not be read by one thread while another writes.

Nobody reads an idle connection, so the server's connection-level M_PING goes unanswered while
the client is idle (a thread blocked in a read between calls would take every lone caller's
answer and cost the thread switch this transport exists to save): after ``peer_timeout`` the
server drops it. The next call first looks, without blocking, at what the idle connection
received (answering pings, noticing the close), and dials again before sending if it is gone.
"""

from __future__ import annotations

import itertools
import logging
import select
import socket
import ssl
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import wire

from . import _client_frames as frames
from . import _sdk_protocol as protocol
from ._errors import ClientClosed, MatchingError, ProtocolError

if TYPE_CHECKING:
    from ._client_dial import Tls

__all__ = ["IdleLost", "SyncConnection"]

log = logging.getLogger("apps.matching.client")

T = TypeVar("T")

_LIMITS = frames.LIMITS
#: How far SO_RCVTIMEO may be over the reading call's time left and still stay (s).
_RCVTIMEO_SLACK = 0.002
#: The largest frame a lone call writes with the connection's lock held (``_send_alone``).
_ALONE_MAX = 16384
_allocate_lock = threading.Lock
_monotonic = time.monotonic


#: SO_RCVTIMEO's "no timeout".
_NO_TIMEOUT = struct.pack("ll", 0, 0)


def _timeval(seconds: float) -> bytes:
    seconds = max(0.001, seconds)
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))


class IdleLost(ClientClosed):
    """The idle connection a call was about to use was found lost: nothing of the call was
    sent (the engine dials again and sends it there, idempotent or not)."""


class _Waiter:
    """One call waiting for its answer; while its thread sleeps, ``lock`` is held and
    released to wake it."""

    __slots__ = ("done", "error", "lock", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: MatchingError | None = None
        self.lock: Any = None


class SyncConnection:
    """One open connection to the matching server, shared by the threads of a blocking client
    (see the module's docs). ``lock`` guards everything but the socket's own I/O."""

    def __init__(
        self, sock: socket.socket, tls: Tls | None, welcome: wire.MatchWelcome, where: str
    ) -> None:
        self.sock = sock
        self.tls = tls
        self.codec: wire.Codec = welcome.codec
        self.where = where
        self.decoder = wire.FrameDecoder(limits=_LIMITS, versions=frozenset({2}))
        self.lock = threading.Lock()
        self.waiters: dict[int, _Waiter] = {}
        #: Waiters whose thread sleeps on its ``lock``, by call id.
        self.sleeping: dict[int, _Waiter] = {}
        #: The call id whose thread reads the socket now (0: none; < 0: an idle check).
        self.reader = 0
        self.sending = False
        self.out: list[bytes] = []
        self.broken: MatchingError | None = None
        #: Call ids (``next`` of a count is atomic: no lock needed).
        self.ids = itertools.count(1)
        self.rcvtimeo: float | None = None
        self.buffer = bytearray(65536)
        #: Whether ``decoder`` holds part of a frame (the next read's bytes are not whole).
        self.partial = False
        #: Waits for the socket to have something to read (``idle_check``'s look, with no
        #: timeout; a read's wait, then a read that does not block). A thread blocked in a
        #: read of a Unix socket is woken, for nothing, each time the server takes bytes of
        #: ours off it (the kernel wakes every waiter of the socket when its write space
        #: grows), most calls once; ``poll`` for input wakes only when input comes: a system
        #: call a read more, two thread switches a call less (measured on a lone RPC: the
        #: client's CPU 58-67 -> 43-50 us, the server's 200-243 -> 170-224 us). None: no
        #: ``poll`` on this platform (reads then block, bounded by SO_RCVTIMEO).
        self.poller: Any = None
        if hasattr(select, "poll"):
            self.poller = select.poll()
            self.poller.register(sock, select.POLLIN)

    # -- failing ---------------------------------------------------------------------------

    def fail(self, error: MatchingError) -> None:
        """Lose the connection (lock held, once): every waiting call fails with
        :class:`ClientClosed` naming ``error``, and the socket is shut down (a thread blocked
        reading it wakes)."""
        if self.broken is not None:
            return
        self.broken = error
        failed = ClientClosed(
            f"the connection to {self.where} was closed: {error.message}", retryable=True
        )
        for waiter in self.waiters.values():
            waiter.done = True
            waiter.error = failed
        self.waiters.clear()
        for waiter in self.sleeping.values():
            waiter.lock.release()
        self.sleeping.clear()
        self.out.clear()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._close_if_unused()

    def _close_if_unused(self) -> None:
        """Close the socket of a lost connection once no thread is in its I/O (lock held)."""
        if self.broken is not None and not self.reader and not self.sending:
            self.sock.close()

    def _wake_reader(self) -> None:
        """Pass the reading role to a sleeping waiter, if any (lock held)."""
        if self.sleeping:
            waiter = self.sleeping.pop(next(iter(self.sleeping)))
            waiter.lock.release()

    # -- sending ---------------------------------------------------------------------------

    def send(self, message: wire.MatchMessage, rid: int = 0, waiter: _Waiter | None = None) -> None:
        """Register ``waiter`` for call ``rid`` (if given) and send ``message``, or queue it
        for the thread sending now.

        Raises:
            ClientClosed: The connection is lost (nothing of the call was sent), or the send
                failed (the connection is then lost).
            WireError: ``message`` cannot be encoded (nothing was sent).
        """
        self._send_data(message.encode(self.codec, limits=_LIMITS), rid, waiter)

    def _send_data(self, data: bytes, rid: int, waiter: _Waiter | None) -> None:
        """:meth:`send` of a message's bytes (the same errors but ``WireError``)."""
        with self.lock:
            if self.broken is not None:
                raise self._closed_error()
            if self.tls is not None:
                data = self.tls.encrypt(data)
            if waiter is not None:
                self.waiters[rid] = waiter
            if not self._take_turn(data):
                return
        self._write(data)

    def _take_turn(self, data: bytes) -> bool:
        """Queue ``data`` for the thread sending now (False), or make this thread the sender
        (True: it must :meth:`_write` ``data``). Lock held: with TLS, bytes leave in the order
        they were encrypted."""
        if self.sending:
            self.out.append(data)
            return False
        self.sending = True
        return True

    def _write(self, data: bytes) -> None:
        """Write ``data`` and what others queue meanwhile (this thread has the sending role)."""
        lock = self.lock
        # ``whole``: no frame is half-sent and none taken from ``out`` is unsent. An interrupt
        # (KeyboardInterrupt, between any two bytecodes) keeps the connection only then.
        whole = False
        try:
            while True:
                self.sock.sendall(data)
                whole = True
                with lock:
                    if not self.out:
                        self.sending = False
                        return
                    whole = False
                    data = b"".join(self.out)
                    self.out.clear()
        except BaseException as exc:
            with lock:
                self.sending = False
                lost = self._send_failed(exc, whole)
                self._close_if_unused()
            if lost is not None:
                raise lost from exc
            raise

    def _send_failed(self, exc: BaseException, whole: bool) -> ClientClosed | None:
        """Lose the connection after a send that raised ``exc`` (lock held), unless it was an
        interrupt that left no frame half-sent (``whole``) nor any queued unsent; the error
        to raise for an ``OSError`` (else ``exc`` goes on)."""
        if isinstance(exc, OSError):
            self.fail(ClientClosed(f"a write failed: {exc}", retryable=True))
            return ClientClosed(
                f"the connection to {self.where} was lost while sending", retryable=True
            )
        if not whole or self.out:
            self.fail(ClientClosed("a send was interrupted midway", retryable=True))
        return None

    def _closed_error(self) -> ClientClosed:
        assert self.broken is not None
        return ClientClosed(
            f"the connection to {self.where} is closed: {self.broken.message}", retryable=True
        )

    # -- calls -----------------------------------------------------------------------------

    def call(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        """Send M_CALL ``op`` and wait for its M_REPLY value (as ``SdkConnection.call``). An
        idle connection is first looked at without blocking (:meth:`idle_check`).

        Raises:
            MatchingError: The server answered M_ERROR (the class its code names).
            CallTimeout: No answer within ``timeout`` seconds (a late reply is dropped).
            IdleLost: The idle connection was found lost (nothing was sent).
            ClientClosed: The connection was lost before the answer (retryable).
        """
        waiter = _Waiter()
        deadline = None if timeout is None else _monotonic() + timeout
        rid = next(self.ids)
        done = False
        try:  # (from the send on: an interrupt anywhere in it still ends the call)
            data = frames.encode_call(op, args, rid, self.codec)
            if self._send_alone(data, rid, waiter):
                # A lone call (the usual case): sent, and this thread reads its answer.
                remaining = None if deadline is None else deadline - _monotonic()
                if remaining is None or remaining > 0:
                    self._read(remaining, waiter)
                if not waiter.done:
                    self._wait(rid, waiter, deadline, op, timeout)
            else:
                if not self.idle_check():
                    assert self.broken is not None
                    raise IdleLost(
                        f"the idle connection to {self.where} was closed: {self.broken.message}",
                        retryable=True,
                    )
                self._send_data(data, rid, waiter)
                self._wait(rid, waiter, deadline, op, timeout)
            done = True
        finally:
            if not done:
                self._abandon(rid, waiter)
        if waiter.error is not None:
            raise waiter.error
        return waiter.value

    def _send_alone(self, data: bytes, rid: int, waiter: _Waiter) -> bool:
        """If no other call is in flight and the idle connection received nothing (a poll
        with no timeout; else :meth:`idle_check` reads it first), register ``waiter`` for
        call ``rid``, send ``data`` with the lock held and keep the reading role; whether it
        did (a lost connection, whose idle check says so, takes the other way too).

        The frame is written under the lock, not by a sending role (whose hand-back costs the
        lone call a lock): the threads that call meanwhile wait for the lock instead of
        queueing their frames, for as long as a write of a frame of at most
        ``_ALONE_MAX`` bytes to an idle connection takes.

        Raises:
            ClientClosed: The write failed (the connection is then lost).
        """
        with self.lock:
            if self.reader or self.sending or self.waiters or self.broken is not None:
                return False
            poller = self.poller
            if poller is None or len(data) > _ALONE_MAX or poller.poll(0):
                return False
            if self.tls is not None:
                data = self.tls.encrypt(data)
            self.waiters[rid] = waiter
            self.reader = rid
            whole = False
            try:
                self.sock.sendall(data)
                whole = True
            except BaseException as exc:
                lost = self._send_failed(exc, whole)
                if lost is not None:
                    raise lost from exc
                raise
            return True

    def _wait(
        self, rid: int, waiter: _Waiter, deadline: float | None, op: str, timeout: float | None
    ) -> None:
        """Wait until ``waiter`` has its answer, reading the socket for every waiting call
        whenever no other thread does."""
        lock = self.lock
        while True:
            with lock:
                if waiter.done:
                    return
                remaining = None if deadline is None else deadline - _monotonic()
                if remaining is not None and remaining <= 0:
                    self.waiters.pop(rid, None)
                    raise protocol.call_timed_out(op, self.where, timeout)
                if self.reader:
                    sleeper = waiter.lock = _allocate_lock()
                    sleeper.acquire()
                    self.sleeping[rid] = waiter
                else:
                    self.reader = rid
                    sleeper = None
            if sleeper is not None:
                if not sleeper.acquire(True, -1 if remaining is None else remaining):
                    with lock:
                        self.sleeping.pop(rid, None)
                continue
            self._read(remaining, waiter)
            if waiter.done:  # (set for good, under the lock: no need to take it to look)
                return

    def _abandon(self, rid: int, waiter: _Waiter) -> None:
        """End a call left early (timeout, interrupt): its late answer will be dropped."""
        with self.lock:
            if self.waiters.get(rid) is waiter:
                del self.waiters[rid]
            self.sleeping.pop(rid, None)
            if self.reader == rid and rid:
                self.reader = 0  # interrupted with the reading role (before its read began)
            if not self.reader:
                self._wake_reader()  # the role may have been passed to this call as it ended
            self._close_if_unused()

    # -- reading ---------------------------------------------------------------------------

    def _read(self, remaining: float | None, waiter: _Waiter | None) -> None:
        """One read for every waiting call (this thread has the reading role; ``remaining``:
        its time left, None: no limit, 0: do not block)."""
        sock = self.sock
        n = 0
        error: MatchingError | None = None
        timed_out = False
        pongs = 0
        try:
            if remaining == 0:
                n = sock.recv_into(self.buffer, 0, socket.MSG_DONTWAIT)
            elif self.poller is not None:
                # (a wait in ``poll`` for input, not in a blocking read: see ``poller``)
                self.poller.poll(-1 if remaining is None else remaining * 1000)
                n = sock.recv_into(self.buffer, 0, socket.MSG_DONTWAIT)
            else:
                self._bound_reads(remaining)
                n = sock.recv_into(self.buffer)
            if not n:
                error = ClientClosed("the server closed it", retryable=True)
        except (BlockingIOError, InterruptedError):  # (the wait timed out, or nothing came)
            timed_out = True
        except OSError as exc:
            error = ClientClosed(f"read failed: {exc}", retryable=True)
        except BaseException:  # (KeyboardInterrupt, ...): another waiter reads on
            with self.lock:
                self.reader = 0
                self._wake_reader()
                self._close_if_unused()
            raise
        write = b""
        with self.lock:
            self.reader = 0
            try:
                if n:
                    pongs, extra = self._take(n)
                    if extra and self._take_turn(extra):
                        write = extra
            except MatchingError as exc:
                error = exc
            except BaseException:
                # Interrupted while handing out answers: some may be lost, so is the connection.
                self.fail(ClientClosed("a read was interrupted midway", retryable=True))
                raise
            if error is not None:
                self.fail(error)
            elif self.sleeping and (timed_out or waiter is None or waiter.done):
                self._wake_reader()  # this thread is done reading: another waiter takes over
            if self.broken is not None:
                self._close_if_unused()
        if write:
            try:
                self._write(write)
            except MatchingError:
                return
        for _ in range(pongs):
            try:
                self.send(wire.MatchPong())
            except MatchingError:
                return

    def _bound_reads(self, remaining: float | None) -> None:
        """Make a blocking read (where there is no ``poll``) give up after about ``remaining``
        seconds (None: never): one system call a read, where a socket timeout costs a poll
        too. The timeout set stays
        while it ends no read late and at most one early: not over ``remaining`` (plus
        ``_RCVTIMEO_SLACK``) and at least half of it (a read it ends early is read again,
        the timeout then set anew). So a lone caller whose calls alternate two timeouts (a
        Step's ``start_flow`` and ``result``) sets it once, not twice a Step."""
        current = self.rcvtimeo
        if remaining is None:
            if current is None:
                return
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _NO_TIMEOUT)
        elif current is not None and remaining / 2 <= current <= remaining + _RCVTIMEO_SLACK:
            return
        else:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(remaining))
        self.rcvtimeo = remaining

    def _take(self, n: int) -> tuple[int, bytes]:
        """Hand the answers ``n`` received bytes complete to their calls (lock held); returns
        the server's pings to answer and TLS bytes to send back.

        Raises:
            MatchingError: The server broke the protocol, or ended the TLS session.
        """
        if self.tls is None and not self.partial:
            reply = frames.lone_reply(self.buffer, n)  # (a lone caller's answer, read whole)
            if reply is not None:
                self.decoder.skip(n)  # (a later error's offset counts these bytes too)
                self._answer(reply[0], reply[1], None)
                return 0, b""
        data = bytes(memoryview(self.buffer)[:n])
        extra = b""
        if self.tls is not None:
            try:
                plain = self.tls.decrypt(data)
            except ssl.SSLError as exc:
                raise ClientClosed(f"TLS failed: {exc}", retryable=True) from exc
            extra = self.tls.outgoing.read()
            if plain is None:
                raise ClientClosed("the server closed it", retryable=True)
            data = plain
        try:
            got = self.decoder.feed(data)
        except wire.WireError as exc:
            raise ProtocolError(f"{self.where} sent a malformed frame: {exc}") from exc
        self.partial = self.decoder.buffered != 0
        return self._deliver(got), extra

    def _answer(self, rid: int, value: Any, error: MatchingError | None) -> None:
        """Give call ``rid`` its answer, waking its thread if it sleeps (lock held)."""
        waiter = self.waiters.pop(rid, None)
        if waiter is None:
            log.debug("dropped a late answer to call %d", rid)
            return
        waiter.value = value
        waiter.error = error
        waiter.done = True
        if rid in self.sleeping:
            del self.sleeping[rid]
            waiter.lock.release()

    def _deliver(self, frames: list[wire.Frame]) -> int:
        """Hand out ``frames`` (lock held); returns how many pings to answer."""
        pongs = 0
        for frame in frames:
            kind, message = protocol.parse(frame, self.where)
            if kind == protocol.ANSWER:
                self._answer(message.rid, *protocol.outcome(message))
            elif kind == protocol.CONTROL:
                # M_RECONNECT and M_ERROR of the connection are ignored, as the trio engine
                # does: the calls caught by a loss fail on their own.
                if type(message) is wire.MatchPing:
                    pongs += 1
            else:  # a client opens no stream
                log.debug("dropped %s for stream %d, which is not open", message, message.rid)
        return pongs

    def idle_check(self) -> bool:
        """If no call is in flight, take in what the idle connection received (answering the
        server's pings) without blocking; whether the connection still works.

        Nothing received is the usual case between a lone caller's calls: a poll with no
        timeout tells it without a read (a read of nothing raises, and takes the reading role
        under the lock twice). Under the lock: a poll object is for one thread at a time."""
        with self.lock:
            if self.broken is not None:
                return False
            if self.reader or self.waiters:
                return True
            poller = self.poller
            if poller is not None and not poller.poll(0):
                return True
            self.reader = mine = -next(self.ids)
        try:
            self._read(0, None)
        finally:
            with self.lock:
                if self.reader == mine:  # (interrupted before its read began: give it back)
                    self.reader = 0
                    self._wake_reader()
        return self.broken is None

    def close(self, error: MatchingError) -> None:
        with self.lock:
            self.fail(error)
