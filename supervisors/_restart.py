"""The restart engine of a supervisor, as ``supervisor.erl`` (OTP 25) runs it.

Starting children in order (``start_children``), stopping them in the order given
(``terminate_children``), and, when a child exits, restarting by its spec and the strategy's
plan (``restart_child/3``, ``do_restart/3``, ``restart/2``), counting each restart against the
intensity, retrying a failed restart through the mailbox (``try_again_restart``), and stopping
the supervisor past the intensity or when a significant child ends (``do_auto_shutdown/2``).
The decisions are the pure functions of ``_plan.py``; these functions carry them out on the
supervisor's state, inside its process.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import trio

import otp

from . import _reports as reports
from ._children import (
    OK,
    SHUTDOWN,
    Child,
    Restarting,
    SupState,
    Undefined,
    del_child,
    remove,
    set_pid,
)
from ._lifecycle import call_start, shutdown
from ._plan import PLANS, add_restart, now_seconds, should_restart
from ._spec import AutoShutdown, ChildSpec, Restart

__all__ = [
    "TryAgain",
    "child_exited",
    "do_terminate",
    "start_children",
    "start_one",
    "terminate_children",
    "try_again",
]


class TryAgain:
    """The cast a supervisor sends itself to retry a failed restart (OTP's
    ``{try_again_restart, Child}``)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


async def start_one(state: SupState, spec: ChildSpec) -> tuple[Any, ...]:
    result = await call_start(spec)
    if result[0] == OK and result[1] is not None:
        reports.report_progress(state.name, spec, result[1])
    return result


async def start_children(state: SupState, ids: Iterable[Hashable]) -> Any:
    """Start ``ids`` in order (OTP's ``start_children``); on the first failure, stop and
    return ``(id, reason)``. Ignored temporary children are dropped."""
    for child_id in ids:
        child = state.children.get(child_id)
        if child is None:
            continue
        result = await start_one(state, child.spec)
        if result[0] == OK:
            if result[1] is None and child.spec.restart is Restart.TEMPORARY:
                remove(state, child)
            else:
                set_pid(state, child, result[1])
        else:
            reports.report_error(reports.START_ERROR, result[1], state.name, child.spec)
            return child_id, result[1]
    return None


async def do_terminate(state: SupState, child: Child) -> None:
    """OTP's ``do_terminate``: stop the child if it runs (a no-op otherwise)."""
    pid = child.pid
    if pid is not None:
        await shutdown(state.name, child.spec, pid)


async def terminate_children(state: SupState, ids: Iterable[Hashable]) -> None:
    """OTP's ``terminate_children``: stop ``ids`` one at a time, in the order given (reverse
    start order); temporary children are dropped, the others kept with no pid."""
    for child_id in list(ids):
        child = state.children.get(child_id)
        if child is None:
            continue
        await do_terminate(state, child)
        if child.spec.restart is Restart.TEMPORARY:
            remove(state, child)
        else:
            set_pid(state, child, None)


async def child_exited(state: SupState, pid: otp.Pid, reason: Any) -> str:
    """OTP's ``restart_child/3`` + ``do_restart/3``; returns "ok" or "shutdown"."""
    if state.is_dynamic:
        spec = state.dynamic.pop(pid, None)
        if spec is None:
            return OK
        if should_restart(spec.restart, reason):
            reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
            state.last_restart_reason = reason
            return await _restart_dynamic(state, pid, spec)
        if otp.is_abnormal(reason):
            reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
        return _auto_shutdown(state, spec)
    child_id = state.pids.get(pid)
    if child_id is None:
        return OK
    child = state.children[child_id]
    spec = child.spec
    if should_restart(spec.restart, reason):
        reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
        state.last_restart_reason = reason
        state.child_restarts[child_id] = state.child_restarts.get(child_id, 0) + 1
        return await _restart_static(state, child)
    if otp.is_abnormal(reason):
        reports.report_error(reports.CHILD_TERMINATED, reason, state.name, spec, pid)
    del_child(state, child)
    return _auto_shutdown(state, spec)


def _auto_shutdown(state: SupState, spec: ChildSpec) -> str:
    """OTP's ``do_auto_shutdown/2``, for a significant child that was not restarted."""
    auto = state.flags.auto_shutdown
    if auto is AutoShutdown.NEVER or not spec.significant:
        return OK
    if auto is AutoShutdown.ANY_SIGNIFICANT:
        return SHUTDOWN
    if state.is_dynamic:
        running = any(
            s.significant for key, s in state.dynamic.items() if key.__class__ is not Undefined
        )
    else:
        running = any(
            c.spec.significant and (c.pid is not None or c.restarting)
            for c in state.children.values()
        )
    return OK if running else SHUTDOWN


def _add_restart(state: SupState) -> bool:
    flags = state.flags
    now = trio.current_time()
    allowed, state.restarts = add_restart(
        state.restarts, now_seconds(now), flags.intensity, flags.period
    )
    state.restarts_total += 1
    state.last_restart_at = now
    return allowed


async def _restart_static(state: SupState, child: Child) -> str:
    """OTP's ``restart/2`` for one_for_one, one_for_all and rest_for_one."""
    if not _add_restart(state):
        reports.report_error(
            reports.SHUTDOWN, reports.REACHED_MAX_RESTART_INTENSITY, state.name, child.spec
        )
        del_child(state, child)
        return SHUTDOWN
    failed_id = child.spec.id
    plan = PLANS[state.flags.strategy](list(state.children), failed_id)
    set_pid(state, child, None)
    await terminate_children(state, plan.terminate)
    for child_id in plan.start:
        other = state.children.get(child_id)
        if other is not None:
            set_pid(state, other, None)
    failure = await start_children(state, plan.start)
    if failure is not None:
        retry = state.children[failure[0]]
        retry.restarting = True
        otp.cast(otp.self(), TryAgain(failure[0]))
    return OK


async def _restart_dynamic(state: SupState, old_key: Any, spec: ChildSpec) -> str:
    """OTP's ``restart/2`` for simple_one_for_one (and DynamicSupervisor)."""
    if not _add_restart(state):
        reports.report_error(
            reports.SHUTDOWN, reports.REACHED_MAX_RESTART_INTENSITY, state.name, spec
        )
        return SHUTDOWN
    result = await start_one(state, spec)
    if result[0] == OK:
        if result[1] is not None:
            state.dynamic[result[1]] = spec
        elif state.mode == "simple":
            # OTP 25 stores the ignored restart as an 'undefined' entry; Elixir drops it.
            state.dynamic[Undefined()] = spec
        return OK
    reports.report_error(reports.START_ERROR, result[1], state.name, spec)
    key = Restarting(old_key)
    state.dynamic[key] = spec
    state.dynamic_restarts += 1
    otp.cast(otp.self(), TryAgain(key))
    return OK


async def try_again(state: SupState, key: Any) -> str:
    """OTP's ``try_again_restart``: retry a failed restart (counted by the intensity)."""
    if state.is_dynamic:
        spec = state.dynamic.pop(key, None) if key.__class__ is Restarting else None
        if spec is None:
            return OK
        state.dynamic_restarts -= 1
        return await _restart_dynamic(state, key.old, spec)
    child = state.children.get(key)
    if child is None or not child.restarting:
        return OK
    return await _restart_static(state, child)
