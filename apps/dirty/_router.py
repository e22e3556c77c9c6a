"""The router: which workers hold which app, the pool's size, scaling and rolling reloads.

A GenServer registered as ``dirty_router``. It publishes ``app -> worker actors`` in the pool's
:class:`Routes` (``PoolContext.routes``), which connection processes read directly on every
REQUEST, taking the next worker round-robin; no message goes through the router on a call's
path. Workers join with
``WorkerUp`` once their apps are loaded and leave on their death (monitor) or when they start
draining. Scaling adds or removes pool children (``start_child``/``terminate_child``); HUP
starts a replacement for every worker first, then drains the old ones.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import attrs
import trio

import otp
import supervisors
from otp import ets

from ._config import apps_for_new_worker, initial_allocation, minimum_workers
from ._pidfile import remove_pidfile, write_pidfile
from ._pool import (
    ACTORS,
    HEARTBEATS,
    PoolContext,
    Reregister,
    WorkerDraining,
    WorkerUp,
    start_worker,
)

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


def worker_spec(ctx: PoolContext, worker_id: int, apps: list[str] | tuple[str, ...]) -> Any:
    """The pool child spec of one worker (a replacement gets the same apps)."""
    return supervisors.ChildSpec(
        ("dirty_worker", worker_id),
        (start_worker, ctx, worker_id, tuple(apps)),
        restart="permanent",
        shutdown=ctx.config.dirty_graceful_timeout + 10.0,
    )


class Router(otp.GenServer):
    """Routes apps to workers; owns the pool's size."""

    async def init(self, ctx: PoolContext) -> Any:
        otp.process_flag(trap_exit=True)
        ets.new(HEARTBEATS, access=ets.PUBLIC, named=True)
        ctx.routes.table = {spec.import_path: () for spec in ctx.config.dirty_apps}
        ctx.routes.open = True
        state = _State(ctx)
        existing = [
            pid
            for _, pid, _, _ in await supervisors.which_children(POOL)
            if isinstance(pid, otp.Pid)
        ]
        if existing:
            for pid in existing:
                otp.send(pid, Reregister())
            state.target = len(existing)
            state.next_id = 1000
            return otp.Ok(state)
        allocation = initial_allocation(ctx.config.dirty_apps, ctx.config.worker_count)
        for apps in allocation:
            error = await _add(state, apps)
            if error is not None:
                return otp.Stop(error)
        state.target = len(allocation)
        return otp.Ok(state)

    def handle_cast(self, msg: Any, state: _State) -> Any:
        if type(msg) is WorkerUp:
            if msg.pid not in state.workers:
                state.monitors[otp.monitor(msg.pid)] = msg.pid
            state.workers[msg.pid] = msg
            state.next_id = max(state.next_id, msg.worker_id + 1)
            _publish(state)
        elif type(msg) is WorkerDraining:
            state.draining.add(msg.pid)
            _publish(state)
        elif msg == "usr1":
            for info in state.workers.values():
                _kill(info.os_pid, signal.SIGUSR1)
        return otp.NoReply(state)

    def handle_info(self, msg: Any, state: _State) -> Any:
        if type(msg) is otp.Down and msg.ref in state.monitors:
            pid = state.monitors.pop(msg.ref)
            state.workers.pop(pid, None)
            state.draining.discard(pid)
            ets.delete(HEARTBEATS, pid)
            _publish(state)
        return otp.NoReply(state)

    async def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case "status":
                return otp.Reply(_status(state), state)
            case ("add", count):
                return otp.Reply(await _scale_up(state, count), state)
            case ("remove", count):
                return otp.Reply(_scale_down(state, count), state)
            case "reload":
                return otp.Reply(await _reload(state), state)
            case "workers":
                return otp.Reply(dict(state.workers), state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    def terminate(self, reason: Any, state: _State) -> None:
        remove_pidfile(state.ctx.config.dirty_pidfile)
        state.ctx.routes.open = False
        state.ctx.routes.table = {}
        try:
            ets.delete(HEARTBEATS)
        except ets.EtsError:
            pass


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
    for info in _live(state):
        actor = ACTORS.get(info.pid)
        if actor is None:
            continue  # gone; its Down is on its way
        for path in info.apps:
            by_app.setdefault(path, []).append(actor)
    state.ctx.routes.table = {path: tuple(actors) for path, actors in by_app.items()}
    write_pidfile(
        state.ctx.config.dirty_pidfile, [w.os_pid for w in state.workers.values() if w.os_pid]
    )


def _holders(state: _State) -> dict[str, int]:
    counts: dict[str, int] = {}
    for info in _live(state):
        for path in info.apps:
            counts[path] = counts.get(path, 0) + 1
    return counts


async def _add(state: _State, apps: list[str] | tuple[str, ...]) -> Any:
    worker_id = state.next_id
    state.next_id += 1
    result = await supervisors.start_child(POOL, worker_spec(state.ctx, worker_id, apps))
    if result[0] != "ok":
        logger.error("dirty worker %d could not start: %r", worker_id, result)
        return ("dirty_worker_start_failed", worker_id, result[1])
    pid = result[1]
    if isinstance(pid, otp.Pid) and pid not in state.workers:
        # Routable at once; its own WorkerUp (with its OS pid) is handled after this call.
        state.monitors[otp.monitor(pid)] = pid
        state.workers[pid] = WorkerUp(pid, worker_id, tuple(apps), 0, trio.current_time())
        _publish(state)
    return None


def _since_heartbeat(info: WorkerUp, now: float) -> float | None:
    """Seconds since the worker was last heard from (Gunicorn's ``last_heartbeat``)."""
    rows = ets.lookup(HEARTBEATS, info.pid)
    return round(max(0.0, now - rows[0][1]), 2) if rows else None


def _status(state: _State) -> dict[str, Any]:
    now = trio.current_time()
    workers = [
        {
            "pid": info.os_pid,
            "age": info.worker_id,
            "apps": list(info.apps),
            "booted": True,
            "last_heartbeat": _since_heartbeat(info, now),
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


async def _scale_up(state: _State, count: int) -> dict[str, Any]:
    spawned = 0
    reason = None
    for _ in range(max(1, count)):
        apps = apps_for_new_worker(state.ctx.config.dirty_apps, _holders(state))
        if not apps:
            reason = "All apps have reached their worker limits"
            break
        error = await _add(state, apps)
        if error is not None:
            reason = f"a worker failed to start: {error!r}"
            break
        spawned += 1
        state.target += 1
    result: dict[str, Any] = {
        "success": reason is None or spawned > 0 or "limits" in reason,
        "operation": "add",
        "requested": count,
        "spawned": spawned,
        "total_workers": len(_live(state)),
        "target_workers": state.target,
    }
    if reason is not None:
        result["reason"] = reason
    logger.info("dirty pool: added %d worker(s), now %d", spawned, len(_live(state)))
    return result


def _scale_down(state: _State, count: int) -> dict[str, Any]:
    minimum = minimum_workers(state.ctx.config.dirty_apps)
    removed = 0
    reason = None
    for _ in range(max(1, count)):
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
        state.draining.add(victim.pid)
        _publish(state)
        otp.spawn(_terminate, victim.pid)
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
    await supervisors.terminate_child(POOL, pid)


async def _reload(state: _State) -> dict[str, Any]:
    """HUP: a new worker for every old one (same apps), then drain the old ones."""
    old = _live(state)
    started = 0
    for info in old:
        error = await _add(state, info.apps)
        if error is not None:
            logger.error("dirty pool reload: stopped early: %r", error)
            break
        started += 1
        state.draining.add(info.pid)
        _publish(state)
        otp.spawn(_terminate, info.pid)
    logger.info("dirty pool reloaded: %d worker(s) replaced", started)
    return {"success": started == len(old), "operation": "reload", "replaced": started}
