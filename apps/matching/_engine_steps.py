"""The engine's flows and steps: starting, waiting for results, cancelling, dispatching each
step's attempts in order, their outcomes, retries with backoff, timeouts and lost workers (a
Temporal history service's workflow task loop, on one node). SubFlow and WaitFor steps park
their attempts as ``_engine_kinds`` says.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import trio

import otp

from ._dispatch import CancelCall, Completed, Dispatch, Failed, Lost, NotDispatched, Routed, Task
from ._engine_definitions import (
    MAX_KNOWN,
    DefinitionLoaded,
    KnownRequest,
    load_definition,
    remember,
    unknown_definition,
)
from ._engine_family import PARENT_KEY
from ._engine_forward import marked
from ._engine_ids import new_flow_id
from ._engine_kinds import EngineKinds
from ._engine_state import (
    _RUNNING,
    MAX_ENDED,
    _check_id,
    _check_timeout,
    _err,
    _Flow,
    _ok,
    _outcome_of,
    _RetryDue,
    _Rpc,
    _State,
    _StepDeadline,
)
from ._engine_waiters import forget_waiter, watch_waiter
from ._errors import ConfigurationError, FlowExists, FlowNotFound, LimitError, MatchingError
from ._flow_spec import FlowSpec, parse_definition
from ._model import MAX_NAME_LENGTH, apply_patch
from ._store import AttemptRecord
from ._store_records import trusted_builder

__all__ = ["EngineSteps"]

logger = logging.getLogger("apps.matching")
#: Builds an ``AttemptRecord`` of the engine's own values (``trusted``: no validators run).
_new_attempt_record = trusted_builder(AttemptRecord)
#: Build each attempt's ``Task`` and ``Dispatch`` (every field, in order; as ``_engine_rpcs``).
_new_task = trusted_builder(Task)
_new_dispatch = trusted_builder(Dispatch)
_NO_NAMES: frozenset[str] = frozenset()


def _check_start(state: _State, where: str, flow_type: Any, args: Any) -> None:
    if type(flow_type) is not str or not flow_type or len(flow_type) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{where}: flow_type must be a non-empty str of at most {MAX_NAME_LENGTH}"
            f" characters (got {flow_type!r})"
        )
    limit = state.options.max_flow_type_length
    if len(flow_type) > limit:
        raise LimitError(
            f"{where}: flow type {flow_type[:40]!r}... is {len(flow_type)} characters,"
            f" over matching.max_flow_type_length={limit}; no worker could register it:"
            " use a shorter name or raise the limit"
        )
    if not isinstance(args, list | tuple):
        raise ConfigurationError(f"{where}: args must be a list (got {args!r})")


class EngineSteps(EngineKinds):
    """The ``FlowEngine``'s flows and steps (a mixin of its callbacks' helpers)."""

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
        _check_start(state, "start_flow", flow_type, args)
        last = state.parsed.get(flow_type)
        if last is not None and last[0] == definition:
            spec = last[1]
        else:
            spec = parse_definition(definition)
            state.parsed[flow_type] = (definition, spec)
            while len(state.parsed) > MAX_KNOWN:
                del state.parsed[next(iter(state.parsed))]
        remember(state, flow_type, spec)
        self._start_with(state, from_, flow_type, list(args), flow_id, spec)

    def _start_known(
        self, state: _State, from_: otp.From, flow_type: Any, args: Any, flow_id: Any
    ) -> None:
        """Start a flow with the definition known for its type (``start_known``): the newest
        one remembered, else the newest stored flow's of that type (read by a helper)."""
        _check_start(state, "start_known", flow_type, args)
        if flow_id is not None:
            _check_id("start_known", flow_id)
        spec = state.known.get(flow_type)
        if spec is not None:
            self._start_with(state, from_, flow_type, list(args), flow_id, spec)
            return
        request = KnownRequest(from_, flow_type, list(args), flow_id)
        otp.spawn_link(load_definition, state.options.store, request, state.me)

    def _definition_loaded(self, state: _State, loaded: DefinitionLoaded) -> None:
        request = loaded.request
        try:
            if loaded.error is not None:
                raise loaded.error
            spec = state.known.get(request.flow_type)  # (advertised while it was read)
            if spec is None:
                if loaded.definition is None:
                    raise unknown_definition(request.flow_type)
                spec = parse_definition(loaded.definition)
                remember(state, request.flow_type, spec)
            self._start_with(
                state, request.from_, request.flow_type, request.args, request.flow_id, spec
            )
        except MatchingError as exc:
            otp.reply(request.from_, _err(exc))

    def _start_with(
        self,
        state: _State,
        from_: otp.From,
        flow_type: str,
        args: list[Any],
        flow_id: Any,
        spec: FlowSpec,
    ) -> None:
        if flow_id is None:
            self._create(state, from_, new_flow_id(), flow_type, args, spec)
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
                self._create(state, from_, flow_id, flow_type, args, spec)

        self._with_flow(state, flow_id, then)

    def _create(
        self,
        state: _State,
        from_: otp.From | None,
        flow_id: str,
        flow_type: str,
        args: list[Any],
        spec: FlowSpec,
        parent: dict[str, Any] | None = None,
    ) -> None:
        """Create a flow (answering ``from_`` once it is stored), or a SubFlow's child
        (``parent`` its link, pinned in its definition; ``from_`` None)."""
        now = time.time()
        definition = spec.to_wire()
        if parent is not None:
            definition = {**definition, PARENT_KEY: parent}
        flow = _Flow(
            flow_id=flow_id,
            flow_type=flow_type,
            spec=spec,
            definition=definition,
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
        state.building.urgent += 1
        flow.unsaved = state.building
        if spec.steps:
            self._pending_put(state, flow)

        def started() -> None:
            # The first step first: its TASK then goes out ahead of the reply (in the same
            # write batch), so a lone caller's Step is not queued behind its reply's write and
            # the caller's wake-up (issue 15).
            self._advance(state, flow)
            if from_ is not None:
                otp.reply(from_, _ok(flow_id))
            if not flow.running and parent is not None:
                self._child_ended(state, flow)  # (a child without steps)

        self._after_flow(state, flow, started)

    def _result(
        self, state: _State, from_: otp.From, flow_id: Any, timeout: Any, forwarded: bool = False
    ) -> None:
        _check_id("result", flow_id)
        timeout = _check_timeout("result", timeout)
        flow = state.flows.get(flow_id)
        if flow is not None and flow.running:
            watch_waiter(state, flow, from_, timeout)  # (the common case: ``then``'s last arm)
            return
        if flow is None and (answer := state.ended.get(flow_id)) is not None:
            otp.reply(from_, answer)  # (it ended here, and that is committed)
            return
        request = (from_, marked(("result", flow_id, timeout), forwarded))

        def then(flow: _Flow | None) -> None:
            if flow is None:
                otp.reply(from_, _err(FlowNotFound(f"no flow has id {flow_id!r}")))
            elif not flow.running:
                self._after_flow(
                    state,
                    flow,
                    lambda: self._answer(state, flow, from_, _outcome_of(flow), request[1]),
                )
            else:
                watch_waiter(state, flow, from_, timeout)

        self._with_flow(state, flow_id, then, request)

    def _cancel(
        self, state: _State, from_: otp.From, flow_id: Any, forwarded: bool = False
    ) -> None:
        _check_id("cancel", flow_id)
        request = (from_, marked(("cancel", flow_id), forwarded))

        def then(flow: _Flow | None) -> None:
            if flow is None:
                otp.reply(from_, _err(FlowNotFound(f"no flow has id {flow_id!r}")))
                return
            if flow.running:
                error = {"type": "cancelled", "message": "the flow was cancelled"}
                self._cancel_flow(state, flow, error)
            self._after_flow(
                state, flow, lambda: self._answer(state, flow, from_, _ok(None), request[1])
            )

        self._with_flow(state, flow_id, then, request)

    def _cancel_flow(self, state: _State, flow: _Flow, error: dict[str, Any]) -> None:
        """End a running flow as cancelled: its attempt in flight is forgotten (its outcome
        is ignored) and the worker running it is told to cancel it (M_CANCEL; one offered and
        not yet accepted is told once its ``delivered`` comes, see :meth:`_routed`); its
        running child, if it waits for one, is cancelled too."""
        if flow.task is not None and flow.delivery is not None and flow.stream is not None:
            otp.send(flow.stream, CancelCall(flow.delivery))
        self._end_attempt(state, flow)
        self._finish(state, flow, "cancelled", None, error)

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
        if flow.step_index < len(flow.spec.steps):  # (past the last step: no row was put)
            self._pending_done(state, flow)
        self._dirty(state, flow)
        self._after_flow(state, flow, lambda: self._settle(state, flow))

    def _settle(self, state: _State, flow: _Flow) -> None:
        """Answer the flow's waiters, and its parent if a SubFlow step started it (it has
        ended, and that is committed)."""
        answer = _outcome_of(flow)
        if not flow.moved:  # (else that end was refused: another server holds the flow)
            ended = state.ended
            ended[flow.flow_id] = answer
            if len(ended) > MAX_ENDED:
                del ended[next(iter(ended))]
        waiters, flow.waiters = flow.waiters, {}
        for key, waiter in waiters.items():
            forget_waiter(state, key, waiter)
            otp.reply(waiter.from_, answer)
        if PARENT_KEY in flow.definition:
            self._child_ended(state, flow)

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
        self._dispatch_step(state, flow, new_attempt=True, now=now)

    def _dispatch_step(
        self,
        state: _State,
        flow: _Flow,
        *,
        new_attempt: bool,
        delivery: int | None = None,
        now: float | None = None,
    ) -> None:
        step = flow.spec.steps[flow.step_index]
        if now is None:
            now = trio.current_time()
        if new_attempt:
            flow.started_at = time.time()
            flow.worker_id = None
            flow.deadline = None if step.timeout is None else now + step.timeout
            flow.checks = 0
            flow.recheck = False
        if delivery is None:
            delivery = state.delivery()
        if flow.deadline_timer is not None:
            otp.cancel_timer(flow.deadline_timer)
            flow.deadline_timer = None
        if flow.deadline is not None:
            flow.deadline_timer = otp.send_after(
                max(flow.deadline - now, 0.0), state.me, _StepDeadline(flow.flow_id, delivery)
            )
        if step.kind == "subflow":
            flow.delivery = delivery  # parked on the child: no task, no worker
            flow.task = None
            self._start_child(state, flow)
            return
        task = _new_task(
            delivery,
            "step",
            flow.flow_type,
            flow.flow_id,
            step.name,
            flow.execution_id(),
            flow.attempt,
            list(flow.step_input),
            flow.state,
            flow.deadline,
            step.kind,
        )
        flow.delivery = delivery
        flow.task = task
        state.deliveries[delivery] = flow
        wait = state.options.dispatch_wait
        if flow.deadline is not None:
            wait = max(min(wait, flow.deadline - now), 0.001)
        dispatch = _new_dispatch(
            task, state.me, flow.sticky_worker, wait, _NO_NAMES, False, _NO_NAMES, 0
        )
        self._submit(state, dispatch)

    def _end_attempt(self, state: _State, flow: _Flow) -> None:
        """Forget the step dispatch in flight (a late outcome is ignored); a SubFlow attempt
        still waiting for its child cancels the child."""
        if flow.delivery is not None:
            state.deliveries.pop(flow.delivery, None)
            if flow.task is None and flow.spec.steps[flow.step_index].kind == "subflow":
                self._cancel_child(state, flow)
        flow.delivery = None
        flow.task = None
        flow.deadline = None
        if flow.deadline_timer is not None:
            otp.cancel_timer(flow.deadline_timer)
            flow.deadline_timer = None

    def _attempt_record(
        self, flow: _Flow, delivery: int, status: str, worker_id: str | None, error: Any
    ) -> AttemptRecord:
        # (trusted: the engine's own values; one per attempt)
        return _new_attempt_record(
            flow.flow_id, flow.step_index, flow.spec.steps[flow.step_index].name,
            flow.execution_id(), flow.attempt, delivery, worker_id, status, error,
            flow.started_at, time.time(),
        )  # fmt: skip

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
        if error.get("type") in retry.non_retryable_errors:
            retryable = False
        if retryable and flow.attempt < retry.max_attempts:
            delay = retry.backoff(flow.attempt)
            flow.attempt += 1
            flow.retry_at = trio.current_time() + delay
            self._pending_put(state, flow, not_before=time.time() + delay)
            self._dirty(state, flow)
            self._after_flow(state, flow, lambda: self._advance(state, flow))
        else:
            self._finish(state, flow, "failed", None, error)

    def _submit(self, state: _State, dispatch: Dispatch) -> None:
        """Route the dispatch: straight to its queue when the matcher publishes one (its
        routing decision recorded here at once), else through the matcher."""
        routed = state.direct.submit(dispatch, state.deliveries)
        if routed is not None:
            self._routed(state, routed)

    def _routed(self, state: _State, routed: Routed, *, call_over: bool = False) -> None:
        """Note a routing decision (``call_over``: it came with the call's outcome)."""
        reasons = state.routed
        reasons[routed.reason] = reasons.get(routed.reason, 0) + 1
        target = state.deliveries.get(routed.delivery)
        if target is None:
            if routed.reason == "delivered" and routed.stream is not None and not call_over:
                # A call nobody waits for any more (its flow was cancelled while it was
                # offered, or its attempt or RPC timed out): the worker may as well stop it.
                otp.send(routed.stream, CancelCall(routed.delivery))
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
                flow.stream = routed.stream
        assert task is not None
        self._dispatch_record(state, flow, task, routed.queue, routed.reason, routed.worker_id)

    def _outcome(self, state: _State, outcome: Completed | Failed | NotDispatched | Lost) -> None:
        target = state.deliveries.get(outcome.delivery)
        if target is None:
            return  # a late outcome: the attempt timed out, or the flow was cancelled
        if isinstance(target, _Rpc):
            self._rpc_outcome(state, target, outcome)
            return
        flow = target
        match outcome:
            case Completed(worker_id=worker_id, not_yet=True):
                self._not_yet(state, flow, worker_id)
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
                # the same attempt again (at least once), as a new delivery; its deadline stands.
                # Logged before it is sent, so even a server killed the next instant has told
                # its log of every redelivery it made (the chaos run counts these lines).
                logger.info(
                    "matching engine: redelivery of step %d attempt %d of flow %s (worker %s"
                    " went away with it)",
                    flow.step_index,
                    task.attempt,
                    flow.flow_id,
                    worker_id,
                )
                delivery = state.delivery()
                again_task = attrs.evolve(task, delivery=delivery)
                self._dispatch_record(state, flow, again_task, queue, "redispatch_lost", worker_id)

                def again() -> None:
                    if flow.running and flow.delivery is None and flow.retry_timer is None:
                        self._dispatch_step(state, flow, new_attempt=False, delivery=delivery)

                self._after_flow(state, flow, again)

    def _step_completed(
        self,
        state: _State,
        flow: _Flow,
        worker_id: str | None,
        value: Any,
        new_state: dict[str, Any],
    ) -> None:
        delivery = flow.delivery if flow.delivery is not None else 0
        self._end_attempt(state, flow)
        self._attempt(state, self._attempt_record(flow, delivery, "completed", worker_id, None))
        self._pending_done(state, flow)
        flow.state = new_state
        if worker_id is not None:  # (None: a SubFlow step, which no worker ran)
            flow.sticky_worker = worker_id
        flow.step_index += 1
        flow.step_input = [value]
        flow.attempt = 1
        if flow.step_index >= len(flow.spec.steps):
            self._finish(state, flow, "completed", value, None)
            return
        self._pending_put(state, flow)
        self._dirty(state, flow)
        self._after_flow(state, flow, lambda: self._advance(state, flow))

    def _step_deadline(self, state: _State, due: _StepDeadline) -> None:
        """The attempt's timeout passed (if ``due`` is still its timer): the attempt fails,
        retryable; a SubFlow's child is cancelled, a WaitFor's checks stop."""
        flow = state.flows.get(due.flow_id)
        if flow is None or flow.delivery != due.delivery:
            return
        flow.deadline_timer = None
        step = flow.spec.steps[flow.step_index]
        where = f"step {step.name!r} attempt {flow.attempt}"
        if step.kind == "wait_for":
            message = (
                f"WaitFor {where}: its condition did not hold within its timeout of"
                f" {step.timeout} s ({flow.checks} checks answered not yet)"
            )
        elif step.kind == "subflow":
            message = (
                f"SubFlow {where}: its child flow did not end within its timeout of"
                f" {step.timeout} s, and was cancelled"
            )
        else:
            message = f"{where} did not finish within its timeout of {step.timeout} s"
        error = {"type": "timeout", "message": message}
        self._attempt_failed(state, flow, "failed", flow.worker_id, error, True)
