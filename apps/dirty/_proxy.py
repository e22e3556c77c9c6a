"""Worker proxies: one process per dirty worker in the node, owning its port (the worker OS
process, ``apps.dirty.worker``) and the node's end of its socketpair. Children of the pool's
DynamicSupervisor, started by ``_proxy_start.start_proxy``.

A proxy forwards requests from client connections to its worker (``WorkerProxy.submit``,
rewriting request ids to its own), forwards the worker's frames back verbatim (only the header's
id changes: ``_proxy_reader``), keeps the requests in flight, and watches liveness: a worker
silent for ``dirty_timeout`` or busy on one call that long is killed and the proxy exits, so the
supervisor starts a replacement with the same apps. Its callers get DirtyTimeoutError; if the
worker dies they get DirtyWorkerError. On shutdown it drains in-flight calls for up to
``dirty_graceful_timeout``, and so it does when its worker got a SIGTERM from elsewhere (the
worker says so) or has served ``dirty_max_requests`` (the router then starts its replacement
first).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

import attrs
import trio

import otp
import wire

from ._calls import count_call
from ._context import (
    ROUTER,
    CallerConnection,
    Drain,
    Drained,
    PoolContext,
    Recycle,
    Reregister,
    Tick,
    WorkerDraining,
    WorkerUp,
)
from ._errors import DirtyError, DirtyTimeoutError, DirtyWorkerError
from ._io import BIG, RID, Batch, Outbox
from ._protocol import END, error_bytes
from ._proxy_reader import read_worker
from ._routes import hand_back, relevel

logger = logging.getLogger("apps.dirty")

_append = wire.append_readdressed

#: SIGTERM-to-SIGKILL grace of a worker port.
KILL_TIMEOUT = 5.0


@attrs.define(eq=False)
class WorkerProxy:
    """The node's side of one worker OS process: its calls in flight and its socket."""

    ctx: PoolContext
    worker_id: int
    apps: tuple[str, ...]
    parent: otp.Pid
    port: otp.Pid | None = None
    os_pid: int = 0
    stream: trio.SocketStream | None = None
    #: Requests in flight by worker request id: [connection, client request id, when it began
    #: running (or last streamed a chunk); None while it waits in the worker for a thread, when
    #: it arrived in the node (its latency counts from then)].
    inflight: dict[int, list[Any]] = attrs.Factory(dict)
    keys: dict[tuple[CallerConnection, int], int] = attrs.Factory(dict)
    next_id: int = 1
    #: When the worker was last heard from (any frame, heartbeats included): STATUS's
    #: ``last_heartbeat``.
    last_seen: float = 0.0
    started: float = 0.0
    me: otp.Pid | None = None
    draining: bool = False
    outbox: Outbox | None = None
    batch: Batch = attrs.Factory(Batch)
    #: Since when the proxy reads nothing from its worker, for a slow client; None if it reads.
    held_since: float | None = None
    #: Routing (``_routes``): the lanes this worker shares with others, the load they file it
    #: under, and the REQUEST frames of calls that may wait in the worker for a thread (sent
    #: with ``dirty_threads`` or more in flight), kept until they start: if the worker is
    #: killed first, they go to another worker.
    lanes: tuple[Any, ...] = ()
    load: int = 0
    held: dict[int, bytes] = attrs.Factory(dict)
    threads: int = attrs.Factory(lambda self: self.ctx.config.dirty_threads, takes_self=True)
    #: Set once the reader has read the worker's socket to its end.
    read_all: trio.Event = attrs.Factory(trio.Event)
    #: Calls left before the worker is recycled (``dirty_max_requests``); 0: never.
    calls_left: int = 0

    def submit(
        self,
        conn: CallerConnection,
        rid: int,
        view: memoryview,
        start: int,
        stop: int,
        now: float,
        at_once: bool = False,
    ) -> None:
        """Queue a client's REQUEST (its payload is ``view[start:stop]``, received at ``now``)
        for the worker, with the rest of the current read's requests (:meth:`flush`); or, with
        ``at_once`` (the read's only frame), re-address it where it is (``view`` is the
        connection's receive buffer, which it does not read again) and write it from there.
        ``conn.deliver(parts, done)`` gets the reply frames (called from this proxy's reader
        task)."""
        wid = self.next_id
        self.next_id = wid + 1
        if self.calls_left:
            self.calls_left -= 1
            if not self.calls_left:
                _recycle(self)
        inflight = self.inflight
        if len(inflight) >= self.threads:
            self.held[wid] = bytes(view[start - 16 : stop])
        inflight[wid] = [conn, rid, now, now]
        self.keys[(conn, rid)] = wid
        lanes = self.lanes
        if lanes:
            # (``relevel`` written out: a function call less on every call's path)
            old = self.load
            new = self.load = len(inflight)
            if new != old:
                for lane in lanes:
                    lane.move(self, old, new)
        if at_once:
            RID.pack_into(view, start - 8, wid)
            assert self.outbox is not None
            self.outbox.writev([view[start - 16 : stop]])
        else:
            batch = self.batch
            # (``Batch.frame`` written out for a small frame: one C call)
            if stop - start >= BIG or not _append(batch.small, view, start, stop, wid):
                batch.frame(view, start, stop, wid)

    def flush(self) -> None:
        """Write the requests :meth:`submit` gathered."""
        assert self.outbox is not None
        self.outbox.writev(self.batch.take())

    def cancel(self, conn: CallerConnection, rid: int) -> None:
        """Abandon a request (client END or gone): the worker gets an END."""
        wid = self.keys.pop((conn, rid), 0)
        if wid:
            self.inflight.pop(wid, None)
            self.held.pop(wid, None)
            relevel(self)
            assert self.outbox is not None
            self.outbox.write(wire.encode_header(END, 0, wid))
            if self.draining and not self.inflight and self.me is not None:
                otp.send(self.me, Drained())


def _recycle(proxy: WorkerProxy) -> None:
    """The worker has served its ``dirty_max_requests``: the router replaces it (a new worker
    first, then this one drained, so no call waits for a worker or is lost)."""
    logger.info(
        "dirty worker %d (pid %d) served its dirty_max_requests: replacing it",
        proxy.worker_id,
        proxy.os_pid,
    )
    router = otp.whereis(ROUTER)
    if router is not None and proxy.me is not None:
        otp.cast(router, Recycle(proxy.me))


def announce(proxy: WorkerProxy) -> None:
    """Tell the router this proxy's worker serves its apps."""
    router = otp.whereis(ROUTER)
    if router is not None:
        # A plain message (the router's handle_info), so that the router's init can wait for
        # the pool's first workers with a selective receive.
        otp.send(
            router,
            WorkerUp(otp.self(), proxy.worker_id, proxy.apps, proxy.os_pid, proxy.started),
        )


async def serve(proxy: WorkerProxy) -> Any:
    """Run until the worker dies, hangs or the proxy is told to stop; returns the exit reason."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_worker, proxy)
        assert proxy.outbox is not None
        nursery.start_soon(proxy.outbox.run)
        action, reason = await _loop(proxy)
        nursery.cancel_scope.cancel()
    if action == "close":
        return await _close(proxy, reason)
    return reason


async def _loop(proxy: WorkerProxy) -> tuple[str, Any]:
    """The proxy's mailbox: its timer (:class:`Tick`), its port's and its parent's exits, the
    router's :class:`Reregister`, and the drain (:class:`Drain`, :class:`Drained`). Returns
    ``("close", reason)`` to stop the worker gracefully, or ``("exit", reason)`` once it is
    dead."""
    config = proxy.ctx.config
    timeout = config.dirty_timeout
    tick = max(0.01, min(1.0, timeout / 10)) if timeout else 5.0
    me = otp.self()
    assert proxy.stream is not None
    draining_until: float | None = None
    stop_reason: Any = None
    otp.send_after(tick, me, Tick())
    while True:
        msg = await otp.receive()
        while True:
            kind = type(msg)
            if kind is Tick:
                otp.send_after(tick, me, Tick())
                now = trio.current_time()
                if timeout and _hung(proxy, now, timeout):
                    logger.error(
                        "dirty worker %d (pid %d) timed out after %gs: killing it",
                        proxy.worker_id,
                        proxy.os_pid,
                        timeout,
                    )
                    await _bury(proxy, kill=True)
                    _fail_all(
                        proxy,
                        DirtyTimeoutError(
                            f"dirty worker {proxy.worker_id} (pid {proxy.os_pid}) did not"
                            f" answer within dirty_timeout={timeout:g}s; it was killed and"
                            " is being replaced",
                            timeout=timeout,
                        ),
                    )
                    return ("exit", ("dirty_timeout", proxy.worker_id))
                if draining_until is not None and (not proxy.inflight or now >= draining_until):
                    return ("close", stop_reason)
            elif kind is otp.Exit:
                if msg.pid == proxy.port:
                    await _bury(proxy, kill=False)
                    _fail_all(
                        proxy,
                        DirtyWorkerError(
                            f"dirty worker {proxy.worker_id} (pid {proxy.os_pid}) exited"
                            f" ({otp.format_reason(msg.reason)}) during the call",
                            worker_id=proxy.worker_id,
                        ),
                    )
                    if msg.reason != otp.NORMAL or draining_until is None:
                        logger.warning(
                            "dirty worker %d (pid %d) exited: %s",
                            proxy.worker_id,
                            proxy.os_pid,
                            otp.format_reason(msg.reason),
                        )
                    if stop_reason is not None:
                        return ("exit", stop_reason)
                    return ("exit", ("dirty_worker_exited", otp.format_reason(msg.reason)))
                if msg.pid == proxy.parent or msg.reason != otp.NORMAL:
                    stop_reason = msg.reason
                    if draining_until is None:
                        draining_until = _start_draining(proxy, me)
                    if not proxy.inflight:
                        return ("close", stop_reason)
            elif kind is Reregister:
                announce(proxy)
            elif kind is Drain:
                if draining_until is None:
                    if msg.sigterm:
                        logger.warning(
                            "dirty worker %d (pid %d) got SIGTERM: it finishes its %d call(s)"
                            " (dirty_graceful_timeout=%gs), then the pool replaces it",
                            proxy.worker_id,
                            proxy.os_pid,
                            len(proxy.inflight),
                            config.dirty_graceful_timeout,
                        )
                    draining_until = _start_draining(proxy, me)
                    stop_reason = otp.SHUTDOWN
            # (Drained only wakes the loop for the check below.)
            msg = await otp.receive(timeout=0, default=None)
            if msg is None:
                break
        if draining_until is not None and not proxy.inflight:
            return ("close", stop_reason)


def _start_draining(proxy: WorkerProxy, me: otp.Pid) -> float:
    """Stop being routed to; returns when the drain's time is up."""
    router = otp.whereis(ROUTER)
    if router is not None:
        otp.cast(router, WorkerDraining(me))
    proxy.draining = True
    return trio.current_time() + proxy.ctx.config.dirty_graceful_timeout


def _hung(proxy: WorkerProxy, now: float, timeout: float) -> bool:
    """Silent for ``timeout``, or busy that long on one call (not counting the time a call
    waited in the worker for a free thread: its run time, ``entry[2]``, is None meanwhile).
    Never while the proxy holds its worker for a slow client: the silence is then the node's."""
    if proxy.held_since is not None:
        return False
    if now - proxy.last_seen > timeout:
        return True
    return any(
        entry[2] is not None and now - entry[2] > timeout for entry in proxy.inflight.values()
    )


async def _close(proxy: WorkerProxy, reason: Any) -> Any:
    """Fail what is left, stop the worker process, return ``reason``. A drained worker gets
    SIGTERM (its apps are closed; SIGKILL after ``KILL_TIMEOUT``); one still running calls at
    ``dirty_graceful_timeout`` is killed at once, as Gunicorn does (it could not exit anyway
    while a thread runs a call)."""
    late = bool(proxy.inflight)
    _fail_all(
        proxy,
        DirtyWorkerError(
            f"dirty worker {proxy.worker_id} was shut down (dirty_graceful_timeout ="
            f" {proxy.ctx.config.dirty_graceful_timeout:g}s) before the call finished",
            worker_id=proxy.worker_id,
        ),
    )
    port = proxy.port
    if port is not None:
        if late:
            otp.exit(port, otp.KILL)
        else:
            # The end of the socket: the worker stops at once (a worker draining after a
            # SIGTERM of its own waits for this).
            if proxy.stream is not None:
                with contextlib.suppress(OSError):
                    proxy.stream.socket.shutdown(socket.SHUT_WR)
            with contextlib.suppress(otp.BadArg):  # (it has exited already: OTP's catch)
                otp.port_close(port)
        await otp.receive(
            lambda m: type(m) is otp.Exit and m.pid == port,
            timeout=KILL_TIMEOUT + 2,
            default=None,
        )
    return reason


async def _bury(proxy: WorkerProxy, kill: bool) -> None:
    """Before the calls of a worker that died (or is to be killed: ``kill``) fail: route nothing
    more to it, let its last frames in (answers it sent, STARTED notices), and hand back to
    their connections the calls it never started (``_routes.hand_back``), unless the rest of
    its socket could not be read (then it is not known which had started: they all fail)."""
    proxy.ctx.proxies.pop(otp.self(), None)
    proxy.ctx.routes.withdraw(proxy)
    port = proxy.port
    if kill and port is not None:
        otp.exit(port, otp.KILL)
        await otp.receive(
            lambda m: type(m) is otp.Exit and m.pid == port, timeout=KILL_TIMEOUT + 2, default=None
        )
    with trio.move_on_after(1.0):
        await proxy.read_all.wait()
    if proxy.read_all.is_set():
        hand_back(proxy)


def _fail_all(proxy: WorkerProxy, error: DirtyError) -> None:
    groups: dict[CallerConnection, tuple[list[bytes], list[int]]] = {}
    calls = proxy.ctx.calls
    now = trio.current_time()
    for conn, rid, _, arrived in proxy.inflight.values():
        parts, done = groups.setdefault(conn, ([], []))
        parts.append(error_bytes(rid, error))
        done.append(rid)
        count_call(calls, now - arrived)
    if proxy.inflight:
        calls.error(type(error).__name__, len(proxy.inflight))
    proxy.inflight.clear()
    proxy.keys.clear()
    proxy.held.clear()
    relevel(proxy)
    for conn, (parts, done) in groups.items():
        conn.deliver(parts, done)
