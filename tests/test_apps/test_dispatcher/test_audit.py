"""Audit of apps/dispatcher against issue 7, JSON-RPC 2.0 and MCP.

Each ``xfail(strict=True)`` test proves a bug (it passes once the bug is fixed); the others guard
tricky edges that were checked and found right.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import trio
import trio.testing

import otp
from apps import dispatcher as d
from apps.dispatcher._attempt import _Slots

from .helpers import Gauge, Script, running

BREAKER = d.BreakerPolicy(failures=3, window=10.0, cooldown=5.0)


async def _open_breaker() -> None:
    for _ in range(3):
        with pytest.raises(d.InternalError):
            await d.dispatch("t")
    await trio.sleep(BREAKER.cooldown)


# -- bugs -------------------------------------------------------------------------------------


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


async def test_calls_queued_for_a_tools_limit_do_not_hold_dispatcher_slots(
    autojump_clock: trio.abc.Clock,
) -> None:
    busy = Gauge(seconds=10.0)
    b_started: list[float] = []

    async def other() -> str:
        b_started.append(trio.current_time())
        await trio.lowlevel.checkpoint()
        return "b"

    tools = [
        d.Tool("a", busy, idempotent=True, max_concurrency=1),
        d.Tool("b", other, idempotent=True),
    ]
    async with running(*tools, max_concurrency=2):
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(d.dispatch, "a", {"i": i})
            await trio.testing.wait_all_tasks_blocked()
            assert d.statistics().running == 1  # one of two dispatcher slots runs anything
            assert await d.dispatch("b") == "b"
    assert b_started == [0.0]  # today: 20.0, after two 10 s runs of "a"


async def test_a_budget_deadline_bounds_the_wait_for_a_slot(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([100.0, "ok"])
    async with running(d.Tool("t", slow, timeout=None, idempotent=False), max_concurrency=1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(d.dispatch, "t")
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(d.BudgetExceeded):
                await d.dispatch("t", budget=d.Budget.within(2.0))
            assert trio.current_time() == 2.0  # today: 100.0
            assert slow.runs == 1  # today: the second handler starts after its deadline
            nursery.cancel_scope.cancel()


async def test_a_joining_caller_keeps_its_own_timeout(autojump_clock: trio.abc.Clock) -> None:
    slow = Script([50.0])
    async with running(d.Tool("t", slow, timeout=100.0, idempotent=False)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: d.dispatch("t", idempotency_key="k"))
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(d.DispatchTimeout):
                await d.dispatch("t", idempotency_key="k", timeout=1.0)
            assert trio.current_time() == 1.0


async def test_the_first_callers_budget_does_not_cut_the_shared_run(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([5.0])
    got: list[Any] = []
    async with running(d.Tool("t", slow, idempotent=False)):
        async with trio.open_nursery() as nursery:

            async def first() -> None:
                # wait_run's own message says "the call goes on; its result is cached"
                with pytest.raises(d.BudgetExceeded):
                    await d.dispatch("t", idempotency_key="k", budget=d.Budget.within(1.0))

            async def joiner() -> None:
                got.append(await d.dispatch("t", idempotency_key="k"))

            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(joiner)
        assert got == [{"run": 1, "args": {}}]
        assert trio.current_time() == 5.0


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


async def test_gather_rejects_a_bad_key_with_a_configuration_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=True)):
        with pytest.raises(d.ConfigurationError, match="idempotency_key"):
            await d.gather_bounded([d.Call("t", {}), d.Call("t", {}, idempotency_key="")])


def test_a_schema_with_an_unresolvable_ref_is_rejected_when_the_tool_is_built() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(d.ConfigurationError, match="schema"):
        d.Tool("t", Script(), schema, idempotent=True)


@pytest.mark.parametrize(
    "schema",
    [{"type": "array"}, {"properties": {"a": {"type": "integer"}}}],
    ids=["array", "no-type"],
)
def test_a_tools_input_schema_is_an_mcp_object_schema(schema: dict[str, Any]) -> None:
    try:
        tool = d.Tool("t", Script(), schema, idempotent=True)
    except d.ConfigurationError as error:
        assert "object" in str(error)
        return
    assert schema.get("type", "object") == "object", "a non-object schema must be rejected"
    assert tool.to_mcp()["inputSchema"]["type"] == "object"


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


async def test_keyed_args_that_cannot_be_fingerprinted_get_a_typed_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def anything(**args: Any) -> int:
        await trio.lowlevel.checkpoint()
        return len(args)

    async with running(d.Tool("t", anything, idempotent=True)):
        assert await d.dispatch("t", {"x": {1: "a", "b": 2}}) == 1  # fine without a key
        with pytest.raises(d.DispatchError):
            await d.dispatch("t", {"x": {1: "a", "b": 2}}, idempotency_key="k")


@pytest.mark.parametrize(
    "request_",
    [("dispatch", "t", {}, "not options"), ("dispatch", ["t"], {})],
    ids=["options-not-a-mapping", "unhashable-name"],
)
async def test_a_malformed_remote_request_is_answered_and_the_dispatcher_survives(
    autojump_clock: trio.abc.Clock, request_: tuple[Any, ...]
) -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        await d.start_dispatcher([d.Tool("t", Script(), idempotent=True)])
        reply = await otp.call("dispatcher", request_, timeout=5.0)
        assert reply[0] == "error"
        assert (await d.dispatch("t"))["run"] == 1


async def test_an_abandoned_sync_thread_still_counts_against_the_tools_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    started, release = threading.Event(), threading.Event()
    lock = threading.Lock()
    gauge = {"now": 0, "peak": 0}

    def blocking(wait: bool) -> str:
        with lock:
            gauge["now"] += 1
            gauge["peak"] = max(gauge["peak"], gauge["now"])
        try:
            if wait:
                started.set()
                release.wait(timeout=10)
        finally:
            with lock:
                gauge["now"] -= 1
        return "done"

    tool = d.Tool("t", blocking, timeout=1.0, idempotent=False, max_concurrency=1)
    async with running(tool):

        async def times_out() -> None:
            with pytest.raises(d.DispatchTimeout):
                await d.dispatch("t", {"wait": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(times_out)
            # Busy until the thread really runs, so the clock cannot jump to the timeout first
            # (a thread that starts after its attempt ended does not run the handler at all).
            while not started.is_set():
                await trio.lowlevel.checkpoint()

        async def let_it_finish() -> None:
            await trio.sleep(5.0)
            release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(let_it_finish)
            assert await d.dispatch("t", {"wait": False}, timeout=math.inf) == "done"
        release.set()
    assert gauge["peak"] == 1


def test_a_retry_budget_that_can_never_grant_a_retry_is_rejected() -> None:
    with pytest.raises(d.ConfigurationError, match="capacity"):
        d.RetryBudget(capacity=0.5)


# -- edges checked and found right ------------------------------------------------------------


async def test_a_cached_result_expires_at_exactly_60_seconds(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=False)):
        await d.dispatch("t", idempotency_key="k")
        await trio.sleep(60.0 - 1 / 1024)
        assert (await d.dispatch("t", idempotency_key="k"))["run"] == 1
        await trio.sleep(1 / 1024)
        assert (await d.dispatch("t", idempotency_key="k"))["run"] == 2
        assert d.statistics().cached_results == 1


async def test_half_open_admits_exactly_one_probe_among_concurrent_callers(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script(["internal"] * 3 + [1.0] * 10)
    tool = d.Tool("t", handler, idempotent=True, retry=d.NO_RETRY, breaker=BREAKER)
    outcomes: list[str] = []

    async def call() -> None:
        try:
            await d.dispatch("t")
            outcomes.append("ok")
        except d.CircuitOpen:
            outcomes.append("open")

    async with running(tool):
        await _open_breaker()
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(call)
        assert d.statistics().breakers == {"t": "closed"}
    assert sorted(outcomes) == ["ok"] + ["open"] * 9
    assert handler.runs == 4


async def test_a_probe_cancelled_while_queued_for_a_slot_frees_the_probe(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script(["internal"] * 3 + [10.0, "ok"])
    tool = d.Tool(
        "t", handler, idempotent=True, retry=d.NO_RETRY, breaker=BREAKER, max_concurrency=1
    )
    async with running(tool, max_concurrency=1):
        await _open_breaker()
        async with trio.open_nursery() as nursery:
            hold = Gauge(seconds=3.0)
            d.register_tool(d.Tool("hold", hold, idempotent=True))
            nursery.start_soon(d.dispatch, "hold", {})  # takes the dispatcher's only slot
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(1.0):
                await d.dispatch("t")  # the probe, queued behind "hold", then cancelled
        assert handler.runs == 3
        assert (await d.dispatch("t"))["run"] == 4  # admitted as the new probe
        assert d.statistics().breakers["t"] == "closed"


async def test_joiners_of_a_timed_out_non_idempotent_run_get_the_typed_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script(["timeout", "ok"])
    errors: list[d.DispatchError] = []

    async def call() -> None:
        try:
            await d.dispatch("pay", idempotency_key="k")
        except d.DispatchError as error:
            errors.append(error)

    async with running(d.Tool("pay", slow, timeout=1.0, idempotent=False)):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(call)
        assert d.statistics().in_flight_keys == 0
    assert slow.runs == 1
    assert trio.current_time() == 1.0
    assert [type(e) for e in errors] == [d.DispatchTimeout] * 3
    assert all("not retried: the tool is not idempotent" in e.message for e in errors)
    assert len({id(e) for e in errors}) == 3  # each caller gets its own envelope


async def test_a_sync_handler_whose_attempt_ended_before_its_thread_started_never_runs() -> None:
    semaphore = trio.Semaphore(1)
    await semaphore.acquire()
    slots = _Slots()
    slots.held.append(semaphore)
    ran: list[int] = []
    run = slots.in_thread(lambda: ran.append(1))
    slots.let_go()  # the attempt timed out before the thread started
    assert semaphore.value == 1
    assert await trio.to_thread.run_sync(run) is None
    assert ran == []


async def test_a_running_sync_handler_keeps_its_slot_until_its_thread_ends() -> None:
    semaphore = trio.Semaphore(1)
    await semaphore.acquire()
    slots = _Slots()
    slots.held.append(semaphore)
    started, gate = threading.Event(), threading.Event()

    def handler() -> str:
        started.set()
        gate.wait(10)
        return "done"

    run = slots.in_thread(handler)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, run)
        await trio.to_thread.run_sync(started.wait)
        slots.let_go()  # the attempt ended (timeout, cancel) while the thread runs
        assert semaphore.value == 0
        gate.set()
    assert semaphore.value == 1  # released by the thread as it ended
