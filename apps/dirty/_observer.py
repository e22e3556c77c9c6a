"""The dirty pool's view for ``supervisors.observe()``: its workers (apps, calls in flight and
waiting for a thread, last heartbeat), the calls parked for a worker that is starting, and the
stash tables, read from what the worker proxies, the routes and the tables hold (no call to the
router, so a busy router does not hold an observer up)."""

from __future__ import annotations

from typing import Any

import trio

from otp import ets

from ._context import PoolContext
from ._stash import _ets_name, _tables


def observer_view(ctx: PoolContext) -> dict[str, Any]:
    """A dict of plain values: ``workers`` (by worker id: ``os_pid``, ``apps``, ``in_flight``
    calls, of which ``waiting_for_thread`` were sent while all ``dirty_threads`` were busy,
    ``draining``, ``last_heartbeat`` in seconds ago or None, ``uptime``), ``parked``
    (connections with calls waiting for a worker of each app that is starting),
    ``stash_tables`` (name: number of keys) and ``calls`` (calls that reached a worker and
    ended: ``total``, ``errors`` by kind, ``latency_seconds`` as a histogram, see
    :meth:`CallStats.view <apps.dirty._calls.CallStats.view>`)."""
    now = trio.current_time()
    workers = []
    for proxy in sorted(list(ctx.proxies.values()), key=lambda p: p.worker_id):
        workers.append(
            {
                "worker_id": proxy.worker_id,
                "os_pid": proxy.os_pid,
                "apps": list(proxy.apps),
                "in_flight": len(proxy.inflight),
                "waiting_for_thread": len(proxy.held),
                "draining": proxy.draining,
                "last_heartbeat": round(max(0.0, now - proxy.last_seen), 2),
                "uptime": round(now - proxy.started, 2),
            }
        )
    stash = {}
    for name in _tables():
        info = ets.info(_ets_name(name))
        if info is not None:
            stash[name] = info.size
    return {
        "workers": workers,
        "parked": {app: len(conns) for app, conns in sorted(ctx.routes.waiting.items()) if conns},
        "stash_tables": stash,
        "calls": ctx.calls.view(),
    }


def ready(ctx: PoolContext) -> str | None:
    """None once every configured app has a worker serving it (the pool's readiness for
    ``supervisors.check_readiness``), else which apps still wait for one."""
    if not ctx.config.enabled:
        return None
    lanes = ctx.routes.table
    waiting = [path for path in ctx.config.apps_paths if not getattr(lanes.get(path), "size", 0)]
    if waiting:
        return f"no worker serves {', '.join(waiting)} yet"
    return None
