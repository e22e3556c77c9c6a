"""The client's ops without I/O (sans-io): what each op checks, sends, and makes of the answer.
Every transport of the client (the trio engine, the blocking one) runs these same generators.

An op is a generator: it yields each step to carry out, a :class:`Call` (one M_CALL to the
server; the answer's value is sent back, an M_ERROR is raised by the transport) or a
:class:`~._blobs.LocalIO` (the blob cache's files; the result is sent back), and returns the
op's value. Argument errors raise before anything is yielded, so nothing is sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, TypeVar

from ._blobs import NEEDS_IO, BlobCache, BlobIO, LocalIO
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

__all__ = [
    "IDEMPOTENT",
    "TIMEOUT_GRACE",
    "Call",
    "ClientOps",
    "Step",
    "OPS",
    "after_loss",
    "drive",
    "drive_call_rpc",
    "share_docs",
    "connection_lost",
    "flow_definition_payload",
]

#: Seconds a call waits past the wait it asked the server for, so the server's own answer (an
#: M_ERROR ``timeout``) wins over the local timeout.
TIMEOUT_GRACE = 5.0

#: Ops that may be sent again on a fresh connection when the first one was lost under them.
IDEMPOTENT = frozenset({"result", "describe", "list", "queues", "get_blob", "put_blob", "cancel"})

T = TypeVar("T")

#: The types of value a blob reference may be in (any other holds none: nothing to unpack).
_CONTAINERS = frozenset({list, tuple, dict})


class Call:
    """A step of an op: send M_CALL ``op`` with ``args``; wait at most ``timeout`` seconds
    (None: no local limit) for its answer."""

    __slots__ = ("args", "op", "timeout")

    def __init__(self, op: str, args: dict[str, Any], timeout: float | None) -> None:
        self.op = op
        self.args = args
        self.timeout = timeout


Step = Call | LocalIO
Steps = Generator[Step, Any, T]


def flow_definition_payload(definition: FlowDefinition) -> dict[str, Any]:
    """What ``start_flow`` sends of a flow type (:meth:`FlowDefinition.to_wire`)."""
    return definition.to_wire()


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone (rather than the server's answer)."""
    if isinstance(exc, ClientClosed | ProtocolError):
        return True
    if isinstance(exc, MatchingError):
        return False
    import trio  # (the trio transport's own errors; the blocking one raises OSError)

    return isinstance(exc, OSError | trio.BrokenResourceError | trio.ClosedResourceError)


async def drive(
    steps: Steps[T],
    call: Callable[[str, dict[str, Any], float | None], Awaitable[Any]],
    local: Callable[..., Awaitable[Any]],
) -> T:
    """Carry out an op's steps on an event loop: its calls with ``call`` (op, args, timeout),
    its file I/O with ``local`` (``fn, *args``, off the loop)."""
    answer: Any = None
    try:
        while True:
            step = steps.send(answer)
            if isinstance(step, Call):
                answer = await call(step.op, step.args, step.timeout)
            else:
                answer = await local(step.fn, *step.args)
    except StopIteration as stop:
        return stop.value


async def drive_call_rpc(
    ops: ClientOps,
    call: Callable[[str, dict[str, Any], float | None], Awaitable[Any]],
    local: Callable[..., Awaitable[Any]],
    flow_id: str,
    name: str,
    args: tuple[Any, ...],
    timeout: float | None,
) -> Any:
    """``ops.call_rpc(flow_id, name, *args, timeout=timeout)`` carried out as :func:`drive`
    does, with no generator of its steps when it is one call (the usual RPC)."""
    first = ops.call_rpc_now(flow_id, name, args, timeout)
    if first is NEEDS_IO:
        return await drive(ops.call_rpc(flow_id, name, *args, timeout=timeout), call, local)
    value = await call(first.op, first.args, first.timeout)
    answer = ops.answer_now(value)
    if answer is NEEDS_IO:
        return await drive(ops.answer_steps(value), call, local)
    return answer


#: The ops every client flavour has (their docs are :class:`ClientOps`').
OPS = (
    "start_flow",
    "start_known_flow",
    "call_rpc",
    "result",
    "describe_flow",
    "list_flows",
    "cancel_flow",
    "list_queues",
)


def share_docs(flavour: type) -> None:
    """Give ``flavour``'s ops :class:`ClientOps`' docs."""
    for name in OPS:
        getattr(flavour, name).__doc__ = getattr(ClientOps, name).__doc__


def after_loss(op: str, exc: BaseException, retry: bool, closed: bool) -> None:
    """What a call whose connection was lost under it (``exc``, :func:`connection_lost`) does
    next, in every transport: returns if ``op`` may go again on a new connection (idempotent,
    not retried yet), else raises ``exc``, or :class:`ClientClosed` if the client was closed
    (``closed``)."""
    if closed:
        raise ClientClosed("the client was closed during the call") from exc
    if retry or op not in IDEMPOTENT:
        raise exc


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


def _wait(timeout: float | None) -> float | None:
    """The local timeout of an op that asks the server to wait ``timeout``."""
    return None if timeout is None else timeout + TIMEOUT_GRACE


class ClientOps:
    """The ops of a matching client, as generators of steps (see the module's docs).

    Args:
        registry: The flow types this client may start (their Steps' retry policies and
            timeouts are sent with ``start_flow``).
        cache: Where large arguments and results are kept (see :class:`BlobCache`); None
            sends every value inline (each frame is still bounded by the server's limits).
        options: The server's address, credentials and the default call timeout.
    """

    def __init__(self, registry: Registry, cache: BlobCache | None, options: ClientOptions) -> None:
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
        #: flow type -> (its definition, what ``start_flow`` sends of it), built once.
        self._payloads: dict[str, tuple[FlowDefinition, dict[str, Any]]] = {}

    # -- blobs -----------------------------------------------------------------------------

    def _blobs(self, steps: Generator[BlobIO, Any, Any], op: str) -> Steps[Any]:
        """The cache's steps, its server steps as ``op`` calls (``put_blob``/``get_blob``)."""
        answer: Any = None
        arg = "data" if op == "put_blob" else "key"
        try:
            while True:
                step = steps.send(answer)
                if isinstance(step, LocalIO):
                    answer = yield step
                else:
                    answer = yield Call(op, {arg: step.arg}, self.options.call_timeout)
        except StopIteration as stop:
            return stop.value

    def _pack(self, value: Any) -> Steps[Any]:
        cache = self.cache
        if cache is None:
            return value
        copy = cache.pack_now(value)
        if copy is not NEEDS_IO:  # (the usual case)
            return copy
        return (yield from self._blobs(cache.pack_steps(value), "put_blob"))

    def answer_steps(self, value: Any) -> Steps[Any]:
        """An answer's ``value`` with the blobs it refers to in place, read or fetched."""
        cache = self.cache
        if cache is None:
            return value
        copy = cache.unpack_now(value)
        if copy is not NEEDS_IO:
            return copy
        return (yield from self._blobs(cache.unpack_steps(value), "get_blob"))

    # -- the ops ---------------------------------------------------------------------------

    def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> Steps[str]:
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
        packed = yield from self._pack(list(args))
        answer = yield Call(
            "start_flow",
            {"flow_type": flow_type, "flow_id": flow_id, "args": packed, "definition": cached[1]},
            self.options.call_timeout,
        )
        return _flow_id("start_flow", answer)

    def start_known_flow(
        self, flow_type: str, *args: Any, flow_id: str | None = None
    ) -> Steps[str]:
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
        packed = yield from self._pack(list(args))
        answer = yield Call(
            "start_known",
            {"flow_type": flow_type, "flow_id": flow_id, "args": packed},
            self.options.call_timeout,
        )
        return _flow_id("start_known", answer)

    def call_rpc(
        self, flow_id: str, name: str, *args: Any, timeout: float | None = None
    ) -> Steps[Any]:
        """Call the RPC ``name`` of the flow ``flow_id``; returns what its handler returned.

        Args:
            timeout: Seconds to wait in all (dispatch and handler); None: the client's
                ``call_timeout`` locally, the server's own waits there.

        Raises:
            FlowNotFound, Unavailable, NoWorkerAvailable, UnknownName, HandlerError,
            CallTimeout: as the server answers.
        """
        call = self.call_rpc_now(flow_id, name, args, timeout)
        if call is NEEDS_IO:
            packed = yield from self._pack(list(args))
            call = self._rpc_call(flow_id, name, packed, _check_timeout(timeout, "call_rpc"))
        value = yield call
        answer = self.answer_now(value)
        return (yield from self.answer_steps(value)) if answer is NEEDS_IO else answer

    def call_rpc_now(
        self, flow_id: str, name: str, args: tuple[Any, ...], timeout: float | None
    ) -> Any:
        """:meth:`call_rpc`'s checks and its :class:`Call`, or :data:`NEEDS_IO` if its
        arguments carry bytes to store first (its steps do). With :meth:`answer_now`, the
        usual RPC with no generator of its steps (a transport may run it so)."""
        _check_flow_id(flow_id, "call_rpc")
        if type(name) is not str or not name:
            raise ConfigurationError(f"call_rpc: name must be a non-empty str (got {name!r})")
        wait = _check_timeout(timeout, "call_rpc")
        packed: Any = list(args)
        if packed and self.cache is not None:  # (no arguments: nothing to look for)
            packed = self.cache.pack_now(packed)
            if packed is NEEDS_IO:
                return NEEDS_IO
        return self._rpc_call(flow_id, name, packed, wait)

    def _rpc_call(self, flow_id: str, name: str, packed: list[Any], wait: float | None) -> Call:
        local = _wait(wait) if wait is not None else self.options.call_timeout
        args = {"flow_id": flow_id, "name": name, "args": packed, "timeout": wait}
        return Call("call_rpc", args, local)

    def answer_now(self, value: Any) -> Any:
        """An answer's ``value`` with the blobs it refers to in place, or :data:`NEEDS_IO` if
        any (:meth:`answer_steps` fetches them). A value that is no container refers to none."""
        cache = self.cache
        if cache is None or type(value) not in _CONTAINERS:
            return value
        return cache.unpack_now(value)

    def result(self, flow_id: str, timeout: float | None = None) -> Steps[Any]:
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
        value = yield Call("result", {"flow_id": flow_id, "timeout": wait}, _wait(wait))
        answer = self.answer_now(value)
        return (yield from self.answer_steps(value)) if answer is NEEDS_IO else answer

    def describe_flow(self, flow_id: str) -> Steps[FlowDescription]:
        """The flow's status, state, attempts and dispatch decisions.

        Raises:
            FlowNotFound: No flow has that id.
        """
        _check_flow_id(flow_id, "describe_flow")
        data = yield Call("describe", {"flow_id": flow_id}, self.options.call_timeout)
        if not isinstance(data, Mapping):
            raise ProtocolError(f"describe was answered with {type(data).__name__}, not a dict")
        data = yield from self.answer_steps(dict(data))
        try:
            return FlowDescription.from_wire(data)
        except (KeyError, ValueError, TypeError) as exc:
            raise ProtocolError(
                f"describe was answered with a malformed description: {exc!r}"
            ) from exc

    def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> Steps[list[FlowSummary]]:
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
        rows = yield Call(
            "list",
            {"flow_type": name, "status": None if status is None else status.value, "limit": limit},
            self.options.call_timeout,
        )
        return _rows("list", rows, FlowSummary.from_wire)

    def cancel_flow(self, flow_id: str) -> Steps[None]:
        """Cancel the flow ``flow_id``: it ends as cancelled (its ``result`` raises
        :class:`FlowFailed`). Cancelling a flow that has ended is a no-op.

        Raises:
            FlowNotFound: No flow has that id.
        """
        _check_flow_id(flow_id, "cancel_flow")
        yield Call("cancel", {"flow_id": flow_id}, self.options.call_timeout)

    def list_queues(self) -> Steps[list[QueueSummary]]:
        """The server's matching queues now (flow-type queues and app worker id queues), by
        name, each with its streams by state, its backlog and its declines."""
        rows = yield Call("queues", {}, self.options.call_timeout)
        return _rows("queues", rows, QueueSummary.from_wire)


def _flow_id(op: str, answer: Any) -> str:
    if type(answer) is not str or not answer:
        raise ProtocolError(f"{op} was answered with {answer!r}, not a flow id")
    return answer


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
