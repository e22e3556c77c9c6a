"""The pool end to end in one node: real worker processes; our clients, sync and async."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
from typing import Any

import pytest
import trio
import trio.testing

from apps import dirty
from apps.dirty._client_sync import _SyncConn

from .conftest import ECHO, LIMITED, calls_in_flight


async def test_execute_sync_client_from_a_thread(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)
    assert await trio.to_thread.run_sync(client.execute, ECHO, "add", 40, 2) == 42
    client.close()


async def test_app_errors_arrive_typed_with_traceback(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)
    with pytest.raises(dirty.DirtyAppError) as info:
        await client.execute_async(ECHO, "fail", "kaput")
    assert info.value.message == "kaput" and info.value.action == "fail"
    assert "RuntimeError: kaput" in (info.value.traceback or "")
    with pytest.raises(dirty.DirtyAppError, match="Unknown action: _private"):
        await client.execute_async(ECHO, "_private")
    with pytest.raises(dirty.DirtyAppNotFoundError, match=r"Dirty app not found: no\.such:App"):
        await client.execute_async("no.such:App", "x")
    # Gunicorn answers an unknown app with DirtyNoWorkersAvailableError: code catching that
    # catches ours too (issue 16.9).
    with pytest.raises(dirty.DirtyNoWorkersAvailableError) as unknown:
        await client.execute_async("no.such:App", "x")
    assert isinstance(unknown.value, dirty.DirtyAppNotFoundError)
    assert unknown.value.app_path == "no.such:App"
    assert await client.execute_async(ECHO, "async_add", 2, 3) == 5
    await client.close_async()


async def test_streams_sync_and_async_generators(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)
    assert [x async for x in client.stream_async(ECHO, "count", 5)] == [0, 1, 2, 3, 4]
    assert [x async for x in client.stream_async(ECHO, "acount", 3)] == [0, 1, 2]
    got = []
    with pytest.raises(dirty.DirtyAppError, match="broke mid-stream"):
        async for x in client.stream_async(ECHO, "fail_midway", 2):
            got.append(x)
    assert got == [0, 1]
    sync = await trio.to_thread.run_sync(lambda: list(client.stream(ECHO, "count", 1000)))
    assert sync == list(range(1000))
    await client.close_async()


async def test_abandoned_stream_stops_the_generator_and_client_stays_usable(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)

    def abandon() -> None:
        for i in client.stream(ECHO, "endless", "sync"):
            if i == 3:
                break
        assert client.execute(ECHO, "echo", "next") == "next"

    await trio.to_thread.run_sync(abandon)
    async for i in client.stream_async(ECHO, "endless", "async"):
        if i == 3:
            break
    assert await client.execute_async(ECHO, "echo", "after") == "after"
    with trio.fail_after(5):
        while not await client.execute_async(ECHO, "was_stopped", "sync") or not (
            await client.execute_async(ECHO, "was_stopped", "async")
        ):
            await trio.sleep(0.01)
    await client.close_async()
    client.close()


async def test_many_calls_in_flight_on_one_async_client(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=2, dirty_threads=4)
    client = dirty.DirtyClient(socket_path)
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        results[i] = await client.execute_async(ECHO, "add", i, 1000)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(one, i)
    assert results == {i: i + 1000 for i in range(50)}
    await client.close_async()


async def test_one_sync_client_shared_by_threads(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=2, dirty_threads=2)
    client = dirty.DirtyClient(socket_path)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(30):
                assert client.execute(ECHO, "echo", [n, i]) == [n, i]
            assert list(client.stream(ECHO, "count", 20)) == list(range(20))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def run() -> None:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    await trio.to_thread.run_sync(run)
    assert errors == []
    client.close()


async def test_threads_give_parallelism_in_one_worker(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(client.execute_async, ECHO, "sleep", 0.3)
    assert trio.current_time() - start < 1.0  # four 0.3 s calls at once, not one after another
    await client.close_async()


async def test_round_robin_and_per_app_limits(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[ECHO, LIMITED], dirty_workers=3)
    client = dirty.DirtyClient(socket_path)
    pids = {await client.execute_async(ECHO, "pid") for _ in range(9)}
    assert len(pids) == 3
    limited = {await client.execute_async(LIMITED, "pid") for _ in range(6)}
    assert len(limited) == 1
    status = await client.status_async()
    assert status["worker_count"] == 3 and status["arbiter_pid"] == os.getpid()
    assert sorted(len(w["apps"]) for w in status["workers"]) == [1, 1, 2]
    await client.close_async()


async def test_requests_alternating_apps_and_actions_on_one_connection_each_go_their_way(
    start_pool: Any, socket_path: str
) -> None:
    # A connection keeps the route bytes of the last request it read: the next request takes
    # that route only if it opens with the same bytes (another app or action never does).
    await start_pool(dirty_apps=[ECHO, LIMITED], dirty_workers=3)
    client = dirty.DirtyClient(socket_path)
    limited = set()
    for i in range(6):
        assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", i) == i
        assert await trio.to_thread.run_sync(client.execute, ECHO, "add", i, 1) == i + 1
        limited.add(await trio.to_thread.run_sync(client.execute, LIMITED, "pid"))
    assert len(limited) == 1
    client.close()


async def test_a_long_call_on_one_worker_does_not_hold_up_calls_while_another_is_idle(
    start_pool: Any, socket_path: str
) -> None:
    # Issue 16.5: round-robin sent every other call to the worker busy with the long one.
    await start_pool(dirty_workers=2, dirty_threads=1)
    client = dirty.DirtyClient(socket_path)
    async with trio.open_nursery() as nursery:

        async def long_call() -> None:
            with contextlib.suppress(dirty.DirtyError):
                await client.execute_async(ECHO, "sleep", 10)

        nursery.start_soon(long_call)
        with trio.fail_after(10):
            while not await calls_in_flight():
                await trio.sleep(0.01)
        with trio.fail_after(5):  # (the long call holds its worker for 10 s)
            pids = {await client.execute_async(ECHO, "pid") for _ in range(6)}
        assert len(pids) == 1
        nursery.cancel_scope.cancel()
    await client.close_async()


async def test_client_timeout_raises_dirty_timeout_error(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path, timeout=0.2)
    with pytest.raises(dirty.DirtyTimeoutError):
        await client.execute_async(ECHO, "sleep", 1.0)
    with pytest.raises(dirty.DirtyTimeoutError):
        await trio.to_thread.run_sync(client.execute, ECHO, "sleep", 1.0)
    client.timeout = 5
    assert await client.execute_async(ECHO, "echo", 1) == 1
    await client.close_async()
    client.close()


@pytest.mark.parametrize("poll", [True, False], ids=["poll", "no-poll"])
async def test_a_read_gives_up_at_the_reading_calls_own_deadline(
    start_pool: Any, socket_path: str, poll: bool
) -> None:
    # The reading thread waits in poll for input, bounded by its call's time left; where there
    # is no poll, it blocks in recv bounded by SO_RCVTIMEO: once a call with a long timeout
    # has set that, a call with a short one must lower it, not wait for the reply.
    await start_pool()
    client = dirty.DirtyClient(socket_path, timeout=30)
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", 1) == 1
    conn = client._sync
    assert conn is not None and (conn.poller is not None) == hasattr(select, "poll")
    if not poll:
        conn.poller = None  # (as on a platform without select.poll)
        assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", 1) == 1
    client.timeout = 0.3
    t0 = trio.current_time()
    with pytest.raises(dirty.DirtyTimeoutError):
        await trio.to_thread.run_sync(client.execute, ECHO, "sleep", 3.0)
    assert trio.current_time() - t0 < 2.5  # (not the 3 s the action takes)
    # (poll's wait is bounded by itself: the socket's option is never set)
    assert (conn.rcvtimeo is None) == poll
    client.timeout = 30
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", 2) == 2
    assert client._sync is conn
    client.close()


def test_bound_reads_changes_the_socket_option_only_when_it_is_off() -> None:
    a, b = socket.socketpair()
    try:
        conn = _SyncConn(a)

        def option() -> float:
            sec, usec = struct.unpack("ll", a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
            return sec + usec / 1e6

        assert conn.rcvtimeo is None and option() == 0
        conn.bound_reads(30)
        assert conn.rcvtimeo == 30 and option() == pytest.approx(30, abs=0.01)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 7, 0))
        conn.bound_reads(29.999)  # within the slack: left as it is (no system call)
        assert conn.rcvtimeo == 30 and option() == pytest.approx(7, abs=0.01)
        conn.bound_reads(0.25)
        assert conn.rcvtimeo == 0.25 and option() == pytest.approx(0.25, abs=0.01)
        conn.bound_reads(-1)  # a deadline already past: the shortest bound, never "forever"
        assert conn.rcvtimeo == 0.001 and 0 < option() <= 0.005
    finally:
        a.close()
        b.close()


async def test_missing_socket_is_a_connection_error(tmp_path: Any) -> None:
    client = dirty.DirtyClient(str(tmp_path / "none.sock"))
    with pytest.raises(dirty.DirtyConnectionError, match="cannot connect"):
        client.execute(ECHO, "echo", 1)


async def test_stash_operations(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)

    def ops() -> None:
        assert "echo_table" in s.tables()  # declared by EchoApp.stashes
        s.put("t", "user:1", {"name": "a"})
        s.put("t", "user:2", [1, 2])
        s.put("t", "other", 3)
        assert s.get("t", "user:1") == {"name": "a"}
        assert s.get("t", "missing", "dflt") == "dflt"
        assert s.get("nope", "k", 7) == 7
        assert sorted(s.keys("t", "user:*")) == ["user:1", "user:2"]
        assert s.exists("t") and s.exists("t", "other") and not s.exists("t", "x")
        assert s.info("t") == {"size": 3, "table": "t"}
        assert s.delete("t", "other") and not s.delete("t", "other")
        table = s.table("t")
        table["k"] = "v"
        assert table["k"] == "v" and "k" in table and len(table) == 3
        with pytest.raises(dirty.StashKeyNotFoundError):
            table["missing"]
        assert s.update_counter("c", "hits") == 1
        assert s.update_counter("c", "hits", 5) == 6
        assert s.insert_new("c", "once", 1) and not s.insert_new("c", "once", 2)
        assert s.compare_and_set("c", "once", 1, 10)
        assert not s.compare_and_set("c", "once", 1, 11)
        assert s.compare_and_set("c", "new", dirty.stash.ABSENT, "x")
        assert s.get("c", "once") == 10
        s.clear("t")
        assert s.keys("t") == []
        assert s.delete_table("t") and "t" not in s.tables()
        with pytest.raises(dirty.StashTableNotFoundError):
            s.info("t")

    await trio.to_thread.run_sync(ops)
    client.close()


async def test_stash_ttl_expires_entries(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)
    await trio.to_thread.run_sync(lambda: s.put("ttl", "k", 1, ttl=0.2))
    assert await trio.to_thread.run_sync(s.get, "ttl", "k") == 1
    await trio.sleep(0.3)
    assert await trio.to_thread.run_sync(s.get, "ttl", "k", "gone") == "gone"
    client.close()


async def test_manage_adds_and_removes_workers_never_below_n(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:2"], dirty_workers=2)
    client = dirty.DirtyClient(socket_path)
    added = await trio.to_thread.run_sync(client.manage, "add", 1)
    assert added["spawned"] == 1 and added["total_workers"] == 3
    removed = await trio.to_thread.run_sync(client.manage, "remove", 2)
    assert removed["removed"] == 1 and "never shrinks below 2" in removed["reason"]
    with trio.fail_after(10):
        while (await client.status_async())["worker_count"] != 2:
            await trio.sleep(0.05)
    assert len({await client.execute_async(LIMITED, "pid") for _ in range(6)}) == 2
    await client.close_async()
    client.close()


async def test_large_bytes_round_trip_sync_and_async(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    blob = bytes(range(256)) * 4096  # 1 MiB, sent and answered by reference
    nested = {"k": [b"x" * 70000, 1]}
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", blob) == blob
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", nested) == nested
    assert await client.execute_async(ECHO, "echo", blob) == blob
    got = await trio.to_thread.run_sync(lambda: list(client.stream(ECHO, "count", 3)))
    assert got == [0, 1, 2]  # the connection is still in step after the large frames
    client.close()
    await client.close_async()


async def test_quick_actions_run_inline_but_never_beyond_dirty_threads(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=1)
    client = dirty.DirtyClient(socket_path)
    for _ in range(5):  # quick: from now on it runs on the worker's loop
        assert await client.execute_async(ECHO, "track", 0) == 1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.execute_async, ECHO, "track", 0.3)
        await trio.sleep(0.1)
        for _ in range(3):  # while the thread runs, the quick call waits its turn
            assert await client.execute_async(ECHO, "track", 0) == 1
    await client.close_async()


async def test_threads_sharing_a_client_time_out_alone(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=2, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=0.5)
    outcomes: list[Any] = []

    def slow() -> None:
        try:
            client.execute(ECHO, "sleep", 2.0)
        except dirty.DirtyTimeoutError as exc:
            outcomes.append(exc)

    def quick() -> None:
        for i in range(50):
            assert client.execute(ECHO, "echo", i) == i
        outcomes.append("quick done")

    def run() -> None:
        threads = [threading.Thread(target=f) for f in (slow, quick, quick)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)

    await trio.to_thread.run_sync(run)
    assert outcomes.count("quick done") == 2
    assert any(isinstance(o, dirty.DirtyTimeoutError) for o in outcomes)
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", "after") == "after"
    client.close()


async def test_a_cancelled_reading_task_hands_the_reading_to_another(
    start_pool: Any, socket_path: str
) -> None:
    # trio: one waiting task reads for all. Cancelling it must pass the role to another
    # waiting call, which would otherwise sleep until its own timeout.
    await start_pool(dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=30)
    first = trio.CancelScope()
    got: list[Any] = []

    async def reading() -> None:
        with first:
            await client.execute_async(ECHO, "sleep", 5.0)

    async def waiting() -> None:
        got.append(await client.execute_async(ECHO, "sleep", 0.2))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reading)
            await trio.testing.wait_all_tasks_blocked()  # its call is out; it reads
            nursery.start_soon(waiting)
            await trio.testing.wait_all_tasks_blocked()  # its call is out; it sleeps
            first.cancel()
    assert got == [0.2]
    assert await client.execute_async(ECHO, "echo", "after") == "after"
    await client.close_async()
