"""Which flows this engine holds: the server whose lease holds a running flow's pending step
owns the flow (MULTISERVER.md, part A), holds it in memory and is the only one that writes it.

The engine takes a flow when it claims its step: at start (``_recover``: the steps it held
before, and on SQLite every step, then every free or expired one), when ``matching_leases``
claims steps (``Claimed``: another server stopped or went silent) and when a call names a
running flow it does not hold (``_with_flow``: a targeted ``claim_flow``; a flow another
server's live lease holds is that server's, and the call goes to ``forward``). Taking a flow
dispatches its current step again (at least once); a flow taken from another server is a
takeover, logged and counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

import otp

from ._engine_commits import EngineCommits
from ._engine_definitions import remember
from ._engine_forward import CHILD_ENDED, forward, known_owner, remember_owner
from ._engine_state import _RUNNING, Claimed, _Flow, _Loaded, _State
from ._engine_waiters import forget_waiter
from ._errors import ConfigurationError
from ._store import Claim, FlowRecord, PendingStep, StoreServer

__all__ = ["RECOVERY_PAGE", "EngineLeases"]

logger = logging.getLogger("apps.matching")

#: Steps one claim takes while the engine starts (it claims until fewer come back).
RECOVERY_PAGE = 1000


class EngineLeases(EngineCommits):
    """The ``FlowEngine``'s flows by lease (a mixin of its callbacks' helpers)."""

    async def _recover(self, state: _State) -> None:
        """(In ``init``.) Take the flows whose steps this server held before (every step on
        an unshared store), then claim every free or expired step, and dispatch each."""
        options = state.options
        me, lease, store = options.server_id, options.lease_seconds, options.store
        adopted = await StoreServer.adopt_leases(me, time.time(), lease, server=store, timeout=None)
        claims: list[tuple[Claim, bool]] = [(claim, True) for claim in adopted]
        while True:
            more = await StoreServer.claim_steps(
                me, time.time(), lease, RECOVERY_PAGE, server=store, timeout=None
            )
            claims.extend((claim, False) for claim in more)
            if len(more) < RECOVERY_PAGE:
                break
        found = []
        for claim, own in claims:
            record = await StoreServer.get_flow(claim.step.flow_id, server=store, timeout=None)
            if record is not None and record.status == _RUNNING:
                found.append((record, claim, own))
        # oldest first, so the definition remembered for a type is its newest flow's
        found.sort(key=lambda entry: entry[0].created_at)
        taken = 0
        for record, claim, own in found:
            if record.flow_id not in state.flows:
                taken += self._take(state, record, claim, recovering=own) is not None
        if taken:
            logger.info("matching engine: recovered %d running flows", taken)

    def _claimed(self, state: _State, claimed: Claimed) -> None:
        """``matching_leases`` claimed steps for this server: take their flows. Who held each
        step before is kept until the flow is taken: a call naming the flow may take it first
        (``_with_flow``: its own claim finds the step leased here already, by this claim). A
        flow such a call took already is told as taken over now."""
        claims = []
        for claim in claimed.claims:
            step = claim.step
            flow = state.flows.get(step.flow_id)
            if flow is None:
                state.claimed_from[step.flow_id] = claim.previous_owner
                claims.append(claim)
            elif flow.claim_untold == (step.step_index, step.attempt):
                flow.claim_untold = None
                self._took_over(state, flow.flow_id, claim.previous_owner, step)
        if claims:
            otp.spawn_link(_load_claimed, state.options.store, claims, state.me)

    def _take(
        self, state: _State, record: FlowRecord, claim: Claim, *, recovering: bool = False
    ) -> _Flow | None:
        """Hold the running flow of ``record`` (its step leased to this server by ``claim``)
        and dispatch its current step (None: its definition is bad, or the step is not its
        current one: the record moved on after the claim, so the flow is not ours)."""
        try:
            flow = _Flow.from_record(record)
        except ConfigurationError:
            logger.exception("matching engine: flow %r has a bad definition", record.flow_id)
            return None
        step = claim.step
        if step.step_index != flow.step_index:
            logger.warning(
                "matching engine: flow %r moved on (step %d) after its step %d was claimed;"
                " it is not this server's",
                flow.flow_id, flow.step_index, step.step_index,
            )  # fmt: skip
            return None
        state.flows[flow.flow_id] = flow
        remember(state, flow.flow_type, flow.spec)
        flow.attempt = step.attempt
        wall = time.time()
        if step.not_before > wall:
            flow.retry_at = trio.current_time() + (step.not_before - wall)
        me, previous = state.options.server_id, claim.previous_owner
        if previous == me and not recovering:
            # Leased here before this claim, so by ``matching_leases``, whose ``Claimed`` names
            # who held it (the step may have run there: the takeover must be told either way).
            previous = state.claimed_from.pop(flow.flow_id, me)
            if previous == me:  # (that ``Claimed`` is still on its way)
                flow.claim_untold = (step.step_index, step.attempt)
        if not recovering and previous != me:
            self._took_over(state, flow.flow_id, previous, step)
        self._advance(state, flow)
        return flow

    def _took_over(
        self, state: _State, flow_id: str, previous: str | None, step: PendingStep
    ) -> None:
        """Count and log the takeover of ``flow_id`` at ``step`` from
        server ``previous`` (None: released by a server that stopped)."""
        state.takeovers += 1
        if previous is not None:
            state.redeliveries += 1
            logger.warning(
                "matching engine: took over flow %s from %s (redelivery of step %d attempt %d)",
                flow_id, previous, step.step_index, step.attempt,
            )  # fmt: skip
        else:
            logger.info(
                "matching engine: took over flow %s released by a server that stopped"
                " (step %d attempt %d)",
                flow_id, step.step_index, step.attempt,
            )  # fmt: skip

    def _moved(self, state: _State, flow_id: str) -> None:
        """Another server took the flow over (a commit of it conflicted: that server leases
        its step, or wrote it already): it holds the flow now.
        Drop it here; its callers are told where it went (``forward``), and what this
        engine still had scheduled for it does nothing (``_Flow.moved``)."""
        state.moved += 1
        flow = state.flows.get(flow_id)
        logger.warning(
            "matching engine: flow %s belongs to another server now (it took the flow over:"
            " this one lost its lease); dropped here",
            flow_id,
        )
        if flow is None:
            return
        del state.flows[flow_id]
        flow.moved = True
        self._end_attempt(state, flow)
        if flow.retry_timer is not None:
            otp.cancel_timer(flow.retry_timer)
            flow.retry_timer = None
        waiters, flow.waiters = flow.waiters, {}
        for key, waiter in waiters.items():
            forget_waiter(state, key, waiter)
            forward(state, waiter.from_, ("result", flow_id, None), flow_id, None)
        if any(step.kind == "subflow" for step in flow.spec.steps):
            # What was refused may be the outcome of a child that ended here (this engine
            # still held the parent, parked): the new owner must read its child (a notice
            # is harmless when no child ended).
            forward(state, None, (CHILD_ENDED, flow_id), flow_id, None)

    def _answer(
        self, state: _State, flow: _Flow, from_: otp.From, answer: Any, request: tuple[Any, ...]
    ) -> None:
        """Answer ``from_`` (once what ``flow`` decided for it is committed), or, if the flow
        moved to another server meanwhile (that commit was refused), forward ``request``."""
        if flow.moved:
            forward(state, from_, request, flow.flow_id, None)
        else:
            otp.reply(from_, answer)

    def _end_attempt(self, state: _State, flow: _Flow) -> None:
        raise NotImplementedError  # (EngineSteps)

    def _with_flow(
        self,
        state: _State,
        flow_id: str,
        then: Callable[[_Flow | None], None],
        request: tuple[otp.From | None, tuple[Any, ...]] | None = None,
    ) -> None:
        """Call ``then`` with the flow, loaded from the store if it is not in memory (None if
        it is not stored either). A running flow not in memory is claimed and held; if another
        server holds it, ``request`` (the caller and its call, or None and a notice) is
        forwarded there, or without one ``then`` gets the flow as stored (not held: to know
        it exists)."""
        flow = state.flows.get(flow_id)
        if flow is not None:
            then(flow)
            return
        if request is not None and (owner := known_owner(state, flow_id)) is not None:
            forward(state, request[0], request[1], flow_id, owner)  # (no store read)
            return
        waiting = state.loading.get(flow_id)
        if waiting is not None:
            waiting.append((then, request))
            return
        state.loading[flow_id] = [(then, request)]
        options, me = state.options, state.me

        def load() -> None:
            otp.spawn_link(
                _load, options.store, flow_id, me, options.server_id, options.lease_seconds
            )

        self._after_commit(state, load)

    def _loaded(self, state: _State, loaded: _Loaded) -> None:
        flow_id, record, claim = loaded.flow_id, loaded.record, loaded.claim
        me = state.options.server_id
        flow = state.flows.get(flow_id)
        if flow is None and record is not None:
            if record.status != _RUNNING:
                if loaded.requested:  # (held while its callers are answered)
                    flow = state.flows[flow_id] = _Flow.from_record(record)
            elif claim is not None and claim.held_by(me):
                flow = self._take(state, record, claim)
        if not loaded.requested:
            state.claimed_from.pop(flow_id, None)  # (taken now, or not this server's)
            if flow is None:
                return
        owner = None if claim is None or claim.held_by(me) else claim.step.lease_owner
        if owner is not None and flow is None:
            remember_owner(state, flow_id, owner)
        for then, request in state.loading.pop(flow_id, []):
            if flow is not None or record is None:
                then(flow)
            elif request is None:
                then(_Flow.from_record(record))
            else:
                caller, call = request
                forward(state, caller, call, flow_id, owner)
        if flow is not None:
            self._maybe_evict(state, flow)


async def _load(store: Any, flow_id: str, engine: otp.Pid, owner: str, lease: float) -> None:
    """Read the flow; if it runs, claim its step, and read it again once the claim holds it
    (what the record says is then this server's to change)."""
    record = await StoreServer.get_flow(flow_id, server=store, timeout=None)
    claim = None
    if record is not None and record.status == _RUNNING:
        claim = await StoreServer.claim_flow(flow_id, owner, time.time(), lease, server=store)
        if claim is None or claim.held_by(owner):
            record = await StoreServer.get_flow(flow_id, server=store, timeout=None)
    otp.send(engine, _Loaded(flow_id, record, claim))


async def _load_claimed(store: Any, claims: list[Claim], engine: otp.Pid) -> None:
    """Read the flows of steps claimed for this server."""
    for claim in claims:
        flow_id = claim.step.flow_id
        record = await StoreServer.get_flow(flow_id, server=store, timeout=None)
        otp.send(engine, _Loaded(flow_id, record, claim, requested=False))
