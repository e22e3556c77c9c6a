"""The observer's sampler: rates of messages, restarts and dirty calls each second into a
bounded ring, on trio's virtual clock; and the pure step between two readings."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import otp
import supervisors
from otp.node._sampler import SAMPLER_NAME, SERIES, Counters, Sampler, step
from supervisors import ChildSpec


class Worker(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(state, state)


DEMO = supervisors.Application(
    "demo", (supervisors.SupFlags(intensity=5), [ChildSpec("worker", Worker)])
)


async def _sink() -> None:
    while True:
        await otp.receive(lambda m: True)


async def series() -> dict[str, Any]:
    return dict(await otp.call(SAMPLER_NAME, "series"))


def _histogram(count: int, total: float, buckets: list[tuple[float, int]]) -> dict[str, Any]:
    return {"buckets": [list(b) for b in buckets], "sum": total, "count": count}


async def test_the_sampler_shows_messages_and_restarts_per_second(autojump_clock: Any) -> None:
    async with otp.open_node():
        await supervisors.start_application(DEMO)
        await Sampler.start_link(1.0, 600, name=SAMPLER_NAME)
        sink = otp.spawn(_sink)
        for n in range(50):
            otp.send(sink, n)
        await trio.sleep(1.5)
        root = supervisors.application_supervisor("demo")
        [(_, worker, _, _)] = await supervisors.which_children(root)
        otp.monitor(worker)
        otp.exit(worker, otp.KILL)
        await otp.receive(otp.Down)
        await trio.sleep(2)
        got = await series()
        assert got["interval"] == 1.0 and got["window"] == 600
        assert len(got["t"]) == 3 and set(got["series"]) == set(SERIES)
        assert got["t"] == sorted(got["t"]) and got["now"] >= got["t"][-1]
        assert got["series"]["messages_per_second"][0] >= 50
        assert got["series"]["restarts_per_second"] == [0.0, 1.0, 0.0]
        # no dirty pool here: its series say nothing rather than 0
        assert got["series"]["dirty_calls_per_second"] == [None, None, None]
        await supervisors.stop_all_applications()


async def test_the_ring_keeps_only_the_window(autojump_clock: Any) -> None:
    async with otp.open_node():
        await Sampler.start_link(1.0, 5, name=SAMPLER_NAME)
        await trio.sleep(20.5)
        got = await series()
        assert len(got["t"]) == 5
        assert all(len(values) == 5 for values in got["series"].values())
        assert got["t"][-1] - got["t"][0] == 4.0


async def test_dirty_calls_and_latency_come_from_the_pools_calls_view(
    autojump_clock: Any,
) -> None:
    calls: dict[str, Any] = {
        "total": 0,
        "errors": {},
        "latency_seconds": _histogram(0, 0.0, [(0.01, 0), (0.1, 0), (1.0, 0), (float("inf"), 0)]),
    }
    dirty = supervisors.Application(
        "dirty", (supervisors.SupFlags(), []), observer_view=lambda: {"calls": calls}
    )
    async with otp.open_node():
        await supervisors.start_application(dirty)
        await Sampler.start_link(1.0, 600, name=SAMPLER_NAME)
        await trio.sleep(0.5)
        # 100 calls in the next second: 98 under 10 ms, 2 under 100 ms; 3 failed
        calls.update(
            total=100,
            errors={"DirtyTimeoutError": 1, "DirtyAppError": 2},
            latency_seconds=_histogram(
                100, 0.5, [(0.01, 98), (0.1, 100), (1.0, 100), (float("inf"), 100)]
            ),
        )
        await trio.sleep(1)
        got = (await series())["series"]
        assert got["dirty_calls_per_second"] == [100.0]
        assert got["dirty_errors_per_second"] == [3.0]
        assert got["dirty_latency_mean_seconds"] == [0.005]
        assert got["dirty_latency_p99_seconds"] == [0.1]
        await trio.sleep(1)  # no call in this second: no latency to show
        got = (await series())["series"]
        assert got["dirty_calls_per_second"][-1] == 0.0
        assert got["dirty_latency_mean_seconds"][-1] is None
        await supervisors.stop_all_applications()


async def test_a_dirty_pool_without_call_counters_has_no_dirty_series(
    autojump_clock: Any,
) -> None:
    dirty = supervisors.Application(
        "dirty", (supervisors.SupFlags(), []), observer_view=lambda: {"workers": []}
    )
    async with otp.open_node():
        await supervisors.start_application(dirty)
        await Sampler.start_link(1.0, 600, name=SAMPLER_NAME)
        await trio.sleep(2.5)
        got = (await series())["series"]
        assert got["dirty_calls_per_second"] == [None, None]
        assert got["dirty_latency_p99_seconds"] == [None, None]
        await supervisors.stop_all_applications()


counts = st.integers(min_value=0, max_value=10_000)


@settings(deadline=None)  # (a loaded machine's pauses are no failure here)
@given(
    handled=st.tuples(
        st.dictionaries(st.integers(0, 20), counts), st.dictionaries(st.integers(0, 20), counts)
    ),
    restarts=st.tuples(counts, counts),
    totals=st.tuples(counts, counts),
    elapsed=st.floats(min_value=0.001, max_value=100),
)
def test_a_step_never_shows_a_negative_rate(
    handled: tuple[dict[int, int], dict[int, int]],
    restarts: tuple[int, int],
    totals: tuple[int, int],
    elapsed: float,
) -> None:
    """Processes die (taking their counts) and applications restart (their supervisors count
    from 0 again): no rate goes below 0, whatever the two readings."""
    readings = [
        Counters(
            time=at,
            handled=dict(by_pid),  # (ints stand for pids: step only compares them)
            restarts=n,
            dirty={"total": total, "errors": {}, "latency_seconds": _histogram(total, 0.0, [])},
        )
        for at, by_pid, n, total in zip((0.0, elapsed), handled, restarts, totals, strict=True)
    ]
    point = step(*readings)
    assert all(point[name] is None or point[name] >= 0 for name in SERIES)
