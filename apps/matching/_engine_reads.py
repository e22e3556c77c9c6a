"""The engine's reads: flows loaded from the store on demand, ``describe`` and ``list_flows``
answered by helper processes straight from the store, and the engine's statistics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import otp

from ._engine_commits import EngineCommits
from ._engine_forward import forward, known_owner, lease_owner, remember_owner
from ._engine_state import MAX_LIST_LIMIT, EngineStatistics, _err, _Flow, _Loaded, _ok, _Rpc, _State
from ._errors import ConfigurationError, FlowNotFound, MatchingError
from ._store import FLOW_STATUSES, FlowRecord, StoreError, StoreServer

__all__ = ["EngineReads"]


class EngineReads(EngineCommits):
    """The ``FlowEngine``'s reads (a mixin of its callbacks' helpers)."""

    def _with_flow(
        self,
        state: _State,
        flow_id: str,
        then: Callable[[_Flow | None], None],
        request: tuple[otp.From, tuple[Any, ...]] | None = None,
    ) -> None:
        """Call ``then`` with the flow, loaded from the store if it is not in memory (None if
        it is not stored either). A running flow not in memory whose pending row another
        server leases is not held here: ``request`` (the caller and its call, when given) goes
        to ``forward``; without one, ``then`` gets a copy of the flow as stored."""
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
        server_id = options.server_id if options.forward is not None else None

        def load() -> None:
            otp.spawn_link(_load, options.store, flow_id, me, server_id)

        self._after_commit(state, load)

    def _loaded(
        self, state: _State, flow_id: str, record: FlowRecord | None, owner: str | None = None
    ) -> None:
        waiting = state.loading.pop(flow_id, [])
        if record is not None and owner is not None and flow_id not in state.flows:
            self._owned_elsewhere(state, record, owner, waiting)
            return
        if record is not None and flow_id not in state.flows:
            flow = _Flow.from_record(record)
            state.flows[flow_id] = flow
            if flow.running:  # (only when it was started by another engine: adopt it)
                self._advance(state, flow)
        for then, _ in waiting:
            then(state.flows.get(flow_id))
        flow_or_none = state.flows.get(flow_id)
        if flow_or_none is not None:
            self._maybe_evict(state, flow_or_none)

    def _owned_elsewhere(
        self,
        state: _State,
        record: FlowRecord,
        owner: str,
        waiting: list[tuple[Callable[[_Flow | None], None], Any]],
    ) -> None:
        """The running flow ``record`` is ``owner``'s: its calls go there (``_engine_forward``)."""
        remember_owner(state, record.flow_id, owner)
        for then, request in waiting:
            if request is None:
                then(_Flow.from_record(record))  # (a copy, not held: for a look at it)
            else:
                caller, call = request
                forward(state, caller, call, record.flow_id, owner)

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
        self._after_commit(state, lambda: self._read(state, _list, from_, flow_type, status, limit))

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
            dispatch_reasons=dict(sorted(state.routed.items())),
        )


async def _load(store: Any, flow_id: str, engine: otp.Pid, server_id: str | None) -> None:
    """Read the flow, and, with ``server_id`` (the engine may forward), who leases a running
    one's step if not this server."""
    record = await StoreServer.get_flow(flow_id, server=store, timeout=None)
    owner = None
    if server_id is not None and record is not None and record.status == "running":
        rows = await StoreServer.pending(flow_id, server=store, timeout=None)
        owner = lease_owner(rows, server_id, time.time())
    otp.send(engine, _Loaded(flow_id, record, owner))


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
