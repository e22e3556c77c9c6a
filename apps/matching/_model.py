"""Flows, Steps and RPCs as a program defines them, and the registry a worker serves.

A :class:`Flow` subclass is a flow type (its ``name`` unique per server) whose Steps run in
declaration order, each with a :class:`RetryPolicy`, and whose ``@rpc`` methods read and update
a flow's durable state for their callers (the seed's Greeting flow: a Step writes a greeting
into the state, an RPC reads it). A Step is one of three kinds: ``@step`` (Execute: its handler
runs once per attempt), ``@wait_for`` (WaitFor: its handler checks a condition on the state,
run again after each change of the state until it answers a value instead of
:data:`NOT_YET`), or :func:`subflow` (a child flow the server starts and waits for, holding no
worker slot while it runs). State changes travel as patches
(:func:`state_patch`), so a Step and an RPC that touch different keys never undo each other.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import attrs

from ._errors import ConfigurationError, UnknownFlowType
from ._flow_views import FlowDescription, FlowStatus, FlowSummary, QueueSummary
from ._state_patches import apply_patch, state_patch

__all__ = [
    "Flow",
    "FlowDefinition",
    "FlowDescription",
    "FlowStatus",
    "FlowSummary",
    "NOT_YET",
    "QueueSummary",
    "Registry",
    "RetryPolicy",
    "RpcContext",
    "RpcDefinition",
    "StepContext",
    "StepDefinition",
    "apply_patch",
    "rpc",
    "state_patch",
    "step",
    "subflow",
    "wait_for",
]

#: Longest flow type, step or RPC name (the server's ``max_flow_type_length`` default).
MAX_NAME_LENGTH = 256
#: Most error types one :class:`RetryPolicy` may name as not retryable.
MAX_NON_RETRYABLE = 64
#: The Step kinds: ``execute`` (``@step``), ``wait_for`` (``@wait_for``), ``subflow``.
STEP_KINDS = ("execute", "wait_for", "subflow")


class _NotYet:
    """The type of :data:`NOT_YET` (one instance)."""

    _instance: ClassVar[_NotYet | None] = None

    def __new__(cls) -> _NotYet:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_YET"

    def __reduce__(self) -> str:
        return "NOT_YET"


#: What a ``@wait_for`` handler returns while its condition does not hold: the server asks
#: again after the flow's state changes (an RPC's patch), until the Step's timeout.
NOT_YET = _NotYet()


def _positive(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not value > 0 or value != value:
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be a number > 0 (got {value!r})"
        )


def _non_negative(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not value >= 0:
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be a number >= 0 (got {value!r})"
        )


def _attempts(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ConfigurationError(
            f"RetryPolicy.max_attempts must be an int >= 1 (got {value!r}); 1 means no retry"
        )


def _error_types(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple | frozenset | set):
        raise ConfigurationError(
            "RetryPolicy.non_retryable_errors must be a list of error type names, such as"
            f" ['ValueError'] (got {value!r})"
        )
    names = tuple(value)
    if len(names) > MAX_NON_RETRYABLE or not all(
        type(n) is str and 0 < len(n) <= MAX_NAME_LENGTH for n in names
    ):
        raise ConfigurationError(
            f"RetryPolicy.non_retryable_errors must hold at most {MAX_NON_RETRYABLE} non-empty"
            f" strs of at most {MAX_NAME_LENGTH} characters (got {value!r})"
        )
    return names


def _coefficient(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not value >= 1:
        raise ConfigurationError(
            f"RetryPolicy.backoff_coefficient must be a number >= 1 (got {value!r})"
        )


@attrs.frozen
class RetryPolicy:
    """How a Step is retried: ``max_attempts`` in all, waiting ``initial_backoff`` seconds
    before the second, multiplied by ``backoff_coefficient`` each time, at most
    ``max_backoff``. Declines and re-routes never consume an attempt; a failed attempt, a
    dispatch that found no worker (``unavailable``, ``no_worker_available``), a worker lost
    after its first output, an attempt past the Step's timeout and a failed child flow do.

    A failure is not retried (the flow fails at once) when the handler raised a
    :class:`MatchingError` with ``retryable=False``, or an exception whose type name is in
    ``non_retryable_errors`` (e.g. ``["ValueError"]``; for a SubFlow step, the child's error
    type), or when the child flow was cancelled."""

    max_attempts: int = attrs.field(default=3, validator=_attempts)
    initial_backoff: float = attrs.field(default=1.0, validator=_non_negative)
    backoff_coefficient: float = attrs.field(default=2.0, validator=_coefficient)
    max_backoff: float = attrs.field(default=60.0, validator=_non_negative)
    non_retryable_errors: tuple[str, ...] = attrs.field(default=(), converter=_error_types)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        delay = self.initial_backoff * self.backoff_coefficient ** (attempt - 1)
        return float(min(delay, self.max_backoff))


def _check_timeout(kind: str, value: Any) -> None:
    if value is not None and (type(value) not in (int, float) or not value > 0):
        raise ConfigurationError(
            f"@{kind}(timeout=...) must be a number of seconds > 0 or None (got {value!r})"
        )


def _check_name(kind: str, name: Any) -> str:
    if type(name) is not str or not name or len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"a {kind} name must be a non-empty str of at most {MAX_NAME_LENGTH} characters"
            f" (got {name!r})"
        )
    return name


@attrs.frozen
class StepDefinition:
    """One Step of a flow type: its position, handler, retry policy and timeout, and its kind
    (``execute``, ``wait_for``, or ``subflow`` with the ``child`` flow it starts and no
    handler)."""

    name: str
    index: int
    handler: Callable[..., Any] = attrs.field(eq=False)
    retry: RetryPolicy = RetryPolicy()
    #: Seconds one attempt may run (its method deadline); None for no limit. For a WaitFor,
    #: how long its condition may take to hold; for a SubFlow, how long the child may run.
    timeout: float | None = None
    kind: str = "execute"
    #: A SubFlow's child flow type, and the Flow it is (None when given by name only).
    child_type: str | None = None
    child: Flow | None = attrs.field(default=None, eq=False)

    @functools.cached_property
    def is_async(self) -> bool:
        # (cached: a worker asks for every call it runs, and inspect's check is slow)
        return inspect.iscoroutinefunction(self.handler)


@attrs.frozen
class RpcDefinition:
    """One RPC of a flow type."""

    name: str
    handler: Callable[..., Any] = attrs.field(eq=False)
    timeout: float | None = None

    @functools.cached_property
    def is_async(self) -> bool:
        # (cached: a worker asks for every call it runs, and inspect's check is slow)
        return inspect.iscoroutinefunction(self.handler)


_MARK = "__matching_handler__"


def step(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> Any:
    """Mark a method of a :class:`Flow` as a Step (``@step`` or ``@step(retry=...)``).

    The method is called as ``method(ctx, *args)`` with a :class:`StepContext`: an Execute
    Step, run once per attempt.
    """
    return _step_mark("step", "execute", fn, name, retry, timeout)


def wait_for(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> Any:
    """Mark a method of a :class:`Flow` as a WaitFor Step (``@wait_for(timeout=60)``).

    The method is called as ``method(ctx, *args)`` with a :class:`StepContext`, like a
    ``@step``, and returns the Step's value once the flow's state says so, or :data:`NOT_YET`.
    The server runs it when the Step starts and again after every committed change of the
    flow's state (an RPC's patch) until it answers a value; each run takes a worker's Step
    slot (reserved RPC slots decline it like any Step) only while it runs. Past ``timeout``
    the attempt fails (``timeout``) and ``retry`` applies. State changes of a run that
    answered :data:`NOT_YET` are dropped.
    """
    return _step_mark("wait_for", "wait_for", fn, name, retry, timeout)


def _step_mark(
    decorator: str,
    kind: str,
    fn: Callable[..., Any] | None,
    name: str | None,
    retry: RetryPolicy | None,
    timeout: float | None,
) -> Any:
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"{decorator} retry must be a RetryPolicy (got {retry!r})")
    _check_timeout(decorator, timeout)

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _MARK, (kind, name or f.__name__, retry or RetryPolicy(), timeout, None))
        return f

    return mark(fn) if fn is not None else mark


def _runs_on_the_server(ctx: Any, *args: Any) -> Any:
    """The handler of a SubFlow step: none runs on a worker (the server starts the child)."""
    raise ConfigurationError(
        f"SubFlow step {getattr(ctx, 'step', '?')!r} runs on the server, not on a worker"
    )


@attrs.frozen
class _SubFlowMark:
    """What :func:`subflow` puts in a Flow class's body."""

    mark: tuple[str, str | None, RetryPolicy, float | None, Flow | type[Flow] | str]


def subflow(
    flow: Flow | type[Flow] | str,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> Any:
    """A SubFlow Step, as a class attribute of a :class:`Flow` (``charge = subflow(Payment)``;
    its name defaults to the attribute's). ``flow`` is the child's Flow class (or instance),
    or its flow type's name (for a flow that starts itself, whose class is not defined yet in
    its own body): the server then takes the definition it knows for that type.

    The server starts a child flow of ``flow``'s type with the Step's input as its args (the
    parent's args for a first Step, else the previous Step's value), waits for it without
    holding a worker slot, and takes the child's result as the Step's value. The child's id is
    derived from the parent Step's execution id and attempt, so a redelivery never starts two.
    The child failing fails the attempt (``retry`` applies, a retry starts a new child; the
    child's error type counts for ``non_retryable_errors``); the child cancelled alone fails it
    for good (``cancelled``); cancelling the parent, or its attempt ending otherwise (its
    ``timeout``), cancels the child.
    """
    if isinstance(flow, str):
        _check_name("flow type", flow)
    elif not (isinstance(flow, Flow) or (isinstance(flow, type) and issubclass(flow, Flow))):
        raise ConfigurationError(
            f"subflow() takes the child's Flow subclass or instance, or its flow type's name"
            f" (got {flow!r})"
        )
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"subflow retry must be a RetryPolicy (got {retry!r})")
    _check_timeout("subflow", timeout)
    return _SubFlowMark(("subflow", name, retry or RetryPolicy(), timeout, flow))


def rpc(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Mark a method of a :class:`Flow` as an RPC (``@rpc`` or ``@rpc(name=...)``).

    The method is called as ``method(ctx, *args)`` with an :class:`RpcContext`.
    """
    _check_timeout("rpc", timeout)

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _MARK, ("rpc", name or f.__name__, None, timeout, None))
        return f

    return mark(fn) if fn is not None else mark


@attrs.frozen
class FlowDefinition:
    """A flow type as a worker serves it: its Steps in order and its RPCs by name."""

    name: str
    steps: tuple[StepDefinition, ...]
    rpcs: Mapping[str, RpcDefinition] = attrs.field(eq=False)

    def step(self, name: str) -> StepDefinition | None:
        for definition in self.steps:
            if definition.name == name:
                return definition
        return None

    def capabilities(self) -> dict[str, list[str]]:
        """What a worker advertises at registration: ``{"steps": [...], "rpcs": [...]}`` (the
        Steps a worker runs: SubFlow steps run on the server)."""
        steps = [s.name for s in self.steps if s.kind != "subflow"]
        return {"steps": steps, "rpcs": list(self.rpcs)}

    def to_wire(self, _outer: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The definition the server pins for a flow of this type (``start_flow``'s
        ``definition``, and a worker's ``define_flows``): its Steps in order with their kind,
        retry policies and timeouts, and its RPC names. A SubFlow step names its child's
        ``flow_type`` and carries the child's ``definition`` (left out for a flow type that
        encloses it, a recursive flow: the server then takes the one it knows)."""
        outer = _outer | {self.name}
        steps: list[dict[str, Any]] = []
        for s in self.steps:
            entry: dict[str, Any] = {
                "name": s.name,
                "kind": s.kind,
                "max_attempts": s.retry.max_attempts,
                "initial_backoff": float(s.retry.initial_backoff),
                "backoff_coefficient": float(s.retry.backoff_coefficient),
                "max_backoff": float(s.retry.max_backoff),
                "non_retryable_errors": list(s.retry.non_retryable_errors),
                "timeout": None if s.timeout is None else float(s.timeout),
            }
            if s.child_type is not None:
                entry["flow_type"] = s.child_type
            if s.child is not None and s.child.name not in outer:
                entry["definition"] = s.child.definition().to_wire(outer)
            steps.append(entry)
        return {"steps": steps, "rpcs": list(self.rpcs)}


class Flow:
    """Base class of flow types. ``name`` (a class attribute) is the flow type's name,
    unique per server; it defaults to the class name.

    Example::

        class GreetingFlow(Flow):
            name = "Greeting"

            @step(retry=RetryPolicy(max_attempts=5))
            async def greet(self, ctx, who):
                ctx.state["greeting"] = f"Hello, {who}!"
                return ctx.state["greeting"]

            @rpc
            async def greeting(self, ctx):
                return ctx.state.get("greeting")

    An instance's attributes are in-memory state of one worker process: sticky routing makes
    it likely, never certain, that the same worker serves a flow again.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__
        _check_name("flow type", cls.name)

    def definition(self) -> FlowDefinition:
        """This flow type's Steps (bound to this instance) and RPCs."""
        # attribute -> mark, in the order the attributes were first defined; an override in a
        # subclass keeps its base's position (dict assignment keeps the original slot).
        marks: dict[str, tuple[str, str | None, RetryPolicy | None, float | None, Any]] = {}
        for klass in reversed(type(self).__mro__):
            for attr, value in vars(klass).items():
                mark: Any
                if isinstance(value, _SubFlowMark):
                    mark = value.mark
                else:
                    mark = getattr(value, _MARK, None)
                if mark is not None:
                    marks[attr] = mark
                elif attr in marks:
                    del marks[attr]  # overridden by something that is no handler
        steps: list[StepDefinition] = []
        rpcs: dict[str, RpcDefinition] = {}
        for attr, (kind, name, retry, timeout, child) in marks.items():
            name = _check_name("rpc" if kind == "rpc" else "step", name or attr)
            if kind == "rpc":
                rpcs[name] = RpcDefinition(name, getattr(self, attr), timeout)
                continue
            handler = _runs_on_the_server if kind == "subflow" else getattr(self, attr)
            child_type = None
            if isinstance(child, str):
                child_type, child = child, None
            elif child is not None:
                if isinstance(child, type):
                    child = child()
                child_type = child.name
            retry = retry or RetryPolicy()
            steps.append(
                StepDefinition(name, len(steps), handler, retry, timeout, kind, child_type, child)
            )
        names = [s.name for s in steps]
        for name in names:
            if names.count(name) > 1:
                raise ConfigurationError(
                    f"flow type {self.name!r} has two steps named {name!r}; step names must be"
                    " unique within a flow type"
                )
        return FlowDefinition(self.name, tuple(steps), rpcs)


class Registry:
    """The flow types a worker serves (and a client may start), by name.

    Args:
        flows: :class:`Flow` instances (or classes, instantiated with no arguments).
        allow_async_handlers: Accept ``async def`` Steps and RPCs (run on the adapter's event
            loop: asyncio for :class:`AsyncWorker`, trio for :class:`TrioWorker`). Without it an
            async handler is refused here, since a blocking worker could only run it on a loop
            of its own.

    Raises:
        ConfigurationError: Two flows share a name, a handler is async without
            ``allow_async_handlers``, or a name is invalid.
    """

    def __init__(self, flows: Iterable[Flow | type[Flow]], *, allow_async_handlers: bool = False):
        self.allow_async_handlers = bool(allow_async_handlers)
        self._flows: dict[str, FlowDefinition] = {}
        self._instances: dict[str, Flow] = {}
        for flow in flows:
            if isinstance(flow, type) and issubclass(flow, Flow):
                flow = flow()
            if not isinstance(flow, Flow):
                raise ConfigurationError(
                    f"Registry takes Flow instances or Flow subclasses (got {flow!r})"
                )
            if flow.name in self._flows:
                raise ConfigurationError(
                    f"two flows are named {flow.name!r}; flow type names must be unique"
                )
            definition = flow.definition()
            if not allow_async_handlers:
                handlers: list[StepDefinition | RpcDefinition] = [
                    *definition.steps,
                    *definition.rpcs.values(),
                ]
                for handler in handlers:
                    if handler.is_async:
                        raise ConfigurationError(
                            f"{flow.name}.{handler.name} is async; pass"
                            " allow_async_handlers=True to Registry to run async handlers"
                        )
            self._flows[flow.name] = definition
            self._instances[flow.name] = flow

    @property
    def flow_types(self) -> tuple[str, ...]:
        return tuple(self._flows)

    def get(self, flow_type: str) -> FlowDefinition:
        """The definition of ``flow_type``.

        Raises:
            UnknownFlowType: The registry has no such flow type.
        """
        try:
            return self._flows[flow_type]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._flows)) or "none"
            raise UnknownFlowType(
                f"flow type {flow_type!r} is not in this registry (it has: {known})"
            ) from None

    def flow_type_of(self, flow: Flow | type[Flow] | str) -> str:
        """The name of a flow type given as a name, a Flow class or instance."""
        if isinstance(flow, str):
            return flow
        if isinstance(flow, Flow) or (isinstance(flow, type) and issubclass(flow, Flow)):
            return flow.name
        raise ConfigurationError(
            f"a flow type is a name, a Flow subclass or a Flow instance (got {flow!r})"
        )

    def capabilities(self) -> dict[str, dict[str, list[str]]]:
        """``{flow_type: {"steps": [...], "rpcs": [...]}}``, as advertised at registration."""
        return {name: d.capabilities() for name, d in self._flows.items()}

    def definitions(self) -> dict[str, dict[str, Any]]:
        """``{flow_type: FlowDefinition.to_wire()}``: what a worker tells the server of its
        flow types after it connects (the ``define_flows`` op), so that a client without
        them (``python -m apps.matching start``) can start flows of them."""
        return {name: d.to_wire() for name, d in self._flows.items()}

    def __contains__(self, flow_type: object) -> bool:
        return flow_type in self._flows

    def __len__(self) -> int:
        return len(self._flows)


@attrs.define
class StepContext:
    """What a Step handler gets: which execution this is, and the flow's state.

    Attributes:
        flow_id: The flow.
        flow_type: Its type.
        step: The Step's name.
        execution_id: Stable across the attempts of this step execution: with ``flow_id``, an
            idempotency key for external side effects (delivery is at least once).
        attempt: 1 for the first attempt.
        state: The flow's state; changes are applied when the Step succeeds.
        deadline_in: Seconds left to this attempt's method deadline when it started, or None.
        blobs: The worker's :class:`BlobCache`.
    """

    flow_id: str
    flow_type: str
    step: str
    execution_id: str
    attempt: int
    state: dict[str, Any]
    deadline_in: float | None = None
    blobs: Any = None
    _emit: Callable[[Any], None] | None = attrs.field(default=None, repr=False, alias="emit")

    def output(self, value: Any = None) -> None:
        """Report progress to the server (an OUTPUT frame). After the first output a worker
        that goes away fails this attempt instead of having it re-dispatched."""
        if self._emit is not None:
            self._emit(value)


@attrs.define
class RpcContext:
    """What an RPC handler gets: the flow and its state (changes applied when it returns)."""

    flow_id: str
    flow_type: str
    rpc: str
    state: dict[str, Any]
    blobs: Any = None
