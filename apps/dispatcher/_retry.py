"""The retry policy: attempts of a call until one succeeds or a verdict makes its failure final.

Before each attempt the tool's circuit breaker admits it (or fails it fast) and the caller's
budget pays for it; after a failure a ``timeout`` or ``transient`` error is retried by the
tool's :class:`RetryPolicy` (a timeout only if the tool is idempotent), after a jittered delay
on trio's clock, if the tool's shared retry budget has a token and the caller's deadline leaves
room.
"""

from __future__ import annotations

import logging
import math
import random
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ._attempt import run_attempt
from ._breaker import BreakerState, CircuitBreaker
from ._errors import DispatchError, ErrorKind, fmt_seconds
from ._tool import RetryPolicy, Tool

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._idempotency import KeyedRun
    from ._state import _State


class Spending(Protocol):
    """What a run spends: a caller's :class:`Budget`, or :class:`_CallsOf` one."""

    @property
    def calls(self) -> int | None: ...

    @property
    def deadline(self) -> float | None: ...

    def exhausted(self, now: float) -> bool: ...

    def spend(self) -> None: ...

    def limit(self) -> float: ...


def _retry_delay(retry_after: Any, policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """The wait before ``attempt``: the handler's ``retry_after`` clamped to
    ``[0, max_retry_after]`` (a negative one, say a Retry-After date already past, means at
    once), or the policy's delay when the handler gave none or not a number (NaN)."""
    if (
        retry_after is None
        or not isinstance(retry_after, int | float)
        or isinstance(retry_after, bool)
        or math.isnan(retry_after)
    ):
        return policy.delay(attempt, rng)
    return min(max(0.0, float(retry_after)), policy.max_retry_after)


async def execute(
    state: _State,
    tool: Tool,
    args: Mapping[str, Any],
    timeout: float | None,
    budget: Spending | None,
    run: KeyedRun | None = None,
    spent: float = 0.0,
    now: float | None = None,
    failed: tuple[DispatchError, float | None] | None = None,
) -> Any:
    """Run ``tool`` with retries in the current task; return its result or raise the
    envelope of its last failure. ``run`` (a keyed call's) learns when an attempt begins;
    ``now``, if given, is the clock's reading for the first attempt. ``failed`` is the
    ``(error, retry_after)`` of a first attempt that already ran (dispatch's fast path):
    the call goes on from its retry verdict."""
    name = tool.name
    policy = tool.retry
    if timeout is None:
        timeout = tool.timeout
    limit = budget.limit() if budget is not None else math.inf
    breaker = state.breaker(tool)
    attempt = 0
    last: DispatchError | None = None
    while True:
        attempt += 1
        if failed is not None:
            error, retry_after = failed
            failed = None
        else:
            if now is None or attempt > 1:
                now = trio.current_time()
            probe = False
            if breaker is not None and breaker.state is not BreakerState.CLOSED:
                was = breaker.state
                admitted, probe = breaker.admit(now)
                if was is BreakerState.OPEN and breaker.state is BreakerState.HALF_OPEN:
                    state.event("breaker.half_open", logging.INFO, name)
                if not admitted:
                    state.event("breaker.reject", logging.DEBUG, name)
                    return await state.reject(_circuit_error(tool, breaker, now, attempt), name)
            if budget is not None:
                if budget.exhausted(now):
                    if breaker is not None:
                        breaker.release(probe)
                    return await state.reject(last or budget_error(tool, budget, attempt - 1), name)
                budget.spend()
            if run is not None:
                run.started = True
            result, outcome, retry_after = await run_attempt(
                state, tool, args, attempt, now, timeout, limit, breaker, probe, spent
            )
            spent = 0.0
            if outcome is None:
                return result
            error = outcome
        last = error
        verdict = _retry_verdict(tool, error, attempt, budget)
        if verdict is None:
            now = trio.current_time()
            delay = _retry_delay(retry_after, policy, attempt + 1, state.rng)
            if now + delay >= limit:
                verdict = "the caller's deadline would pass before the next attempt"
            elif not state.take_retry_token(tool, now):
                verdict = "the tool's shared retry budget is spent (too many retries lately)"
                state.event("dispatch.retry_denied", logging.WARNING, name, attempts=attempt)
            else:
                state.event(
                    "dispatch.retry",
                    logging.INFO,
                    name,
                    attempt=attempt + 1,
                    delay=delay,
                    kind=str(error.kind),
                )
                await trio.sleep(delay)
                continue
        error.message = f"{error.message}; not retried: {verdict}"
        error.args = (error.message,)
        state.event(f"dispatch.error.{error.kind}", logging.INFO, name, attempts=attempt)
        raise error


def _retry_verdict(
    tool: Tool, error: DispatchError, attempt: int, budget: Spending | None
) -> str | None:
    """Why ``error`` is final, or None if the call may be retried."""
    kind = error.kind
    if kind is ErrorKind.TIMEOUT and not tool.idempotent:
        return "the tool is not idempotent and the attempt may have committed"
    if not tool.retry.retryable(kind, tool.idempotent):
        return f"{kind} errors are not retried"
    if attempt >= tool.retry.max_attempts:
        return f"gave up after {attempt} attempt{'s' if attempt > 1 else ''}"
    if budget is not None and budget.calls is not None and budget.calls <= 0:
        return "the caller's budget has no tool calls left"
    return None


def _circuit_error(tool: Tool, breaker: CircuitBreaker, now: float, attempt: int) -> DispatchError:
    policy = breaker.policy
    if breaker.state is BreakerState.OPEN:
        wait = breaker.opened_at + policy.cooldown - now
        why = (
            f"its circuit breaker opened after {policy.failures} failures within"
            f" {fmt_seconds(policy.window)}; it lets a probe call through in {fmt_seconds(wait)}"
        )
    else:
        why = "its circuit breaker is half-open and its one probe call is running"
    return DispatchError.make(
        ErrorKind.CIRCUIT_OPEN,
        f"tool {tool.name!r} is failing fast: {why}; call again later",
        attempts=attempt - 1,
        data={"tool": tool.name, "breaker": str(breaker.state)},
    )


def budget_error(tool: Tool, budget: Spending, attempts: int) -> DispatchError:
    if budget.calls is not None and budget.calls <= 0:
        why = "it has no tool calls left"
    else:
        why = f"its deadline ({budget.deadline}) has passed"
    return DispatchError.make(
        ErrorKind.BUDGET_EXCEEDED,
        f"tool {tool.name!r} was not called: the caller's budget is spent ({why}); give"
        " the caller a larger budget or stop calling",
        attempts=attempts,
        data={"tool": tool.name, "calls": budget.calls, "deadline": budget.deadline},
    )
