"""The engine's deliveries that run on other servers (MULTISERVER.md, part C).

A matcher that forwards a dispatch to another server's matcher tells the origin engine
``Routed(delivery, "node:<node>", "forwarded")`` (``_matcher_remote``); from then on the
delivery's queue, stream and worker are on that node, and its outcome comes from there. If
that server goes first, nothing would ever come: so the engine monitors that node's matcher
(``otp.monitor(("matching_matcher", node))``, which also ends with ``noconnection`` when the
node goes down) and, when it goes, treats each of its deliveries still in flight there as
``Lost`` before any output (dispatched again, consuming no attempt, and logged as a
redelivery). The matcher rather than the node: a server whose application stops (or whose
matcher restarts, taking its queues along) while its node runs on would leave the dispatches
waiting there unanswered too. A call a worker there had accepted may still end and report
after that: its outcome comes late and is ignored (at least once, as after any ``Lost``).

On one server nothing is ever forwarded: the engine's cost is one comparison per ``Routed``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

import otp

from ._dispatch import Lost, Routed
from ._matcher import MATCHER

__all__ = ["RemoteDeliveries", "lost_with"]

logger = logging.getLogger("apps.matching")

_PREFIX = "node:"


@attrs.define(eq=False)
class RemoteDeliveries:
    """delivery -> (node, worker id if known) for the deliveries forwarded to another node,
    and the monitors of those nodes' matchers."""

    where: dict[int, tuple[str, str | None]] = attrs.Factory(dict)
    watched: dict[str, otp.Ref] = attrs.Factory(dict)
    monitors: dict[otp.Ref, str] = attrs.Factory(dict)

    def routed(self, routed: Routed, in_flight: Mapping[int, Any]) -> None:
        """Note a routing decision (called for every ``Routed`` the engine gets)."""
        where = self.where
        if routed.reason == "forwarded" and routed.queue.startswith(_PREFIX):
            node = routed.queue[len(_PREFIX) :]
            where[routed.delivery] = (node, routed.worker_id)
            if node not in self.watched:
                ref = otp.monitor((MATCHER, node))
                self.watched[node] = ref
                self.monitors[ref] = node
            if len(where) > 2 * len(in_flight) + 64:
                # The deliveries that ended are forgotten here now and then, not one by one
                # (their outcomes need no look-up here).
                self.where = {d: w for d, w in where.items() if d in in_flight}
        elif where and routed.worker_id is not None and routed.delivery in where:
            where[routed.delivery] = (where[routed.delivery][0], routed.worker_id)

    def down(self, ref: otp.Ref, reason: Any, in_flight: Mapping[int, Any]) -> list[Lost]:
        """The matcher of a node watched went (``ref`` its monitor; any other ref: nothing):
        a ``Lost`` (before output) for each delivery of ours still in flight there."""
        node = self.monitors.pop(ref)
        del self.watched[node]
        lost = []
        for delivery, (on, worker_id) in list(self.where.items()):
            if on != node:
                continue
            del self.where[delivery]
            target = in_flight.get(delivery)
            if target is None:
                continue
            what = f"the server on node {node}"
            lost.append(lost_with(what, reason, delivery, target, worker_id or f"node:{node}"))
        return lost


def lost_with(what: str, reason: Any, delivery: int, target: Any, worker_id: str) -> Lost:
    """``what`` (a server, a queue) went down with ``delivery`` (its flow or RPC call
    ``target``) in flight: logged as a redelivery, and the ``Lost`` (before output) that
    dispatches it again."""
    task = getattr(target, "task", None)
    logger.warning(
        "matching engine: %s went down (%s) with delivery %d (%s %r of flow %r); redelivery:"
        " it is dispatched again, consuming no attempt",
        what,
        otp.reason_text(reason),
        delivery,
        getattr(task, "kind", "task"),
        getattr(task, "name", "?"),
        getattr(task, "flow_id", "?"),
    )
    return Lost(delivery, worker_id, after_output=False)
