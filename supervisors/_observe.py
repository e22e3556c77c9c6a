"""What an observer sees of supervisors and applications: the records a supervisor answers
with (each one's flags, children and restart history) and an application's view."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs

import otp

from ._spec import ChildType, Restart, Strategy


@attrs.frozen
class Observe:
    """The request a supervisor answers with its :class:`SupervisorView`."""


@attrs.frozen
class ChildView:
    """One child of a supervisor.

    Attributes:
        id: The child spec's id (None for the children of a simple_one_for_one supervisor or a
            DynamicSupervisor).
        pid: Its pid; None if it is not running; ``supervisors.RESTARTING`` while a failed
            restart is being retried.
        type: Worker or supervisor.
        restart: Permanent, transient or temporary.
        supervisor: The child's own view when it is a running supervisor the walk could ask;
            None otherwise.
        restarts: Restarts its exits caused since the supervisor started (static children).
    """

    id: Hashable
    pid: otp.Pid | str | None
    type: ChildType
    restart: Restart
    supervisor: SupervisorView | None = None
    restarts: int = 0


@attrs.frozen
class SupervisorView:
    """One supervisor at the moment it answered.

    Attributes:
        pid: The supervisor.
        name: Its registered name, or None.
        strategy: Its restart strategy (None for a DynamicSupervisor, which has none to set).
        intensity, period: At most ``intensity`` restarts in ``period`` seconds.
        children: Its children in start order.
        restarts_in_window: Restarts that count against the intensity now.
        restarts_total: Restarts since it started (each failed restart retried counts again).
        last_restart_at: When the latest restart happened, on trio's clock (None: none yet).
        last_restart_reason: The exit reason of the child whose exit caused it.
    """

    pid: otp.Pid
    name: Any
    strategy: Strategy | None
    intensity: int
    period: int
    children: tuple[ChildView, ...]
    restarts_in_window: int
    restarts_total: int
    last_restart_at: float | None
    last_restart_reason: Any


@attrs.frozen
class ApplicationView:
    """One running application.

    Attributes:
        name, description, version: As its :class:`~supervisors.Application` says.
        root: Its supervision tree (None if its root could not be asked).
        view: What its ``observer_view`` returned (None without one); if that raised, a dict
            ``{"error": "..."}`` naming the error.
    """

    name: str
    description: str
    version: str
    root: SupervisorView | None
    view: dict[str, Any] | None
