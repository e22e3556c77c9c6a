"""The engine's side of the direct routes (``_matcher_routes``): a fresh dispatch goes straight
to the queue the matcher publishes for it, without waking the matcher (issue 15).

The hard edge is a queue that dies with a dispatch sent to it straight: nothing else knows of
that dispatch. So the engine monitors each queue it sends to (one monitor per queue, not per
dispatch) and keeps the deliveries it sent there until a later ``Routed`` shows they left it
(delivered, or routed on by the matcher); if the queue dies abnormally first, each is ``Lost``
before output (dispatched again, consuming no attempt, and logged as a redelivery), as
``_engine_remote`` does for a server that goes down. A queue that stops normally hands its
waiting dispatches back to the matcher first (``QueueBook.hand_back``): nothing is lost then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

import otp
from otp import ets

from ._dispatch import Dispatch, Lost, Routed
from ._engine_remote import lost_with
from ._matcher_routes import routes_table
from ._store_records import trusted_builder

__all__ = ["DirectDeliveries"]

#: Builds the ``Routed`` of each dispatch sent straight (every field, in order; no frozen
#: ``__init__``, as ``_engine_rpcs._new_task``).
_new_routed = trusted_builder(Routed)
#: Routing reasons that leave a dispatch where it is (its queue still holds it).
_STAYS = frozenset({"declined_no_capacity"})


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
    #: The engine's handling runs in another process's task now (``_engine_handoff``): a
    #: queue not watched yet gets the dispatch through the matcher (a monitor must be the
    #: engine's own).
    elsewhere: bool = False

    def submit(self, dispatch: Dispatch, in_flight: Mapping[int, Any]) -> Routed | None:
        """Send ``dispatch`` to its queue if a direct route names one, and return the routing
        decision to record (as the matcher would have sent it); else submit it to the matcher
        (a cast) and return None. Never blocks."""
        found = self._route(dispatch)
        if found is None or (self.elsewhere and found[0] not in self.watched):
            otp.cast(self.matcher, dispatch)
            return None
        pid, handle, routed = found
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
        if handle is not None:
            handle.dispatch(dispatch)  # (its queue's handling, here when it is free)
        else:
            otp.send(pid, dispatch)
        return routed

    def _route(self, dispatch: Dispatch) -> tuple[otp.Pid, Any, Routed] | None:
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
        _, pid, handle = found[0]
        return pid, handle, _new_routed(dispatch.task.delivery, key, reason, sticky, None)

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
            lost.append(lost_with(f"queue {name}", reason, delivery, target, name))
        return lost
