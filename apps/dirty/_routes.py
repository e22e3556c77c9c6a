"""Routes: which worker proxies serve each app, and which of them takes the next call.

The router publishes them (``PoolContext.routes``); connection processes read them on every
REQUEST, and worker proxies keep them current as their load changes, all on the node's one
thread: no message is on a call's path.

Each app has a :class:`Lane`: the workers holding it, bucketed by load (the calls in flight on
each; one with fewer than ``dirty_threads`` runs a call at once, above that calls wait in it
for a thread). A call goes to the least-loaded worker, round-robin among equals (a worker that
takes a call goes to the back of its new bucket). It is O(1): a change of a worker's load
moves it between two buckets of each lane it is in, and each lane knows its lowest non-empty
bucket. An app held by one worker has no buckets at all: that worker takes every call.

While no worker holds an app but one is starting for it (the replacement of a killed worker,
a scale-up, the router's restart), a connection parks the app's calls (:class:`Parking`)
instead of failing them, for at most ``dirty_timeout`` each; the router wakes the connection
(:class:`Unpark`) when a worker is routable or none is starting any more. A worker killed
while calls wait in it for a thread hands them back to their connections (:func:`hand_back`,
:class:`Requeue`): they never ran, so they go to another worker or the replacement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

import otp


class Lane:
    """The workers holding one app, by load; :meth:`pick` names the one for the next call."""

    __slots__ = ("buckets", "low", "only", "size")

    def __init__(self, actors: Sequence[Any]) -> None:
        self.size = len(actors)
        #: The app's one worker (no buckets are kept then), else None.
        self.only = actors[0] if self.size == 1 else None
        #: ``buckets[load]``: the workers at that load, in the order they got there (a bucket
        #: emptied stays, for the next worker to reach that load: at most one per call in
        #: flight on the busiest worker).
        self.buckets: list[dict[Any, None]] = []
        self.low = 0
        if self.size > 1:
            self.buckets = [{} for _ in range(1 + max(actor.load for actor in actors))]
            for actor in actors:
                self.buckets[actor.load][actor] = None
            self.low = min(actor.load for actor in actors)

    def pick(self) -> Any:
        """The least-loaded worker, the longest at that load first; None if there is none."""
        only = self.only
        if only is not None:
            return only
        if not self.size:
            return None
        return next(iter(self.buckets[self.low]))

    def move(self, actor: Any, old: int, new: int) -> None:
        """``actor``'s load went from ``old`` to ``new``."""
        buckets = self.buckets
        del buckets[old][actor]
        if new < len(buckets):
            buckets[new][actor] = None
        else:
            buckets.extend({} for _ in range(new - len(buckets)))
            buckets.append({actor: None})
        low = self.low
        if new < low:
            self.low = new
        elif old == low and not buckets[old]:
            # Loads rise one call at a time: the next bucket up is at most ``new``.
            low += 1
            while not buckets[low]:
                low += 1
            self.low = low

    def discard(self, actor: Any) -> None:
        """Route no more calls to ``actor`` (rare: a worker being killed)."""
        if self.only is actor:
            self.only = None
            self.size = 0
            return
        for bucket in self.buckets:
            if actor in bucket:
                del bucket[actor]
                self.size -= 1
                self.low = next((i for i, b in enumerate(self.buckets) if b), 0)
                return


def relevel(actor: Any) -> None:
    """File ``actor`` under its current load (its calls in flight) in the lanes it shares;
    called whenever that count may have changed."""
    new = len(actor.inflight)
    old = actor.load
    if new != old:
        actor.load = new
        for lane in actor.lanes:
            lane.move(actor, old, new)


@attrs.frozen
class Unpark:
    """(Router to connection.) The calls parked for ``app`` may go now: a worker holds it, or
    none is starting for it any more."""

    app: str


@attrs.frozen
class Expire:
    """(A connection's timer.) The parked call ``rid`` (parked as ``token``) waited its time."""

    rid: int
    token: otp.Ref


@attrs.frozen(eq=False)
class Requeue:
    """(A killed worker's actor to a connection.) The call ``rid`` (its REQUEST frame's bytes)
    had not started in ``worker``: route it again."""

    worker: Any
    rid: int
    frame: bytes


class Routes:
    """What the router publishes for the connections; see the module's docstring.

    ``open`` is False while no router publishes (the pool is shutting down).
    """

    __slots__ = ("members", "open", "starting", "table", "wait_limit", "waiting")

    def __init__(self) -> None:
        self.table: dict[str, Lane] = {}
        self.open = False
        #: Apps a worker is starting for (a call finding no worker waits for it).
        self.starting: set[str] = set()
        #: Connections with calls parked, by app: the router wakes them.
        self.waiting: dict[str, dict[otp.Pid, None]] = {}
        #: How long a call may stay parked (``dirty_timeout``; None: until woken).
        self.wait_limit: float | None = None
        #: The worker proxies in ``table``.
        self.members: tuple[Any, ...] = ()

    def install(self, by_app: dict[str, list[Any]], starting: Iterable[str]) -> None:
        """Publish ``app -> worker proxies`` (and the apps a worker is starting for), and wake
        the connections whose parked calls can go."""
        for actor in self.members:
            actor.lanes = ()
        members: dict[Any, None] = {}
        for actors in by_app.values():
            for actor in actors:
                members[actor] = None
        for actor in members:
            actor.load = len(actor.inflight)
        table: dict[str, Lane] = {}
        for path, actors in by_app.items():
            lane = table[path] = Lane(actors)
            if lane.size > 1:
                for actor in actors:
                    actor.lanes += (lane,)
        self.members = tuple(members)
        self.table = table
        self.starting = set(starting)
        self.wake()

    def withdraw(self, actor: Any) -> None:
        """Route nothing more to ``actor`` (a worker being killed; the router hears of its
        death later), and count its apps as starting: its supervisor brings up a replacement."""
        for lane in self.table.values():
            lane.discard(actor)
        actor.lanes = ()
        self.starting.update(actor.apps)

    def close(self) -> None:
        """No more routing (the router stops): parked calls are woken to fail."""
        self.open = False
        self.table = {}
        self.starting = set()
        self.wake()

    def wake(self) -> None:
        """Wake the connections whose apps have a worker now, or none starting."""
        for path in list(self.waiting):
            lane = self.table.get(path)
            if lane is None or lane.size or path not in self.starting:
                for pid in self.waiting.pop(path):
                    otp.send(pid, Unpark(path))


class Parking:
    """A connection's calls waiting for a worker of their app. It stands in the connection's
    ``pending`` for each of them, as a worker proxy does for a call it runs (``cancel``)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        #: request id -> (app, REQUEST frame bytes, token of its wait).
        self.calls: dict[int, tuple[str, bytes, otp.Ref]] = {}

    def park(
        self, me: otp.Pid, routes: Routes, rid: int, app: str, frame: bytes, token: Any
    ) -> None:
        """Park a call (``token`` None: a new wait, timed by ``routes.wait_limit``; else the
        wait it is already in)."""
        if token is None:
            token = otp.make_ref()
            if routes.wait_limit:
                otp.send_after(routes.wait_limit, me, Expire(rid, token))
        self.calls[rid] = (app, frame, token)
        waiting = routes.waiting.get(app)
        if waiting is None:
            waiting = routes.waiting[app] = {}
        waiting[me] = None

    def cancel(self, conn: Any, rid: int) -> None:
        """The client abandoned the call (END, or it is gone)."""
        self.calls.pop(rid, None)

    def take(self, app: str) -> list[tuple[int, bytes, otp.Ref]]:
        """Unpark the calls for ``app``: ``[(rid, frame, token)]``."""
        calls = self.calls
        taken = [(rid, frame, token) for rid, (path, frame, token) in calls.items() if path == app]
        for rid, _, _ in taken:
            del calls[rid]
        return taken


def hand_back(actor: Any) -> None:
    """``actor``'s worker is dead: hand each call that was waiting in it for a thread (and had
    not started: no STARTED notice came) back to its connection, which routes it again. Such a
    call never ran, so it cannot run twice; the others fail with the worker's error."""
    inflight = actor.inflight
    keys = actor.keys
    for wid, frame in actor.held.items():
        entry = inflight.get(wid)
        if entry is not None and entry[2] is None:
            conn, rid = entry[0], entry[1]
            del inflight[wid]
            keys.pop((conn, rid), None)
            otp.send(conn.me, Requeue(actor, rid, frame))
    actor.held.clear()
