"""Audit of apps/dirty's client APIs as a web app uses them: the async client on asyncio and trio
(cancellation, timeouts, many tasks, successive and concurrent event loops, closing), the
module-level helpers (``get_dirty_client``, ``close_dirty_client``, ``set_dirty_socket_path``,
``GUNICORN_DIRTY_SOCKET``) and the stash API from a web worker, against Gunicorn 27.0.1's
``gunicorn.dirty.client`` / ``gunicorn.dirty.stash`` and what a Python user expects.

Real pools come from ``start_pool``; states a real pool cannot be held in (a pool that stops
reading, a reply sent at an exact scheduling step) use small scripted servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from apps import dirty
from apps.dirty._protocol import CHUNK, END, REQUEST, RESPONSE, decode_payload
from wire import FrameSplitter, reply_parts, request_parts
from wire import encode_header as header

from .conftest import ECHO
from .test_edges_clients import _in_asyncio

BOUND = 10.0  # seconds: the generous bound on any wait for a condition


class StallingPool:
    """A pool that reads the first ``first`` bytes of its first connection, then nothing until
    ``close()``: a node whose connection stopped reading (its worker's socket is full, its
    scheduler is stuck). Counts the bytes it took."""

    def __init__(self, path: str, first: int = 0) -> None:
        self.path = path
        self.gate = threading.Event()
        self.conns: list[socket.socket] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(4)
        threading.Thread(target=self._serve, args=(first,), daemon=True).start()

    def _serve(self, first: int) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        self.conns.append(conn)
        got = 0
        while got < first:
            data = conn.recv(first - got)
            if not data:
                return
            got += len(data)
        self.gate.wait(BOUND)

    def close(self) -> None:
        self.gate.set()
        self.server.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def stalling_pool(tmp_path: Path) -> Iterator[Callable[..., StallingPool]]:
    pools: list[StallingPool] = []

    def make(first: int = 0) -> StallingPool:
        pool = StallingPool(str(tmp_path / f"stall{len(pools)}.sock"), first)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


class EchoPool:
    """A pool answering each REQUEST with its first argument; counts the connections it
    accepted and those still open (a connection the client closes ends at once)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.accepted = 0
        self.open = 0
        self.lock = threading.Lock()
        self.conns: list[socket.socket] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        splitter = FrameSplitter()
        try:
            while data := conn.recv(1 << 16):
                for mtype, rid, payload in splitter.feed(data):
                    if mtype == REQUEST:
                        value = decode_payload(payload)["args"][0]
                        conn.sendall(b"".join(bytes(p) for p in reply_parts(RESPONSE, rid, value)))
        except OSError:
            pass
        finally:
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.server.close()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def echo_pool(tmp_path: Path) -> Iterator[EchoPool]:
    pool = EchoPool(str(tmp_path / "echo.sock"))
    yield pool
    pool.close()


@pytest.fixture
def echo_env(monkeypatch: pytest.MonkeyPatch, echo_pool: EchoPool) -> Iterator[EchoPool]:
    """GUNICORN_DIRTY_SOCKET set to an echo pool; the process's shared clients let go after."""
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", echo_pool.path)
    yield echo_pool
    dirty.close_dirty_client()


@pytest.fixture
def shared_env(monkeypatch: pytest.MonkeyPatch, socket_path: str) -> Iterator[str]:
    """GUNICORN_DIRTY_SOCKET set to the test's pool; the process's shared clients let go after."""
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", socket_path)
    yield socket_path
    dirty.set_dirty_socket_path(None)
    dirty.close_dirty_client()


# --------------------------------------------------------- closing the shared clients


async def test_close_dirty_client_then_close_dirty_client_async_closes_the_async_connection(
    echo_env: EchoPool,
) -> None:
    # A Starlette/FastAPI app with sync and async views: its shutdown lets go of both kinds.
    seen: list[Any] = []

    async def app_life() -> None:
        client = await dirty.get_dirty_client_async()
        seen.append(client)
        assert await client.execute_async(ECHO, "echo", "view") == "view"
        dirty.close_dirty_client()  # a sync shutdown hook (gunicorn's worker_exit)
        await dirty.close_dirty_client_async()  # the lifespan's shutdown
        seen.append(client._async)  # the async connection still held (None once closed)

    await _in_asyncio(app_life)
    client, conn = seen
    try:
        assert conn is None, "the async connection was left open"
    finally:
        await client.close_async()


async def test_get_and_close_dirty_client_async_on_trio_and_asyncio(
    start_pool: Any, shared_env: str
) -> None:
    # One shared client for sync and async code (ours, unlike Gunicorn's context-local one);
    # close_dirty_client_async closes its async connection and the client stays usable.
    await start_pool(dirty_workers=1)
    client = await dirty.get_dirty_client_async()
    assert client is dirty.get_dirty_client()
    assert await client.execute_async(ECHO, "echo", "trio") == "trio"
    await dirty.close_dirty_client_async()
    assert await client.execute_async(ECHO, "echo", "again") == "again"
    await dirty.close_dirty_client_async()

    async def on_asyncio() -> list[Any]:
        mine = await dirty.get_dirty_client_async(timeout=3)
        got = [mine is client, await mine.execute_async(ECHO, "echo", "asyncio")]
        await dirty.close_dirty_client_async()
        return got

    assert await _in_asyncio(on_asyncio) == [True, "asyncio"]
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", "sync") == "sync"


async def test_set_dirty_socket_path_wins_over_the_variable_and_none_goes_back(
    start_pool: Any, shared_env: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    await start_pool(dirty_workers=1)
    nowhere = str(tmp_path / "nowhere.sock")
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", nowhere)
    dirty.set_dirty_socket_path(shared_env)  # Gunicorn's API: wins over the variable

    def use() -> list[Any]:
        dirty.stash.put("sp", "k", 1)  # the stash module functions follow it too
        return [dirty.get_dirty_client().execute(ECHO, "echo", 1), dirty.stash.get("sp", "k")]

    assert await trio.to_thread.run_sync(use) == [1, 1]
    dirty.set_dirty_socket_path(None)
    with pytest.raises(dirty.DirtyConnectionError, match="GUNICORN_DIRTY_SOCKET") as info:
        await trio.to_thread.run_sync(dirty.get_dirty_client().execute, ECHO, "echo", 2)
    assert info.value.socket_path == nowhere and nowhere in str(info.value)


# ---------------------------------------------------------- event loops coming and going


async def test_two_live_event_loops_taking_turns_keep_one_connection_each(
    echo_pool: EchoPool,
) -> None:
    # Two threads with their own running loops (asgiref's loop threads, a background loop
    # thread) calling through the process's shared client in turn.
    client = dirty.DirtyClient(echo_pool.path, timeout=10)
    turns = [threading.Event(), threading.Event()]
    answered = threading.Event()  # loop 1's last call is answered (so is every other)
    done = threading.Event()
    rounds = 4

    async def loop_thread(me: int) -> None:
        for i in range(rounds):
            await asyncio.to_thread(turns[me].wait, BOUND)
            turns[me].clear()
            assert await client.execute_async(ECHO, "echo", [me, i]) == [me, i]
            turns[1 - me].set()
        if me == 1:
            answered.set()
        await asyncio.to_thread(done.wait, BOUND)  # the loop lives on

    seen: list[int] = []
    turns[0].set()
    async with trio.open_nursery() as nursery:
        for me in (0, 1):
            nursery.start_soon(trio.to_thread.run_sync, asyncio.run, loop_thread(me))
        try:
            assert await trio.to_thread.run_sync(answered.wait, BOUND)
            seen += [echo_pool.accepted, echo_pool.open]  # both loops still running
        finally:
            done.set()
    await client.close_async()
    accepted, still_open = seen
    assert accepted <= 2, f"{accepted} connections for 2 event loops"
    assert still_open <= 2, f"{still_open} left open"


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


async def test_close_async_on_asyncio_of_a_connection_an_ended_trio_run_opened(
    echo_env: EchoPool,
) -> None:
    client = dirty.get_dirty_client()
    held: list[Any] = []

    async def command() -> None:
        assert await client.execute_async(ECHO, "echo", "trio") == "trio"
        held.append(client._async)

    await trio.to_thread.run_sync(trio.run, command)

    async def shutdown() -> None:
        await dirty.close_dirty_client_async()  # the app's (asyncio) shutdown

    try:
        await _in_asyncio(shutdown)
        assert held[0].stream.socket.fileno() == -1
    finally:
        held[0].stream.socket.close()


# ------------------------------------------------------------------ async sends and ENDs


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


async def test_asyncio_execute_async_send_is_bounded_by_the_client_timeout(
    stalling_pool: Callable[..., StallingPool],
) -> None:
    pool = stalling_pool()
    client = dirty.DirtyClient(pool.path, timeout=0.05)

    async def scenario() -> Any:
        try:
            async with asyncio.timeout(0.5):  # 10x the client's timeout
                await client.execute_async("x:App", "echo", b"\x01" * (8 << 20))
        except (dirty.DirtyError, TimeoutError) as exc:
            return exc
        finally:
            await client.close_async()

    got = await _in_asyncio(scenario)
    assert isinstance(got, dirty.DirtyTimeoutError), repr(got)


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


# ---------------------------------------------------------------- many trio tasks


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


# ------------------------------------------------------------------ streams, backpressure


class FloodingPool:
    """Answers the first REQUEST with ``total`` bytes of 64 KiB CHUNKs as fast as the client
    takes them; ``taken`` is how many bytes went out before the client stopped taking any
    for ``stall`` seconds (or all of them)."""

    def __init__(self, path: str, total: int, stall: float = 0.3) -> None:
        self.path = path
        self.total = total
        self.stall = stall
        self.taken = 0
        self.finished = threading.Event()
        self.gate = threading.Event()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            self.finished.set()
            return
        try:
            splitter = FrameSplitter()
            rid = None
            while rid is None:
                for mtype, got, _ in splitter.feed(conn.recv(65536)):
                    if mtype == REQUEST:
                        rid = got
            chunk = b"".join(bytes(p) for p in reply_parts(CHUNK, rid, b"x" * 65536))
            conn.settimeout(self.stall)
            while self.taken < self.total:
                view = memoryview(chunk)
                while view:
                    n = conn.send(view)
                    self.taken += n
                    view = view[n:]
        except OSError:  # (socket.timeout: the client stopped reading)
            pass
        finally:
            self.finished.set()
            self.gate.wait(BOUND)
            conn.close()

    def close(self) -> None:
        self.gate.set()
        self.server.close()


async def test_asyncio_a_slow_stream_consumer_is_not_buffered_without_bound(
    tmp_path: Path,
) -> None:
    # A view streaming a large result to a slow HTTP client: it takes one chunk, then waits.
    total = 64 << 20
    pool = FloodingPool(str(tmp_path / "flood.sock"), total)
    client = dirty.DirtyClient(pool.path, timeout=10)

    async def view() -> None:
        chunks = client.stream_async("x:App", "big")
        assert await anext(chunks) == b"x" * 65536
        await asyncio.to_thread(pool.finished.wait, BOUND)  # the HTTP client is slow
        await chunks.aclose()
        await client.close_async()

    try:
        await _in_asyncio(view)
    finally:
        pool.close()
    assert pool.taken < total // 2, f"{pool.taken >> 20} MiB buffered for one chunk consumed"


class FloodAndEchoPool:
    """Answers the first REQUEST with ``chunks`` 64 KiB CHUNKs then END, sent as fast as the
    client takes them, and any later REQUEST with a RESPONSE echoing its first argument, sent
    in turn with the chunks (so behind those the client has not read yet)."""

    def __init__(self, path: str, chunks: int) -> None:
        self.path = path
        self.chunks = chunks
        self.lock = threading.Lock()
        self.conn: socket.socket | None = None
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            self.conn, _ = self.server.accept()
            splitter = FrameSplitter()
            flooding = False
            while data := self.conn.recv(65536):
                for mtype, rid, payload in splitter.feed(data):
                    if mtype != REQUEST:
                        continue
                    if not flooding:
                        flooding = True
                        threading.Thread(target=self._flood, args=(rid,), daemon=True).start()
                        continue
                    value = decode_payload(payload)["args"][0]
                    with self.lock:
                        self.conn.sendall(
                            b"".join(bytes(p) for p in reply_parts(RESPONSE, rid, value))
                        )
        except OSError:
            pass

    def _flood(self, rid: int) -> None:
        assert self.conn is not None
        chunk = b"".join(bytes(p) for p in reply_parts(CHUNK, rid, b"x" * 65536))
        try:
            for _ in range(self.chunks):
                with self.lock:
                    self.conn.sendall(chunk)
            with self.lock:
                self.conn.sendall(header(END, 0, rid))
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()
        if self.conn is not None:
            self.conn.close()


async def test_asyncio_a_call_mid_stream_is_answered_while_the_stream_is_held_back(
    tmp_path: Path,
) -> None:
    # Flow control pauses the shared connection's reading for a lagging stream: a view that
    # awaits another call mid-stream (its reply is behind the held-back chunks) must get it.
    pool = FloodAndEchoPool(str(tmp_path / "flood_echo.sock"), chunks=128)
    client = dirty.DirtyClient(pool.path, timeout=10)

    async def view() -> list[Any]:
        chunks = client.stream_async("x:App", "big")
        assert await anext(chunks) == b"x" * 65536
        conn = client._async
        assert conn is not None
        while not conn.held:  # the stream is held back in the socket
            await asyncio.sleep(0.001)
        got = [await client.execute_async("x:App", "echo", "mid-stream")]
        got.append(1 + sum([1 async for _ in chunks]))
        got.append(conn.queued)
        await client.close_async()
        return got

    try:
        assert await _in_asyncio(view) == ["mid-stream", 128, 0]
    finally:
        pool.close()


@pytest.mark.parametrize("kind", ["sync", "trio"])
async def test_a_slow_stream_consumer_leaves_the_stream_in_the_socket(
    tmp_path: Path, kind: str
) -> None:
    # The sync and trio clients read only for a call that waits: the pool is held back.
    total = 64 << 20
    pool = FloodingPool(str(tmp_path / "flood.sock"), total, stall=0.2)
    client = dirty.DirtyClient(pool.path, timeout=10)
    try:
        if kind == "sync":

            def view() -> None:
                chunks = client.stream("x:App", "big")
                assert next(chunks) == b"x" * 65536
                pool.finished.wait(BOUND)
                chunks.close()

            await trio.to_thread.run_sync(view)
        else:
            chunks = client.stream_async("x:App", "big")
            assert await anext(chunks) == b"x" * 65536
            await trio.to_thread.run_sync(pool.finished.wait, BOUND)
            await chunks.aclose()  # type: ignore[attr-defined]
    finally:
        client.close()
        await client.close_async()
        pool.close()
    assert pool.taken < 8 << 20, f"{pool.taken >> 20} MiB taken for one chunk consumed"


# ---------------------------------------------------------------------------- the stash


async def test_stash_table_contains_none_only_if_none_is_a_key(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    table = dirty.stash.StashClient(client).table("nk")

    def ops() -> list[Any]:
        table["a"] = 1
        with pytest.raises(KeyError):
            table[None]
        absent = None in table
        table[None] = "a None key is a key like any other"
        return [absent, None in table, table[None]]

    try:
        got = await trio.to_thread.run_sync(ops)
    finally:
        client.close()
    assert got == [False, True, "a None key is a key like any other"]


async def test_stash_ttl_that_is_not_a_finite_positive_number_is_refused_unstored(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)

    def ops() -> None:
        for ttl in (math.nan, math.inf, -math.inf, True):
            with pytest.raises(dirty.StashError, match="> 0"):
                s.put("ttlx", "put", 1, ttl=ttl)
            with pytest.raises(dirty.StashError, match="> 0"):
                s.insert_new("ttlx", "new", 1, ttl=ttl)
            with pytest.raises(dirty.StashError, match="> 0"):
                s.compare_and_set("ttlx", "cas", dirty.stash.ABSENT, 1, ttl=ttl)
        assert s.keys("ttlx") == []
        s.put("ttlx", "far", 1, ttl=1e12)  # far in the future: kept
        assert s.table("ttlx")["far"] == 1 and len(s.table("ttlx")) == 1

    try:
        await trio.to_thread.run_sync(ops)
    finally:
        client.close()
