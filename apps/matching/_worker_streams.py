"""The pull worker's task streams: the queues it serves, the streams open on one connection,
and the sans-IO plan that keeps each queue at its idle target.

This is the seed's 容量和关闭 rule: every queue keeps ``idle_streams_per_queue`` registered idle
streams (one more for 30 s after a reserved-capacity decline); a stream that took a task is
replaced at once, and the extra idle streams left when tasks end are closed once they have
stayed idle for ``idle_stream_linger`` seconds, so a loaded worker reuses its streams and the
steady state after load falls is ``max_concurrent_tasks + (F + 1) * idle_streams_per_queue``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import attrs
import trio

import wire

from ._sdk_connection import SdkConnection

__all__ = ["Link", "Plan", "QueueState", "Stream", "plan_changes", "plan_streams"]


@attrs.define(eq=False)
class QueueState:
    """A queue the worker serves; it outlives connections."""

    name: str
    kind: str
    target: str
    backoff: float
    retry_at: float = -math.inf
    #: Until when the queue keeps one extra idle stream (after a reserved-capacity decline).
    extra_until: float = -math.inf


@attrs.define(eq=False)
class Link:
    """One connection and the streams open on it."""

    conn: SdkConnection
    nursery: trio.Nursery
    streams: dict[int, Stream] = attrs.field(factory=dict)
    #: Calls accepted on this connection whose outcome is not sent yet.
    calls: int = 0
    reconnecting: bool = False
    registered_any: bool = False
    #: Set when the link may have to end: the connection ended, or the server asked to
    #: reconnect, or the last call of a reconnecting link ended.
    ending: trio.Event = attrs.field(factory=trio.Event)
    #: The scope the link's timer loop (keepalive PONGs, held ACCEPTs) sleeps in: a call
    #: brings its deadline forward when it needs the loop sooner, which wakes nothing now.
    timer: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    #: How long a call's M_ACCEPT is held on this connection (``PullWorkerOptions.
    #: accept_delay``, at most a tenth of the server's ``peer_timeout``), and on how many
    #: streams it is held now.
    accept_delay: float = 0.0
    held_accepts: int = 0
    #: When the stream-managing loop looks again unless woken: the ``wake`` of its last plan
    #: while it sleeps, ``-inf`` while it is planning (then every change wakes it).
    manage_wake: float = -math.inf


@attrs.define(eq=False)
class Stream:
    """One task stream of a :class:`Link`."""

    id: int
    queue: QueueState
    link: Link
    #: "registering", "idle", "busy" or "closed".
    state: str = "registering"
    #: When it last became idle (registered, or its handler returned).
    idle_since: float = 0.0
    #: While busy: when its next keepalive PONG is due.
    pong_at: float = math.inf
    #: While busy: the call's delivery, and what cancels it (its task's cancel scope, or a
    #: fast-path call), for an M_CANCEL; the delivery the server cancelled, if it did.
    delivery: int | None = None
    cancel: Any = None
    cancelled: int | None = None
    #: The call's M_ACCEPT while it is held (sent with the outcome, or alone at
    #: ``accept_at``), else None.
    accept: wire.MatchAccept | None = None
    accept_at: float = math.inf
    #: Whether the call's M_ACCEPT was written (claimed under the connection's write lock
    #: by the timer loop or by the call's handler thread: exactly one writes it).
    accept_written: bool = True


@attrs.frozen
class Plan:
    """What :func:`plan_streams` decided: streams to open per queue, streams to close, and
    when to look again (the earliest linger or extra-stream deadline; ``inf`` for none)."""

    opens: tuple[QueueState, ...]
    closes: tuple[Stream, ...]
    wake: float


def plan_streams(
    queues: Iterable[QueueState],
    streams: Iterable[Stream],
    *,
    now: float,
    target: int,
    linger: float,
    may_open: bool,
    slot_free: bool,
) -> Plan:
    """Decide, without side effects, how to bring every queue to its idle target.

    Each queue wants ``target`` registered idle streams (plus one while its ``extra_until``
    lasts; that extra one is opened only with a slot free, ``slot_free``). Missing ones are
    opened when ``may_open`` and the queue's ``retry_at`` has passed. Idle streams beyond what
    is kept are closed longest-idle first, but only once idle for ``linger`` seconds, and one
    registered stream is always kept while others are still registering. (A call's outcome
    is written at once or queued before anything later: a stream is idle once it is sent.)
    """
    queues = list(queues)
    idle: dict[int, list[Stream]] = {id(q): [] for q in queues}
    registering: dict[int, int] = {id(q): 0 for q in queues}
    for s in streams:
        key = id(s.queue)
        if key not in idle:
            continue
        if s.state == "idle":
            idle[key].append(s)
        elif s.state == "registering":
            registering[key] += 1
    opens: list[QueueState] = []
    closes: list[Stream] = []
    wake = math.inf
    for q in queues:
        wake = min(
            wake,
            _plan_one(
                q, idle[id(q)], registering[id(q)], opens, closes, now, target, linger,
                may_open, slot_free,
            ),
        )  # fmt: skip
    return Plan(tuple(opens), tuple(closes), wake)


def plan_changes(
    q: QueueState,
    streams: Iterable[Stream],
    *,
    now: float,
    target: int,
    linger: float,
    may_open: bool,
    slot_free: bool,
    wake_by: float,
) -> bool:
    """Whether :func:`plan_streams`' plan for the one queue ``q`` (``streams`` may hold other
    queues') opens or closes a stream, or wakes before ``wake_by``: what a change to one of
    its streams asks of the stream-managing loop. One pass, nothing built: it runs twice per
    call (a stream taking a task, and idle again)."""
    idle = pending = 0
    oldest = math.inf
    for s in streams:
        if s.queue is q:
            state = s.state
            if state == "idle":
                idle += 1
                if s.idle_since < oldest:
                    oldest = s.idle_since
            elif state == "registering":
                pending += 1
    wake = math.inf
    extra = 1 if q.extra_until > now else 0
    if extra:
        wake = q.extra_until
    if q.retry_at > now:
        wake = min(wake, q.retry_at)
    if may_open and now >= q.retry_at and target + (extra if slot_free else 0) > idle + pending:
        return True  # a stream to open
    if min(idle + pending - target - extra, idle - 1) > 0:
        # The longest-idle stream is the first extra (see _plan_one): due, it is closed;
        # else its linger is the queue's earliest close.
        if oldest + linger <= now:
            return True
        wake = min(wake, oldest + linger)
    return wake < wake_by


def _plan_one(
    q: QueueState,
    mine: list[Stream],
    pending: int,
    opens: list[QueueState],
    closes: list[Stream],
    now: float,
    target: int,
    linger: float,
    may_open: bool,
    slot_free: bool,
) -> float:
    """One queue's part of the plan (its idle streams ``mine``, ``pending`` registering):
    appends to ``opens`` and ``closes``, returns when to look again."""
    wake = math.inf
    extra = 1 if q.extra_until > now else 0
    if extra:
        wake = min(wake, q.extra_until)
    if q.retry_at > now:
        wake = min(wake, q.retry_at)
    wanted = target + (extra if slot_free else 0)
    kept = target + extra
    if may_open and now >= q.retry_at:
        opens.extend([q] * (wanted - len(mine) - pending))
    excess = min(len(mine) + pending - kept, len(mine) - 1)
    if excess > 0:
        oldest = min([s.idle_since for s in mine])
        if oldest + linger > now:
            # None is due yet (the usual case under load, each call's end asking): the
            # earliest close is the longest-idle stream's, found without sorting.
            return min(wake, oldest + linger)
        mine.sort(key=_idle_since)
        for s in mine[:excess]:
            due = s.idle_since + linger
            if due <= now:
                closes.append(s)
            else:
                wake = min(wake, due)
    return wake


def _idle_since(s: Stream) -> float:
    return s.idle_since
