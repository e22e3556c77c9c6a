"""One attempt: one run of a tool's handler under the concurrency limits (the tool's, then the
dispatcher's) and a cancel scope of the attempt's timeout, its verdict recorded on the tool's
circuit breaker. A sync handler runs in a worker thread that a timeout abandons (it cannot be
killed), holding its slots until it ends.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._breaker import CircuitBreaker
from ._deadline import TIMED_OUT, under_deadline
from ._errors import DispatchError, ErrorKind, TransientError, fmt_seconds
from ._tool import ASYNC, SYNC, Tool, _RemoteTimeout

if TYPE_CHECKING:
    from ._state import _State

logger = logging.getLogger("apps.dispatcher")
_DEBUG, _INFO, _WARNING = logging.DEBUG, logging.INFO, logging.WARNING

#: The failures a circuit breaker counts (the others say nothing about the tool's health).
_COUNTED = frozenset((ErrorKind.TIMEOUT, ErrorKind.TRANSIENT, ErrorKind.INTERNAL))


def in_doubt(tool: Tool) -> dict[str, bool]:
    """The envelope's ``in_doubt`` flag for a handler cancelled halfway: only a non-idempotent
    tool's outcome matters (an idempotent one can simply run again)."""
    return {} if tool.idempotent else {"in_doubt": True}


def doubt_note(tool: Tool) -> str:
    if tool.idempotent:
        return ""
    return "; its outcome is unknown (the tool is not idempotent and may have taken effect)"


async def _acquire(semaphore: trio.Semaphore) -> None:
    try:
        semaphore.acquire_nowait()
    except trio.WouldBlock:
        await semaphore.acquire()


@attrs.define(eq=False)
class _Slots:
    """The concurrency slots one attempt holds.

    A sync handler's thread cannot be killed: when a timeout abandons it, it keeps running and
    so keeps its slots, released from the thread when it ends. A thread that had not started
    when its attempt ended does not run the handler at all.
    """

    held: list[trio.Semaphore] = attrs.Factory(list)
    lock: threading.Lock = attrs.Factory(threading.Lock)
    token: trio.lowlevel.TrioToken | None = None
    running: bool = False
    ended: bool = False

    def release(self) -> None:
        for semaphore in self.held:
            semaphore.release()
        self.held.clear()

    def in_thread(self, handler: Callable[[], Any]) -> Callable[[], Any]:
        self.token = trio.lowlevel.current_trio_token()

        def run() -> Any:
            with self.lock:
                if self.ended:
                    return None  # the attempt ended before the thread started
                self.running = True
            try:
                return handler()
            finally:
                with self.lock:
                    self.running = False
                    release = self.ended
                if release:
                    try:
                        self.token.run_sync_soon(self.release)
                    except trio.RunFinishedError:
                        pass

        return run

    def let_go(self) -> None:
        """The attempt ends: release the slots, unless its thread still runs."""
        with self.lock:
            self.ended = True
            if self.running:
                return
        self.release()


async def run_attempt(
    state: _State,
    tool: Tool,
    args: Mapping[str, Any],
    attempt: int,
    now: float,
    timeout: float | None,
    limit: float,
    breaker: CircuitBreaker | None,
    probe: bool,
    spent: float = 0.0,
) -> tuple[Any, DispatchError | None, float | None]:
    """One run of the handler under the concurrency limits and a cancel scope:
    ``(result, error, retry_after)``. Records the verdict on the breaker."""
    name = tool.name
    counters = state.counters
    result: Any = None
    finished = False
    tool_limiter = None if tool.max_concurrency is None else state.tool_limiter(tool)
    limiter = state.limiter
    limited = tool_limiter is not None or limiter is not None
    slots = _Slots() if limited or tool.mode is SYNC else None
    try:
        if slots is not None and limited:
            # The tool's own slot first: a call queued behind its tool must not hold one of
            # the dispatcher's slots, which other tools need. The caller's deadline bounds
            # the wait.
            with trio.move_on_at(limit):
                for semaphore in (tool_limiter, limiter):
                    if semaphore is not None:
                        await _acquire(semaphore)
                        slots.held.append(semaphore)
            if len(slots.held) < (tool_limiter is not None) + (limiter is not None):
                if breaker is not None:
                    breaker.release(probe)
                finished = True
                return None, _slot_deadline_error(tool, attempt), None
            now = trio.current_time()
        deadline = now + timeout - spent if timeout is not None else math.inf
        until = deadline if deadline < limit else limit
        state.running += 1
        counters["dispatch.attempt"] += 1
        state.count_for(name, "dispatch.attempt")
        if logger.isEnabledFor(_DEBUG):
            state.log(_DEBUG, "dispatch.attempt", name, attempt=attempt)
        failure: Exception | None = None
        caught = False
        scope = None
        mode = tool.mode
        try:
            if mode is ASYNC:
                if until == math.inf:
                    result = await tool.handler(**args)
                else:
                    # Its cancel scope is entered at the handler's first wait (see _deadline).
                    result = await under_deadline(
                        tool.handler(**args), trio.lowlevel.current_task(), until, state.now
                    )
                    if result is TIMED_OUT:
                        caught, result = True, None
            else:
                scope = trio.CancelScope(deadline=until)
                with scope:
                    if slots is not None and mode is SYNC:
                        result = await trio.to_thread.run_sync(
                            slots.in_thread(functools.partial(tool.handler, **args)),
                            abandon_on_cancel=True,
                        )
                    else:
                        result = await tool.handler.invoke(tool, args)
        except Exception as exc:
            failure = exc
        finally:
            state.running -= 1
        finished = True
    finally:
        if slots is not None:
            slots.let_go()
        if not finished and breaker is not None:
            breaker.release(probe)  # cancelled from outside: no verdict on the tool
    if scope is not None:
        caught = scope.cancelled_caught
    if failure is None and not caught:
        counters["dispatch.ok"] += 1
        state.count_for(name, "dispatch.ok")
        if logger.isEnabledFor(_DEBUG):
            state.log(_DEBUG, "dispatch.ok", name, attempts=attempt)
        if breaker is not None and probe and breaker.success(probe):
            state.event("breaker.close", _INFO, name)
        return result, None, None
    failure = None if caught else failure
    error, retry_after = attempt_failed(
        state, tool, attempt, failure, deadline <= limit, timeout, breaker, probe
    )
    return None, error, retry_after


def attempt_failed(
    state: _State,
    tool: Tool,
    attempt: int,
    failure: Exception | None,
    timed_out: bool,
    timeout: float | None,
    breaker: CircuitBreaker | None,
    probe: bool,
) -> tuple[DispatchError, float | None]:
    """The verdict on an attempt that raised ``failure``, or (None) whose cancel scope caught
    its deadline (which wins over anything the cancelled handler raised): ``timed_out`` if
    that was the attempt's own timeout, else the caller's budget deadline. Returns
    ``(error, retry_after)``; records the verdict on the breaker."""
    name = tool.name
    retry_after: float | None = None
    if failure is None:
        if timed_out:
            state.event("dispatch.timeout", _WARNING, name, attempt=attempt, timeout=timeout)
            error = _timeout_error(tool, attempt, timeout)
        else:
            error = _deadline_error(tool, attempt)
    elif isinstance(failure, TransientError):
        error = DispatchError.make(
            ErrorKind.TRANSIENT,
            f"tool {name!r} failed transiently on attempt {attempt}: {failure}",
            attempts=attempt,
            data={"tool": name, **failure.data},
        )
        error.__cause__ = failure
        retry_after = failure.retry_after
    elif isinstance(failure, _RemoteTimeout):
        error = _timeout_error(tool, attempt, timeout, remote=str(failure))
        error.__cause__ = failure
    else:
        error = DispatchError.make(
            ErrorKind.INTERNAL,
            f"tool {name!r} raised {type(failure).__name__}: {failure} (a bug in the handler"
            " or an unexpected failure; the cause is chained; a handler raises"
            " apps.dispatcher.TransientError for failures worth retrying)",
            attempts=attempt,
            data={"tool": name, "exception": type(failure).__name__},
        )
        error.__cause__ = failure
    if breaker is not None:
        if error.kind in _COUNTED:
            if breaker.failure(trio.current_time(), probe):
                state.event("breaker.open", _WARNING, name, cooldown=breaker.policy.cooldown)
        else:
            breaker.release(probe)
    return error, retry_after


def _timeout_error(
    tool: Tool, attempt: int, timeout: float | None, remote: str | None = None
) -> DispatchError:
    where = f" where it ran ({remote})" if remote else f" within {fmt_seconds(timeout or 0.0)}"
    return DispatchError.make(
        ErrorKind.TIMEOUT,
        f"tool {tool.name!r} did not answer{where} on attempt {attempt} and was cancelled"
        f"{doubt_note(tool)} (raise Tool.timeout or pass dispatch(timeout=...) if it is just"
        " slow)",
        attempts=attempt,
        data={"tool": tool.name, "timeout": timeout, **in_doubt(tool)},
    )


def _slot_deadline_error(tool: Tool, attempt: int) -> DispatchError:
    return DispatchError.make(
        ErrorKind.BUDGET_EXCEEDED,
        f"tool {tool.name!r} was not run (attempt {attempt}): the caller's budget deadline"
        " passed while the call waited for a concurrency slot (the dispatcher's or the"
        " tool's max_concurrency); give the caller more time or allow more concurrency",
        attempts=attempt - 1,
        data={"tool": tool.name},
    )


def _deadline_error(tool: Tool, attempt: int) -> DispatchError:
    return DispatchError.make(
        ErrorKind.BUDGET_EXCEEDED,
        f"tool {tool.name!r} was cancelled on attempt {attempt}: the caller's budget"
        f" deadline passed while it ran{doubt_note(tool)}; give the caller more time",
        attempts=attempt,
        data={"tool": tool.name, **in_doubt(tool)},
    )
