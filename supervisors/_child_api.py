"""The child API of a supervisor (``supervisor.erl``'s ``start_child/2`` ... ``count_children/1``):
the requests, the client functions that send them, and the supervisor's answers to them.

Each client function is a ``GenServer`` call with infinite timeout, as in OTP; each ``handle_*``
function is what the engine's ``handle_call`` runs for one request, on the supervisor's state.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

import otp

from ._children import (
    OK,
    RESTARTING,
    Child,
    Restarting,
    SupState,
    del_child,
    dynamic_placeholder,
    find_static,
    remove,
    set_pid,
)
from ._lifecycle import call_start, shutdown
from ._observe import ChildView, SupervisorView
from ._plan import now_seconds, restarts_in_window
from ._restart import do_terminate, start_one
from ._spec import (
    ChildSpec,
    ChildSpecError,
    ChildType,
    Restart,
    check_dynamic_significant,
    check_significant,
)

__all__ = [
    "CountChildren",
    "DeleteChild",
    "GetChildspec",
    "RestartChild",
    "StartChild",
    "TerminateChild",
    "WhichChildren",
    "count_children",
    "delete_child",
    "get_childspec",
    "handle_count_children",
    "handle_delete_child",
    "handle_get_childspec",
    "handle_observe",
    "handle_restart_child",
    "handle_start_child",
    "handle_terminate_child",
    "handle_which_children",
    "restart_child",
    "start_child",
    "terminate_child",
    "which_children",
]


# -- requests ---------------------------------------------------------------------------------


@attrs.frozen
class StartChild:
    spec: Any


@attrs.frozen
class TerminateChild:
    child: Any


@attrs.frozen
class RestartChild:
    child: Any


@attrs.frozen
class DeleteChild:
    child: Any


@attrs.frozen
class GetChildspec:
    child: Any


@attrs.frozen
class WhichChildren:
    pass


@attrs.frozen
class CountChildren:
    pass


# -- client functions -------------------------------------------------------------------------


async def start_child(supervisor: Any, spec: Any) -> Any:
    """Add a child and start it (OTP's ``supervisor:start_child/2``).

    For a static supervisor ``spec`` is a :class:`ChildSpec` (or its map form) and the child
    goes last in the start order (so it is stopped first). For simple_one_for_one ``spec`` is a
    list (or tuple) of extra arguments appended to the template's; anything else is answered
    ``("error", ("bad_extra_args", spec))``. For a :class:`DynamicSupervisor` it is a spec whose
    arguments get the supervisor's ``extra_arguments`` prepended.

    Returns:
        ``("ok", pid)``, ``("ok", pid, info)``, ``("ok", None)`` (the start returned ignore;
        ``"ignore"`` from a DynamicSupervisor), ``("error", ("already_started", pid))``,
        ``("error", "already_present")``, ``("error", (reason, spec))`` (start failed; for
        simple_one_for_one ``("error", reason)``), ``("error", "max_children")`` or
        ``("error", bad_spec_reason)``.

    Raises:
        otp.CallError: the supervisor is not alive (``"noproc"``) or died during the call.
    """
    return await otp.call(supervisor, StartChild(spec), timeout=None)


async def terminate_child(supervisor: Any, child: Any) -> Any:
    """Stop a child by id (or pid; by pid only for dynamic supervisors); its spec is kept
    (a temporary child's is dropped) and it is not restarted. A dynamic child whose restart is
    being retried is found by its old pid, and its retries stop.

    Returns ``"ok"`` (also if it was not running; for simple_one_for_one, also for a pid no
    longer alive), ``("error", "not_found")`` or ``("error", "simple_one_for_one")`` (an id
    given to a simple_one_for_one supervisor).
    """
    return await otp.call(supervisor, TerminateChild(child), timeout=None)


async def restart_child(supervisor: Any, child_id: Any) -> Any:
    """Start a stopped child again: ``("ok", pid)``, ``("ok", pid, info)``, ``("ok", None)``,
    ``("error", "running")``, ``("error", "restarting")``, ``("error", "not_found")``,
    ``("error", "simple_one_for_one")`` or ``("error", reason)`` if its start fails."""
    return await otp.call(supervisor, RestartChild(child_id), timeout=None)


async def delete_child(supervisor: Any, child_id: Any) -> Any:
    """Forget a stopped child's spec: ``"ok"``, ``("error", "running")``,
    ``("error", "restarting")``, ``("error", "not_found")`` or
    ``("error", "simple_one_for_one")``."""
    return await otp.call(supervisor, DeleteChild(child_id), timeout=None)


async def get_childspec(supervisor: Any, child: Any) -> Any:
    """``("ok", ChildSpec)`` for a child id (or pid), else ``("error", "not_found")``."""
    return await otp.call(supervisor, GetChildspec(child), timeout=None)


async def which_children(supervisor: Any) -> list[tuple[Any, Any, ChildType, tuple[str, ...]]]:
    """One ``(id, pid | "restarting" | None, type, modules)`` per child, newest first (OTP's
    order). ``None`` is OTP's ``undefined`` (not running); dynamic children have id None."""
    return await otp.call(supervisor, WhichChildren(), timeout=None)


async def count_children(supervisor: Any) -> dict[str, int]:
    """``{"specs": n, "active": n, "supervisors": n, "workers": n}`` (OTP's order); active
    counts children whose process is alive."""
    return await otp.call(supervisor, CountChildren(), timeout=None)


# -- the supervisor's answers -----------------------------------------------------------------


def handle_which_children(state: SupState) -> list[tuple[Any, Any, ChildType, tuple[str, ...]]]:
    if state.is_dynamic:
        undefined, pids, restarting = [], [], []
        for key, spec in state.dynamic.items():
            if key.__class__ is otp.Pid:
                pids.append((key, spec))
            elif key.__class__ is Restarting:
                restarting.append(spec)
            else:
                undefined.append(spec)
        pids.sort(key=lambda entry: entry[0])
        rows: list[tuple[Any, Any, ChildType, tuple[str, ...]]] = []
        rows.extend((None, None, s.type, s.modules) for s in undefined)
        rows.extend((None, pid, s.type, s.modules) for pid, s in pids)
        rows.extend((None, RESTARTING, s.type, s.modules) for s in restarting)
        return rows
    return [
        (
            c.spec.id,
            RESTARTING if c.restarting else c.pid,
            c.spec.type,
            c.spec.modules,
        )
        for c in reversed(state.children.values())
    ]


def handle_observe(state: SupState) -> SupervisorView:
    if state.is_dynamic:
        children = [
            ChildView(
                id=None,
                pid=key if key.__class__ is otp.Pid else dynamic_placeholder(key),
                type=spec.type,
                restart=spec.restart,
            )
            for key, spec in state.dynamic.items()
        ]
    else:
        children = [
            ChildView(
                id=c.spec.id,
                pid=RESTARTING if c.restarting else c.pid,
                type=c.spec.type,
                restart=c.spec.restart,
                restarts=state.child_restarts.get(c.spec.id, 0),
            )
            for c in state.children.values()
        ]
    flags = state.flags
    return SupervisorView(
        pid=otp.self(),
        name=state.name if not isinstance(state.name, otp.Pid) else None,
        strategy=flags.strategy if state.mode != "dynamic" else None,
        intensity=flags.intensity,
        period=flags.period,
        children=tuple(children),
        restarts_in_window=restarts_in_window(
            state.restarts, now_seconds(trio.current_time()), flags.period
        ),
        restarts_total=state.restarts_total,
        last_restart_at=state.last_restart_at,
        last_restart_reason=state.last_restart_reason,
    )


def handle_count_children(state: SupState) -> dict[str, int]:
    if state.mode == "simple":
        assert state.template is not None
        size = len(state.dynamic)
        active = size - state.dynamic_restarts
        is_sup = state.template.type is ChildType.SUPERVISOR
        return {
            "specs": 1,
            "active": active,
            "supervisors": size if is_sup else 0,
            "workers": 0 if is_sup else size,
        }
    if state.mode == "dynamic":
        specs = list(state.dynamic.values())
        active = sum(1 for key in state.dynamic if key.__class__ is otp.Pid)
    else:
        specs = [c.spec for c in state.children.values()]
        active = sum(
            1
            for c in state.children.values()
            if c.pid is not None and otp.process_info(c.pid) is not None
        )
    supervisors = sum(1 for s in specs if s.type is ChildType.SUPERVISOR)
    return {
        "specs": len(specs),
        "active": active,
        "supervisors": supervisors,
        "workers": len(specs) - supervisors,
    }


async def handle_start_child(state: SupState, raw: Any) -> Any:
    if state.mode == "simple":
        assert state.template is not None
        if not isinstance(raw, list | tuple):
            return ("error", ("bad_extra_args", raw))
        spec = state.template.with_args(raw)
        result = await call_start(spec)
        if result[0] == OK and result[1] is not None:
            state.dynamic[result[1]] = spec
        return result
    try:
        spec = ChildSpec.from_map(raw)
        if state.mode == "dynamic":
            check_dynamic_significant(spec)
        check_significant(spec, state.flags.auto_shutdown)
    except ChildSpecError as exc:
        return ("error", exc.reason)
    except TypeError:
        # A bad spec must be an error value: raising here would crash the supervisor.
        return ("error", ("invalid_child_spec", raw))
    if state.mode == "dynamic":
        if state.max_children is not None and len(state.dynamic) >= state.max_children:
            return ("error", "max_children")
        spec = spec.with_args(state.extra_arguments, prepend=True)
        result = await start_one(state, spec)
        if result[0] == OK:
            if result[1] is None:
                return "ignore"
            state.dynamic[result[1]] = spec
        return result
    existing = state.children.get(spec.id)
    if existing is not None:
        if existing.pid is not None:
            return ("error", ("already_started", existing.pid))
        return ("error", "already_present")
    result = await start_one(state, spec)
    if result[0] != OK:
        return ("error", (result[1], spec))
    if result[1] is None and spec.restart is Restart.TEMPORARY:
        return result
    child = Child(spec)
    state.children[spec.id] = child
    set_pid(state, child, result[1])
    return result


async def handle_terminate_child(state: SupState, key: Any) -> Any:
    if state.is_dynamic:
        if key.__class__ is not otp.Pid:
            return ("error", "simple_one_for_one" if state.mode == "simple" else "not_found")
        spec = state.dynamic.get(key)
        if spec is None:
            return _terminate_absent_dynamic(state, key)
        await shutdown(state.name, spec, key)
        state.dynamic.pop(key, None)
        return OK
    child = find_static(state, key)
    if child is None:
        return ("error", "not_found")
    await do_terminate(state, child)
    del_child(state, child)
    return OK


def _terminate_absent_dynamic(state: SupState, pid: otp.Pid) -> Any:
    """``terminate_child`` of a pid that is not a running dynamic child. If its restart is
    being retried (OTP's ``restarting(Pid)``), drop it: the queued retry then finds
    nothing. simple_one_for_one answers ok for a pid no longer alive (OTP 25's
    ``find_child``); DynamicSupervisor answers not_found (Elixir's)."""
    if state.dynamic_restarts:
        for key in state.dynamic:
            if key.__class__ is Restarting and key.old == pid:
                del state.dynamic[key]
                state.dynamic_restarts -= 1
                return OK
    if state.mode == "simple" and otp.process_info(pid) is None:
        return OK
    return ("error", "not_found")


async def handle_restart_child(state: SupState, key: Any) -> Any:
    if state.is_dynamic:
        return ("error", "simple_one_for_one")
    child = find_static(state, key)
    if child is None or key.__class__ is otp.Pid:
        return ("error", "not_found")
    if child.restarting:
        return ("error", RESTARTING)
    if child.pid is not None:
        return ("error", "running")
    result = await start_one(state, child.spec)
    if result[0] == OK:
        set_pid(state, child, result[1])
    return result


def handle_delete_child(state: SupState, key: Any) -> Any:
    if state.is_dynamic:
        return ("error", "simple_one_for_one")
    child = find_static(state, key)
    if child is None or key.__class__ is otp.Pid:
        return ("error", "not_found")
    if child.restarting:
        return ("error", RESTARTING)
    if child.pid is not None:
        return ("error", "running")
    remove(state, child)
    return OK


def handle_get_childspec(state: SupState, key: Any) -> Any:
    if state.is_dynamic:
        spec = state.dynamic.get(key) if key.__class__ is otp.Pid else None
        if spec is None:
            return ("error", "not_found")
        return (OK, state.template if state.template is not None else spec)
    child = find_static(state, key)
    if child is None:
        return ("error", "not_found")
    return (OK, child.spec)
