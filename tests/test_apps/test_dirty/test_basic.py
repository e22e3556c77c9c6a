"""The pool end to end: real worker processes, our async client on trio."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import trio

import supervisors
from apps import dirty

from .conftest import ECHO, calls_in_flight


async def test_execute_returns_the_result(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(ECHO, "echo", {"a": [1, 2.5, b"x", None]}) == {
        "a": [1, 2.5, b"x", None]
    }
    assert await client.execute_async(ECHO, "add", 1, b=2) == 3
    await client.close_async()


CALL = "tests.test_apps.test_dirty.dirty_apps:CallApp"


async def test_a_custom_call_may_return_coroutines_generators_and_values(
    start_pool: Any, socket_path: str
) -> None:
    """Sync actions run and reply from a worker thread; what they return that needs the
    worker's event loop (a coroutine, an async generator) is finished there."""
    await start_pool(dirty_apps=[CALL], dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(CALL, "plain", 1, "a") == ["plain", [1, "a"]]
    assert await client.execute_async(CALL, "coro", 5) == ["coro", 5]
    assert [x async for x in client.stream_async(CALL, "agen", 4)] == [0, 1, 2, 3]
    assert [x async for x in client.stream_async(CALL, "gen", 3)] == [0, 1, 2]
    try:
        await client.execute_async(CALL, "fail")
    except dirty.DirtyAppError as exc:
        assert "custom call failed" in str(exc)
    else:
        raise AssertionError("no DirtyAppError")
    await client.close_async()


async def test_the_observer_view_shows_workers_calls_in_flight_and_stash_tables(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=1)
    streaming = dirty.DirtyClient(socket_path)
    waiting = dirty.DirtyClient(socket_path)
    stream = streaming.stream_async(ECHO, "endless", "observed").__aiter__()
    assert await stream.__anext__() == 0

    async def view() -> dict[str, Any]:
        (app,) = await supervisors.observe()
        assert app.name == "dirty" and app.view is not None
        return app.view

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting.execute_async, ECHO, "sleep", 0)
        with trio.fail_after(10):
            # The worker actor takes the second call when the connection reads it: no event
            # tells that, so look until it shows.
            while (await view())["workers"][0]["in_flight"] < 2:
                await trio.sleep(0.01)
        (worker,) = (await view())["workers"]
        assert worker["apps"] == [ECHO]
        assert worker["waiting_for_thread"] == 1
        assert worker["os_pid"] == (await streaming.status_async())["workers"][0]["pid"]
        assert worker["draining"] is False
        await stream.aclose()  # (the sleep gets the thread and returns)
    await streaming.stash_request_async(1, "observed_table", "k", [1, 2])  # put
    await streaming.stash_request_async(1, "observed_table", "j", 3)
    final = await view()
    assert final["stash_tables"] == {"echo_table": 0, "observed_table": 2}  # (EchoApp declares one)
    assert final["parked"] == {}
    assert final["workers"][0]["last_heartbeat"] is not None
    await streaming.close_async()
    await waiting.close_async()


async def test_the_observer_view_counts_calls_errors_by_kind_and_latency(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)

    async def calls() -> dict[str, Any]:
        (app,) = await supervisors.observe()
        assert app.view is not None
        return app.view["calls"]

    assert (await calls())["total"] == 0
    for i in range(3):
        assert await client.execute_async(ECHO, "echo", i) == i
    assert [x async for x in client.stream_async(ECHO, "count", 2)] == [0, 1]
    with pytest.raises(dirty.DirtyAppError):
        await client.execute_async(ECHO, "fail", "boom")
    got = await calls()
    assert got["total"] == 5  # (a stream is one call, ended by its END)
    assert got["errors"] == {"DirtyAppError": 1}
    latency = got["latency_seconds"]
    assert latency["count"] == 5 and latency["sum"] > 0
    les = [le for le, _ in latency["buckets"]]
    counts = [n for _, n in latency["buckets"]]
    assert les == sorted(les) and counts == sorted(counts)  # cumulative, by bound
    assert counts[-1] <= 5
    json.dumps(got, allow_nan=False)  # (served as JSON: no infinity)
    await client.close_async()


async def test_calls_the_pool_fails_are_counted_by_their_error(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    [worker] = (await client.status_async())["workers"]
    failed: list[BaseException] = []

    async def long_call() -> None:
        try:
            await client.execute_async(ECHO, "sleep", 30)
        except dirty.DirtyError as exc:
            failed.append(exc)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_call)
            while not await calls_in_flight():
                await trio.sleep(0.01)
            os.kill(worker["pid"], signal.SIGKILL)
    assert [type(e) for e in failed] == [dirty.DirtyWorkerError]
    (app,) = await supervisors.observe()
    assert app.view is not None
    assert app.view["calls"]["total"] == 1
    assert app.view["calls"]["errors"] == {"DirtyWorkerError": 1}
    await client.close_async()


async def test_the_pool_is_ready_when_every_app_has_a_worker(start_pool: Any) -> None:
    await start_pool(dirty_apps=[ECHO], dirty_workers=1)
    assert await supervisors.check_readiness(["dirty"]) == {}
    (app,) = await supervisors.observe()
    assert app.view is not None
    os.kill(app.view["workers"][0]["os_pid"], signal.SIGKILL)
    # The router drops the dead worker's route when its port's exit reaches it, and the pool
    # starts another: no event tells either, so look until each shows.
    with trio.fail_after(10):
        while not (waiting := await supervisors.check_readiness(["dirty"])):
            await trio.sleep(0.01)
    assert waiting == {"dirty": f"no worker serves {ECHO} yet"}
    with trio.fail_after(30):
        while await supervisors.check_readiness(["dirty"]):
            await trio.sleep(0.05)
