"""What a client reads about flows and queues: :class:`FlowStatus`, :class:`FlowSummary` (one
flow of ``list_flows``), :class:`QueueSummary` (one queue of ``queues``) and
:class:`FlowDescription` (``describe_flow``: a flow with its attempts, dispatch history, parent
and children)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["FlowDescription", "FlowStatus", "FlowSummary", "QueueSummary"]


class FlowStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@attrs.frozen
class FlowSummary:
    """One line of :meth:`AsyncClient.list_flows`."""

    flow_id: str
    flow_type: str
    status: FlowStatus
    created_at: float
    updated_at: float

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> FlowSummary:
        return cls(
            data["flow_id"],
            data["flow_type"],
            FlowStatus(data["status"]),
            float(data["created_at"]),
            float(data["updated_at"]),
        )


@attrs.frozen
class QueueSummary:
    """One line of :meth:`AsyncClient.list_queues`: a matching queue as the server holds it
    now (queues start on demand and stop when unused).

    Attributes:
        name: The flow type (``kind="flow"``) or the app worker id (``kind="worker"``, the
            queue of sticky routing).
        kind: ``"flow"`` or ``"worker"``.
        streams: Streams registered on it, by state: ``idle`` (waiting for work),
            ``offered`` (a task is out for ACCEPT/DECLINE) and ``busy`` (running a call).
        waiting: Dispatches waiting for a stream (its backlog).
        workers: App worker ids with a stream on it.
        declines: DECLINEs its streams answered since the queue started.
    """

    name: str
    kind: str
    streams: int
    idle: int
    offered: int
    busy: int
    waiting: int
    workers: int
    declines: int

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> QueueSummary:
        return cls(
            str(data["name"]),
            str(data["kind"]),
            *(int(data[key]) for key in _QUEUE_COUNTS),
        )


_QUEUE_COUNTS = ("streams", "idle", "offered", "busy", "waiting", "workers", "declines")


@attrs.frozen
class FlowDescription:
    """:meth:`AsyncClient.describe_flow`: a flow's status, state, attempts and dispatches.

    ``attempts`` and ``dispatches`` are dicts as the server sends them: each attempt has
    ``step``, ``attempt``, ``execution_id``, ``status``, ``worker_id``, ``error``; each
    dispatch has ``delivery``, ``kind``, ``name``, ``attempt``, ``queue``, ``reason``
    (``sticky``, ``flow_queue``, ``fallback_no_stream``, ``fallback_timeout``,
    ``reroute_unknown_name``, ``declined_no_capacity``, ``redispatch_lost``, ``delivered``, and
    ``not_yet`` for a WaitFor check that answered :data:`NOT_YET`) and ``worker_id``.

    ``parent`` is set on a SubFlow's child: ``flow_id``, ``step_index``, ``step``, ``attempt``
    of the parent Step that started it. ``children`` are the child flows this flow's SubFlow
    steps started (one per attempt): ``flow_id``, ``flow_type``, ``status``, ``step``,
    ``step_index``, ``attempt``. ``checks`` count a WaitFor's checks per attempt: ``step``,
    ``attempt``, ``not_yet`` (answers "not yet"), ``last_at``.
    """

    flow_id: str
    flow_type: str
    status: FlowStatus
    args: tuple[Any, ...]
    state: Mapping[str, Any]
    result: Any
    error: Mapping[str, Any] | None
    step_index: int
    sticky_worker: str | None
    created_at: float
    updated_at: float
    attempts: tuple[Mapping[str, Any], ...] = ()
    dispatches: tuple[Mapping[str, Any], ...] = ()
    parent: Mapping[str, Any] | None = None
    children: tuple[Mapping[str, Any], ...] = ()
    checks: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> FlowDescription:
        return cls(
            data["flow_id"],
            data["flow_type"],
            FlowStatus(data["status"]),
            tuple(data.get("args") or ()),
            dict(data.get("state") or {}),
            data.get("result"),
            data.get("error"),
            int(data.get("step_index", 0)),
            data.get("sticky_worker"),
            float(data["created_at"]),
            float(data["updated_at"]),
            tuple(data.get("attempts") or ()),
            tuple(data.get("dispatches") or ()),
            data.get("parent"),
            tuple(data.get("children") or ()),
            tuple(data.get("checks") or ()),
        )
