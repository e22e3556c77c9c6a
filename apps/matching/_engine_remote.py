"""The engine's deliveries that run on other servers (MULTISERVER.md, part C).

A matcher that forwards a dispatch to another server's matcher tells the origin engine
``Routed(delivery, "node:<node>", "forwarded")`` (``_matcher_remote``); from then on the
delivery's queue, stream and worker are on that node, and its outcome comes from there. If that
node goes down first, nothing would ever come: so the engine watches it (``otp.monitor_node``)
and, when it goes, treats each of its deliveries still in flight as ``Lost`` before any output
(dispatched again, consuming no attempt, and logged as a redelivery).

On one server nothing is ever forwarded: the engine's cost is one comparison per ``Routed``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

import otp

from ._dispatch import Lost, Routed

__all__ = ["RemoteDeliveries"]

logger = logging.getLogger("apps.matching")

_PREFIX = "node:"


@attrs.define(eq=False)
class RemoteDeliveries:
    """delivery -> (node, worker id if known) for the deliveries forwarded to another node,
    and the nodes watched."""

    where: dict[int, tuple[str, str | None]] = attrs.Factory(dict)
    watched: set[str] = attrs.Factory(set)

    def routed(self, routed: Routed, in_flight: Mapping[int, Any]) -> None:
        """Note a routing decision (called for every ``Routed`` the engine gets)."""
        where = self.where
        if routed.reason == "forwarded" and routed.queue.startswith(_PREFIX):
            node = routed.queue[len(_PREFIX) :]
            where[routed.delivery] = (node, routed.worker_id)
            if node not in self.watched:
                self.watched.add(node)
                otp.monitor_node(node)
            if len(where) > 2 * len(in_flight) + 64:
                # The deliveries that ended are forgotten here now and then, not one by one
                # (their outcomes need no look-up here).
                self.where = {d: w for d, w in where.items() if d in in_flight}
        elif where and routed.worker_id is not None and routed.delivery in where:
            where[routed.delivery] = (where[routed.delivery][0], routed.worker_id)

    def node_down(self, node: str, in_flight: Mapping[int, Any]) -> list[Lost]:
        """``node`` went down: a ``Lost`` (before output) for each delivery of ours still in
        flight there."""
        self.watched.discard(node)
        lost = []
        for delivery, (on, worker_id) in list(self.where.items()):
            if on != node:
                continue
            del self.where[delivery]
            target = in_flight.get(delivery)
            if target is None:
                continue
            task = getattr(target, "task", None)
            logger.warning(
                "matching engine: node %s went down with delivery %d (%s %r of flow %r);"
                " redelivery: it is dispatched again, consuming no attempt",
                node,
                delivery,
                getattr(task, "kind", "task"),
                getattr(task, "name", "?"),
                getattr(task, "flow_id", "?"),
            )
            lost.append(Lost(delivery, worker_id or f"node:{node}", after_output=False))
        return lost
