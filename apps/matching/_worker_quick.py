"""Which plain-function handlers the pull worker runs on its own (trio) thread: those that
proved quick in a handler thread, so a call costs no thread hand-off (a wake-up of a handler
thread, the GIL passed to it and back, the outcome handed back: about a quarter of a worker's
CPU per empty Step).

Like the dirty worker's quick sync actions (``apps/dirty/worker/_server.py``), a handler earns
it by returning within :data:`QUICK_SECONDS` :data:`QUICK_AFTER` times in a row in a thread;
one run on the trio thread slower than that (it blocked, or the thread was preempted) sends it
back to the threads, and it must then prove itself twice as often as before (up to
:data:`MAX_PROOF` runs; each :data:`MAX_PROOF` quick runs in a row on the trio thread halve it
again): a handler that blocks now and then stalls the trio loop rarely, and a blocking one
never runs there. ``PullWorkerOptions.inline_quick_handlers`` turns it off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_PROOF", "QUICK_AFTER", "QUICK_SECONDS", "QuickHandlers"]

log = logging.getLogger("apps.matching.worker")

#: A run this short (wall clock, seconds) counts as quick.
QUICK_SECONDS = 0.001
#: Quick runs in a row in a thread before a handler runs on the trio thread.
QUICK_AFTER = 16
#: The most quick runs in a row ever asked of a handler that was sent back.
MAX_PROOF = 4096


class QuickHandlers:
    """The quick handlers of one worker engine, by handler definition (its identity: the
    Registry holds one per Step and RPC). Only the trio thread calls :meth:`ran_inline`;
    handler threads call :meth:`ran_in_thread` (a lost update under a race costs one more or
    one fewer run in a thread, nothing else)."""

    def __init__(
        self, enabled: bool = True, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.enabled = enabled
        #: What a handler's run is timed with (seconds; the wall clock: a blocked handler
        #: uses no CPU).
        self.clock = clock
        #: id(handler) -> quick runs in a row in a thread so far (>= its proof: inline).
        self._runs: dict[int, int] = {}
        #: id(handler) -> the runs in a row it must prove (absent: QUICK_AFTER).
        self._proof: dict[int, int] = {}
        #: Times a handler was sent back to the threads (for tests and statistics).
        self.demoted = 0

    def is_quick(self, handler: Any) -> bool:
        """Whether ``handler`` runs on the trio thread now."""
        key = id(handler)
        return self.enabled and self._runs.get(key, 0) >= self._proof.get(key, QUICK_AFTER)

    def ran_in_thread(self, handler: Any, seconds: float) -> None:
        """(Any thread.) ``handler`` returned after ``seconds`` in a handler thread."""
        key = id(handler)
        self._runs[key] = self._runs.get(key, 0) + 1 if seconds <= QUICK_SECONDS else 0

    def ran_inline(self, handler: Any, seconds: float) -> None:
        """(The trio thread.) ``handler`` returned after ``seconds`` on the trio thread: a
        slow run sends it back to the threads, to prove itself twice as long; every
        :data:`MAX_PROOF` quick runs in a row there halve what it must prove (a preempted
        thread's run looks slow too, and it should not keep a quick handler off for good)."""
        key = id(handler)
        if seconds <= QUICK_SECONDS:
            proof = self._proof.get(key, QUICK_AFTER)
            if proof == QUICK_AFTER:
                return  # (nothing to halve: its runs are counted no further)
            runs = self._runs.get(key, 0) + 1
            if runs >= proof + MAX_PROOF:
                proof = self._proof[key] = proof // 2
                runs = proof
            self._runs[key] = runs
            return
        proof = min(self._proof.get(key, QUICK_AFTER) * 2, MAX_PROOF)
        self._proof[key] = proof
        self._runs[key] = 0
        self.demoted += 1
        log.info(
            "handler %s took %.1f ms on the worker's trio thread: it runs in handler threads"
            " again until it returns within %.0f ms %d times in a row",
            getattr(handler, "name", handler),
            seconds * 1e3,
            QUICK_SECONDS * 1e3,
            proof,
        )
