"""The engine's reads: ``describe`` and ``list_flows`` answered by helper processes straight
from the store, and the engine's statistics (flows loaded on demand: ``_engine_leases``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import otp

from ._engine_family import family
from ._engine_leases import EngineLeases
from ._engine_state import MAX_LIST_LIMIT, EngineStatistics, _err, _ok, _Rpc, _State
from ._errors import ConfigurationError, FlowNotFound, MatchingError
from ._store import FLOW_STATUSES, FlowRecord, StoreError, StoreServer

__all__ = ["EngineReads"]


class EngineReads(EngineLeases):
    """The ``FlowEngine``'s reads (a mixin of its callbacks' helpers)."""

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
            takeovers=state.takeovers,
            redeliveries=state.redeliveries,
            moved=state.moved,
            server_id=state.options.server_id,
        )


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
    description.update(await family(store, record, attempts, dispatches))
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
