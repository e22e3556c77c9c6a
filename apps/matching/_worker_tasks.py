"""The task half of the pull worker's engine: accept or decline each offered task against the
capacity (``max_concurrent_tasks`` shared by Steps and RPCs, ``reserved_rpc_tasks`` slots only
RPCs may take), run the accepted call, keep its stream alive, and send its outcome.

This is the seed's 容量和关闭 and 为 RPC 预留容量: a Step is declined ``no_capacity`` when the busy
handlers reach the cap less the reservation (counted in ``pull_reserved_rpc_declines``), an
RPC only at the cap. :class:`WorkerTasks` is mixed into ``WorkerEngine``, which holds the state.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import trio

import wire

from ._errors import ClientClosed
from ._model import Registry, RpcDefinition, StepDefinition
from ._options import PullWorkerOptions
from ._worker_blocking import BlockingCall, BlockingCalls
from ._worker_calls import (
    CallOutputs,
    HandlerRunner,
    Returned,
    cancelled_failure,
    execute,
    handler_of,
    send_output,
)
from ._worker_streams import Link, QueueState, Stream

__all__ = ["ACCEPT_DELAY_SHARE", "RESERVED_DECLINE_EXTRA_IDLE_SECONDS", "WorkerTasks"]

log = logging.getLogger("apps.matching.worker")

#: How long a queue keeps one extra idle stream after its last reserved-capacity decline.
RESERVED_DECLINE_EXTRA_IDLE_SECONDS = 30.0
#: A held ACCEPT waits at most ``peer_timeout / ACCEPT_DELAY_SHARE`` (the server's wait for it).
ACCEPT_DELAY_SHARE = 10


class WorkerTasks(BlockingCalls):
    """Tasks and slots; the engine sets these attributes and provides :meth:`_kick`."""

    _registry: Registry
    #: (flow type, kind, name) -> its handler, for the tasks served so far (``handler_of``).
    _handlers: dict[tuple[str, str, str], StepDefinition | RpcDefinition]
    _queues: list[QueueState]
    _cache: Any
    _runner: HandlerRunner
    _pull: PullWorkerOptions
    _app_worker_id: str
    _cap: int
    _reserved: int
    _reserved_declines: int
    #: Handlers running (their slots are taken).
    _busy: int
    #: Calls whose outcome is not sent yet.
    _active: int
    #: What the drain timeout cancels: the calls' scopes (and fast-path calls).
    _call_scopes: set[trio.CancelScope | BlockingCall]
    _calls_nursery: trio.Nursery
    _draining: bool
    _token: trio.lowlevel.TrioToken | None
    #: trio's current time (the run's clock's ``current_time`` once the engine runs: one
    #: call where ``trio.current_time`` is three).
    _now: Callable[[], float]

    def _kick(self) -> None:
        raise NotImplementedError

    def _stream_changed(self, s: Stream) -> None:
        raise NotImplementedError

    async def _send_quietly(self, link: Link, message: wire.MatchMessage) -> bool:
        """Send, ignoring a lost connection (the loss is handled where it is noticed)."""
        try:
            await link.conn.send(message)
        except ClientClosed:
            return False
        return True

    def _send_nowait(self, link: Link, *messages: wire.MatchMessage) -> bool:
        """:meth:`_send_quietly` without waiting, in one write (``SdkConnection.send_nowait``)."""
        try:
            link.conn.send_nowait(*messages)
        except ClientClosed:
            return False
        return True

    def _decline(self, s: Stream, task: wire.MatchTask, reason: str, message: str) -> None:
        decline = wire.MatchDecline(
            delivery=task.delivery, reason=reason, message=message, rid=s.id
        )
        self._send_nowait(s.link, decline)

    def _on_task(self, s: Stream, task: wire.MatchTask) -> None:
        """An offered task (in the reader task): decline it, or accept it and start its call."""
        link = s.link
        if s.state != "idle":
            self._decline(s, task, "no_capacity", "this stream runs a call already")
            return
        if self._draining or link.reconnecting:
            self._decline(s, task, "draining", f"worker {self._app_worker_id} is stopping")
            return
        key = (task.flow_type, task.kind, task.name)
        handler = self._handlers.get(key)
        if handler is None:
            found = handler_of(self._registry, self._app_worker_id, task)
            if isinstance(found, str):
                self._decline(s, task, "unknown_name", found)
                return
            # (only what the registry has: as many keys as it has handlers, whatever the
            # server sends)
            handler = self._handlers[key] = found
        busy, cap = self._busy, self._cap
        if task.kind == "step" and busy >= cap - self._reserved:
            if busy < cap:
                self._reserved_declines += 1
                log.debug(
                    "declined a step of flow type %s (%s): %d of %d slots busy, %d reserved for"
                    " RPCs",
                    task.flow_type,
                    task.name,
                    busy,
                    cap,
                    self._reserved,
                )
                s.queue.extra_until = trio.current_time() + RESERVED_DECLINE_EXTRA_IDLE_SECONDS
                self._kick()
                message = f"{busy} of {cap} slots busy, {self._reserved} reserved for RPCs"
            else:
                message = f"all {cap} slots busy"
            self._decline(s, task, "no_capacity", message)
            return
        if task.kind == "rpc" and busy >= cap:
            self._decline(s, task, "no_capacity", f"all {cap} slots busy")
            return
        s.state = "busy"
        now = self._now()
        s.pong_at = now + self._pull.keepalive_interval
        self._busy += 1
        self._active += 1
        link.calls += 1
        s.delivery = task.delivery
        s.cancelled = None
        ran = self._run_inline(s, task, handler, now)
        if ran is True:
            return  # (its outcome is sent, its slot free again: no change to plan for)
        accept = wire.MatchAccept(delivery=task.delivery, rid=s.id)
        self._stream_changed(s)
        if not self._start_accept(s, accept, now):
            return
        if ran is not False:
            self._blocking_done(*ran)  # (outputs or blobs first: the usual way from here)
            return
        if self._submit_blocking(s, task, handler, now):
            return
        scope = trio.CancelScope()
        s.cancel = scope
        self._call_scopes.add(scope)
        self._calls_nursery.start_soon(self._run_call, s, task, handler, scope)

    def _start_accept(self, s: Stream, accept: wire.MatchAccept, now: float) -> bool:
        """Hold the ACCEPT of the call ``s`` just took (a handler that ends within the delay
        sends it in the outcome's write), or send it now; False when the connection was lost
        sending it (the call is then over)."""
        link = s.link
        if link.accept_delay > 0:
            s.accept = accept
            s.accept_at = now + link.accept_delay
            s.accept_written = False
            link.held_accepts += 1
            self._timer_sooner(link, s.accept_at)
            return True
        s.accept_written = True
        self._timer_sooner(link, s.pong_at)
        if not self._send_nowait(link, accept):
            self._free_slot(s)
            self._call_over(s)
            return False
        link.conn.write_corked()  # (not held to the read's end: sent at once, as asked)
        return True

    def _on_cancel(self, s: Stream, message: wire.MatchCancel) -> None:
        """M_CANCEL: the server no longer wants the call's outcome (its flow was cancelled).
        A call in a task is cancelled (its outcome becomes a ``Cancelled`` failure); a
        fast-path call's function cannot be interrupted: its outcome is sent when it
        returns."""
        if s.state != "busy" or s.delivery != message.delivery or s.cancel is None:
            return  # (its call ended already: the M_CANCEL crossed its outcome)
        log.info("delivery %d was cancelled by the server (its flow was cancelled)", s.delivery)
        s.cancelled = message.delivery
        s.cancel.cancel()

    async def _wait_kick(self, deadline: float = math.inf) -> None:
        raise NotImplementedError

    def _send_outcome_nowait(
        self, s: Stream, task: wire.MatchTask, message: wire.MatchMessage
    ) -> None:
        """Send a call's outcome (unless its stream or connection is gone, with a warning),
        in one write with its ACCEPT if that is still held; one that cannot be encoded
        becomes a non-retryable failure."""
        link = s.link
        accept = s.accept
        first: tuple[wire.MatchMessage, ...] = ()
        if accept is not None and accept.delivery == task.delivery:
            accept_at = s.accept_at
            self._unhold(s)
            if not s.accept_written:  # (no thread writes this call's outcome: no lock)
                s.accept_written = True
                first = (accept,)
            if accept_at <= link.timer.deadline:
                # It was the timer loop's next deadline: move it on to the next one, so the
                # loop is not woken for nothing (a wake-up costs more than this scan).
                link.timer.deadline = self._timer_due(link)
        if link.conn.closed or s.state == "closed":
            self._outcome_dropped(task, message)
            return
        try:
            link.conn.send_nowait(*first, message)
        except wire.WireError as exc:
            self._send_nowait(link, *first, self._unsendable(s, task, exc))
        except ClientClosed:
            log.warning(
                "the connection was lost: the outcome of delivery %d is dropped", task.delivery
            )

    # -- calls in tasks ---------------------------------------------------------------------

    async def _output(self, s: Stream, task: wire.MatchTask, value: Any) -> None:
        if s.accept is not None and s.accept.delivery == task.delivery:
            self._send_accept(s)  # (the server takes an output only from an accepted call)
        if s.state != "closed":  # (never a frame on a stream after its CLOSE)
            await send_output(s.link.conn, task.delivery, s.id, value)

    def _free_slot(self, s: Stream, now: float | None = None) -> None:
        """The handler on ``s`` returned (at ``now``, if the caller has read the clock): its
        slot is free (its outcome may not be sent yet)."""
        self._busy -= 1
        s.delivery = s.cancel = None
        if now is None:
            now = self._now()
        if s.state == "busy":
            s.state = "idle"
            s.idle_since = now
            s.pong_at = math.inf
        if self._busy == self._cap - 1:
            # A slot is free again: a queue's extra idle stream (after a reserved-capacity
            # decline) may now be opened. Otherwise the stream counts as busy until its
            # outcome is sent: _call_over wakes the loops if need be.
            if any(q.extra_until > now for q in self._queues):
                self._kick()

    def _call_over(self, s: Stream) -> None:
        """The call on ``s`` is over, its outcome sent (or dropped)."""
        if s.accept is not None:
            # No outcome (the drain timeout cancelled it): the ACCEPT goes alone, as it would
            # have at once; the server then reports the call lost when the connection ends.
            self._send_accept(s)
        self._active -= 1
        link = s.link
        link.calls -= 1
        if link.reconnecting and link.calls == 0:
            link.ending.set()
        self._stream_changed(s)

    async def _run_call(
        self,
        s: Stream,
        task: wire.MatchTask,
        handler: StepDefinition | RpcDefinition,
        scope: trio.CancelScope,
        returned: Returned | None = None,
        outputs: CallOutputs | None = None,
    ) -> None:
        """Run one call in a task (or finish a fast-path one, ``returned`` by its function,
        with its ``outputs``) and send its outcome."""
        outcome: wire.MatchMessage | None = None
        freed = False
        if outputs is None:
            outputs = CallOutputs(self._calls_nursery, functools.partial(self._output, s, task))
        token = self._token
        assert token is not None
        try:
            with scope:
                try:
                    outcome = await execute(
                        task,
                        handler,
                        rid=s.id,
                        conn=s.link.conn,
                        cache=self._cache,
                        runner=self._runner,
                        emit=outputs.emitter(token),
                        returned=returned,
                    )
                finally:
                    outputs.closed = True
                await outputs.finish()
            if scope.cancelled_caught and outcome is None and s.cancelled == task.delivery:
                outcome = cancelled_failure(task, s.id)
            elif scope.cancelled_caught:
                log.warning(
                    "delivery %d (%s %s of flow %s) was cancelled after stop_drain_timeout; the"
                    " server re-dispatches or fails it",
                    task.delivery,
                    task.kind,
                    task.name,
                    task.flow_id,
                )
            freed = True
            self._free_slot(s)
            if outcome is not None:
                # (written at once or queued in order: a CLOSE of the stream comes after it)
                self._send_outcome_nowait(s, task, outcome)
        finally:
            self._call_scopes.discard(scope)
            if not freed:
                self._free_slot(s)
            self._call_over(s)

    # -- the link's timer: keepalive PONGs and held ACCEPTs -------------------------------

    @staticmethod
    def _timer_sooner(link: Link, when: float) -> None:
        """The link's timer loop is needed at ``when``: bring its deadline forward (this wakes
        nothing now, unlike an event would: a call costs the loop no wake-up of its own)."""
        timer = link.timer
        if when < timer.deadline:
            timer.deadline = when

    @staticmethod
    def _timer_due(link: Link) -> float:
        """When the timer loop is next needed: the earliest held ACCEPT or PONG due."""
        due = math.inf
        for x in link.streams.values():
            if x.accept is not None:
                if x.accept_at < due:
                    due = x.accept_at
            elif x.state == "busy" and x.pong_at < due:
                due = x.pong_at
        return due

    @staticmethod
    def _unhold(s: Stream) -> None:
        s.accept = None
        s.accept_at = math.inf
        s.link.held_accepts -= 1

    def _send_accept(self, s: Stream) -> None:
        """Send the held ACCEPT of the call on ``s`` alone (its delay passed, or something
        else of the call must follow it)."""
        accept = s.accept
        if accept is None:
            return
        self._unhold(s)
        if s.state == "closed":
            return
        # (under the lock: the call's handler thread may be writing it with the outcome)
        with s.link.conn.write_lock:
            if not s.accept_written:
                s.accept_written = True
                self._send_nowait(s.link, accept)

    async def _timer_loop(self, link: Link) -> None:
        """One loop per connection (not a task per call): an M_PONG every
        ``keepalive_interval`` on each stream while its task runs, and each held M_ACCEPT
        when its delay passes (``PullWorkerOptions.accept_delay``). It sleeps in
        ``link.timer``, whose deadline a call brings forward when it needs the loop sooner."""
        interval = self._pull.keepalive_interval
        while not link.conn.closed:
            self._take_completions()
            now = trio.current_time()
            for s in list(link.streams.values()):
                if s.accept is not None:
                    if s.accept_at > now:
                        continue
                    self._send_accept(s)
                if s.state == "busy" and s.pong_at <= now:
                    s.pong_at = now + interval
                    self._send_nowait(link, wire.MatchPong(rid=s.id))
            # (no checkpoint since the scan: a call that starts later moves this deadline)
            with trio.CancelScope(deadline=self._timer_due(link)) as link.timer:
                await trio.sleep_forever()

    @staticmethod
    def _outcome_dropped(task: wire.MatchTask, outcome: wire.MatchMessage) -> None:
        log.warning(
            "the stream of delivery %d (%s %s of flow %s) is gone: its %s is dropped; the"
            " server re-dispatches it, or fails the attempt if it sent output",
            task.delivery,
            task.kind,
            task.name,
            task.flow_id,
            "result" if isinstance(outcome, wire.MatchResult) else "failure",
        )

    @staticmethod
    def _unsendable(s: Stream, task: wire.MatchTask, exc: wire.WireError) -> wire.MatchFailure:
        """The failure sent instead of an outcome that cannot be encoded."""
        return wire.MatchFailure(
            delivery=task.delivery,
            type=type(exc).__name__,
            message=f"the handler's result cannot be sent: {exc}",
            retryable=False,
            rid=s.id,
        )
