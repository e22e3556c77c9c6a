"""The per-tool circuit breaker, the shared retry token bucket and a caller's ``Budget``.

Breaker and bucket are plain state machines that take the time as an argument (trio's clock,
passed in by the dispatcher), so they are tested as pure data and the dispatcher's synchronous
sections keep them consistent (all processes of a node share one trio thread).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from typing import Any

import attrs
import trio

from ._errors import ConfigurationError
from ._tool import BreakerPolicy, RetryBudget


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@attrs.define(eq=False)
class CircuitBreaker:
    """One tool's breaker (see :class:`BreakerPolicy`). ``admit`` before an attempt, then exactly
    one of ``success``, ``failure`` or ``release`` (the attempt ended without a verdict: it was
    cancelled, or failed in a way that does not count) after it."""

    policy: BreakerPolicy
    state: BreakerState = BreakerState.CLOSED
    failures: deque[float] = attrs.Factory(deque)
    opened_at: float = 0.0
    probing: bool = False

    def admit(self, now: float) -> tuple[bool, bool]:
        """``(admitted, is_probe)``. An open breaker becomes half-open once its cooldown has
        passed, and then admits exactly one probe at a time."""
        if self.state is BreakerState.CLOSED:
            return True, False
        if self.state is BreakerState.OPEN:
            if now < self.opened_at + self.policy.cooldown:
                return False, False
            self.state = BreakerState.HALF_OPEN
        if self.probing:
            return False, False
        self.probing = True
        return True, True

    def success(self, probe: bool) -> bool:
        """Record a successful attempt; True if it closed the breaker."""
        if probe:
            self.probing = False
            if self.state is BreakerState.HALF_OPEN:
                self.state = BreakerState.CLOSED
                self.failures.clear()
                return True
        return False

    def failure(self, now: float, probe: bool) -> bool:
        """Record a failed attempt; True if it opened the breaker."""
        if probe:
            self.probing = False
            if self.state is BreakerState.HALF_OPEN:
                self._open(now)
                return True
            return False
        if self.state is not BreakerState.CLOSED:
            return False  # an attempt admitted before the breaker opened
        failures = self.failures
        failures.append(now)
        horizon = now - self.policy.window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if len(failures) >= self.policy.failures:
            self._open(now)
            return True
        return False

    def release(self, probe: bool) -> None:
        """The attempt ended without a verdict: a probe's slot is free again."""
        if probe:
            self.probing = False

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = now
        self.failures.clear()

    def current(self, now: float) -> BreakerState:
        """The state as a caller would see it now (open turns half-open after the cooldown)."""
        if self.state is BreakerState.OPEN and now >= self.opened_at + self.policy.cooldown:
            return BreakerState.HALF_OPEN
        return self.state


@attrs.define(eq=False)
class TokenBucket:
    """The shared retry budget of one tool (see :class:`RetryBudget`), refilled lazily."""

    policy: RetryBudget
    tokens: float
    stamp: float

    @classmethod
    def full(cls, policy: RetryBudget, now: float) -> TokenBucket:
        return cls(policy, policy.capacity, now)

    def take(self, now: float) -> bool:
        """Take one token if there is one."""
        policy = self.policy
        self.tokens = min(
            policy.capacity, self.tokens + (now - self.stamp) * policy.refill_per_second
        )
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def _check_calls(_budget: Any, _attr: Any, value: Any) -> None:
    if value is not None and (value.__class__ is not int or value < 0):
        raise ConfigurationError(f"Budget.calls must be an int >= 0 or None (got {value!r})")


def _check_deadline(_budget: Any, _attr: Any, value: Any) -> None:
    if value is not None and (
        not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value)
    ):
        raise ConfigurationError(
            f"Budget.deadline must be a time on trio's clock (a number) or None (got {value!r})"
        )


@attrs.define(eq=False)
class Budget:
    """What a caller may still spend: ``calls`` handler runs (attempts, retries included) and a
    ``deadline`` on trio's clock (``trio.current_time()`` units). None means no limit.

    A budget is mutable and may be shared: pass the same one to many ``dispatch`` calls (or to
    ``gather_bounded``) and they all spend it. A call whose budget is spent before its first
    attempt fails at once with ``budget_exceeded``; one that runs out while retrying returns
    its last failure.
    """

    calls: int | None = attrs.field(default=None, validator=_check_calls)
    deadline: float | None = attrs.field(default=None, validator=_check_deadline)

    @classmethod
    def within(cls, seconds: float, *, calls: int | None = None) -> Budget:
        """A budget whose deadline is ``seconds`` from now on trio's clock."""
        return cls(calls=calls, deadline=trio.current_time() + seconds)

    def exhausted(self, now: float) -> bool:
        return (self.calls is not None and self.calls <= 0) or (
            self.deadline is not None and now >= self.deadline
        )

    def spend(self) -> None:
        if self.calls is not None:
            self.calls -= 1

    def limit(self) -> float:
        return math.inf if self.deadline is None else self.deadline
