"""The client engine (trio): start flows, call their RPCs, wait for results, describe, list and
cancel them, and list the server's queues (the seed's ``Client``; every flavour in
``_adapters.py`` runs this one engine).

One connection is shared by every call of the engine (calls are multiplexed by call id). A
connection that is lost is dropped and the next call dials again; a call caught by the loss fails
with the connection's error, since it may or may not have reached the server. The server's
connection-level M_PING is answered with M_PONG (a trio system task per connection reads its
``control`` channel), so an idle client is not dropped after ``peer_timeout``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

import wire

from ._blobs import BlobCache
from ._client_ops import (
    ClientOps,
    Steps,
    after_loss,
    connection_lost,
    drive,
    drive_call_rpc,
    share_docs,
)
from ._errors import ClientClosed, MatchingError
from ._model import (
    Flow,
    FlowDescription,
    FlowStatus,
    FlowSummary,
    QueueSummary,
    Registry,
)
from ._options import ClientOptions

__all__ = ["ClientEngine"]

log = logging.getLogger("apps.matching.client")

T = TypeVar("T")


class CallConnection(Protocol):
    """What the engine needs of a connection (``SdkConnection`` in role ``"client"``)."""

    @property
    def closed(self) -> bool: ...

    async def call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any: ...

    async def aclose(self) -> None: ...


Connect = Callable[[ClientOptions], Awaitable[CallConnection]]


async def _answer_pings(conn: Any) -> None:
    """Answer each connection-level M_PING on ``conn.control`` with M_PONG until the channel
    ends (the connection closed or was lost). Other control messages (M_RECONNECT, M_ERROR
    with request id 0) are ignored: calls caught by a loss fail on their own. A trio system
    task: it never raises (cancellation at the end of the run aside)."""
    try:
        async for message in conn.control:
            if type(message) is wire.MatchPing:
                try:
                    await conn.send(wire.MatchPong())
                except MatchingError:  # the connection is gone: the channel ends too
                    return
    except Exception:
        log.exception("answering the server's pings failed")


async def _open_sdk_connection(options: ClientOptions) -> CallConnection:
    from ._sdk_connection import SdkConnection

    conn: CallConnection = await SdkConnection.open(options, "client")
    return conn


class ClientEngine:
    """A matching client on trio: one connection, dialled on the first call; the ops are
    :class:`~._client_ops.ClientOps`' (shared with the other flavours, as are its arguments),
    run here. ``connect``: how to dial (tests); default ``SdkConnection.open(options,
    "client")``.

    Every method is a checkpoint. A call cancelled while it waits abandons its answer (the
    server may still carry out the call: a cancelled ``start_flow`` may have started the
    flow). Errors are the typed classes of ``_errors`` the server's answers name.
    """

    def __init__(
        self,
        registry: Registry,
        cache: BlobCache | None,
        options: ClientOptions,
        *,
        connect: Connect | None = None,
    ) -> None:
        self._ops = ClientOps(registry, cache, options)
        self.registry = registry
        self.cache = cache
        self.options = options
        self._connect: Connect = connect or _open_sdk_connection
        self._conn: CallConnection | None = None
        self._lock = trio.Lock()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def open(self) -> None:
        """Dial the server now (calls do it themselves when needed).

        Raises:
            ClientClosed: :meth:`close` was called.
            MatchingError: The server refused the connection (e.g. ``AuthenticationError``).
            OSError: The server could not be reached.
        """
        await self._connection()
        await trio.lowlevel.checkpoint()  # (an open connection is returned without one)

    async def close(self) -> None:
        """Close the connection; calls in flight fail with :class:`ClientClosed`, later calls
        too. Closing twice is a no-op."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with trio.CancelScope(shield=True):
                await conn.aclose()
        else:
            await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ClientEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _connection(self) -> CallConnection:
        if self._closed:
            raise ClientClosed("the client is closed; make a new one to call the server")
        conn = self._conn
        if conn is not None and not conn.closed:
            # No checkpoint here: the call's write on it is one (a wake-up per call saved).
            return conn
        async with self._lock:
            if self._closed:
                raise ClientClosed("the client is closed; make a new one to call the server")
            conn = self._conn
            if conn is not None and conn.closed:
                self._conn = conn = None
            if conn is None:
                conn = await self._connect(self.options)
                if self._closed:  # closed while dialling
                    with trio.CancelScope(shield=True):
                        await conn.aclose()
                    raise ClientClosed("the client was closed while it connected")
                self._conn = conn
                if getattr(conn, "control", None) is not None:
                    trio.lowlevel.spawn_system_task(_answer_pings, conn)
            return conn

    def _drop(self, conn: CallConnection) -> None:
        if self._conn is conn:
            self._conn = None

    async def _call(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        """Send one op; reconnect once for an idempotent op whose connection was found lost."""
        for retry in (False, True):
            conn = self._conn
            if conn is None or conn.closed or self._closed:
                conn = await self._connection()
            try:
                return await conn.call(op, args, timeout=timeout)
            except BaseException as exc:
                if not connection_lost(exc):
                    raise
                self._drop(conn)
                with trio.CancelScope(shield=True):
                    try:
                        await conn.aclose()
                    except Exception:
                        pass
                after_loss(op, exc, retry, self._closed)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _run(self, steps: Steps[T]) -> T:
        """Carry out an op's steps: its calls on the connection, its file I/O in a thread."""
        return await drive(steps, self._call, trio.to_thread.run_sync)

    # -- the ops (ClientOps' docs) ---------------------------------------------------------

    async def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> str:
        return await self._run(self._ops.start_flow(flow, *args, flow_id=flow_id))

    async def start_known_flow(self, flow_type: str, *args: Any, flow_id: str | None = None) -> str:
        return await self._run(self._ops.start_known_flow(flow_type, *args, flow_id=flow_id))

    async def call_rpc(
        self, flow_id: str, name: str, *args: Any, timeout: float | None = None
    ) -> Any:
        return await drive_call_rpc(
            self._ops, self._call, trio.to_thread.run_sync, flow_id, name, args, timeout
        )

    async def result(self, flow_id: str, timeout: float | None = None) -> Any:
        return await self._run(self._ops.result(flow_id, timeout))

    async def describe_flow(self, flow_id: str) -> FlowDescription:
        return await self._run(self._ops.describe_flow(flow_id))

    async def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> list[FlowSummary]:
        return await self._run(self._ops.list_flows(flow_type, status, limit))

    async def cancel_flow(self, flow_id: str) -> None:
        await self._run(self._ops.cancel_flow(flow_id))

    async def list_queues(self) -> list[QueueSummary]:
        return await self._run(self._ops.list_queues())


share_docs(ClientEngine)
