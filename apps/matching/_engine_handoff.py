"""An RPC's outcome handed to the engine by the stream that read it, instead of sent.

The stream's ``Completed`` or ``Failed`` of a call goes to the dispatch's ``reply_to``, the
engine. When that is a local engine that took this run's hand-overs (``register``, from its
``init``), the task that runs the stream (its connection's reader, most often) runs the
engine's handling of an RPC's outcome itself, on the engine's state, as ``StreamHandle`` and
``QueueHandle`` do for a stream and a queue: the engine's handling never waits and runs in the
same trio thread, so its task is not woken, and its answer to the RPC's caller (through the
caller's ``on_response``: the client's connection) is written in the reader's own scheduling
batch (issue 15: one wake-up of the server less per RPC).

The engine takes it only while its mailbox is empty and it is not handling something itself
(``FlowEngine._take_outcome`` says the rest), so nothing it was sent before is overtaken: the
call's ``Routed`` "delivered" that came by message is handled first. Otherwise, and for any
``reply_to`` not registered (another node's engine, a test's process), the outcome is sent as
before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

import otp

from ._dispatch import Completed, Failed

__all__ = ["register", "to_engine"]

#: What the engine does with an outcome handed to it: True if it took it.
Taker = Callable[[Completed | Failed], bool]

#: Engine pid -> its taker, for this trio run (one node's engines).
_TAKERS: trio.lowlevel.RunVar[dict[Any, Taker]] = trio.lowlevel.RunVar("matching_engine_takers")


def register(pid: otp.Pid, take: Taker) -> None:
    """(From the engine ``pid``'s own task.) Hand ``pid``'s outcomes to ``take`` from now on,
    until the process exits."""
    try:
        takers = _TAKERS.get()
    except LookupError:
        takers = {}
        _TAKERS.set(takers)
    takers[pid] = take

    def forget(pid: otp.Pid, reason: Any) -> None:
        if takers.get(pid) is take:
            del takers[pid]

    otp.add_exit_hook(forget)


def to_engine(reply_to: Any, outcome: Completed | Failed) -> None:
    """``otp.send(reply_to, outcome)``, or its handling by the engine ``reply_to`` in the
    calling task when it takes it (see the module's docstring). Raises as ``otp.send``."""
    try:
        take = _TAKERS.get().get(reply_to)
    except LookupError:
        take = None
    if take is None or not take(outcome):
        otp.send(reply_to, outcome)
