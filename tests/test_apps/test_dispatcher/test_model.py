"""A Hypothesis model of the dispatcher: random calls (scripted failures, idempotency keys),
and clock advances, played on the real runtime (one ``otp.run`` on a MockClock per example)
against a pure model of attempts, retries, the retry bucket, the cache and the breakers.

Every duration is a multiple of 1/32 s, so the real clock and the model agree exactly.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otp
from apps import dispatcher as d

from .helpers import Script

TIMEOUT, TTL, WINDOW, COOLDOWN, FAILURES = 1.0, 16.0, 8.0, 4.0, 3
RETRY = d.RetryPolicy(
    max_attempts=3,
    first_delay=0.125,
    multiplier=4.0,
    jitter=0.0,
    budget=d.RetryBudget(capacity=2.0, refill_per_second=0.25),
)
BREAKER = d.BreakerPolicy(failures=FAILURES, window=WINDOW, cooldown=COOLDOWN)
IDEMPOTENT = {"t": True, "n": False}


@attrs.frozen
class CallStep:
    tool: str
    key: str | None
    arg: int
    script: tuple[str, ...]


@attrs.frozen
class Advance:
    seconds: float


steps = st.lists(
    st.one_of(
        st.builds(
            CallStep,
            tool=st.sampled_from(["t", "n"]),
            key=st.sampled_from([None, None, "k1", "k2"]),
            arg=st.integers(0, 1),
            script=st.lists(
                st.sampled_from(["ok", "transient", "timeout", "internal"]), max_size=3
            ).map(tuple),
        ),
        st.builds(Advance, st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0, 16.0])),
    ),
    max_size=25,
)


@attrs.define
class Breaker:
    state: str = "closed"
    failures: list[float] = attrs.Factory(list)
    opened_at: float = 0.0


@attrs.define
class Model:
    """What the dispatcher should do, computed without it."""

    now: float = 0.0
    runs: dict[str, int] = attrs.Factory(lambda: {"t": 0, "n": 0})
    attempts: int = 0
    #: key -> (fingerprint, the kept outcome, when it was kept)
    cache: dict[str, tuple[tuple[str, int], tuple[str, Any], float]] = attrs.Factory(dict)
    breakers: dict[str, Breaker] = attrs.Factory(lambda: {"t": Breaker(), "n": Breaker()})
    buckets: dict[str, tuple[float, float]] = attrs.Factory(dict)

    def call(self, step: CallStep) -> tuple[str, Any]:
        fingerprint = (step.tool, step.arg)
        if step.key is not None:
            cached = self.cache.get(step.key)
            if cached is not None and self.now < cached[2] + TTL:
                return cached[1] if cached[0] == fingerprint else ("conflict", None)
        outcome, attempts = self.run(step)
        # A success is kept for every tool; a non-idempotent tool's failure once it has run.
        kept = outcome[0] == "ok" or (not IDEMPOTENT[step.tool] and attempts > 0)
        if step.key is not None and kept:
            self.cache[step.key] = (fingerprint, outcome, self.now)
        return outcome

    def run(self, step: CallStep) -> tuple[tuple[str, Any], int]:
        """The outcome of running the call, and how many attempts ran the handler."""
        script = list(step.script)
        breaker = self.breakers[step.tool]
        attempt = 0
        while True:
            attempt += 1
            probe = False
            if breaker.state == "open":
                if self.now < breaker.opened_at + COOLDOWN:
                    return ("circuit_open", None), attempt - 1
                breaker.state, probe = "half_open", True
            self.runs[step.tool] += 1
            self.attempts += 1
            outcome = script.pop(0) if script else "ok"
            if outcome == "ok":
                if probe:
                    breaker.state, breaker.failures = "closed", []
                return ("ok", {"run": self.runs[step.tool], "args": {"x": step.arg}}), attempt
            if outcome == "timeout":
                self.now += TIMEOUT
            if probe:
                breaker.state, breaker.opened_at, breaker.failures = "open", self.now, []
            else:
                breaker.failures = [t for t in breaker.failures if t > self.now - WINDOW]
                breaker.failures.append(self.now)
                if len(breaker.failures) >= FAILURES:
                    breaker.state, breaker.opened_at, breaker.failures = "open", self.now, []
            retryable = outcome == "transient" or (outcome == "timeout" and IDEMPOTENT[step.tool])
            if not retryable or attempt >= RETRY.max_attempts:
                return (outcome, None), attempt
            tokens, stamp = self.buckets.get(step.tool, (2.0, self.now))
            tokens = min(2.0, tokens + (self.now - stamp) * 0.25)
            if tokens < 1.0:
                self.buckets[step.tool] = (tokens, self.now)
                return (outcome, None), attempt
            self.buckets[step.tool] = (tokens - 1.0, self.now)
            self.now += RETRY.delay(attempt + 1)

    def breaker_state(self, tool: str) -> str:
        breaker = self.breakers[tool]
        if breaker.state == "open" and self.now >= breaker.opened_at + COOLDOWN:
            return "half_open"
        return breaker.state


async def play(plan: list[CallStep | Advance]) -> None:
    scripts = {name: Script() for name in IDEMPOTENT}
    tools = [
        d.Tool(
            name,
            scripts[name],
            timeout=TIMEOUT,
            idempotent=IDEMPOTENT[name],
            retry=RETRY,
            breaker=BREAKER,
        )
        for name in IDEMPOTENT
    ]
    await d.start_dispatcher(tools, d.DispatcherConfig(result_ttl=TTL))
    model = Model()
    for step in plan:
        if isinstance(step, Advance):
            await trio.sleep(step.seconds)
            model.now += step.seconds
            continue
        scripts[step.tool].steps = list(step.script)
        expected = model.call(step)
        try:
            got: tuple[str, Any] = (
                "ok",
                await d.dispatch(step.tool, {"x": step.arg}, idempotency_key=step.key),
            )
        except d.DispatchError as error:
            got = (str(error.kind), None)
        assert got == expected, step
        assert trio.current_time() == model.now, step
        stats = d.statistics()
        for name in IDEMPOTENT:
            assert scripts[name].runs == model.runs[name]
            assert stats.breakers.get(name, "closed") == model.breaker_state(name), step
        assert stats.counters["dispatch.attempt"] == model.attempts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_the_dispatcher_follows_the_model(plan: list[CallStep | Advance]) -> None:
    otp.run(play, plan, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_model_sees_a_breaker_open_and_close() -> None:
    plan: list[CallStep | Advance] = [
        CallStep("n", None, 0, ("internal",)),
        CallStep("n", None, 0, ("internal",)),
        CallStep("n", "k1", 0, ("internal",)),
        CallStep("n", "k1", 0, ()),
        Advance(4.0),
        CallStep("n", "k1", 1, ()),
        CallStep("n", "k1", 0, ()),
        CallStep("t", None, 1, ("timeout", "transient", "ok")),
    ]
    otp.run(play, plan, clock=trio.testing.MockClock(autojump_threshold=0))
