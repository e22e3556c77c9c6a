"""The stream half of the pull worker's engine: the loop that keeps every queue at its idle
stream target on a connection (``plan_streams``, ``_worker_streams.py``), opening, registering
and closing streams, and each stream's frames from the server (a TASK, REGISTERED, REJECTED,
PING, CANCEL, CLOSE), handled in the connection's reader.

This is the seed's 拉取模式 registration: a stream per idle slot of each queue, replaced once
it takes a task. :class:`WorkerStreams` is mixed into ``WorkerEngine``, which holds the state.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import trio

import wire

from ._errors import PullRegistrationError, error_from_code
from ._readiness import RegistrationTracker
from ._worker_streams import Link, QueueState, Stream, plan_changes, plan_streams
from ._worker_tasks import WorkerTasks

__all__ = ["WorkerStreams"]

log = logging.getLogger("apps.matching.worker")


class WorkerStreams(WorkerTasks):
    """Streams and their frames; the engine sets these attributes and provides
    :meth:`_kick` and :meth:`_fail`."""

    _tracker: RegistrationTracker
    #: Set by every change that may alter a plan (:meth:`_kick` replaces it).
    _kicked: trio.Event

    def _fail(self, error: BaseException) -> None:
        raise NotImplementedError

    async def _manage_loop(self, link: Link) -> None:
        """Keep the idle streams of every queue at their target on ``link``: one loop, woken
        by every change and by one timer (the earliest linger, extra-stream or retry
        deadline)."""
        while not link.conn.closed:
            # Taken before rebalancing, which may wait to send: a change meanwhile is not lost.
            kicked = self._kicked
            link.manage_wake = -math.inf
            wake = await self._rebalance(link)
            link.manage_wake = wake
            with trio.move_on_at(wake):
                await kicked.wait()

    async def _rebalance(self, link: Link) -> float:
        """Open and close streams as :func:`plan_streams` says; returns when to look again.

        The streams to close are chosen and forgotten in one go, before any CLOSE is written:
        a stream chosen from a stale view could have taken a task meanwhile (and been closed
        under its call), or answered a frame after its own CLOSE.
        """
        self._take_completions()
        plan = plan_streams(self._queues, link.streams.values(), **self._plan_inputs(link))
        for q in plan.opens:
            self._open_stream(link, q)
        for s in plan.closes:
            self._forget_stream(s)
        for s in plan.closes:
            if not await self._send_quietly(link, wire.MatchClose(rid=s.id)):
                break
        return plan.wake

    def _plan_inputs(self, link: Link) -> dict[str, Any]:
        return {
            "now": trio.current_time(),
            "target": self._pull.idle_streams_per_queue,
            "linger": self._pull.idle_stream_linger,
            "may_open": not self._draining and not link.reconnecting,
            "slot_free": self._busy < self._cap,
        }

    def _stream_changed(self, s: Stream) -> None:
        """``s`` took a call or is idle again: wake the loops only if that changes the plan of
        its queue (a stream to open or close, or an earlier wake than the loop's), not on
        every call: the stream-managing loop woke twice per Step before."""
        link = s.link
        if self._draining or link.manage_wake == -math.inf or s.state == "closed":
            self._kick()
            return
        pull = self._pull
        if plan_changes(
            s.queue,
            link.streams.values(),
            now=trio.current_time(),
            target=pull.idle_streams_per_queue,
            linger=pull.idle_stream_linger,
            may_open=not link.reconnecting,  # (not draining: checked above)
            slot_free=self._busy < self._cap,
            wake_by=link.manage_wake,
        ):
            self._kick()

    def _open_stream(self, link: Link, q: QueueState) -> None:
        if link.conn.closed:  # (a write of this rebalance lost it: the connect loop redials)
            return
        s = Stream(0, q, link)
        s.id = link.conn.open_stream_handler(functools.partial(self._on_stream_frame, s))
        link.streams[s.id] = s
        self._send_nowait(link, wire.MatchRegister(queue=q.kind, name=q.target, rid=s.id))

    def _forget_stream(self, s: Stream) -> None:
        """``s`` is closed (by us, by the server, by a rejection or a lost connection)."""
        if s.state == "closed":
            return
        s.state = "closed"
        s.link.streams.pop(s.id, None)
        s.link.conn.close_stream(s.id)
        self._tracker.stream_gone(s.queue.name, s)
        self._kick()

    def _on_stream_frame(self, s: Stream, message: wire.MatchMessage) -> None:
        """A frame of stream ``s`` (in the connection's reader task: nothing here waits)."""
        if self._completions:  # (a call's thread wrote its outcome: its slot is free first)
            self._take_completions()
        if s.state == "closed":
            return  # (forgotten with frames still on their way: they are not answered)
        kind = type(message)
        if kind is wire.MatchTask:
            self._on_task(s, message)  # type: ignore[arg-type]
        elif kind is wire.MatchRegistered:
            self._on_registered(s)
        elif kind is wire.MatchRejected:
            self._on_rejected(s, message)  # type: ignore[arg-type]
        elif kind is wire.MatchPing:
            self._send_nowait(s.link, wire.MatchPong(rid=s.id))
        elif kind is wire.MatchCancel:
            self._on_cancel(s, message)  # type: ignore[arg-type]
        elif kind is wire.MatchClose:
            log.debug("the server closed stream %d of %s", s.id, s.queue.name)
            self._forget_stream(s)

    def _on_registered(self, s: Stream) -> None:
        if s.state != "registering":
            return
        s.state = "idle"
        s.idle_since = trio.current_time()
        s.queue.backoff = self._pull.reconnect_initial_backoff
        s.queue.retry_at = -math.inf
        s.link.registered_any = True
        self._tracker.stream_registered(s.queue.name, s)
        self._kick()

    def _on_rejected(self, s: Stream, message: wire.MatchRejected) -> None:
        q = s.queue
        self._forget_stream(s)
        error = error_from_code(message.code, message.message, retryable=not message.permanent)
        delay = q.backoff
        q.retry_at = trio.current_time() + delay
        q.backoff = min(q.backoff * 2, self._pull.reconnect_max_backoff)
        if not message.permanent:
            log.warning(
                "queue %s rejected a stream (%s: %s); retrying in %.3g s",
                q.name,
                message.code,
                message.message,
                delay,
            )
        elif not self._tracker.permanent_rejection(q.name, error):
            log.warning(
                "queue %s rejected an extra stream permanently (%s: %s); another stream holds"
                " the queue; retrying in %.3g s",
                q.name,
                message.code,
                message.message,
                delay,
            )
        elif self._pull.stop_on_permanent_stream_rejection:
            log.error(
                "queue %s rejected its only stream permanently (%s: %s); stopping, as"
                " stop_on_permanent_stream_rejection is set",
                q.name,
                message.code,
                message.message,
            )
            self._fail(PullRegistrationError(q.name, error))
        else:
            log.error(
                "queue %s rejected its only stream permanently (%s: %s); retrying in %.3g s",
                q.name,
                message.code,
                message.message,
                delay,
            )
        self._kick()
