"""The threads a pull worker runs its blocking (plain-function) handlers in.

``trio.to_thread.run_sync`` per handler call cost a worker about 250 us of CPU per Step (its
capacity limiter, a cancel scope, a thread hand-off through a lock per call, and one
``run_sync_soon`` wake-up of the trio loop per call). :class:`HandlerThreads` does the same job
for one trio run with less: jobs go through one ``queue.SimpleQueue`` (C code), and the
outcomes of calls that finish while the trio loop is busy are handed back in one
``run_sync_soon`` between them. A job for an idle thread is handed over when the trio loop is
about to sleep (an instrument's ``before_io_wait``), so the woken thread finds the GIL free;
the instrument is there only while jobs are held now and then (:data:`IDLE_PASSES`).

The engine hands a call to :meth:`HandlerThreads.submit` with a function to call with its
outcome (in the trio thread, between tasks), so a blocking Step costs no trio task of its own;
:meth:`HandlerThreads.run` is the same for a task that waits. A call may also come with a
function its own thread calls first (``finish``): when that one takes the outcome (the engine
writes a quick call's outcome to the socket from there), the trio loop is not woken at all.

A blocking handler never waits behind another one: the pool starts a thread whenever the calls
in flight outnumber its threads, so every queued job has an idle thread to take it (a
``max_concurrent_tasks`` worker holds at most that many threads). A thread idle for
:data:`IDLE_SECONDS` exits, as trio's own thread cache's do. As with ``abandon_on_cancel=False``,
a thread cannot be interrupted: a cancelled call waits for its function to return.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import outcome
import trio

__all__ = ["IDLE_PASSES", "IDLE_SECONDS", "HandlerThreads"]

log = logging.getLogger("apps.matching.worker")

#: Seconds an idle handler thread waits for a job before it exits.
IDLE_SECONDS = 10.0
#: Passes of the trio loop with no job to hand over before the handing-over instrument is
#: removed (installing and removing it cost about as much as twenty passes with it).
IDLE_PASSES = 1000

#: Who takes a job's outcome: a task waiting in :meth:`HandlerThreads.run`, or a function.
_Taker = trio.lowlevel.Task | Callable[[outcome.Outcome[Any]], None]
#: What a handler thread may do with an outcome itself: True when it took it.
_Finisher = Callable[[outcome.Outcome[Any]], bool] | None
_Job = tuple[Callable[[], Any], _Taker, contextvars.Context, _Finisher]


class HandlerThreads:
    """Runs plain functions in threads for the tasks of one trio run (see the module doc).

    Attributes:
        threads: Threads alive now (for tests and statistics).
        started: Threads started so far.
        handed_back: Outcomes handed back to the trio thread so far (those a ``finish``
            function took are not).
    """

    def __init__(self, name: str = "matching-handler") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        #: Guards ``threads`` against a thread exiting while a job is queued for it.
        self._lock = threading.Lock()
        self.threads = 0
        self.started = 0
        self.handed_back = 0
        #: Calls submitted whose function has not returned yet (under ``_lock``).
        self._in_flight = 0
        self._done: deque[tuple[_Taker, outcome.Outcome[Any]]] = deque()
        self._wake_pending = False
        self._token: trio.lowlevel.TrioToken | None = None
        #: Jobs for idle threads, handed to them when the trio thread is about to sleep
        #: (:class:`_BeforeSleep`): a thread woken while the trio thread still runs would
        #: wait for the GIL, sleep again and be woken a second time when it is released.
        self._held: deque[_Job] = deque()
        #: The instrument that hands them over, while it is installed, and the trio loop's
        #: passes since it last had a job to hand over: after :data:`IDLE_PASSES` of them it
        #: is removed (a worker whose calls all run on the trio thread pays nothing for it on
        #: each pass) and installed again with the next job held.
        self._instrument: _BeforeSleep | None = None
        self._idle_passes = 0

    async def run(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn()`` in a handler thread (in a copy of the caller's context) and return
        what it returns, or raise what it raises. Cancellation waits for ``fn`` to return
        and is then raised at the caller's next checkpoint."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._start((fn, trio.lowlevel.current_task(), contextvars.copy_context(), None))
        result: Any = await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
        return result

    def submit(
        self,
        fn: Callable[[], Any],
        done: Callable[[outcome.Outcome[Any]], None],
        finish: _Finisher = None,
    ) -> None:
        """Call ``fn()`` in a handler thread (in a copy of the current context); ``done`` gets
        its outcome in the trio thread, outside any task's code (between tasks, as a
        ``run_sync_soon`` callback: it must not block, and what it raises is logged).

        With ``finish``, the handler thread first calls ``finish(outcome)``: if it returns
        True the outcome is taken there and ``done`` is never called (what it raises is
        logged, and the outcome goes to ``done``)."""
        self._start((fn, done, contextvars.copy_context(), finish))

    def _start(self, job: _Job) -> None:
        if self._token is None:
            self._token = trio.lowlevel.current_trio_token()
        with self._lock:
            self._in_flight += 1
            if self._in_flight > self.threads:
                self.threads += 1
                self.started += 1
                thread = threading.Thread(
                    target=self._work, args=(job,), name=self._name, daemon=True
                )
                thread.start()
                return
            self._held.append(job)
        if self._instrument is None:
            self._instrument = _BeforeSleep(self._release)
            trio.lowlevel.add_instrument(self._instrument)
        self._idle_passes = 0

    def _release(self) -> None:
        """(In the trio thread, about to sleep.) Hand the held jobs to the idle threads; with
        none held for :data:`IDLE_PASSES` passes, remove the instrument."""
        held = self._held
        if held:
            with self._lock:  # (a thread exits only with no job queued nor held)
                while held:
                    self._jobs.put(held.popleft())
            self._idle_passes = 0
            return
        self._idle_passes += 1
        if self._idle_passes >= IDLE_PASSES and self._instrument is not None:
            trio.lowlevel.remove_instrument(self._instrument)
            self._instrument = None

    def _work(self, job: _Job | None) -> None:
        """A handler thread: run jobs until idle for IDLE_SECONDS."""
        while True:
            if job is not None:
                fn, task, context, finish = job
                result = outcome.capture(context.run, fn)
                job = None
                with self._lock:
                    self._in_flight -= 1
                if finish is None or not self._finish(finish, result):
                    self._hand_back_soon(task, result)
            try:
                job = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty() and not self._held:  # (both change under the lock)
                        self.threads -= 1
                        return
                continue
            if job is None:  # pragma: no cover - no one sends it; kept for a clean stop
                return

    @staticmethod
    def _finish(
        finish: Callable[[outcome.Outcome[Any]], bool], result: outcome.Outcome[Any]
    ) -> bool:
        try:
            return finish(result)
        except Exception:
            log.exception("finishing a blocking handler's call in its thread failed")
            return False

    def _hand_back_soon(self, task: _Taker, result: outcome.Outcome[Any]) -> None:
        """(In a handler thread.) Give ``result`` to the trio thread."""
        self._done.append((task, result))
        # One wake-up of the trio loop for every outcome handed back meanwhile. The flag is
        # cleared there before the outcomes are taken, so an outcome appended after that is
        # either taken by that pass or wakes the loop again.
        if not self._wake_pending:
            self._wake_pending = True
            assert self._token is not None
            try:
                self._token.run_sync_soon(self._hand_back)
            except trio.RunFinishedError:  # pragma: no cover - the engine waits
                pass

    def _hand_back(self) -> None:
        """(In the trio thread.) Resume the tasks whose functions returned."""
        self._wake_pending = False
        done = self._done
        Task = trio.lowlevel.Task
        while done:
            taker, result = done.popleft()
            self.handed_back += 1
            if type(taker) is Task:
                trio.lowlevel.reschedule(taker, result)
                continue
            try:
                taker(result)  # type: ignore[operator]
            except Exception:  # (an exception here would end the trio run)
                log.exception("handing back the outcome of a blocking handler failed")


class _BeforeSleep(trio.abc.Instrument):
    """Calls ``release`` each time the trio loop is about to wait for I/O."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release

    def before_io_wait(self, timeout: float) -> None:
        self._release()


def _cannot_abort(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED
