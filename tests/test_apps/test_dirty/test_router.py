"""The router never blocks on a worker start: STATUS is answered while a reload or a scale-up
waits for a new worker, and scaling requests queue behind the one in progress. Real worker
processes; a FIFO holds a new worker's start open (events, not sleeps)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import supervisors
from apps import dirty
from apps.dirty._context import ROUTER, WorkerUp
from apps.dirty._router import POOL
from apps.dirty._routes import Lane, relevel

from .conftest import ECHO, calls_in_flight

GATED = "tests.test_apps.test_dirty.dirty_apps:GatedApp"


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the gate FIFO goes (workers see it through ``DIRTY_TEST_GATE``)."""
    path = tmp_path / "gate"
    monkeypatch.setenv("DIRTY_TEST_GATE", str(path))
    return path


@asynccontextmanager
async def holding_a_worker_start(
    gate: Path, then: Callable[[], None] | None = None
) -> AsyncIterator[None]:
    """Inside the block, a worker start is under way and stays so: the next worker to start
    (after ``then()``, if given, which may bring one about) has opened the gate and waits in
    its app's ``init``. Leaving the block lets it finish (and later workers start freely)."""
    os.mkfifo(gate)
    if then is not None:
        then()
    with trio.fail_after(30):
        # Opening a FIFO for writing returns once its reader (the new worker) opened it.
        fd = await trio.to_thread.run_sync(os.open, gate, os.O_WRONLY, abandon_on_cancel=True)
    os.unlink(gate)
    try:
        yield
    finally:
        os.close(fd)


def _pids(status: dict[str, Any]) -> list[int]:
    return [w["pid"] for w in status["workers"]]


async def _wait_gone(client: dirty.DirtyClient, pids: set[int]) -> None:
    with trio.fail_after(20):
        while pids & set(_pids(await client.status_async())):
            await trio.sleep(0.05)


async def test_status_is_answered_while_a_reload_waits_for_its_new_worker(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    old = _pids(await client.status_async())
    assert len(old) == 1
    reloaded: list[Any] = []

    async def reload() -> None:
        reloaded.append(await otp.call(ROUTER, "reload", timeout=None))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reload)
        async with holding_a_worker_start(gate):
            # The reload is under way (its new worker is loading): the router still answers,
            # and the old worker still serves until its replacement is up.
            status = await client.status_async()
            assert _pids(status) == old and not status["workers"][0]["draining"]
            assert _pids(await otp.call(ROUTER, "status")) == old
            assert await client.execute_async(GATED, "pid") == old[0]
            assert reloaded == []
    assert reloaded == [{"success": True, "operation": "reload", "replaced": 1}]
    await _wait_gone(client, set(old))  # new workers first, then the old one drained
    [new] = _pids(await client.status_async())
    assert await client.execute_async(GATED, "pid") == new != old[0]
    await client.close_async()


async def test_scaling_requests_queue_behind_a_reload_and_status_is_answered_meanwhile(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    old = set(_pids(await client.status_async()))
    results: list[Any] = []

    async def request(what: Any) -> None:
        results.append(await otp.call(ROUTER, what, timeout=None))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, "reload")
        async with holding_a_worker_start(gate):
            nursery.start_soon(request, ("add", 1))
            await trio.testing.wait_all_tasks_blocked()
            # MANAGE (add) over the socket also waits its turn; STATUS does not.
            nursery.start_soon(trio.to_thread.run_sync, client.manage, "add", 1)
            status = await client.status_async()
            assert set(_pids(status)) == old and status["target_workers"] == 1
            assert results == []
    assert results[0] == {"success": True, "operation": "reload", "replaced": 1}
    assert results[1]["operation"] == "add" and results[1]["spawned"] == 1
    await _wait_gone(client, old)
    status = await client.status_async()
    assert status["worker_count"] == 3 and status["target_workers"] == 3
    await client.close_async()
    client.close()


async def test_status_is_answered_while_a_scale_up_waits_for_its_new_worker(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    added: list[Any] = []

    async def add() -> None:
        added.append(await trio.to_thread.run_sync(client.manage, "add", 1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(add)
        async with holding_a_worker_start(gate):
            assert (await client.status_async())["worker_count"] == 1
            assert added == []
    assert added[0]["spawned"] == 1 and added[0]["total_workers"] == 2
    assert (await client.status_async())["worker_count"] == 2
    await client.close_async()
    client.close()


async def test_a_worker_that_fails_to_start_ends_its_request_and_the_next_one_runs(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    gate.write_text("shut")  # new workers fail to load the app
    failed = await otp.call(ROUTER, ("add", 2), timeout=None)
    assert failed["spawned"] == 0 and not failed["success"]
    assert "a worker failed to start" in failed["reason"]
    reload = await otp.call(ROUTER, "reload", timeout=None)
    assert reload == {"success": False, "operation": "reload", "replaced": 0}
    status = await client.status_async()
    assert status["worker_count"] == 1 and status["target_workers"] == 1
    assert not status["workers"][0]["draining"]  # no replacement: the old worker stays
    gate.unlink()
    added = await trio.to_thread.run_sync(client.manage, "add", 1)
    assert added["spawned"] == 1 and added["total_workers"] == 2
    await client.close_async()
    client.close()


async def _settled(client: dirty.DirtyClient) -> dict[str, Any]:
    """The pool's status once no worker is draining and it holds as many workers as it should."""
    with trio.fail_after(20):
        while True:
            status = await client.status_async()
            live = [w for w in status["workers"] if not w["draining"]]
            if len(live) == status["worker_count"] == status["target_workers"]:
                return status
            await trio.sleep(0.05)


async def test_a_worker_that_dies_while_a_reload_replaces_it_is_not_brought_back(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    # The old worker dies while its replacement loads: its supervisor restarts it (workers are
    # permanent), and that restart must go too, or the pool ends up one worker over its size.
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    [old] = _pids(await client.status_async())
    reloaded: list[Any] = []

    async def reload() -> None:
        reloaded.append(await otp.call(ROUTER, "reload", timeout=None))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reload)
        async with holding_a_worker_start(gate):
            os.kill(old, signal.SIGKILL)
            await _wait_gone(client, {old})
    assert reloaded == [{"success": True, "operation": "reload", "replaced": 1}]
    # Answered once the pool supervisor is done with the death it saw while it started the new
    # worker (it restarts the killed one then).
    assert len(await supervisors.which_children(POOL)) >= 1
    status = await _settled(client)
    assert status["worker_count"] == 1
    [new] = _pids(status)
    assert new != old
    assert await client.execute_async(GATED, "pid") == new


async def test_a_worker_back_under_a_retired_id_is_drained_and_stopped(
    start_pool: Any, socket_path: str
) -> None:
    # What a supervisor's restart of a worker the pool has retired looks like to the router:
    # a WorkerUp under the retired id. It must never be routed to.
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    [retired] = [w["age"] for w in (await otp.call(ROUTER, "status"))["workers"]]
    assert (await otp.call(ROUTER, "reload", timeout=None))["replaced"] == 1

    async def idle() -> None:
        await otp.receive()

    ghost = otp.spawn(idle)
    otp.cast(ROUTER, WorkerUp(ghost, retired, (GATED,), 0, trio.current_time()))
    status = await otp.call(ROUTER, "status")  # (after the cast: same sender, in order)
    [entry] = [w for w in status["workers"] if w["pid"] == 0]  # (the ghost has no OS pid)
    assert entry["draining"] and status["app_workers"] == {GATED: 1}
    otp.exit(ghost, otp.KILL)
    client = dirty.DirtyClient(socket_path)
    status = await _settled(client)
    assert status["worker_count"] == 1 and retired not in [w["age"] for w in status["workers"]]


async def test_a_helper_that_dies_mid_start_fails_the_request_and_adds_no_worker(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    router = otp.whereis(ROUTER)
    assert router is not None
    added: list[Any] = []
    answered = trio.Event()

    async def add() -> None:
        added.append(await otp.call(ROUTER, ("add", 1), timeout=None))
        answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(add)
        async with holding_a_worker_start(gate):
            # The router's helper for this start: the process it spawned linked.
            helpers = [
                pid
                for pid in otp.processes()
                if (info := otp.process_info(pid)) is not None
                and info.parent == router
                and router in info.links
            ]
            assert len(helpers) == 1
            otp.exit(helpers[0], otp.KILL)
            with trio.fail_after(10):
                await answered.wait()  # (the router answers as soon as it sees the EXIT)
            assert added[0]["success"] is False and added[0]["spawned"] == 0
            assert "failed to start" in added[0]["reason"]
            assert (await client.status_async())["worker_count"] == 1  # answered meanwhile
    # The start went on without its helper; the worker it brought up is stopped.
    assert len(await supervisors.which_children(POOL)) >= 1
    status = await _settled(client)
    assert status["worker_count"] == 1 and status["target_workers"] == 1


# -- routing: least-loaded, calls waiting for a replacement, the router's helpers ------------


class _Worker:
    """What a lane sees of a worker actor."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inflight: dict[int, None] = {}
        self.lanes: tuple[Lane, ...] = ()
        self.load = 0

    def take(self) -> None:
        self.inflight[max(self.inflight, default=0) + 1] = None
        relevel(self)

    def finish(self) -> None:
        self.inflight.popitem()
        relevel(self)

    def __repr__(self) -> str:
        return self.name


def _lane(*workers: _Worker) -> Lane:
    lane = Lane(workers)
    for w in workers:
        w.lanes += (lane,)
    return lane


def test_a_lane_picks_the_least_loaded_worker_round_robin_among_equals() -> None:
    a, b, c = _Worker("a"), _Worker("b"), _Worker("c")
    lane = _lane(a, b, c)
    picked = []
    for _ in range(6):  # all idle, each call quick: round-robin
        w = lane.pick()
        picked.append(w)
        w.take()
        w.finish()
    assert picked == [a, b, c, a, b, c]
    a.take()  # a long call on a: the others take the next calls, in turn
    picked = []
    for _ in range(4):
        w = lane.pick()
        picked.append(w)
        w.take()
        w.finish()
    assert picked == [b, c, b, c]
    b.take()
    c.take()  # all at one call: round-robin again, from the one longest at that load
    assert lane.pick() is a
    a.finish()
    assert lane.pick() is a  # the least loaded, whoever's turn it was
    lane.discard(a)
    assert lane.pick() in (b, c) and lane.size == 2


def test_a_lane_always_picks_a_worker_at_the_lowest_load() -> None:
    rng = random.Random(16)
    workers = [_Worker(name) for name in "abcd"]
    lane = _lane(*workers)
    for _ in range(2000):
        w = rng.choice(workers)
        if w.inflight and rng.random() < 0.5:
            w.finish()
        else:
            lane.pick().take()
        assert lane.pick().load == min(len(w.inflight) for w in workers)


def test_an_app_with_one_worker_keeps_no_buckets() -> None:
    only = _Worker("only")
    lane = Lane([only])
    assert lane.pick() is only and not lane.buckets
    lane.discard(only)
    assert lane.pick() is None and Lane([]).pick() is None


async def test_calls_wait_while_the_apps_only_worker_is_replaced_and_then_run(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    # Issue 16.8: right after a worker is killed, calls for its app waited in no queue: they
    # failed with DirtyNoWorkersAvailableError until the replacement was up.
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    [old] = _pids(await client.status_async())
    answers: list[Any] = []

    async def call() -> None:
        try:
            answers.append(await client.execute_async(GATED, "pid"))
        except dirty.DirtyError as exc:
            answers.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            async with holding_a_worker_start(gate, lambda: os.kill(old, signal.SIGKILL)):
                # The replacement is loading (the old worker is gone): the calls wait for it.
                for _ in range(3):
                    nursery.start_soon(call)
                await trio.testing.wait_all_tasks_blocked(0.05)
                assert answers == []
    [new] = set(answers)
    assert new != old and len(answers) == 3
    await client.close_async()


async def test_the_router_takes_its_helpers_down_with_it(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    # Issue 16.13: a worker being retired was stopped by a process nothing linked or
    # supervised; the helper starting a worker is linked to the router. Both die with it.
    await start_pool(dirty_apps=[GATED, ECHO], dirty_workers=2, dirty_graceful_timeout=30)
    client = dirty.DirtyClient(socket_path)
    router = otp.whereis(ROUTER)
    assert router is not None

    async def busy() -> None:
        with contextlib.suppress(dirty.DirtyError):
            await client.execute_async(ECHO, "sleep", 8)

    async def add() -> None:
        with contextlib.suppress(otp.CallError):
            await otp.call(ROUTER, ("add", 1), timeout=None)

    async with trio.open_nursery() as nursery:
        for _ in range(2):  # both workers busy: the one retired drains for seconds
            nursery.start_soon(busy)
        with trio.fail_after(10):
            while await calls_in_flight() < 2:
                await trio.sleep(0.01)
        before = set(otp.processes())
        removed = await otp.call(ROUTER, ("remove", 1), timeout=None)
        assert removed["removed"] == 1
        await trio.testing.wait_all_tasks_blocked(0.05)
        stopping = set(otp.processes()) - before  # the helper stopping the retired worker
        assert stopping
        nursery.start_soon(add)  # its helper waits on the pool supervisor (busy stopping)
        info = otp.process_info(router)
        assert info is not None
        parent = info.parent
        with trio.fail_after(10):
            while not set(_links(router)) - stopping - {parent}:
                await trio.sleep(0.01)
        helpers = (set(_links(router)) | stopping) - {parent}
        otp.exit(router, otp.KILL)
        with trio.fail_after(2):  # (the retired worker drains for 8 s)
            while any(otp.process_info(pid) is not None for pid in helpers):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await client.close_async()


def _links(pid: otp.Pid) -> tuple[otp.Pid, ...]:
    info = otp.process_info(pid)
    return info.links if info is not None else ()


async def test_manage_add_is_capped_at_dirty_max_workers_and_answered_with_the_clamped_count(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1, dirty_max_workers=2)
    client = dirty.DirtyClient(socket_path)
    added = await trio.to_thread.run_sync(client.manage, "add", 1_000_000)
    assert added["requested"] == 1_000_000 and added["spawned"] == 1 and added["success"]
    assert added["total_workers"] == added["target_workers"] == 2
    assert added["reason"] == "the pool is capped at dirty_max_workers=2 worker(s)"
    again = await otp.call(ROUTER, ("add", 1), timeout=None)  # (SIGTTIN's request)
    assert again["spawned"] == 0 and again["total_workers"] == 2
    await client.close_async()
    client.close()


async def test_a_remove_is_not_stuck_behind_a_huge_add_the_latest_request_wins(
    start_pool: Any, socket_path: str, gate: Path
) -> None:
    await start_pool(dirty_apps=[GATED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    results: dict[str, Any] = {}

    async def request(what: Any) -> None:
        results[what[0]] = await otp.call(ROUTER, what, timeout=None)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(request, ("add", 1_000_000))
            async with holding_a_worker_start(gate):  # the add's first worker is loading
                nursery.start_soon(request, ("remove", 1))
                await trio.testing.wait_all_tasks_blocked()
                assert results == {}
    # The add stopped after the worker it was starting; the remove then ran.
    assert results["add"]["spawned"] == 1 and results["add"]["requested"] == 1_000_000
    assert results["add"]["reason"] == "cut short by a later remove"
    assert results["remove"]["removed"] == 1 and results["remove"]["target_workers"] == 1
    status = await _settled(client)
    assert status["worker_count"] == 1 and status["target_workers"] == 1
    await client.close_async()
