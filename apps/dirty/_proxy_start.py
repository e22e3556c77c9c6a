"""Starting a worker proxy: the worker OS process (a port running ``apps.dirty.worker``), the
pool's ``dirty_post_fork`` hook, and the wait for the worker to load its apps (``_lifecycle``),
before the proxy serves calls (``_proxy.serve``) and, when it stops, ``dirty_worker_exit``.
"""

from __future__ import annotations

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
import wire

from ._app import DirtyWorkerInfo
from ._config import DirtyConfig
from ._context import PoolContext
from ._errors import DirtyError
from ._io import Outbox, tune_socket
from ._lifecycle import await_loaded
from ._protocol import STATUS
from ._proxy import KILL_TIMEOUT, WorkerProxy, announce, serve

logger = logging.getLogger("apps.dirty")

#: glibc malloc settings of worker processes (unless the environment sets them): payloads up to
#: the protocol's 64 MiB come from (and go back to) the heap instead of fresh ``mmap`` pages,
#: so a large argument or result costs a copy, not a page fault per 4 KiB on every call.
WORKER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
#: The worker program (``python -m``).
WORKER_MODULE = "apps.dirty.worker"


@attrs.frozen
class ProxyStarted:
    """(A starting proxy to :func:`start_proxy`.) Its worker runs (``error`` None), or could not
    start (``error``: the exit reason)."""

    ref: otp.Ref
    error: Any


async def start_proxy(
    ctx: PoolContext, worker_id: int, apps: tuple[str, ...], wait_loaded: bool = True
) -> otp.Pid:
    """Start a worker proxy linked to the caller (the pool supervisor); return once its worker
    process has loaded its apps, or with ``wait_loaded=False`` once it runs (and its
    ``dirty_post_fork`` has run): the load is then the running proxy's, and a failed load a
    crash its supervisor restarts (so the pool's first workers load in parallel, and a load
    is retried within the pool's restart intensity). The proxy tells the router (WorkerUp)
    when its apps are loaded, either way.

    Raises:
        otp.StartError: The worker process could not start (or load its apps in time).
        otp.StartIgnored: The pool is stopping (the start was cut short: not an error).
    """
    ref = otp.make_ref()
    pid = otp.spawn_link(_proxy_process, ctx, worker_id, apps, otp.self(), ref, wait_loaded)
    mref = otp.monitor(pid)
    msg = await otp.receive(
        lambda m: (
            (type(m) is ProxyStarted and m.ref == ref) or (type(m) is otp.Down and m.ref == mref)
        )
    )
    otp.demonitor(mref, flush=True)
    if type(msg) is ProxyStarted and msg.error is None:
        return pid
    otp.unlink(pid)
    otp.exit(pid, otp.KILL)
    if type(msg) is otp.Down and msg.reason == otp.KILLED and not ctx.routes.open:
        # The router stopped it because the pool is shutting down (SIGTERM while a worker
        # starts): a shutdown, not a start error to report.
        logger.info("dirty worker %d: start cut short, the pool is stopping", worker_id)
        raise otp.StartIgnored
    reason = msg.error if type(msg) is ProxyStarted else msg.reason
    raise otp.StartError(("dirty_worker_failed", worker_id, reason))


async def _proxy_process(
    ctx: PoolContext,
    worker_id: int,
    apps: tuple[str, ...],
    parent: otp.Pid,
    ref: otp.Ref,
    wait_loaded: bool,
) -> None:
    otp.process_flag(trap_exit=True)
    proxy = WorkerProxy(ctx, worker_id, apps, parent, me=otp.self())
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
            await _spawn(proxy, ours, theirs)
            if not wait_loaded:
                otp.send(parent, ProxyStarted(ref, None))
            stopped = await _load(proxy)
        except Exception as exc:
            error = _load_failed(proxy, exc)
            if proxy.port is not None:
                otp.exit(proxy.port, otp.KILL)
            if wait_loaded:
                otp.send(parent, ProxyStarted(ref, error))
                return
            reason = error
            return
        finally:
            ctx.starting.discard(me)
        if stopped is not None:
            reason = stopped  # the pool stopped it while it loaded
            if proxy.port is not None:
                otp.exit(proxy.port, otp.KILL)
            return
        assert proxy.me is not None
        ctx.proxies[proxy.me] = proxy
        if wait_loaded:
            otp.send(parent, ProxyStarted(ref, None))
        announce(proxy)
        reason = await serve(proxy)
    finally:
        ctx.proxies.pop(me, None)
        if proxy.outbox is not None:
            proxy.outbox.close()
        ours.close()
        hook = ctx.config.hook("dirty_worker_exit")
        if hook is not None and proxy.os_pid:
            _run_hook(hook, "dirty_worker_exit", ctx, _info(proxy))
    otp.exit_self(reason)


def _load_failed(proxy: WorkerProxy, exc: Exception) -> Any:
    """Log why the worker could not start (with the app's traceback) and return the reason."""
    tb = getattr(exc, "traceback", None)
    logger.error(
        "dirty worker %d failed to start: %s%s",
        proxy.worker_id,
        exc,
        f"\n{tb.rstrip()}" if tb else "",
    )
    return ("dirty_worker_failed", proxy.worker_id, str(exc))


def _info(proxy: WorkerProxy) -> DirtyWorkerInfo:
    return DirtyWorkerInfo(proxy.worker_id, proxy.os_pid or None, proxy.apps)


def _run_hook(hook: Any, name: str, *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        logger.exception("dirty hook %s failed", name)


async def _spawn(proxy: WorkerProxy, ours: socket.socket, theirs: socket.socket) -> None:
    """Start the worker process, run ``dirty_post_fork``, then let the worker load its apps
    (Gunicorn's order: fork, ``dirty_post_fork``, the apps' ``__init__``, ``init()``,
    ``dirty_worker_init``)."""
    ctx = proxy.ctx
    config = ctx.config
    spec = {
        "fd": theirs.fileno(),
        "ppid": os.getpid(),
        "apps": list(proxy.apps),
        "threads": config.dirty_threads,
        "heartbeat": config.heartbeat_interval,
        "graceful": config.dirty_graceful_timeout,
        "worker_id": proxy.worker_id,
        "log_level": ctx.log_level,
        "worker_init": _hook_path(config, "dirty_worker_init"),
    }
    env = dict(os.environ)
    env["GUNICORN_DIRTY_SOCKET"] = ctx.socket_path
    for name, value in WORKER_MALLOC.items():
        env.setdefault(name, value)
    try:
        proxy.port = await otp.open_port(
            [sys.executable, "-m", WORKER_MODULE, json.dumps(spec)],
            env=env,
            pass_fds=[theirs.fileno()],
            kill_timeout=KILL_TIMEOUT,
        )
    finally:
        theirs.close()
    proxy.os_pid = await otp.port_os_pid(proxy.port)
    proxy.stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    proxy.outbox = Outbox(ours.fileno())
    if config.dirty_max_requests:
        jitter = config.dirty_max_requests_jitter
        proxy.calls_left = config.dirty_max_requests + (random.randint(0, jitter) if jitter else 0)
    hook = config.hook("dirty_post_fork")
    if hook is not None:
        _run_hook(hook, "dirty_post_fork", ctx, _info(proxy))
    proxy.outbox.write(wire.encode_header(STATUS, 0, 0))  # the go-ahead


async def _load(proxy: WorkerProxy) -> Any:
    """Wait for the worker to load its apps; return None, or the exit reason of the pool's
    order to stop, if one came meanwhile (the load is then abandoned).

    Raises:
        DirtyError: The worker failed to load, exited, or took over ``dirty_app_load_timeout``.
    """
    assert proxy.stream is not None
    stop: list[Any] = []
    failed: list[DirtyError] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            msg = await otp.receive(
                lambda m: (
                    type(m) is otp.Exit
                    and (m.pid == proxy.parent or (m.pid != proxy.port and m.reason != otp.NORMAL))
                )
            )
            stop.append(msg.reason)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        timeout = proxy.ctx.config.app_load_timeout
        try:
            await await_loaded(proxy.stream, proxy.worker_id, proxy.apps, timeout)
        except DirtyError as exc:
            failed.append(exc)
        nursery.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if stop:
        return stop[0]
    proxy.started = proxy.last_seen = trio.current_time()
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
