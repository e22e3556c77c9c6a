"""Timers on trio's clock: ``send_after``, ``exit_after``, ``cancel_timer`` (Erlang's
``erlang:send_after/3`` and ``erlang:cancel_timer/1``).

One system task per node keeps every timer in a heap and sleeps until the earliest deadline, so
a timer costs a heap entry rather than a task, and MockClock drives them in tests.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ._ids import Ref

if TYPE_CHECKING:
    from ._node import Node
    from ._process import Process

logger = logging.getLogger("otp.timers")


def checked_seconds(value: Any, what: str, *, none_ok: bool = False) -> float:
    """``value`` as a number of seconds, or an error naming ``what`` (say ``"NoReply.timeout"``).

    The slow path behind the callers' inline test (``int`` or ``float`` and not NaN, which keeps
    the hot paths free of a call): it also takes other int and float subclasses.

    Raises:
        TypeError: ``value`` is not a number (a bool is not one either).
        ValueError: ``value`` is NaN, which would fire a timer at once.
    """
    expected = "a number of seconds or None" if none_ok else "a number of seconds"
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{what} must be {expected} (got {value!r})")
    if math.isnan(value):
        raise ValueError(f"{what} must be {expected}, not NaN")
    return value


class TimerService:
    """The per-node timer wheel (a heap of deadlines) and the task that fires it."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._heap: list[tuple[float, int, Any]] = []
        #: Each live timer's deadline and action, by its ref (or its object, see start).
        self._actions: dict[Any, tuple[float, Callable[[], None]]] = {}
        #: The target process of each timer started with start_to.
        self._targets: dict[Ref, Process] = {}
        self._order = itertools.count()
        self._scope: trio.CancelScope | None = None
        #: The trio run's clock (trio.current_time's, without its two calls on the way).
        self._clock: trio.abc.Clock | None = None

    def __len__(self) -> int:
        return len(self._actions)

    def start(self, delay: float, action: Callable[[], None], *, private: bool = False) -> Any:
        """Run ``action`` in ``delay`` seconds; returns the timer's ref. A ``private`` timer
        (a call's timeout) is named by a bare object instead: cheaper to make than a ref, and
        out of reach of ``cancel_timer`` and ``read_timer``, whatever ref they are given."""
        ref = object() if private else self._node.make_ref()
        clock = self._clock
        if clock is None:
            clock = self._clock = trio.lowlevel.current_clock()
        deadline = clock.current_time() + max(0.0, delay)
        self._actions[ref] = (deadline, action)
        heap = self._heap
        heapq.heappush(heap, (deadline, next(self._order), ref))
        # Cancelled timers stay in the heap until their deadline; when they outnumber the live
        # ones, rebuild it, so a stream of cancelled call timeouts costs amortised O(log n).
        if len(heap) > 1024 and len(heap) > 2 * len(self._actions):
            self._compact()
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline
        return ref

    def start_to(self, delay: float, target: Process, action: Callable[[], None]) -> Ref:
        """A timer aimed at the local process ``target``: cancelled when ``target`` exits
        (:meth:`cancel_all`)."""

        def fire() -> None:
            timers = target.timers
            if timers is not None:
                timers.discard(ref)
            action()

        ref = self.start(delay, fire)
        self._targets[ref] = target
        if target.timers is None:
            target.timers = {ref}
        else:
            target.timers.add(ref)
        return ref

    def cancel_all(self, target: Process) -> None:
        """Cancel the timers aimed at ``target`` (it exited)."""
        refs = target.timers
        if refs:
            target.timers = None
            for ref in refs:
                self._actions.pop(ref, None)
                self._targets.pop(ref, None)

    def cancel(self, ref: Ref) -> float | None:
        entry = self._actions.pop(ref, None)
        if entry is None:
            return None
        target = self._targets.pop(ref, None)
        if target is not None and target.timers is not None:
            target.timers.discard(ref)
        return max(0.0, entry[0] - trio.current_time())

    def discard(self, timer: Any) -> None:
        """Cancel a timer made by :meth:`start` (not ``start_to``) without reading the time it
        had left: a call's timeout once the call is over."""
        self._actions.pop(timer, None)

    def read(self, ref: Ref) -> float | None:
        entry = self._actions.get(ref)
        if entry is None:
            return None
        return max(0.0, entry[0] - trio.current_time())

    def _compact(self) -> None:
        live = self._actions
        self._heap[:] = [item for item in self._heap if item[2] in live]
        heapq.heapify(self._heap)

    async def run(self) -> None:
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, _, ref = heapq.heappop(heap)
                entry = self._actions.pop(ref, None)
                if entry is not None:
                    self._targets.pop(ref, None)
                    try:
                        entry[1]()
                    except Exception:
                        # This task serves every timer of the node: one failing action must not
                        # stop the others, let alone take the node down.
                        logger.exception("timer %r failed when it fired", ref)
            # Drop cancelled entries from the top so the next deadline is a live one.
            while heap and heap[0][2] not in self._actions:
                heapq.heappop(heap)
            deadline = heap[0][0] if heap else math.inf
            with trio.CancelScope(deadline=deadline) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
