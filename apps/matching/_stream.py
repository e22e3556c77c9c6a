"""The server's stream process: one per registered worker stream, linked to its connection.

It is the queue's view of one worker stream (the seed's task stream: "每条 stream 一次只处理一个
调用"): it tells its queue when it is idle, writes the offered TASK, waits for ACCEPT/DECLINE,
then owns the call and reports ``Completed``/``Failed`` to the dispatch's ``reply_to``. If it
ends with a call (its connection died, the worker went silent or closed it) ``Lost`` still
reaches ``reply_to``; an offered, unanswered dispatch goes back to its queue. Idle streams get
an ``M_PING`` every ``ping_interval``; a worker silent for ``peer_timeout`` is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

import otp
import wire

from ._dispatch import (
    Accepted,
    CancelCall,
    Capabilities,
    Completed,
    Declined,
    Dispatch,
    ErrorInfo,
    Failed,
    Lost,
    MatchingLimits,
    Offer,
    Routed,
    StreamGone,
    StreamIdle,
    WorkerFreed,
)
from ._engine_handoff import registry, to_engine
from ._matcher import MATCHER, StreamUp
from ._server_frames import task_message
from ._store_records import trusted_builder

__all__ = ["FreedNotices", "StreamConn", "StreamHandle", "open_stream"]

#: What each call's end sends (every field, in order), built without attrs' frozen
#: ``__init__`` (a quarter fewer instructions; ``_engine_rpcs``'s ``_new_task`` says more).
_new_routed = trusted_builder(Routed)
_new_completed = trusted_builder(Completed)
_new_stream_idle = trusted_builder(StreamIdle)

logger = logging.getLogger("apps.matching")


class StreamConn(Protocol):
    """What a stream needs of its connection: a non-blocking write of one wire ``Match*``
    message (the connection encodes it and writes it to the socket). It must not raise for a
    closed socket (the connection's death ends the stream through their link)."""

    def send_message(self, message: Any) -> None: ...


#: What a ``StreamHandle`` hands over: the worker's frames (from the connection) and the
#: queue's offers.
_HANDED = (
    Offer,
    wire.MatchAccept,
    wire.MatchDecline,
    wire.MatchOutput,
    wire.MatchResult,
    wire.MatchFailure,
    wire.MatchPong,
    wire.MatchClose,
)

#: The stream's phases: waiting for an offer, waiting for the worker's answer to one, owning
#: an accepted call.
_IDLE, _OFFERED, _BUSY = "idle", "offered", "busy"


@attrs.define(eq=False)
class FreedNotices:
    """Shared by the stream processes of one worker connection: whether the worker declined a
    task for capacity since a call of it last ended (then the next call's end tells the
    worker's queues with ``WorkerFreed``, so they offer it what it declined).

    A queue holds a worker's capacity decline until its ``WorkerFreed``; a worker declines for
    capacity only while calls of it run, and each of them ends on this connection after the
    DECLINE was read (the worker frees a slot before it writes the call's outcome). So one
    ``WorkerFreed`` after each run of declines is all the queues need, not one per call. The
    connection sets ``declined`` as it reads the DECLINE, not the stream that gets it: the
    outcome that follows goes to another stream process, which may run first."""

    #: True at first: a reconnected worker's queues may hold declines of its old connection.
    declined: bool = True

    def note_decline(self, decline: wire.MatchDecline) -> None:
        """The connection read ``decline`` for one of its streams (before handing it on)."""
        if decline.reason != "unknown_name" and decline.reason != "draining":
            self.declined = True  # (the queue takes any other reason as no_capacity)


@attrs.define(eq=False)
class _Stream:
    conn: StreamConn
    owner: otp.Pid
    stream_id: int
    worker_id: str
    caps: Capabilities
    queue: otp.Pid
    limits: MatchingLimits
    matcher: Any
    notices: FreedNotices | None = None
    me: Any = None
    last_heard: float = 0.0
    queue_ref: otp.Ref | None = None
    owner_ref: otp.Ref | None = None
    queue_gone: bool = False
    phase: str = _IDLE
    #: When the idle stream's next M_PING is due.
    next_ping: float = 0.0
    #: The offered dispatch, the queue that offered it, and when its answer is due.
    offered: Dispatch | None = None
    offered_by: str = ""
    answer_by: float = 0.0
    #: The call the stream owns (accepted), and whether the worker sent output for it.
    call: Dispatch | None = None
    after_output: bool = False
    #: The cancel scope the stream waits in: its deadline is at or before the phase's (it is
    #: only ever brought forward; when it passes, the phase's real deadline is checked).
    scope: trio.CancelScope | None = None
    #: The scope's deadline as last set (read here without trio's property).
    scope_due: float = 0.0
    #: The worker's frames sent to the process's mailbox and not handled yet: while there
    #: are any, a frame handed over (``StreamHandle.deliver``) follows them there.
    mailed: int = 0
    #: Set once the stream ends (or a frame handled in the connection's task ended it).
    ended: bool = False
    #: Its handle (given to its queue in ``StreamIdle``, so offers are handed over too).
    handle: StreamHandle | None = None
    #: Its queue's handle, once the queue gave it (what it tells the queue is handed over).
    queue_handle: Any = None
    #: The trio run's clock (``trio.current_time`` without its two calls on the way).
    clock: Callable[[], float] = attrs.Factory(lambda: trio.lowlevel.current_clock().current_time)
    #: This run's engines' takers (``_engine_handoff.registry``): kept, not read a call.
    takers: dict[Any, Any] = attrs.Factory(registry)


class _End(Exception):
    """The stream ends (normally)."""


@attrs.frozen
class _Ended:
    """connection -> stream: a frame handled in the connection's task ended the stream."""


@attrs.define(eq=False)
class StreamHandle:
    """A hold on one stream process (from :func:`open_stream`), for its connection and, through
    ``StreamIdle``, its queue (both on the stream's node).

    :meth:`deliver` hands the stream a worker frame or an ``Offer``. The stream's handling of
    either never waits, and it runs in the same trio thread, so while the process has nothing
    handed over still queued in its mailbox, the connection's reader (or the queue) handles it
    itself, on the stream's state, instead of waking the stream's task for it: two wake-ups
    less for every call (the TASK written, the ACCEPT and RESULT read; issue 15). What is
    handed over keeps its order (it follows anything still in the mailbox), and nothing else
    the stream gets races it: an offer is never answered before its TASK is written, a
    ``Down`` or ``CancelCall`` overtaken is what a mailbox gives when it came second (a stream
    whose connection died ends on that ``Down`` and its queue takes the offer back), and a
    stream ended by a frame handled here ends its process at its next message. Told the
    stream's ``StreamIdle`` or ``Declined``, its queue may offer it its next dispatch right
    there: so the stream tells its queue what it is only once it is (idle), last."""

    pid: otp.Pid
    state: _Stream

    def deliver(self, frame: Any) -> None:
        """Hand over a worker frame (from the connection)."""
        state = self.state
        if state.mailed or state.me is None or state.ended or not otp.is_process_alive(self.pid):
            state.mailed += 1
            otp.send(self.pid, frame)
            return
        self._take(frame)

    def bind_queue(self, queue_handle: Any) -> None:
        """(From its queue, as it first hears of the stream.) What the stream tells the queue
        from now on goes to ``queue_handle`` (``_queue.QueueHandle.from_stream``)."""
        self.state.queue_handle = queue_handle

    def offer(self, offer: Offer) -> None:
        """Hand over an offer (from the queue). A stream whose connection is doomed gets it
        by message, as it would have before it ends: its queue takes it back then."""
        if otp.is_process_alive(self.state.owner):
            self.deliver(offer)
        else:
            self.state.mailed += 1
            otp.send(self.pid, offer)

    def deliver_served(
        self, accept: wire.MatchAccept, outcome: wire.MatchResult | wire.MatchFailure
    ) -> None:
        """Hand over a worker's ACCEPT and the outcome of the same delivery that followed it at
        once (from the connection): as :meth:`deliver` of each, in one message to the call's
        ``reply_to`` and one to the queue instead of two each, when it is taken here."""
        state = self.state
        if state.mailed or state.me is None or state.ended or not otp.is_process_alive(self.pid):
            self.deliver(accept)
            self.deliver(outcome)
            return
        self._take(accept, outcome)

    def _take(self, frame: Any, outcome: Any = None) -> None:
        state = self.state
        try:
            if outcome is None:
                _handle(state, frame)
            else:
                _served(state, frame, outcome)
        except _End:
            state.ended = True
            otp.send(self.pid, _Ended())
        except Exception as exc:  # a bug: it ends the stream (as it would in its own task)
            logger.exception("matching: stream %d failed on %r", state.stream_id, frame)
            state.ended = True
            otp.exit(self.pid, ("stream_failed", repr(exc)))


def open_stream(
    conn: StreamConn,
    stream_id: int,
    worker_id: str,
    caps: Capabilities,
    queue_pid: otp.Pid,
    *,
    limits: MatchingLimits | None = None,
    matcher: Any = MATCHER,
    notices: FreedNotices | None = None,
) -> StreamHandle:
    """Spawn the stream process linked to the caller (the connection process) and return its
    :class:`StreamHandle`. Call it right after :func:`register_stream` returned
    ``queue_pid``; then hand the worker's frames for ``stream_id`` (``MatchAccept``,
    ``MatchDecline``, ``MatchOutput``, ``MatchResult``, ``MatchFailure``, ``MatchPong``,
    ``MatchClose``) to its ``deliver``, in the order read (sending them to its ``pid`` as
    plain messages works too, a wake-up of the stream's task each). ``notices`` is shared by
    the connection's streams (see :class:`FreedNotices`); None sends ``WorkerFreed`` after
    every call.

    The stream ends normally when the worker closes it (``MatchClose``), when it stays silent
    for ``limits.peer_timeout`` (it writes ``MatchClose`` then) and when its queue goes away
    (once its call, if any, is over). It also ends when the connection does.
    """
    state = _Stream(
        conn,
        otp.self(),
        stream_id,
        worker_id,
        caps,
        queue_pid,
        limits if limits is not None else MatchingLimits(),
        matcher,
        notices,
    )
    pid = otp.spawn_link(_run, state)
    # Told from here, not by the stream: the matcher counts it before the caller answers
    # REGISTERED (which may reach the worker before the new process first runs).
    otp.cast(matcher, StreamUp(pid, state.owner, worker_id, queue_pid))
    state.handle = StreamHandle(pid, state)
    return state.handle


async def _run(state: _Stream) -> None:
    state.me = otp.self()

    def lost(pid: otp.Pid, reason: Any) -> None:
        call = state.call
        if call is not None:
            state.call = None
            try:
                otp.send(
                    call.reply_to, Lost(call.task.delivery, state.worker_id, state.after_output)
                )
            except Exception:  # the node is going away
                logger.debug("matching stream: could not report a lost call", exc_info=True)

    otp.add_exit_hook(lost)
    state.queue_ref = otp.monitor(state.queue)
    state.owner_ref = otp.monitor(state.owner)
    state.last_heard = state.clock()
    receive = otp.receive
    try:
        otp.send(state.queue, StreamIdle(state.me, state.worker_id, state.caps, state.handle))
        _to_idle(state)
        while True:
            # One cancel scope for many messages (not one per receive): its deadline is the
            # phase's at most, and only moves when it passes (see _Stream.scope).
            state.scope_due = due = _due(state)
            with trio.CancelScope(deadline=due) as scope:
                state.scope = scope
                while True:
                    _mailed(state, await receive())
            # The deadline passed: what came meanwhile counts first (a PONG that is in the
            # mailbox shows the worker is alive), as a receive with a timeout has it.
            while (message := await receive(timeout=0, default=None)) is not None:
                _mailed(state, message)
            _deadline_passed(state)
    except _End:
        return
    finally:
        state.ended = True


def _mailed(state: _Stream, message: Any) -> None:
    """One message from the mailbox."""
    if state.ended:
        raise _End  # (the connection's task handled a frame that ended the stream)
    if state.mailed and isinstance(message, _HANDED):
        state.mailed -= 1
    _handle(state, message)


def _tell_queue(state: _Stream, message: Any) -> None:
    """Tell the stream's queue ``message``: handed over once the queue gave its handle (its
    first ``StreamIdle``, which has the queue monitor the stream, is sent)."""
    queue_handle = state.queue_handle
    if queue_handle is None:
        otp.send(state.queue, message)
    else:
        queue_handle.from_stream(message)


def _close(state: _Stream) -> None:
    state.conn.send_message(wire.MatchClose(rid=state.stream_id))


def _due(state: _Stream) -> float:
    """When the phase's deadline passes (a ping, a silent worker, an answer not given)."""
    limits = state.limits
    if state.phase is _IDLE:
        return min(state.next_ping, state.last_heard + limits.peer_timeout)
    if state.phase is _OFFERED:
        return state.answer_by
    return state.last_heard + limits.peer_timeout


def _to_idle(state: _Stream, now: float | None = None) -> None:
    """Idle (registered, or its offer declined, or its call over); a stream whose queue is gone
    ends instead. ``now``: the clock, if read.

    The idle phase may be due sooner than the scope's deadline: it is brought forward. Only
    going idle needs that: an offer's answer (``now + peer_timeout``) and a call's silence
    (from the ACCEPT just heard) are due no sooner than the phase before them."""
    if state.queue_gone:
        _close(state)
        raise _End
    state.phase = _IDLE
    if now is None:
        now = state.clock()
    state.next_ping = now + state.limits.ping_interval
    scope = state.scope
    if scope is not None:
        due = _due(state)
        if due < state.scope_due:
            state.scope_due = scope.deadline = due


def _deadline_passed(state: _Stream) -> None:
    now = state.clock()
    limits = state.limits
    phase = state.phase
    if phase is _IDLE:
        if now >= state.last_heard + limits.peer_timeout:
            logger.info(
                "matching: worker %r silent on stream %d for %g s: closing it",
                state.worker_id,
                state.stream_id,
                limits.peer_timeout,
            )
            _tell_queue(state, StreamGone(state.me))
            _close(state)
            raise _End
        if now >= state.next_ping:
            state.conn.send_message(wire.MatchPing(rid=state.stream_id))
            state.next_ping = now + limits.ping_interval
    elif phase is _OFFERED:
        if now >= state.answer_by:
            assert state.offered is not None
            logger.info(
                "matching: worker %r did not answer delivery %d on stream %d within %g s:"
                " closing the stream",
                state.worker_id,
                state.offered.task.delivery,
                state.stream_id,
                limits.peer_timeout,
            )
            _tell_queue(state, StreamGone(state.me))
            _close(state)
            raise _End
    elif now >= state.last_heard + limits.peer_timeout:
        assert state.call is not None
        logger.info(
            "matching: worker %r silent for %g s during delivery %d: the call is lost",
            state.worker_id,
            limits.peer_timeout,
            state.call.task.delivery,
        )
        _close(state)
        raise _End  # the exit hook reports Lost


def _handle(state: _Stream, message: Any) -> None:
    """One message, whatever the phase (it never waits)."""
    kind = type(message)
    if kind is otp.Down:
        if message.ref == state.owner_ref:
            raise _End  # the connection is gone (the exit hook reports a call as lost)
        if message.ref == state.queue_ref:
            state.queue_gone = True
            if state.phase is _IDLE:
                _close(state)
                raise _End
        return
    if kind is Offer:
        if state.phase is _IDLE:
            _offer(state, message.dispatch, message.queue)
        else:
            _refuse(state, message.dispatch)
        return
    if kind is CancelCall:
        call = state.call
        if call is not None and call.task.delivery == message.delivery:
            state.conn.send_message(wire.MatchCancel(message.delivery, rid=state.stream_id))
        return
    # Anything from the worker shows it is alive.
    state.last_heard = state.clock()
    if kind is wire.MatchPong:
        return
    phase = state.phase
    if kind is wire.MatchClose:
        if phase is not _BUSY:  # (a busy one's exit hook reports its call Lost)
            _tell_queue(state, StreamGone(state.me))
        raise _End
    if phase is _OFFERED:
        offered = state.offered
        assert offered is not None
        if kind is wire.MatchAccept and message.delivery == offered.task.delivery:
            _accepted(state, offered)
        elif kind is wire.MatchDecline and message.delivery == offered.task.delivery:
            state.offered = None
            # Idle first (see StreamHandle; its connection noted a decline in FreedNotices)
            _to_idle(state)
            _tell_queue(state, Declined(state.me, offered.task.delivery, message.reason))
    elif phase is _BUSY:
        call = state.call
        assert call is not None
        delivery = call.task.delivery
        if (kind is wire.MatchResult or kind is wire.MatchFailure) and message.delivery == delivery:
            _call_ended(state, call, message, None, state.last_heard)  # (the clock, just read)
        elif kind is wire.MatchOutput and message.delivery == delivery:
            state.after_output = True


def _served(
    state: _Stream, accept: wire.MatchAccept, outcome: wire.MatchResult | wire.MatchFailure
) -> None:
    """The worker's ACCEPT and the outcome of the same delivery, read at once: ``_handle`` of
    each, with the ``Routed`` "delivered" carried by the outcome and the queue's ``Accepted``
    by its ``StreamIdle``."""
    offered = state.offered
    if state.phase is not _OFFERED or offered is None or accept.delivery != offered.task.delivery:
        _handle(state, accept)
        _handle(state, outcome)
        return
    state.last_heard = now = state.clock()
    state.offered = None
    routed = _new_routed(accept.delivery, state.offered_by, "delivered", state.worker_id, state.me)
    _call_ended(state, offered, outcome, routed, now)


def _call_ended(
    state: _Stream,
    call: Dispatch,
    message: wire.MatchResult | wire.MatchFailure,
    delivered: Routed | None = None,
    now: float | None = None,
) -> None:
    """The worker's RESULT or FAILURE of ``call``: its outcome to ``reply_to`` (carrying
    ``delivered``, the call's routing not sent yet, if any; an RPC's handled here by a local
    engine that takes it, ``_engine_handoff``), then the stream is idle again (``now``: the
    clock, if read)."""
    state.call = None
    delivery = call.task.delivery
    worker_id = state.worker_id
    if type(message) is wire.MatchResult:
        value, patch, not_yet = message.value, message.patch, message.not_yet is True
        completed = _new_completed(delivery, worker_id, value, patch, not_yet, delivered)
        try:
            to_engine(call.reply_to, completed, state.takers)
        except otp.BadArg as exc:
            # The flow's engine is on another node, and this result is past the
            # distribution's limits (a value nested deeper than they allow, say): the
            # attempt fails, saying why, rather than this stream (and its connection).
            failed = Failed(delivery, worker_id, _cannot_cross(exc), delivered)
            otp.send(call.reply_to, failed)
    else:
        assert type(message) is wire.MatchFailure
        error = ErrorInfo(message.type, message.message, message.retryable)
        to_engine(call.reply_to, Failed(delivery, worker_id, error, delivered), state.takers)
    _call_over(state, None if delivered is None else delivery, now)


def _offer(state: _Stream, dispatch: Dispatch, queue: str) -> None:
    """Write the TASK; the worker's answer comes as a message."""
    task = dispatch.task
    delivery = task.delivery
    now = state.clock()
    timeout = None if task.deadline is None else max(0.0, task.deadline - now)
    try:
        frame = task_message(
            state.stream_id,
            delivery,
            task.kind,
            task.flow_type,
            task.flow_id,
            task.name,
            task.execution_id,
            task.attempt,
            task.args if type(task.args) is list else list(task.args),
            task.state if type(task.state) is dict else dict(task.state),
            timeout,
            task.step_kind,
        )
    except wire.WireError as exc:
        # The engine's task is not writable: it fails (the stream itself is fine).
        _tell_queue(state, Accepted(state.me, delivery))
        otp.send(
            dispatch.reply_to,
            Failed(delivery, state.worker_id, ErrorInfo("InvalidTask", str(exc), False)),
        )
        _to_idle(state)
        _tell_queue(state, StreamIdle(state.me, state.worker_id, state.caps, state.handle))
        return
    state.conn.send_message(frame)
    state.phase = _OFFERED
    state.offered = dispatch
    state.offered_by = queue
    state.answer_by = now + state.limits.peer_timeout
    # (the scope's deadline stands: the idle phase was due by then, see _to_idle)


def _accepted(state: _Stream, dispatch: Dispatch) -> None:
    """The worker accepted: the stream owns the call until its RESULT or FAILURE."""
    delivery = dispatch.task.delivery
    state.offered = None
    state.call = dispatch
    state.after_output = False
    state.phase = _BUSY
    routed = Routed(delivery, state.offered_by, "delivered", state.worker_id, state.me)
    otp.send(dispatch.reply_to, routed)
    _tell_queue(state, Accepted(state.me, delivery))
    # (the scope's deadline stands: the offer was due by then, see _to_idle)


def _call_over(state: _Stream, accepted: int | None = None, now: float | None = None) -> None:
    """The call's outcome went to its ``reply_to``: the worker's queues may offer it what it
    declined for capacity, and the stream is idle again (``accepted``: the call's delivery,
    when its queue has not been told ``Accepted`` yet)."""
    notices = state.notices
    if notices is None or notices.declined:
        if notices is not None:
            notices.declined = False
        otp.cast(state.matcher, WorkerFreed(state.worker_id))
    _to_idle(state, now)
    idle = _new_stream_idle(state.me, state.worker_id, state.caps, state.handle, accepted)
    _tell_queue(state, idle)


def _refuse(state: _Stream, dispatch: Dispatch) -> None:
    """An offer while the stream has one already: it goes back. Never, by the rules: a queue
    offers a stream a dispatch only once told it is idle (``StreamIdle``, or ``Declined``
    answering the last offer), told in order, and only once it is (see StreamHandle)."""
    logger.warning(
        "matching: stream %d of %r got a second offer (delivery %d): sending it back",
        state.stream_id,
        state.worker_id,
        dispatch.task.delivery,
    )
    _tell_queue(state, Declined(state.me, dispatch.task.delivery, "no_capacity"))


def _cannot_cross(exc: otp.BadArg) -> ErrorInfo:
    return ErrorInfo(
        "result_cannot_cross",
        f"the step's result cannot be sent to the server that owns the flow: {exc}; return a"
        " smaller or flatter value (or put it in a blob)",
        False,
    )
