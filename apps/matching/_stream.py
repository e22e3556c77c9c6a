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
from typing import Any, Protocol

import attrs
import trio

import otp
import wire

from ._dispatch import (
    Accepted,
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
from ._matcher import MATCHER, StreamUp

__all__ = ["StreamConn", "start_stream"]

logger = logging.getLogger("apps.matching")


class StreamConn(Protocol):
    """What a stream needs of its connection: a non-blocking write of one wire ``Match*``
    message (the connection encodes it and writes it to the socket). It must not raise for a
    closed socket (the connection's death ends the stream through their link)."""

    def send_message(self, message: Any) -> None: ...


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
    me: Any = None
    last_heard: float = 0.0
    queue_ref: otp.Ref | None = None
    owner_ref: otp.Ref | None = None
    queue_gone: bool = False
    #: The call the stream owns (accepted), and whether the worker sent output for it.
    call: Dispatch | None = None
    after_output: bool = False


class _End(Exception):
    """The stream ends (normally)."""


def start_stream(
    conn: StreamConn,
    stream_id: int,
    worker_id: str,
    caps: Capabilities,
    queue_pid: otp.Pid,
    *,
    limits: MatchingLimits | None = None,
    matcher: Any = MATCHER,
) -> otp.Pid:
    """Spawn the stream process linked to the caller (the connection process) and return its
    pid. Call it right after :func:`register_stream` returned ``queue_pid``; then forward the
    worker's frames for ``stream_id`` (``MatchAccept``, ``MatchDecline``, ``MatchOutput``,
    ``MatchResult``, ``MatchFailure``, ``MatchPong``, ``MatchClose``) to the returned pid as
    plain messages.

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
    )
    return otp.spawn_link(_run, state)


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
    otp.cast(state.matcher, StreamUp(state.me, state.owner, state.worker_id, state.queue))
    state.queue_ref = otp.monitor(state.queue)
    state.owner_ref = otp.monitor(state.owner)
    state.last_heard = trio.current_time()
    try:
        while True:
            if state.queue_gone:
                _close(state)
                return
            otp.send(state.queue, StreamIdle(state.me, state.worker_id, state.caps))
            while await _idle(state):
                pass
    except _End:
        return


def _close(state: _Stream) -> None:
    state.conn.send_message(wire.MatchClose(rid=state.stream_id))


def _watch(state: _Stream, message: Any) -> bool:
    """Handle a message any phase handles alike; True if it was one."""
    kind = type(message)
    if kind is otp.Down:
        if message.ref == state.owner_ref:
            raise _End  # the connection is gone (the exit hook reports a call as lost)
        if message.ref == state.queue_ref:
            state.queue_gone = True
        return True
    if kind is wire.MatchPong:
        state.last_heard = trio.current_time()
        return True
    return False


async def _idle(state: _Stream) -> bool:
    """Wait for an offer (pinging the worker); True to go on waiting (the offer was declined),
    False once a call is over (the stream is idle again)."""
    limits = state.limits
    next_ping = trio.current_time() + limits.ping_interval
    while True:
        if state.queue_gone:
            _close(state)
            raise _End
        now = trio.current_time()
        if now - state.last_heard >= limits.peer_timeout:
            logger.info(
                "matching: worker %r silent on stream %d for %g s: closing it",
                state.worker_id,
                state.stream_id,
                limits.peer_timeout,
            )
            otp.send(state.queue, StreamGone(state.me))
            _close(state)
            raise _End
        if now >= next_ping:
            state.conn.send_message(wire.MatchPing(rid=state.stream_id))
            next_ping = now + limits.ping_interval
        timeout = max(0.0, min(next_ping, state.last_heard + limits.peer_timeout) - now)
        message = await otp.receive(timeout=timeout, default=None)
        if message is None or _watch(state, message):
            continue
        kind = type(message)
        if kind is Offer:
            return await _offered(state, message.dispatch, message.queue)
        if kind is wire.MatchClose:
            otp.send(state.queue, StreamGone(state.me))
            raise _End
        # Anything else from the worker (a stray answer) shows it is alive.
        state.last_heard = trio.current_time()


async def _offered(state: _Stream, dispatch: Dispatch, queue: str) -> bool:
    """Write the TASK and wait for the worker's answer; then run the call if accepted."""
    task = dispatch.task
    delivery = task.delivery
    now = trio.current_time()
    timeout = None if task.deadline is None else max(0.0, task.deadline - now)
    try:
        frame = wire.MatchTask(
            rid=state.stream_id,
            delivery=delivery,
            kind=task.kind,
            flow_type=task.flow_type,
            flow_id=task.flow_id,
            name=task.name,
            execution_id=task.execution_id,
            attempt=task.attempt,
            args=task.args if type(task.args) is list else list(task.args),
            state=task.state if type(task.state) is dict else dict(task.state),
            timeout=timeout,
        )
    except wire.WireError as exc:
        # The engine's task is not writable: it fails (the stream itself is fine).
        otp.send(state.queue, Accepted(state.me, delivery))
        otp.send(
            dispatch.reply_to,
            Failed(delivery, state.worker_id, ErrorInfo("InvalidTask", str(exc), False)),
        )
        return False
    state.conn.send_message(frame)
    answer_by = now + state.limits.peer_timeout
    while True:
        left = answer_by - trio.current_time()
        if left <= 0:
            logger.info(
                "matching: worker %r did not answer delivery %d on stream %d within %g s:"
                " closing the stream",
                state.worker_id,
                delivery,
                state.stream_id,
                state.limits.peer_timeout,
            )
            otp.send(state.queue, StreamGone(state.me))
            _close(state)
            raise _End
        message = await otp.receive(timeout=left, default=None)
        if message is None or _watch(state, message):
            continue
        kind = type(message)
        state.last_heard = trio.current_time()
        if kind is wire.MatchAccept and message.delivery == delivery:
            state.call = dispatch
            state.after_output = False
            otp.send(dispatch.reply_to, Routed(delivery, queue, "delivered", state.worker_id))
            otp.send(state.queue, Accepted(state.me, delivery))
            await _busy(state)
            return False
        if kind is wire.MatchDecline and message.delivery == delivery:
            otp.send(state.queue, Declined(state.me, delivery, message.reason))
            return True
        if kind is wire.MatchClose:
            otp.send(state.queue, StreamGone(state.me))
            raise _End
        if kind is Offer:
            _refuse(state, message.dispatch)


async def _busy(state: _Stream) -> None:
    """Own the accepted call until the worker's RESULT or FAILURE."""
    call = state.call
    assert call is not None
    delivery = call.task.delivery
    worker_id = state.worker_id
    while True:
        left = state.last_heard + state.limits.peer_timeout - trio.current_time()
        if left <= 0:
            logger.info(
                "matching: worker %r silent for %g s during delivery %d: the call is lost",
                worker_id,
                state.limits.peer_timeout,
                delivery,
            )
            _close(state)
            raise _End  # the exit hook reports Lost
        message = await otp.receive(timeout=left, default=None)
        if message is None or _watch(state, message):
            continue
        kind = type(message)
        state.last_heard = trio.current_time()
        if kind is wire.MatchResult and message.delivery == delivery:
            state.call = None
            otp.send(call.reply_to, Completed(delivery, worker_id, message.value, message.patch))
            break
        if kind is wire.MatchFailure and message.delivery == delivery:
            state.call = None
            error = ErrorInfo(message.type, message.message, message.retryable)
            otp.send(call.reply_to, Failed(delivery, worker_id, error))
            break
        if kind is wire.MatchOutput and message.delivery == delivery:
            state.after_output = True
        elif kind is wire.MatchClose:
            raise _End  # the exit hook reports Lost
        elif kind is Offer:
            _refuse(state, message.dispatch)
    otp.cast(state.matcher, WorkerFreed(worker_id))


def _refuse(state: _Stream, dispatch: Dispatch) -> None:
    """An offer while the stream has one already (never, by the queue's rules): it goes back."""
    logger.warning(
        "matching: stream %d of %r got a second offer (delivery %d): sending it back",
        state.stream_id,
        state.worker_id,
        dispatch.task.delivery,
    )
    otp.send(state.queue, Declined(state.me, dispatch.task.delivery, "no_capacity"))
