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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import trio

import wire

from ._blobs import BlobCache
from ._errors import ClientClosed, ConfigurationError, MatchingError, ProtocolError
from ._model import (
    Flow,
    FlowDefinition,
    FlowDescription,
    FlowStatus,
    FlowSummary,
    QueueSummary,
    Registry,
)
from ._options import ClientOptions

__all__ = ["ClientEngine", "flow_definition_payload"]

#: Seconds a call waits past the wait it asked the server for, so the server's own answer (an
#: M_ERROR ``timeout``) wins over the local timeout.
TIMEOUT_GRACE = 5.0

#: Ops that may be sent again on a fresh connection when the first one was lost under them.
_IDEMPOTENT = frozenset({"result", "describe", "list", "queues", "get_blob", "put_blob", "cancel"})

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


def flow_definition_payload(definition: FlowDefinition) -> dict[str, Any]:
    """What ``start_flow`` sends of a flow type (:meth:`FlowDefinition.to_wire`)."""
    return definition.to_wire()


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone (rather than the server's answer)."""
    if isinstance(exc, ClientClosed | ProtocolError):
        return True
    if isinstance(exc, MatchingError):
        return False
    return isinstance(exc, OSError | trio.BrokenResourceError | trio.ClosedResourceError)


def _check_flow_id(flow_id: object, where: str) -> str:
    if type(flow_id) is not str or not flow_id:
        raise ConfigurationError(f"{where}: flow_id must be a non-empty str (got {flow_id!r})")
    return flow_id


def _check_timeout(timeout: object, where: str) -> float | None:
    if timeout is None:
        return None
    if type(timeout) not in (int, float) or not timeout > 0 or timeout == float("inf"):  # type: ignore[operator]
        raise ConfigurationError(
            f"{where}: timeout must be a finite number of seconds > 0 or None (got {timeout!r})"
        )
    return float(timeout)  # type: ignore[arg-type]


class ClientEngine:
    """A matching client on trio: one connection, dialled on the first call.

    Args:
        registry: The flow types this client may start (their Steps' retry policies and
            timeouts are sent with ``start_flow``).
        cache: Where large arguments and results are kept (see :class:`BlobCache`); None
            sends every value inline (each frame is still bounded by the server's limits).
        options: The server's address, credentials and the default call timeout.
        connect: How to dial (tests); default ``SdkConnection.open(options, "client")``.

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
        if not isinstance(registry, Registry):
            raise ConfigurationError(f"the client's registry must be a Registry (got {registry!r})")
        if cache is not None and not isinstance(cache, BlobCache):
            raise ConfigurationError(
                f"the client's cache must be a BlobCache or None (got {cache!r})"
            )
        if not isinstance(options, ClientOptions):
            raise ConfigurationError(
                f"the client's options must be a ClientOptions (got {options!r})"
            )
        self.registry = registry
        self.cache = cache
        self.options = options
        self._connect: Connect = connect or _open_sdk_connection
        self._conn: CallConnection | None = None
        self._lock = trio.Lock()
        self._closed = False
        #: flow type -> (its definition, what ``start_flow`` sends of it), built once.
        self._payloads: dict[str, tuple[FlowDefinition, dict[str, Any]]] = {}

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
            conn = await self._connection()
            try:
                return await conn.call(op, args, timeout=timeout)
            except BaseException as exc:
                if not _connection_lost(exc):
                    raise
                self._drop(conn)
                with trio.CancelScope(shield=True):
                    try:
                        await conn.aclose()
                    except Exception:
                        pass
                if self._closed:
                    raise ClientClosed("the client was closed during the call") from exc
                if retry or op not in _IDEMPOTENT:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, timeout: float | None) -> float | None:
        """The local timeout of an op that asks the server to wait ``timeout``."""
        return None if timeout is None else timeout + TIMEOUT_GRACE

    async def _upload(self, data: bytes) -> str:
        key: str = await self._call("put_blob", {"data": data}, self.options.call_timeout)
        return key

    async def _fetch(self, key: str) -> bytes:
        data: bytes = await self._call("get_blob", {"key": key}, self.options.call_timeout)
        return data

    async def _pack(self, value: Any) -> Any:
        if self.cache is None:
            return value
        return await self.cache.pack_async(value, self._upload)

    async def _unpack(self, value: Any) -> Any:
        if self.cache is None:
            return value
        return await self.cache.unpack_async(value, self._fetch)

    # -- the ops ---------------------------------------------------------------------------

    async def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> str:
        """Start a flow of type ``flow`` (a Flow class or instance, or its name) with
        ``args``; returns its flow id (``flow_id``, or one the server makes).

        Raises:
            UnknownFlowType: The registry has no such flow type (nothing is sent), or the
                server knows of none.
            FlowExists: A flow with ``flow_id`` exists already.
        """
        flow_type = self.registry.flow_type_of(flow)
        definition = self.registry.get(flow_type)
        if flow_id is not None:
            _check_flow_id(flow_id, "start_flow")
        cached = self._payloads.get(flow_type)
        if cached is None or cached[0] is not definition:
            cached = self._payloads[flow_type] = (definition, flow_definition_payload(definition))
        packed = await self._pack(list(args))
        answer = await self._call(
            "start_flow",
            {"flow_type": flow_type, "flow_id": flow_id, "args": packed, "definition": cached[1]},
            self.options.call_timeout,
        )
        if type(answer) is not str or not answer:
            raise ProtocolError(f"start_flow was answered with {answer!r}, not a flow id")
        return answer

    async def start_known_flow(self, flow_type: str, *args: Any, flow_id: str | None = None) -> str:
        """Start a flow of ``flow_type``, a type this client's registry need not have, with
        the definition the server knows for it (the ``start_known`` op): the newest one a
        connected worker advertised or a client's ``start_flow`` sent, else the one the newest
        stored flow of the type was pinned with. Returns its flow id.

        Raises:
            UnknownFlowType: The server knows no definition of ``flow_type``.
            FlowExists: A flow with ``flow_id`` exists already.
        """
        if type(flow_type) is not str or not flow_type:
            raise ConfigurationError(
                f"start_known_flow: flow_type must be a non-empty str (got {flow_type!r})"
            )
        if flow_id is not None:
            _check_flow_id(flow_id, "start_known_flow")
        packed = await self._pack(list(args))
        answer = await self._call(
            "start_known",
            {"flow_type": flow_type, "flow_id": flow_id, "args": packed},
            self.options.call_timeout,
        )
        if type(answer) is not str or not answer:
            raise ProtocolError(f"start_known was answered with {answer!r}, not a flow id")
        return answer

    async def call_rpc(
        self, flow_id: str, name: str, *args: Any, timeout: float | None = None
    ) -> Any:
        """Call the RPC ``name`` of the flow ``flow_id``; returns what its handler returned.

        Args:
            timeout: Seconds to wait in all (dispatch and handler); None: the client's
                ``call_timeout`` locally, the server's own waits there.

        Raises:
            FlowNotFound, Unavailable, NoWorkerAvailable, UnknownName, HandlerError,
            CallTimeout: as the server answers.
        """
        _check_flow_id(flow_id, "call_rpc")
        if type(name) is not str or not name:
            raise ConfigurationError(f"call_rpc: name must be a non-empty str (got {name!r})")
        wait = _check_timeout(timeout, "call_rpc")
        packed = await self._pack(list(args))
        local = self._wait(wait) if wait is not None else self.options.call_timeout
        value = await self._call(
            "call_rpc", {"flow_id": flow_id, "name": name, "args": packed, "timeout": wait}, local
        )
        return await self._unpack(value)

    async def result(self, flow_id: str, timeout: float | None = None) -> Any:
        """Wait for the flow ``flow_id`` to end; returns its last Step's return value.

        Args:
            timeout: Seconds to wait; None: the client's ``call_timeout`` (no limit if that is
                None).

        Raises:
            FlowFailed: The flow failed or was cancelled.
            FlowNotFound: No flow has that id.
            CallTimeout: It had not ended within ``timeout``.
        """
        _check_flow_id(flow_id, "result")
        wait = _check_timeout(timeout, "result")
        if wait is None:
            wait = self.options.call_timeout
        value = await self._call("result", {"flow_id": flow_id, "timeout": wait}, self._wait(wait))
        return await self._unpack(value)

    async def describe_flow(self, flow_id: str) -> FlowDescription:
        """The flow's status, state, attempts and dispatch decisions.

        Raises:
            FlowNotFound: No flow has that id.
        """
        _check_flow_id(flow_id, "describe_flow")
        data = await self._call("describe", {"flow_id": flow_id}, self.options.call_timeout)
        if not isinstance(data, Mapping):
            raise ProtocolError(f"describe was answered with {type(data).__name__}, not a dict")
        data = await self._unpack(dict(data))
        try:
            return FlowDescription.from_wire(data)
        except (KeyError, ValueError, TypeError) as exc:
            raise ProtocolError(
                f"describe was answered with a malformed description: {exc!r}"
            ) from exc

    async def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> list[FlowSummary]:
        """Flows, newest first, of ``flow_type`` and ``status`` if given, at most ``limit``."""
        name = None if flow_type is None else self.registry.flow_type_of(flow_type)
        if status is not None:
            try:
                status = FlowStatus(status)
            except ValueError:
                known = ", ".join(s.value for s in FlowStatus)
                raise ConfigurationError(
                    f"list_flows: status must be one of {known} or None (got {status!r})"
                ) from None
        if type(limit) is not int or limit < 1:
            raise ConfigurationError(f"list_flows: limit must be an int >= 1 (got {limit!r})")
        rows = await self._call(
            "list",
            {"flow_type": name, "status": None if status is None else status.value, "limit": limit},
            self.options.call_timeout,
        )
        return _rows("list", rows, FlowSummary.from_wire)

    async def cancel_flow(self, flow_id: str) -> None:
        """Cancel the flow ``flow_id``: it ends as cancelled (its ``result`` raises
        :class:`FlowFailed`). Cancelling a flow that has ended is a no-op.

        Raises:
            FlowNotFound: No flow has that id.
        """
        _check_flow_id(flow_id, "cancel_flow")
        await self._call("cancel", {"flow_id": flow_id}, self.options.call_timeout)

    async def list_queues(self) -> list[QueueSummary]:
        """The server's matching queues now (flow-type queues and app worker id queues), by
        name, each with its streams by state, its backlog and its declines."""
        rows = await self._call("queues", {}, self.options.call_timeout)
        return _rows("queues", rows, QueueSummary.from_wire)


def _rows(op: str, rows: Any, read: Callable[[Any], T]) -> list[T]:
    """An op's answer, a list of dicts, read by ``read``.

    Raises:
        ProtocolError: It is not a list, or a row is malformed.
    """
    if type(rows) is not list:
        raise ProtocolError(f"{op} was answered with {type(rows).__name__}, not a list")
    try:
        return [read(row) for row in rows]
    except (KeyError, ValueError, TypeError) as exc:
        raise ProtocolError(f"{op} was answered with a malformed row: {exc!r}") from exc
