"""The engine's values and in-memory records: its options and statistics, a flow held in memory
(``_Flow``, what its ``FlowRecord`` says plus its attempt in progress), an RPC call in flight,
the pass of records being built for one batch, the messages its timers and helpers send, and the
reply helpers of its client functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

import otp

from ._dispatch import Task
from ._engine_direct import DirectDeliveries
from ._engine_remote import RemoteDeliveries
from ._errors import Cancelled, ConfigurationError, FlowFailed, MatchingError, error_from_code
from ._flow_spec import FlowSpec, parse_definition
from ._matcher import MATCHER
from ._model import MAX_NAME_LENGTH
from ._server_id import local_server_id
from ._store import (
    SERVER_NAME,
    AttemptRecord,
    Claim,
    DispatchRecord,
    FlowRecord,
    PendingStep,
    WriteBatch,
)
from ._store_records import trusted_builder

__all__ = [
    "ENGINE",
    "DEFAULT_TIMEOUT",
    "CALL_MARGIN",
    "MAX_LIST_LIMIT",
    "_RUNNING",
    "EngineOptions",
    "EngineStatistics",
    "_Waiter",
    "_Flow",
    "_Rpc",
    "_Pass",
    "_State",
    "_Loaded",
    "Claimed",
    "_FlushRecords",
    "_RetryDue",
    "_StepDeadline",
    "_RpcDeadline",
    "_WaitTimeouts",
    "_Caller",
    "_ok",
    "_err",
    "_unwrap",
    "_call_timeout",
    "_check_timeout",
    "_check_id",
    "_flow_failed",
    "_outcome_of",
]

#: The engine's registered name.
ENGINE = "matching_engine"
#: Default timeout of the client functions that answer from the store (seconds).
DEFAULT_TIMEOUT = 30.0
#: Added to a call's own timeout (``result``, ``call_rpc``) for the engine's answer to arrive.
CALL_MARGIN = 30.0
#: Most flows one ``list_flows`` returns.
MAX_LIST_LIMIT = 10_000
#: How many ended flows' answers to ``result`` the engine keeps (``_State.ended``).
MAX_ENDED = 256
_RUNNING = "running"


#: Builds a ``FlowRecord`` of the engine's own values (``trusted``: no validators run).
_new_flow_record = trusted_builder(FlowRecord)


# -- options and statistics -----------------------------------------------------------------------


def _positive_seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"EngineOptions.{attribute.name} must be a number of seconds > 0 (got {value!r})"
        )


def _positive_int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ConfigurationError(
            f"EngineOptions.{attribute.name} must be an int >= 1 (got {value!r})"
        )


def _delivery_or_none(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not int or not 0 <= value < 2**62):
        raise ConfigurationError(
            f"EngineOptions.first_delivery must be None or an int from 0 to 2**62 (got {value!r})"
        )


def _server_name(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value or len(value) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"EngineOptions.server_id must be a non-empty str of at most {MAX_NAME_LENGTH}"
            f" characters (got {value!r})"
        )


@attrs.frozen
class EngineOptions:
    """How the engine reaches the rest of the server, and its waits.

    Attributes:
        store: The ``StoreServer`` (pid or registered name).
        matcher: The matcher dispatches are submitted to (pid or registered name).
        dispatch_wait: The dispatch wait of each step attempt and RPC call (at most the
            attempt's or call's own timeout).
        max_batch: Records one batch collects before it is committed even though the mailbox
            is not empty yet (a batch also goes as soon as the mailbox is empty).
        first_delivery: The first delivery id; None derives it from the wall clock, so ids
            stay unique across restarts of the engine within one server run.
        dispatch_record_delay: How long dispatch records (``Routed``, for ``describe_flow``)
            may wait in memory for a batch to ride in before one is committed for them alone.
            Nothing waits for them: a crash loses those not yet committed.
        server_id: Who this server is in the store: every pending step the engine writes is
            leased to it (``_server_id.server_id()``: the node's name when distributed).
        lease_seconds: How long a lease lasts; ``matching_leases`` renews them every third
            of it. A server silent that long loses its flows to the others.
    """

    store: Any = SERVER_NAME
    matcher: Any = MATCHER
    dispatch_wait: float = attrs.field(default=10.0, validator=_positive_seconds)
    max_batch: int = attrs.field(default=5000, validator=_positive_int)
    first_delivery: int | None = attrs.field(default=None, validator=_delivery_or_none)
    dispatch_record_delay: float = attrs.field(default=0.1, validator=_positive_seconds)
    #: The longest flow type name a flow may start with (``matching.max_flow_type_length``).
    max_flow_type_length: int = attrs.field(default=256, validator=_positive_int)
    server_id: str = attrs.field(factory=local_server_id, validator=_server_name)
    lease_seconds: float = attrs.field(default=15.0, validator=_positive_seconds)
    #: How calls for flows other servers own are forwarded (``_engine_forward.ForwardOptions``);
    #: None: this server shares its store with no other, and never forwards.
    forward: Any = None


@attrs.frozen
class EngineStatistics:
    """What :meth:`FlowEngine.statistics` reports (for the observer).

    Attributes:
        flows_running: Running flows.
        flows_resident: Flows held in memory (running ones, and finished ones being read or
            updated by an RPC).
        dispatches_in_flight: Step attempts and RPC calls dispatched and not yet answered.
        rpcs_in_flight: Of those, RPC calls.
        retries_waiting: Step attempts waiting for their backoff timer.
        waiters: Callers waiting in ``result``.
        commits: Batches committed since the engine started.
        records_committed: Records (flows, attempts, dispatches, pending steps) in them.
        largest_batch: The most records one batch carried.
        building: Records collected for the next batch.
        commit_in_flight: Whether a batch is being committed now.
        dispatch_reasons: Routing decisions since the engine started, by reason (one of
            ``ROUTED_REASONS``: a sticky hit, a fallback, a re-route, a delivery, ...).
        takeovers: Flows this engine took from another server since it started (a lease that
            expired, or one released by a server that stopped).
        redeliveries: Of those, the ones whose lease expired: their current step may have run
            on the other server, and is dispatched again (at least once).
        moved: Flows this engine held that another server wrote meanwhile (this server was
            silent past its lease, and that server took them): dropped here, theirs now.
        server_id: The server id its leases carry (``EngineOptions.server_id``).
    """

    flows_running: int
    flows_resident: int
    dispatches_in_flight: int
    rpcs_in_flight: int
    retries_waiting: int
    waiters: int
    commits: int
    records_committed: int
    largest_batch: int
    building: int
    commit_in_flight: bool
    dispatch_reasons: dict[str, int] = attrs.field(factory=dict)
    takeovers: int = 0
    redeliveries: int = 0
    moved: int = 0
    server_id: str = ""


# (read from another server's node too: an observer of the cluster asks each engine)
otp.remote_value(EngineStatistics, name="matching.EngineStatistics")


# -- runtime state --------------------------------------------------------------------------------


@attrs.define(eq=False)
class _Waiter:
    from_: otp.From
    #: When its timeout passes (trio clock), or None (``_engine_waiters``).
    deadline: float | None


@attrs.define(eq=False)
class _Caller:
    """A process that waited in ``result`` (``_engine_waiters``): its monitor, and the flow of
    each of its waiters (by their key, the call's ``From.tag``)."""

    ref: otp.Ref
    waiters: dict[otp.Ref, str] = attrs.Factory(dict)


@attrs.define(eq=False)
class _Flow:
    """A flow held in memory: what its record says, and its attempt in progress."""

    flow_id: str
    flow_type: str
    spec: FlowSpec
    definition: dict[str, Any]
    status: str
    args: list[Any]
    state: dict[str, Any]
    step_index: int
    step_input: list[Any]
    result: Any
    error: dict[str, Any] | None
    sticky_worker: str | None
    created_at: float
    updated_at: float
    #: The version of the last record put into a batch (0: none yet, the flow is new).
    version: int
    #: The current step's attempt number.
    attempt: int = 1
    #: When the retry of the current step is due (trio clock), or None.
    retry_at: float | None = None
    retry_timer: otp.Ref | None = None
    retry_token: int = 0
    #: The step dispatch in flight, and what it carries.
    delivery: int | None = None
    task: Task | None = None
    deadline: float | None = None
    deadline_timer: otp.Ref | None = None
    started_at: float = 0.0
    queue: str | None = None
    worker_id: str | None = None
    #: The stream process that owns the dispatch in flight, once delivered (for M_CANCEL).
    stream: otp.Pid | None = None
    #: A WaitFor attempt's checks that answered "not yet"; whether the state changed while
    #: its check ran (``_engine_kinds``).
    checks: int = 0
    recheck: bool = False
    waiters: dict[otp.Ref, _Waiter] = attrs.field(factory=dict)
    rpcs: int = 0
    #: After-commit actions scheduled for this flow and not yet run.
    holds: int = 0
    #: The pass (being built or committed) holding the flow's latest records, or None when
    #: everything it decided is committed: what it does next waits for that pass.
    unsaved: _Pass | None = None
    #: Another server wrote the flow since this engine took it (a commit of it conflicted):
    #: it is that server's now, and nothing this engine still holds of it may run or answer.
    moved: bool = False
    #: The step (index, attempt) this engine took finding it leased here already, before the
    #: ``Claimed`` of ``matching_leases`` that leased it came: that claim names who held it
    #: before (``_engine_leases``), so the takeover is told when it comes.
    claim_untold: tuple[int, int] | None = None

    @property
    def running(self) -> bool:
        return self.status == _RUNNING and not self.moved

    def record(self) -> FlowRecord:
        # (trusted: the engine's own values, checked as they came in; two per Step)
        return _new_flow_record(
            self.flow_id, self.flow_type, self.status, self.args, self.state,
            self.step_index, self.step_input, self.result, self.error, self.sticky_worker,
            self.created_at, self.updated_at, self.version, self.definition,
        )  # fmt: skip

    @classmethod
    def from_record(cls, record: FlowRecord) -> _Flow:
        definition = dict(record.definition)
        return cls(
            flow_id=record.flow_id,
            flow_type=record.flow_type,
            spec=parse_definition(definition),
            definition=definition,
            status=record.status,
            args=list(record.args),
            state=dict(record.state),
            step_index=record.step_index,
            step_input=list(record.step_input or []),
            result=record.result,
            error=record.error,
            sticky_worker=record.sticky_worker,
            created_at=record.created_at,
            updated_at=record.updated_at,
            version=record.version,
        )

    def execution_id(self) -> str:
        return f"{self.flow_id}/{self.step_index}/{self.spec.steps[self.step_index].name}"


@attrs.define(eq=False)
class _Rpc:
    flow: _Flow
    from_: otp.From
    task: Task
    timeout: float | None
    deadline_timer: otp.Ref | None = None
    queue: str | None = None


@attrs.define(eq=False)
class _Pass:
    """What a pass over the mailbox produced: records for one batch, and what to do once it is
    committed."""

    created: dict[str, _Flow] = attrs.field(factory=dict)
    dirty: dict[str, _Flow] = attrs.field(factory=dict)
    attempts: list[AttemptRecord] = attrs.field(factory=list)
    dispatches: list[DispatchRecord] = attrs.field(factory=list)
    pending_put: dict[tuple[str, int], PendingStep] = attrs.field(factory=dict)
    pending_done: list[tuple[str, int]] = attrs.field(factory=list)
    actions: list[Callable[[], None]] = attrs.field(factory=list)
    #: Records in the batch (dispatch records included).
    size: int = 0
    #: Records something waits for (all but dispatch records): they are committed as soon as
    #: the mailbox is empty; dispatch records alone wait ``dispatch_record_delay``.
    urgent: int = 0
    #: The batch sent to the store for it (sent again without a flow that moved).
    sent: WriteBatch | None = None

    def batch(self) -> WriteBatch:
        batch = WriteBatch(
            attempts=self.attempts,
            dispatches=self.dispatches,
            pending_put=list(self.pending_put.values()),
            pending_done=self.pending_done,
        )
        for flow in self.created.values():
            flow.version = 1
            batch.flows_created.append(flow.record())
        for flow_id, flow in self.dirty.items():
            if flow_id not in self.created:
                flow.version += 1
                batch.flows_upserted.append(flow.record())
        return batch


@attrs.define
class _State:
    options: EngineOptions
    me: otp.Pid
    #: The monitor of the ``StoreServer``: the engine stops when it goes (commits in flight
    #: would never be answered).
    store_monitor: otp.Ref
    next_delivery: int
    flows: dict[str, _Flow] = attrs.field(factory=dict)
    deliveries: dict[int, _Flow | _Rpc] = attrs.field(factory=dict)
    #: Flows being read from the store, and what waits for each: ``(then, request)``, the
    #: request a caller's ``(from_, call)`` to forward when another server holds the flow.
    loading: dict[str, list[tuple[Callable[[_Flow | None], None], Any]]] = attrs.field(factory=dict)
    #: Flow id -> the other server found holding it and until when that is trusted (trio
    #: clock): its calls are forwarded without reading the store (``_engine_forward``).
    owners: dict[str, tuple[str, float]] = attrs.field(factory=dict)
    #: Flow type -> the newest definition given for it (``_engine_definitions``).
    known: dict[str, FlowSpec] = attrs.field(factory=dict)
    #: Flow type -> the definition a client sent last and what it parsed to: a client sends
    #: its type's definition with every ``start_flow``, and comparing is cheaper than parsing.
    parsed: dict[str, tuple[Any, FlowSpec]] = attrs.field(factory=dict)
    #: Flow id -> the answer to ``result`` of a flow that ended here, its end committed (the
    #: newest ``MAX_ENDED``): a lone caller's ``result`` often comes after its short flow
    #: ended and was let go, and needs no read of the store then.
    ended: dict[str, Any] = attrs.field(factory=dict)
    #: The processes that waited in ``result``, and their monitors (``_engine_waiters``).
    callers: dict[otp.Pid, _Caller] = attrs.field(factory=dict)
    caller_refs: dict[otp.Ref, otp.Pid] = attrs.field(factory=dict)
    #: The waiters' timeouts: (deadline, seq, flow_id, key), one timer for the earliest.
    wait_heap: list[tuple[float, int, str, otp.Ref]] = attrs.field(factory=list)
    wait_seq: int = 0
    wait_timer: otp.Ref | None = None
    wait_due: float = 0.0
    wait_token: int = 0
    wait_compact_at: int = 1024
    building: _Pass = attrs.field(factory=_Pass)
    committing: _Pass | None = None
    commits: int = 0
    records_committed: int = 0
    largest_batch: int = 0
    #: Routing decisions by reason (``Routed.reason``), for the observer.
    routed: dict[str, int] = attrs.field(factory=dict)
    record_timer: bool = False
    #: ``EngineStatistics.takeovers``, ``redeliveries`` and ``moved``.
    takeovers: int = 0
    redeliveries: int = 0
    moved: int = 0
    #: Flow id -> who held the step ``matching_leases`` claimed for this server before it
    #: (None: free), until the engine takes the flow: a call's own claim of that step may
    #: take it first, and finds it leased here already (``_engine_leases``).
    claimed_from: dict[str, str | None] = attrs.field(factory=dict)
    #: The deliveries forwarded to other servers, and those servers' nodes watched.
    remote: RemoteDeliveries = attrs.field(factory=RemoteDeliveries)
    #: The deliveries sent straight to a queue (not through the matcher), and those queues
    #: watched (``_matcher_routes``).
    direct: DirectDeliveries = attrs.field(
        default=attrs.Factory(lambda self: DirectDeliveries(self.options.matcher), takes_self=True)
    )
    #: Handling what was handed over in another task (``FlowEngine._take_call``, ...).
    handing: bool = False
    #: The size of the batch committed while handing (its ``BatchCommitted`` taken there, to
    #: be handled once that handling is done: ``FlowEngine._take_committed``), or None.
    taken: int | None = None
    #: Whether no action waited for a commit as that handling began (a commit's answer is
    #: taken there only then: what it runs was decided there).
    fresh: bool = False
    #: A ``_Settle`` is in the engine's mailbox: a handling in another task left its commit
    #: to the engine's own pass (``EngineCommits._next``).
    settle_sent: bool = False
    #: ``NoReply(self)`` and ``NoReply(self, timeout=0)``, built once (frozen values, returned
    #: by every callback: see ``EngineCommits._next``).
    carry_on: Any = None
    carry_on_now: Any = None

    def __attrs_post_init__(self) -> None:
        self.carry_on = otp.NoReply(self)
        self.carry_on_now = otp.NoReply(self, timeout=0)

    def delivery(self) -> int:
        self.next_delivery += 1
        return self.next_delivery - 1


# -- messages to the engine from its helpers and timers -------------------------------------------


@attrs.frozen(eq=False)
class _Loaded:
    """A flow read from the store (by ``_with_flow``, or for a claim of its pending step):
    its record, and the claim of its step when it was running (``_engine_leases``)."""

    flow_id: str
    record: FlowRecord | None
    claim: Claim | None = None
    #: Whether calls wait for it (``_with_flow``), or only a claim brought it.
    requested: bool = True


@attrs.frozen
class Claimed:
    """``matching_leases`` -> engine: pending steps it claimed for this server (``_leases``)."""

    claims: tuple[Claim, ...]


@attrs.frozen
class _FlushRecords:
    """The ``dispatch_record_delay`` passed: commit the dispatch records waiting."""


@attrs.frozen
class _Settle:
    """A handling in another task left its commit to the engine's own pass: start it there
    (``EngineCommits._next``), with whatever else that pass takes."""


@attrs.frozen
class _RetryDue:
    flow_id: str
    token: int


@attrs.frozen
class _StepDeadline:
    flow_id: str
    delivery: int


@attrs.frozen
class _RpcDeadline:
    delivery: int


@attrs.frozen
class _WaitTimeouts:
    """The earliest ``result`` timeout is due (``_engine_waiters``)."""

    token: int


def _ok(value: Any) -> tuple[str, Any]:
    return ("ok", value)


def _err(exc: MatchingError) -> tuple[str, str, str, bool, dict[str, Any]]:
    return ("error", exc.code, exc.message, exc.retryable, exc.details)


def _unwrap(reply: Any) -> Any:
    if reply[0] == "ok":
        return reply[1]
    _, code, message, retryable, details = reply
    raise error_from_code(code, message, retryable=retryable, details=details)


def _call_timeout(timeout: float | None) -> float | None:
    return None if timeout is None else timeout + CALL_MARGIN


def _check_timeout(where: str, timeout: Any) -> float | None:
    if timeout is None:
        return None
    if type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigurationError(
            f"{where}: timeout must be a number of seconds > 0 or None (got {timeout!r})"
        )
    return float(timeout)


def _check_id(where: str, flow_id: Any) -> str:
    if type(flow_id) is not str or not flow_id or len(flow_id) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{where}: flow_id must be a non-empty str of at most {MAX_NAME_LENGTH} characters"
            f" (got {flow_id!r})"
        )
    return flow_id


def _flow_failed(flow: _Flow) -> MatchingError:
    error = flow.error or {"type": flow.status, "message": ""}
    details = {"flow_id": flow.flow_id, "type": error["type"], "message": error["message"]}
    if flow.status == "cancelled":
        return Cancelled(f"flow {flow.flow_id!r} was cancelled", details=details)
    return FlowFailed(
        f"flow {flow.flow_id!r} ({flow.flow_type}) failed: {error['type']}: {error['message']}",
        details=details,
    )


def _outcome_of(flow: _Flow) -> Any:
    if flow.status == "completed":
        return _ok(flow.result)
    return _err(_flow_failed(flow))
