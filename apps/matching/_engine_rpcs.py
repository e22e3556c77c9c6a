"""The engine's RPC calls: dispatched to a worker (sticky to the flow's last one), their state
patches applied, their callers answered once what the answer depends on is committed.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

import otp

from ._dispatch import Completed, Dispatch, Failed, Lost, NotDispatched, Task
from ._engine_forward import marked
from ._engine_reads import EngineReads
from ._engine_state import _check_id, _check_timeout, _err, _Flow, _ok, _Rpc, _RpcDeadline, _State
from ._errors import (
    ConfigurationError,
    FlowNotFound,
    HandlerError,
    NoWorkerAvailable,
    Unavailable,
    UnknownName,
)
from ._model import apply_patch
from ._store_records import trusted_builder

__all__ = ["EngineRpcs"]

#: Build the ``Task`` and ``Dispatch`` of each RPC (every field, in order) of values the engine
#: checked already, without attrs' frozen ``__init__``: the keyword ``Task(...)`` alone cost
#: about as much as the rest of ``_rpc_to``.
_new_task = trusted_builder(Task)
_new_dispatch = trusted_builder(Dispatch)
#: A fresh dispatch's ``excluded`` and ``drained``.
_NO_NAMES: frozenset[str] = frozenset()


class EngineRpcs(EngineReads):
    """The ``FlowEngine``'s RPC calls (a mixin of its callbacks' helpers)."""

    # (defined by EngineKinds, which FlowEngine mixes in)
    def _state_changed(self, state: _State, flow: _Flow) -> None:
        raise NotImplementedError

    # (defined by EngineSteps, which FlowEngine mixes in)
    def _submit(self, state: _State, dispatch: Dispatch) -> None:
        raise NotImplementedError

    # -- RPCs -------------------------------------------------------------------------------------

    def _call_rpc(
        self,
        state: _State,
        from_: otp.From,
        flow_id: Any,
        name: Any,
        args: Any,
        timeout: Any,
        forwarded: bool = False,
    ) -> None:
        _check_id("call_rpc", flow_id)
        if type(name) is not str or not name:
            raise ConfigurationError(f"call_rpc: name must be a non-empty str (got {name!r})")
        if not isinstance(args, list | tuple):
            raise ConfigurationError(f"call_rpc: args must be a list (got {args!r})")
        timeout = _check_timeout("call_rpc", timeout)
        flow = state.flows.get(flow_id)
        if flow is not None:  # (``_with_flow``'s first case, with no closure nor request built)
            self._rpc_to(state, from_, flow, flow_id, name, args, timeout)
            return
        request = (from_, marked(("call_rpc", flow_id, name, list(args), timeout), forwarded))

        def then(flow: _Flow | None) -> None:
            self._rpc_to(state, from_, flow, flow_id, name, args, timeout)

        self._with_flow(state, flow_id, then, request)

    def _rpc_to(
        self,
        state: _State,
        from_: otp.From,
        flow: _Flow | None,
        flow_id: str,
        name: str,
        args: Any,
        timeout: float | None,
    ) -> None:
        """Dispatch the RPC ``name`` of ``flow`` (None: no flow has ``flow_id``)."""
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
            task = _new_task(
                delivery,
                "rpc",
                flow.flow_type,
                flow_id,
                name,
                f"{flow_id}/rpc/{delivery}",
                1,  # (attempt)
                list(args),
                flow.state,
                deadline,
                None,  # (step_kind: an RPC has none)
            )
            call = _Rpc(flow, from_, task, timeout)
            flow.rpcs += 1
            if timeout is not None:
                call.deadline_timer = otp.send_after(timeout, state.me, _RpcDeadline(delivery))
            self._submit_rpc(state, call)

    def _submit_rpc(self, state: _State, call: _Rpc) -> None:
        task = call.task
        state.deliveries[task.delivery] = call
        wait = state.options.dispatch_wait
        if task.deadline is not None:
            wait = max(min(wait, task.deadline - trio.current_time()), 0.001)
        sticky = call.flow.sticky_worker
        self._submit(
            state, _new_dispatch(task, state.me, sticky, wait, _NO_NAMES, False, _NO_NAMES, 0)
        )

    def _rpc_outcome(
        self, state: _State, call: _Rpc, outcome: Completed | Failed | NotDispatched | Lost
    ) -> None:
        flow = call.flow
        match outcome:
            case Completed(value=value, patch=patch):
                # (a patch that changes nothing is not applied: wire checked its shape, and
                # applying it would give a copy of the state, dropped)
                if patch and (patch.get("set") or patch.get("delete")):
                    try:
                        new_state = apply_patch(flow.state, patch)
                    except (ValueError, TypeError, AttributeError) as exc:
                        details = {"type": "bad_patch"}
                        error = HandlerError(f"the RPC's state patch: {exc}", details=details)
                        self._rpc_done(state, call, _err(error))
                        return
                    flow.state = new_state
                    self._dirty(state, flow)
                    # (a WaitFor step checks again once the change is committed)
                    self._after_flow(state, flow, lambda: self._state_changed(state, flow))
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
        """Answer the RPC's caller once what it did (its patch), and what the flow decided
        before (the state the RPC saw), is committed: at once when both are."""
        state.deliveries.pop(call.task.delivery, None)
        if call.deadline_timer is not None:
            otp.cancel_timer(call.deadline_timer)
            call.deadline_timer = None
        flow = call.flow
        if flow.unsaved is None and not flow.moved:
            # (``_after_flow`` and ``_answer`` with nothing to wait for: at once, no closure)
            flow.rpcs -= 1
            otp.reply(call.from_, answer)
            return

        def answered() -> None:
            flow.rpcs -= 1
            task = call.task
            request = ("call_rpc", flow.flow_id, task.name, task.args, call.timeout)
            self._answer(state, flow, call.from_, answer, request)

        self._after_flow(state, flow, answered)
