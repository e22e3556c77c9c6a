"""Worker actors: one process per dirty worker, owning its port (the OS process) and the
arbiter end of its socketpair. Children of the pool's DynamicSupervisor.

A worker actor forwards requests from connection processes to its worker (rewriting request ids
to its own), forwards the worker's frames back verbatim (only the header's id changes), keeps
the requests in flight, and watches liveness: a worker silent for ``dirty_timeout`` or busy on one
call that long is killed and the actor exits, so the supervisor starts a replacement with the
same apps. Its callers get DirtyTimeoutError; if the worker dies they get DirtyWorkerError. On
shutdown it drains in-flight calls for up to ``dirty_graceful_timeout``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from typing import Any

import attrs
import trio

import otp
import wire
from otp import ets

from ._config import DirtyConfig
from ._errors import DirtyError, DirtyTimeoutError, DirtyWorkerError
from ._frames import CHUNK, END, REQUEST, RESPONSE, FrameSplitter, encode, header, tune_socket
from ._worker import DirtyWorkerInfo

logger = logging.getLogger("apps.dirty")

ROUTER = "dirty_router"
#: A public ETS table the router owns: ``(worker_actor_pid, last_seen)``, trio clock, written
#: by the worker actors at most every ``_BEAT_EVERY`` seconds; STATUS's ``last_heartbeat``.
HEARTBEATS = "apps.dirty.heartbeats"
_BEAT_EVERY = 0.1
#: How long a new worker may take to load its apps.
START_TIMEOUT = 60.0
#: SIGTERM-to-SIGKILL grace of a worker port.
KILL_TIMEOUT = 5.0


@attrs.frozen
class PoolContext:
    """What every part of one pool shares."""

    config: DirtyConfig
    socket_path: str
    log_level: str = "INFO"


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
class Reregister:
    """A (restarted) router asks the worker actors to announce themselves again."""


class Outbox:
    """Ordered, synchronous writes to a non-blocking socket.

    ``write`` sends at once with ``os.write`` while nothing is queued; what the socket does not
    take is queued for ``run`` (a task of the owner) to send when it is writable. Any task of
    the node may write (trio runs them on one thread), so a frame goes from one process straight
    to another's socket without a mailbox hop.
    """

    __slots__ = ("_idle", "_wake", "broken", "buf", "closed", "fd", "on_broken")

    def __init__(self, fd: int, on_broken: Any = None) -> None:
        self.fd = fd
        self.buf: list[memoryview] = []
        self.closed = False
        self.broken = False
        self.on_broken = on_broken
        self._wake = trio.Event()
        self._idle: trio.Event | None = None

    def write(self, data: bytes) -> None:
        if self.closed or not data:
            return
        if not self.buf:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                n = 0
            except OSError:
                self._break()
                return
            if n == len(data):
                return
            self.buf.append(memoryview(data)[n:])
            self._wake.set()
        else:
            self.buf.append(memoryview(data))

    def _break(self) -> None:
        self.closed = self.broken = True
        self.buf.clear()
        self._wake.set()
        self._idled()
        if self.on_broken is not None:
            self.on_broken()

    def close(self) -> None:
        """No more writes (before the socket is closed: its fd number may be reused)."""
        self.closed = True
        self.buf.clear()
        self._wake.set()
        self._idled()

    def _idled(self) -> None:
        if self._idle is not None:
            self._idle.set()
            self._idle = None

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
                data = buf[0]
                try:
                    n = os.write(self.fd, data)
                except BlockingIOError:
                    break
                except OSError:
                    self._break()
                    return
                if n == len(data):
                    buf.pop(0)
                else:
                    buf[0] = data[n:]
                    break

    async def flush(self) -> None:
        """Wait until everything written has been sent (or the socket broke)."""
        while self.buf and not self.closed:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()


#: Worker actors of this node by pid, for connections to submit to directly.
ACTORS: dict[otp.Pid, Any] = {}


@attrs.frozen
class _Started:
    ref: otp.Ref
    error: Any


def error_bytes(rid: int, error: DirtyError) -> bytes:
    """An ERROR frame for ``rid``."""
    e = error.to_dict()
    return encode(wire.make_error(rid, e["error_type"], e["message"], e["details"]))


async def start_worker(ctx: PoolContext, worker_id: int, apps: tuple[str, ...]) -> otp.Pid:
    """Start a worker actor linked to the caller (the pool supervisor); return once its worker
    process has loaded its apps.

    Raises:
        otp.StartError: The worker process could not start or load its apps in time.
    """
    ref = otp.make_ref()
    pid = otp.spawn_link(_worker_actor, ctx, worker_id, apps, otp.self(), ref)
    mref = otp.monitor(pid)
    msg = await otp.receive(
        lambda m: (type(m) is _Started and m.ref == ref) or (type(m) is otp.Down and m.ref == mref),
        timeout=START_TIMEOUT + 5,
        default=None,
    )
    otp.demonitor(mref, flush=True)
    if type(msg) is _Started and msg.error is None:
        return pid
    otp.unlink(pid)
    otp.exit(pid, otp.KILL)
    reason = msg.error if type(msg) is _Started else getattr(msg, "reason", "timeout")
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
    inflight: dict[int, list[Any]] = attrs.Factory(dict)
    keys: dict[tuple[otp.Pid, int], int] = attrs.Factory(dict)
    next_id: int = 1
    last_seen: float = 0.0
    started: float = 0.0
    me: otp.Pid | None = None
    draining: bool = False
    outbox: Outbox | None = None

    def submit(self, conn: Any, rid: int, payload: bytes) -> None:
        """Send a client's REQUEST to the worker now; ``conn.deliver(bytes, done)`` gets the
        reply frames (called from the connection's own task)."""
        wid = self.next_id
        self.next_id = wid + 1
        self.inflight[wid] = [conn, rid, trio.current_time()]
        self.keys[(conn, rid)] = wid
        assert self.outbox is not None
        self.outbox.write(header(REQUEST, len(payload), wid) + payload)

    def cancel(self, conn: Any, rid: int) -> None:
        """Abandon a request (client END or gone): the worker gets an END."""
        wid = self.keys.pop((conn, rid), 0)
        if wid:
            self.inflight.pop(wid, None)
            assert self.outbox is not None
            self.outbox.write(header(END, 0, wid))
            if self.draining and not self.inflight and self.me is not None:
                otp.send(self.me, "drained")


async def _worker_actor(
    ctx: PoolContext, worker_id: int, apps: tuple[str, ...], parent: otp.Pid, ref: otp.Ref
) -> None:
    otp.process_flag(trap_exit=True)
    actor = _Actor(ctx, worker_id, apps, parent, me=otp.self())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tune_socket(ours)
    tune_socket(theirs)
    reason: Any = otp.NORMAL
    try:
        try:
            await _open(actor, ours, theirs)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise
            logger.error("dirty worker %d failed to start: %s", worker_id, exc)
            otp.send(parent, _Started(ref, repr(exc)))
            if actor.port is not None:
                otp.exit(actor.port, otp.KILL)
            return
        assert actor.me is not None
        ACTORS[actor.me] = actor
        otp.send(parent, _Started(ref, None))
        hook = ctx.config.hook("dirty_post_fork")
        if hook is not None:
            _run_hook(hook, "dirty_post_fork", ctx, _info(actor))
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
        otp.cast(
            router,
            WorkerUp(otp.self(), actor.worker_id, actor.apps, actor.os_pid, actor.started),
        )


async def _open(actor: _Actor, ours: socket.socket, theirs: socket.socket) -> None:
    ctx = actor.ctx
    config = ctx.config
    spec = {
        "fd": theirs.fileno(),
        "ppid": os.getpid(),
        "apps": list(actor.apps),
        "threads": config.dirty_threads,
        "heartbeat": config.heartbeat_interval,
        "worker_id": actor.worker_id,
        "log_level": ctx.log_level,
        "worker_init": _hook_path(config, "dirty_worker_init"),
    }
    env = dict(os.environ)
    env["GUNICORN_DIRTY_SOCKET"] = ctx.socket_path
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
    splitter = FrameSplitter()
    with trio.fail_after(START_TIMEOUT):
        while True:
            data = await actor.stream.receive_some(65536)
            if not data:
                raise DirtyWorkerError(
                    f"dirty worker {actor.worker_id} exited while loading {list(actor.apps)};"
                    " see its log for the traceback",
                    worker_id=actor.worker_id,
                )
            if any(t == RESPONSE and rid == 0 for t, rid, _ in splitter.feed(data)):
                break
    actor.started = actor.last_seen = trio.current_time()


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
                        _fail_all(
                            actor,
                            DirtyTimeoutError(
                                f"dirty worker {actor.worker_id} (pid {actor.os_pid}) did not"
                                f" answer within dirty_timeout={timeout:g}s; it was killed and"
                                " is being replaced",
                                timeout=timeout,
                            ),
                        )
                        logger.error(
                            "dirty worker %d (pid %d) timed out after %gs: killing it",
                            actor.worker_id,
                            actor.os_pid,
                            timeout,
                        )
                        assert actor.port is not None
                        otp.exit(actor.port, otp.KILL)
                        return ("exit", ("dirty_timeout", actor.worker_id))
                    if draining_until is not None and (not actor.inflight or now >= draining_until):
                        return ("close", stop_reason)
                elif kind is otp.Exit:
                    if msg.pid == actor.port:
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
    if now - actor.last_seen > timeout:
        return True
    return any(now - entry[2] > timeout for entry in actor.inflight.values())


async def _close(actor: _Actor, reason: Any) -> Any:
    """Fail what is left, stop the worker process (SIGTERM, then SIGKILL), return ``reason``."""
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
        otp.port_close(port)
        await otp.receive(
            lambda m: type(m) is otp.Exit and m.pid == port,
            timeout=KILL_TIMEOUT + 2,
            default=None,
        )
    return reason


def _fail_all(actor: _Actor, error: DirtyError) -> None:
    groups: dict[Any, tuple[list[bytes], list[int]]] = {}
    for conn, rid, _ in actor.inflight.values():
        parts, done = groups.setdefault(conn, ([], []))
        parts.append(error_bytes(rid, error))
        done.append(rid)
    actor.inflight.clear()
    actor.keys.clear()
    for conn, (parts, done) in groups.items():
        conn.deliver(b"".join(parts), tuple(done))


def _publish_beat(actor: _Actor, now: float) -> None:
    try:
        ets.insert(HEARTBEATS, (actor.me, now))
    except ets.EtsError:
        pass  # the router is restarting; its next table gets the next beat


async def _read_worker(actor: _Actor) -> None:
    assert actor.stream is not None
    receive = actor.stream.receive_some
    splitter = FrameSplitter()
    inflight = actor.inflight
    keys = actor.keys
    published = 0.0
    while True:
        try:
            data = await receive(splitter.read_size())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        now = trio.current_time()
        actor.last_seen = now
        if now - published > _BEAT_EVERY:
            published = now
            _publish_beat(actor, now)
        groups: dict[Any, tuple[list[bytes], list[int]]] = {}
        for mtype, wid, payload in splitter.feed(data):
            entry = inflight.get(wid)
            if entry is None:
                continue  # heartbeat, or a request abandoned or failed already
            conn, rid, _ = entry
            group = groups.get(conn)
            if group is None:
                group = groups[conn] = ([], [])
            group[0].append(header(mtype, len(payload), rid))
            group[0].append(payload)
            if mtype == CHUNK:
                entry[2] = now
            else:
                del inflight[wid]
                keys.pop((conn, rid), None)
                group[1].append(rid)
        for conn, (parts, done) in groups.items():
            conn.deliver(b"".join(parts), tuple(done))
        if actor.draining and not inflight and actor.me is not None:
            otp.send(actor.me, "drained")
