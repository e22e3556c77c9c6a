"""Counting trio task wake-ups, so a benchmark can show them next to its times.

A wake-up is one ``task_scheduled`` event of trio's instrumentation: a task made runnable
again (by a channel, an event, a socket becoming readable, a reschedule). Raw trio's ping-pong
pays about two per round trip; an actor hop pays at least one more. Install a
:class:`WakeupCounter` with ``trio.lowlevel.add_instrument`` (or pass it to ``trio.run``'s
``instruments``) around the measured part and divide :attr:`WakeupCounter.count` by the number
of operations. It counts only the trio run it is installed in: a figure spanning OS processes
counts each process's own run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


class WakeupCounter(trio.abc.Instrument):
    """Counts ``task_scheduled`` events (see the module docstring) while installed."""

    def __init__(self) -> None:
        self.count = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


@contextmanager
def counting_wakeups() -> Iterator[WakeupCounter]:
    """Count the wake-ups of the current trio run inside the ``with`` block (call it from a
    trio task; the counter stays readable after the block)."""
    counter = WakeupCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)
