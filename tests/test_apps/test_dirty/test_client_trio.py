"""The async client on trio: cancellation in every state, concurrent first calls, closing,
reconnecting after a pool restart."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

from apps import dirty
from apps.dirty._protocol import REQUEST, RESPONSE
from wire import FrameSplitter, reply_parts, request_parts

from .conftest import ECHO
from .helpers import BOUND, EchoPool, StallingPool


async def test_trio_cancel_mid_send_does_not_desync_the_connection(fake_pool: Any) -> None:
    pool = fake_pool(stall_first=True)
    client = dirty.DirtyClient(pool.path, timeout=2)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.execute_async, "x:App", "echo", b"\x01" * (32 << 20))
            await trio.to_thread.run_sync(pool.started.wait, BOUND)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    pool.gate.set()
    try:
        with trio.fail_after(5):
            assert await client.execute_async("x:App", "echo", "after") == "after"
    finally:
        await client.close_async()


async def test_trio_concurrent_first_calls_share_one_connection_that_close_async_closes(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=20)
    probe = dirty.DirtyClient(socket_path, timeout=20)
    outcomes: list[Any] = []
    all_out = trio.Event()

    async def call() -> None:
        try:
            outcomes.append(await client.execute_async(ECHO, "track", 1.5))
        except dirty.DirtyError as exc:
            outcomes.append(exc)
        if len(outcomes) == 3:
            all_out.set()

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(call)
        with trio.fail_after(BOUND):
            while await probe.execute_async(ECHO, "track", 0) < 4:  # the three run
                await trio.sleep(0.01)
        await client.close_async()
        with trio.move_on_after(1):
            await all_out.wait()
        nursery.cancel_scope.cancel()
    await probe.close_async()
    assert len(outcomes) == 3
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in outcomes), outcomes


async def test_trio_cancellation_in_each_state_then_reuse(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=10)

    async def call() -> None:
        await client.execute_async(ECHO, "sleep", 1.5)

    streaming = trio.Event()

    async def stream() -> None:
        async for i in client.stream_async(ECHO, "endless", "trio_cancelled"):
            if i == 2:
                streaming.set()

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)  # reads for all
            nursery.start_soon(call)  # sleeps as a follower
            nursery.start_soon(stream)  # mid-stream
            await streaming.wait()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert await client.execute_async(ECHO, "echo", "after") == "after"
        got = [x async for x in client.stream_async(ECHO, "count", 3)]
        assert got == [0, 1, 2]
        while not await client.execute_async(ECHO, "was_stopped", "trio_cancelled"):
            await trio.sleep(0.01)
    await client.close_async()


async def test_trio_close_async_fails_calls_in_flight_at_once(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=20)
    outcomes: list[Any] = []

    async def call() -> None:
        try:
            outcomes.append(await client.execute_async(ECHO, "sleep", 1.5))
        except dirty.DirtyError as exc:
            outcomes.append(exc)

    await client.connect_async()
    with trio.fail_after(1):  # the calls take 1.5 s
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()  # both sent: one reads, one sleeps
            await client.close_async()
    assert len(outcomes) == 2
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in outcomes), outcomes
    assert await client.execute_async(ECHO, "echo", "again") == "again"
    await client.close_async()


async def test_a_trio_connection_is_closed_when_a_later_trio_run_replaces_it(
    echo_pool: EchoPool,
) -> None:
    # A CLI or test suite calling trio.run more than once with one client.
    client = dirty.DirtyClient(echo_pool.path)
    conns: list[Any] = []

    async def command() -> None:
        assert await client.execute_async(ECHO, "echo", len(conns)) == len(conns)
        conns.append(client._async)

    await trio.to_thread.run_sync(trio.run, command)
    await trio.to_thread.run_sync(trio.run, command)
    first, second = conns
    try:
        assert first is not second
        assert first.stream.socket.fileno() == -1, "the ended run's socket is still open"
    finally:
        first.stream.socket.close()
        await client.close_async()


async def test_trio_execute_async_send_is_bounded_by_the_client_timeout(
    stalling_pool: Callable[..., StallingPool], autojump_clock: trio.testing.MockClock
) -> None:
    pool = stalling_pool()
    client = dirty.DirtyClient(pool.path, timeout=2)
    outcome: list[Any] = []
    with trio.move_on_after(60):
        try:
            await client.execute_async("x:App", "echo", b"\x01" * (8 << 20))
        except dirty.DirtyError as exc:
            outcome.append(exc)
    try:
        assert outcome, "the send outlived the client's timeout"
        assert isinstance(outcome[0], dirty.DirtyTimeoutError), outcome
    finally:
        await client.close_async()


async def test_a_cancelled_trio_call_does_not_wait_for_another_tasks_send(
    stalling_pool: Callable[..., StallingPool],
) -> None:
    first = sum(len(bytes(p)) for p in request_parts(1, "x:App", "hold", (1,), {}))
    pool = stalling_pool(first)  # takes the first request whole, then stops reading
    client = dirty.DirtyClient(pool.path, timeout=30)
    finished = trio.Event()
    scope = trio.CancelScope()

    async def view() -> None:  # a request whose HTTP client went away
        with scope:
            await client.execute_async("x:App", "hold", 1)
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(view)
        await trio.testing.wait_all_tasks_blocked()  # sent, reading its reply
        nursery.start_soon(client.execute_async, "x:App", "echo", b"\x01" * (8 << 20))
        await trio.testing.wait_all_tasks_blocked()  # the upload is blocked mid-send
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        cancelled_at_once = finished.is_set()
        nursery.cancel_scope.cancel()
    await client.close_async()
    assert cancelled_at_once, "the cancelled call is still waiting for the other's send"


class TrioScriptedPool:
    """A one-connection pool inside the test's trio run: it records the request ids it reads
    and answers only when the test says, with a plain non-blocking send (no checkpoint), so a
    reply and a cancellation can happen in one scheduling step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.server.setblocking(False)
        self.conn: socket.socket | None = None
        self.rids: list[int] = []
        self.got = trio.Condition()

    async def serve(self) -> None:
        await trio.lowlevel.wait_readable(self.server)
        self.conn, _ = self.server.accept()
        self.conn.setblocking(False)
        splitter = FrameSplitter()
        while True:
            await trio.lowlevel.wait_readable(self.conn)
            data = self.conn.recv(65536)
            if not data:
                return
            for mtype, rid, _ in splitter.feed(data):
                if mtype == REQUEST:
                    self.rids.append(rid)
            async with self.got:
                self.got.notify_all()

    async def wait_requests(self, n: int) -> None:
        async with self.got:
            while len(self.rids) < n:
                await self.got.wait()

    def reply(self, rid: int, value: Any) -> None:
        assert self.conn is not None
        self.conn.sendall(b"".join(bytes(p) for p in reply_parts(RESPONSE, rid, value)))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


async def test_a_cancelled_trio_follower_does_not_take_the_reading_role_with_it(
    tmp_path: Path,
) -> None:
    # Three views share a client on a trio server (hypercorn --worker-class trio): one reads
    # for all; a second's HTTP client goes away just as the first's reply comes in; the third
    # must still get its reply. (Which of the two woken tasks runs first is trio's random
    # pick, so the scenario is repeated: each round has an even chance.)
    pool = TrioScriptedPool(str(tmp_path / "scripted.sock"))
    client = dirty.DirtyClient(pool.path, timeout=30)
    stuck_rounds = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.serve)
        for round_ in range(30):
            base = len(pool.rids)
            scope = trio.CancelScope()
            reader_done, last_done = trio.Event(), trio.Event()

            async def call(done: trio.Event, value: int = round_) -> None:
                await client.execute_async("x:App", "echo", value)
                done.set()

            async def cancelled(scope: trio.CancelScope = scope, value: int = round_) -> None:
                with scope:
                    await client.execute_async("x:App", "echo", value)

            nursery.start_soon(call, reader_done)  # reads for all
            await pool.wait_requests(base + 1)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(cancelled)  # waits as a follower
            await pool.wait_requests(base + 2)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(call, last_done)  # waits as a follower
            await pool.wait_requests(base + 3)
            await trio.testing.wait_all_tasks_blocked()
            first, _, last = pool.rids[base : base + 3]
            pool.reply(first, round_)  # the reader's reply, and in the same step...
            scope.cancel()  # ...the second view is cancelled
            await reader_done.wait()
            pool.reply(last, round_)
            with trio.move_on_after(0.5):  # (its reply is in the socket already)
                await last_done.wait()
            if not last_done.is_set():
                stuck_rounds += 1
                break
        nursery.cancel_scope.cancel()
    await client.close_async()
    pool.close()
    assert stuck_rounds == 0, "a reply sat unread: no task was left reading"
