"""The ``matching_engine`` GenServer: flows, their steps and attempts, retries, RPC calls,
result waiters, descriptions, cancellation and recovery (the seed's Dex server core).

It mirrors a Temporal history service on one node: every decision becomes records in a
``WriteBatch`` for the ``StoreServer``; what a flow does next (dispatch its next step, start a
retry timer, answer a waiter or an RPC caller) happens only once the batch holding its cause is
committed. What one pass over the mailbox produces is committed as one batch, one batch at a
time (group commit); the mailbox is read all the while.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

import otp

from ._dispatch import Completed, Dispatch, Failed, Lost, NotDispatched, Routed, Task
from ._errors import CallTimeout as MatchingCallTimeout
from ._errors import (
    Cancelled,
    ConfigurationError,
    FlowExists,
    FlowFailed,
    FlowNotFound,
    HandlerError,
    MatchingError,
    NoWorkerAvailable,
    ProtocolError,
    Unavailable,
    UnknownName,
    error_from_code,
)
from ._matcher import MATCHER, submit
from ._model import MAX_NAME_LENGTH, RetryPolicy, apply_patch
from ._store import (
    FLOW_STATUSES,
    SERVER_NAME,
    AttemptRecord,
    DispatchRecord,
    FlowRecord,
    PendingStep,
    StoreError,
    StoreServer,
    WriteBatch,
)

__all__ = [
    "ENGINE",
    "EngineOptions",
    "EngineStatistics",
    "FlowEngine",
    "FlowSpec",
    "StepSpec",
    "parse_definition",
]

logger = logging.getLogger("apps.matching")

#: The engine's registered name.
ENGINE = "matching_engine"
#: Default timeout of the client functions that answer from the store (seconds).
DEFAULT_TIMEOUT = 30.0
#: Added to a call's own timeout (``result``, ``call_rpc``) for the engine's answer to arrive.
CALL_MARGIN = 30.0
#: Most flows one ``list_flows`` returns.
MAX_LIST_LIMIT = 10_000
_RUNNING = "running"


# -- flow definitions -----------------------------------------------------------------------------


@attrs.frozen
class StepSpec:
    """One step of a pinned flow definition: its name, retry policy and attempt timeout."""

    name: str
    retry: RetryPolicy
    timeout: float | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_attempts": self.retry.max_attempts,
            "initial_backoff": self.retry.initial_backoff,
            "backoff_coefficient": self.retry.backoff_coefficient,
            "max_backoff": self.retry.max_backoff,
            "timeout": self.timeout,
        }


@attrs.frozen
class FlowSpec:
    """A flow type's definition as a client sent it at ``start_flow``, validated; a flow runs
    to its end with the one it started with."""

    steps: tuple[StepSpec, ...]
    rpcs: frozenset[str]

    def to_wire(self) -> dict[str, Any]:
        """``{"steps": [{"name", "max_attempts", ...}], "rpcs": [names]}``."""
        return {"steps": [s.to_wire() for s in self.steps], "rpcs": sorted(self.rpcs)}


def _bad_definition(where: str, expected: str, got: Any) -> ConfigurationError:
    return ConfigurationError(
        f"start_flow definition: {where} must be {expected} (got {got!r}); send the flow"
        " type's definition as the client's Registry builds it"
    )


def _name(where: str, value: Any) -> str:
    if type(value) is not str or not value or len(value) > MAX_NAME_LENGTH:
        raise _bad_definition(
            where, f"a non-empty str of at most {MAX_NAME_LENGTH} characters", value
        )
    return value


def parse_definition(value: Any) -> FlowSpec:
    """Validate a flow type's definition: ``{"steps": [{"name", "max_attempts",
    "initial_backoff", "backoff_coefficient", "max_backoff", "timeout"}], "rpcs": [names]}``.
    Missing retry keys take :class:`RetryPolicy`'s defaults, a missing timeout is None.

    Raises:
        ConfigurationError: naming the field, what was expected and what was received.
    """
    if not isinstance(value, Mapping):
        raise _bad_definition("the definition", 'a dict {"steps": [...], "rpcs": [...]}', value)
    steps_in = value.get("steps", [])
    rpcs_in = value.get("rpcs", [])
    if not isinstance(steps_in, list | tuple):
        raise _bad_definition('"steps"', "a list of step dicts", steps_in)
    if not isinstance(rpcs_in, list | tuple):
        raise _bad_definition('"rpcs"', "a list of RPC names", rpcs_in)
    steps: list[StepSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(steps_in):
        where = f"steps[{i}]"
        if not isinstance(entry, Mapping):
            raise _bad_definition(where, 'a dict with "name"', entry)
        name = _name(f"{where}.name", entry.get("name"))
        if name in seen:
            raise _bad_definition(f"{where}.name", "unique within the flow type", name)
        seen.add(name)
        retry_args = {
            key: entry[key]
            for key in ("max_attempts", "initial_backoff", "backoff_coefficient", "max_backoff")
            if entry.get(key) is not None
        }
        try:
            retry = RetryPolicy(**retry_args)
        except ConfigurationError as exc:
            raise ConfigurationError(f"start_flow definition: {where}: {exc.message}") from exc
        timeout = entry.get("timeout")
        if timeout is not None and (
            type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout <= 0
        ):
            raise _bad_definition(f"{where}.timeout", "a number of seconds > 0 or None", timeout)
        steps.append(StepSpec(name, retry, None if timeout is None else float(timeout)))
    rpcs = frozenset(_name(f"rpcs[{i}]", r) for i, r in enumerate(rpcs_in))
    return FlowSpec(tuple(steps), rpcs)


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
    """

    store: Any = SERVER_NAME
    matcher: Any = MATCHER
    dispatch_wait: float = attrs.field(default=10.0, validator=_positive_seconds)
    max_batch: int = attrs.field(default=5000, validator=_positive_int)
    first_delivery: int | None = attrs.field(default=None, validator=_delivery_or_none)


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


# -- runtime state --------------------------------------------------------------------------------


@attrs.define(eq=False)
class _Waiter:
    from_: otp.From
    timer: otp.Ref | None


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
    waiters: dict[otp.Ref, _Waiter] = attrs.field(factory=dict)
    rpcs: int = 0
    #: After-commit actions scheduled for this flow and not yet run.
    holds: int = 0

    @property
    def running(self) -> bool:
        return self.status == _RUNNING

    def record(self) -> FlowRecord:
        return FlowRecord(
            flow_id=self.flow_id,
            flow_type=self.flow_type,
            status=self.status,
            args=self.args,
            state=self.state,
            step_index=self.step_index,
            step_input=self.step_input,
            result=self.result,
            error=self.error,
            sticky_worker=self.sticky_worker,
            created_at=self.created_at,
            updated_at=self.updated_at,
            version=self.version,
            definition=self.definition,
        )

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


@attrs.define
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
    size: int = 0

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
    committer: otp.Pid
    next_delivery: int
    flows: dict[str, _Flow] = attrs.field(factory=dict)
    deliveries: dict[int, _Flow | _Rpc] = attrs.field(factory=dict)
    loading: dict[str, list[Callable[[_Flow | None], None]]] = attrs.field(factory=dict)
    watched: dict[otp.Ref, str] = attrs.field(factory=dict)
    building: _Pass = attrs.field(factory=_Pass)
    committing: _Pass | None = None
    commits: int = 0
    records_committed: int = 0
    largest_batch: int = 0

    def delivery(self) -> int:
        self.next_delivery += 1
        return self.next_delivery - 1


# -- messages to the engine from its helpers and timers -------------------------------------------


@attrs.frozen
class _Committed:
    size: int


@attrs.frozen(eq=False)
class _Loaded:
    flow_id: str
    record: FlowRecord | None


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
class _WaitTimeout:
    flow_id: str
    ref: otp.Ref


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


class FlowEngine(otp.GenServer):
    """The ``matching_engine`` GenServer (registered as :data:`ENGINE` by the application).

    Start it with ``FlowEngine.start_link(EngineOptions(...), name=ENGINE)`` after the
    ``StoreServer`` and the matcher. ``init`` recovers: every running flow's current step is
    dispatched again (at least once), with the state, attempt and sticky worker stored; a retry
    still backing off waits for the rest of its backoff.

    Its callbacks never wait: callers are answered later (``otp.reply``), once what their answer
    depends on is committed. If a commit fails or the store goes away the engine crashes (its
    helpers are linked to it) and its supervisor's restart recovers from the store.
    """

    # ======================================== client side ====================================

    @staticmethod
    async def start_flow(
        flow_type: str,
        args: Sequence[Any],
        definition: Mapping[str, Any],
        flow_id: str | None = None,
        *,
        server: Any = ENGINE,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> str:
        """Start a flow of ``flow_type`` with ``args`` and the flow type's ``definition`` (from
        the client's registry, pinned for this flow); returns its id (a new uuid4 hex when
        ``flow_id`` is None) once the flow is stored.

        Raises:
            FlowExists: a flow with ``flow_id`` exists.
            ConfigurationError: the definition, the flow type, the args or the id is invalid.
            otp.CallTimeout, otp.CallError: no answer in time, or the engine died (the flow may
                or may not have been started). Cancellation leaves the same.
        """
        request = ("start_flow", flow_type, args, flow_id, definition)
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def call_rpc(
        flow_id: str,
        name: str,
        args: Sequence[Any] = (),
        timeout: float | None = None,
        *,
        server: Any = ENGINE,
    ) -> Any:
        """Run the RPC ``name`` of the flow with ``args`` on a worker (sticky to the flow's last
        worker) and return its value, once its state changes are stored. ``timeout`` bounds the
        whole call (dispatch wait included); None leaves it to the dispatch wait and the worker.

        Raises:
            FlowNotFound: no such flow.
            UnknownName: the flow's definition has no such RPC, or no worker has it.
            Unavailable, NoWorkerAvailable: no worker took the call within the dispatch wait.
            HandlerError: the RPC raised (``details["type"]``), or its worker went away.
            CallTimeout: ``timeout`` passed.
        """
        request = ("call_rpc", flow_id, name, args, timeout)
        return _unwrap(await otp.call(server, request, _call_timeout(timeout)))

    @staticmethod
    async def result(flow_id: str, timeout: float | None = None, *, server: Any = ENGINE) -> Any:
        """Wait for the flow to end; return its result (its last step's return value).

        Raises:
            FlowFailed: the flow failed (``details`` has its error's ``type`` and ``message``).
            Cancelled: the flow was cancelled.
            FlowNotFound: no such flow.
            CallTimeout: the flow was still running after ``timeout`` seconds.
        """
        request = ("result", flow_id, timeout)
        return _unwrap(await otp.call(server, request, _call_timeout(timeout)))

    @staticmethod
    async def describe(
        flow_id: str, *, server: Any = ENGINE, timeout: float | None = DEFAULT_TIMEOUT
    ) -> dict[str, Any]:
        """The flow as stored, as :meth:`FlowDescription.from_wire` reads it: status, args,
        state, result, error, step index, sticky worker, times, definition, its attempts and
        its last dispatch records.

        Raises:
            FlowNotFound: no such flow.
        """
        return _unwrap(await otp.call(server, ("describe", flow_id), timeout))

    @staticmethod
    async def list_flows(
        flow_type: str | None = None,
        status: str | None = None,
        limit: int = 100,
        *,
        server: Any = ENGINE,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` flows, newest first, as :meth:`FlowSummary.from_wire` reads them.

        Raises:
            ConfigurationError: ``status`` is not a flow status, or ``limit`` is not an int in
                1..10000.
        """
        request = ("list_flows", flow_type, status, limit)
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def cancel(
        flow_id: str, *, server: Any = ENGINE, timeout: float | None = DEFAULT_TIMEOUT
    ) -> None:
        """Cancel a running flow: its running attempt's outcome is ignored and its waiters get
        :class:`Cancelled`. Cancelling a flow that has ended changes nothing.

        Raises:
            FlowNotFound: no such flow.
        """
        _unwrap(await otp.call(server, ("cancel", flow_id), timeout))

    @staticmethod
    async def statistics(
        *, server: Any = ENGINE, timeout: float | None = DEFAULT_TIMEOUT
    ) -> EngineStatistics:
        """The engine's counters."""
        return await otp.call(server, ("statistics",), timeout)

    # ======================================== callbacks ======================================

    async def init(self, options: EngineOptions | None = None) -> otp.Ok:
        options = options if options is not None else EngineOptions()
        me = otp.self()
        committer = otp.spawn_link(_committer, options.store, me)
        first = options.first_delivery
        if first is None:
            first = time.time_ns() // 1000
        state = _State(options=options, me=me, committer=committer, next_delivery=first)
        records = await StoreServer.list_flows(
            status=_RUNNING, limit=2**62, server=options.store, timeout=None
        )
        now, wall = trio.current_time(), time.time()
        for record in reversed(records):  # oldest first
            try:
                flow = _Flow.from_record(record)
            except ConfigurationError:
                logger.exception("matching engine: flow %r has a bad definition", record.flow_id)
                continue
            state.flows[flow.flow_id] = flow
            if flow.step_index >= len(flow.spec.steps):
                continue  # (cannot be: such a flow is stored completed)
            for pending in await StoreServer.pending(
                flow.flow_id, server=options.store, timeout=None
            ):
                if pending.step_index == flow.step_index:
                    flow.attempt = pending.attempt
                    if pending.not_before > wall:
                        flow.retry_at = now + (pending.not_before - wall)
            self._advance(state, flow)
        if records:
            logger.info("matching engine: recovered %d running flows", len(records))
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        try:
            match request:
                case ("start_flow", flow_type, args, flow_id, definition):
                    self._start_flow(state, from_, flow_type, args, flow_id, definition)
                case ("call_rpc", flow_id, name, args, timeout):
                    self._call_rpc(state, from_, flow_id, name, args, timeout)
                case ("result", flow_id, timeout):
                    self._result(state, from_, flow_id, timeout)
                case ("describe", flow_id):
                    _check_id("describe", flow_id)
                    self._after_commit(
                        state, None, lambda: self._read(state, _describe, from_, flow_id)
                    )
                case ("list_flows", flow_type, status, limit):
                    self._list_flows(state, from_, flow_type, status, limit)
                case ("cancel", flow_id):
                    self._cancel(state, from_, flow_id)
                case ("statistics",):
                    otp.reply(from_, self._statistics(state))
                case _:
                    raise ProtocolError(f"matching engine: unknown request {request!r}")
        except MatchingError as exc:
            otp.reply(from_, _err(exc))
        return self._next(state)

    def handle_info(self, message: Any, state: _State) -> Any:
        match message:
            case "timeout":
                self._flush(state)
            case Routed():
                self._routed(state, message)
            case Completed() | Failed() | NotDispatched() | Lost():
                self._outcome(state, message)
            case _Committed():
                self._committed(state, message)
            case _Loaded(flow_id=flow_id, record=record):
                self._loaded(state, flow_id, record)
            case _RetryDue(flow_id=flow_id, token=token):
                flow = state.flows.get(flow_id)
                if flow is not None and flow.retry_timer is not None and flow.retry_token == token:
                    flow.retry_timer = None
                    flow.retry_at = None
                    self._advance(state, flow)
            case _StepDeadline(flow_id=flow_id, delivery=delivery):
                flow = state.flows.get(flow_id)
                if flow is not None and flow.delivery == delivery:
                    flow.deadline_timer = None
                    step = flow.spec.steps[flow.step_index]
                    error = {
                        "type": "timeout",
                        "message": f"step {step.name!r} attempt {flow.attempt} did not finish"
                        f" within its timeout of {step.timeout} s",
                    }
                    self._attempt_failed(state, flow, "failed", flow.worker_id, error, True)
            case _RpcDeadline(delivery=delivery):
                call = state.deliveries.get(delivery)
                if isinstance(call, _Rpc):
                    call.deadline_timer = None
                    exc = MatchingCallTimeout(
                        f"RPC {call.task.name!r} of flow {call.flow.flow_id!r} did not answer"
                        f" within {call.timeout} s"
                    )
                    self._rpc_done(state, call, _err(exc))
            case _WaitTimeout(flow_id=flow_id, ref=ref):
                flow = state.flows.get(flow_id)
                waiter = flow.waiters.pop(ref, None) if flow is not None else None
                if flow is not None and waiter is not None:
                    state.watched.pop(ref, None)
                    otp.demonitor(ref, flush=True)
                    exc = MatchingCallTimeout(
                        f"flow {flow_id!r} was still running when the result's timeout passed"
                    )
                    otp.reply(waiter.from_, _err(exc))
                    self._maybe_evict(state, flow)
            case otp.Down(ref=ref):
                watched = state.watched.pop(ref, None)
                flow = state.flows.get(watched) if watched is not None else None
                if flow is not None:
                    waiter = flow.waiters.pop(ref, None)
                    if waiter is not None and waiter.timer is not None:
                        otp.cancel_timer(waiter.timer)
                    self._maybe_evict(state, flow)
            case _:
                logger.warning("matching engine: unexpected message %r", message)
        return self._next(state)

    # -- commits ----------------------------------------------------------------------------------

    def _next(self, state: _State) -> otp.NoReply:
        """Carry on; with records waiting and no commit running, commit once the mailbox is
        empty (a zero timeout), or at once past ``max_batch`` records."""
        if state.committing is None and (state.building.size or state.building.actions):
            if state.building.size >= state.options.max_batch:
                self._flush(state)
            else:
                return otp.NoReply(state, timeout=0)
        return otp.NoReply(state)

    def _flush(self, state: _State) -> None:
        if state.committing is not None:
            return
        done = state.building
        if not done.size:
            state.building = _Pass()
            for action in done.actions:
                action()
            if state.building.size or state.building.actions:
                self._flush(state)
            return
        state.building = _Pass()
        state.committing = done
        batch = done.batch()
        otp.send(state.committer, (batch, len(batch)))

    def _committed(self, state: _State, message: _Committed) -> None:
        done = state.committing
        state.committing = None
        state.commits += 1
        state.records_committed += message.size
        state.largest_batch = max(state.largest_batch, message.size)
        if done is not None:
            for action in done.actions:
                action()
        if state.building.size:
            self._flush(state)  # what came while that batch was being committed: one group

    def _after_commit(self, state: _State, flow: _Flow | None, action: Callable[[], None]) -> None:
        """Run ``action`` once everything decided so far is committed (at once if it is)."""
        building = state.building
        if building.size or building.actions:
            target = building
        elif state.committing is not None:
            target = state.committing
        else:
            action()
            return
        if flow is not None:
            flow.holds += 1

            def run() -> None:
                flow.holds -= 1
                action()
                self._maybe_evict(state, flow)

            target.actions.append(run)
        else:
            target.actions.append(action)

    def _dirty(self, state: _State, flow: _Flow) -> None:
        flow.updated_at = time.time()
        building = state.building
        if flow.flow_id not in building.dirty:
            building.dirty[flow.flow_id] = flow
            building.size += 1

    def _attempt(self, state: _State, record: AttemptRecord) -> None:
        state.building.attempts.append(record)
        state.building.size += 1

    def _pending_put(self, state: _State, flow: _Flow, not_before: float = 0.0) -> None:
        step = flow.spec.steps[flow.step_index]
        pending = PendingStep(
            flow.flow_id, flow.step_index, step.name, flow.execution_id(), flow.attempt,
            not_before=not_before,
        )  # fmt: skip
        state.building.pending_put[pending.key] = pending
        state.building.size += 1

    def _pending_done(self, state: _State, flow: _Flow) -> None:
        state.building.pending_done.append((flow.flow_id, flow.step_index))
        state.building.size += 1

    # -- reads ------------------------------------------------------------------------------------

    def _with_flow(self, state: _State, flow_id: str, then: Callable[[_Flow | None], None]) -> None:
        """Call ``then`` with the flow, loaded from the store if it is not in memory (None if
        it is not stored either)."""
        flow = state.flows.get(flow_id)
        if flow is not None:
            then(flow)
            return
        waiting = state.loading.get(flow_id)
        if waiting is not None:
            waiting.append(then)
            return
        state.loading[flow_id] = [then]
        store, me = state.options.store, state.me

        def load() -> None:
            otp.spawn_link(_load, store, flow_id, me)

        self._after_commit(state, None, load)

    def _loaded(self, state: _State, flow_id: str, record: FlowRecord | None) -> None:
        waiting = state.loading.pop(flow_id, [])
        if record is not None and flow_id not in state.flows:
            flow = _Flow.from_record(record)
            state.flows[flow_id] = flow
            if flow.running:  # (only when it was started by another engine: adopt it)
                self._advance(state, flow)
        for then in waiting:
            then(state.flows.get(flow_id))
        flow_or_none = state.flows.get(flow_id)
        if flow_or_none is not None:
            self._maybe_evict(state, flow_or_none)

    def _maybe_evict(self, state: _State, flow: _Flow) -> None:
        if (
            not flow.running
            and not flow.waiters
            and not flow.rpcs
            and not flow.holds
            and state.flows.get(flow.flow_id) is flow
        ):
            del state.flows[flow.flow_id]

    def _read(self, state: _State, fn: Callable[..., Any], from_: otp.From, *args: Any) -> None:
        otp.spawn_link(_reader, fn, state.options.store, from_, args)

    def _list_flows(
        self, state: _State, from_: otp.From, flow_type: Any, status: Any, limit: Any
    ) -> None:
        if flow_type is not None and (type(flow_type) is not str or not flow_type):
            raise ConfigurationError(
                f"list_flows: flow_type must be a str or None (got {flow_type!r})"
            )
        if status is not None and status not in FLOW_STATUSES:
            raise ConfigurationError(
                f"list_flows: status must be one of {', '.join(FLOW_STATUSES)} or None"
                f" (got {status!r})"
            )
        if type(limit) is not int or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ConfigurationError(
                f"list_flows: limit must be an int from 1 to {MAX_LIST_LIMIT} (got {limit!r})"
            )
        self._after_commit(
            state, None, lambda: self._read(state, _list, from_, flow_type, status, limit)
        )

    def _statistics(self, state: _State) -> EngineStatistics:
        flows = state.flows.values()
        rpcs = sum(isinstance(d, _Rpc) for d in state.deliveries.values())
        return EngineStatistics(
            flows_running=sum(f.running for f in flows),
            flows_resident=len(state.flows),
            dispatches_in_flight=len(state.deliveries),
            rpcs_in_flight=rpcs,
            retries_waiting=sum(f.retry_timer is not None for f in flows),
            waiters=sum(len(f.waiters) for f in flows),
            commits=state.commits,
            records_committed=state.records_committed,
            largest_batch=state.largest_batch,
            building=state.building.size,
            commit_in_flight=state.committing is not None,
        )

    # -- starting, waiting, cancelling ------------------------------------------------------------

    def _start_flow(
        self,
        state: _State,
        from_: otp.From,
        flow_type: Any,
        args: Any,
        flow_id: Any,
        definition: Any,
    ) -> None:
        if type(flow_type) is not str or not flow_type or len(flow_type) > MAX_NAME_LENGTH:
            raise ConfigurationError(
                f"start_flow: flow_type must be a non-empty str of at most {MAX_NAME_LENGTH}"
                f" characters (got {flow_type!r})"
            )
        if not isinstance(args, list | tuple):
            raise ConfigurationError(f"start_flow: args must be a list (got {args!r})")
        spec = parse_definition(definition)
        if flow_id is None:
            self._create(state, from_, uuid.uuid4().hex, flow_type, list(args), spec)
            return
        _check_id("start_flow", flow_id)

        def then(found: _Flow | None) -> None:
            if found is not None:
                exc = FlowExists(
                    f"a flow with id {flow_id!r} exists already ({found.flow_type},"
                    f" {found.status}); start it with another id, or None for a new one",
                    details={"flow_id": flow_id},
                )
                otp.reply(from_, _err(exc))
            else:
                self._create(state, from_, flow_id, flow_type, list(args), spec)

        self._with_flow(state, flow_id, then)

    def _create(
        self,
        state: _State,
        from_: otp.From,
        flow_id: str,
        flow_type: str,
        args: list[Any],
        spec: FlowSpec,
    ) -> None:
        now = time.time()
        flow = _Flow(
            flow_id=flow_id,
            flow_type=flow_type,
            spec=spec,
            definition=spec.to_wire(),
            status=_RUNNING if spec.steps else "completed",
            args=args,
            state={},
            step_index=0,
            step_input=args,
            result=None,
            error=None,
            sticky_worker=None,
            created_at=now,
            updated_at=now,
            version=0,
        )
        state.flows[flow_id] = flow
        state.building.created[flow_id] = flow
        state.building.size += 1
        if spec.steps:
            self._pending_put(state, flow)

        def started() -> None:
            otp.reply(from_, _ok(flow_id))
            self._advance(state, flow)

        self._after_commit(state, flow, started)

    def _result(self, state: _State, from_: otp.From, flow_id: Any, timeout: Any) -> None:
        _check_id("result", flow_id)
        timeout = _check_timeout("result", timeout)

        def then(flow: _Flow | None) -> None:
            if flow is None:
                otp.reply(from_, _err(FlowNotFound(f"no flow has id {flow_id!r}")))
            elif not flow.running:
                self._after_commit(state, flow, lambda: otp.reply(from_, _outcome_of(flow)))
            else:
                ref = otp.monitor(from_.pid)
                timer = None
                if timeout is not None:
                    timer = otp.send_after(timeout, state.me, _WaitTimeout(flow_id, ref))
                flow.waiters[ref] = _Waiter(from_, timer)
                state.watched[ref] = flow_id

        self._with_flow(state, flow_id, then)

    def _cancel(self, state: _State, from_: otp.From, flow_id: Any) -> None:
        _check_id("cancel", flow_id)

        def then(flow: _Flow | None) -> None:
            if flow is None:
                otp.reply(from_, _err(FlowNotFound(f"no flow has id {flow_id!r}")))
                return
            if flow.running:
                self._end_attempt(state, flow)
                self._finish(state, flow, "cancelled", None, {
                    "type": "cancelled", "message": "the flow was cancelled",
                })  # fmt: skip
            self._after_commit(state, flow, lambda: otp.reply(from_, _ok(None)))

        self._with_flow(state, flow_id, then)

    def _finish(
        self, state: _State, flow: _Flow, status: str, result: Any, error: dict[str, Any] | None
    ) -> None:
        """End the flow; its waiters are answered once that is committed."""
        if flow.retry_timer is not None:
            otp.cancel_timer(flow.retry_timer)
            flow.retry_timer = None
        flow.retry_at = None
        flow.status = status
        flow.result = result
        flow.error = error
        self._pending_done(state, flow)
        self._dirty(state, flow)
        self._after_commit(state, flow, lambda: self._settle(state, flow))

    def _settle(self, state: _State, flow: _Flow) -> None:
        """Answer the flow's waiters (it has ended, and that is committed)."""
        answer = _outcome_of(flow)
        waiters, flow.waiters = flow.waiters, {}
        for ref, waiter in waiters.items():
            state.watched.pop(ref, None)
            otp.demonitor(ref, flush=True)
            if waiter.timer is not None:
                otp.cancel_timer(waiter.timer)
            otp.reply(waiter.from_, answer)

    # -- steps ------------------------------------------------------------------------------------

    def _advance(self, state: _State, flow: _Flow) -> None:
        """Dispatch the flow's current step unless it is dispatched, backing off or ended."""
        if not flow.running or flow.delivery is not None or flow.retry_timer is not None:
            return
        now = trio.current_time()
        if flow.retry_at is not None and flow.retry_at > now:
            flow.retry_token += 1
            due = _RetryDue(flow.flow_id, flow.retry_token)
            flow.retry_timer = otp.send_after(flow.retry_at - now, state.me, due)
            return
        flow.retry_at = None
        self._dispatch_step(state, flow, new_attempt=True)

    def _dispatch_step(
        self, state: _State, flow: _Flow, *, new_attempt: bool, delivery: int | None = None
    ) -> None:
        step = flow.spec.steps[flow.step_index]
        now = trio.current_time()
        if new_attempt:
            flow.started_at = time.time()
            flow.worker_id = None
            flow.deadline = None if step.timeout is None else now + step.timeout
        if delivery is None:
            delivery = state.delivery()
        if flow.deadline_timer is not None:
            otp.cancel_timer(flow.deadline_timer)
            flow.deadline_timer = None
        if flow.deadline is not None:
            flow.deadline_timer = otp.send_after(
                max(flow.deadline - now, 0.0), state.me, _StepDeadline(flow.flow_id, delivery)
            )
        task = Task(
            delivery=delivery,
            kind="step",
            flow_type=flow.flow_type,
            flow_id=flow.flow_id,
            name=step.name,
            execution_id=flow.execution_id(),
            attempt=flow.attempt,
            args=list(flow.step_input),
            state=flow.state,
            deadline=flow.deadline,
        )
        flow.delivery = delivery
        flow.task = task
        state.deliveries[delivery] = flow
        wait = state.options.dispatch_wait
        if flow.deadline is not None:
            wait = max(min(wait, flow.deadline - now), 0.001)
        submit(Dispatch(task, state.me, flow.sticky_worker, wait), matcher=state.options.matcher)

    def _end_attempt(self, state: _State, flow: _Flow) -> None:
        """Forget the step dispatch in flight (a late outcome is ignored)."""
        if flow.delivery is not None:
            state.deliveries.pop(flow.delivery, None)
        flow.delivery = None
        flow.task = None
        flow.deadline = None
        if flow.deadline_timer is not None:
            otp.cancel_timer(flow.deadline_timer)
            flow.deadline_timer = None

    def _attempt_record(
        self, flow: _Flow, delivery: int, status: str, worker_id: str | None, error: Any
    ) -> AttemptRecord:
        return AttemptRecord(
            flow_id=flow.flow_id,
            step_index=flow.step_index,
            step=flow.spec.steps[flow.step_index].name,
            execution_id=flow.execution_id(),
            attempt=flow.attempt,
            delivery=delivery,
            worker_id=worker_id,
            status=status,
            error=error,
            started_at=flow.started_at,
            finished_at=time.time(),
        )

    def _attempt_failed(
        self,
        state: _State,
        flow: _Flow,
        status: str,
        worker_id: str | None,
        error: dict[str, Any],
        retryable: bool,
    ) -> None:
        """The attempt is consumed: retry after its backoff, or fail the flow."""
        delivery = flow.delivery if flow.delivery is not None else 0
        self._end_attempt(state, flow)
        self._attempt(state, self._attempt_record(flow, delivery, status, worker_id, error))
        retry = flow.spec.steps[flow.step_index].retry
        if retryable and flow.attempt < retry.max_attempts:
            delay = retry.backoff(flow.attempt)
            flow.attempt += 1
            flow.retry_at = trio.current_time() + delay
            self._pending_put(state, flow, not_before=time.time() + delay)
            self._dirty(state, flow)
            self._after_commit(state, flow, lambda: self._advance(state, flow))
        else:
            self._finish(state, flow, "failed", None, error)

    def _routed(self, state: _State, routed: Routed) -> None:
        target = state.deliveries.get(routed.delivery)
        if target is None:
            return
        task: Task | None
        if isinstance(target, _Rpc):
            flow, task = target.flow, target.task
            target.queue = routed.queue
        else:
            flow = target
            task = flow.task
            flow.queue = routed.queue
            if routed.reason == "delivered" and routed.worker_id is not None:
                flow.worker_id = routed.worker_id
        assert task is not None
        self._dispatch_record(state, flow, task, routed.queue, routed.reason, routed.worker_id)

    def _dispatch_record(
        self,
        state: _State,
        flow: _Flow,
        task: Task,
        queue: str,
        reason: str,
        worker_id: str | None,
    ) -> None:
        record = DispatchRecord(
            flow_id=flow.flow_id,
            delivery=task.delivery,
            kind=task.kind,
            name=task.name,
            attempt=task.attempt,
            queue=queue,
            reason=reason,
            worker_id=worker_id,
            at=time.time(),
        )
        state.building.dispatches.append(record)
        state.building.size += 1

    def _outcome(self, state: _State, outcome: Completed | Failed | NotDispatched | Lost) -> None:
        target = state.deliveries.get(outcome.delivery)
        if target is None:
            return  # a late outcome: the attempt timed out, or the flow was cancelled
        if isinstance(target, _Rpc):
            self._rpc_outcome(state, target, outcome)
            return
        flow = target
        match outcome:
            case Completed(worker_id=worker_id, value=value, patch=patch):
                try:
                    new_state = apply_patch(flow.state, patch)
                except (ValueError, TypeError, AttributeError) as exc:
                    error = {"type": "bad_patch", "message": f"the step's state patch: {exc}"}
                    self._attempt_failed(state, flow, "failed", worker_id, error, True)
                    return
                self._step_completed(state, flow, worker_id, value, new_state)
            case Failed(worker_id=worker_id, error=info):
                error = {"type": info.type, "message": info.message}
                self._attempt_failed(state, flow, "failed", worker_id, error, info.retryable)
            case NotDispatched(reason=reason, message=message):
                error = {"type": reason, "message": message}
                self._attempt_failed(state, flow, "not_dispatched", None, error, True)
            case Lost(worker_id=worker_id, after_output=True):
                error = {
                    "type": "lost",
                    "message": f"worker {worker_id!r} went away after the attempt's first output",
                }
                self._attempt_failed(state, flow, "lost", worker_id, error, True)
            case Lost(worker_id=worker_id):
                task = flow.task
                assert task is not None
                queue = flow.queue or f"flow:{flow.flow_type}"
                state.deliveries.pop(outcome.delivery, None)
                flow.delivery = None
                flow.task = None
                # the same attempt again (at least once), as a new delivery; its deadline stands
                delivery = state.delivery()
                again_task = attrs.evolve(task, delivery=delivery)
                self._dispatch_record(state, flow, again_task, queue, "redispatch_lost", worker_id)

                def again() -> None:
                    if flow.running and flow.delivery is None and flow.retry_timer is None:
                        self._dispatch_step(state, flow, new_attempt=False, delivery=delivery)

                self._after_commit(state, flow, again)

    def _step_completed(
        self, state: _State, flow: _Flow, worker_id: str, value: Any, new_state: dict[str, Any]
    ) -> None:
        delivery = flow.delivery if flow.delivery is not None else 0
        self._end_attempt(state, flow)
        self._attempt(state, self._attempt_record(flow, delivery, "completed", worker_id, None))
        self._pending_done(state, flow)
        flow.state = new_state
        flow.sticky_worker = worker_id
        flow.step_index += 1
        flow.step_input = [value]
        flow.attempt = 1
        if flow.step_index >= len(flow.spec.steps):
            self._finish(state, flow, "completed", value, None)
            return
        self._pending_put(state, flow)
        self._dirty(state, flow)
        self._after_commit(state, flow, lambda: self._advance(state, flow))

    # -- RPCs -------------------------------------------------------------------------------------

    def _call_rpc(
        self, state: _State, from_: otp.From, flow_id: Any, name: Any, args: Any, timeout: Any
    ) -> None:
        _check_id("call_rpc", flow_id)
        if type(name) is not str or not name:
            raise ConfigurationError(f"call_rpc: name must be a non-empty str (got {name!r})")
        if not isinstance(args, list | tuple):
            raise ConfigurationError(f"call_rpc: args must be a list (got {args!r})")
        timeout = _check_timeout("call_rpc", timeout)

        def then(flow: _Flow | None) -> None:
            if flow is None:
                otp.reply(from_, _err(FlowNotFound(f"no flow has id {flow_id!r}")))
            elif name not in flow.spec.rpcs:
                known = ", ".join(sorted(flow.spec.rpcs)) or "none"
                exc = UnknownName(
                    f"flow type {flow.flow_type!r} (as flow {flow_id!r} was started) has no RPC"
                    f" named {name!r} (it has: {known})"
                )
                otp.reply(from_, _err(exc))
            else:
                delivery = state.delivery()
                deadline = None if timeout is None else trio.current_time() + timeout
                task = Task(
                    delivery=delivery,
                    kind="rpc",
                    flow_type=flow.flow_type,
                    flow_id=flow_id,
                    name=name,
                    execution_id=f"{flow_id}/rpc/{delivery}",
                    attempt=1,
                    args=list(args),
                    state=flow.state,
                    deadline=deadline,
                )
                call = _Rpc(flow, from_, task, timeout)
                flow.rpcs += 1
                if timeout is not None:
                    call.deadline_timer = otp.send_after(timeout, state.me, _RpcDeadline(delivery))
                self._submit_rpc(state, call)

        self._with_flow(state, flow_id, then)

    def _submit_rpc(self, state: _State, call: _Rpc) -> None:
        task = call.task
        state.deliveries[task.delivery] = call
        wait = state.options.dispatch_wait
        if task.deadline is not None:
            wait = max(min(wait, task.deadline - trio.current_time()), 0.001)
        dispatch = Dispatch(task, state.me, call.flow.sticky_worker, wait)
        submit(dispatch, matcher=state.options.matcher)

    def _rpc_outcome(
        self, state: _State, call: _Rpc, outcome: Completed | Failed | NotDispatched | Lost
    ) -> None:
        flow = call.flow
        match outcome:
            case Completed(value=value, patch=patch):
                try:
                    new_state = apply_patch(flow.state, patch)
                except (ValueError, TypeError, AttributeError) as exc:
                    details = {"type": "bad_patch"}
                    error = HandlerError(f"the RPC's state patch: {exc}", details=details)
                    self._rpc_done(state, call, _err(error))
                    return
                if patch and (patch.get("set") or patch.get("delete")):
                    flow.state = new_state
                    self._dirty(state, flow)
                self._rpc_done(state, call, _ok(value))
            case Failed(error=info):
                error = HandlerError(
                    f"RPC {call.task.name!r} of flow {flow.flow_id!r} raised {info.type}:"
                    f" {info.message}",
                    retryable=info.retryable,
                    details={"type": info.type},
                )
                self._rpc_done(state, call, _err(error))
            case NotDispatched(reason=reason, message=message):
                cls = {"unavailable": Unavailable, "no_worker_available": NoWorkerAvailable}.get(
                    reason, UnknownName
                )
                self._rpc_done(state, call, _err(cls(message)))
            case Lost(worker_id=worker_id, after_output=True):
                error = HandlerError(
                    f"worker {worker_id!r} went away while running RPC {call.task.name!r} of flow"
                    f" {flow.flow_id!r}",
                    retryable=True,
                    details={"type": "lost"},
                )
                self._rpc_done(state, call, _err(error))
            case Lost(worker_id=worker_id):
                old = call.task
                state.deliveries.pop(old.delivery, None)
                queue = call.queue or f"flow:{flow.flow_type}"
                call.task = attrs.evolve(old, delivery=state.delivery())
                self._dispatch_record(state, flow, call.task, queue, "redispatch_lost", worker_id)
                if call.deadline_timer is not None and old.deadline is not None:
                    otp.cancel_timer(call.deadline_timer)
                    remaining = max(old.deadline - trio.current_time(), 0.0)
                    call.deadline_timer = otp.send_after(
                        remaining, state.me, _RpcDeadline(call.task.delivery)
                    )
                self._submit_rpc(state, call)

    def _rpc_done(self, state: _State, call: _Rpc, answer: Any) -> None:
        """Answer the RPC's caller once what it did is committed."""
        state.deliveries.pop(call.task.delivery, None)
        if call.deadline_timer is not None:
            otp.cancel_timer(call.deadline_timer)
            call.deadline_timer = None
        flow = call.flow

        def answered() -> None:
            flow.rpcs -= 1
            otp.reply(call.from_, answer)

        self._after_commit(state, flow, answered)


def _outcome_of(flow: _Flow) -> Any:
    if flow.status == "completed":
        return _ok(flow.result)
    return _err(_flow_failed(flow))


# -- helper processes -----------------------------------------------------------------------------


async def _committer(store: Any, engine: otp.Pid) -> None:
    """Commits the engine's batches one at a time, in order, and tells it each is durable. A
    refused batch or a store gone crashes it, and with it (linked) the engine."""
    while True:
        batch, size = await otp.receive()
        await StoreServer.commit(batch, server=store, timeout=None)
        otp.send(engine, _Committed(size))


async def _load(store: Any, flow_id: str, engine: otp.Pid) -> None:
    record = await StoreServer.get_flow(flow_id, server=store, timeout=None)
    otp.send(engine, _Loaded(flow_id, record))


async def _reader(
    fn: Callable[..., Any], store: Any, from_: otp.From, args: tuple[Any, ...]
) -> None:
    """Answers a describe or a list from the store, straight to the caller."""
    try:
        otp.reply(from_, _ok(await fn(store, *args)))
    except MatchingError as exc:
        otp.reply(from_, _err(exc))
    except StoreError as exc:
        otp.reply(from_, ("error", "internal", exc.message, exc.retryable, exc.details))


async def _describe(store: Any, flow_id: str) -> dict[str, Any]:
    record = await StoreServer.get_flow(flow_id, server=store, timeout=None)
    if record is None:
        raise FlowNotFound(f"no flow has id {flow_id!r}")
    attempts = await StoreServer.attempts(flow_id, server=store, timeout=None)
    dispatches = await StoreServer.dispatches(flow_id, server=store, timeout=None)
    description = _summary(record)
    description.update(
        args=list(record.args),
        state=record.state,
        result=record.result,
        error=record.error,
        step_index=record.step_index,
        sticky_worker=record.sticky_worker,
        definition=record.definition,
        attempts=[
            {
                "step_index": a.step_index,
                "step": a.step,
                "attempt": a.attempt,
                "execution_id": a.execution_id,
                "delivery": a.delivery,
                "status": a.status,
                "worker_id": a.worker_id,
                "error": a.error,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
            }
            for a in attempts
        ],
        dispatches=[
            {
                "delivery": d.delivery,
                "kind": d.kind,
                "name": d.name,
                "attempt": d.attempt,
                "queue": d.queue,
                "reason": d.reason,
                "worker_id": d.worker_id,
                "at": d.at,
            }
            for d in dispatches
        ],
    )
    return description


async def _list(store: Any, flow_type: str | None, status: str | None, limit: int) -> list[Any]:
    records = await StoreServer.list_flows(
        flow_type=flow_type, status=status, limit=limit, server=store, timeout=None
    )
    return [_summary(r) for r in records]


def _summary(record: FlowRecord) -> dict[str, Any]:
    return {
        "flow_id": record.flow_id,
        "flow_type": record.flow_type,
        "status": record.status,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }
