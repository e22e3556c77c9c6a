"""Time to live: each object's deadline, the heap of deadlines, and the sweep that drops
expired objects (an extension: OTP's ETS has no expiry; caches built on it sweep by hand).

An expired object is never seen: every read first drops what is due (``expire_due``); the
sweep, run by the table's actor on the node's timer, frees the memory of what nobody reads.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from .._ids import Ref
    from .._node import Node
    from .._process import Process


class ActorSignal:
    """A message from a table to its own actor (printed by its label)."""

    __slots__ = ("_label",)

    def __init__(self, label: str) -> None:
        self._label = label

    def __repr__(self) -> str:
        return self._label


#: Tells the table actor to sweep expired objects.
SWEEP: Any = ActorSignal("ets_sweep")


class Expiry:
    """The expiry half of ``Tab`` (a mixin: the fields are the table's)."""

    if TYPE_CHECKING:
        node: Node
        alive: bool
        unique: bool
        dl: dict[Any, Any]
        heap: list[tuple[float, int, Any]]
        seq: Iterator[int]
        sweep_at: float
        sweep_timer: Ref | None
        actor_proc: Process | None

        def refresh(self) -> None: ...
        def remove_key(self, key: Any) -> list[Any]: ...
        def keep(self, key: Any, keep: Callable[[Any, float], bool]) -> list[Any]: ...

    else:
        __slots__ = ()  # the fields are Tab's slots (mypy reads the declarations above)

    def deadline_after(self, expire_after: float | None) -> float | None:
        return None if expire_after is None else trio.current_time() + expire_after

    def _push_deadline(self, deadline: float, key: Any) -> None:
        heap = self.heap
        heapq.heappush(heap, (deadline, next(self.seq), key))
        if len(heap) == 1:
            self.refresh()
        if len(heap) > 1024 and len(heap) > 4 * len(self.dl):
            self._compact_heap()
        if deadline < self.sweep_at:
            self._schedule_sweep(deadline)

    def _compact_heap(self) -> None:
        entries = []
        seq = self.seq
        for key, deadline in self.dl.items():
            when = deadline if self.unique else min(deadline)
            if when != math.inf:
                entries.append((when, next(seq), key))
        heapq.heapify(entries)
        self.heap = entries
        self.refresh()

    def expire_due(self) -> None:
        """Remove every object whose deadline has passed (expired objects are never seen)."""
        heap = self.heap
        if not heap:
            return
        now = trio.current_time()
        while heap and heap[0][0] <= now:
            _, _, key = heapq.heappop(heap)
            if self.unique:
                deadline = self.dl.get(key)
                if deadline is not None and deadline <= now:
                    self.remove_key(key)
            else:
                deadlines = self.dl.get(key)
                if deadlines is not None and min(deadlines) <= now:
                    self.keep(key, lambda _obj, when: when > now)
                    deadlines = self.dl.get(key)
                    if deadlines is not None:
                        soonest = min(deadlines)
                        if soonest != math.inf:
                            heapq.heappush(heap, (soonest, next(self.seq), key))
            heap = self.heap
        if not heap:
            self.refresh()

    def _schedule_sweep(self, deadline: float) -> None:
        timers = self.node.timers
        if self.sweep_timer is not None:
            timers.cancel(self.sweep_timer)
        self.sweep_at = deadline
        self.sweep_timer = timers.start(deadline - trio.current_time(), self._sweep_due)

    def _sweep_due(self) -> None:
        self.sweep_timer = None
        self.sweep_at = math.inf
        actor = self.actor_proc
        if actor is not None and actor.alive:
            actor.deliver(SWEEP)
        else:
            self.sweep()

    def sweep(self) -> None:
        """Physically drop expired objects and schedule the next sweep (run by the actor)."""
        if not self.alive:
            return
        self.expire_due()
        if self.heap and self.sweep_timer is None:
            self._schedule_sweep(self.heap[0][0])
