"""Worker actors: one process per dirty worker, owning its port (the OS process) and the
arbiter end of its socketpair. Children of the pool's DynamicSupervisor.

A worker actor forwards requests from connection processes to its worker (rewriting request ids
to its own), forwards the worker's frames back verbatim (only the header's id changes), keeps
the requests in flight, and watches liveness: a worker silent for ``dirty_timeout`` or busy on one
call that long is killed and the actor exits, so the supervisor starts a replacement with the
same apps. Its callers get DirtyTimeoutError; if the worker dies they get DirtyWorkerError. On
shutdown it drains in-flight calls for up to ``dirty_graceful_timeout``, and so it does when its
worker got a SIGTERM from elsewhere (the worker says so) or has served ``dirty_max_requests``
(the router then starts its replacement first). Before any of this the actor starts the worker
process, runs ``dirty_post_fork`` and waits for the apps to load (``_lifecycle``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import sys
from typing import Any

import attrs
import trio

import otp
from otp import ets

from ._config import DirtyConfig
from ._errors import DirtyError, DirtyTimeoutError, DirtyWorkerError
from ._frames import (
    BIG,
    CHUNK,
    END,
    QUEUED,
    RID,
    STATUS,
    FrameBuffer,
    error_bytes,
    header,
    tune_socket,
)
from ._lifecycle import DRAINING, await_loaded
from ._routes import Routes, hand_back, relevel
from ._worker import DirtyWorkerInfo

logger = logging.getLogger("apps.dirty")

ROUTER = "dirty_router"
#: A public ETS table the router owns: ``(worker_actor_pid, last_seen)``, trio clock, written
#: by the worker actors at most every ``_BEAT_EVERY`` seconds; STATUS's ``last_heartbeat``.
HEARTBEATS = "apps.dirty.heartbeats"
_BEAT_EVERY = 0.1
#: glibc malloc settings of worker processes (unless the environment sets them): payloads up to
#: the protocol's 64 MiB come from (and go back to) the heap instead of fresh ``mmap`` pages,
#: so a large argument or result costs a copy, not a page fault per 4 KiB on every call.
WORKER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
#: SIGTERM-to-SIGKILL grace of a worker port.
KILL_TIMEOUT = 5.0


@attrs.frozen
class PoolContext:
    """What every part of one pool shares."""

    config: DirtyConfig
    socket_path: str
    log_level: str = "INFO"
    routes: Routes = attrs.field(factory=Routes, eq=False, repr=False)
    #: Worker actors whose worker is still loading its apps: the router stops them when the
    #: pool stops, so a long app load (a model) never holds up the node's shutdown.
    starting: set[otp.Pid] = attrs.field(factory=set, eq=False, repr=False)


@attrs.frozen
class WorkerUp:
    """A worker actor tells the router it serves ``apps``."""

    pid: otp.Pid
    worker_id: int
    apps: tuple[str, ...]
    os_pid: int
    started: float


@attrs.frozen
class WorkerDraining:
    """A worker actor tells the router to stop routing to it."""

    pid: otp.Pid


@attrs.frozen
class Recycle:
    """A worker actor asks the router to replace its worker (``dirty_max_requests``): a
    replacement first, then this one drained."""

    pid: otp.Pid


@attrs.frozen
class Reregister:
    """A (restarted) router asks the worker actors to announce themselves again."""


_IOV_MAX = 1024
#: A client connection holding more than this, unsent, is a slow reader: its connection takes
#: no more of its requests until it is down to ``LOW_WATER``, for at most ``SEND_TIMEOUT``;
#: past its budget (``dirty_client_buffer``) the worker actor that wrote it reads no more from
#: its worker meanwhile (the kernel then pushes back on the worker's streams).
HIGH_WATER = 8 << 20
LOW_WATER = 2 << 20
#: How long one slow client may hold up a worker (Ranch's ``send_timeout`` default): it is
#: then dropped, its requests abandoned, so the worker's other callers are not held longer.
#: Never longer than ``dirty_timeout``, the longest the pool otherwise lets a call wait.
SEND_TIMEOUT = 30.0
#: Reads a socket's reader takes back to back (while the socket has data, skipping the wait
#: for readiness) before it lets the node's other tasks run.
BUSY_READS = 8


class Batch:
    """Frames for one destination, gathered while one read's frames are handled and written
    with one ``writev``. Small frames are copied into one buffer; a large payload is kept as a
    view of the receive buffer (no copy), so the batch must be written before the next read.
    """

    __slots__ = ("parts", "small")

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.small = bytearray()

    def frame(self, view: memoryview, start: int, stop: int, rid: int) -> None:
        """Add the frame whose payload is ``view[start:stop]``, re-addressed to ``rid``."""
        if stop - start < BIG:
            small = self.small
            small += view[start - 16 : stop]
            RID.pack_into(small, len(small) - (stop - start) - 8, rid)
        else:
            head = bytearray(view[start - 16 : start])
            RID.pack_into(head, 8, rid)
            if self.small:
                self.parts.append(self.small)
                self.small = bytearray()
            self.parts.append(head)
            self.parts.append(view[start:stop])

    def run(self, view: memoryview, frames: list[Any], first: int, last: int, rid: int) -> None:
        """Add ``frames[first:last]`` (back to back in ``view``, all small), re-addressed to
        ``rid``, with one copy."""
        begin = frames[first][2] - 16
        small = self.small
        base = len(small) - begin - 8
        small += view[begin : frames[last - 1][3]]
        pack_into = RID.pack_into
        for k in range(first, last):
            pack_into(small, base + frames[k][2], rid)

    def add(self, data: bytes) -> None:
        """Add encoded frames."""
        self.small += data

    def take(self) -> list[Any]:
        """The buffers to write (the batch is then empty)."""
        parts = self.parts
        if self.small:
            parts.append(self.small)
            self.small = bytearray()
        self.parts = []
        return parts


class Outbox:
    """Ordered, synchronous writes to a non-blocking socket.

    ``write``/``writev`` send at once (one ``writev``) while nothing is queued; what the socket
    does not take is copied and queued for ``run`` (a task of the owner) to send when it is
    writable. Any task of the node may write (trio runs them on one thread), so a frame goes
    from one process straight to another's socket without a mailbox hop.

    ``size`` counts the queued bytes: a writer that must not outrun the reader waits, once it
    is over ``HIGH_WATER``, with :meth:`wait_room` (writes themselves never block or refuse).
    """

    __slots__ = ("_idle", "_room", "_wake", "broken", "buf", "closed", "fd", "on_broken", "size")

    def __init__(self, fd: int, on_broken: Any = None) -> None:
        self.fd = fd
        self.buf: list[Any] = []
        self.size = 0
        self.closed = False
        self.broken = False
        self.on_broken = on_broken
        self._wake = trio.Event()
        self._idle: trio.Event | None = None
        self._room: trio.Event | None = None

    def write(self, data: bytes) -> None:
        """Send ``data`` (or queue it behind what is queued)."""
        if self.closed or not data:
            return
        if self.buf:
            self.buf.append(data)
            self.size += len(data)
            return
        self.writev([data])

    def writev(self, parts: list[Any]) -> None:
        """Send the buffers in order; views (of a receive buffer) are copied if queued."""
        if self.closed or not parts:
            return
        if self.buf:
            self._queue(parts, 0)
            return
        fd = self.fd
        i = 0
        while i < len(parts):
            chunk = parts[i : i + _IOV_MAX]
            try:
                n = os.writev(fd, chunk)
            except BlockingIOError:
                n = 0
            except OSError:
                self._break()
                return
            for part in chunk:
                size = len(part)
                if n >= size:
                    n -= size
                    i += 1
                    continue
                # The socket is full: queue the rest (copied: views die with the next read).
                rest = bytes(memoryview(part)[n:])
                self.buf.append(rest)
                self.size += len(rest)
                self._queue(parts, i + 1)
                self._wake.set()
                return

    def _queue(self, parts: list[Any], first: int) -> None:
        buf = self.buf
        size = self.size
        for k in range(first, len(parts)):
            data = bytes(parts[k])  # (a view of a receive buffer dies with its next read)
            buf.append(data)
            size += len(data)
        self.size = size

    def _break(self) -> None:
        self.closed = self.broken = True
        self._drop()
        if self.on_broken is not None:
            self.on_broken()

    def abort(self) -> None:
        """Drop what is queued and stop writing, as if the socket broke (``on_broken`` runs)."""
        if not self.closed:
            self._break()

    def close(self) -> None:
        """No more writes (before the socket is closed: its fd number may be reused)."""
        self.closed = True
        self._drop()

    def _drop(self) -> None:
        self.buf.clear()
        self.size = 0
        self._wake.set()
        self._idled()
        self._roomy()

    def _idled(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

    def _roomy(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    async def run(self) -> None:
        """Send what ``write`` queued, as the socket takes it."""
        buf = self.buf
        while not self.closed:
            if not buf:
                self._idled()
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            await trio.lowlevel.wait_writable(self.fd)
            while buf and not self.closed:
                chunk = buf[:_IOV_MAX]
                try:
                    n = os.writev(self.fd, chunk)
                except BlockingIOError:
                    break
                except OSError:
                    self._break()
                    return
                self.size -= n
                if self._room is not None and self.size <= LOW_WATER:
                    self._roomy()
                done = 0
                for data in chunk:
                    if n < len(data):
                        break
                    n -= len(data)
                    done += 1
                del buf[:done]
                if n:
                    buf[0] = memoryview(buf[0])[n:]
                if done < len(chunk):
                    break

    async def flush(self) -> None:
        """Wait until everything written has been sent (or the socket broke)."""
        while self.buf and not self.closed:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    async def wait_room(self) -> None:
        """Wait until at most ``LOW_WATER`` bytes are queued (or the outbox is closed).
        Cancelling the wait leaves the outbox as it is."""
        while self.size > LOW_WATER and not self.closed:
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()


#: Worker actors of this node by pid, for connections to submit to directly.
ACTORS: dict[otp.Pid, Any] = {}


@attrs.frozen
class _Started:
    ref: otp.Ref
    error: Any


async def start_worker(
    ctx: PoolContext, worker_id: int, apps: tuple[str, ...], wait_loaded: bool = True
) -> otp.Pid:
    """Start a worker actor linked to the caller (the pool supervisor); return once its worker
    process has loaded its apps, or with ``wait_loaded=False`` once it runs (and its
    ``dirty_post_fork`` has run): the load is then the running actor's, and a failed load a
    crash its supervisor restarts (so the pool's first workers load in parallel, and a load
    is retried within the pool's restart intensity). The actor tells the router (WorkerUp)
    when its apps are loaded, either way.

    Raises:
        otp.StartError: The worker process could not start (or load its apps in time).
        otp.StartIgnored: The pool is stopping (the start was cut short: not an error).
    """
    ref = otp.make_ref()
    pid = otp.spawn_link(_worker_actor, ctx, worker_id, apps, otp.self(), ref, wait_loaded)
    mref = otp.monitor(pid)
    msg = await otp.receive(
        lambda m: (type(m) is _Started and m.ref == ref) or (type(m) is otp.Down and m.ref == mref)
    )
    otp.demonitor(mref, flush=True)
    if type(msg) is _Started and msg.error is None:
        return pid
    otp.unlink(pid)
    otp.exit(pid, otp.KILL)
    if type(msg) is otp.Down and msg.reason == otp.KILLED and not ctx.routes.open:
        # The router stopped it because the pool is shutting down (SIGTERM while a worker
        # starts): a shutdown, not a start error to report.
        logger.info("dirty worker %d: start cut short, the pool is stopping", worker_id)
        raise otp.StartIgnored
    reason = msg.error if type(msg) is _Started else msg.reason
    raise otp.StartError(("dirty_worker_failed", worker_id, reason))


@attrs.define(eq=False)
class _Actor:
    ctx: PoolContext
    worker_id: int
    apps: tuple[str, ...]
    parent: otp.Pid
    port: otp.Pid | None = None
    os_pid: int = 0
    stream: trio.SocketStream | None = None
    #: Requests in flight by worker request id: [connection, client request id, when it began
    #: running (or last streamed a chunk); None while it waits in the worker for a thread].
    inflight: dict[int, list[Any]] = attrs.Factory(dict)
    keys: dict[tuple[otp.Pid, int], int] = attrs.Factory(dict)
    next_id: int = 1
    last_seen: float = 0.0
    started: float = 0.0
    me: otp.Pid | None = None
    draining: bool = False
    outbox: Outbox | None = None
    batch: Batch = attrs.Factory(Batch)
    #: Since when the actor reads nothing from its worker, for a slow client; None if it reads.
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
        self, conn: Any, rid: int, view: memoryview, start: int, stop: int, now: float
    ) -> None:
        """Queue a client's REQUEST (its payload is ``view[start:stop]``, received at ``now``)
        for the worker, with the rest of the current read's requests (:meth:`flush`);
        ``conn.deliver(parts, done)`` gets the reply frames (called from this actor's reader
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
        inflight[wid] = [conn, rid, now]
        self.keys[(conn, rid)] = wid
        self.batch.frame(view, start, stop, wid)
        if self.lanes:
            relevel(self)

    def flush(self) -> None:
        """Write the requests :meth:`submit` gathered."""
        assert self.outbox is not None
        self.outbox.writev(self.batch.take())

    def cancel(self, conn: Any, rid: int) -> None:
        """Abandon a request (client END or gone): the worker gets an END."""
        wid = self.keys.pop((conn, rid), 0)
        if wid:
            self.inflight.pop(wid, None)
            self.held.pop(wid, None)
            relevel(self)
            assert self.outbox is not None
            self.outbox.write(header(END, 0, wid))
            if self.draining and not self.inflight and self.me is not None:
                otp.send(self.me, "drained")


async def _worker_actor(
    ctx: PoolContext,
    worker_id: int,
    apps: tuple[str, ...],
    parent: otp.Pid,
    ref: otp.Ref,
    wait_loaded: bool,
) -> None:
    otp.process_flag(trap_exit=True)
    actor = _Actor(ctx, worker_id, apps, parent, me=otp.self())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tune_socket(ours)
    tune_socket(theirs)
    reason: Any = otp.NORMAL
    me = otp.self()
    try:
        if wait_loaded:
            # The supervisor waits in start_child: the router must be able to cut the start
            # short when the pool stops (see Router.terminate).
            ctx.starting.add(me)
        try:
            await _spawn(actor, ours, theirs)
            if not wait_loaded:
                otp.send(parent, _Started(ref, None))
            stopped = await _load(actor)
        except Exception as exc:
            error = _load_failed(actor, exc)
            if actor.port is not None:
                otp.exit(actor.port, otp.KILL)
            if wait_loaded:
                otp.send(parent, _Started(ref, error))
                return
            reason = error
            return
        finally:
            ctx.starting.discard(me)
        if stopped is not None:
            reason = stopped  # the pool stopped it while it loaded
            if actor.port is not None:
                otp.exit(actor.port, otp.KILL)
            return
        assert actor.me is not None
        ACTORS[actor.me] = actor
        if wait_loaded:
            otp.send(parent, _Started(ref, None))
        _announce(actor)
        reason = await _serve(actor)
    finally:
        ACTORS.pop(otp.self(), None)
        if actor.outbox is not None:
            actor.outbox.close()
        ours.close()
        hook = ctx.config.hook("dirty_worker_exit")
        if hook is not None and actor.os_pid:
            _run_hook(hook, "dirty_worker_exit", ctx, _info(actor))
    otp.exit_self(reason)


def _load_failed(actor: _Actor, exc: Exception) -> Any:
    """Log why the worker could not start (with the app's traceback) and return the reason."""
    tb = getattr(exc, "traceback", None)
    logger.error(
        "dirty worker %d failed to start: %s%s",
        actor.worker_id,
        exc,
        f"\n{tb.rstrip()}" if tb else "",
    )
    return ("dirty_worker_failed", actor.worker_id, str(exc))


def _recycle(actor: _Actor) -> None:
    """The worker has served its ``dirty_max_requests``: the router replaces it (a new worker
    first, then this one drained, so no call waits for a worker or is lost)."""
    logger.info(
        "dirty worker %d (pid %d) served its dirty_max_requests: replacing it",
        actor.worker_id,
        actor.os_pid,
    )
    router = otp.whereis(ROUTER)
    if router is not None and actor.me is not None:
        otp.cast(router, Recycle(actor.me))


def _info(actor: _Actor) -> DirtyWorkerInfo:
    return DirtyWorkerInfo(actor.worker_id, actor.os_pid or None, actor.apps)


def _run_hook(hook: Any, name: str, *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        logger.exception("dirty hook %s failed", name)


def _announce(actor: _Actor) -> None:
    _publish_beat(actor, actor.last_seen)
    router = otp.whereis(ROUTER)
    if router is not None:
        # A plain message (the router's handle_info), so that the router's init can wait for
        # the pool's first workers with a selective receive.
        otp.send(
            router,
            WorkerUp(otp.self(), actor.worker_id, actor.apps, actor.os_pid, actor.started),
        )


async def _spawn(actor: _Actor, ours: socket.socket, theirs: socket.socket) -> None:
    """Start the worker process, run ``dirty_post_fork``, then let the worker load its apps
    (Gunicorn's order: fork, ``dirty_post_fork``, the apps' ``__init__``, ``init()``,
    ``dirty_worker_init``)."""
    ctx = actor.ctx
    config = ctx.config
    spec = {
        "fd": theirs.fileno(),
        "ppid": os.getpid(),
        "apps": list(actor.apps),
        "threads": config.dirty_threads,
        "heartbeat": config.heartbeat_interval,
        "graceful": config.dirty_graceful_timeout,
        "worker_id": actor.worker_id,
        "log_level": ctx.log_level,
        "worker_init": _hook_path(config, "dirty_worker_init"),
    }
    env = dict(os.environ)
    env["GUNICORN_DIRTY_SOCKET"] = ctx.socket_path
    for name, value in WORKER_MALLOC.items():
        env.setdefault(name, value)
    try:
        actor.port = await otp.open_port(
            [sys.executable, "-m", "apps.dirty._worker_main", json.dumps(spec)],
            env=env,
            pass_fds=[theirs.fileno()],
            kill_timeout=KILL_TIMEOUT,
        )
    finally:
        theirs.close()
    actor.os_pid = await otp.port_os_pid(actor.port)
    actor.stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    actor.outbox = Outbox(ours.fileno())
    if config.dirty_max_requests:
        jitter = config.dirty_max_requests_jitter
        actor.calls_left = config.dirty_max_requests + (random.randint(0, jitter) if jitter else 0)
    hook = config.hook("dirty_post_fork")
    if hook is not None:
        _run_hook(hook, "dirty_post_fork", ctx, _info(actor))
    actor.outbox.write(header(STATUS, 0, 0))  # the go-ahead


async def _load(actor: _Actor) -> Any:
    """Wait for the worker to load its apps; return None, or the exit reason of the pool's
    order to stop, if one came meanwhile (the load is then abandoned).

    Raises:
        DirtyError: The worker failed to load, exited, or took over ``dirty_app_load_timeout``.
    """
    assert actor.stream is not None
    stop: list[Any] = []
    failed: list[DirtyError] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            msg = await otp.receive(
                lambda m: (
                    type(m) is otp.Exit
                    and (m.pid == actor.parent or (m.pid != actor.port and m.reason != otp.NORMAL))
                )
            )
            stop.append(msg.reason)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        timeout = actor.ctx.config.app_load_timeout
        try:
            await await_loaded(actor.stream, actor.worker_id, actor.apps, timeout)
        except DirtyError as exc:
            failed.append(exc)
        nursery.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if stop:
        return stop[0]
    actor.started = actor.last_seen = trio.current_time()
    return None


def _hook_path(config: DirtyConfig, name: str) -> str | None:
    value = config.hooks.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname else None


async def _serve(actor: _Actor) -> Any:
    """Run until the worker dies, hangs or the actor is told to stop; returns the exit reason."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_read_worker, actor)
        assert actor.outbox is not None
        nursery.start_soon(actor.outbox.run)
        action, reason = await _loop(actor)
        nursery.cancel_scope.cancel()
    if action == "close":
        return await _close(actor, reason)
    return reason


async def _loop(actor: _Actor) -> tuple[str, Any]:
    config = actor.ctx.config
    timeout = config.dirty_timeout
    tick = max(0.01, min(1.0, timeout / 10)) if timeout else 5.0
    me = otp.self()
    assert actor.stream is not None
    draining_until: float | None = None
    stop_reason: Any = None
    if True:
        otp.send_after(tick, me, "tick")
        while True:
            msg = await otp.receive()
            while True:
                kind = type(msg)
                if msg == "tick":
                    otp.send_after(tick, me, "tick")
                    now = trio.current_time()
                    if timeout and _hung(actor, now, timeout):
                        logger.error(
                            "dirty worker %d (pid %d) timed out after %gs: killing it",
                            actor.worker_id,
                            actor.os_pid,
                            timeout,
                        )
                        await _bury(actor, kill=True)
                        _fail_all(
                            actor,
                            DirtyTimeoutError(
                                f"dirty worker {actor.worker_id} (pid {actor.os_pid}) did not"
                                f" answer within dirty_timeout={timeout:g}s; it was killed and"
                                " is being replaced",
                                timeout=timeout,
                            ),
                        )
                        return ("exit", ("dirty_timeout", actor.worker_id))
                    if draining_until is not None and (not actor.inflight or now >= draining_until):
                        return ("close", stop_reason)
                elif kind is otp.Exit:
                    if msg.pid == actor.port:
                        await _bury(actor, kill=False)
                        _fail_all(
                            actor,
                            DirtyWorkerError(
                                f"dirty worker {actor.worker_id} (pid {actor.os_pid}) exited"
                                f" ({otp.format_reason(msg.reason)}) during the call",
                                worker_id=actor.worker_id,
                            ),
                        )
                        if msg.reason != otp.NORMAL or draining_until is None:
                            logger.warning(
                                "dirty worker %d (pid %d) exited: %s",
                                actor.worker_id,
                                actor.os_pid,
                                otp.format_reason(msg.reason),
                            )
                        if stop_reason is not None:
                            return ("exit", stop_reason)
                        return ("exit", ("dirty_worker_exited", otp.format_reason(msg.reason)))
                    if msg.pid == actor.parent or msg.reason != otp.NORMAL:
                        stop_reason = msg.reason
                        if draining_until is None:
                            router = otp.whereis(ROUTER)
                            if router is not None:
                                otp.cast(router, WorkerDraining(me))
                            draining_until = trio.current_time() + config.dirty_graceful_timeout
                            actor.draining = True
                        if not actor.inflight:
                            return ("close", stop_reason)
                elif kind is Reregister:
                    _announce(actor)
                elif kind is tuple and msg[0] == "drain":
                    if draining_until is None and msg[1:] == ("sigterm",):
                        logger.warning(
                            "dirty worker %d (pid %d) got SIGTERM: it finishes its %d call(s)"
                            " (dirty_graceful_timeout=%gs), then the pool replaces it",
                            actor.worker_id,
                            actor.os_pid,
                            len(actor.inflight),
                            config.dirty_graceful_timeout,
                        )
                    if draining_until is None:
                        router = otp.whereis(ROUTER)
                        if router is not None:
                            otp.cast(router, WorkerDraining(me))
                        draining_until = trio.current_time() + config.dirty_graceful_timeout
                        actor.draining = True
                        stop_reason = otp.SHUTDOWN
                elif kind is tuple and msg[0] == "signal" and actor.os_pid:
                    try:
                        os.kill(actor.os_pid, msg[1])
                    except ProcessLookupError:
                        pass
                msg = await otp.receive(timeout=0, default=None)
                if msg is None:
                    break
            if draining_until is not None and not actor.inflight:
                return ("close", stop_reason)


def _hung(actor: _Actor, now: float, timeout: float) -> bool:
    """Silent for ``timeout``, or busy that long on one call (not counting the time a call
    waited in the worker for a free thread: its run time, ``entry[2]``, is None meanwhile).
    Never while the actor holds its worker for a slow client: the silence is then the node's."""
    if actor.held_since is not None:
        return False
    if now - actor.last_seen > timeout:
        return True
    return any(
        entry[2] is not None and now - entry[2] > timeout for entry in actor.inflight.values()
    )


async def _close(actor: _Actor, reason: Any) -> Any:
    """Fail what is left, stop the worker process, return ``reason``. A drained worker gets
    SIGTERM (its apps are closed; SIGKILL after ``KILL_TIMEOUT``); one still running calls at
    ``dirty_graceful_timeout`` is killed at once, as Gunicorn does (it could not exit anyway
    while a thread runs a call)."""
    late = bool(actor.inflight)
    _fail_all(
        actor,
        DirtyWorkerError(
            f"dirty worker {actor.worker_id} was shut down (dirty_graceful_timeout ="
            f" {actor.ctx.config.dirty_graceful_timeout:g}s) before the call finished",
            worker_id=actor.worker_id,
        ),
    )
    port = actor.port
    if port is not None:
        if late:
            otp.exit(port, otp.KILL)
        else:
            # The end of the socket: the worker stops at once (a worker draining after a
            # SIGTERM of its own waits for this).
            if actor.stream is not None:
                with contextlib.suppress(OSError):
                    actor.stream.socket.shutdown(socket.SHUT_WR)
            with contextlib.suppress(otp.BadArg):  # (it has exited already: OTP's catch)
                otp.port_close(port)
        await otp.receive(
            lambda m: type(m) is otp.Exit and m.pid == port,
            timeout=KILL_TIMEOUT + 2,
            default=None,
        )
    return reason


async def _bury(actor: _Actor, kill: bool) -> None:
    """Before the calls of a worker that died (or is to be killed: ``kill``) fail: route nothing
    more to it, let its last frames in (answers it sent, STARTED notices), and hand back to
    their connections the calls it never started (``_routes.hand_back``), unless the rest of
    its socket could not be read (then it is not known which had started: they all fail)."""
    ACTORS.pop(otp.self(), None)
    actor.ctx.routes.withdraw(actor)
    port = actor.port
    if kill and port is not None:
        otp.exit(port, otp.KILL)
        await otp.receive(
            lambda m: type(m) is otp.Exit and m.pid == port, timeout=KILL_TIMEOUT + 2, default=None
        )
    with trio.move_on_after(1.0):
        await actor.read_all.wait()
    if actor.read_all.is_set():
        hand_back(actor)


def _fail_all(actor: _Actor, error: DirtyError) -> None:
    groups: dict[Any, tuple[list[bytes], list[int]]] = {}
    for conn, rid, _ in actor.inflight.values():
        parts, done = groups.setdefault(conn, ([], []))
        parts.append(error_bytes(rid, error))
        done.append(rid)
    actor.inflight.clear()
    actor.keys.clear()
    actor.held.clear()
    relevel(actor)
    for conn, (parts, done) in groups.items():
        conn.deliver(parts, done)


def _publish_beat(actor: _Actor, now: float) -> None:
    try:
        ets.insert(HEARTBEATS, (actor.me, now))
    except ets.EtsError:
        pass  # the router is restarting; its next table gets the next beat


async def _read_worker(actor: _Actor) -> None:
    """Forward the worker's frames to their connections: every frame of one read, re-addressed,
    in one write per connection."""
    assert actor.stream is not None
    fd = actor.stream.socket.fileno()
    buffer = FrameBuffer()
    inflight = actor.inflight
    keys = actor.keys
    held = actor.held
    published = 0.0
    readv = os.readv
    wait_readable = trio.lowlevel.wait_readable
    busy = 0
    drained = True
    while True:
        if drained:  # the last read did not fill the buffer: wait for more
            busy = 0
            try:
                await wait_readable(fd)
            except trio.ClosedResourceError:
                return
        elif busy == BUSY_READS:  # let the other tasks run now and then
            busy = 0
            await trio.lowlevel.checkpoint()
        try:
            space = buffer.space()
            n = readv(fd, [space])
            busy += 1
        except BlockingIOError:
            drained = True
            continue
        except OSError:
            return
        if not n:
            actor.read_all.set()
            return
        drained = n < len(space)
        now = trio.current_time()
        actor.last_seen = now
        if now - published > _BEAT_EVERY:
            published = now
            _publish_beat(actor, now)
        frames = buffer.frames(n)
        if not frames:
            continue  # (a large frame's first part: read on at once)
        view = buffer.view
        groups: dict[Any, tuple[Batch, list[int]]] = {}
        i = 0
        count = len(frames)
        while i < count:
            mtype, wid, start, stop = frames[i]
            entry = inflight.get(wid)
            if entry is None:
                if not wid and mtype == STATUS and view[start:stop] == DRAINING and actor.me:
                    otp.send(actor.me, ("drain", "sigterm"))
                i += 1
                continue  # heartbeat, or a request abandoned or failed already
            if mtype == STATUS:  # the worker queued or started it: its run time counts from then
                if view[start:stop] == QUEUED:
                    entry[2] = None
                else:
                    entry[2] = now
                    if held:
                        held.pop(wid, None)
                i += 1
                continue
            conn, rid, _ = entry
            group = groups.get(conn)
            if group is None:
                group = groups[conn] = (Batch(), [])
            if mtype == CHUNK:
                entry[2] = now
                # A run of this stream's small chunks: one copy, then each header's id.
                j = i + 1
                while (
                    j < count
                    and frames[j][1] == wid
                    and frames[j][0] == CHUNK
                    and frames[j][3] - frames[j][2] < BIG
                ):
                    j += 1
                if j - i > 1 and stop - start < BIG:
                    group[0].run(view, frames, i, j, rid)
                    i = j
                    continue
                group[0].frame(view, start, stop, rid)
            else:
                group[0].frame(view, start, stop, rid)
                del inflight[wid]
                del keys[(conn, rid)]
                if held:
                    held.pop(wid, None)
                group[1].append(rid)
            i += 1
        if actor.lanes and len(inflight) != actor.load:
            relevel(actor)
        slow = None
        for conn, (batch, done) in groups.items():
            if conn.deliver(batch.take(), done):
                slow = conn
        if actor.draining and not inflight and actor.me is not None:
            otp.send(actor.me, "drained")
        if slow is not None:
            await _hold_for(actor, slow)


def send_timeout(config: DirtyConfig) -> float:
    """How long a client that takes nothing of its replies is waited for before it is dropped:
    ``SEND_TIMEOUT``, or ``dirty_timeout`` if shorter."""
    timeout = config.dirty_timeout
    return min(SEND_TIMEOUT, timeout) if timeout else SEND_TIMEOUT


async def _hold_for(actor: _Actor, conn: Any) -> None:
    """Read nothing more from the worker while a client connection is over its budget
    (``dirty_client_buffer``), so that the kernel pushes back on the worker (its streams wait
    for room) instead of the node queueing without bound. The worker's other callers wait too
    (their replies share its socket), so a client that has not come down to ``LOW_WATER``
    within :func:`send_timeout` is dropped (``conn.drop_stalled``: its requests are abandoned,
    each with an ERROR frame) and the worker serves on. The time held does not count as the
    worker's silence or its calls' run time.
    """
    outbox = conn.outbox
    limit = send_timeout(actor.ctx.config)
    held = actor.held_since = trio.current_time()
    try:
        with trio.move_on_after(limit) as scope:
            await outbox.wait_room()
        if scope.cancelled_caught:
            logger.warning(
                "dirty pool: dropping a client that took nothing of its %d KiB of replies in"
                " %gs; dirty worker %d was held up for it",
                outbox.size >> 10,
                limit,
                actor.worker_id,
            )
            conn.drop_stalled(limit)
    finally:
        actor.held_since = None
        # (Rare: a pause.) The worker and its calls were not silent, the node was not reading.
        paused = trio.current_time() - held
        actor.last_seen += paused
        for entry in actor.inflight.values():
            if entry[2] is not None:
                entry[2] += paused
