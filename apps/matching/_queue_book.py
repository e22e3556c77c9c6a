"""The sans-IO core of one matching queue: idle streams, waiting dispatches, declines, waits.

One ``QueueBook`` per queue (a flow type's, or an app worker id's for sticky routing). It does
no I/O: each event method returns the actions the queue actor carries out. The rules are the
seed's "路由和可用性" and "容量和关闭": one call per stream, ``no_capacity`` tries other workers,
``unknown_name`` re-routes (excluding that worker), and the wait ends in the flow-type queue (a
sticky queue) or in ``NotDispatched`` (a flow-type queue). Nothing here consumes an attempt.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from ._dispatch import Capabilities, Dispatch, MatchingLimits

__all__ = ["ForwardToFlow", "OfferStream", "QueueBook", "Reject", "Route"]


# -- actions --------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class OfferStream:
    """Send ``Offer(dispatch)`` to ``stream``."""

    stream: Any
    dispatch: Dispatch


@attrs.frozen(eq=False)
class ForwardToFlow:
    """Hand ``dispatch`` (its wait, exclusions and capacity flag brought up to date) to its
    flow type's queue, for ``reason`` (``fallback_timeout``, ``fallback_no_stream`` or
    ``reroute_unknown_name``); ``worker_id`` is this sticky queue's worker."""

    dispatch: Dispatch
    reason: str
    worker_id: str | None


@attrs.frozen(eq=False)
class Reject:
    """Tell ``dispatch.reply_to``: ``NotDispatched(delivery, reason, message)``."""

    dispatch: Dispatch
    reason: str
    message: str


@attrs.frozen(eq=False)
class Route:
    """Tell ``dispatch.reply_to``: ``Routed(delivery, <this queue>, reason, worker_id)``."""

    dispatch: Dispatch
    reason: str
    worker_id: str | None


Action = OfferStream | ForwardToFlow | Reject | Route

#: How many draining workers without streams a queue remembers (app worker ids change with
#: every worker process, so the set would otherwise only grow).
_DRAINING_KEPT = 4096


# -- state ----------------------------------------------------------------------------------


@attrs.define(eq=False)
class _Waiting:
    seq: int
    dispatch: Dispatch
    enqueued: float
    expiry: float
    #: Workers that declined with ``unknown_name`` (never offered again).
    excluded: set[str]
    #: Workers that declined for capacity, until their ``worker_freed``.
    busy: set[str] = attrs.Factory(set)
    #: Some worker declined for capacity during this dispatch.
    capacity: bool = False
    #: Workers skipped because their advertised capabilities lack the name.
    lacking: set[str] = attrs.Factory(set)
    #: Workers known to be draining on this dispatch's way (never offered it).
    drained: set[str] = attrs.Factory(set)


@attrs.define(eq=False)
class _Stream:
    key: Any
    worker_id: str
    caps: Capabilities
    #: ``idle``, ``offered`` (the dispatch is out for its answer) or ``busy`` (owns a call).
    state: str = "idle"
    offered: _Waiting | None = None
    #: The worker's ``worker_freed`` count when the dispatch was offered (see ``declined``).
    freed_mark: int = 0


@attrs.frozen
class QueueStatistics:
    """What one queue holds: streams by state, and the dispatches waiting (its backlog)."""

    queue: str
    streams: int
    idle: int
    offered: int
    busy: int
    waiting: int
    workers: int
    #: DECLINEs answered to this queue's offers since it started.
    declines: int = 0


class QueueBook:
    """The state of one queue and its rules.

    Args:
        kind: ``"flow"`` (a flow type's queue) or ``"worker"`` (an app worker id's queue,
            for sticky routing).
        name: The flow type, or the app worker id.
        clock: Returns the current time (trio's clock in the actor; anything in tests).
        limits: ``sticky_wait`` (worker queues) and ``max_backlog`` come from here.

    Streams are any hashable keys. Each event method returns the list of actions to carry out,
    in order.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        *,
        clock: Callable[[], float],
        limits: MatchingLimits | None = None,
    ) -> None:
        if kind not in ("flow", "worker"):
            raise ValueError(f"QueueBook.kind must be 'flow' or 'worker' (got {kind!r})")
        self.kind = kind
        self.name = name
        self.queue = f"{kind}:{name}"
        self.limits = limits if limits is not None else MatchingLimits()
        self._clock = clock
        self._streams: dict[Hashable, _Stream] = {}
        self._idle: OrderedDict[Hashable, _Stream] = OrderedDict()
        self._waiting: OrderedDict[int, _Waiting] = OrderedDict()
        self._offered = 0
        self._workers: dict[str, int] = {}
        self._caps: dict[str, Capabilities] = {}
        self._draining: set[str] = set()
        #: ``worker_freed`` notices per worker with streams here (a count).
        self._freed: dict[str, int] = {}
        #: (expiry, seq) of the dispatches left waiting, a heap (with stale entries, dropped
        #: by :meth:`next_expiry`): empty, no wait is watched (the queue skips its timer then).
        self.expiries: list[tuple[float, int]] = []
        self._seq = 0
        self._declines = 0

    # -- looking in ---------------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        """Dispatches in this queue: waiting, or offered and not yet answered."""
        return len(self._waiting) + self._offered

    @property
    def unused(self) -> bool:
        """No stream and no backlog: nothing here is in use (the queue may stop)."""
        return not self._streams and not self._waiting and not self._offered

    def next_expiry(self) -> float | None:
        """When the earliest waiting dispatch's wait ends (call :meth:`expire` then), or None."""
        heap = self.expiries
        while heap:
            expiry, seq = heap[0]
            waiting = self._waiting.get(seq)
            if waiting is not None and waiting.expiry == expiry:
                return expiry
            heapq.heappop(heap)
        return None

    def waiting(self) -> list[Dispatch]:
        """The waiting dispatches, oldest first (offered ones excluded)."""
        return [w.dispatch for w in self._waiting.values()]

    def idle_streams(self) -> list[Any]:
        """The idle streams in the order they get offers."""
        return list(self._idle)

    def offered(self) -> dict[Any, Dispatch]:
        """Stream -> the dispatch offered to it and not yet answered."""
        return {
            s.key: s.offered.dispatch
            for s in self._streams.values()
            if s.state == "offered" and s.offered is not None
        }

    def stream_state(self, stream: Any) -> str | None:
        """``idle``, ``offered``, ``busy``, or None for a stream this queue does not know."""
        entry = self._streams.get(stream)
        return None if entry is None else entry.state

    def statistics(self) -> QueueStatistics:
        states = [s.state for s in self._streams.values()]
        return QueueStatistics(
            queue=self.queue,
            streams=len(states),
            idle=states.count("idle"),
            offered=states.count("offered"),
            busy=states.count("busy"),
            waiting=len(self._waiting),
            workers=len(self._workers),
            declines=self._declines,
        )

    # -- events -------------------------------------------------------------------------------

    def stream_idle(self, stream: Any, worker_id: str, caps: Capabilities) -> list[Action]:
        """``stream`` (of ``worker_id``, advertising ``caps``) registered or finished its call.

        It gets the oldest waiting dispatch it can take, if any."""
        actions: list[Action] = []
        entry = self._streams.get(stream)
        if entry is None:
            entry = _Stream(stream, worker_id, caps)
            self._streams[stream] = entry
            self._workers[worker_id] = self._workers.get(worker_id, 0) + 1
        elif entry.state == "idle":
            return actions
        elif entry.state == "offered":
            # The stream gave up its offer without an answer: the dispatch goes on waiting.
            self._take_back(entry, actions)
        entry.caps = caps
        entry.state = "idle"
        self._caps[worker_id] = caps
        self._idle[stream] = entry
        self._match_stream(entry, actions)
        return actions

    def stream_gone(self, stream: Any) -> list[Action]:
        """``stream`` closed or died. A dispatch offered to it (unanswered) is offered to
        another stream; a call it accepted is the stream's to report as lost."""
        actions: list[Action] = []
        entry = self._streams.pop(stream, None)
        if entry is None:
            return actions
        self._idle.pop(stream, None)
        worker = entry.worker_id
        left = self._workers[worker] - 1
        if left:
            self._workers[worker] = left
        else:
            del self._workers[worker]
            self._caps.pop(worker, None)
            self._freed.pop(worker, None)
            # (a draining worker stays draining: its next stream may come before the news)
        if entry.state == "offered":
            waiting = self._take_back(entry, actions)
            if waiting is not None:
                self._settle(waiting, actions)
        if self.kind == "worker" and not self._streams:
            # The sticky worker has no stream left: its dispatches go to the flow-type queues.
            for waiting in list(self._waiting.values()):
                self._forward(waiting, "fallback_no_stream", actions)
        return actions

    def dispatch(self, dispatch: Dispatch) -> list[Action]:
        """A dispatch arrives; it waits here until a stream takes it or its wait ends (in a
        worker queue: ``limits.sticky_wait`` at most; never past the task's deadline)."""
        actions: list[Action] = []
        now = self._clock()
        task = dispatch.task
        if len(self._waiting) + self._offered >= self.limits.max_backlog:  # (``backlog``)
            actions.append(
                Reject(
                    dispatch,
                    "unavailable",
                    f"queue {self.queue} already holds {self.backlog} dispatches, the most"
                    f" matching.max_backlog={self.limits.max_backlog} allows: {task.kind}"
                    f" {task.name!r} of flow type {task.flow_type!r} was not dispatched; add"
                    " workers or raise matching.max_backlog",
                )
            )
            return actions
        wait = dispatch.wait
        if self.kind == "worker":
            wait = min(wait, self.limits.sticky_wait)
        expiry = now + max(0.0, wait)
        if task.deadline is not None:
            expiry = min(expiry, task.deadline)
        self._seq += 1
        waiting = _Waiting(self._seq, dispatch, now, expiry, set(dispatch.excluded))
        waiting.capacity = dispatch.declined_no_capacity
        if dispatch.drained:
            waiting.drained.update(dispatch.drained)
        if self.kind == "worker":
            worker = self.name
            if not self._streams or worker in self._draining:
                self._forward(waiting, "fallback_no_stream", actions)
                return actions
            caps = self._caps.get(worker)
            if worker in waiting.excluded or (
                caps is not None and not caps.can(task.flow_type, task.kind, task.name)
            ):
                waiting.excluded.add(worker)
                self._forward(waiting, "reroute_unknown_name", actions)
                return actions
        self._waiting[waiting.seq] = waiting
        self._settle(waiting, actions, now)
        if waiting.seq in self._waiting:
            # (only a dispatch left waiting needs its expiry watched: one offered at once is
            # pushed again if it comes back, by ``_requeue``)
            heapq.heappush(self.expiries, (expiry, waiting.seq))
        return actions

    def accepted(self, stream: Any, delivery: int) -> list[Action]:
        """The worker accepted the dispatch offered on ``stream``: it owns the call now (and
        tells ``reply_to`` the dispatch was ``delivered``)."""
        actions: list[Action] = []
        entry = self._streams.get(stream)
        waiting = entry.offered if entry is not None else None
        if entry is None or waiting is None or waiting.dispatch.task.delivery != delivery:
            return actions
        entry.state = "busy"
        entry.offered = None
        self._offered -= 1
        return actions

    def declined(self, stream: Any, delivery: int, reason: str) -> list[Action]:
        """The worker declined the dispatch offered on ``stream``; the stream stays idle.

        ``no_capacity``: other streams are tried; this worker only again after its
        ``worker_freed``. ``unknown_name``: a worker queue forwards the dispatch to the flow-type
        queue at once; a flow-type queue excludes the worker and tries others. ``draining``: the
        worker gets nothing new. Any other reason counts as ``no_capacity``."""
        actions: list[Action] = []
        entry = self._streams.get(stream)
        waiting = entry.offered if entry is not None else None
        if entry is None or waiting is None or waiting.dispatch.task.delivery != delivery:
            return actions
        worker = entry.worker_id
        entry.offered = None
        entry.state = "idle"
        self._offered -= 1
        self._declines += 1
        self._idle[stream] = entry
        if reason == "unknown_name":
            waiting.excluded.add(worker)
            if self.kind == "worker":
                self._forward(waiting, "reroute_unknown_name", actions)
                self._match_stream(entry, actions)
                return actions
            self._requeue(waiting)
        elif reason == "draining":
            # Kept from this dispatch too, so a flow-type queue it is forwarded to (which may
            # not have heard of the drain yet) does not offer it to the same worker again.
            waiting.drained.add(worker)
            self._requeue(waiting)
            actions.extend(self.worker_draining(worker))
        else:
            # A worker freed after this offer went out may have read it while still full: its
            # WorkerFreed (through the matcher) can overtake its DECLINE (from its stream), and
            # then nothing would offer it this dispatch again. So it stays eligible.
            if self._freed.get(worker, 0) == entry.freed_mark:
                waiting.busy.add(worker)
            waiting.capacity = True
            actions.append(Route(waiting.dispatch, "declined_no_capacity", worker))
            self._requeue(waiting)
        if waiting.seq in self._waiting:
            self._settle(waiting, actions)
        self._match_stream(entry, actions)
        return actions

    def worker_freed(self, worker_id: str) -> list[Action]:
        """A call of ``worker_id`` ended: the dispatches it declined for capacity may go to it
        again."""
        actions: list[Action] = []
        if worker_id in self._workers:
            self._freed[worker_id] = self._freed.get(worker_id, 0) + 1
        freed = [w for w in self._waiting.values() if worker_id in w.busy]
        for waiting in freed:
            waiting.busy.discard(worker_id)
            if waiting.seq in self._waiting:
                self._match_dispatch(waiting, actions)
        return actions

    def worker_draining(self, worker_id: str) -> list[Action]:
        """``worker_id`` takes no new work: never offered anything again. A worker queue of
        that worker forwards its dispatches to the flow-type queues."""
        actions: list[Action] = []
        if len(self._draining) >= _DRAINING_KEPT:
            # Forget the drained workers that have no stream here any more.
            self._draining &= set(self._workers)
        self._draining.add(worker_id)
        if self.kind == "worker" and worker_id == self.name:
            for waiting in list(self._waiting.values()):
                # Kept from it, as a dispatch it declined as draining is: the flow-type queue
                # may not have heard of the drain yet, and must not offer it to the worker again.
                waiting.drained.add(worker_id)
                self._forward(waiting, "fallback_no_stream", actions)
        return actions

    def hand_off(self) -> list[Action]:
        """A flow-type queue with no stream gives back its waiting dispatches, with the wait
        each has left (to go to another server's streams: ``_matcher_remote``)."""
        actions: list[Action] = []
        if self.kind == "flow" and not self._streams:
            for waiting in list(self._waiting.values()):
                self._forward(waiting, "flow_queue", actions)
        return actions

    def hand_back(self) -> list[Action]:
        """The queue stops: its waiting dispatches go back to the matcher with the wait each has
        left (a worker queue's to the flow-type queue, ``fallback_no_stream``; a flow-type
        queue's to be routed again, ``flow_queue``). Only an unused queue is stopped, but a
        dispatch sent to it straight (``_matcher_routes``) may have come in meanwhile."""
        actions: list[Action] = []
        reason = "fallback_no_stream" if self.kind == "worker" else "flow_queue"
        for waiting in list(self._waiting.values()):
            self._forward(waiting, reason, actions)
        return actions

    def expire(self) -> list[Action]:
        """End the waits that are over (by the clock): a worker queue forwards them to the
        flow-type queue, a flow-type queue answers ``NotDispatched``. An offered dispatch
        waits for its answer first."""
        actions: list[Action] = []
        now = self._clock()
        heap = self.expiries
        while heap and heap[0][0] <= now:
            expiry, seq = heapq.heappop(heap)
            waiting = self._waiting.get(seq)
            if waiting is not None and waiting.expiry == expiry:
                self._end(waiting, actions)
        return actions

    # -- the rules ----------------------------------------------------------------------------

    def _eligible(self, waiting: _Waiting, entry: _Stream) -> bool:
        worker = entry.worker_id
        if (
            worker in waiting.excluded
            or worker in waiting.busy
            or worker in waiting.drained
            or worker in self._draining
        ):
            return False
        task = waiting.dispatch.task
        if entry.caps.can(task.flow_type, task.kind, task.name):
            return True
        waiting.lacking.add(worker)
        return False

    def _offer(self, waiting: _Waiting, entry: _Stream, actions: list[Action]) -> None:
        del self._waiting[waiting.seq]
        del self._idle[entry.key]
        entry.state = "offered"
        entry.offered = waiting
        entry.freed_mark = self._freed.get(entry.worker_id, 0)
        self._offered += 1
        actions.append(OfferStream(entry.key, waiting.dispatch))

    def _match_stream(self, entry: _Stream, actions: list[Action]) -> None:
        """Offer the idle ``entry`` the oldest waiting dispatch it can take."""
        if entry.state != "idle":
            return
        for waiting in self._waiting.values():
            if self._eligible(waiting, entry):
                self._offer(waiting, entry, actions)
                return

    def _match_dispatch(self, waiting: _Waiting, actions: list[Action]) -> None:
        """Offer the waiting dispatch to the first idle stream that can take it."""
        for entry in self._idle.values():
            if self._eligible(waiting, entry):
                self._offer(waiting, entry, actions)
                return

    def _settle(self, waiting: _Waiting, actions: list[Action], now: float | None = None) -> None:
        """A dispatch (back) in the waiting list: offer it, or end its wait if it is over (at
        once, unoffered, if the task's deadline has passed); ``now`` the clock, if read."""
        if now is None:
            now = self._clock()
        deadline = waiting.dispatch.task.deadline
        if deadline is None or deadline > now:
            self._match_dispatch(waiting, actions)
        if waiting.seq in self._waiting and waiting.expiry <= now:
            self._end(waiting, actions)

    def _requeue(self, waiting: _Waiting) -> None:
        """Back in the waiting list, ahead of the rest (it came before most of them)."""
        self._waiting[waiting.seq] = waiting
        self._waiting.move_to_end(waiting.seq, last=False)
        heapq.heappush(self.expiries, (waiting.expiry, waiting.seq))

    def _take_back(self, entry: _Stream, actions: list[Action]) -> _Waiting | None:
        waiting = entry.offered
        entry.offered = None
        if waiting is None:
            return None
        self._offered -= 1
        self._requeue(waiting)
        return waiting

    def _end(self, waiting: _Waiting, actions: list[Action]) -> None:
        """The wait is over."""
        self._waiting.pop(waiting.seq, None)
        if self.kind == "worker":
            self._forward(waiting, "fallback_timeout", actions)
        else:
            reason, message = self._failure(waiting)
            actions.append(Reject(waiting.dispatch, reason, message))

    def _left(self, waiting: _Waiting) -> float:
        """Seconds of the dispatch's whole wait left now (never past the task's deadline)."""
        now = self._clock()
        left = waiting.dispatch.wait - (now - waiting.enqueued)
        deadline = waiting.dispatch.task.deadline
        if deadline is not None:
            left = min(left, deadline - now)
        return left

    def _forward(self, waiting: _Waiting, reason: str, actions: list[Action]) -> None:
        """Out of this (worker) queue, to the flow-type queue with the wait that is left; if
        none is left, the dispatch ends here."""
        self._waiting.pop(waiting.seq, None)
        left = self._left(waiting)
        if left <= 0:
            reason_, message = self._failure(waiting)
            actions.append(Reject(waiting.dispatch, reason_, message))
            return
        dispatch = attrs.evolve(
            waiting.dispatch,
            wait=left,
            excluded=waiting.excluded,
            declined_no_capacity=waiting.capacity,
            drained=waiting.drained,
        )
        worker = self.name if self.kind == "worker" else None
        actions.append(ForwardToFlow(dispatch, reason, worker))

    def _failure(self, waiting: _Waiting) -> tuple[str, str]:
        task = waiting.dispatch.task
        what = f"{task.kind} {task.name!r} of flow type {task.flow_type!r}"
        waited = f"{max(0.0, self._clock() - waiting.enqueued):g} s"
        if waiting.capacity:
            return (
                "no_worker_available",
                f"every worker able to run {what} declined it for capacity during the dispatch"
                f" wait ({waited} in {self.queue}); add workers, raise their"
                " max_concurrent_tasks, or let the retry policy try again",
            )
        if waiting.excluded or waiting.lacking:
            workers = ", ".join(sorted(waiting.excluded | waiting.lacking))
            return (
                "unknown_name",
                f"no worker registered for flow type {task.flow_type!r} has the {what}"
                f" (workers without it: {workers}); deploy workers whose flow defines"
                f" {task.kind} {task.name!r}",
            )
        return (
            "unavailable",
            f"no worker able to run {what} was connected to {self.queue} during the dispatch"
            f" wait ({waited}); start a pull worker that registers flow type"
            f" {task.flow_type!r}",
        )
