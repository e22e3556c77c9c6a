"""Idempotency keys: in-flight calls collapse into one run, outcomes are kept with a TTL (a
non-idempotent tool's failures too, so a late retry never runs it twice), the same key with
other arguments is a conflict, and a cancelled first caller strands nobody."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import otp
from apps import dispatcher as d

from .helpers import Script, running


async def test_two_concurrent_same_key_calls_run_the_handler_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([1.0])
    results: list[object] = []

    async def call() -> None:
        results.append(await d.dispatch("slow", {"x": 1}, idempotency_key="k1"))

    async with running(d.Tool("slow", slow, idempotent=False)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            nursery.start_soon(call)
        stats = d.statistics()
    assert slow.runs == 1
    assert results == [{"run": 1, "args": {"x": 1}}] * 2
    assert stats.counters["dispatch.dedup_hit"] == 1
    assert stats.in_flight_keys == 0 and stats.cached_results == 1


async def test_a_late_retry_gets_the_cached_result_until_the_ttl_passes(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=False)):
        first = await d.dispatch("t", {"x": 1}, idempotency_key="k")
        await trio.sleep(59.9)
        assert await d.dispatch("t", {"x": 1}, idempotency_key="k") == first
        assert handler.runs == 1
        await trio.sleep(0.2)  # 60.1 s after the result: it has expired
        second = await d.dispatch("t", {"x": 1}, idempotency_key="k")
    assert handler.runs == 2
    assert second["run"] == 2


async def test_the_result_ttl_is_configurable(autojump_clock: trio.abc.Clock) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=False), result_ttl=5.0):
        await d.dispatch("t", idempotency_key="k")
        await trio.sleep(5.0)
        await d.dispatch("t", idempotency_key="k")
    assert handler.runs == 2


async def test_the_same_key_with_other_arguments_is_a_conflict(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([1.0])
    async with running(d.Tool("t", slow, idempotent=False)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: d.dispatch("t", {"x": 1}, idempotency_key="k"))
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(d.IdempotencyConflict) as in_flight:
                await d.dispatch("t", {"x": 2}, idempotency_key="k")
        with pytest.raises(d.IdempotencyConflict) as cached:
            await d.dispatch("t", {"x": 2}, idempotency_key="k")
    assert slow.runs == 1
    for caught in (in_flight, cached):
        assert caught.value.kind == "conflict"
        assert caught.value.jsonrpc_code == -32004
        assert "a new call needs a new key" in caught.value.message


async def test_calls_without_a_key_are_never_deduplicated(autojump_clock: trio.abc.Clock) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=True)):
        await d.dispatch("t", {"x": 1})
        await d.dispatch("t", {"x": 1})
    assert handler.runs == 2


async def test_an_idempotent_tools_failures_run_again(autojump_clock: trio.abc.Clock) -> None:
    handler = Script(["internal", "ok"])
    async with running(d.Tool("t", handler, idempotent=True)):
        with pytest.raises(d.InternalError):
            await d.dispatch("t", idempotency_key="k")
        assert (await d.dispatch("t", idempotency_key="k"))["run"] == 2


async def test_a_late_retry_of_a_timed_out_non_idempotent_call_gets_the_timeout_not_a_run(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The seed's double charge: payments.charge times out (it may have committed), the
    # caller's retry with the same key comes a second later.
    charge = Script(["timeout"])
    async with running(d.Tool("payments.charge", charge, timeout=5.0, idempotent=False)):
        with pytest.raises(d.DispatchTimeout) as first:
            await d.dispatch("payments.charge", {"cents": 500}, idempotency_key="order-1")
        assert first.value.in_doubt and "its outcome is unknown" in first.value.message
        await trio.sleep(1.0)
        with pytest.raises(d.DispatchTimeout) as retry:
            await d.dispatch("payments.charge", {"cents": 500}, idempotency_key="order-1")
        assert charge.runs == 1
        envelope = retry.value.to_jsonrpc()
        assert envelope["code"] == -32000
        assert envelope["data"]["kind"] == "timeout"
        assert envelope["data"]["in_doubt"] is True
        assert envelope["data"]["replayed"] is True
        assert "its handler was not run again" in retry.value.message
        await trio.sleep(60.0)  # past result_ttl the key is free again
        await d.dispatch("payments.charge", {"cents": 500}, idempotency_key="order-1")
    assert charge.runs == 2


async def test_a_non_idempotent_tools_failure_is_kept_for_its_key(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script(["internal"])
    async with running(d.Tool("write", handler, idempotent=False)):
        with pytest.raises(d.InternalError) as first:
            await d.dispatch("write", idempotency_key="k")
        with pytest.raises(d.InternalError) as again:
            await d.dispatch("write", idempotency_key="k")
        assert d.statistics().cached_results == 1
    assert handler.runs == 1
    assert not first.value.in_doubt and again.value.data["replayed"] is True
    assert again.value.attempts == first.value.attempts == 1


async def test_a_failure_before_the_handler_ran_is_not_kept(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script(["internal"])
    breaker = d.BreakerPolicy(failures=1, window=10.0, cooldown=5.0)
    tool = d.Tool("write", handler, idempotent=False, retry=d.NO_RETRY, breaker=breaker)
    async with running(tool):
        with pytest.raises(d.InternalError):
            await d.dispatch("write", idempotency_key="a")
        with pytest.raises(d.CircuitOpen):
            await d.dispatch("write", idempotency_key="b")
        await trio.sleep(5.0)
        assert (await d.dispatch("write", idempotency_key="b"))["run"] == 2


async def test_waiters_get_the_result_when_the_first_caller_is_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([5.0])
    got: list[object] = []
    async with running(d.Tool("slow", slow, idempotent=False)):
        async with trio.open_nursery() as nursery:
            first = trio.CancelScope()

            async def first_caller() -> None:
                with first:
                    await d.dispatch("slow", idempotency_key="k")

            async def second_caller() -> None:
                got.append(await d.dispatch("slow", idempotency_key="k"))

            nursery.start_soon(first_caller)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(second_caller)
            await trio.sleep(1.0)
            first.cancel()
        assert first.cancelled_caught
        assert trio.current_time() == 5.0
        assert got == [{"run": 1, "args": {}}]
        assert slow.cancelled == 0
        # The run went on without its first caller, and its result is cached.
        assert await d.dispatch("slow", idempotency_key="k") == got[0]
    assert slow.runs == 1


async def test_a_cancelled_lone_caller_leaves_its_result_for_a_retry(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([5.0])
    async with running(d.Tool("slow", slow, idempotent=False)):
        with trio.move_on_after(1.0):
            await d.dispatch("slow", idempotency_key="k")
        assert await d.dispatch("slow", idempotency_key="k") == {"run": 1, "args": {}}
        assert trio.current_time() == 5.0
    assert slow.runs == 1


async def test_waiters_get_an_error_when_the_dispatcher_dies(
    autojump_clock: trio.abc.Clock,
) -> None:
    slow = Script([5.0])
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        pid = await d.start_dispatcher([d.Tool("slow", slow, idempotent=False)])
        async with trio.open_nursery() as nursery:

            async def kill() -> None:
                await trio.sleep(1.0)
                otp.exit(pid, "kill")

            nursery.start_soon(kill)
            with pytest.raises(d.InternalError, match="stopped while the call with idempotency"):
                await d.dispatch("slow", idempotency_key="k")
        assert trio.current_time() == 1.0
        with pytest.raises(d.DispatcherNotRunning):
            await d.dispatch("slow")


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
