"""The calls of one SDK connection that wait for their answer (M_REPLY or M_ERROR), by call id,
and their timeouts (the request/reply half of ``_sdk_connection.py``, as OTP's
``gen_server:call`` keeps a monitor and a timer per call).

A caller parks its task (no event, no cancel scope); the reader hands the answer straight to it.
The timeouts of all calls are kept by one timer task per connection: a queue per distinct
timeout (deadlines arrive in order within it), so the timer sleeps until the oldest live call's
deadline instead of every call paying a cancel scope (a third of a call's Python work).

A client's M_CALLs are held for the end of the scheduling batch (:class:`HeldCalls`) and written
together, as the server's connections batch their frames (``_write_batches.py``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ._errors import CallTimeout, MatchingError
from ._sdk_protocol import call_timed_out
from ._write_batches import batched_writes

__all__ = ["HeldCalls", "PendingCalls"]


class _Pending:
    """One call waiting for its answer."""

    __slots__ = ("done", "error", "op", "task", "timeout", "value")

    def __init__(self, op: str, timeout: float | None) -> None:
        self.op = op
        self.timeout = timeout
        self.task: trio.lowlevel.Task | None = None
        self.done = False
        self.value: Any = None
        self.error: MatchingError | None = None


class PendingCalls:
    """The waiting calls of one connection (every method in the trio thread).

    Args:
        where: The peer, for error messages.
    """

    def __init__(self, where: str) -> None:
        self._where = where
        self._calls: dict[int, _Pending] = {}
        #: timeout -> (deadline, call id, call) in deadline order; answered calls are dropped
        #: from the front as new ones come, and by the timer.
        self._timeouts: dict[float, deque[tuple[float, int, _Pending]]] = {}
        #: When the timer looks next (``inf``: it waits to be woken).
        self._timer_at = math.inf
        self._timer_wake = trio.Event()

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, rid: int, op: str, timeout: float | None) -> _Pending:
        """Register call ``rid`` before its M_CALL is written (an answer may come at once)."""
        pending = _Pending(op, timeout)
        self._calls[rid] = pending
        return pending

    def forget(self, rid: int) -> None:
        """Call ``rid`` is over (answered, timed out, cancelled): a late answer is dropped."""
        self._calls.pop(rid, None)

    async def wait(self, rid: int, pending: _Pending) -> Any:
        """Wait for call ``rid``'s answer and return its value.

        Raises:
            MatchingError: The server's M_ERROR, or what :meth:`fail_all` set.
            CallTimeout: No answer within the call's timeout.

        Cancellation forgets the call (its late answer is dropped).
        """
        if not pending.done:
            timeout = pending.timeout
            if timeout is not None:
                self._arm(rid, pending, timeout)
            pending.task = trio.lowlevel.current_task()

            def abort(_: Any) -> trio.lowlevel.Abort:
                pending.task = None
                self._calls.pop(rid, None)
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        if pending.error is not None:
            raise pending.error
        return pending.value

    def answer(self, rid: int, value: Any = None, error: MatchingError | None = None) -> bool:
        """Complete call ``rid`` (False: no such call, the answer is dropped)."""
        pending = self._calls.pop(rid, None)
        if pending is None:
            return False
        self._complete(pending, value, error)
        return True

    def fail_all(self, error: MatchingError) -> None:
        """Fail every waiting call with ``error`` (the connection is gone)."""
        calls, self._calls = self._calls, {}
        for pending in calls.values():
            self._complete(pending, None, error)
        self._timeouts.clear()

    @staticmethod
    def _complete(pending: _Pending, value: Any, error: MatchingError | None) -> None:
        pending.done = True
        pending.value = value
        pending.error = error
        task = pending.task
        if task is not None:
            pending.task = None
            trio.lowlevel.reschedule(task)

    # -- timeouts ----------------------------------------------------------------------------

    def _arm(self, rid: int, pending: _Pending, timeout: float) -> None:
        deadline = trio.current_time() + timeout
        queue = self._timeouts.get(timeout)
        if queue is None:
            queue = self._timeouts[timeout] = deque()
        while queue and queue[0][2].done:
            queue.popleft()
        queue.append((deadline, rid, pending))
        if deadline < self._timer_at:
            self._timer_at = deadline
            self._timer_wake.set()

    async def run_timer(self) -> None:
        """Fail the calls whose timeout passed, until cancelled (a task per connection)."""
        while True:
            now = trio.current_time()
            earliest = math.inf
            for timeout, queue in list(self._timeouts.items()):
                while queue and (queue[0][2].done or queue[0][0] <= now):
                    _, rid, pending = queue.popleft()
                    if not pending.done and self._calls.pop(rid, None) is pending:
                        self._complete(pending, None, self._timed_out(pending))
                if queue:
                    earliest = min(earliest, queue[0][0])
                else:
                    del self._timeouts[timeout]
            self._timer_at = earliest
            self._timer_wake = trio.Event()
            with trio.move_on_at(earliest):
                await self._timer_wake.wait()

    def _timed_out(self, pending: _Pending) -> CallTimeout:
        return call_timed_out(pending.op, self._where, pending.timeout)


class HeldCalls:
    """Encoded M_CALL frames held until the end of the scheduling batch (the run's
    ``BatchedWrites`` calls :meth:`flush` just before it waits for I/O), then given to
    ``write`` in one piece, in order (the trio thread only).

    Under load one read of replies resumes tens of callers, which call again at once: their
    calls go in one write, and the server reads them in one wake-up (issue 15).

    Args:
        write: Writes encoded frames without waiting; it must never raise.
    """

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._write = write
        self.frames: list[bytes] = []
        self._due = False

    def hold(self, data: bytes) -> None:
        """Hold one encoded frame for the batch's end."""
        self.frames.append(data)
        if not self._due:
            self._due = True
            batched_writes().due.append(self)

    def flush(self) -> None:
        """Write the held frames now (the owner does before any frame it writes itself)."""
        self._due = False
        frames = self.frames
        if frames:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            frames.clear()
            self._write(data)
