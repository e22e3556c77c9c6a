"""The values the matching server's actors exchange: tasks, dispatches, their outcomes, the
messages between streams and queues, what a worker advertises, and the matching limits.

They mirror the seed's "Pull Worker 分发" (dispatch waits, sticky routing, declines) and its
``matching.*`` limits; ``ARCHITECTURE.md`` ("Messages between the server's actors") is the map.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

import otp

__all__ = [
    "Accepted",
    "CancelCall",
    "Capabilities",
    "Completed",
    "Declined",
    "Dispatch",
    "ErrorInfo",
    "Failed",
    "Forwarded",
    "Lost",
    "MatchingLimits",
    "NotDispatched",
    "Offer",
    "Routed",
    "StreamGone",
    "StreamIdle",
    "StreamRejection",
    "Task",
    "WorkerDraining",
    "WorkerFreed",
]

#: The kinds of task: a step of a flow, or an RPC on it.
KINDS = ("step", "rpc")
#: The reasons a worker may give in a DECLINE.
DECLINE_REASONS = ("no_capacity", "unknown_name", "draining")
#: ``NotDispatched.reason`` values.
NOT_DISPATCHED_REASONS = ("unavailable", "no_worker_available", "unknown_name")
#: ``Routed.reason`` values (one per routing decision, for ``describe_flow``).
ROUTED_REASONS = (
    "sticky",
    "flow_queue",
    "fallback_no_stream",
    "fallback_timeout",
    "reroute_unknown_name",
    "declined_no_capacity",
    "redispatch_lost",
    "delivered",
    "forwarded",
)


def _one_of(*allowed: str) -> Any:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise ValueError(
                f"{type(inst).__name__}.{attribute.name} must be one of {', '.join(allowed)}"
                f" (got {value!r})"
            )

    return check


def _names(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


# -- the task and its dispatch --------------------------------------------------------------


@attrs.frozen(eq=False)
class Task:
    """One attempt of a step, or one RPC call, as a worker gets it (``M_TASK``).

    Attributes:
        delivery: Unique per server run; the wire's ``delivery``.
        kind: ``"step"`` or ``"rpc"``.
        flow_type, flow_id, name, execution_id, attempt, args, state: As in ``M_TASK``.
        deadline: The attempt's method deadline on trio's clock (absolute), or None. No
            dispatch waits past it.
        step_kind: A step's kind (``"execute"``, ``"wait_for"``), None for an RPC: both
            kinds are Step tasks for routing and capacity.
    """

    delivery: int
    kind: str = attrs.field(validator=_one_of(*KINDS))
    flow_type: str
    flow_id: str
    name: str
    execution_id: str
    attempt: int
    args: list[Any] = attrs.field(factory=list)
    state: dict[str, Any] = attrs.field(factory=dict)
    deadline: float | None = None
    step_kind: str | None = None


@attrs.frozen(eq=False)
class Dispatch:
    """A task on its way to a worker.

    Attributes:
        task: The task.
        reply_to: Gets the outcomes (``Routed``, ``Completed``, ``Failed``, ``NotDispatched``,
            ``Lost``).
        sticky_worker: The app worker id that last served the flow, or None.
        wait: The dispatch wait left, in seconds.
        excluded: App worker ids that declined it with ``unknown_name`` (it is never offered to
            them again).
        declined_no_capacity: Some worker declined it for capacity on its way so far (so that
            running out of wait means ``no_worker_available``).
        drained: App worker ids that are draining (it is not offered to them either, but
            their lacking nothing makes no ``unknown_name``).
        hops: How many matchers of other servers it was forwarded to (bounded by
            ``_matcher_remote.MAX_HOPS``, so it never circles between servers).
    """

    task: Task
    reply_to: otp.Pid
    sticky_worker: str | None = None
    wait: float = 10.0
    excluded: frozenset[str] = attrs.field(default=frozenset(), converter=_names)
    declined_no_capacity: bool = False
    drained: frozenset[str] = attrs.field(default=frozenset(), converter=_names)
    hops: int = 0


@attrs.frozen(eq=False)
class Forwarded:
    """matcher -> another server's matcher: route this dispatch there (its fields, as they
    cross nodes: the task without its deadline, which is on this node's trio clock, and
    ``deadline_left`` in seconds instead; sets as lists)."""

    task: Task
    reply_to: otp.Pid
    sticky_worker: str | None
    wait: float
    excluded: list[str]
    declined_no_capacity: bool
    drained: list[str]
    hops: int
    deadline_left: float | None

    @classmethod
    def of(cls, dispatch: Dispatch, now: float) -> Forwarded:
        task = dispatch.task
        deadline = task.deadline
        return cls(
            attrs.evolve(task, deadline=None) if deadline is not None else task,
            dispatch.reply_to,
            dispatch.sticky_worker,
            dispatch.wait,
            sorted(dispatch.excluded),
            dispatch.declined_no_capacity,
            sorted(dispatch.drained),
            dispatch.hops + 1,
            None if deadline is None else deadline - now,
        )

    def dispatch(self, now: float) -> Dispatch:
        """The dispatch on this node (its deadline on this node's clock)."""
        task = self.task
        if self.deadline_left is not None:
            task = attrs.evolve(task, deadline=now + self.deadline_left)
        return Dispatch(
            task,
            self.reply_to,
            self.sticky_worker,
            self.wait,
            self.excluded,
            self.declined_no_capacity,
            self.drained,
            self.hops,
        )


# -- outcomes, sent to Dispatch.reply_to ----------------------------------------------------


@attrs.frozen
class ErrorInfo:
    """A handler's error as the worker reported it (``M_FAILURE``)."""

    type: str
    message: str
    retryable: bool


@attrs.frozen
class Routed:
    """One routing decision: the dispatch went to ``queue`` (``"flow:<type>"`` or
    ``"worker:<id>"``) for ``reason`` (one of ``ROUTED_REASONS``); a ``"delivered"`` one names
    the ``stream`` process that owns the call now (where a ``CancelCall`` goes)."""

    delivery: int
    queue: str
    reason: str
    worker_id: str | None = None
    stream: otp.Pid | None = None


@attrs.frozen
class CancelCall:
    """To the stream process that owns ``delivery``: the engine no longer wants its outcome
    (its flow was cancelled); tell the worker (``M_CANCEL``)."""

    delivery: int


@attrs.frozen(eq=False)
class Completed:
    """The worker returned ``value`` and the state ``patch``; ``not_yet``: a WaitFor check
    answered "not yet" (``value`` and ``patch`` mean nothing then). ``delivered``: the
    ``Routed(..., "delivered", ...)`` of this call, when the stream read the worker's ACCEPT
    and this outcome at once (it takes effect first; one message instead of two)."""

    delivery: int
    worker_id: str
    value: Any
    patch: dict[str, Any]
    not_yet: bool = False
    delivered: Routed | None = None


@attrs.frozen
class Failed:
    """The handler raised: ``error`` says what. ``delivered`` as ``Completed``'s."""

    delivery: int
    worker_id: str
    error: ErrorInfo
    delivered: Routed | None = None


@attrs.frozen
class NotDispatched:
    """No worker took the task within its dispatch wait.

    ``reason``: ``"unavailable"`` (no able worker connected), ``"no_worker_available"`` (workers
    declined for capacity), ``"unknown_name"`` (no worker has the step or RPC). ``message``
    names the flow type, the step or RPC, and what to do.
    """

    delivery: int
    reason: str = attrs.field(validator=_one_of(*NOT_DISPATCHED_REASONS))
    message: str


@attrs.frozen
class Lost:
    """The worker went away with the call. Before any output (``after_output`` False) the
    engine re-dispatches it without consuming an attempt."""

    delivery: int
    worker_id: str
    after_output: bool


# -- stream <-> queue, connection -> queues --------------------------------------------------


@attrs.frozen(eq=False)
class StreamIdle:
    """The stream is registered, or finished its call, and can take one. ``handle``: what the
    queue hands its ``Offer`` to (``_stream.StreamHandle.deliver``: the offer is taken in the
    queue's own task when the stream's mailbox holds nothing before it), or None to send it.
    ``accepted``: the delivery whose ``Accepted`` this stands for too (the worker's ACCEPT and
    the call's outcome were read at once: one message instead of two), else None."""

    stream: Any
    worker_id: str
    caps: Capabilities
    handle: Any = attrs.field(default=None, eq=False)
    accepted: int | None = None


@attrs.frozen
class StreamGone:
    """The stream is closed; a dispatch offered to it goes to another."""

    stream: Any


@attrs.frozen
class Accepted:
    """The worker accepted the offered dispatch; the stream owns the call now."""

    stream: Any
    delivery: int


@attrs.frozen
class Declined:
    """The worker declined the offered dispatch (``reason`` one of ``DECLINE_REASONS``)."""

    stream: Any
    delivery: int
    reason: str


@attrs.frozen
class WorkerFreed:
    """A call of that worker ended: its declines for capacity no longer stand."""

    worker_id: str


@attrs.frozen
class WorkerDraining:
    """The worker takes no new tasks and no sticky routing."""

    worker_id: str


@attrs.frozen(eq=False)
class Offer:
    """queue -> stream: write this dispatch's TASK and tell me the answer. ``queue`` names the
    offering queue (for the ``Routed(..., "delivered", ...)`` the stream sends on ACCEPT,
    ahead of the call's outcome)."""

    dispatch: Dispatch
    queue: str = ""


@attrs.frozen
class StreamRejection:
    """Why a stream's registration was refused (``M_REJECTED``): ``code`` is a wire error code,
    ``message`` names the limit or the conflict, ``permanent`` whether retrying can help."""

    code: str
    message: str
    permanent: bool


# What crosses between the servers of a cluster (a dispatch forwarded to another server's
# matcher, the outcomes its queues and streams send the origin engine, the engine's
# ``CancelCall`` to a stream there), under names that do not move with the modules.
_CROSSING = (Task, Forwarded, ErrorInfo, Routed, CancelCall, Completed, Failed, NotDispatched, Lost)
for _cls in _CROSSING:
    otp.remote_value(_cls, name=f"matching.{_cls.__name__}")


# -- what a worker advertises ---------------------------------------------------------------


def _to_flows(value: Any) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    if not isinstance(value, Mapping):
        raise TypeError(
            "Capabilities.flows must be a mapping flow_type -> (steps, rpcs)"
            f" (got {type(value).__name__})"
        )
    flows: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for flow_type, entry in value.items():
        if not isinstance(flow_type, str):
            raise TypeError(f"Capabilities.flows keys must be str flow types (got {flow_type!r})")
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            raise TypeError(
                f"Capabilities.flows[{flow_type!r}] must be (steps, rpcs), two sets of names"
                f" (got {entry!r})"
            )
        flows[flow_type] = (frozenset(entry[0]), frozenset(entry[1]))
    return flows


@attrs.frozen
class Capabilities:
    """The flow types a worker registered, with their step and RPC names (``M_HELLO.flows``).

    Attributes:
        flows: ``flow_type -> (steps, rpcs)``, two frozensets of names.
    """

    flows: Mapping[str, tuple[frozenset[str], frozenset[str]]] = attrs.field(
        factory=dict, converter=_to_flows
    )

    @classmethod
    def from_wire(cls, flows: Mapping[str, Mapping[str, Any]]) -> Capabilities:
        """From ``M_HELLO.flows``: ``{flow_type: {"steps": [...], "rpcs": [...]}}``."""
        return cls(
            {
                flow_type: (entry.get("steps", ()), entry.get("rpcs", ()))
                for flow_type, entry in flows.items()
            }
        )

    def can(self, flow_type: str, kind: str, name: str) -> bool | None:
        """Whether the worker has the step (``kind="step"``) or RPC ``name`` of ``flow_type``;
        None if it did not advertise that flow type at all."""
        entry = self.flows.get(flow_type)
        if entry is None:
            return None
        return name in (entry[0] if kind == "step" else entry[1])

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.flows.items(), key=lambda item: item[0])))


# -- limits ---------------------------------------------------------------------------------


def _positive_int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(
            f"MatchingLimits.{attribute.name} must be an int >= 1 (got {value!r}); set"
            f" matching.{attribute.name} to a positive whole number"
        )


def _positive_seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"MatchingLimits.{attribute.name} must be a number of seconds > 0 (got {value!r});"
            f" set matching.{attribute.name} to a positive number"
        )


@attrs.frozen
class MatchingLimits:
    """The matching server's limits and waits (the seed's ``matching.*`` settings).

    Attributes:
        max_streams: Streams registered on the node in all.
        max_streams_per_worker: Streams per app worker id (``maxConcurrentTasksCap``); a worker
            with F flow types may hold F + 1 more, for its idle streams.
        max_flow_types: Flow types one worker may register, and flow-type queues on the node.
        max_flow_type_length: Longest flow type name.
        max_queue_length: Longest queue name (app worker id).
        max_backlog: Dispatches waiting in one queue; past it a dispatch is not dispatched
            (``unavailable``).
        sticky_wait: Longest wait in a sticky worker's queue before the flow-type queue.
        dispatch_wait: Default dispatch wait (the engine passes it as ``Dispatch.wait``).
        ping_interval: How often idle streams get an ``M_PING``.
        peer_timeout: A worker silent on a stream that long is dropped.
        queue_idle_timeout: A queue with no stream and no backlog that long is stopped (the
            matcher starts it again when a dispatch or a registration needs it), so the
            queues alive are those in use.

    Raises:
        ValueError: a field is not a positive int (counts) or a positive number (seconds).
    """

    max_streams: int = attrs.field(default=100_000, validator=_positive_int)
    max_streams_per_worker: int = attrs.field(default=256, validator=_positive_int)
    max_flow_types: int = attrs.field(default=256, validator=_positive_int)
    max_flow_type_length: int = attrs.field(default=256, validator=_positive_int)
    max_queue_length: int = attrs.field(default=256, validator=_positive_int)
    max_backlog: int = attrs.field(default=10_000, validator=_positive_int)
    sticky_wait: float = attrs.field(default=5.0, validator=_positive_seconds)
    dispatch_wait: float = attrs.field(default=10.0, validator=_positive_seconds)
    ping_interval: float = attrs.field(default=20.0, validator=_positive_seconds)
    peer_timeout: float = attrs.field(default=60.0, validator=_positive_seconds)
    queue_idle_timeout: float = attrs.field(default=300.0, validator=_positive_seconds)
