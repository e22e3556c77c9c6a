"""Direct routes: a dispatch whose queue the matcher would pick at once goes there without
waking the matcher (issue 15: the matcher's wake-up was a hop on every Step's and RPC's path).

The matcher publishes, in an ``otp.ets`` table named after it (``routes_table``), the queues it
would send a fresh dispatch straight to: a sticky worker's queue while that worker has a stream
there and is not draining (``worker:<id>``), and a flow type's queue while it has a stream
(``flow:<type>``). Every other case (no such stream, exclusions, another server's streams,
bad names) still goes through the matcher, which applies the seed's rules as before. Erlang's
``pg`` and ``global`` publish their state the same way, for reads that wake nobody.

The engine submits with :meth:`DirectDeliveries.submit`. The hard edge is a queue that dies
with a dispatch sent to it straight: nothing else knows of that dispatch. So the engine
monitors each queue it sends to (one monitor per queue, not per dispatch) and keeps the
deliveries it sent there until a later ``Routed`` shows they left it (delivered, or forwarded
on); if the queue dies abnormally first, each is ``Lost`` before output (dispatched again,
consuming no attempt, and logged). A queue that stops normally hands its waiting dispatches
back to the matcher first (``QueueBook.hand_back``), so nothing is lost then either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

import otp
from otp import ets

from ._dispatch import Dispatch, Lost, Routed

__all__ = ["DirectDeliveries", "open_routes", "publish_route", "routes_table"]

logger = logging.getLogger("apps.matching")

#: Routing reasons that leave a dispatch where it is (its queue still holds it).
_STAYS = frozenset({"declined_no_capacity"})


def routes_table(matcher: Any) -> str | None:
    """The name of the routes table of the matcher registered as ``matcher`` (None for a pid:
    an unregistered matcher publishes no routes)."""
    return f"{matcher}.routes" if isinstance(matcher, str) else None


def open_routes(matcher_name: str | None) -> Any:
    """(In the matcher's ``init``.) Its routes table, owned by it (gone with it), or None for
    an unregistered matcher."""
    name = routes_table(matcher_name)
    if name is None:
        return None
    return ets.new(name, type=ets.SET, access=ets.PROTECTED, named=True)


def publish_route(table: Any, queue_name: str, pid: otp.Pid | None) -> None:
    """(In the matcher.) ``queue_name`` is a direct route to ``pid`` now, or none (None)."""
    if table is None:
        return
    if pid is None:
        ets.delete(table, queue_name)
    else:
        ets.insert(table, (queue_name, pid))


@attrs.define(eq=False)
class DirectDeliveries:
    """The engine's side: the matcher's routes table (found by name when first needed), the
    deliveries it sent straight to a queue and that may still be there, and its monitors of
    those queues."""

    matcher: Any
    table: Any = None
    #: delivery -> (queue pid, queue name), until a later ``Routed`` shows it left.
    where: dict[int, tuple[otp.Pid, str]] = attrs.Factory(dict)
    watched: dict[otp.Pid, otp.Ref] = attrs.Factory(dict)
    monitors: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)

    def submit(self, dispatch: Dispatch, in_flight: Mapping[int, Any]) -> Routed | None:
        """Send ``dispatch`` to its queue if a direct route names one, and return the routing
        decision to record (as the matcher would have sent it); else submit it to the matcher
        (a cast) and return None. Never blocks."""
        found = self._route(dispatch)
        if found is None:
            otp.cast(self.matcher, dispatch)
            return None
        pid, routed = found
        delivery = routed.delivery
        where = self.where
        where[delivery] = (pid, routed.queue)
        if pid not in self.watched:
            ref = otp.monitor(pid)
            self.watched[pid] = ref
            self.monitors[ref] = pid
        if len(where) > 2 * len(in_flight) + 64:
            # Deliveries that ended are forgotten now and then, not one by one (an outcome
            # needs no look-up here).
            self.where = {d: w for d, w in where.items() if d in in_flight}
        otp.send(pid, dispatch)
        return routed

    def _route(self, dispatch: Dispatch) -> tuple[otp.Pid, Routed] | None:
        table = self.table
        if table is None:
            name = routes_table(self.matcher)
            if name is None:
                return None
            table = self.table = ets.whereis(name)
            if table is None:
                return None
        sticky = dispatch.sticky_worker
        if sticky is None:
            key = f"flow:{dispatch.task.flow_type}"
            reason = "flow_queue"
        elif sticky in dispatch.excluded:
            return None
        else:
            key = f"worker:{sticky}"
            reason = "sticky"
        try:
            found = ets.lookup(table, key)
        except ets.EtsError:
            self.table = None  # the matcher went (its successor publishes a new table)
            return None
        if not found:
            return None
        return found[0][1], Routed(dispatch.task.delivery, key, reason, sticky)

    def routed(self, routed: Routed) -> None:
        """Note a routing decision that came by message: a dispatch sent straight to a queue
        and now delivered or routed on has left that queue."""
        if self.where and routed.reason not in _STAYS:
            self.where.pop(routed.delivery, None)

    def down(self, ref: otp.Ref, reason: Any, in_flight: Mapping[int, Any]) -> list[Lost]:
        """A queue watched went (``ref`` its monitor). Stopped normally, it handed back what
        waited in it; otherwise each delivery of ours still in it is ``Lost`` before output."""
        pid = self.monitors.pop(ref)
        del self.watched[pid]
        lost = []
        for delivery, (queue, name) in list(self.where.items()):
            if queue != pid:
                continue
            del self.where[delivery]
            target = in_flight.get(delivery)
            if target is None or reason == otp.NORMAL:
                continue
            task = getattr(target, "task", None)
            logger.warning(
                "matching engine: queue %s went down (%s) with delivery %d (%s %r of flow %r)"
                " sent straight to it; redelivery: it is dispatched again, consuming no attempt",
                name,
                otp.reason_text(reason),
                delivery,
                getattr(task, "kind", "task"),
                getattr(task, "name", "?"),
                getattr(task, "flow_id", "?"),
            )
            lost.append(Lost(delivery, name, after_output=False))
        return lost
