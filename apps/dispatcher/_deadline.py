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
    scope: trio.CancelScope | None = None
    value: Any = None
    error: BaseException | None = None
    try:
        while True:
            if error is None:
                message = coro.send(value)
            else:
                message, error = coro.throw(error), None
            if scope is None and (
                message is not _SCHEDULE_POINT or task._cancel_status is not status
            ):
                scope = _entered(deadline, task, status)
            try:
                value = yield message
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # (trio throws in only after a foreign yield)
                value, error = None, exc
                if scope is None:
                    scope = _entered(deadline, task, status)
            else:
                if scope is None and now() >= deadline:
                    # Where trio's run loop would have expired it: the scope is entered
                    # cancelled, before the handler goes on.
                    scope = _entered(deadline, task, status)
    except StopIteration as stop:
        result = stop.value
    except BaseException as exc:
        if scope is None:
            raise
        try:
            swallowed = scope.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:
            if scope.cancelled_caught:
                return TIMED_OUT  # what the scope did not take of a group goes with it
            raise
        if swallowed:
            return TIMED_OUT
        raise
    if scope is not None:
        scope.__exit__(None, None, None)
    return result


def _entered(deadline: float, task: Any, status: Any) -> trio.CancelScope:
    """A scope of ``deadline`` entered in ``task`` directly beneath ``status``, the cancel
    status the handler began in. If the handler has opened scopes (or nurseries) of its own
    since, the outermost of them moves beneath it, as if it had been entered first."""
    scope = trio.CancelScope(deadline=deadline)
    inner = task._cancel_status
    if inner is status:
        scope.__enter__()
        return scope
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
    return scope


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


#: The trio releases whose cancel-status tree the late scope was tested against (its
#: ``CancelStatus`` parent links have not changed since 0.12; a release after these gets the
#: plain scope until it is tested: slower, never wrong).
TESTED_TRIO = ((0, 25), (0, 35))


def late_scopes_supported(version: str, task_type: type) -> bool:
    """Whether trio ``version`` (``trio.__version__``), whose tasks are ``task_type``, may
    have a cancel scope entered late: a tested release with the private fields it needs."""
    try:
        release = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:  # (a development build: "0.36.0+dev" parses; "main" does not)
        return False
    low, high = TESTED_TRIO
    return low <= release <= high and all(
        hasattr(task_type, field) for field in ("_cancel_status", "_activate_cancel_status")
    )


#: Whether handlers' scopes are entered late here (else each at its handler's start).
TASK_FIELDS = late_scopes_supported(trio.__version__, trio.lowlevel.Task)
if not TASK_FIELDS:
    under_deadline = _plainly  # type: ignore[assignment]
