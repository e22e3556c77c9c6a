"""A SubFlow's family as the store holds it: the child's deterministic id, the parent link
pinned in the child's definition, and what ``describe`` shows of both (a flow's parent, its
children, its WaitFor checks).

The link lives in the child's pinned ``definition`` (key ``"parent"``), which is fixed when the
child starts, as the link is: no column of the store's schema changes for it. A parent finds
its children by their ids, derived from its steps' execution ids and attempts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from ._model import MAX_NAME_LENGTH
from ._store import AttemptRecord, DispatchRecord, FlowRecord, StoreServer

__all__ = ["PARENT_KEY", "child_flow_id", "family", "parent_link"]

#: The key of the parent link in a child's pinned definition.
PARENT_KEY = "parent"


def child_flow_id(execution_id: str, attempt: int) -> str:
    """The id of the child flow a SubFlow step's ``attempt`` starts: the same for a redelivery
    of that attempt (so it never starts two), another for the next attempt. Readable while it
    fits a flow id (``<execution_id>/<attempt>``), else a digest of it."""
    readable = f"{execution_id}/{attempt}"
    if len(readable) <= MAX_NAME_LENGTH:
        return readable
    return "subflow-" + hashlib.sha256(readable.encode()).hexdigest()


def parent_link(definition: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parent Step a child flow was started by (``flow_id``, ``step_index``, ``step``,
    ``attempt``), from its pinned definition; None for a flow no Step started."""
    link = definition.get(PARENT_KEY)
    if not isinstance(link, Mapping) or type(link.get("flow_id")) is not str:
        return None
    return dict(link)


async def family(
    store: Any,
    record: FlowRecord,
    attempts: Sequence[AttemptRecord],
    dispatches: Sequence[DispatchRecord],
) -> dict[str, Any]:
    """``describe``'s ``parent``, ``children`` (one per SubFlow attempt that started one) and
    ``checks`` (a WaitFor's "not yet" answers per attempt, from its dispatch records)."""
    steps = record.definition.get("steps")
    children: list[dict[str, Any]] = []
    if isinstance(steps, list):
        tried: dict[int, set[int]] = {}
        for a in attempts:
            tried.setdefault(a.step_index, set()).add(a.attempt)
        if record.status == "running":
            for pending in await StoreServer.pending(record.flow_id, server=store, timeout=None):
                tried.setdefault(pending.step_index, set()).add(pending.attempt)
        for index, entry in enumerate(steps[: record.step_index + 1]):
            if not isinstance(entry, Mapping) or entry.get("kind") != "subflow":
                continue
            execution_id = f"{record.flow_id}/{index}/{entry.get('name')}"
            for attempt in sorted(tried.get(index, ())):
                child_id = child_flow_id(execution_id, attempt)
                child = await StoreServer.get_flow(child_id, server=store, timeout=None)
                if child is None:
                    continue
                children.append(
                    {
                        "flow_id": child.flow_id,
                        "flow_type": child.flow_type,
                        "status": child.status,
                        "step": entry.get("name"),
                        "step_index": index,
                        "attempt": attempt,
                    }
                )
    checks: dict[tuple[str, int], dict[str, Any]] = {}
    for d in dispatches:
        if d.reason == "not_yet":
            check = checks.setdefault(
                (d.name, d.attempt), {"step": d.name, "attempt": d.attempt, "not_yet": 0}
            )
            check["not_yet"] += 1
            check["last_at"] = d.at
    return {
        "parent": parent_link(record.definition),
        "children": children,
        "checks": list(checks.values()),
    }
