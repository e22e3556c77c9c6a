"""A supervisor's state: its child records and the few operations that keep them consistent.

Mirrors the child data section of ``supervisor.erl`` (OTP 25): the ``#state{}`` record, the
``#child{}`` records in start order, ``set_pid``/``del_child``/``find_child``, and the keys a
dynamic child has while its restart is retried (``restarting(Pid)``) or after it was ignored
(``undefined``). Everything here is data; the engine's modules carry out the decisions.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs

import otp

from ._spec import ChildSpec, Restart, SupFlags

__all__ = [
    "OK",
    "RESTARTING",
    "SHUTDOWN",
    "Child",
    "Restarting",
    "SupState",
    "Undefined",
    "del_child",
    "dynamic_placeholder",
    "find_static",
    "remove",
    "set_pid",
]

#: ``which_children`` shows this instead of a pid while a failed restart is being retried.
RESTARTING = "restarting"

#: What the restart engine answers: carry on, or stop the supervisor (intensity reached, or a
#: significant child ended under auto_shutdown).
OK = "ok"
SHUTDOWN = "shutdown"


@attrs.define(slots=True, eq=False)
class Child:
    """A static child: its spec, its pid (None: not running) and whether a restart is pending."""

    spec: ChildSpec
    pid: otp.Pid | None = None
    restarting: bool = False


class Restarting:
    """Key of a dynamic child whose restart failed and is being retried."""

    __slots__ = ("old",)

    def __init__(self, old: Any) -> None:
        self.old = old


class Undefined:
    """Key of a dynamic child whose restart returned ignore (OTP 25 keeps it as ``undefined``)."""

    __slots__ = ()


@attrs.define(slots=True, eq=False)
class SupState:
    name: Any
    flags: SupFlags
    mode: str  # "static", "simple" (simple_one_for_one) or "dynamic" (DynamicSupervisor)
    children: dict[Hashable, Child] = attrs.Factory(dict)
    pids: dict[otp.Pid, Hashable] = attrs.Factory(dict)
    template: ChildSpec | None = None
    dynamic: dict[Any, ChildSpec] = attrs.Factory(dict)
    dynamic_restarts: int = 0
    restarts: tuple[tuple[int, int], ...] = ()
    max_children: int | None = None
    extra_arguments: tuple[Any, ...] = ()
    #: For observers; kept on restart only, so they cost nothing otherwise.
    restarts_total: int = 0
    last_restart_at: float | None = None
    last_restart_reason: Any = None
    child_restarts: dict[Hashable, int] = attrs.Factory(dict)  # (observer-remote)

    @property
    def is_dynamic(self) -> bool:
        return self.mode != "static"


def set_pid(state: SupState, child: Child, pid: otp.Pid | None) -> None:
    if child.pid is not None:
        state.pids.pop(child.pid, None)
    child.pid = pid
    child.restarting = False
    if pid is not None:
        state.pids[pid] = child.spec.id


def remove(state: SupState, child: Child) -> None:
    if child.pid is not None:
        state.pids.pop(child.pid, None)
    state.children.pop(child.spec.id, None)


def del_child(state: SupState, child: Child) -> None:
    """OTP's ``del_child``: a temporary child's spec goes, any other's pid is cleared."""
    if child.spec.restart is Restart.TEMPORARY:
        remove(state, child)
    else:
        set_pid(state, child, None)


def find_static(state: SupState, key: Any) -> Child | None:
    """The static child with id ``key``, or with pid ``key``; None if there is none."""
    if key.__class__ is otp.Pid:
        child_id = state.pids.get(key)
        return state.children.get(child_id) if child_id is not None else None
    try:
        return state.children.get(key)
    except TypeError:
        return None


def dynamic_placeholder(key: Any) -> Any:
    """What stands for the pid of a dynamic child that has none (``restarting`` or None)."""
    return RESTARTING if key.__class__ is Restarting else None
