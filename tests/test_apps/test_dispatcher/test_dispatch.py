"""dispatch: timeouts, classified retries, budgets and the error envelope, on trio's MockClock."""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing

import otp
from apps import dispatcher as d

from .helpers import ADD_SCHEMA, Script, add, running


async def test_a_call_returns_the_handlers_result(autojump_clock: trio.abc.Clock) -> None:
    async with running(d.Tool("add", add, ADD_SCHEMA, idempotent=True)):
        assert await d.dispatch("add", {"a": 2, "b": 3}) == 5
        assert d.statistics().counters["dispatch.ok"] == 1


async def test_a_timeout_cancels_the_handler_and_is_typed(autojump_clock: trio.abc.Clock) -> None:
    slow = Script(["timeout"])
    async with running(d.Tool("slow", slow, timeout=1.5, idempotent=False)):
        with pytest.raises(d.DispatchTimeout) as caught:
            await d.dispatch("slow")
        error = caught.value
        assert isinstance(error, TimeoutError)
        assert error.kind == d.ErrorKind.TIMEOUT
        assert error.attempts == 1
        assert error.jsonrpc_code == -32000
        assert "did not answer within 1.5 s on attempt 1" in error.message
        assert slow.cancelled == 1
        assert trio.current_time() == 1.5


async def _scenario(name: str, clock: trio.testing.MockClock) -> Any:
    """A handler's run, as :func:`test_a_late_scope_ends_a_handler_as_an_early_one_would`
    plays it under a deadline 1 s away."""
    if name == "at_once":
        return "value"
    if name == "schedule_points":
        await trio.lowlevel.checkpoint()
        await trio.sleep(0)
        return "value"
    if name == "busy_past_the_deadline":
        clock.jump(2.0)
        await trio.lowlevel.checkpoint()
        return "value"
    if name == "waits_past_the_deadline":
        await trio.lowlevel.checkpoint()
        await trio.sleep(2.0)
    if name == "own_scope_then_waits":
        with trio.CancelScope(deadline=trio.current_time() + 100):
            await trio.sleep(2.0)
    if name == "own_shorter_scope":
        with trio.move_on_after(0.5):
            await trio.sleep(2.0)
        return "value"
    if name == "raises":
        await trio.lowlevel.checkpoint()
        raise ValueError("bad state")
    if name == "group_with_the_cancellation":
        try:
            await trio.sleep(2.0)
        except trio.Cancelled as cancelled:
            raise BaseExceptionGroup("cleanup", [cancelled, ValueError("x")]) from None
    if name == "swallows_the_cancellation":
        try:
            await trio.sleep(2.0)
        except trio.Cancelled:
            return "swallowed"
    return "not reached"


@pytest.mark.parametrize(
    "name",
    [
        "at_once",
        "schedule_points",
        "busy_past_the_deadline",
        "waits_past_the_deadline",
        "own_scope_then_waits",
        "own_shorter_scope",
        "raises",
        "group_with_the_cancellation",
        "swallows_the_cancellation",
    ],
)
async def test_a_late_scope_ends_a_handler_as_an_early_one_would(
    autojump_clock: trio.testing.MockClock, name: str
) -> None:
    from apps.dispatcher import _deadline

    outcomes = []
    for driver in (_deadline.under_deadline, _deadline._plainly):
        began = trio.current_time()
        task = trio.lowlevel.current_task()
        try:
            value = await driver(
                _scenario(name, autojump_clock), task, began + 1.0, trio.current_time
            )
            outcome: Any = "timed out" if value is _deadline.TIMED_OUT else value
        except ValueError as exc:
            outcome = exc.args
        outcomes.append((outcome, trio.current_time() - began))
        assert trio.current_effective_deadline() == math.inf
    assert outcomes[0] == outcomes[1]


def test_a_late_scope_is_used_only_on_a_tested_trio_with_the_fields_it_needs() -> None:
    from apps.dispatcher import _deadline

    task = trio.lowlevel.Task
    assert _deadline.late_scopes_supported(trio.__version__, task) is _deadline.TASK_FIELDS
    assert _deadline.late_scopes_supported("0.35.0", task)
    assert _deadline.late_scopes_supported("0.25.1", task)
    assert not _deadline.late_scopes_supported("0.24.0", task)  # older than tested
    assert not _deadline.late_scopes_supported("0.36.0", task)  # newer: the plain scope
    assert not _deadline.late_scopes_supported("1.0.0", task)
    assert not _deadline.late_scopes_supported("main", task)
    assert not _deadline.late_scopes_supported("0.35.0", object)  # no private fields


@pytest.mark.parametrize("key", [None, "k1"])  # keyed: the attempt runs in the runner
async def test_a_timeout_passed_during_a_schedule_point_cancels_the_handler(
    autojump_clock: trio.testing.MockClock, key: str | None
) -> None:
    # The handler never parks: its cancel scope is entered when it is resumed past the deadline.
    steps: list[str] = []

    async def busy(**_args: Any) -> None:
        autojump_clock.jump(2.0)
        await trio.lowlevel.checkpoint()
        steps.append("past the deadline")

    async with running(d.Tool("busy", busy, timeout=1.0, idempotent=False)):
        outside = trio.current_effective_deadline()
        with pytest.raises(d.DispatchTimeout, match="did not answer within 1 s"):
            await d.dispatch("busy", idempotency_key=key)
        assert steps == []
        assert trio.current_effective_deadline() == outside  # no scope left behind


async def test_a_timeout_reaches_a_handler_that_waits_after_schedule_points(
    autojump_clock: trio.abc.Clock,
) -> None:
    deadlines: list[float] = []

    async def later(**_args: Any) -> None:
        await trio.lowlevel.checkpoint()
        await trio.sleep(0)
        deadlines.append(trio.current_effective_deadline())  # nothing has waited yet
        await trio.sleep(0.5)
        deadlines.append(trio.current_effective_deadline())
        await trio.sleep(10)

    async with running(d.Tool("later", later, timeout=1.5, idempotent=False)):
        outside = trio.current_effective_deadline()
        with pytest.raises(d.DispatchTimeout):
            await d.dispatch("later")
        assert trio.current_time() == 1.5
        assert deadlines == [outside, min(outside, 1.5)]
        assert d.statistics().counters["dispatch.timeout"] == 1


@pytest.mark.parametrize("key", [None, "k1"])
@pytest.mark.parametrize("opens", ["scope", "nursery"])
async def test_a_timeout_reaches_a_handler_that_opened_its_own_scope_first(
    autojump_clock: trio.abc.Clock, opens: str, key: str | None
) -> None:
    seen: list[float] = []
    children_cancelled: list[bool] = []

    async def child() -> None:
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            children_cancelled.append(True)
            raise

    async def nested(**_args: Any) -> None:
        if opens == "scope":
            with trio.CancelScope(deadline=100.0):
                await trio.sleep(0.5)
                seen.append(trio.current_effective_deadline())
                await trio.sleep(10)
        else:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child)
                await trio.sleep(0.5)
                seen.append(trio.current_effective_deadline())

    async with running(d.Tool("nested", nested, timeout=1.0, idempotent=False)):
        outside = trio.current_effective_deadline()
        with pytest.raises(d.DispatchTimeout):
            await d.dispatch("nested", idempotency_key=key)
        assert trio.current_time() == 1.0
        assert seen == [min(outside, 1.0)]
        assert children_cancelled == ([True] if opens == "nursery" else [])
        assert trio.current_effective_deadline() == outside


async def test_a_handlers_timeout_reaches_the_tool_it_dispatches_first(
    autojump_clock: trio.abc.Clock,
) -> None:
    # Both scopes are entered at the inner handler's first wait: the outer one beneath.
    inner = Script(["timeout"])

    async def outer(**_args: Any) -> Any:
        return await d.dispatch("inner", timeout=5.0)

    tools = [
        d.Tool("outer", outer, timeout=1.0, idempotent=False),
        d.Tool("inner", inner, idempotent=False),
    ]
    async with running(*tools):
        outside = trio.current_effective_deadline()
        with pytest.raises(d.DispatchTimeout, match="'outer' did not answer within 1 s"):
            await d.dispatch("outer")
        assert trio.current_time() == 1.0
        assert inner.cancelled == 1
        assert trio.current_effective_deadline() == outside
        assert d.statistics().counters["dispatch.timeout"] == 1  # the outer call's only


async def test_a_handlers_own_shorter_scope_ends_first(autojump_clock: trio.abc.Clock) -> None:
    async def patient(**_args: Any) -> str:
        with trio.move_on_after(0.5):
            await trio.sleep(10)
        await trio.sleep(0.25)
        return "gave up waiting"

    async with running(d.Tool("patient", patient, timeout=1.0, idempotent=False)):
        assert await d.dispatch("patient") == "gave up waiting"
        assert trio.current_time() == 0.75


async def test_a_caller_cancelled_while_its_handler_waits_is_cancelled_not_timed_out(
    autojump_clock: trio.abc.Clock,
) -> None:
    endless = Script(["timeout"])
    async with running(d.Tool("endless", endless, timeout=5.0, idempotent=True)):
        with trio.move_on_after(2.0) as scope:
            await d.dispatch("endless")
        assert scope.cancelled_caught
        assert endless.cancelled == 1
        assert "dispatch.timeout" not in d.statistics().counters


async def test_timeouts_in_milliseconds_as_the_seed_writes_them(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script(["timeout", "timeout"])
    tool = d.Tool("slow", slow, timeout_ms=1500, idempotent=False)
    assert tool.timeout == 1.5
    async with running(tool):
        with pytest.raises(d.DispatchTimeout, match=r"within 1\.5 s"):
            await d.dispatch("slow")
        with pytest.raises(d.DispatchTimeout, match=r"within 0\.25 s"):
            await d.dispatch("slow", timeout_ms=250)
        assert trio.current_time() == 1.75
        with pytest.raises(d.InvalidOption, match="timeout_ms, not both"):
            await d.dispatch("slow", timeout=1.0, timeout_ms=250)
        with pytest.raises(d.InvalidOption, match="timeout_ms must be a number"):
            await d.dispatch("slow", timeout_ms=0)
    with pytest.raises(d.ConfigurationError, match="timeout_ms, not both"):
        d.Tool("slow", slow, timeout=1.0, timeout_ms=250, idempotent=False)


async def test_the_per_call_timeout_overrides_the_tools(autojump_clock: trio.abc.Clock) -> None:
    slow = Script([5.0])
    async with running(d.Tool("slow", slow, timeout=1.0, idempotent=False)):
        assert (await d.dispatch("slow", timeout=10.0))["run"] == 1
        assert trio.current_time() == 5.0


async def test_transient_errors_are_retried_with_the_issues_delays(
    autojump_clock: trio.abc.Clock,
) -> None:
    flaky = Script(["transient", "transient", "ok"])
    async with running(d.Tool("flaky", flaky, idempotent=False)):
        assert (await d.dispatch("flaky"))["run"] == 3
    jitter = random.Random(7)  # the dispatcher's seed: its only draws are the two delays
    second = 0.1 * (1 + jitter.uniform(0, 0.5))
    third = 0.4 * (1 + jitter.uniform(0, 0.5))
    assert flaky.starts == pytest.approx([0.0, second, second + third])
    assert 0.1 <= second <= 0.15 and 0.4 <= third <= 0.6


async def test_transient_failures_give_up_after_three_attempts(
    autojump_clock: trio.abc.Clock,
) -> None:
    flaky = Script(["transient"] * 5)
    async with running(d.Tool("flaky", flaky, idempotent=False)):
        with pytest.raises(d.TransientFailure) as caught:
            await d.dispatch("flaky")
        assert caught.value.attempts == 3
        assert "not retried: gave up after 3 attempts" in caught.value.message
        assert isinstance(caught.value.__cause__, d.TransientError)
        assert d.statistics().counters["dispatch.retry"] == 2
    assert flaky.runs == 3


async def test_schema_errors_are_never_retried_and_never_run_the_handler(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with running(d.Tool("add", handler, ADD_SCHEMA, idempotent=True)):
        with pytest.raises(d.InvalidArguments) as caught:
            await d.dispatch("add", {"a": "one", "b": 2})
        error = caught.value
        assert error.kind == "schema" and error.attempts == 0
        assert error.message.startswith(
            "tool 'add': the arguments do not match its schema: 'one' is not of type 'integer'"
            " (at /a)"
        )
        assert error.data["errors"] == [
            {"path": "/a", "message": "'one' is not of type 'integer'", "keyword": "type"}
        ]
        assert error.to_jsonrpc()["code"] == -32602
        assert error.to_mcp() == {"result": error.to_mcp_result()}
        assert error.to_mcp_result()["isError"] is True
        with pytest.raises(d.InvalidArguments, match="must be a JSON object"):
            await d.dispatch("add", [1, 2])  # type: ignore[arg-type]
    assert handler.runs == 0


def _nested(depth: int) -> dict[str, object]:
    args: dict[str, object] = {}
    for _ in range(depth - 1):
        args = {"a": args}
    return args


async def test_arguments_nested_past_the_depth_limit_are_a_schema_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    recursive = {"type": "object", "properties": {"a": {"$ref": "#"}}}
    handler = Script()
    tools = [
        d.Tool("checked", handler, recursive, idempotent=True),
        d.Tool("any", handler, idempotent=True),
    ]
    async with running(*tools):
        for name, key in (("checked", None), ("any", "k"), ("checked", "k2")):
            with pytest.raises(d.InvalidArguments) as caught:
                await d.dispatch(name, _nested(100_000), idempotency_key=key)
            error = caught.value
            assert "deeper than the limit max_arg_depth=64 (DispatcherConfig.max_arg_depth)" in (
                error.message
            )
            assert error.kind == "schema" and error.data["limit"] == {"max_arg_depth": 64}
        cycle: list[object] = []
        cycle.append(cycle)
        with pytest.raises(d.InvalidArguments, match="max_arg_depth"):
            await d.dispatch("any", {"a": cycle})
        assert handler.runs == 0
        await d.dispatch("checked", _nested(64), idempotency_key="k3")
    assert handler.runs == 1
    with pytest.raises(d.ConfigurationError, match="max_arg_depth must be an int from 1 to 200"):
        d.DispatcherConfig(max_arg_depth=10_000)


@contextmanager
def _failing_after(seconds: float) -> Iterator[None]:
    """Turn a stalled loop into a failure: ``re`` checks for signals while it backtracks."""

    def expired(_signum: int, _frame: object) -> None:
        raise AssertionError(f"the event loop was still stalled after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


HOSTILE = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
    "patternProperties": {"^(b+)+$": {"type": "integer"}},
    "additionalProperties": False,
}


async def test_a_catastrophic_schema_pattern_cannot_stall_the_loop(
    autojump_clock: trio.abc.Clock,
) -> None:
    # ^(a+)+$ against 5,000 a's and a "!" backtracks for longer than the universe has existed
    # (30 a's already take minutes).
    handler = Script()
    async with running(d.Tool("t", handler, HOSTILE, idempotent=True)):
        with _failing_after(10.0):
            with pytest.raises(d.InvalidArguments, match=r"does not match '\^\(a\+\)\+\$'"):
                await d.dispatch("t", {"s": "a" * 5_000 + "!"})
            with pytest.raises(d.InvalidArguments, match="not match any of the regexes"):
                await d.dispatch("t", {"b" * 3_000 + "!": 1})
            assert (await d.dispatch("t", {"s": "aaa", "bb": 2}))["run"] == 1


async def test_a_calls_pattern_work_is_bounded_by_max_pattern_steps(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    tool = d.Tool("t", handler, HOSTILE, idempotent=True)
    async with running(tool, max_pattern_steps=50_000):
        with pytest.raises(d.InvalidArguments) as caught:
            await d.dispatch("t", {"s": "a" * 10_000})  # ~11 steps a character
        assert "more than the limit max_pattern_steps=50000" in caught.value.message
        assert caught.value.data["limit"] == {"max_pattern_steps": 50_000}
        # The bound is per call, over all its strings: many short ones add up.
        with pytest.raises(d.InvalidArguments, match="max_pattern_steps"):
            await d.dispatch("t", {"b" * 400 + str(i): i for i in range(20)})
        roomy = d.DispatcherConfig(name="roomy", max_pattern_steps=200_000)
        await d.start_dispatcher([tool], roomy)
        assert (await d.dispatch("t", {"s": "a" * 10_000}, dispatcher="roomy"))["run"] == 1


async def test_validation_counts_against_the_calls_timeout() -> None:
    # Real time: the validation's CPU time is what counts (a MockClock does not see it).
    handler = Script()
    tool = d.Tool("t", handler, HOSTILE, idempotent=True, timeout=0.001)
    async with running(tool, max_pattern_steps=10**7):
        with pytest.raises(d.DispatchTimeout, match="was not run: validating its arguments took"):
            await d.dispatch("t", {"s": "a" * 50_000})
    assert handler.runs == 0


async def test_an_unknown_tool_is_not_found(autojump_clock: trio.abc.Clock) -> None:
    async with running(d.Tool("add", add, ADD_SCHEMA, idempotent=True)):
        with pytest.raises(d.ToolNotFound) as caught:
            await d.dispatch("sub", {})
    error = caught.value
    assert error.message == (
        "no tool named 'sub' is registered with dispatcher 'dispatcher' (known: 'add'); register"
        " it with apps.dispatcher.register_tool(Tool(...))"
    )
    assert error.to_jsonrpc()["code"] == -32601
    assert error.to_mcp()["error"]["code"] == -32602


async def test_a_non_idempotent_tool_is_not_retried_after_a_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script(["timeout", "ok"])
    async with running(d.Tool("pay", slow, timeout=1.0, idempotent=False)):
        with pytest.raises(d.DispatchTimeout) as caught:
            await d.dispatch("pay")
    assert slow.runs == 1
    assert "not retried: the tool is not idempotent" in caught.value.message


async def test_an_idempotent_tool_is_retried_after_a_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script(["timeout", "ok"])
    async with running(d.Tool("read", slow, timeout=1.0, idempotent=True)):
        assert (await d.dispatch("read"))["run"] == 2
    assert slow.starts[1] == pytest.approx(1.0 + 0.1 * (1 + random.Random(7).uniform(0, 0.5)))


async def test_a_handler_exception_is_internal_and_not_retried(
    autojump_clock: trio.abc.Clock,
) -> None:
    broken = Script(["internal", "ok"])
    async with running(d.Tool("broken", broken, idempotent=True)):
        with pytest.raises(d.InternalError) as caught:
            await d.dispatch("broken")
    assert broken.runs == 1
    assert isinstance(caught.value.__cause__, ValueError)
    assert caught.value.message.startswith("tool 'broken' raised ValueError: bad state")
    assert caught.value.to_jsonrpc()["code"] == -32603


async def test_retry_after_replaces_the_delay_and_is_capped(
    autojump_clock: trio.abc.Clock,
) -> None:
    calls: list[float] = []

    async def limited() -> str:
        calls.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        if len(calls) == 1:
            raise d.TransientError("rate limited", retry_after=3.0)
        if len(calls) == 2:
            raise d.TransientError("rate limited", retry_after=100.0)
        return "done"

    policy = d.RetryPolicy(max_retry_after=5.0)
    async with running(d.Tool("limited", limited, idempotent=True, retry=policy)):
        assert await d.dispatch("limited") == "done"
    assert calls == [0.0, 3.0, 8.0]


async def test_the_shared_retry_budget_stops_a_retry_storm(autojump_clock: trio.abc.Clock) -> None:
    flaky = Script(["transient"] * 100)
    policy = d.RetryPolicy(budget=d.RetryBudget(capacity=2.0, refill_per_second=0.0))
    async with running(d.Tool("flaky", flaky, idempotent=True, retry=policy, breaker=None)):
        outcomes = await d.gather_bounded([("flaky", {})] * 5, return_outcomes=True)
        assert all(o.error is not None and o.error.kind == "transient" for o in outcomes)
        assert d.statistics().counters["dispatch.retry_denied"] == 5  # 3 at once, 2 later
    assert flaky.runs == 5 + 2


async def test_a_spent_budget_fails_at_once(autojump_clock: trio.abc.Clock) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=True)):
        with pytest.raises(d.BudgetExceeded) as caught:
            await d.dispatch("t", budget=d.Budget(calls=0))
        assert caught.value.attempts == 0
        assert "the caller's budget is spent (it has no tool calls left)" in caught.value.message
        with pytest.raises(d.BudgetExceeded, match="deadline"):
            await d.dispatch("t", budget=d.Budget(deadline=trio.current_time()))
        assert trio.current_time() == 0.0
    assert handler.runs == 0


async def test_a_budget_that_is_not_a_budget_is_a_typed_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=True)):
        with pytest.raises(d.InvalidOption) as caught:
            await d.dispatch("t", budget=5)  # type: ignore[arg-type]
        with pytest.raises(d.InvalidOption):
            await d.gather_bounded([("t", {})], budget=5)  # type: ignore[arg-type]
    error = caught.value
    assert isinstance(error, d.DispatchError) and isinstance(error, d.ConfigurationError)
    assert error.kind == "schema" and error.jsonrpc_code == -32602
    assert "budget must be an apps.dispatcher.Budget (say Budget(calls=5)" in error.message
    assert "got 5" in error.message
    assert handler.runs == 0


async def test_retries_spend_the_callers_budget(autojump_clock: trio.abc.Clock) -> None:
    flaky = Script(["transient"] * 10)
    async with running(d.Tool("flaky", flaky, idempotent=True)):
        budget = d.Budget(calls=2)
        with pytest.raises(d.TransientFailure, match="budget has no tool calls left"):
            await d.dispatch("flaky", budget=budget)
        assert budget.calls == 0
        with pytest.raises(d.BudgetExceeded):
            await d.dispatch("flaky", budget=budget)
    assert flaky.runs == 2


async def test_a_budget_deadline_cancels_the_attempt(autojump_clock: trio.abc.Clock) -> None:
    slow = Script([10.0])
    async with running(d.Tool("slow", slow, timeout=30.0, idempotent=True)):
        with pytest.raises(d.BudgetExceeded, match="deadline passed while it ran"):
            await d.dispatch("slow", budget=d.Budget.within(2.0))
        assert trio.current_time() == 2.0


async def test_a_sync_handler_runs_in_a_thread_and_its_timeout_abandons_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    release = threading.Event()

    def blocking(wait: bool) -> str:
        if wait:
            release.wait(timeout=10)
        return threading.current_thread().name

    async with running(d.Tool("blocking", blocking, timeout=1.0, idempotent=False)):
        # The mock clock jumps while the thread runs: no timeout for the quick call.
        thread = await d.dispatch("blocking", {"wait": False}, timeout=math.inf)
        assert thread != threading.current_thread().name
        with pytest.raises(d.DispatchTimeout):
            await d.dispatch("blocking", {"wait": True})
        release.set()


async def test_the_dispatcher_must_be_running() -> None:
    async with otp.open_node():
        with pytest.raises(d.DispatcherNotRunning, match="no dispatcher runs as 'dispatcher'"):
            await d.dispatch("add", {})


async def test_events_are_logged_and_counted(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="apps.dispatcher")
    flaky = Script(["timeout", "ok"])
    async with running(d.Tool("flaky", flaky, timeout=1.0, idempotent=True)):
        await d.dispatch("flaky")
        stats = d.statistics()
    events = [r.dispatch_event["event"] for r in caplog.records if hasattr(r, "dispatch_event")]
    assert events == [
        "dispatch.attempt",
        "dispatch.timeout",
        "dispatch.retry",
        "dispatch.attempt",
        "dispatch.ok",
    ]
    assert stats.counters["dispatch.attempt"] == 2
    assert stats.counters["dispatch.timeout"] == 1
    assert stats.breakers == {"flaky": "closed"}
    assert stats.running == 0


async def test_tools_can_be_registered_while_the_dispatcher_runs(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with running():
        d.register_tool(d.Tool("add", add, ADD_SCHEMA, idempotent=True))
        assert await d.dispatch("add", {"a": 1, "b": 1}) == 2
        with pytest.raises(d.ConfigurationError, match="already registered"):
            d.register_tool(d.Tool("add", add, idempotent=True))
        assert d.unregister_tool("add") is not None
        with pytest.raises(d.ToolNotFound):
            await d.dispatch("add", {"a": 1, "b": 1})


@pytest.mark.parametrize("retry_after", [-5.0, math.nan])
async def test_a_bad_retry_after_from_a_handler_still_retries(
    autojump_clock: trio.abc.Clock, retry_after: float
) -> None:
    starts: list[float] = []

    async def limited() -> str:
        starts.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        if len(starts) == 1:  # e.g. a Retry-After date already in the past
            raise d.TransientError("rate limited", retry_after=retry_after)
        return "done"

    async with running(d.Tool("limited", limited, idempotent=True)):
        assert await d.dispatch("limited") == "done"
    assert len(starts) == 2


@pytest.mark.parametrize("timeout", [-1.0, math.nan, "1"])
async def test_a_bad_per_call_timeout_is_a_configuration_error(
    autojump_clock: trio.abc.Clock, timeout: Any
) -> None:
    handler = Script([100.0])
    async with running(d.Tool("t", handler, timeout=1.0, idempotent=False)):
        with pytest.raises(d.ConfigurationError, match="timeout"):
            await d.dispatch("t", timeout=timeout)
    assert handler.runs == 0
    assert trio.current_time() == 0.0


async def test_a_retry_refused_for_the_deadline_spends_no_shared_token(
    autojump_clock: trio.abc.Clock,
) -> None:
    flaky = Script(["transient", "transient", "ok"])
    policy = d.RetryPolicy(budget=d.RetryBudget(capacity=1.0, refill_per_second=0.0))
    async with running(d.Tool("t", flaky, idempotent=True, retry=policy, breaker=None)):
        with pytest.raises(d.TransientFailure, match="deadline would pass"):
            await d.dispatch("t", budget=d.Budget.within(0.05))
        # The bucket's one token was never used for a retry: this call may retry once.
        assert (await d.dispatch("t"))["run"] == 3


async def test_handler_data_cannot_override_the_envelopes_kind(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def limited() -> None:
        await trio.lowlevel.checkpoint()
        raise d.TransientError("slow down", data={"kind": "rate_limit", "attempts": 99})

    async with running(d.Tool("t", limited, idempotent=True, retry=d.NO_RETRY)):
        with pytest.raises(d.TransientFailure) as caught:
            await d.dispatch("t")
    error = caught.value
    for data in (error.to_jsonrpc()["data"], error.to_mcp_result()["structuredContent"]["error"]):
        assert data["kind"] == "transient"
        assert data["attempts"] == 1


def test_a_retry_budget_that_can_never_grant_a_retry_is_rejected() -> None:
    with pytest.raises(d.ConfigurationError, match="capacity"):
        d.RetryBudget(capacity=0.5)


async def test_a_tool_replaced_while_its_call_runs_keeps_the_calls_counts(
    autojump_clock: trio.abc.Clock,
) -> None:
    first = Script([5.0])
    async with running(d.Tool("work", first, idempotent=True)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.dispatch, "work")
            await trio.testing.wait_all_tasks_blocked()
            stats = d.statistics()
            assert (stats.running, stats.counters["dispatch.attempt"]) == (1, 1)
            second = Script()
            d.register_tool(d.Tool("work", second, idempotent=True), replace=True)
            assert (await d.dispatch("work"))["run"] == 1
        assert (first.runs, second.runs) == (1, 1)
        stats = d.statistics()
        assert stats.counters["dispatch.attempt"] == stats.counters["dispatch.ok"] == 2
        view = d.observer_view()["tools"]["work"]
        assert (view["calls"], view["attempts"], view["ok"]) == (2, 2, 2)
        assert view["latency_seconds"]["count"] == 2


async def test_a_call_without_a_timeout_is_cancelled_with_its_caller(
    autojump_clock: trio.abc.Clock,
) -> None:
    endless = Script(["timeout"])
    async with running(d.Tool("endless", endless, timeout=None, idempotent=True)):
        with trio.move_on_after(3.0) as scope:
            await d.dispatch("endless")
        assert scope.cancelled_caught
        assert endless.cancelled == 1
        stats = d.statistics()
        assert stats.running == 0
        assert stats.counters["dispatch.attempt"] == 1
        assert "dispatch.timeout" not in stats.counters
        assert d.observer_view()["tools"]["endless"]["latency_seconds"]["count"] == 1


@pytest.mark.parametrize("schema", [None, ADD_SCHEMA])
async def test_a_timeout_wins_over_what_the_cancelled_handler_raises(
    autojump_clock: trio.abc.Clock, schema: dict[str, Any] | None
) -> None:
    async def stubborn(**_args: Any) -> None:
        try:
            await trio.sleep(10)
        except trio.Cancelled as cancelled:
            raise BaseExceptionGroup("cleanup", [cancelled, ValueError("cleanup failed")])

    async with running(d.Tool("stubborn", stubborn, schema, timeout=1.0, idempotent=False)):
        with pytest.raises(d.DispatchTimeout, match="did not answer within 1 s"):
            await d.dispatch("stubborn", {"a": 1, "b": 2})
        assert d.statistics().counters["dispatch.timeout"] == 1


@pytest.mark.parametrize("called_before", [False, True])
async def test_a_cancelled_caller_never_runs_the_handler(
    autojump_clock: trio.abc.Clock, called_before: bool
) -> None:
    work = Script()
    async with running(d.Tool("work", work, idempotent=True)):
        if called_before:  # the dispatcher is remembered: the check is made inline
            await d.dispatch("work")
        runs = work.runs
        with trio.CancelScope() as scope:
            scope.cancel()
            await d.dispatch("work")
        assert scope.cancelled_caught
        assert work.runs == runs
        assert d.statistics().running == 0


async def test_calls_after_a_restart_reach_the_new_dispatcher(
    autojump_clock: trio.abc.Clock,
) -> None:
    work = Script()
    async with running(d.Tool("work", work, idempotent=True)):
        await d.dispatch("work")
        first = otp.whereis("dispatcher")
        assert first is not None
        otp.exit(first, "kill")
        await trio.testing.wait_all_tasks_blocked()
        assert otp.whereis("dispatcher") not in (None, first)
        await d.dispatch("work")
        # The call was counted by the restarted server's state, not the dead one's.
        assert d.statistics().counters["dispatch.ok"] == 1
        assert work.runs == 2


async def test_debug_events_follow_the_loggers_level_from_one_call_to_the_next(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    def events() -> list[str]:
        found = [r.dispatch_event["event"] for r in caplog.records if hasattr(r, "dispatch_event")]
        caplog.clear()
        return found

    async with running(d.Tool("work", Script(), idempotent=True)):
        caplog.set_level(logging.INFO, logger="apps.dispatcher")
        await d.dispatch("work")
        assert events() == []
        caplog.set_level(logging.DEBUG, logger="apps.dispatcher")
        await d.dispatch("work")
        assert events() == ["dispatch.attempt", "dispatch.ok"]
        logging.getLogger("apps.dispatcher").disabled = True
        try:
            await d.dispatch("work")
        finally:
            logging.getLogger("apps.dispatcher").disabled = False
        assert events() == []
        caplog.set_level(logging.INFO, logger="apps.dispatcher")
        await d.dispatch("work")
        assert events() == []
