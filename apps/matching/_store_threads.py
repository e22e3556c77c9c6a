"""``ThreadCalls``: how a SQL store runs its calls on its connection in threads of trio's cache,
with one pass of trio's scheduler to hand each back."""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

__all__ = ["ThreadCalls"]

T = TypeVar("T")


class ThreadCalls:
    """The store's calls on its open connection, each in a thread of trio's cache, one at a
    time (under the store's lock); the thread wakes its caller through a socket pair the caller
    waits on. One pass of the scheduler, where ``trio.to_thread.run_sync`` costs three: its
    capacity limiter's checkpoint before the thread starts (the lock already admits one call),
    its ``run_sync_soon`` task and then the caller after it (issue 15: four wake-ups less a
    Step, whose two commits take them). ``start`` runs a call no task waits for (a
    ``StoreServer``'s group commit, ``SqlStore.commit_soon``)."""

    def __init__(self) -> None:
        self._ours, self._theirs = socket.socketpair()
        self._ours.setblocking(False)
        self._outcome: Any = None
        self._token = trio.lowlevel.current_trio_token()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a thread. Cancellation waits for it to return (the connection is
        never left mid-call) and takes effect at the caller's next checkpoint, as
        ``run_sync``'s does."""
        await trio.lowlevel.checkpoint_if_cancelled()
        trio.lowlevel.start_thread_soon(functools.partial(fn, *args), self._deliver)
        with trio.CancelScope(shield=True):
            await trio.lowlevel.wait_readable(self._ours)
        self._ours.recv(16)
        result, self._outcome = self._outcome, None
        value: T = result.unwrap()
        return value

    def start(self, call: Callable[[], Any], done: Callable[[outcome.Outcome[Any]], None]) -> None:
        """``call()`` in a thread, now, with no task waiting for it: its outcome goes to
        ``done`` on trio's thread (``run_sync_soon``: one pass of the scheduler, as ``run``'s
        caller's wake-up costs). Dropped if trio's run ended meanwhile."""
        token = self._token

        def deliver(result: outcome.Outcome[Any]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done, result)

        trio.lowlevel.start_thread_soon(call, deliver)

    def _deliver(self, result: Any) -> None:
        """(In the thread.) Hand the call's ``outcome.Outcome`` over and wake the caller."""
        self._outcome = result
        self._theirs.send(b"\0")

    def close(self) -> None:
        """(No call running: the store's lock is held.)"""
        trio.lowlevel.notify_closing(self._ours)
        self._ours.close()
        self._theirs.close()
