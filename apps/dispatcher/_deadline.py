"""A handler run under its timeout whose cancel scope is entered at its first wait: a handler
that only passes schedule points (``trio.lowlevel.checkpoint``, ``trio.sleep(0)``) and ends
before its deadline never pays for the scope, which costs more than such a handler itself.

What a timeout promises is unchanged: the deadline is checked whenever the handler is resumed
from a schedule point (where trio's run loop would have expired it), and the scope, with the
same absolute deadline, is in place before the handler parks (where trio delivers a
cancellation). Only ``trio.current_effective_deadline()`` read before the handler's first
wait does not yet include the timeout.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import trio


def _schedule_point_message() -> Any:
    # What trio.lowlevel.cancel_shielded_checkpoint yields to the run loop (trio resumes the
    # task at once, without parking it), taken from the coroutine itself rather than from
    # trio's private module.
    coro = trio.lowlevel.cancel_shielded_checkpoint()  # noqa: ASYNC105 -- stepped by hand
    try:
        return coro.send(None)
    finally:
        coro.close()


_SCHEDULE_POINT = _schedule_point_message()

#: What :func:`under_deadline` returns when the scope caught its deadline (the timeout wins
#: over anything the cancelled handler raised).
TIMED_OUT: Any = object()


@types.coroutine
def under_deadline(
    coro: Coroutine[Any, Any, Any], task: Any, deadline: float, now: Callable[[], float]
) -> Generator[Any, Any, Any]:
    """Run the handler's coroutine ``coro`` in ``task`` (the current one) with the deadline
    ``deadline`` on the clock ``now``; return its result, or :data:`TIMED_OUT`.

    Cancellation: as under ``with trio.CancelScope(deadline=deadline)`` around ``await coro``.
    """
    status = task._cancel_status
    value: Any = None
    while True:
        try:
            message = coro.send(value)
        except StopIteration as stop:
            return stop.value
        if message is not _SCHEDULE_POINT or task._cancel_status is not status:
            return (yield from _scoped(coro, task, status, deadline, message, None, None))
        try:
            value = yield message
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # (trio resumes a schedule point with send)
            return (yield from _scoped(coro, task, status, deadline, None, coro.throw, exc))
        if now() >= deadline:
            # Where trio's run loop would have expired the scope: it is entered cancelled.
            return (yield from _scoped(coro, task, status, deadline, None, coro.send, value))


def _scoped(
    coro: Any,
    task: Any,
    status: Any,
    deadline: float,
    message: Any,
    resume: Callable[[Any], Any] | None,
    argument: Any,
) -> Generator[Any, Any, Any]:
    """The rest of the handler's run under the cancel scope: from yielding ``message`` to the
    run loop or, given ``resume``, from ``resume(argument)`` (``coro.send`` or ``coro.throw``).
    """
    scope = trio.CancelScope(deadline=deadline)
    _enter(scope, task, status)
    try:
        if resume is not None:
            message = resume(argument)
        while True:
            try:
                value = yield message
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                message = coro.throw(exc)
            else:
                message = coro.send(value)
    except StopIteration as stop:
        result = stop.value
    except BaseException as exc:
        try:
            swallowed = scope.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:
            if scope.cancelled_caught:
                return TIMED_OUT  # what the scope did not take of a group goes with it
            raise
        if swallowed:
            return TIMED_OUT
        raise
    scope.__exit__(None, None, None)
    return result


def _enter(scope: trio.CancelScope, task: Any, status: Any) -> None:
    """Enter ``scope`` in ``task`` directly beneath ``status``, the cancel status the handler
    began in. If the handler has opened scopes (or nurseries) of its own since, the outermost
    of them moves beneath ``scope``, as if ``scope`` had been entered first."""
    inner = task._cancel_status
    if inner is status:
        scope.__enter__()
        return
    task._activate_cancel_status(status)
    try:
        scope.__enter__()
    finally:
        ours = task._cancel_status
        task._activate_cancel_status(inner)
    outermost = inner
    while outermost is not None and outermost.parent is not status:
        outermost = outermost.parent
    if outermost is not None:
        outermost.parent = ours


async def _plainly(
    coro: Coroutine[Any, Any, Any], task: Any, deadline: float, now: Callable[[], float]
) -> Any:
    scope = trio.CancelScope(deadline=deadline)
    try:
        with scope:
            return await coro
    except Exception:
        if scope.cancelled_caught:
            return TIMED_OUT  # what the scope did not take of a group goes with it
        raise
    return TIMED_OUT  # (the scope took the Cancelled its deadline raised)


#: Whether trio's tasks have the private fields a cancel scope is entered with late (a trio
#: without them has every handler's scope entered at its start).
TASK_FIELDS = all(
    hasattr(trio.lowlevel.Task, field) for field in ("_cancel_status", "_activate_cancel_status")
)
if not TASK_FIELDS:
    under_deadline = _plainly  # type: ignore[assignment]
