"""How the engine makes its decisions durable: records collected in a pass over the mailbox,
committed as one batch at a time through the ``StoreServer`` (group commit, answered with
``BatchCommitted``), and the actions waiting for them (a flow's next move waits for its own
cause only; dispatch records wait for nobody).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import otp

from ._dispatch import Completed, Failed, Lost, NotDispatched, Task
from ._engine_state import _Flow, _FlushRecords, _Pass, _Rpc, _Settle, _State
from ._store import (
    AttemptRecord,
    DispatchRecord,
    PendingStep,
    StoreConflict,
    StoreError,
    StoreServer,
    WriteBatch,
)
from ._store_records import trusted_builder

__all__ = ["EngineCommits"]

#: Build the engine's own records (``trusted``: no validators run; several per Step).
_new_pending_step = trusted_builder(PendingStep)
_new_dispatch_record = trusted_builder(DispatchRecord)


class EngineCommits:
    """The ``FlowEngine``'s commit machinery (a mixin of its callbacks' helpers)."""

    # (defined by EngineSteps and EngineRpcs, which FlowEngine mixes in)
    def _advance(self, state: _State, flow: _Flow) -> None:
        raise NotImplementedError

    def _rpc_outcome(
        self, state: _State, call: _Rpc, outcome: Completed | Failed | NotDispatched | Lost
    ) -> None:
        raise NotImplementedError

    def _next(self, state: _State) -> otp.NoReply:
        """Carry on; with records something waits for and no commit running, commit once the
        mailbox is empty: at once if it is now (``otp.message_queue_len``, as Erlang's ``after
        0`` looks: a lone caller's batch waits for no other pass of the scheduler; the engine's
        mailbox, also where its handling runs in another task), else after
        taking what waits (a zero timeout); at once past ``max_batch`` records. Dispatch
        records alone wait ``dispatch_record_delay`` (or a batch that goes before)."""
        building = state.building
        if state.committing is None and building.size:
            if building.size >= state.options.max_batch:
                self._flush(state)
            elif building.urgent or building.actions:
                if _waiting(state):
                    return state.carry_on_now
                if not _put_off(state):
                    self._flush(state)
            elif not state.record_timer:
                state.record_timer = True
                otp.send_after(state.options.dispatch_record_delay, state.me, _FlushRecords())
        elif state.committing is None and building.actions:
            if _waiting(state):
                return state.carry_on_now
            if not _put_off(state):
                self._flush(state)
        return state.carry_on

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
        batch = done.sent = done.batch()
        batch.owner = state.options.server_id  # (fenced: refused once another server took a flow)
        StoreServer.commit_nowait(batch, state.me, len(batch), server=state.options.store)

    def _refused(self, state: _State, error: StoreError) -> None:
        """The store refused the batch being committed. A conflict on one flow means another
        server took it over (this one lost its lease: the other leases its step, or wrote it
        already): drop that flow and send the batch again without it. Anything else crashes
        the engine (its restart recovers from the store).
        """
        done = state.committing
        flow_id = error.details.get("flow_id") if isinstance(error, StoreConflict) else None
        if done is None or done.sent is None or not isinstance(flow_id, str):
            raise error
        batch = _without(done.sent, flow_id)
        if len(batch) == len(done.sent):
            raise error  # (nothing of that flow in it: not a conflict this engine can settle)
        done.sent = batch
        self._moved(state, flow_id)
        StoreServer.commit_nowait(batch, state.me, len(batch), server=state.options.store)

    def _moved(self, state: _State, flow_id: str) -> None:
        raise NotImplementedError  # (EngineLeases)

    def _committed(self, state: _State, size: int) -> None:
        done = state.committing
        state.committing = None
        state.commits += 1
        state.records_committed += size
        state.largest_batch = max(state.largest_batch, size)
        if done is not None:
            for flow in done.created.values():
                if flow.unsaved is done:
                    flow.unsaved = None
            for flow in done.dirty.values():
                if flow.unsaved is done:
                    flow.unsaved = None
            for action in done.actions:
                action()
        building = state.building
        if building.urgent or building.actions or building.size >= state.options.max_batch:
            self._flush(state)  # what came while that batch was being committed: one group

    def _after_commit(self, state: _State, action: Callable[[], None]) -> None:
        """Run ``action`` once everything decided so far is committed, dispatch records
        included (at once if it is): for reads from the store."""
        building = state.building
        if building.size or building.actions:
            target = building
        elif state.committing is not None:
            target = state.committing
        else:
            action()
            return
        target.actions.append(action)

    def _after_flow(self, state: _State, flow: _Flow, action: Callable[[], None]) -> None:
        """Run ``action`` once what ``flow`` decided so far is committed (at once if it is):
        what a flow does next waits for its own cause only, not for other flows' records nor
        for dispatch records."""
        target = flow.unsaved
        if target is None:
            action()
        else:
            self._hold(state, flow, target, action)

    def _hold(self, state: _State, flow: _Flow, target: _Pass, action: Callable[[], None]) -> None:
        flow.holds += 1

        def run() -> None:
            flow.holds -= 1
            action()
            self._maybe_evict(state, flow)

        target.actions.append(run)

    def _dirty(self, state: _State, flow: _Flow) -> None:
        if flow.moved:
            return  # (another server's now: what this engine still learns of it is not kept)
        flow.updated_at = time.time()
        building = state.building
        flow.unsaved = building
        if flow.flow_id not in building.dirty:
            building.dirty[flow.flow_id] = flow
            building.size += 1
            building.urgent += 1

    def _attempt(self, state: _State, record: AttemptRecord) -> None:
        state.building.attempts.append(record)
        state.building.size += 1
        state.building.urgent += 1

    def _pending_put(self, state: _State, flow: _Flow, not_before: float = 0.0) -> None:
        step = flow.spec.steps[flow.step_index]
        options = state.options
        # (leased to this server: the flow is ours, and no other server may claim the step
        # while ``matching_leases`` renews the lease)
        pending = _new_pending_step(
            flow.flow_id, flow.step_index, step.name, flow.execution_id(),
            flow.attempt, options.server_id, time.time() + options.lease_seconds, not_before,
        )  # fmt: skip
        state.building.pending_put[pending.key] = pending
        state.building.size += 1
        state.building.urgent += 1

    def _pending_done(self, state: _State, flow: _Flow) -> None:
        state.building.pending_done.append((flow.flow_id, flow.step_index))
        state.building.size += 1
        state.building.urgent += 1

    def _maybe_evict(self, state: _State, flow: _Flow) -> None:
        if (
            not flow.running
            and not flow.waiters
            and not flow.rpcs
            and not flow.holds
            and state.flows.get(flow.flow_id) is flow
        ):
            del state.flows[flow.flow_id]

    def _dispatch_record(
        self,
        state: _State,
        flow: _Flow,
        task: Task,
        queue: str,
        reason: str,
        worker_id: str | None,
    ) -> None:
        record = _new_dispatch_record(
            flow.flow_id,
            task.delivery,
            task.kind,
            task.name,
            task.attempt,
            queue,
            reason,
            worker_id,
            time.time(),
        )
        state.building.dispatches.append(record)
        state.building.size += 1


def _without(batch: WriteBatch, flow_id: str) -> WriteBatch:
    """``batch`` without the records of flow ``flow_id``."""
    return WriteBatch(
        flows_upserted=[r for r in batch.flows_upserted if r.flow_id != flow_id],
        attempts=[r for r in batch.attempts if r.flow_id != flow_id],
        dispatches=[r for r in batch.dispatches if r.flow_id != flow_id],
        pending_put=[r for r in batch.pending_put if r.flow_id != flow_id],
        pending_done=[k for k in batch.pending_done if k[0] != flow_id],
        flows_created=[r for r in batch.flows_created if r.flow_id != flow_id],
        owner=batch.owner,
    )


def _put_off(state: _State) -> bool:
    """Whether the commit the engine's handling in another task would start now is left to
    the engine's own pass (one ``_Settle`` sent): while anything it dispatched is still in
    flight, whose outcome may come any moment (an RPC's outcome beside other calls). There
    it commits with every outcome and call of its scheduling batch, in one group: each
    handling committing its own (a few records) made a commit an RPC, or a Step, under load
    (issue 15). A lone caller's Step or RPC, nothing else in flight, commits where it is
    handled."""
    if not state.handing or not state.deliveries:
        return False
    if not state.settle_sent:
        state.settle_sent = True
        otp.send(state.me, _Settle())
    return True


def _waiting(state: _State) -> int:
    """How many messages wait in the engine's mailbox (its own handling asks its own, which
    costs less than naming it)."""
    return otp.message_queue_len(state.me) if state.handing else otp.message_queue_len()
