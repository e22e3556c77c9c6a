"""The ``matching_engine`` GenServer: flows, their steps and attempts, retries, RPC calls,
result waiters, descriptions, cancellation and recovery (the seed's Dex server core).

It mirrors a Temporal history service on one node: every decision becomes records in a
``WriteBatch`` for the ``StoreServer``; what a flow does next (dispatch its next step, start a
retry timer, answer a waiter or an RPC caller) happens only once the batch holding its own cause
is committed (an RPC that changed nothing, on a flow with nothing waiting to be committed, is
answered at once). What one pass over the mailbox produces is committed as one batch, one batch
at a time (group commit); the mailbox is read all the while. Dispatch records (``Routed``) wait
for nobody: they ride in the next batch, or go alone after ``dispatch_record_delay``.

This module holds the client functions and the callbacks; their helpers are mixins, one job
each: ``_engine_steps`` (flows and steps), ``_engine_kinds`` (SubFlow and WaitFor steps),
``_engine_rpcs`` (RPC calls), ``_engine_reads`` (describe, list), ``_engine_leases`` (which
flows it holds: claims, takeovers, loads), ``_engine_commits`` (batches and what waits for
them); the values are in ``_engine_state`` and the pinned definitions in ``_flow_spec``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import otp

from . import _engine_handoff as handoff
from ._dispatch import Completed, Failed, Lost, NotDispatched, Routed
from ._engine_definitions import Advertised, DefinitionLoaded, remember
from ._engine_kinds import ChildEnded, ChildRead
from ._engine_reads import _describe
from ._engine_rpcs import EngineRpcs
from ._engine_state import (
    DEFAULT_TIMEOUT,
    ENGINE,
    Claimed,
    EngineOptions,
    EngineStatistics,
    _call_timeout,
    _check_id,
    _err,
    _FlushRecords,
    _Loaded,
    _RetryDue,
    _Rpc,
    _RpcDeadline,
    _State,
    _StepDeadline,
    _unwrap,
    _WaitTimeouts,
)
from ._engine_steps import EngineSteps
from ._engine_waiters import caller_down, expired_waiters
from ._errors import CallTimeout as MatchingCallTimeout
from ._errors import MatchingError, ProtocolError
from ._flow_spec import FlowSpec, StepSpec, parse_definition
from ._store import BatchCommitted

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


class FlowEngine(EngineSteps, EngineRpcs, otp.GenServer):
    """The ``matching_engine`` GenServer (registered as :data:`ENGINE` by the application).

    Start it with ``FlowEngine.start_link(EngineOptions(...), name=ENGINE)`` after the
    ``StoreServer`` and the matcher. ``init`` recovers through claims (``_engine_leases``): it
    takes back the steps its server id leased (on SQLite every step: one server per file), then
    claims every free or expired one, and dispatches each flow's current step again (at least
    once), with the state, attempt and sticky worker stored; a retry still backing off waits
    for the rest of its backoff. Every pending step it writes is leased to its server id.

    Its callbacks never wait: callers are answered later (``otp.reply``), once what their answer
    depends on is committed. An RPC's call and its outcome may be handled in the task that read
    them, on its state, instead of sent (``_engine_handoff``: ``_take_call``,
    ``_take_outcome``). A commit refused for a conflict on one flow (another server wrote it:
    this one lost its lease) drops that flow and commits the rest; any other refusal crashes
    the engine; if the ``StoreServer`` goes away (the engine monitors it) the engine
    stops with ``Shutdown(("store_down", reason))``; either way its supervisor's restart
    recovers from the store.
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
        the client's registry, pinned for this flow); returns its id (a new UUIDv7 hex,
        time-ordered, when ``flow_id`` is None) once the flow is stored.

        Raises:
            FlowExists: a flow with ``flow_id`` exists.
            ConfigurationError: the definition, the flow type, the args or the id is invalid.
            otp.CallTimeout, otp.CallError: no answer in time, or the engine died (the flow may
                or may not have been started). Cancellation leaves the same.
        """
        request = ("start_flow", flow_type, args, flow_id, definition)
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def start_known(
        flow_type: str,
        args: Sequence[Any],
        flow_id: str | None = None,
        *,
        server: Any = ENGINE,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> str:
        """Start a flow of ``flow_type`` with ``args`` and the definition the engine knows for
        the type (``_engine_definitions``); returns its id once the flow is stored.

        Raises:
            UnknownFlowType: no definition of ``flow_type`` was given and none is stored.
            FlowExists, ConfigurationError: as :meth:`start_flow`.
        """
        request = ("start_known", flow_type, args, flow_id)
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    def advertise(definitions: Mapping[str, FlowSpec], *, server: Any = ENGINE) -> None:
        """Tell the engine the definitions a worker advertised (a cast; never blocks)."""
        otp.cast(server, Advertised(dict(definitions)))

    @staticmethod
    def child_ended(parent_id: str, *, server: Any = ENGINE) -> None:
        """Tell the engine that a child of ``parent_id``'s parked SubFlow step may have ended
        out of its sight (on another server): it reads the child from the store and, if it
        ended, completes or fails the step (a cast; never blocks)."""
        otp.cast(server, ChildEnded(parent_id))

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
        """Cancel a running flow: its running attempt's outcome is ignored (its worker is told
        to stop it, M_CANCEL), the child flow its SubFlow step waits for is cancelled too, and
        its waiters get :class:`Cancelled`. Cancelling a flow that has ended changes nothing.

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
        store_monitor = otp.monitor(options.store)
        first = options.first_delivery
        if first is None:
            first = time.time_ns() // 1000
        state = _State(options=options, me=me, store_monitor=store_monitor, next_delivery=first)
        await self._recover(state)
        takers = handoff.Takers(
            functools.partial(self._take_outcome, state), functools.partial(self._take_call, state)
        )
        handoff.register(me, takers)
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        try:
            match request:
                case ("start_flow", flow_type, args, flow_id, definition):
                    self._start_flow(state, from_, flow_type, args, flow_id, definition)
                case ("start_known", flow_type, args, flow_id):
                    self._start_known(state, from_, flow_type, args, flow_id)
                case ("call_rpc", flow_id, name, args, timeout):
                    self._call_rpc(state, from_, flow_id, name, args, timeout)
                case ("result", flow_id, timeout):
                    self._result(state, from_, flow_id, timeout)
                case ("describe", flow_id):
                    _check_id("describe", flow_id)
                    self._after_commit(state, lambda: self._read(state, _describe, from_, flow_id))
                case ("list_flows", flow_type, status, limit):
                    self._list_flows(state, from_, flow_type, status, limit)
                case ("cancel", flow_id):
                    self._cancel(state, from_, flow_id)
                case ("forwarded", ("result", flow_id, timeout)):
                    self._result(state, from_, flow_id, timeout, forwarded=True)
                case ("forwarded", ("call_rpc", flow_id, name, args, timeout)):
                    self._call_rpc(state, from_, flow_id, name, args, timeout, forwarded=True)
                case ("forwarded", ("cancel", flow_id)):
                    self._cancel(state, from_, flow_id, forwarded=True)
                case ("forwarded", ("child_ended", parent_id)):
                    self._child_notice(state, from_, parent_id)
                case ("forwarded", ("cancel_child", child_id, parent_id)):
                    self._cancel_child_of(state, from_, child_id, parent_id)
                case ("statistics",):
                    otp.reply(from_, self._statistics(state))
                case _:
                    raise ProtocolError(f"matching engine: unknown request {request!r}")
        except MatchingError as exc:
            otp.reply(from_, _err(exc))
        return self._next(state)

    def handle_cast(self, message: Any, state: _State) -> Any:
        if type(message) is Advertised:
            for flow_type, spec in message.definitions.items():
                remember(state, flow_type, spec)
        elif type(message) is ChildEnded:
            self._child_told(state, message.parent_id)
        else:
            logger.warning("matching engine: unexpected cast %r", message)
        return self._next(state)

    def _take_call(self, state: _State, from_: otp.From, request: Any) -> bool:
        """(In the task of the connection that read it: ``_engine_handoff``.) Handle a
        ``call_rpc`` of a flow in memory here, as ``handle_call`` would, and say so; or say it
        must be sent: any other request, one while anything waits in the engine's mailbox or
        the engine handles something itself, and an RPC of a flow not in memory or moved to
        another server (its read and its forward start processes, which must be the
        engine's). A queue its dispatch goes straight to that the engine does not watch yet
        gets it through the matcher (``DirectDeliveries.elsewhere``: so does a monitor). A bug
        in it ends the engine (as it would in its own task), not the caller."""
        if type(request) is not tuple or len(request) != 5 or request[0] != "call_rpc":
            return False
        me = state.me
        if state.handing or otp.message_queue_len(me) or not otp.is_process_alive(me):
            return False
        _, flow_id, name, args, timeout = request
        flow = state.flows.get(flow_id) if type(flow_id) is str else None
        if flow is None or flow.moved or otp.self() == me:
            return False
        state.handing = state.direct.elsewhere = True
        try:
            try:
                self._call_rpc(state, from_, flow_id, name, args, timeout)
            except MatchingError as exc:
                otp.reply(from_, _err(exc))
            self._next(state)
        except Exception as exc:
            logger.exception("matching engine: failed on %r (handed over)", request)
            otp.exit(me, ("engine_failed", repr(exc)))
        finally:
            state.handing = state.direct.elsewhere = False
        return True

    def _take_outcome(self, state: _State, outcome: Completed | Failed) -> bool:
        """(In the task of the stream that read it: ``_engine_handoff``.) Handle an RPC's
        outcome here, as ``handle_info`` would, and say so; or say it must be sent: while
        anything waits in the engine's mailbox (it comes first), while the engine handles
        something itself, and for a Step's outcome or an RPC of a flow that moved to another
        server (what those lead to may monitor a queue or start a process, which must be
        the engine's). A bug in it ends the engine (as it would in its own task), not the
        caller."""
        call = state.deliveries.get(outcome.delivery)  # (first: a Step's is sent, at once)
        if type(call) is not _Rpc or call.flow.moved or state.handing:
            return False
        me = state.me
        if otp.message_queue_len(me) or not otp.is_process_alive(me) or otp.self() == me:
            return False
        state.handing = True
        try:
            if outcome.delivered is not None:
                self._note_routed(state, outcome.delivered, call_over=True)
            self._rpc_outcome(state, call, outcome)
            self._next(state)
        except Exception as exc:
            logger.exception("matching engine: failed on %r (handed over)", outcome)
            otp.exit(me, ("engine_failed", repr(exc)))
        finally:
            state.handing = False
        return True

    def _note_routed(self, state: _State, routed: Routed, *, call_over: bool = False) -> None:
        self._routed(state, routed, call_over=call_over)
        state.remote.routed(routed, state.deliveries)
        state.direct.routed(routed)

    def handle_info(self, message: Any, state: _State) -> Any:
        match message:
            case "timeout":
                self._flush(state)
            case DefinitionLoaded():
                self._definition_loaded(state, message)
            case ChildRead():
                self._child_read(state, message)
            case Completed() | Failed():
                if message.delivered is not None:  # (its Routed, sent with it)
                    self._note_routed(state, message.delivered, call_over=True)
                self._outcome(state, message)
            case Routed():
                self._note_routed(state, message)
            case NotDispatched() | Lost():
                self._outcome(state, message)
            case BatchCommitted(tag=size, error=refused):
                if refused is not None:
                    self._refused(state, refused)  # (or crash, and recover from the store)
                else:
                    self._committed(state, size)
            case _FlushRecords():
                state.record_timer = False
                if state.building.size:
                    self._flush(state)
            case _Loaded():
                self._loaded(state, message)
            case Claimed():
                self._claimed(state, message)
            case _RetryDue(flow_id=flow_id, token=token):
                flow = state.flows.get(flow_id)
                if flow is not None and flow.retry_timer is not None and flow.retry_token == token:
                    flow.retry_timer = None
                    flow.retry_at = None
                    self._advance(state, flow)
            case _StepDeadline():
                self._step_deadline(state, message)
            case _RpcDeadline(delivery=delivery):
                call = state.deliveries.get(delivery)
                if isinstance(call, _Rpc):
                    call.deadline_timer = None
                    exc = MatchingCallTimeout(
                        f"RPC {call.task.name!r} of flow {call.flow.flow_id!r} did not answer"
                        f" within {call.timeout} s"
                    )
                    self._rpc_done(state, call, _err(exc))
            case _WaitTimeouts(token=token):
                for flow, waiter in expired_waiters(state, token):
                    exc = MatchingCallTimeout(
                        f"flow {flow.flow_id!r} was still running when the result's timeout passed"
                    )
                    otp.reply(waiter.from_, _err(exc))
                    self._maybe_evict(state, flow)
            case otp.Down(ref=ref, reason=reason) if ref in state.remote.monitors:
                # (another server our forwarded deliveries ran on went)
                for lost in state.remote.down(ref, reason, state.deliveries):
                    self._outcome(state, lost)
            case otp.Down(ref=ref, reason=reason) if ref in state.direct.monitors:
                # (a queue our deliveries were sent straight to went)
                for lost in state.direct.down(ref, reason, state.deliveries):
                    self._outcome(state, lost)
            case otp.Down(ref=ref, reason=reason) if ref == state.store_monitor:
                return otp.Stop(otp.Shutdown(("store_down", reason)), state)
            case otp.Down(ref=ref):
                for flow in caller_down(state, ref) or ():
                    self._maybe_evict(state, flow)
            case _:
                logger.warning("matching engine: unexpected message %r", message)
        return self._next(state)
