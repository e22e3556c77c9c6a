"""Bounded fan-out (call order, measured concurrency) and the per-tool circuit breaker."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from apps import dispatcher as d

from .helpers import ADD_SCHEMA, Gauge, Script, running


async def test_40_calls_under_limit_8_never_run_more_than_8_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    gauge = Gauge(seconds=1.0)
    async with running(d.Tool("gauge", gauge, idempotent=True)):
        values = await d.gather_bounded([("gauge", {"i": i}) for i in range(40)], limit=8)
    assert values == list(range(40))
    assert gauge.peak == 8
    assert trio.current_time() == 5.0  # 40 calls, 8 at a time, 1 s each


async def _echo(i: int, wait: float) -> int:
    await trio.sleep(wait)
    return i


ECHO = d.Tool(
    "echo", _echo, {"type": "object", "properties": {"i": {"type": "integer"}}}, idempotent=True
)


async def test_gather_returns_values_in_call_order_like_gather(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with running(ECHO):
        calls = [d.Call("echo", {"i": 0, "wait": 3.0}), ("echo", {"i": 1, "wait": 1.0})]
        assert await d.gather_bounded(calls, limit=2) == [0, 1]


async def test_gather_raises_the_first_error_once_every_call_has_ended(
    autojump_clock: trio.abc.Clock,
) -> None:
    done: list[int] = []

    async def work(i: int, fail_after: float | None = None) -> int:
        await trio.sleep(fail_after if fail_after is not None else 2.0)
        if fail_after is not None:
            raise ValueError(f"call {i} broke")
        done.append(i)
        return i

    async with running(d.Tool("work", work, idempotent=True)):
        calls = [("work", {"i": 0}), ("work", {"i": 1, "fail_after": 1.5}), ("work", {"i": 2})]
        calls.append(("work", {"i": 3, "fail_after": 0.5}))
        with pytest.raises(d.InternalError, match="call 3 broke") as caught:
            await d.gather_bounded(calls, limit=8)
    # No call was cancelled because another failed: all of them ran to their end.
    assert sorted(done) == [0, 2] and trio.current_time() == 2.0
    assert caught.value.__notes__ == [
        "gather_bounded: call 3 of 4 failed first; other failed calls: 1 (pass"
        " return_outcomes=True for every outcome)"
    ]


async def test_gather_accepts_the_seeds_timeout_ms(autojump_clock: trio.abc.Clock) -> None:
    async with running(ECHO):
        calls = [d.Call("echo", {"i": 0, "wait": 1.0}, timeout_ms=250)]
        [outcome] = await d.gather_bounded(calls, return_outcomes=True)
        assert outcome.error is not None and outcome.error.kind == "timeout"
        assert outcome.error.data["timeout"] == 0.25
        with pytest.raises(d.InvalidOption, match="timeout_ms, not both"):
            await d.gather_bounded([d.Call("echo", {}, timeout=1.0, timeout_ms=5)])


async def test_gather_keeps_call_order_and_errors_in_place_with_return_outcomes(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with running(ECHO):
        calls = [
            d.Call("echo", {"i": 0, "wait": 3.0}),
            ("echo", {"i": "x", "wait": 0.0}),
            ("nope", {}),
            d.Call("echo", {"i": 3, "wait": 1.0}),
        ]
        outcomes = await d.gather_bounded(calls, limit=2, return_outcomes=True)
    assert outcomes[0].value == 0 and outcomes[3].value == 3
    assert outcomes[1].error is not None and outcomes[1].error.kind == "schema"
    assert outcomes[2].error is not None and outcomes[2].error.kind == "not_found"
    with pytest.raises(d.ToolNotFound):
        outcomes[2].unwrap()


async def test_a_tools_own_limit_bounds_every_caller(autojump_clock: trio.abc.Clock) -> None:
    gauge = Gauge(seconds=1.0)
    async with running(d.Tool("gauge", gauge, idempotent=True, max_concurrency=3)):
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(d.gather_bounded, [("gauge", {"i": i}) for i in range(10)])
    assert gauge.peak == 3


async def test_the_dispatchers_limit_bounds_every_tool(autojump_clock: trio.abc.Clock) -> None:
    gauge = Gauge(seconds=1.0)
    tools = [d.Tool("a", gauge, idempotent=True), d.Tool("b", gauge, idempotent=True)]
    async with running(*tools, max_concurrency=5):
        calls = [(name, {"i": i}) for i in range(10) for name in ("a", "b")]
        await d.gather_bounded(calls, limit=20)
    assert gauge.peak == 5


async def test_gather_rejects_a_bad_limit(autojump_clock: trio.abc.Clock) -> None:
    async with running():
        with pytest.raises(d.ConfigurationError, match=r"limit must be an int >= 1 \(got 0\)"):
            await d.gather_bounded([], limit=0)


BREAKER = d.BreakerPolicy(failures=3, window=10.0, cooldown=5.0)


async def test_the_breaker_opens_half_opens_with_one_probe_and_closes(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script(["internal"] * 3 + [1.0])
    tool = d.Tool("t", handler, idempotent=True, retry=d.NO_RETRY, breaker=BREAKER)
    async with running(tool):
        for _ in range(3):
            with pytest.raises(d.InternalError):
                await d.dispatch("t")
        assert d.statistics().breakers == {"t": "open"}
        with pytest.raises(d.CircuitOpen, match="lets a probe call through in 5 s") as caught:
            await d.dispatch("t")
        assert caught.value.attempts == 0 and caught.value.jsonrpc_code == -32003
        assert handler.runs == 3
        await trio.sleep(5.0)
        assert d.statistics().breakers == {"t": "half_open"}
        probe_result: list[object] = []

        async def probe() -> None:
            probe_result.append(await d.dispatch("t"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(d.CircuitOpen, match="one probe call is running"):
                await d.dispatch("t")
        assert probe_result and handler.runs == 4
        assert d.statistics().breakers == {"t": "closed"}
        await d.dispatch("t")
        counters = d.statistics().counters
    assert handler.runs == 5
    assert counters["breaker.open"] == 1
    assert counters["breaker.half_open"] == 1
    assert counters["breaker.close"] == 1


async def test_a_failed_probe_opens_the_breaker_again(autojump_clock: trio.abc.Clock) -> None:
    handler = Script(["transient"] * 4)
    tool = d.Tool("t", handler, idempotent=True, retry=d.NO_RETRY, breaker=BREAKER)
    async with running(tool):
        for _ in range(3):
            with pytest.raises(d.TransientFailure):
                await d.dispatch("t")
        await trio.sleep(5.0)
        with pytest.raises(d.TransientFailure):
            await d.dispatch("t")
        assert d.statistics().breakers == {"t": "open"}
        with pytest.raises(d.CircuitOpen):
            await d.dispatch("t")


async def test_failures_outside_the_window_do_not_open_the_breaker(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script(["internal"] * 3)
    tool = d.Tool("t", handler, idempotent=True, retry=d.NO_RETRY, breaker=BREAKER)
    async with running(tool):
        for _ in range(3):
            with pytest.raises(d.InternalError):
                await d.dispatch("t")
            await trio.sleep(6.0)
        assert d.statistics().breakers == {"t": "closed"}


async def test_schema_and_not_found_errors_never_count_as_failures(
    autojump_clock: trio.abc.Clock,
) -> None:
    tool = d.Tool("add", Script(), ADD_SCHEMA, idempotent=True, breaker=BREAKER)
    async with running(tool):
        for _ in range(5):
            with pytest.raises(d.InvalidArguments):
                await d.dispatch("add", {"a": "x"})
        assert d.statistics().breakers.get("add", "closed") == "closed"
        assert (await d.dispatch("add", {"a": 1, "b": 2}))["run"] == 1


async def test_a_cancelled_probe_frees_the_probe_slot(autojump_clock: trio.abc.Clock) -> None:
    handler = Script(["internal"] * 3 + [10.0, "ok"])
    tool = d.Tool("t", handler, idempotent=True, retry=d.NO_RETRY, breaker=BREAKER)
    async with running(tool):
        for _ in range(3):
            with pytest.raises(d.InternalError):
                await d.dispatch("t")
        await trio.sleep(5.0)
        with trio.move_on_after(1.0):
            await d.dispatch("t")
        assert (await d.dispatch("t"))["run"] == 5
        assert d.statistics().breakers == {"t": "closed"}


async def _open_breaker() -> None:
    for _ in range(3):
        with pytest.raises(d.InternalError):
            await d.dispatch("t")
    await trio.sleep(BREAKER.cooldown)


async def test_gather_rejects_a_bad_key_with_a_configuration_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = Script()
    async with running(d.Tool("t", handler, idempotent=True)):
        with pytest.raises(d.ConfigurationError, match="idempotency_key"):
            await d.gather_bounded([d.Call("t", {}), d.Call("t", {}, idempotency_key="")])


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
