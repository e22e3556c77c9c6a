"""Concurrency limits: the dispatcher's slots, each tool's limit, and sync handlers whose
threads hold a slot until they end."""

from __future__ import annotations

import math
import threading

import pytest
import trio
import trio.testing

from apps import dispatcher as d
from apps.dispatcher._attempt import _Slots

from .helpers import Gauge, Script, running


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
