"""The SDKs' side of one connection to the matching server: dial, HELLO/WELCOME, and one reader
task that sorts the server's frames into streams, call replies and connection-level messages.

It mirrors the client half of a gRPC channel carrying the seed's bidirectional task streams (and
OTP's ``gen_server:call`` for the request/reply part): stream ids and call ids are chosen here,
unique per connection; a lost connection fails every waiting call and ends every stream.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import trio

import wire

from . import _sdk_protocol as protocol
from ._errors import (
    ClientClosed,
    MatchingError,
    ProtocolError,
)
from ._options import ClientOptions, WorkerOptions
from ._sdk_calls import HeldCalls, PendingCalls
from ._sdk_dial import dial, handshake
from ._sdk_writes import SdkWrites

__all__ = ["SdkConnection"]

log = logging.getLogger("apps.matching.connection")


class SdkConnection(SdkWrites):
    """One open connection to the matching server (a worker's or a client's).

    Build it with :meth:`open`. Frames are sorted by one reader task:

    * stream frames (M_REGISTERED, M_REJECTED, M_TASK, M_CLOSE, M_CANCEL, M_PING with a stream
      id) go to
      the receive channel :meth:`open_stream` returned for that id, or to the function it was
      given, called in the reader task (frames for a stream id that is not open are dropped);
    * M_REPLY / M_ERROR with a call id complete the :meth:`call` waiting for it (late replies,
      for calls that timed out or were cancelled, are dropped);
    * connection-level frames (M_RECONNECT, M_ERROR and M_PING with request id 0) go to
      :attr:`control`, an unbounded channel the owner reads (and answers pings from).

    When the connection is lost (the server closed it, a read or write failed, the server broke
    the protocol) or :meth:`aclose` is called, every waiting call fails with
    :class:`ClientClosed` (retryable), every stream channel and :attr:`control` end, and
    :attr:`closed` is set; :attr:`error` says why.

    Attributes:
        welcome: The server's M_WELCOME.
        codec: The connection's payload codec (the one WELCOME named).
        control: Connection-level messages from the server.
        error: Why the connection ended (None while it is open, or after a plain ``aclose``).
    """

    def __init__(self, frames: wire.FrameStream, welcome: wire.MatchWelcome, where: str) -> None:
        self._frames = frames
        self.welcome = welcome
        self.codec: wire.Codec = welcome.codec
        self._where = where
        #: The turn of a writer that waits (:meth:`send`, the flusher): it writes only what
        #: is in the backlog, so a frame it has half written is always the backlog's head.
        self._write_lock = trio.Lock()
        #: Encoded frames not written at once, in order (the head may be half written); a
        #: flusher task (or the next :meth:`send`) writes them before anything else.
        self._backlog: deque[bytes | memoryview] = deque()
        #: A flusher will look at the backlog (a task is started, or a send flushes it).
        self._flushing = False
        #: Held (by any thread) to write at once or to touch the backlog: a frame is never
        #: written into the middle of another, whichever thread writes (see
        #: :meth:`send_threadsafe`). Re-entrant: an owner may hold it around its own writes.
        self.write_lock = threading.RLock()
        #: Set (under :attr:`write_lock`) once the connection is lost: no thread writes after.
        self._shut = False
        self._token = trio.lowlevel.current_trio_token()
        self._nursery: trio.Nursery | None = None
        self._next_id = 1
        #: stream id -> what takes its frames (a channel's ``send_nowait``, or the owner's).
        self._streams: dict[int, Callable[[wire.MatchMessage], None]] = {}
        self._channels: dict[int, trio.MemorySendChannel[wire.MatchMessage]] = {}
        self._calls = PendingCalls(where)
        self._timer_scope = trio.CancelScope()
        control_send, control_receive = trio.open_memory_channel[wire.MatchMessage](math.inf)
        self._control_send = control_send
        self.control: trio.MemoryReceiveChannel[wire.MatchMessage] = control_receive
        self._closed = trio.Event()
        self._reader_done = trio.Event()
        self._reader_scope = trio.CancelScope()
        self.error: MatchingError | None = None
        self._reader_started = False
        #: Whether :meth:`call` holds its M_CALL for the end of the scheduling batch (a
        #: client's plain socket), and those held.
        self.batch_calls = False
        self._held = HeldCalls(self._write_held)
        stream = frames.stream
        #: The descriptor of a plain socket (not TLS), written to directly by :meth:`send`.
        self._fd: int | None = (
            stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        )
        self._cork: list[bytes] | None = None

    # -- opening --------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        options: WorkerOptions | ClientOptions,
        role: str,
        *,
        worker_id: str | None = None,
        session: str | None = None,
        flows: Mapping[str, Mapping[str, list[str]]] | None = None,
        nursery: trio.Nursery | None = None,
    ) -> SdkConnection:
        """Dial the server of ``options``, say HELLO and wait for WELCOME.

        The whole of it (connect, TLS handshake, HELLO/WELCOME) is bounded by
        ``options.connect_timeout``. Unix addresses use a Unix socket; TCP uses TLS when
        ``options.uses_tls``, verifying the server with ``options.ssl_context`` or a context
        built from ``tls_ca_file`` (the system's CAs by default) against
        ``tls_server_hostname`` or the address's host.

        Args:
            options: Where and how to connect (address, credentials, TLS, codec).
            role: ``"worker"`` or ``"client"``.
            worker_id: The app worker id (workers only).
            session: Random per process; a fresh one by default.
            flows: Workers: ``{flow_type: {"steps": [...], "rpcs": [...]}}``.
            nursery: Where the reader task runs; by default a trio system task (it ends with
                the connection, and never raises).

        Returns:
            The open connection, already switched to the welcomed codec.

        Raises:
            Unavailable: The server cannot be reached, or closed the connection during the
                handshake (retryable).
            CallTimeout: The handshake did not finish within ``connect_timeout`` (retryable).
            AuthenticationError: The server refused the credentials, or its TLS certificate
                failed verification.
            MatchingError: Any other M_ERROR the server answered HELLO with (its class is the
                error code's, :func:`error_from_code`).
            ProtocolError: The server's answer was not a WELCOME.

        On cancellation the half-open connection is closed; nothing is left behind.
        """
        address = options.address
        where = str(address)
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(options.connect_timeout):
                stream = await dial(options, where)
                frames = wire.FrameStream(stream, versions=frozenset({2}), exact=True)
                first = protocol.hello(
                    options, role, worker_id=worker_id, session=session, flows=flows
                )
                welcome = await handshake(frames, first, where)
        except trio.TooSlowError as exc:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise protocol.connect_too_slow(where, options) from exc
        except BaseException:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise
        frames.exact = False
        frames.codec = welcome.codec
        conn = cls(frames, welcome, where)
        conn.batch_calls = role == "client" and conn._fd is not None
        conn._reader_started = True
        conn._nursery = nursery
        if nursery is not None:
            nursery.start_soon(conn._read)
            nursery.start_soon(conn._run_timer)
        else:
            trio.lowlevel.spawn_system_task(conn._read)
            trio.lowlevel.spawn_system_task(conn._run_timer)
        return conn

    # -- streams and calls ----------------------------------------------------------------

    def _allocate(self) -> int:
        rid = self._next_id
        self._next_id += 1
        return rid

    def open_stream(self) -> tuple[int, trio.MemoryReceiveChannel[wire.MatchMessage]]:
        """A new stream id (unique for this connection, shared with call ids) and the channel
        its frames from the server will arrive on. Sends nothing: the caller sends M_REGISTER.

        Raises:
            ClientClosed: The connection is closed.
        """
        self._check_open()
        rid = self._allocate()
        send, receive = trio.open_memory_channel[wire.MatchMessage](math.inf)
        self._streams[rid] = send.send_nowait
        self._channels[rid] = send
        return rid, receive

    def open_stream_handler(self, handler: Callable[[wire.MatchMessage], None]) -> int:
        """A new stream id whose frames are given to ``handler`` in the reader task, as they
        arrive (no channel and no task per stream: the worker's streams cost a wake-up less
        per frame). ``handler`` must not block; an exception it raises loses the connection.
        Nothing tells it that the stream ended (:attr:`closed` says when the connection did).

        Raises:
            ClientClosed: The connection is closed.
        """
        self._check_open()
        rid = self._allocate()
        self._streams[rid] = handler
        return rid

    def close_stream(self, stream_id: int) -> None:
        """Forget ``stream_id``: its channel ends, later frames for it are dropped. Sends
        nothing (the caller sends M_CLOSE when the server should know)."""
        self._streams.pop(stream_id, None)
        send = self._channels.pop(stream_id, None)
        if send is not None:
            send.close()

    @property
    def stream_ids(self) -> frozenset[int]:
        """The open stream ids."""
        return frozenset(self._streams)

    async def call(self, op: str, args: Mapping[str, Any], timeout: float | None = None) -> Any:
        """Send M_CALL ``op`` and wait for its M_REPLY value (a client's M_CALL goes at the
        end of the scheduling batch, with the other calls of the batch: :attr:`batch_calls`).

        Raises:
            MatchingError: The server answered M_ERROR (the class its code names).
            CallTimeout: No answer within ``timeout`` seconds (the reply, if it comes, is
                dropped).
            ClientClosed: The connection was lost before the answer (retryable).

        On cancellation the call is forgotten (its late reply is dropped); the server may
        still have carried it out.
        """
        self._check_open()
        rid = self._allocate()
        calls = self._calls
        pending = calls.add(rid, op, timeout)
        try:
            if self.batch_calls:
                data = wire.encode_call(op, dict(args), rid, self.codec, limits=self._frames.limits)
                await trio.lowlevel.checkpoint_if_cancelled()
                self._held.hold(data)
            else:
                await self.send(wire.MatchCall(op=op, args=dict(args), rid=rid))
            return await calls.wait(rid, pending)
        finally:
            calls.forget(rid)

    # -- closing --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        """Wait until the connection is closed or lost."""
        await self._closed.wait()

    async def aclose(self) -> None:
        """Close the connection (idempotent): waiting calls fail with :class:`ClientClosed`,
        streams and :attr:`control` end. Returns once the reader has stopped."""
        self._lost(None)
        await trio.aclose_forcefully(self._frames.stream)
        self._reader_scope.cancel()
        if self._reader_started:
            with trio.CancelScope(shield=True):  # its scope is cancelled: it ends at once
                await self._reader_done.wait()
        else:
            await trio.lowlevel.checkpoint()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise ClientClosed(
                f"the connection to {self._where} is closed"
                + (f": {self.error.message}" if self.error is not None else ""),
                retryable=True,
            )

    def _lost(self, error: MatchingError | None) -> None:
        """Mark the connection lost (once): fail the calls, end the channels."""
        if self._closed.is_set():
            return
        with self.write_lock:  # (after this no thread writes: the socket may be closed)
            self._shut = True
            self._backlog.clear()
        self._held.frames.clear()
        self.error = error
        self._closed.set()
        self._reader_scope.cancel()
        message = f"the connection to {self._where} was closed" + (
            f": {error.message}" if error is not None else ""
        )
        self._calls.fail_all(ClientClosed(message, retryable=True))
        self._timer_scope.cancel()
        for send in self._channels.values():
            send.close()
        self._channels.clear()
        self._streams.clear()
        self._control_send.close()

    async def _run_timer(self) -> None:
        """The calls' timeouts (:class:`PendingCalls`), until the connection ends."""
        with self._timer_scope:
            await self._calls.run_timer()

    # -- the reader -----------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            with self._reader_scope:
                receive = self._frames.receive_frames
                closed = self._closed
                while True:
                    # One checkpoint for every frame a read brought (under load tens of a
                    # client's replies, several TASKs of a worker's), not one each.
                    try:
                        frames = await receive()
                    except wire.WireError as exc:
                        self._lost(ProtocolError(f"{self._where} sent a malformed frame: {exc}"))
                        return
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                        self._lost(ClientClosed(f"read failed: {exc}", retryable=True))
                        return
                    if not frames:
                        self._lost(ClientClosed("the server closed it", retryable=True))
                        return
                    # What the deliveries write (a worker's answers to its TASKs) goes in one
                    # write once they are done (_sdk_writes.py).
                    self._cork = []
                    try:
                        for frame in frames:
                            try:
                                message = wire.parse_matching(frame)
                            except wire.WireError as exc:
                                self._lost(ProtocolError(f"{self._where} sent a bad frame: {exc}"))
                                return
                            self._deliver(message)
                            if closed.is_set():
                                return  # (a frame broke the protocol: the rest is not delivered)
                    finally:
                        self._uncork()
        except Exception as exc:  # never let a system task crash the run
            log.exception("the reader of the connection to %s failed", self._where)
            self._lost(ClientClosed(f"the reader failed: {exc!r}", retryable=True))
        finally:
            self._lost(ClientClosed("the reader stopped", retryable=True))
            self._reader_done.set()

    def _deliver(self, message: Any) -> None:
        if type(message) in protocol.STREAM_TYPES:  # (a worker's TASKs: no routing to work out)
            where = protocol.STREAM
        else:
            try:
                where = protocol.route(message, self._where)
            except ProtocolError as exc:
                self._lost(exc)
                return
        if where == protocol.STREAM:
            deliver = self._streams.get(message.rid)
            if deliver is None:
                log.debug("dropped %s for stream %d, which is not open", message, message.rid)
                return
            deliver(message)
        elif where == protocol.ANSWER:
            value, error = protocol.outcome(message)
            answered = self._calls.answer(message.rid, value, error)
            if not answered:
                log.debug("dropped a late answer to call %d", message.rid)
        else:
            self._control_send.send_nowait(message)
