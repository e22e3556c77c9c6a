"""The supervision tree from the node's running applications down, plus each application's own
view (``supervisors.observe()``).

A supervisor answers for itself (a call, as ``which_children``); the walk asks each supervisor
child in turn, so a tree is a consistent picture of each supervisor, not of all at one instant.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

import otp

from ._application import running_applications
from ._observe import ApplicationView, Observe, SupervisorView
from ._spec import ChildType

#: How long the walk waits for one supervisor's answer (it may be busy restarting children).
DESCRIBE_TIMEOUT = 5.0


async def observe_supervisor(
    supervisor: Any, *, timeout: float = DESCRIBE_TIMEOUT
) -> SupervisorView | None:
    """The tree under ``supervisor`` (a pid or a registered name), or None if it is not a
    running supervisor that answers within ``timeout`` seconds.

    Children of type supervisor are looked into the same way; one that cannot be asked has
    ``supervisor=None`` in its :class:`ChildView`.
    """
    try:
        view = await otp.call(supervisor, Observe(), timeout=timeout)
    except (otp.CallError, otp.NoProc, otp.CallTimeout):
        return None
    if not isinstance(view, SupervisorView):
        return None
    children = []
    for child in view.children:
        if child.type is ChildType.SUPERVISOR and isinstance(child.pid, otp.Pid):
            child = attrs.evolve(
                child, supervisor=await observe_supervisor(child.pid, timeout=timeout)
            )
        children.append(child)
    return attrs.evolve(view, children=tuple(children))


async def observe(*, timeout: float = DESCRIBE_TIMEOUT) -> list[ApplicationView]:
    """Every running application, in start order: its supervision tree and its own view."""
    found = []
    for app, root in running_applications():
        found.append(
            ApplicationView(
                name=app.name,
                description=app.description,
                version=app.version,
                root=await observe_supervisor(root, timeout=timeout),
                view=await _application_view(app.observer_view),
            )
        )
    return found


async def _application_view(view: Callable[[], Any] | None) -> dict[str, Any] | None:
    if view is None:
        return None
    try:
        result = view()
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:
        # One application's broken view must not hide the others' (nor the tree).
        return {"error": f"{type(exc).__name__}: {exc}"}
    return dict(result)


async def check_readiness(expected: Iterable[str] = ()) -> dict[str, str]:
    """What is not ready, by application name: each of ``expected`` that is not running, and
    each running application whose ``ready`` check says what it waits for (or raised). Empty
    when everything is ready.

    A check runs in the caller's process, as an ``observer_view`` does.
    """
    running = running_applications()
    names = {app.name for app, _root in running}
    waiting = {name: "not started" for name in expected if name not in names}
    for app, _root in running:
        if app.ready is None:
            continue
        try:
            result = app.ready()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            waiting[app.name] = f"its readiness check raised {type(exc).__name__}: {exc}"
            continue
        if result is not None:
            waiting[app.name] = str(result)
    await trio.lowlevel.checkpoint()
    return waiting
