"""The router: which workers hold which app, the pool's size, scaling and rolling reloads.

A GenServer registered as ``dirty_router``. It publishes ``app -> worker proxies`` in the pool's
:class:`Routes` (``PoolContext.routes``), which connection processes read directly on every
REQUEST, taking the least-loaded worker (see ``_routes``); no message goes through the router on
a call's path. It also publishes which apps a worker is starting for (a killed worker's
replacement, a scale-up's new worker), so that their calls wait instead of failing, and wakes
the connections holding such calls when a worker is up. Workers join with
``WorkerUp`` once their apps are loaded and leave on their death (monitor) or when they start
draining. Scaling adds or removes pool children (``start_child``/``terminate_child``); HUP
starts a replacement for every worker first, then drains the old ones.

The router never waits for a worker to start inside a callback: scaling and reload requests
queue up (their callers get a deferred reply) and run one at a time; each worker start is a
``start_child`` made by a short-lived helper process, which reports the outcome as a message.
Meanwhile the router answers STATUS, follows workers joining and leaving, and queues further
requests.

Helper processes: the router (``dirty_router``, a child of ``dirty_sup``) owns two kinds of
short-lived helpers, ``_start_worker_child`` (one worker start) and ``_terminate`` (stopping a
retired worker, which drains first), because both wait on the pool supervisor for as long as a
worker takes to start or drain. Both are spawned linked to the router, which traps exits and
reaps them (their ``Exit``): if the router dies, they die with it, and what they had asked of
the pool supervisor (a start, a termination) is the supervisor's to finish. No helper outlives
the router.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any

import attrs
import trio

import otp
import supervisors

from ._config import apps_for_new_worker, initial_allocation, minimum_workers
from ._context import (
    ForwardSignal,
    PoolContext,
    Recycle,
    Reregister,
    WorkerDraining,
    WorkerUp,
)
from ._pidfile import remove_pidfile, write_pidfile
from ._proxy_start import start_proxy

logger = logging.getLogger("apps.dirty")

POOL = "dirty_pool"


@attrs.define(eq=False)
class _State:
    ctx: PoolContext
    workers: dict[otp.Pid, WorkerUp] = attrs.Factory(dict)
    draining: set[otp.Pid] = attrs.Factory(set)
    monitors: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)
    next_id: int = 1
    target: int = 0
    started_at: float = attrs.Factory(time.time)
    #: The scaling or reload request being carried out, and those waiting their turn.
    op: _Op | None = None
    queue: deque[_Op] = attrs.Factory(deque)
    #: Ids of workers the pool replaced (reload) or removed (scale-down). Workers are permanent
    #: children, so one that dies before the pool has stopped it comes back under the same id;
    #: that restart is stopped at once, or the pool would end up a worker over its size.
    retired: set[int] = attrs.Factory(set)
    #: Workers the pool supervisor is bringing (back) up, by id: their apps. A worker that died
    #: (and was not retired) is restarted under its id; workers found at the router's start
    #: re-announce themselves (their apps unknown until then: all of them).
    awaiting: dict[int, tuple[str, ...]] = attrs.Factory(dict)


@attrs.define(eq=False)
class _Op:
    """A scaling (``add``/``remove``) or ``reload`` request, carried out one worker start at a
    time; ``from_`` gets the result when it is done."""

    kind: str
    count: int
    from_: otp.From | None
    #: add: the count asked for (``count`` is what is carried out: capped, or cut short).
    requested: int = 0
    #: reload: the workers still to replace, and how many there were.
    old: deque[WorkerUp] = attrs.Factory(deque)
    total: int = 0
    #: Workers started (add) or replaced (reload) so far.
    done: int = 0
    reason: str | None = None
    #: The worker start in progress: the helper's pid, its tag, and what it starts.
    helper: otp.Pid | None = None
    tag: otp.Ref | None = None
    worker_id: int = 0
    apps: tuple[str, ...] = ()
    replacing: WorkerUp | None = None


@attrs.frozen
class _ChildStarted:
    """A helper's report: the outcome of ``start_child`` for the worker tagged ``tag``."""

    tag: otp.Ref
    result: Any


def worker_spec(
    ctx: PoolContext, worker_id: int, apps: list[str] | tuple[str, ...], wait_loaded: bool = True
) -> Any:
    """The pool child spec of one worker (a replacement gets the same apps)."""
    return supervisors.ChildSpec(
        ("dirty_worker", worker_id),
        (start_proxy, ctx, worker_id, tuple(apps), wait_loaded),
        restart="permanent",
        shutdown=ctx.config.dirty_graceful_timeout + 10.0,
    )


class Router(otp.GenServer):
    """Routes apps to workers; owns the pool's size."""

    async def init(self, ctx: PoolContext) -> Any:
        otp.process_flag(trap_exit=True)
        paths = [spec.import_path for spec in ctx.config.dirty_apps]
        ctx.routes.wait_limit = ctx.config.dirty_timeout or None
        ctx.routes.install({path: [] for path in paths}, paths)
        ctx.routes.open = True
        state = _State(ctx)
        children = [
            (child_id, pid)
            for child_id, pid, _, _ in await supervisors.which_children(POOL)
            if isinstance(pid, otp.Pid)
        ]
        existing = [pid for _, pid in children]
        if existing:
            for child_id, pid in children:
                if isinstance(child_id, tuple) and len(child_id) == 2:
                    state.awaiting[child_id[1]] = tuple(paths)
                otp.send(pid, Reregister())
            state.target = len(existing)
            state.next_id = 1000
            return otp.Ok(state)
        allocation = initial_allocation(ctx.config.dirty_apps, ctx.config.worker_count)
        error = await _start_first_workers(state, allocation)
        if error is not None:
            return otp.Stop(error)
        state.target = len(allocation)
        return otp.Ok(state)

    def handle_cast(self, msg: Any, state: _State) -> Any:
        if type(msg) is Recycle:
            info = state.workers.get(msg.pid)
            if info is not None and msg.pid not in state.draining:
                state.queue.append(_Op("reload", 0, None, old=deque([info]), total=1))
                _next_op(state)
        elif type(msg) is WorkerUp:
            _worker_up(state, msg)
        elif type(msg) is WorkerDraining:
            state.draining.add(msg.pid)
            _publish(state)
        elif type(msg) is ForwardSignal:
            for info in state.workers.values():
                _kill(info.os_pid, msg.signum)
        return otp.NoReply(state)

    def handle_info(self, msg: Any, state: _State) -> Any:
        kind = type(msg)
        if kind is WorkerUp:
            return self.handle_cast(msg, state)
        if kind is otp.Down and msg.ref in state.monitors:
            pid = state.monitors.pop(msg.ref)
            info = state.workers.pop(pid, None)
            if info is not None and pid not in state.draining:
                if info.worker_id not in state.retired:
                    state.awaiting[info.worker_id] = info.apps  # its supervisor restarts it
            state.draining.discard(pid)
            _publish(state)
        elif kind is _ChildStarted:
            op = state.op
            if op is not None and msg.tag == op.tag:
                _step_done(state, op, msg.result)
        elif kind is otp.Exit:
            op = state.op
            if op is not None and msg.pid == op.helper and msg.reason != otp.NORMAL:
                # The helper died before it reported (it reports before it exits normally).
                _step_done(state, op, ("error", msg.reason))
        return otp.NoReply(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case "status":
                return otp.Reply(_status(state), state)
            case [("add" | "remove") as kind, int() as count]:
                # Gunicorn acts on (and reports) at least one worker for a count of 0 or less.
                if kind == "remove":
                    _supersede_adds(state)  # the latest request wins
                state.queue.append(_Op(kind, max(1, count), from_, requested=max(1, count)))
                _next_op(state)
                return otp.NoReply(state)
            case "reload":
                state.queue.append(_Op("reload", 0, from_))
                _next_op(state)
                return otp.NoReply(state)
            case "workers":
                return otp.Reply(dict(state.workers), state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    def terminate(self, reason: Any, state: _State) -> None:
        remove_pidfile(state.ctx.config.dirty_pidfile)
        state.ctx.routes.close()
        # A worker still loading its apps would hold the pool supervisor in start_child (and
        # the node's shutdown) until its load ends: its start fails now instead.
        for pid in list(state.ctx.starting):
            otp.exit(pid, otp.KILL)


def _worker_up(state: _State, msg: WorkerUp) -> None:
    if msg.pid not in state.workers:
        state.monitors[otp.monitor(msg.pid)] = msg.pid
    state.workers[msg.pid] = msg
    state.awaiting.pop(msg.worker_id, None)
    state.next_id = max(state.next_id, msg.worker_id + 1)
    if msg.worker_id in state.retired and msg.pid not in state.draining:
        logger.info(
            "dirty worker %d came back after the pool had retired it: stopping it",
            msg.worker_id,
        )
        _retire(state, msg.pid)
    else:
        _publish(state)


def _kill(os_pid: int, signum: int) -> None:
    try:
        os.kill(os_pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _live(state: _State) -> list[WorkerUp]:
    return sorted(
        (w for p, w in state.workers.items() if p not in state.draining),
        key=lambda w: w.worker_id,
    )


def _publish(state: _State) -> None:
    by_app: dict[str, list[Any]] = {s.import_path: [] for s in state.ctx.config.dirty_apps}
    starting: set[str] = set()
    for info in _live(state):
        proxy = state.ctx.proxies.get(info.pid)
        if proxy is None:
            starting.update(info.apps)  # being killed or dead (its Down is on its way): replaced
            continue
        for path in info.apps:
            by_app.setdefault(path, []).append(proxy)
    for apps in state.awaiting.values():
        starting.update(apps)
    op = state.op
    if op is not None and op.helper is not None:
        starting.update(op.apps)
    state.ctx.routes.install(by_app, starting)
    write_pidfile(
        state.ctx.config.dirty_pidfile, [w.os_pid for w in state.workers.values() if w.os_pid]
    )


def _holders(state: _State) -> dict[str, int]:
    counts: dict[str, int] = {}
    for info in _live(state):
        for path in info.apps:
            counts[path] = counts.get(path, 0) + 1
    return counts


async def _start_first_workers(state: _State, allocation: list[list[str]]) -> Any:
    """Start the pool's first workers and wait until every one has loaded its apps: they load
    in parallel, and one whose load fails is restarted by the pool (within its restart
    intensity; past it the pool, and this start, fail). Returns None or the error."""
    pool = otp.whereis(POOL)
    if pool is None:
        return ("dirty_pool_down", POOL)
    pool_ref = otp.monitor(pool)
    pending: set[int] = set()
    for apps in allocation:
        worker_id = state.next_id
        state.next_id += 1
        spec = worker_spec(state.ctx, worker_id, apps, wait_loaded=False)
        result = await supervisors.start_child(POOL, spec)
        if result[0] != "ok":
            logger.error("dirty worker %d could not start: %r", worker_id, result)
            return ("dirty_worker_start_failed", worker_id, result[1])
        pending.add(worker_id)
    while pending:
        msg = await otp.receive(
            lambda m: type(m) is WorkerUp or (type(m) is otp.Down and m.ref == pool_ref)
        )
        if type(msg) is otp.Down:
            return ("dirty_pool_down", msg.reason)
        _worker_up(state, msg)
        pending.discard(msg.worker_id)
    otp.demonitor(pool_ref, flush=True)
    return None


def _register(state: _State, pid: Any, worker_id: int, apps: tuple[str, ...]) -> None:
    """A worker the pool just started is routable at once (unless its own WorkerUp, with its
    OS pid, came first)."""
    state.awaiting.pop(worker_id, None)
    if isinstance(pid, otp.Pid) and pid not in state.workers:
        state.monitors[otp.monitor(pid)] = pid
        state.workers[pid] = WorkerUp(pid, worker_id, apps, 0, trio.current_time())
        _publish(state)


def _since_heartbeat(state: _State, info: WorkerUp, now: float) -> float | None:
    """Seconds since the worker was last heard from (Gunicorn's ``last_heartbeat``)."""
    proxy = state.ctx.proxies.get(info.pid)
    return round(max(0.0, now - proxy.last_seen), 2) if proxy is not None else None


def _status(state: _State) -> dict[str, Any]:
    now = trio.current_time()
    workers = [
        {
            "pid": info.os_pid,
            "age": info.worker_id,
            "apps": list(info.apps),
            "booted": True,
            "last_heartbeat": _since_heartbeat(state, info, now),
            "uptime": round(now - info.started, 2),
            "draining": info.pid in state.draining,
        }
        for info in sorted(state.workers.values(), key=lambda w: w.worker_id)
    ]
    return {
        "arbiter_pid": os.getpid(),
        "workers": workers,
        "worker_count": len(workers),
        "target_workers": state.target,
        "apps": [s.import_path for s in state.ctx.config.dirty_apps],
        "app_workers": {path: n for path, n in _holders(state).items()},
    }


def _scale_down(state: _State, count: int) -> dict[str, Any]:
    minimum = minimum_workers(state.ctx.config.dirty_apps)
    removed = 0
    reason = None
    for _ in range(count):
        live = _live(state)
        if len(live) <= minimum:
            reason = f"the pool never shrinks below {minimum} worker(s), the largest per-app N"
            logger.warning("dirty pool: not removing a worker: %s", reason)
            break
        holders = _holders(state)
        limited = {s.import_path for s in state.ctx.config.dirty_apps if s.workers is not None}

        victims = [
            w for w in live if all(p not in limited or holders[p] > 1 for p in w.apps)
        ] or live
        victim = victims[-1]
        state.retired.add(victim.worker_id)
        _retire(state, victim.pid)
        removed += 1
        state.target = max(0, state.target - 1)
    result: dict[str, Any] = {
        "success": True,
        "operation": "remove",
        "requested": count,
        "removed": removed,
        "total_workers": len(_live(state)),
        "target_workers": state.target,
    }
    if reason is not None:
        result["reason"] = reason
    return result


async def _terminate(pid: otp.Pid) -> None:
    try:
        await supervisors.terminate_child(POOL, pid)
    except otp.CallError:
        pass  # the pool is shutting down (and stops the worker itself)


# -- scaling and reload: one request at a time, one worker start at a time, never blocking ----


def _next_op(state: _State) -> None:
    """Start the next queued request unless one is being carried out."""
    while state.op is None and state.queue:
        op = state.queue.popleft()
        if op.kind == "remove":
            _reply(op, _scale_down(state, op.count))
            continue
        if op.kind == "reload" and not op.total:
            op.old = deque(_live(state))
            op.total = len(op.old)
        if op.kind == "add":
            cap = state.ctx.config.dirty_max_workers
            room = max(0, cap - len(_live(state)))
            if op.count > room:
                op.count = room
                op.reason = f"the pool is capped at dirty_max_workers={cap} worker(s)"
        state.op = op
        _step(state, op)


def _step(state: _State, op: _Op) -> None:
    """Start the request's next worker (in a helper process), or finish the request."""
    if op.kind == "add":
        apps: tuple[str, ...] = ()
        if op.done < op.count:
            apps = tuple(apps_for_new_worker(state.ctx.config.dirty_apps, _holders(state)))
            if not apps:
                op.reason = "All apps have reached their worker limits"
        if not apps:
            _finish(state, op)
            return
        op.replacing = None
    else:
        while op.old and op.old[0].pid not in state.workers:
            # Died since the reload began: its supervisor's restart is a new worker already.
            op.old.popleft()
            op.done += 1
        if not op.old:
            _finish(state, op)
            return
        op.replacing = op.old.popleft()
        apps = op.replacing.apps
    op.worker_id = state.next_id
    state.next_id += 1
    op.apps = apps
    op.tag = otp.make_ref()
    spec = worker_spec(state.ctx, op.worker_id, apps)
    op.helper = otp.spawn_link(_start_worker_child, otp.self(), op.tag, spec)
    state.ctx.routes.starting.update(apps)


async def _start_worker_child(router: otp.Pid, tag: otp.Ref, spec: Any) -> None:
    """A helper of the router: start one worker (as long as that takes) and report."""
    otp.send(router, _ChildStarted(tag, await supervisors.start_child(POOL, spec)))


def _step_done(state: _State, op: _Op, result: Any) -> None:
    op.helper = op.tag = None
    if result[0] != "ok":
        logger.error("dirty worker %d could not start: %r", op.worker_id, result)
        # If the start goes on without its helper (the helper died), the worker it brings up
        # is not the pool's: it is stopped when it announces itself.
        state.retired.add(op.worker_id)
        error = ("dirty_worker_start_failed", op.worker_id, result[1])
        _publish(state)  # (its apps are not starting any more)
        if op.kind == "reload":
            logger.error("dirty pool reload: stopped early: %r", error)
        op.reason = f"a worker failed to start: {error!r}"
        _finish(state, op)
        return
    _register(state, result[1], op.worker_id, op.apps)
    op.done += 1
    if op.kind == "add":
        state.target += 1
    elif op.replacing is not None:
        # The new worker first, then the old one drained; if the old one died meanwhile, the
        # restart its supervisor gave it (same worker id) is what goes.
        retired = op.replacing.worker_id
        op.replacing = None
        state.retired.add(retired)
        for info in list(state.workers.values()):
            if info.worker_id == retired and info.pid not in state.draining:
                _retire(state, info.pid)
    _step(state, op)


def _retire(state: _State, pid: otp.Pid) -> None:
    """Stop routing to the worker ``pid`` and stop it (it drains its calls first)."""
    state.draining.add(pid)
    _publish(state)
    otp.spawn_link(_terminate, pid)  # (a helper the router reaps: see the module's docstring)


def _supersede_adds(state: _State) -> None:
    """A remove wins over the adds before it: those waiting are answered now (nothing done),
    the one under way stops after the worker it is starting."""
    for waiting in [op for op in state.queue if op.kind == "add"]:
        state.queue.remove(waiting)
        waiting.count = 0
        waiting.reason = "superseded by a later remove"
        _reply(waiting, _add_result(state, waiting))
    op = state.op
    if op is not None and op.kind == "add" and op.count > op.done:
        op.count = op.done + (1 if op.helper is not None else 0)
        op.reason = "cut short by a later remove"


def _add_result(state: _State, op: _Op) -> dict[str, Any]:
    result: dict[str, Any] = {
        "success": op.reason is None
        or op.done > 0
        or "limits" in op.reason
        or "dirty_max_workers" in op.reason,
        "operation": "add",
        "requested": op.requested or op.count,
        "spawned": op.done,
        "total_workers": len(_live(state)),
        "target_workers": state.target,
    }
    if op.reason is not None:
        result["reason"] = op.reason
    return result


def _finish(state: _State, op: _Op) -> None:
    state.op = None
    if op.kind == "add":
        result = _add_result(state, op)
        logger.info("dirty pool: added %d worker(s), now %d", op.done, len(_live(state)))
    else:
        logger.info("dirty pool reloaded: %d worker(s) replaced", op.done)
        result = {"success": op.done == op.total, "operation": "reload", "replaced": op.done}
    _reply(op, result)
    _next_op(state)


def _reply(op: _Op, result: dict[str, Any]) -> None:
    if op.from_ is not None:
        otp.reply(op.from_, result)
