"""A distribution connection's process (Erlang's ``dist_util`` and the connection's controller):
dial or accept, the TLS and distribution handshakes, then the reader, the writer and the
ticker until the connection breaks; every ordinary ending is logged and kept as the
connection's ``failure``, never a crash.
"""

from __future__ import annotations

import functools
import logging
import math
import socket as _socket
import ssl
from typing import TYPE_CHECKING, Any

import trio

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
from ._dist_reading import SocketFrames, dispatch_batch
from ._process import current_process

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
            reader: wire.FrameStream | SocketFrames = frames
            if isinstance(stream, trio.SocketStream):
                conn.direct_fd = stream.socket.fileno()
                # The handshake's stream read no byte past its last frame (exact): the
                # socket holds the rest.
                reader = conn.reader = conn.socket_reader = SocketFrames(
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


class _CountedReads(trio.abc.Stream):
    """A TLS connection's stream under its ``wire.FrameStream``, counting the bytes read
    (Connection.received, as SocketFrames counts a plain socket's)."""

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
    dist: Distribution, conn: Connection, frames: wire.FrameStream | SocketFrames
) -> None:
    receive_frames = frames.receive_frames
    while batch := await receive_frames():
        if not dispatch_batch(dist, conn, batch):
            return


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
