"""The server's connection processes: one per worker or client socket, children of the
``matching_connections`` DynamicSupervisor (the listener's acceptors start them).

A connection reads frames under tight limits until M_HELLO, checks the bearer token for the
role, answers M_WELCOME with the codec both sides use from then on, and serves the role:
a worker's M_REGISTER opens a stream (the matcher picks the queue, a linked stream process
serves it) and its stream frames are handed to that stream (``StreamHandle``); M_CALLs go to
``_call_ops.py`` (each runs in a task of its own, answered by M_REPLY or M_ERROR). Malformed
input gets an M_ERROR (and, when the bytes cannot be decoded, the connection closes); the
server serves everyone else on. Writes are bounded (:meth:`Connection.send_message` never
blocks: the frames of one scheduling batch go to a plain socket in one write at its end
(``_write_batches``), what it does not take to the writer task's queue; a peer that stops
reading is dropped), a peer silent for ``peer_timeout`` is dropped,
and an idle connection gets an M_PING every ``ping_interval``. The connection's end closes its
streams (their reports are the routing core's).

A graceful stop (its supervisor's ``shutdown`` exit signal) drains the connection (seed, 容量和关闭:
when the server asks a worker to reconnect, the worker first finishes its running calls): a
worker is sent M_RECONNECT and marked draining (it is offered nothing new), its idle streams are
closed, and the streams with a call keep serving it until its RESULT or FAILURE; a client's
``result`` waits are answered by a retryable ``draining`` error at once, its other calls in
flight may still be answered. New calls and registrations are refused as ``draining``. The
connection closes once nothing runs, or after ``stop_drain_timeout`` (what still runs then is
given up: a worker's calls are lost, a client's get ``draining``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import trio

import otp
import wire

from . import _engine_handoff as handoff
from . import _matcher, _stream
from ._call_ops import answer_request, start_call
from ._config import MatchingConfig
from ._connection_drain import DRAIN_GRACE, STOPPING, drain, is_shutdown
from ._connection_handshake import handshake
from ._connection_streams import close_stream, register_stream
from ._dispatch import Capabilities, WorkerDraining
from ._engine import ENGINE
from ._server_frames import encode_reply, encode_task
from ._write_batches import BatchedWrites, batched_writes

__all__ = [
    "DRAIN_GRACE",
    "HELLO_LIMITS",
    "Connection",
    "ServerContext",
    "shutdown_timeout",
    "start_connection",
]

logger = logging.getLogger("apps.matching")

#: Limits until HELLO is read: a peer that has not authenticated gets little of our memory.
HELLO_LIMITS = wire.Limits(
    max_payload=64 * 1024,
    max_depth=8,
    max_items=4096,
    max_total_items=16384,
    max_str=16 * 1024,
)
#: Bytes handed to the socket at once: each write must drain within ``peer_timeout``.
WRITE_CHUNK = 256 * 1024
#: What the server sends: the peers' decoders enforce the protocol's own limits.
_OUT_LIMITS = wire.Limits()
#: The codecs the server speaks.
#: The frames a worker may send after HELLO on a stream (non-zero request id).
_STREAM_FRAMES = (
    wire.MatchPong,
    wire.MatchClose,
    wire.MatchAccept,
    wire.MatchDecline,
    wire.MatchOutput,
    wire.MatchResult,
    wire.MatchFailure,
)


@attrs.frozen(eq=False)
class ServerContext:
    """What every connection of one server shares.

    Attributes:
        config: The server's settings.
        blobs: The server's ``BlobCache`` (``put(data) -> key``, ``get(key) -> bytes``).
        matcher: The matcher (name or pid).
        engine: The engine (name or pid).
    """

    config: MatchingConfig
    blobs: Any
    matcher: Any = _matcher.MATCHER
    engine: Any = ENGINE


def shutdown_timeout(config: MatchingConfig) -> float:
    """The ``shutdown`` of a connection's child spec: its drain (``stop_drain_timeout``), the
    last answers' :data:`DRAIN_GRACE`, and as much again before the supervisor kills it."""
    return config.stop_drain_timeout + 2 * DRAIN_GRACE


async def start_connection(stream: trio.abc.Stream, ctx: ServerContext, peer: str) -> otp.Pid:
    """Start a connection process serving ``stream`` (from ``peer``, for the logs), linked to
    the caller (the ``matching_connections`` supervisor)."""
    await trio.lowlevel.checkpoint()
    return otp.spawn_link(_connection, stream, ctx, peer)


@attrs.define(eq=False)
class Connection:
    """One connection's state; the stream processes write to the peer through
    :meth:`send_message` (the routing core's ``StreamConn``).

    Attributes:
        peer: The peer's address, for the logs.
        role: ``"worker"`` or ``"client"`` once HELLO is read.
        worker_id: A worker's app worker id.
        streams: Stream id -> the stream process serving it.
        tasks: Stream id -> the delivery of the TASK written on it, until the worker declines
            it or sends its RESULT or FAILURE (a stream with a call, or an offer, in flight).
        draining: Whether a graceful stop is draining the connection.
    """

    me: otp.Pid
    stream: trio.abc.Stream
    ctx: ServerContext
    peer: str
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    codec: wire.Codec = wire.Codec.TLV
    role: str = ""
    worker_id: str = ""
    session: str = ""
    caps: Capabilities = attrs.Factory(Capabilities)
    #: Stream id -> its process (and state: the reader hands frames over, ``StreamHandle``).
    streams: dict[int, _stream.StreamHandle] = attrs.Factory(dict)
    #: Shared by the worker's stream processes: when a call's end must send ``WorkerFreed``.
    notices: _stream.FreedNotices = attrs.Factory(_stream.FreedNotices)
    #: Stream ids being registered -> the frames that came for them meanwhile.
    registering: dict[int, list[Any]] = attrs.Factory(dict)
    #: An ACCEPT read and not yet handed to its stream: if the next frame of the same read is
    #: that call's outcome (a worker writes both at once when its handler ends within
    #: ``accept_delay``), both go over together (``StreamHandle.deliver_served``).
    held: wire.MatchAccept | None = None
    calls: set[int] = attrs.Factory(set)
    #: Call id -> (op, the cancel scope of its task), for the drain.
    call_scopes: dict[int, tuple[str, trio.CancelScope]] = attrs.Factory(dict)
    #: The engine requests in flight (``otp.send_request``) -> (call id, op).
    requests: dict[otp.Ref, tuple[int, str]] = attrs.Factory(dict)
    #: What answers them: ``answer_request`` of this connection, run where the engine answers
    #: (``send_request``'s ``on_response``; it never waits): no message, no wake-up of the
    #: connection's task (two a Step, issue 15). None: the answers come as messages.
    answer: Any = None
    #: This run's engines' takers (``_engine_handoff.registry``): kept, not read a call.
    takers: dict[Any, Any] = attrs.Factory(handoff.registry)
    tasks: dict[int, int] = attrs.Factory(dict)
    draining: bool = False
    #: Set once ``stop_drain_timeout`` has passed: what still runs is given up.
    drain_over: bool = False
    #: Streams the drain closed: TASKs still offered on them are not written (the queue takes
    #: them back when the stream ends).
    closing: set[int] = attrs.Factory(set)
    unsent: deque[bytes] = attrs.Factory(deque)
    unsent_bytes: int = 0
    #: The descriptor of a plain socket (not TLS): a frame goes straight to it while nothing
    #: waits to be written before it.
    fd: int | None = None
    #: The writer task has a chunk on its way (a frame written directly would overtake it).
    writing: bool = False
    #: Frames for a plain socket, written together at the end of the scheduling batch (by
    #: ``batches``; only while nothing is queued for the writer).
    pending: list[bytes] = attrs.Factory(list)
    batches: BatchedWrites | None = None
    wake: trio.Event = attrs.Factory(trio.Event)
    last_received: float = 0.0
    last_sent: float = 0.0
    #: The trio run's clock (``trio.current_time`` without its two calls on the way: two
    #: reads of it a frame read or written, as the stream's).
    clock: Callable[[], float] = attrs.Factory(lambda: trio.lowlevel.current_clock().current_time)
    #: Set when the connection is to close once what is queued is written.
    close_after_flush: str | None = None
    close_level: int = logging.WARNING
    reason: str = ""
    nursery: trio.Nursery | None = None

    # ---------------------------------------------------------------- StreamConn

    def send_message(self, msg: Any) -> None:
        """Queue ``msg`` (a ``wire.Match*`` message) for the peer; never blocks.

        A message that cannot be encoded is logged and, for a reply, answered by an M_ERROR
        instead. A peer that has more than ``max_unsent`` bytes waiting (it stopped reading) is
        dropped.
        """
        if self.reason:
            return
        kind = type(msg)
        if kind is wire.MatchTask or kind is wire.MatchPing:
            if msg.rid in self.closing:
                return  # (an offer that crossed the drain's M_CLOSE: its queue takes it back)
            if kind is wire.MatchTask:
                self.tasks[msg.rid] = msg.delivery
        try:
            if kind is wire.MatchTask:
                data = encode_task(msg, self.codec, _OUT_LIMITS)
            else:
                data = msg.encode(self.codec, limits=_OUT_LIMITS)
        except wire.WireError as exc:
            logger.warning(
                "matching: cannot encode %s for %s: %s", type(msg).__name__, self.peer, exc
            )
            if isinstance(msg, wire.MatchReply):
                self._unsendable_reply(msg.rid, exc)
            return
        self._write(data)

    def send_reply(self, rid: int, value: Any) -> None:
        """``send_message(wire.MatchReply(value, rid=rid))`` for the call ``rid`` this
        connection read (the answer of every engine call, two a Step), without the message."""
        if self.reason:
            return
        try:
            data = encode_reply(value, rid, self.codec, _OUT_LIMITS)
        except wire.WireError as exc:
            logger.warning("matching: cannot encode MatchReply for %s: %s", self.peer, exc)
            self._unsendable_reply(rid, exc)
            return
        self._write(data)

    def _unsendable_reply(self, rid: int, exc: wire.WireError) -> None:
        self.send_message(
            wire.MatchError("limit", f"the reply cannot be sent: {exc.message}", rid=rid)
        )

    def _write(self, data: bytes) -> None:
        """Queue an encoded frame: held for the batch's end, else for the writer task."""
        if self.batches is not None and not self.unsent and not self.writing:
            # A plain socket takes the batch's frames at once nearly always (``flush``).
            pending = self.pending
            if not pending:
                self.batches.due.append(self)
            pending.append(data)
            return
        self._queue(data)

    def flush(self) -> None:
        """Write the frames held for the batch's end straight to the (non-blocking) socket,
        without waking the writer task; what it does not take now is queued for the writer."""
        pending = self.pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if self.reason or self.fd is None:
            return  # (closed meanwhile: its descriptor may be another socket's now)
        try:
            sent = os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self.drop(f"writing failed ({exc})")
            return
        if sent == len(data):
            self.last_sent = self.clock()
            return
        self._queue(data[sent:])

    def _queue(self, data: bytes) -> None:
        self.unsent.append(data)
        self.unsent_bytes += len(data)
        if self.unsent_bytes > self.ctx.config.max_unsent:
            self.drop(
                f"it stopped reading ({self.unsent_bytes} bytes unsent, over"
                f" max_unsent={self.ctx.config.max_unsent})",
                level=logging.WARNING,
            )
            return
        self.wake.set()

    def error(self, rid: int, code: str, message: str, *, retryable: bool = False) -> None:
        """Send an M_ERROR (``rid`` 0 for the connection)."""
        self.send_message(wire.MatchError(code, message, retryable, rid=rid))

    def drop(self, why: str, *, level: int = logging.INFO) -> None:
        """End the connection now (logged at ``level``)."""
        if not self.reason:
            self.reason = why
            logger.log(level, "matching: dropping %s: %s", self.label, why)
        self.scope.cancel()

    def finish(self, why: str, *, level: int = logging.WARNING) -> None:
        """End the connection once what is queued is written (logged at ``level``)."""
        if self.close_after_flush is None:
            self.close_after_flush = why
            self.close_level = level
        self.wake.set()

    def settle(self) -> None:
        """While draining: close once nothing runs (no call, no registration, no stream; past
        ``stop_drain_timeout`` the streams are not waited for)."""
        if (
            self.draining
            and not self.calls
            and not self.registering
            and (self.drain_over or not self.streams)
        ):
            self.finish(f"drained ({STOPPING})", level=logging.DEBUG)

    @property
    def label(self) -> str:
        if self.role == "worker":
            return f"worker {self.worker_id!r} at {self.peer}"
        return f"{self.role or 'peer'} at {self.peer}"


async def _connection(stream: trio.abc.Stream, ctx: ServerContext, peer: str) -> None:
    otp.process_flag(trap_exit=True)
    conn = Connection(otp.self(), stream, ctx, peer)
    conn.answer = functools.partial(answer_request, conn)
    frames = wire.FrameStream(
        stream, limits=HELLO_LIMITS, versions=frozenset({2}), exact=True, receive_size=65536
    )
    try:
        with conn.scope:
            if not await handshake(conn, frames):
                return
            frames.limits = wire.Limits(max_payload=ctx.config.max_payload)
            frames.exact = False
            if isinstance(stream, trio.SocketStream):
                conn.fd = stream.socket.fileno()
                conn.batches = batched_writes()
            now = trio.current_time()
            conn.last_received = conn.last_sent = now
            async with trio.open_nursery() as nursery:
                conn.nursery = nursery
                nursery.start_soon(_reader, conn, frames)
                nursery.start_soon(_writer, conn)
                nursery.start_soon(_keepalive, conn)
                await _mailbox(conn)
    finally:
        conn.reason = conn.reason or "closed"
        for rid, handle in conn.streams.items():
            # A message, not an exit signal: a RESULT the stream has not read yet comes first.
            handle.deliver(wire.MatchClose(rid=rid))
        await trio.aclose_forcefully(stream)


# ==================================================================== the running connection


async def _mailbox(conn: Connection) -> None:
    """The process's mailbox: the engine's answers to the calls, stream processes ending, and
    the parent's exit signal (a ``shutdown`` drains the connection, any other reason drops
    it)."""
    while True:
        msg = await otp.receive()
        if type(msg) is otp.Response:
            answer_request(conn, msg)
        elif type(msg) is otp.Exit:
            rid = next((r for r, h in conn.streams.items() if h.pid == msg.pid), None)
            if rid is None:
                if is_shutdown(msg.reason):
                    drain(conn)
                    continue
                conn.drop(f"exit signal from {msg.pid!r} ({otp.format_reason(msg.reason)})")
                return
            del conn.streams[rid]
            conn.tasks.pop(rid, None)
            conn.closing.discard(rid)
            conn.settle()
            if otp.is_abnormal(msg.reason):  # (a stream that ends itself says M_CLOSE)
                logger.warning(
                    "matching: stream %d of %s ended: %s",
                    rid,
                    conn.label,
                    otp.format_reason(msg.reason),
                )
                conn.send_message(wire.MatchClose(rid=rid))


async def _writer(conn: Connection) -> None:
    """Write what is queued, a chunk at a time; a chunk that does not drain within
    ``peer_timeout`` drops the peer."""
    timeout = conn.ctx.config.peer_timeout
    stream = conn.stream
    while True:
        if conn.pending:
            conn.flush()  # (before the connection closes, or the writer's next chunk)
        if not conn.unsent:
            if conn.close_after_flush is not None:
                conn.drop(conn.close_after_flush, level=conn.close_level)
                return
            conn.wake = trio.Event()
            await conn.wake.wait()
            continue
        chunk = _take(conn, WRITE_CHUNK)
        conn.writing = True
        with trio.move_on_after(timeout) as timer:
            try:
                await stream.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                conn.drop(f"writing failed ({exc})")
                return
        conn.writing = False
        if timer.cancelled_caught:
            conn.drop(
                f"it stopped reading (nothing drained for {timeout}s,"
                f" {conn.unsent_bytes + len(chunk)} bytes unsent)",
                level=logging.WARNING,
            )
            return
        conn.last_sent = trio.current_time()


def _take(conn: Connection, size: int) -> bytes:
    parts: list[bytes] = []
    taken = 0
    unsent = conn.unsent
    while unsent and taken < size:
        part = unsent.popleft()
        if taken + len(part) > size and parts:
            unsent.appendleft(part)
            break
        if len(part) > size:
            unsent.appendleft(part[size:])
            part = part[:size]
        parts.append(part)
        taken += len(part)
    conn.unsent_bytes -= taken
    return b"".join(parts)


async def _keepalive(conn: Connection) -> None:
    """M_PING (request id 0) when nothing was sent for ``ping_interval``; drop a peer silent
    for ``peer_timeout`` (a client with calls in flight is waiting for us, not silent)."""
    config = conn.ctx.config
    ping, silence = float(config.ping_interval), float(config.peer_timeout)
    while True:
        await trio.sleep_until(min(conn.last_sent + ping, conn.last_received + silence))
        now = trio.current_time()
        if now >= conn.last_received + silence:
            if conn.role == "client" and conn.calls:
                # A client waiting for its answers is not silent: it waits for us.
                conn.last_received = now
                continue
            conn.drop(f"silent for {silence}s (peer_timeout)", level=logging.WARNING)
            return
        if now >= conn.last_sent + ping and not conn.unsent:
            conn.send_message(wire.MatchPing())
            conn.last_sent = now


async def _reader(conn: Connection, frames: wire.FrameStream) -> None:
    while True:
        try:
            batch = await frames.receive_frames()
        except wire.WireError as exc:
            logger.warning("matching: undecodable input from %s: %s", conn.label, exc)
            conn.error(0, "bad_frame", exc.message)
            conn.finish(f"undecodable input ({exc})")
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            conn.drop(f"reading failed ({exc})")
            return
        if not batch:
            conn.drop("it closed the connection", level=logging.DEBUG)
            return
        conn.last_received = conn.clock()
        for frame in batch:
            _handle(conn, frame)
        if conn.held is not None:  # (never held past the read it came in)
            _release(conn)


def _handle(conn: Connection, frame: wire.Frame) -> None:
    try:
        msg = wire.parse_matching(frame)
    except wire.WireError as exc:
        _bad(conn, frame.request_id, exc.message)
        return
    kind = type(msg)
    held = conn.held
    if held is not None:
        if (
            (kind is wire.MatchResult or kind is wire.MatchFailure)
            and msg.rid == held.rid  # type: ignore[union-attr]
            and msg.delivery == held.delivery  # type: ignore[union-attr]
        ):
            conn.held = None
            _to_stream(conn, msg, held)
            return
        _release(conn)
    if kind is wire.MatchPong and msg.rid == 0:  # type: ignore[union-attr]
        return
    if kind is wire.MatchCall:
        assert isinstance(msg, wire.MatchCall)
        start_call(conn, msg)
        return
    if conn.role == "worker":
        if kind in _STREAM_FRAMES:
            _to_stream(conn, msg)
            return
        if kind is wire.MatchRegister:
            assert isinstance(msg, wire.MatchRegister)
            register_stream(conn, msg)
            return
        if kind is wire.MatchDraining:
            logger.info("matching: %s is draining", conn.label)
            _matcher.notify_worker(WorkerDraining(conn.worker_id), matcher=conn.ctx.matcher)
            return
    _bad(
        conn,
        frame.request_id,
        f"a {conn.role} may not send {frame.type.name}",
    )


def _bad(conn: Connection, rid: int, message: str) -> None:
    logger.warning("matching: bad frame from %s: %s", conn.label, message)
    conn.error(rid, "bad_frame", message)


# ==================================================================== worker streams


def _release(conn: Connection) -> None:
    """Hand the held ACCEPT to its stream (what follows it is not its outcome)."""
    held = conn.held
    assert held is not None
    conn.held = None
    handle = conn.streams.get(held.rid)
    if handle is not None:
        handle.deliver(held)


def _to_stream(conn: Connection, msg: Any, accept: wire.MatchAccept | None = None) -> None:
    """Hand ``msg`` to its stream (``accept``: the ACCEPT held before it, see ``held``)."""
    rid = msg.rid
    handle = conn.streams.get(rid)
    if handle is not None:
        kind = type(msg)
        if kind is wire.MatchAccept:
            conn.held = msg  # (held until the next frame: see ``Connection.held``)
            return
        if accept is not None:
            handle.deliver_served(accept, msg)
        else:
            if kind is wire.MatchDecline:
                # Noted here, in the order the worker wrote it: the RESULT that frees its slot
                # comes after it on this connection, but may reach its own stream process
                # before this DECLINE reaches its stream; that call's end must still send
                # WorkerFreed.
                conn.notices.note_decline(msg)
            handle.deliver(msg)
        if kind is wire.MatchClose:
            conn.tasks.pop(rid, None)
        elif (
            kind is wire.MatchResult or kind is wire.MatchFailure or kind is wire.MatchDecline
        ) and conn.tasks.get(rid) == msg.delivery:
            del conn.tasks[rid]
            if conn.draining:
                close_stream(conn, rid, handle)  # (after the outcome: the stream reads it first)
    elif rid in conn.registering:
        conn.registering[rid].append(msg)
    elif type(msg) is wire.MatchPong or type(msg) is wire.MatchClose:
        pass  # (crossed the stream's own close)
    else:
        _bad(conn, rid, f"unknown stream id {rid}: register it first (M_REGISTER)")
