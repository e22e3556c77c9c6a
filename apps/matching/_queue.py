"""The queue actor: one per flow type and one per app worker id, around a ``QueueBook``.

A GenServer started (temporary) under the DynamicSupervisor ``matching_queues`` by the
matcher. It monitors the streams that register with it (a stream's death is a ``StreamGone``),
keeps one ``send_after`` timer for the earliest end of a wait, and carries out the book's
actions: offers to streams, outcomes to ``reply_to``, and forwards to flow-type queues through
the matcher. Messages reach it as casts or as plain messages alike.

A queue unused (no stream, no backlog) for ``limits.queue_idle_timeout`` tells the matcher
(``QueueIdle``, with the number of dispatches it has received); the matcher forgets it and
answers ``StopIdle`` when no dispatch or registration can still be on its way to it, and the
queue stops (``normal``), handing back to the matcher any dispatch the engine sent it straight
meanwhile (``_matcher_routes``). Otherwise the queue asks again after another idle timeout.

The engine hands it the dispatches it sends straight (``QueueHandle``): while nothing handed
over waits in its mailbox, the engine's task runs the queue's handling of one itself.
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
from ._matcher_remote import HandOff
from ._queue_book import (
    Action,
    OfferStream,
    QueueBook,
    QueueStatistics,
    Reject,
    Route,
)

__all__ = [
    "Forward",
    "Queue",
    "QueueHandle",
    "QueueIdle",
    "StopIdle",
    "queue_spec",
    "start_queue",
]

logger = logging.getLogger("apps.matching")

# (read from another server's node too: the matcher's statistics ask each of its queues)
otp.remote_value(QueueStatistics, name="matching.QueueStatistics")


@attrs.frozen(eq=False)
class Forward:
    """queue -> matcher: hand ``dispatch`` to its flow type's queue (``reason`` for ``Routed``;
    ``worker_id`` the sticky worker it leaves)."""

    dispatch: Dispatch
    reason: str
    worker_id: str | None


@attrs.frozen(eq=False)
class QueueIdle:
    """queue -> matcher: the queue ``queue`` has had no stream and no backlog for
    ``queue_idle_timeout``, having received ``received`` dispatches in all."""

    queue: otp.Pid
    received: int


@attrs.frozen
class StopIdle:
    """matcher -> queue: the matcher forgot the queue (nothing is on its way to it): stop."""


@attrs.frozen(eq=False)
class _Mailed:
    """A stream's message its queue's handle sent rather than handed over (``_State.mailed``)."""

    message: StreamIdle | Accepted | Declined | StreamGone


@attrs.frozen
class _Expire:
    token: int


@attrs.frozen
class _IdleCheck:
    token: int


@attrs.define(eq=False)
class _State:
    book: QueueBook
    matcher: Any
    monitors: dict[Any, otp.Ref] = attrs.Factory(dict)
    #: Stream -> what its offers are handed to (``StreamIdle.handle``; absent: sent).
    handles: dict[Any, Any] = attrs.Factory(dict)
    timer: otp.Ref | None = None
    timer_due: float | None = None
    token: int = 0
    idle_after: float = 300.0
    idle_timer: otp.Ref | None = None
    idle_token: int = 0
    #: Dispatches received (the matcher counts those it sent, to know none is on its way).
    received: int = 0
    #: ``NoReply(self)``, built once: every message ends with it (a frozen value, so one does).
    carry_on: Any = None
    #: The queue's pid (its handling may run in another process's task: ``QueueHandle``).
    me: Any = None
    #: Its handle (``QueueHandle``; None if it was started without one).
    handle: QueueHandle | None = None
    #: Told to stop (``StopIdle``), or failed: nothing more is handled outside its own task.
    stopped: bool = False
    #: Handling something now (a stream's answer to an offer it makes is sent, not handled
    #: inside it).
    busy: bool = False
    #: Stream -> how many of its messages the handle sent and the queue has not handled yet
    #: (while any, its next ones follow them to the mailbox).
    mailed: dict[Any, int] = attrs.Factory(dict)


@attrs.define(eq=False)
class QueueHandle:
    """A hold on one queue process, made by whoever starts it (the matcher, which publishes it
    beside the queue's direct route, ``_matcher_routes``) and bound by the queue's ``init``.

    :meth:`dispatch` hands the queue a ``Dispatch``, :meth:`from_stream` a message of one of
    its streams. The queue's handling of either never waits and runs in the same trio thread,
    so the caller (the engine; the task that runs the stream: its connection's reader, most
    often) handles it itself, on the queue's state, instead of waking the queue's task (as
    ``StreamHandle`` does for a stream): two wake-ups less per Step (one per RPC), and the
    TASK goes out in the engine's own scheduling batch, ahead of its reply to ``start_flow``
    (issue 15). What one sender hands over keeps its order: a stream's message follows any of
    its own still in the mailbox (its first ``StreamIdle``, which has the queue monitor it,
    always comes by message, and the queue gives the stream this handle then), and one that
    comes while the queue is handling something (a stream answering the offer it is making)
    goes to the mailbox. A message of another sender still in the mailbox is overtaken,
    which is what the mailbox gives when that one came second. A queue told to stop
    (``StopIdle``), failed or not alive gets it by message, as before (where it dies with the
    queue, whose monitor tells the engine and the stream); one whose handling fails is killed
    with ``("queue_failed", ...)``, not its caller (whose monitor of the queue makes what it
    sent there ``Lost``).
    """

    pid: otp.Pid | None = None
    state: _State | None = None

    def dispatch(self, dispatch: Dispatch) -> None:
        """Hand over ``dispatch`` (never blocks)."""
        state = self.state
        pid = self.pid
        assert pid is not None and state is not None, "a QueueHandle is bound by the queue's init"
        if state.busy or state.stopped or not otp.is_process_alive(pid):
            otp.send(pid, dispatch)
            return
        state.busy = True
        try:
            state.received += 1
            _after(state, state.book.dispatch(dispatch))
        except Exception as exc:  # a bug: it ends the queue (as it would in its own task)
            self._failed(exc, dispatch)
        state.busy = False

    def from_stream(self, message: StreamIdle | Accepted | Declined | StreamGone) -> None:
        """Hand over a message of one of the queue's streams (never blocks)."""
        state = self.state
        pid = self.pid
        assert pid is not None and state is not None, "a QueueHandle is bound by the queue's init"
        stream = message.stream
        if (
            isinstance(message, StreamGone)  # (its handling flushes the queue's own mailbox)
            or state.busy
            or stream in state.mailed
            or stream not in state.monitors
            or state.stopped
            or not otp.is_process_alive(pid)
        ):
            state.mailed[stream] = state.mailed.get(stream, 0) + 1
            otp.send(pid, _Mailed(message))
            return
        state.busy = True
        try:
            _after(state, _from_stream(state, message))
        except Exception as exc:  # a bug: it ends the queue (as it would in its own task)
            self._failed(exc, message)
        state.busy = False

    def _failed(self, exc: Exception, message: Any) -> None:
        state = self.state
        assert state is not None
        logger.exception("matching queue %s failed on %r", state.book.queue, message)
        state.stopped = True
        otp.exit(state.me, ("queue_failed", repr(exc)))


async def start_queue(
    kind: str,
    name: str,
    limits: MatchingLimits,
    matcher: Any,
    handle: QueueHandle | None = None,
) -> otp.Pid:
    """Start a queue (``kind`` ``"flow"`` or ``"worker"``, ``name`` the flow type or app worker
    id) linked to the caller (its supervisor); ``matcher`` (pid or name) gets its forwards.
    ``handle``, if given, is bound to it before this returns."""
    return await Queue.start_link(kind, name, limits, matcher, handle)


def queue_spec(
    kind: str, name: str, limits: MatchingLimits, matcher: Any, handle: QueueHandle | None = None
) -> Any:
    """The ``matching_queues`` child spec of one queue (temporary: the matcher starts it again
    when it is needed)."""
    return supervisors.ChildSpec(
        ("matching_queue", kind, name),
        (start_queue, kind, name, limits, matcher, handle),
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

    def init(
        self,
        kind: str,
        name: str,
        limits: MatchingLimits,
        matcher: Any,
        handle: QueueHandle | None = None,
    ) -> otp.Ok:
        # The run's clock itself (``trio.current_time`` is two calls more a read).
        clock = trio.lowlevel.current_clock().current_time
        state = _State(
            QueueBook(kind, name, clock=clock, limits=limits),
            matcher,
            idle_after=limits.queue_idle_timeout,
            me=otp.self(),
        )
        state.carry_on = otp.NoReply(state)
        _watch_idle(state)
        if handle is not None:
            handle.pid, handle.state = state.me, state
            state.handle = handle
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        if request == "statistics":
            return otp.Reply(state.book.statistics(), state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    def handle_cast(self, message: Any, state: _State) -> otp.NoReply | otp.Stop:
        return self.handle_info(message, state)

    def handle_info(self, message: Any, state: _State) -> otp.NoReply | otp.Stop:
        state.busy = True
        try:
            return _handle(state, message)
        finally:
            state.busy = False


def _handle(state: _State, message: Any) -> otp.NoReply | otp.Stop:
    """One message from the mailbox."""
    if type(message) is _Mailed:
        message = message.message
        stream = message.stream
        left = state.mailed[stream] - 1
        if left:
            state.mailed[stream] = left
        else:
            del state.mailed[stream]
    book = state.book
    kind = type(message)
    if kind is Dispatch:
        state.received += 1
        actions = book.dispatch(message)
    elif kind is WorkerFreed:  # (one per call ended, to each queue of its worker)
        actions = book.worker_freed(message.worker_id)
    elif kind is StreamIdle:
        stream = message.stream
        if stream not in state.monitors:
            state.monitors[stream] = otp.monitor(stream)
            if message.handle is not None:
                state.handles[stream] = message.handle
                if state.handle is not None:
                    message.handle.bind_queue(state.handle)  # (its next ones handed over)
        actions = _from_stream(state, message)
    elif kind is Accepted:
        _from_stream(state, message)  # (it changes no wait, nor whether the queue is used)
        return state.carry_on
    elif kind is Declined:
        actions = _from_stream(state, message)
    elif kind is StreamGone:
        ref = state.monitors.pop(message.stream, None)
        state.handles.pop(message.stream, None)
        if ref is not None:
            otp.demonitor(ref, flush=True)
        _note_offer_gone(book, message.stream)
        actions = book.stream_gone(message.stream)
    elif kind is otp.Down:
        if state.monitors.get(message.pid) != message.ref:
            return state.carry_on
        del state.monitors[message.pid]
        state.handles.pop(message.pid, None)
        _note_offer_gone(book, message.pid)
        actions = book.stream_gone(message.pid)
    elif kind is WorkerDraining:
        actions = book.worker_draining(message.worker_id)
    elif kind is HandOff:
        actions = book.hand_off()
    elif kind is _Expire:
        if message.token != state.token:
            return state.carry_on
        state.timer = state.timer_due = None
        actions = book.expire()
    elif kind is _IdleCheck:
        if message.token == state.idle_token:
            state.idle_timer = None
            if book.unused:
                otp.cast(state.matcher, QueueIdle(state.me, state.received))
            _watch_idle(state)
        return state.carry_on
    elif kind is StopIdle:
        # (a dispatch sent straight to it may have come after it said it was unused: it
        # goes back to the matcher, and the engine forgets it was here on this normal exit)
        state.stopped = True
        _carry_out(state, book.hand_back())
        return otp.Stop(otp.NORMAL, state)
    else:
        logger.warning("matching queue %s: unexpected message %r", book.queue, message)
        return state.carry_on
    _after(state, actions)
    return state.carry_on


def _from_stream(state: _State, message: StreamIdle | Accepted | Declined) -> list[Action]:
    """A message of a stream the queue monitors already (by message, or handed over)."""
    book = state.book
    kind = type(message)
    if kind is StreamIdle:
        assert isinstance(message, StreamIdle)
        if message.accepted is not None:  # (its Accepted, sent with it)
            book.accepted(message.stream, message.accepted)
        return book.stream_idle(message.stream, message.worker_id, message.caps)
    if kind is Accepted:
        # (one per call: it changes no wait, and the stream keeps the queue in use)
        assert isinstance(message, Accepted)
        book.accepted(message.stream, message.delivery)
        return []
    assert isinstance(message, Declined)
    return book.declined(message.stream, message.delivery, message.reason)


def _after(state: _State, actions: list[Action]) -> None:
    """Carry out the book's ``actions``; then its timers follow its waits and its use."""
    book = state.book
    if actions:
        _carry_out(state, actions)
    if book.expiries or state.timer_due is not None:  # (else _rearm has nothing to do)
        _rearm(state)
    if state.idle_timer is not None or book.unused:  # (else neither has _watch_idle)
        _watch_idle(state)


def _carry_out(state: _State, actions: list[Action]) -> None:
    queue = state.book.queue
    for action in actions:
        if isinstance(action, OfferStream):
            handle = state.handles.get(action.stream)
            if handle is not None:
                handle.offer(Offer(action.dispatch, queue))
            else:
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
        state.timer = otp.send_after(delay, state.me, _Expire(state.token))


def _watch_idle(state: _State) -> None:
    """An idle timer while the book is unused, none while it is in use."""
    if state.book.unused:
        if state.idle_timer is None:
            state.idle_token += 1
            state.idle_timer = otp.send_after(
                state.idle_after, state.me, _IdleCheck(state.idle_token)
            )
    elif state.idle_timer is not None:
        otp.cancel_timer(state.idle_timer)
        state.idle_timer = None
        state.idle_token += 1


def _note_offer_gone(book: QueueBook, stream: Any) -> None:
    """A stream went away with a Step offered to it and not yet answered: it is offered again,
    but the worker may have started it (its ACCEPT lost with the connection), so this is logged
    as a possible redelivery, as the engine logs a ``Lost`` one (the chaos run counts both)."""
    if book.stream_state(stream) != "offered":
        return
    dispatch = book.offered().get(stream)
    if dispatch is None or dispatch.task.kind != "step":
        return
    task = dispatch.task
    index = task.execution_id.rsplit("/", 2)[-2]
    logger.info(
        "matching queue: redelivery of step %s attempt %d of flow %s (offered to a worker that"
        " went away before answering: it may have started it)",
        index, task.attempt, task.flow_id,
    )  # fmt: skip
