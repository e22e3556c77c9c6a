"""Write batching for the server's connections: the frames a connection sends while the trio
run works through one batch of ready tasks go to its socket in one write, just before the run
waits for I/O again (a trio instrument's ``before_io_wait``), as Nagle's algorithm or a
corked socket would, without their delay.

Under load one wake-up of a client connection answers tens of calls, and one wake-up of a queue
writes tasks to many streams of one worker: one system call (and one wake-up of the peer's
reader) each instead of one per frame (issue 15). A lone frame waits only for the tasks that
run in the same batch.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

__all__ = ["BatchedWrites", "Flushable", "batched_writes"]

logger = logging.getLogger("apps.matching")


class Flushable(Protocol):
    """What holds frames for the batch's end: ``flush`` writes them (it never raises)."""

    def flush(self) -> None: ...


class BatchedWrites(trio.abc.Instrument):
    """The run's writes still due: each holder is flushed once, in the order it became due,
    each time the run is about to wait for I/O (so before any peer can answer them)."""

    def __init__(self) -> None:
        self.due: list[Flushable] = []

    def before_io_wait(self, timeout: float) -> None:
        due = self.due
        if not due:
            return
        self.due = []
        for holder in due:
            try:
                holder.flush()
            except Exception:  # (an instrument that raises is removed: never let one out)
                logger.exception("matching: a batched write failed")


_BATCHES: trio.lowlevel.RunVar[BatchedWrites] = trio.lowlevel.RunVar("matching_batched_writes")


def batched_writes() -> BatchedWrites:
    """This trio run's :class:`BatchedWrites` (installed as an instrument when first asked)."""
    try:
        return _BATCHES.get()
    except LookupError:
        batches = BatchedWrites()
        trio.lowlevel.add_instrument(batches)
        _BATCHES.set(batches)
        return batches
