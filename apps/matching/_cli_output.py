"""What ``python -m apps.matching`` prints: JSON values (``--json``) and human tables, as lists
of lines (pure functions: the CLI writes them)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._model import FlowDescription, FlowSummary, QueueSummary

__all__ = ["description_lines", "dumps", "flows_lines", "queues_lines", "record"]


def dumps(value: Any) -> str:
    """One line of JSON; what JSON has no type for (bytes, atoms, sets) is written as its
    repr."""
    return json.dumps(value, default=repr, ensure_ascii=False)


def record(value: FlowDescription | FlowSummary | QueueSummary) -> dict[str, Any]:
    """A value of the client as the dict ``--json`` prints (its fields by name)."""
    return attrs.asdict(value, recurse=False)


def description_lines(d: FlowDescription) -> list[str]:
    """``describe``: the flow's fields (and the parent Step that started it, for a SubFlow's
    child), then its attempts, the child flows its SubFlow steps started, its WaitFor checks
    and its dispatches (with the routing reason of each) as tables."""
    lines = [
        f"{label + ':':<15}{value}"
        for label, value in (
            ("flow", d.flow_id),
            ("type", d.flow_type),
            ("status", d.status.value),
            ("step", d.step_index),
            ("sticky worker", d.sticky_worker or "-"),
            ("created", _time(d.created_at)),
            ("updated", _time(d.updated_at)),
            ("args", dumps(list(d.args))),
            ("state", dumps(dict(d.state))),
            ("result", dumps(d.result)),
            ("error", "-" if d.error is None else dumps(dict(d.error))),
            ("parent", _parent(d.parent)),
        )
    ]
    attempts = [
        (a.get("step"), a.get("attempt"), a.get("status"), a.get("worker_id"),
         _time(a.get("started_at")), _error(a.get("error")))
        for a in d.attempts
    ]  # fmt: skip
    dispatches = [
        (x.get("delivery"), x.get("kind"), x.get("name"), x.get("attempt"), x.get("queue"),
         x.get("reason"), x.get("worker_id"), _time(x.get("at")))
        for x in d.dispatches
    ]  # fmt: skip
    lines += ["", "attempts:"]
    lines += _table(("STEP", "ATTEMPT", "STATUS", "WORKER", "STARTED", "ERROR"), attempts)
    if d.children:
        children = [
            (c.get("step"), c.get("attempt"), c.get("flow_id"), c.get("flow_type"),
             c.get("status"))
            for c in d.children
        ]  # fmt: skip
        lines += ["", "children:"]
        lines += _table(("STEP", "ATTEMPT", "FLOW", "TYPE", "STATUS"), children)
    if d.checks:
        checks = [
            (c.get("step"), c.get("attempt"), c.get("not_yet"), _time(c.get("last_at")))
            for c in d.checks
        ]
        lines += ["", "wait_for checks:"]
        lines += _table(("STEP", "ATTEMPT", "NOT_YET", "LAST"), checks)
    lines += ["", "dispatches:"]
    header = ("DELIVERY", "KIND", "NAME", "ATTEMPT", "QUEUE", "REASON", "WORKER", "AT")
    return lines + _table(header, dispatches)


def flows_lines(rows: Sequence[FlowSummary]) -> list[str]:
    """``list``: one line per flow."""
    return _table(
        ("FLOW", "TYPE", "STATUS", "CREATED", "UPDATED"),
        [
            (r.flow_id, r.flow_type, r.status.value, _time(r.created_at), _time(r.updated_at))
            for r in rows
        ],
    )


def queues_lines(queues: Sequence[QueueSummary]) -> list[str]:
    """``queues``: one line per queue, its streams by state, backlog and declines."""
    return _table(
        ("QUEUE", "KIND", "IDLE", "OFFERED", "BUSY", "BACKLOG", "WORKERS", "DECLINES"),
        [
            (q.name, q.kind, q.idle, q.offered, q.busy, q.waiting, q.workers, q.declines)
            for q in queues
        ],
    )


def _time(at: Any) -> str:
    if type(at) not in (int, float):
        return "-"
    moment = datetime.datetime.fromtimestamp(at, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _parent(link: Any) -> str:
    if not isinstance(link, Mapping):
        return "-"
    return (
        f"{link.get('flow_id')} (step {link.get('step')!r} #{link.get('step_index')},"
        f" attempt {link.get('attempt')})"
    )


def _error(error: Any) -> str:
    if not isinstance(error, Mapping):
        return "-"
    return f"{error.get('type', '?')}: {error.get('message', '')}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(header)] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return lines if rows else [*lines, "(none)"]
