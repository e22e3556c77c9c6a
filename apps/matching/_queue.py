"""The queue actor: one per flow type and one per app worker id, around a ``QueueBook``.

A GenServer started (temporary) under the DynamicSupervisor ``matching_queues`` by the
matcher. It monitors the streams that register with it (a stream's death is a ``StreamGone``),
keeps one ``send_after`` timer for the earliest end of a wait, and carries out the book's
actions: offers to streams, outcomes to ``reply_to``, and forwards to flow-type queues through
the matcher. Messages reach it as casts or as plain messages alike.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

import otp
import supervisors

from ._dispatch import (
    Accepted,
    Declined,
    Dispatch,
    MatchingLimits,
    NotDispatched,
    Offer,
    Routed,
    StreamGone,
    StreamIdle,
    WorkerDraining,
    WorkerFreed,
)
from ._queue_book import (
    Action,
    OfferStream,
    QueueBook,
    QueueStatistics,
    Reject,
    Route,
)

__all__ = ["Forward", "Queue", "queue_spec", "start_queue"]

logger = logging.getLogger("apps.matching")


@attrs.frozen(eq=False)
class Forward:
    """queue -> matcher: hand ``dispatch`` to its flow type's queue (``reason`` for ``Routed``;
    ``worker_id`` the sticky worker it leaves)."""

    dispatch: Dispatch
    reason: str
    worker_id: str | None


@attrs.frozen
class _Expire:
    token: int


@attrs.define(eq=False)
class _State:
    book: QueueBook
    matcher: Any
    monitors: dict[Any, otp.Ref] = attrs.Factory(dict)
    timer: otp.Ref | None = None
    timer_due: float | None = None
    token: int = 0


async def start_queue(kind: str, name: str, limits: MatchingLimits, matcher: Any) -> otp.Pid:
    """Start a queue (``kind`` ``"flow"`` or ``"worker"``, ``name`` the flow type or app worker
    id) linked to the caller (its supervisor); ``matcher`` (pid or name) gets its forwards."""
    return await Queue.start_link(kind, name, limits, matcher)


def queue_spec(kind: str, name: str, limits: MatchingLimits, matcher: Any) -> Any:
    """The ``matching_queues`` child spec of one queue (temporary: the matcher starts it again
    when it is needed)."""
    return supervisors.ChildSpec(
        ("matching_queue", kind, name),
        (start_queue, kind, name, limits, matcher),
        restart="temporary",
    )


class Queue(otp.GenServer):
    """One matching queue. Client side: :meth:`statistics`; everything else is messages."""

    @staticmethod
    async def statistics(queue: Any, timeout: float | None = 5.0) -> QueueStatistics:
        """The queue's streams and backlog now.

        Raises:
            otp.CallError: the queue is not alive.
        """
        return await otp.call(queue, "statistics", timeout)

    # -- callbacks ------------------------------------------------------------------------------

    def init(self, kind: str, name: str, limits: MatchingLimits, matcher: Any) -> otp.Ok:
        return otp.Ok(
            _State(QueueBook(kind, name, clock=trio.current_time, limits=limits), matcher)
        )

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        if request == "statistics":
            return otp.Reply(state.book.statistics(), state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    def handle_cast(self, message: Any, state: _State) -> otp.NoReply:
        return self.handle_info(message, state)

    def handle_info(self, message: Any, state: _State) -> otp.NoReply:
        book = state.book
        kind = type(message)
        if kind is Dispatch:
            actions = book.dispatch(message)
        elif kind is StreamIdle:
            stream = message.stream
            if stream not in state.monitors:
                state.monitors[stream] = otp.monitor(stream)
            actions = book.stream_idle(stream, message.worker_id, message.caps)
        elif kind is Accepted:
            actions = book.accepted(message.stream, message.delivery)
        elif kind is Declined:
            actions = book.declined(message.stream, message.delivery, message.reason)
        elif kind is StreamGone:
            ref = state.monitors.pop(message.stream, None)
            if ref is not None:
                otp.demonitor(ref, flush=True)
            actions = book.stream_gone(message.stream)
        elif kind is otp.Down:
            if state.monitors.get(message.pid) != message.ref:
                return otp.NoReply(state)
            del state.monitors[message.pid]
            actions = book.stream_gone(message.pid)
        elif kind is WorkerFreed:
            actions = book.worker_freed(message.worker_id)
        elif kind is WorkerDraining:
            actions = book.worker_draining(message.worker_id)
        elif kind is _Expire:
            if message.token != state.token:
                return otp.NoReply(state)
            state.timer = state.timer_due = None
            actions = book.expire()
        else:
            logger.warning("matching queue %s: unexpected message %r", book.queue, message)
            return otp.NoReply(state)
        _carry_out(state, actions)
        _rearm(state)
        return otp.NoReply(state)


def _carry_out(state: _State, actions: list[Action]) -> None:
    queue = state.book.queue
    for action in actions:
        if isinstance(action, OfferStream):
            otp.send(action.stream, Offer(action.dispatch, queue))
        elif isinstance(action, Route):
            dispatch = action.dispatch
            otp.send(
                dispatch.reply_to,
                Routed(dispatch.task.delivery, queue, action.reason, action.worker_id),
            )
        elif isinstance(action, Reject):
            dispatch = action.dispatch
            otp.send(
                dispatch.reply_to,
                NotDispatched(dispatch.task.delivery, action.reason, action.message),
            )
        else:
            otp.cast(state.matcher, Forward(action.dispatch, action.reason, action.worker_id))


def _rearm(state: _State) -> None:
    """One timer, for the earliest end of a wait."""
    due = state.book.next_expiry()
    if due == state.timer_due:
        return
    if state.timer is not None:
        otp.cancel_timer(state.timer)
        state.timer = None
    state.timer_due = due
    state.token += 1
    if due is not None:
        delay = max(0.0, due - trio.current_time())
        state.timer = otp.send_after(delay, otp.self(), _Expire(state.token))
