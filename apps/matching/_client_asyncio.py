"""The asyncio client's engine and connection: the client's ops (``_client_ops``) on an asyncio
protocol of the caller's own loop, no thread between a task and the socket. The connection's
protocol (HELLO, WELCOME, frame routing, errors) is ``_sdk_protocol``'s, as the trio and the
blocking connections use it.

Answers are handed to their calls' futures as the loop reads them, and the server's
connection-level M_PING is answered there at once, so an idle client is never dropped while
its loop runs. A connection belongs to the loop that dialled it: a call from another loop (a
later ``asyncio.run``) dials again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from typing import Any, TypeVar

import wire

from . import _sdk_protocol as protocol
from ._blobs import BlobCache
from ._client_ops import ClientOps, Steps, after_loss, connection_lost, drive, drive_call_rpc
from ._errors import ClientClosed, MatchingError, ProtocolError
from ._options import ClientOptions

__all__ = ["AsyncioClientEngine"]

log = logging.getLogger("apps.matching.client")

T = TypeVar("T")

_LIMITS = wire.Limits()


class AsyncioConnection(asyncio.Protocol):
    """One connection to the matching server on an asyncio loop (build it with :func:`dial`).

    Attributes:
        broken: Why the connection ended (None while it is open).
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = wire.FrameDecoder(limits=_LIMITS, versions=frozenset({2}))
        self.codec = wire.Codec.TLV
        #: The server's answer to HELLO (None: the connection ended first).
        self.first: asyncio.Future[wire.Frame | None] = self.loop.create_future()
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count(1)
        self.broken: MatchingError | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except wire.WireError as exc:
            self.lose(ProtocolError(f"{self.where} sent a malformed frame: {exc}"))
            return
        for frame in frames:
            if not self.first.done():
                self.first.set_result(frame)
                continue
            try:
                self._deliver(frame)
            except MatchingError as exc:
                self.lose(exc)
                return

    def eof_received(self) -> bool:
        self.lose(ClientClosed("the server closed it", retryable=True))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = "the server closed it" if exc is None else f"read failed: {exc}"
        self.lose(ClientClosed(reason, retryable=True))

    def _deliver(self, frame: wire.Frame) -> None:
        kind, message = protocol.parse(frame, self.where)
        if kind == protocol.ANSWER:
            future = self.calls.pop(message.rid, None)
            if future is None or future.done():
                log.debug("dropped a late answer to call %d", message.rid)
                return
            value, error = protocol.outcome(message)
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)
        elif kind == protocol.CONTROL:
            # M_RECONNECT and M_ERROR of the connection are ignored, as the trio engine does.
            if type(message) is wire.MatchPing and self.transport is not None:
                self.transport.write(wire.MatchPong().encode(self.codec, limits=_LIMITS))
        else:  # a client opens no stream
            log.debug("dropped %s for stream %d, which is not open", message, message.rid)

    # -- calls -----------------------------------------------------------------------------

    async def call(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        """Send M_CALL ``op`` and wait for its M_REPLY value (as ``SdkConnection.call``).

        Raises:
            MatchingError: The server answered M_ERROR (the class its code names).
            CallTimeout: No answer within ``timeout`` seconds (a late reply is dropped).
            ClientClosed: The connection was lost before the answer (retryable).

        On cancellation the call is forgotten (its late reply is dropped).
        """
        if self.broken is not None or self.transport is None:
            raise self._closed_error()
        rid = next(self.ids)
        data = wire.MatchCall(op=op, args=args, rid=rid).encode(self.codec, limits=_LIMITS)
        future = self.loop.create_future()
        self.calls[rid] = future
        timer = None
        try:
            self.transport.write(data)
            if timeout is not None:
                timer = self.loop.call_later(timeout, self._expire, future, op, timeout)
            return await future
        finally:
            self.calls.pop(rid, None)
            if timer is not None:
                timer.cancel()

    def _expire(self, future: asyncio.Future[Any], op: str, timeout: float) -> None:
        if not future.done():
            future.set_exception(protocol.call_timed_out(op, self.where, timeout))

    def _closed_error(self) -> ClientClosed:
        reason = "" if self.broken is None else f": {self.broken.message}"
        return ClientClosed(f"the connection to {self.where} is closed{reason}", retryable=True)

    def lose(self, error: MatchingError) -> None:
        """End the connection (once): waiting calls fail with :class:`ClientClosed`."""
        if self.broken is not None:
            return
        self.broken = error
        if not self.first.done():
            self.first.set_result(None)
        failed = ClientClosed(
            f"the connection to {self.where} was closed: {error.message}", retryable=True
        )
        calls, self.calls = self.calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(failed)
        if self.transport is not None:
            self.transport.abort()


async def dial(options: ClientOptions, role: str = "client") -> AsyncioConnection:
    """Dial the server of ``options`` on the running loop, say HELLO and wait for WELCOME,
    all within ``connect_timeout`` (as ``SdkConnection.open``, whose errors it raises)."""
    address = options.address
    where = str(address)
    loop = asyncio.get_running_loop()
    conn: AsyncioConnection | None = None
    try:
        async with asyncio.timeout(options.connect_timeout):
            try:
                if address.kind == "unix":
                    _, conn = await loop.create_unix_connection(
                        lambda: AsyncioConnection(where), address.path
                    )
                else:
                    tls = protocol.tls_context(options) if options.uses_tls else None
                    _, conn = await loop.create_connection(
                        lambda: AsyncioConnection(where),
                        address.host,
                        address.port,
                        ssl=tls,
                        server_hostname=(options.tls_server_hostname or address.host)
                        if tls is not None
                        else None,
                    )
            except ssl.SSLError as exc:
                raise protocol.tls_failed(where, exc) from exc
            except OSError as exc:
                raise protocol.unreachable(where, exc) from exc
            assert conn.transport is not None
            hello = protocol.hello(options, role).to_frame()
            conn.transport.write(wire.encode_frame(hello, limits=_LIMITS))
            welcome = protocol.welcome(await conn.first, where)
    except MatchingError:
        if conn is not None:
            conn.lose(ClientClosed("the handshake failed"))
        raise
    except TimeoutError as exc:
        if conn is not None:
            conn.lose(ClientClosed("the handshake took too long"))
        raise protocol.connect_too_slow(where, options) from exc
    except BaseException:
        if conn is not None:
            conn.lose(ClientClosed("the handshake was cancelled"))
        raise
    conn.codec = welcome.codec
    return conn


class AsyncioClientEngine:
    """The asyncio client's engine: :class:`ClientOps` run on an :class:`AsyncioConnection`,
    dialled on the first call, dialled again after a loss (as ``ClientEngine`` on trio)."""

    def __init__(self, registry: Any, cache: BlobCache | None, options: ClientOptions) -> None:
        self.ops = ClientOps(registry, cache, options)
        self.options = options
        self._conn: AsyncioConnection | None = None
        self._dialling: asyncio.Future[AsyncioConnection] | None = None
        self._closed = False

    async def run(self, steps: Steps[T]) -> T:
        """Carry out an op's steps: its calls on the connection, its file I/O in a thread."""
        return await drive(steps, self._call, asyncio.to_thread)

    async def call_rpc(
        self, flow_id: str, name: str, args: tuple[Any, ...], timeout: float | None
    ) -> Any:
        """``ops.call_rpc`` carried out (with no generator of its steps: ``drive_call_rpc``)."""
        return await drive_call_rpc(
            self.ops, self._call, asyncio.to_thread, flow_id, name, args, timeout
        )

    async def open(self) -> None:
        await self._connection()

    async def close(self) -> None:
        """Close the connection; calls in flight fail with :class:`ClientClosed`, later calls
        too. Closing twice is a no-op."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.lose(ClientClosed("the client was closed"))
        await asyncio.sleep(0)

    async def _connection(self) -> AsyncioConnection:
        if self._closed:
            raise ClientClosed("the client is closed; make a new one to call the server")
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is not None and conn.broken is None and conn.loop is loop:
            return conn
        dialling = self._dialling
        if dialling is None or dialling.get_loop() is not loop:
            # One dial for every caller that waits; it ends even if they are cancelled.
            dialling = self._dialling = asyncio.ensure_future(dial(self.options))
            dialling.add_done_callback(self._dialled)
        conn = await asyncio.shield(dialling)
        if self._closed:
            raise ClientClosed("the client was closed while it connected")
        return conn

    def _dialled(self, dialling: asyncio.Future[AsyncioConnection]) -> None:
        if self._dialling is dialling:
            self._dialling = None
        if dialling.cancelled() or dialling.exception() is not None:
            return
        conn = dialling.result()
        if self._closed:
            conn.lose(ClientClosed("the client was closed while it connected"))
        else:
            self._conn = conn

    async def _call(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        """Send one op; reconnect once for an idempotent op whose connection was found lost."""
        for retry in (False, True):
            conn = await self._connection()
            try:
                return await conn.call(op, args, timeout)
            except BaseException as exc:
                if not connection_lost(exc):
                    raise
                if self._conn is conn:
                    self._conn = None
                conn.lose(ClientClosed("a call found it lost", retryable=True))
                after_loss(op, exc, retry, self._closed)
        raise AssertionError("unreachable")  # pragma: no cover
