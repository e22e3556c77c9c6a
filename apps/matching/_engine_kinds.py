"""The engine's Step kinds beyond Execute: SubFlow (the server starts a child flow and waits
for it, holding no worker slot) and WaitFor (a check run on a worker at the Step's start and
again after every committed change of the flow's state, until it answers a value).

Both park the parent's attempt the same way: ``flow.delivery`` stays set (so nothing else is
dispatched for the Step, and its deadline timer, keyed by that delivery, still fires) while
``flow.task`` is None and the delivery is no longer in ``state.deliveries`` (so nothing a
worker says about it counts any more). A SubFlow is parked for its whole attempt; a WaitFor
between its checks.

A child knows its parent from the link pinned in its definition (``_engine_family``); the
parent knows its child from the child's id, derived from the Step's execution id and attempt.
So after a restart the parked parent, dispatched again, finds its child in the store: running
(it tells the parent when it ends), ended (the parent takes its outcome at once) or missing
(started now). An engine that is told a child ended elsewhere (``ChildEnded``, for whatever
notices it: another server, a ``LISTEN``) reads the child from the store and does the same.

Across servers (MULTISERVER.md) parent and child may be held by two: a child ending where its
parent is not held tells the parent's owner (the ``child_ended`` notice, forwarded as calls
are, ``_engine_forward``), and a parent that no longer waits for a child held elsewhere tells
the child's owner to cancel it (``cancel_child``). Each notice is answered once the flow is
held where it arrives (taken there if no live lease holds it) and what it asks is committed; a
server that lost the flow meanwhile answers ``not_owner`` and the notice is re-resolved. An
engine that took a child's outcome into a parent it held but had lost (its write is refused:
another server took the parent over) tells the new owner too (``_engine_leases._moved``). So
a dead owner's parent is found by whichever server takes it over, as a restart finds it.
"""

from __future__ import annotations

from typing import Any

import attrs

import otp

from ._engine_family import child_flow_id, parent_link
from ._engine_forward import CANCEL_CHILD, CHILD_ENDED, marked
from ._engine_reads import EngineReads
from ._engine_state import _check_id, _Flow, _ok, _State
from ._flow_spec import FlowSpec
from ._store import FlowRecord, StoreServer

__all__ = ["ChildEnded", "ChildRead", "EngineKinds"]


@attrs.frozen
class ChildEnded:
    """(A cast to the engine.) The child of ``parent_id``'s parked SubFlow step may have ended
    where this engine did not see it: read it from the store."""

    parent_id: str


@attrs.frozen(eq=False)
class ChildRead:
    """A helper's answer: the child ``record`` (None: not stored) the parked attempt
    ``parked`` of ``parent_id`` waits for."""

    parent_id: str
    parked: int
    record: FlowRecord | None


async def _read_child(store: Any, child_id: str, parent_id: str, parked: int, me: Any) -> None:
    record = await StoreServer.get_flow(child_id, server=store, timeout=None)
    otp.send(me, ChildRead(parent_id, parked, record))


class EngineKinds(EngineReads):
    """The ``FlowEngine``'s SubFlow and WaitFor steps (a mixin of its callbacks' helpers)."""

    # (defined by EngineSteps, which FlowEngine mixes in)
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
        raise NotImplementedError

    def _dispatch_step(
        self, state: _State, flow: _Flow, *, new_attempt: bool, delivery: int | None = None
    ) -> None:
        raise NotImplementedError

    def _step_completed(
        self, state: _State, flow: _Flow, worker_id: str | None, value: Any, new_state: Any
    ) -> None:
        raise NotImplementedError

    def _attempt_failed(
        self,
        state: _State,
        flow: _Flow,
        status: str,
        worker_id: str | None,
        error: dict[str, Any],
        retryable: bool,
    ) -> None:
        raise NotImplementedError

    def _cancel_flow(self, state: _State, flow: _Flow, error: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- SubFlow --------------------------------------------------------------------------------

    def _start_child(self, state: _State, flow: _Flow) -> None:
        """The parent's SubFlow attempt is parked (``flow.delivery`` set): start its child, or
        adopt the one a previous dispatch of this attempt started."""
        step = flow.spec.steps[flow.step_index]
        child_id = child_flow_id(flow.execution_id(), flow.attempt)
        link = {
            "flow_id": flow.flow_id,
            "step_index": flow.step_index,
            "step": step.name,
            "attempt": flow.attempt,
        }
        parked = flow.delivery

        def then(child: _Flow | None) -> None:
            if not flow.running or flow.delivery != parked or flow.task is not None:
                return  # the attempt ended meanwhile (cancelled, timed out)
            if child is None:
                spec = step.child or state.known.get(step.child_type or "")
                if spec is None:
                    error = {
                        "type": "unknown_flow_type",
                        "message": f"SubFlow step {step.name!r} starts a flow of type"
                        f" {step.child_type!r}, whose definition the server does not know:"
                        " start the parent with a Registry that holds the child's Flow class,"
                        " or connect a worker serving it",
                    }
                    self._attempt_failed(state, flow, "failed", None, error, True)
                    return
                args = list(flow.step_input)
                self._create(state, None, child_id, step.child_type or "", args, spec, link)
            elif parent_link(child.definition) != link:
                error = {
                    "type": "flow_exists",
                    "message": f"SubFlow step {step.name!r} cannot start its child: flow id"
                    f" {child_id!r} is taken by a flow this step did not start",
                }
                self._attempt_failed(state, flow, "failed", None, error, False)
            elif not child.running:
                self._child_outcome(state, flow, child)
            # (else: running, it tells this parent when it ends)

        self._with_flow(state, child_id, then)

    def _child_ended(self, state: _State, child: _Flow) -> None:
        """``child`` ended and that is committed: its parent's SubFlow step takes its outcome,
        if the parent still waits for this child (not for a later attempt's). A parent another
        server holds is told there (``child_ended``)."""
        link = parent_link(child.definition)
        if link is None:
            return
        parent_id = link["flow_id"]

        def then(parent: _Flow | None) -> None:
            if (
                parent is None
                or not self._waits_for_child(parent)
                or parent.step_index != link.get("step_index")
                or parent.attempt != link.get("attempt")
            ):
                return
            self._child_outcome(state, parent, child)

        self._with_flow(state, parent_id, then, (None, (CHILD_ENDED, parent_id)))

    def _child_notice(self, state: _State, from_: otp.From, parent_id: Any) -> None:
        """Another server tells (forwarded ``child_ended``) that the child of ``parent_id``'s
        parked SubFlow step ended there: hold the parent (take it if no live lease holds it)
        and read its child from the store; answer once that is under way."""
        _check_id(CHILD_ENDED, parent_id)
        request = marked((CHILD_ENDED, parent_id), True)

        def then(parent: _Flow | None) -> None:
            if parent is None:
                otp.reply(from_, _ok(None))  # (no such flow: nothing waits for the child)
                return
            self._child_told(state, parent_id)
            self._after_flow(
                state, parent, lambda: self._answer(state, parent, from_, _ok(None), request)
            )

        self._with_flow(state, parent_id, then, (from_, request))

    def _child_outcome(self, state: _State, parent: _Flow, child: _Flow) -> None:
        parent.delivery = None  # (the child ended: nothing to cancel)
        if child.status == "completed":
            self._step_completed(state, parent, None, child.result, parent.state)
            return
        if child.status == "cancelled":
            error = {"type": "cancelled", "message": f"child flow {child.flow_id!r} was cancelled"}
            self._attempt_failed(state, parent, "failed", None, error, False)
            return
        cause = child.error or {"type": "failed", "message": ""}
        error = {
            "type": str(cause.get("type")),
            "message": f"child flow {child.flow_id!r} ({child.flow_type}) failed:"
            f" {cause.get('message')}",
        }
        self._attempt_failed(state, parent, "failed", None, error, True)

    def _child_told(self, state: _State, parent_id: str) -> None:
        """``ChildEnded``: if the parent is here, parked on a child, read the child from the
        store (read only: the child is not adopted, another engine may run it)."""
        parent = state.flows.get(parent_id)
        if parent is None or not self._waits_for_child(parent) or parent.delivery is None:
            return
        child_id = child_flow_id(parent.execution_id(), parent.attempt)
        store, me = state.options.store, state.me
        otp.spawn_link(_read_child, store, child_id, parent_id, parent.delivery, me)

    def _child_read(self, state: _State, read: ChildRead) -> None:
        parent = state.flows.get(read.parent_id)
        record = read.record
        if (
            parent is None
            or not self._waits_for_child(parent)
            or parent.delivery != read.parked
            or record is None
            or record.status == "running"
        ):
            return
        link = parent_link(record.definition)
        if link is None or link.get("flow_id") != parent.flow_id:
            return
        if link.get("attempt") != parent.attempt:
            return
        self._child_outcome(state, parent, _Flow.from_record(record))

    @staticmethod
    def _waits_for_child(parent: _Flow) -> bool:
        return (
            parent.running
            and parent.delivery is not None
            and parent.task is None
            and parent.spec.steps[parent.step_index].kind == "subflow"
        )

    def _cancel_child(self, state: _State, parent: _Flow) -> None:
        """The parent's parked SubFlow attempt ends otherwise than by its child's end (the
        parent is cancelled, or the attempt timed out): cancel the child, and so its own. A
        child another server holds is cancelled there (``cancel_child``)."""
        child_id = child_flow_id(parent.execution_id(), parent.attempt)
        self._cancel_child_of(state, None, child_id, parent.flow_id)

    def _cancel_child_of(
        self, state: _State, from_: otp.From | None, child_id: Any, parent_id: Any
    ) -> None:
        """Cancel ``child_id`` if it runs as ``parent_id``'s child; ``from_``: another server
        told this one to (forwarded ``cancel_child``), and is answered once the child is held
        here (taken if no live lease holds it) and its cancellation committed."""
        _check_id(CANCEL_CHILD, child_id)
        _check_id(CANCEL_CHILD, parent_id)
        error = {
            "type": "cancelled",
            "message": f"the parent flow {parent_id!r} no longer waits for it",
        }
        request = marked((CANCEL_CHILD, child_id, parent_id), from_ is not None)

        def then(child: _Flow | None) -> None:
            link = None if child is None else parent_link(child.definition)
            if child is not None and child.running and link and link["flow_id"] == parent_id:
                self._cancel_flow(state, child, error)
            if from_ is None:
                return
            if child is None:
                otp.reply(from_, _ok(None))
            else:
                self._after_flow(
                    state, child, lambda: self._answer(state, child, from_, _ok(None), request)
                )

        self._with_flow(state, child_id, then, (from_, request))

    # -- WaitFor --------------------------------------------------------------------------------

    def _not_yet(self, state: _State, flow: _Flow, worker_id: str) -> None:
        """A check answered "not yet": park the attempt until the state changes (or check
        again at once if it changed while the check ran)."""
        step = flow.spec.steps[flow.step_index]
        if step.kind != "wait_for":
            error = {
                "type": "not_yet",
                "message": f"step {step.name!r} returned NOT_YET, but it is an Execute step:"
                " declare it with @wait_for to wait for a condition",
            }
            self._attempt_failed(state, flow, "failed", worker_id, error, False)
            return
        task = flow.task
        assert task is not None and flow.delivery is not None
        state.deliveries.pop(flow.delivery, None)
        flow.task = None
        flow.worker_id = worker_id
        flow.checks += 1
        queue = flow.queue or f"flow:{flow.flow_type}"
        self._dispatch_record(state, flow, task, queue, "not_yet", worker_id)
        if flow.recheck:
            flow.recheck = False
            self._dispatch_step(state, flow, new_attempt=False)

    def _state_changed(self, state: _State, flow: _Flow) -> None:
        """The flow's state changed and that is committed: a parked WaitFor checks again; one
        whose check is running checks again once it answers (it may have read the old
        state)."""
        if not flow.running or flow.delivery is None:
            return  # (a Step backing off sees the new state when it is dispatched)
        if flow.spec.steps[flow.step_index].kind != "wait_for":
            return
        if flow.task is None:
            self._dispatch_step(state, flow, new_attempt=False)
        else:
            flow.recheck = True
