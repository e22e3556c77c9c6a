"""A distribution connection's process (Erlang's ``dist_util`` and the connection's controller):
dial or accept, the TLS and distribution handshakes, then the reader, the writer and the
ticker until the connection breaks; every ordinary ending is logged and kept as the
connection's ``failure``, never a crash.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket as _socket
import ssl
from typing import TYPE_CHECKING, Any

import trio
from trio.lowlevel import Task, current_task, reschedule, wait_readable, wait_task_rescheduled

import wire

from ._dist_config import DistributionError, parse_address
from ._dist_connection import (
    BAD_COOKIE,
    CLOSED,
    HANDSHAKE_TIMEOUT,
    MALFORMED,
    MISCONFIGURED,
    NOT_HEARD,
    NOT_READ,
    REFUSED,
    UNREACHABLE,
    WRONG_NODE,
    Connection,
    ConnectionFailure,
)
from ._dist_handshake import (
    BadCookie,
    HandshakeError,
    HandshakeRefused,
    WrongNode,
    accept,
    initiate,
)
from ._dist_inbound import dropped
from ._dist_records import UnknownRemoteValue
from ._process import CURRENT_PROCESS, CallWaiter, current_process

if TYPE_CHECKING:
    from ._distribution import Distribution

logger = logging.getLogger("otp.dist")

#: Limits until a peer has proved the cookie: handshake frames are small (Erlang's handshake
#: messages have a 16-bit length), so a stranger cannot make the node buffer a large one.
_HANDSHAKE_LIMITS = wire.Limits(max_payload=65535)


async def _dial(dist: Distribution, address: str) -> tuple[trio.abc.Stream, str | None]:
    kind, where = parse_address(address)
    if kind == "unix":
        return await trio.open_unix_socket(where), None
    host, port = where
    tls = dist.config.tls
    if tls is None:
        if not dist.config.insecure_tcp:
            raise DistributionError(
                f"dialling {address} needs TLS certificates; plain TCP only with insecure_tcp"
            )
        return await trio.open_tcp_stream(host, port), None
    tcp = await trio.open_tcp_stream(host, port)
    stream = trio.SSLStream(
        tcp,
        tls.client_context(),
        server_hostname=tls.server_hostname or host,
        https_compatible=False,
    )
    try:
        await _tls_handshake(stream)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream, host


async def _tls_handshake(stream: trio.SSLStream[Any]) -> None:
    """Run the TLS handshake now, so a refusal is told as one (with its alert or reason), not
    as a connection closed at the first read.

    Raises:
        HandshakeError: the handshake failed.
    """
    try:
        await stream.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            reason = f"certificate refused: {cause.verify_message}"
        elif isinstance(cause, ssl.SSLError):
            reason = cause.reason or str(cause)
            if "ALERT" in reason:
                reason = f"the peer sent the alert {reason}"
        else:
            reason = f"the peer closed the connection ({cause or exc!r})"
        raise HandshakeError(f"TLS handshake failed: {reason}") from exc


async def run_connection(
    dist: Distribution,
    conn: Connection | None,
    stream: trio.abc.Stream | None,
    address: str | None,
) -> None:
    """A connection's process: dial or accept, handshake, then read, write and ping until the
    link breaks. ``address`` is where to dial, or where an accepted peer is (for the log)."""
    node = dist.node
    me = current_process()
    config = dist.config
    what = f"to {conn.peer} at {address}" if conn is not None else f"from {address}"
    # Our own pending dial to the peer, which this accepted connection is to replace.
    rival: Connection | None = None
    refused = False  # our dial, refused by the peer before its answer

    def admit(peer: str) -> None:
        nonlocal rival
        rival = dist.admit(peer)

    try:
        try:
            with trio.fail_after(config.handshake_timeout):
                if stream is None:
                    assert address is not None
                    stream, _ = await _dial(dist, address)
                elif config.tls is not None and _is_tcp(stream):
                    stream = trio.SSLStream(stream, config.tls.server_context(), server_side=True)
                    await _tls_handshake(stream)
                # Read frame by frame: what follows the last handshake frame is read under
                # the connection's limits (an initiator may write right behind its proof).
                frames = wire.FrameStream(
                    stream, limits=_HANDSHAKE_LIMITS, versions=frozenset({2}), exact=True
                )
                handshake = (
                    functools.partial(initiate, expected=conn.peer)
                    if conn is not None
                    else functools.partial(accept, admit=admit)
                )
                peer = await handshake(
                    frames,
                    name=node.name,
                    creation=node.creation,
                    cookie=config.cookie,
                    codecs=config.codecs,
                    listen=dist.listening,
                    hidden=config.hidden,  # hidden nodes (observer-remote)
                )
                if conn is None:
                    conn = Connection(dist, peer.name)
                    conn.process = me
            frames.limits = config.limits
            frames.exact = False
            me.behaviour = f"dist_connection {peer.name}"
            reader: wire.FrameStream | _SocketFrames = frames
            if isinstance(stream, trio.SocketStream):
                conn.direct_fd = stream.socket.fileno()
                # The handshake's stream read no byte past its last frame (exact): the
                # socket holds the rest.
                reader = conn.reader = conn.socket_reader = _SocketFrames(
                    conn.direct_fd, config.limits
                )
            else:
                conn.reader = frames.stream = _CountedReads(frames.stream)
            dist.connection_up(conn, peer)
            rival = None
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.write_loop, stream)
                    nursery.start_soon(_ticker, conn, config.liveness_timeout)
                    await _read_loop(dist, conn, reader)
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The reader, writer or ticker failed: let the handlers below name the cause.
                raise _sole(group) from None
        except _CONNECTION_ENDINGS as exc:
            _ended(conn, what, exc, config.liveness_timeout)
            refused = isinstance(exc, HandshakeRefused)
        if conn is not None and conn.state == "connecting":
            await _await_rival(dist, conn, refused)
    finally:
        if rival is not None:
            dist.rival_failed(rival)
        if conn is not None:
            conn.direct_fd = None
            dist.connection_lost(conn)
            if conn.socket_reader is not None:
                conn.socket_reader.close()
                conn.socket_reader = None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


def _ended(conn: Connection | None, what: str, exc: BaseException, liveness: float) -> None:
    """Log how the connection ``what`` ended (one of _CONNECTION_ENDINGS) and keep it as the
    connection's failure (the first one: say, queue_limit's, before its process is killed)."""
    if isinstance(exc, trio.TooSlowError):
        logger.warning("distribution connection %s: handshake timed out", what)
        kind, reason = HANDSHAKE_TIMEOUT, "handshake timed out"
    elif isinstance(exc, HandshakeRefused):
        logger.info("distribution connection %s refused: %s", what, exc)
        kind, reason = REFUSED, str(exc)
    elif isinstance(exc, HandshakeError):
        logger.warning("distribution connection %s refused: %s", what, exc)
        kind = (
            BAD_COOKIE
            if isinstance(exc, BadCookie)
            else WRONG_NODE
            if isinstance(exc, WrongNode)
            else REFUSED
        )
        reason = str(exc)
    elif isinstance(exc, wire.WireError):
        logger.warning("distribution connection %s dropped: malformed input: %s", what, exc)
        kind, reason = MALFORMED, str(exc)
    elif isinstance(exc, _SOCKET_ENDINGS):
        logger.info("distribution connection %s closed: %s", what, exc)
        # Before the handshake is done, the address answered nothing we could use.
        kind = UNREACHABLE if conn is None or conn.state == "connecting" else CLOSED
        reason = str(exc) or repr(exc)
    elif isinstance(exc, _LivenessTimeout):
        verb = "read" if exc.args == ("read",) else "sent"
        logger.warning(
            "node %s %s nothing for %s s: connection counted as lost",
            conn.peer if conn else "?",
            verb,
            liveness,
        )
        kind = NOT_READ if verb == "read" else NOT_HEARD
        reason = f"the peer {verb} nothing for {liveness} s"
    else:
        logger.warning("distribution connection %s: %s", what, exc)
        kind, reason = MISCONFIGURED, str(exc)
    if conn is not None and conn.failure is None:
        conn.failure = ConnectionFailure(kind, reason)


async def _await_rival(dist: Distribution, conn: Connection, refused: bool) -> None:
    """Our dial ``conn`` failed, but the peer's own dial may replace it (see Distribution.admit):
    wait while one is in its handshake, for it to take over (connection_up ends this process)
    or fail. A peer that refused ours (``refused``) dials us itself if it has the smaller
    name (a simultaneous connect), its hello sent before its refusal: if it has not come yet,
    it may still within a handshake's time."""
    grace = dist.config.handshake_timeout if refused and dist.node.name > conn.peer else 0.0
    deadline = trio.current_time() + grace
    while conn.state == "connecting" and (
        conn.rivals or (not conn.rival_came and trio.current_time() < deadline)
    ):
        with trio.move_on_at(math.inf if conn.rivals else deadline):
            await conn.rival_lot.park()


def _is_tcp(stream: trio.abc.Stream) -> bool:
    sock = getattr(stream, "socket", None)
    return sock is not None and sock.family in (_socket.AF_INET, _socket.AF_INET6)


class _LivenessTimeout(Exception):
    pass


#: How a socket fails or closes under a connection.
_SOCKET_ENDINGS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError)

#: What ends a connection in the ordinary way (each is logged, never a crash; see _ended).
_CONNECTION_ENDINGS = (
    trio.TooSlowError,
    HandshakeError,
    wire.WireError,
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    ssl.SSLError,
    _LivenessTimeout,
    DistributionError,
)


def _sole(exc: BaseException) -> BaseException:
    """What ended the connection: the one exception inside nested single-member exception
    groups; when several tasks failed at once (a reset seen by the reader and the writer), the
    first of them if every one is an ordinary ending; else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        leaves = _leaves(exc)
        if all(isinstance(leaf, _CONNECTION_ENDINGS) for leaf in leaves):
            return leaves[0]
    return exc


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


#: The most bytes the reader takes from a plain socket at once.
READ_BYTES = 65536

#: What the leader met that ends the connection without an error: its reader's receive_frames
#: returns [] (the socket's clean end, or a connection declared lost by a frame it dispatched).
_STOP = object()


class _SocketFrames:
    """A connection's incoming frames, read straight from its plain socket (the reader of
    :func:`_read_loop`; a TLS connection reads through its ``wire.FrameStream``).

    A read that drained the socket (it returned less than was asked) is almost always followed
    by a quiet socket: the next read waits until the socket is readable first, where trio's
    ``receive_some`` tries a read that fails before it waits (a system call and an exception
    on each side of every round trip). After a full read it reads again at once, after a
    checkpoint, so a peer that floods cannot starve the node's other tasks.

    A remote call's caller may read the socket itself while it waits: see :meth:`wait_reply`.
    """

    __slots__ = (
        "_closed",
        "_decoder",
        "_drained",
        "_ended",
        "_fd",
        "_follower",
        "_lead_fd",
        "_parked",
        "leader",
        "reads",
        "received",
    )

    def __init__(self, fd: int, limits: wire.Limits) -> None:
        self._fd = fd
        self._decoder = wire.FrameDecoder(limits=limits, versions=frozenset({2}))
        self._drained = False
        #: Bytes read so far (Connection.received): one addition a read, not a frame.
        self.received = 0
        #: Reads so far (the reader skips its own read when another took the bytes that woke it).
        self.reads = 0
        #: The waiter of the remote call whose caller reads the socket (see wait_reply), if any.
        self.leader: CallWaiter | None = None
        #: A duplicate of the socket's descriptor that the leader waits on (made for the first
        #: leader): trio lets one task wait on a descriptor, and this one wakes the leader alone.
        self._lead_fd: int | None = None
        #: The leader waits for the socket (what wakes it otherwise is ``_wake_leader``).
        self._parked = False
        #: What a leader met that ends the connection: an error to raise, or _STOP.
        self._ended: Any = None
        #: The reader's task while it waits for a leader to stop (see receive_frames).
        self._follower: Task | None = None
        self._closed = False

    async def receive_frames(self) -> list[wire.Frame]:
        """Every frame available (at least one, waiting for it), or ``[]`` at a clean end.

        Raises:
            wire.WireError: the peer sent malformed bytes.
            OSError: the socket failed (say, reset by the peer).
        """
        decoder = self._decoder
        decoder.feed(b"")  # raises an error found after the last frame delivered
        fd = self._fd
        while True:
            if self._ended is not None:
                ended, self._ended = self._ended, _STOP
                if ended is _STOP:
                    return []
                raise ended
            if self.leader is not None:
                # A caller reads the socket (see wait_reply): wait until it stops, off the socket.
                self._follower = current_task()
                await wait_task_rescheduled(self._abort_follower)
                continue
            if self._drained:
                reads = self.reads
                await wait_readable(fd)
                if self.reads != reads or self.leader is not None:
                    continue  # (a caller took what woke this task, or reads the rest)
            else:
                await trio.lowlevel.checkpoint()
                if self.leader is not None:
                    continue
            if self._ended is not None:
                continue
            try:
                frames = self._read()
            except (BlockingIOError, InterruptedError):
                self._drained = True
                continue
            if frames is None:
                return []
            if frames:
                return frames

    def _abort_follower(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self._follower = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _read(self) -> list[wire.Frame] | None:
        """One read of the socket: the frames it completes (maybe none), or None at its clean
        end.

        Raises:
            BlockingIOError: nothing to read.
            wire.WireError: the peer sent malformed bytes (or ended inside a frame).
            OSError: the socket failed.
        """
        data = os.read(self._fd, READ_BYTES)
        self.reads += 1
        size = len(data)
        if not size:
            self._decoder.feed_eof()
            return None
        self.received += size
        self._drained = size < READ_BYTES
        return self._decoder.feed(data)

    async def wait_reply(self, dist: Distribution, conn: Connection, waiter: CallWaiter) -> None:
        """Wait for the remote call of ``waiter`` on this connection to end, reading the socket
        in the caller's task if no other caller does (leader/follower): the reply then costs
        one trio loop pass before the caller goes on, not two (the reader's, then the
        caller's).

        Every frame read is dispatched in order, exactly as the reader dispatches it (as the
        connection's process), until the waiter is resolved: by a frame read here, or from
        elsewhere (its timeout, a deferred reply from a local process, the connection's
        loss), which wakes this wait (``_wake_leader``). The reader meanwhile waits off the
        socket and reads nothing; what ends the connection here (its end, an error, a
        malformed frame) is handed to the reader, which ends it as it would have. Cancelled,
        the caller has read nothing: it is cancelled only while it waits.
        """
        if self.leader is not None or self._closed or self._ended is not None:
            await waiter.wait()
            return
        lead_fd = self._lead_fd
        if lead_fd is None:
            lead_fd = self._lead_fd = os.dup(self._fd)
        self.leader = waiter
        waiter.wake = self._wake_leader
        try:
            while not waiter.done:
                self._parked = True
                try:
                    await wait_readable(lead_fd)
                except trio.ClosedResourceError:
                    self._parked = False
                    if self._closed:
                        break
                    continue  # (woken by _wake_leader)
                self._parked = False
                if self._ended is not None:
                    break
                try:
                    frames = self._read()
                except (BlockingIOError, InterruptedError):
                    self._drained = True
                    continue
                except Exception as exc:  # (an OSError or wire.WireError: the reader's to raise)
                    self._end(exc)
                    break
                if frames is None:
                    self._end(_STOP)
                    break
                if frames:
                    # As the connection's process dispatches them: what a frame does may
                    # depend on it (a sender's pid, a busy queue suspending the sender).
                    token = CURRENT_PROCESS.set(conn.process)  # type: ignore[arg-type]
                    try:
                        if not _dispatch_batch(dist, conn, frames):
                            self._end(_STOP)
                            break
                    except Exception as exc:
                        self._end(exc)
                        break
                    finally:
                        CURRENT_PROCESS.reset(token)
        finally:
            self._parked = False
            self.leader = None
            waiter.wake = None
            follower = self._follower
            if follower is not None:
                self._follower = None
                reschedule(follower)
        if not waiter.done:
            # (The connection ended: its loss resolves the waiter.)
            await waiter.wait()

    def _wake_leader(self) -> None:
        """The leader's waiter was resolved from elsewhere: wake it if it waits for the socket
        (the only task that waits on its descriptor)."""
        if self._parked and self._lead_fd is not None:
            trio.lowlevel.notify_closing(self._lead_fd)

    def _end(self, ended: Any) -> None:
        """What the leader met ends the connection: the reader raises ``ended`` (or returns []
        for _STOP). It sees it at once: it waits for the leader to stop, or waited for the
        socket with the leader and was woken with it (by the bytes the leader read)."""
        self._ended = ended

    def close(self) -> None:
        """The connection ended: no caller reads the socket any more (a leader still waiting
        goes back to its waiter)."""
        self._closed = True
        fd = self._lead_fd
        if fd is not None:
            self._lead_fd = None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


class _CountedReads(trio.abc.Stream):
    """A TLS connection's stream under its ``wire.FrameStream``, counting the bytes read
    (Connection.received, as _SocketFrames counts a plain socket's)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.received = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.stream.receive_some(max_bytes)
        self.received += len(data)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def _read_loop(
    dist: Distribution, conn: Connection, frames: wire.FrameStream | _SocketFrames
) -> None:
    receive_frames = frames.receive_frames
    while batch := await receive_frames():
        if not _dispatch_batch(dist, conn, batch):
            return


def _dispatch_batch(dist: Distribution, conn: Connection, batch: list[wire.Frame]) -> bool:
    """Dispatch every frame that arrived together, in order: one scheduler pass per read, not
    per frame (per-pair order is the order of the batch). False once the connection was
    declared lost (disconnect() does so at once): nothing more of it is delivered, or acted
    on (a "peers" list read just before would redial).

    Raises:
        wire.MalformedMessage: a frame's payload is malformed.
    """
    conn.received_since_tick = True
    conn.heard = True
    dispatch = dist.dispatch
    for frame in batch:
        if conn.state == "down":
            return False
        try:
            dispatch(conn, frame)
        except UnknownRemoteValue as exc:
            dropped(frame.type.name, exc)  # (a pg group name, say): not the connection's end
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise wire.MalformedMessage(f"bad {frame.type.name} payload: {exc!r}") from exc
    return True


async def _ticker(conn: Connection, liveness: float) -> None:
    """Erlang's net tick: every quarter of ``liveness``, ping a peer we have sent nothing to,
    and count the connection lost once nothing has come from the peer for ``liveness``, or
    the peer has read nothing of what waits for it for that long (a peer that sends but never
    reads would hold its queue, and the senders it suspends, for ever).

    Liveness is checked here, not by a deadline on every read: the reader only sets a flag.
    """
    heard = read = trio.current_time()
    written = conn.written
    while True:
        await trio.sleep(liveness / 4)
        now = trio.current_time()
        if conn.received_since_tick:
            conn.received_since_tick = False
            heard = now
        elif now - heard >= liveness:
            raise _LivenessTimeout()
        if conn.written != written or not conn.queued:
            written, read = conn.written, now
        elif now - read >= liveness:
            raise _LivenessTimeout("read")
        if not conn.sent_since_tick and not conn.queued:
            conn.enqueue(wire.MessageType.PING, None)
        conn.sent_since_tick = False


# -- the public API -------------------------------------------------------------------------------
