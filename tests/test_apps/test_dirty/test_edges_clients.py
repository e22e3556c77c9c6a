"""Edges of the pool's clients as a production web app meets them: shared clients under threads,
forked workers (``--preload``), event loops coming and going, cancellation and interrupts in
every state, pool restarts, large values, odd timeouts and a missing or wrong socket setting.

Real pools come from the ``start_pool`` fixture; states a real pool cannot be held in (a send
blocked half-way) use :class:`FakePool`, a scripted GD v1 server in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import supervisors
from apps import dirty
from apps.dirty import _client, _client_sync
from apps.dirty._protocol import END, REQUEST, RESPONSE, decode_payload
from wire import FrameSplitter, reply_parts

from .conftest import ECHO

BOUND = 10.0  # seconds: the generous bound on any wait for a condition


def _wait_for(condition: Callable[[], bool], bound: float = BOUND) -> None:
    """Wait (in a plain thread) until ``condition()`` holds; fail after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


async def _in_asyncio(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``scenario()`` with ``asyncio.run`` in a worker thread, with a deadline."""

    async def bounded() -> Any:
        async with asyncio.timeout(30):
            return await scenario()

    return await trio.to_thread.run_sync(asyncio.run, bounded())


class FakePool:
    """A scripted pool: answers each REQUEST with a RESPONSE carrying its first argument
    (``"hold"`` actions only once ``release`` is set). With ``stall_first``, the first
    connection reads ``stall_after`` bytes and then nothing until ``gate`` is set (a client's
    send stays blocked half-way). Records ``(connection, type, rid, action)`` per frame, the
    protocol errors met and the connections that ended."""

    def __init__(self, path: str, stall_first: bool = False, stall_after: int = 65536) -> None:
        self.path = path
        self.frames: list[tuple[int, int, int, str | None]] = []
        self.errors: list[str] = []
        self.ended: set[int] = set()  # connections whose client closed them (or that failed)
        self.started = threading.Event()  # the stalled connection has read its bytes
        self.gate = threading.Event()
        self.held = threading.Event()  # a "hold" request came in
        self.release = threading.Event()
        self.stall_first = stall_first
        self.stall_after = stall_after
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        n = 0
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()
            n += 1

    def _serve(self, conn: socket.socket, n: int) -> None:
        splitter = FrameSplitter()
        try:
            if n == 0 and self.stall_first:
                got = 0
                while got < self.stall_after:
                    data = conn.recv(self.stall_after - got)
                    if not data:
                        return
                    got += len(data)
                    splitter.feed(data)
                self.started.set()
                self.gate.wait(BOUND)
            while data := conn.recv(1 << 20):
                for mtype, rid, payload in splitter.feed(data):
                    action = None
                    if mtype == REQUEST:
                        body = decode_payload(payload)
                        action = body["action"]
                    with self.lock:
                        self.frames.append((n, mtype, rid, action))
                    if mtype != REQUEST:
                        continue
                    if action == "hold":
                        self.held.set()
                        self.release.wait(BOUND)
                    args = body["args"]
                    value = args[0] if args and not isinstance(args[0], bytes) else "big"
                    conn.sendall(b"".join(bytes(p) for p in reply_parts(RESPONSE, rid, value)))
        except (OSError, dirty.DirtyProtocolError) as exc:
            with self.lock:
                self.errors.append(f"connection {n}: {exc!r}")
        finally:
            with self.lock:
                self.ended.add(n)
            conn.close()

    def close(self) -> None:
        self.gate.set()
        self.release.set()
        self.server.close()
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def fake_pool(tmp_path: Path) -> Any:
    pools: list[FakePool] = []

    def make(**kw: Any) -> FakePool:
        pool = FakePool(str(tmp_path / f"fake{len(pools)}.sock"), **kw)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture
def shared_env(monkeypatch: pytest.MonkeyPatch, socket_path: str) -> Any:
    """GUNICORN_DIRTY_SOCKET set to the test's pool; the process's shared clients closed after."""
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", socket_path)
    yield socket_path
    dirty.close_dirty_client()


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt during the test, whatever the run inherited (a shell's
    background job starts with SIGINT ignored, and Python then installs no handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_main_when(event: threading.Event) -> threading.Thread:
    """SIGINT the main thread (a KeyboardInterrupt there) once ``event`` is set."""
    main = threading.main_thread().ident
    assert main is not None

    def kill() -> None:
        if event.wait(BOUND):
            signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------- interrupts and sends


def test_keyboard_interrupt_while_reading_leaves_the_sync_client_usable(
    fake_pool: Any, sigint_raises: None
) -> None:
    pool = fake_pool()
    client = dirty.DirtyClient(pool.path, timeout=5)
    killer = _interrupt_main_when(pool.held)
    with pytest.raises(KeyboardInterrupt):
        client.execute("x:App", "hold", 1)
    killer.join(BOUND)
    pool.release.set()  # the abandoned call's reply comes late; it must not be taken as the next
    assert client.execute("x:App", "echo", "next") == "next"
    # The pool was told to drop call 1: by its END, or (the interrupt came while the send was
    # being finished, so a frame may be half-sent) by the connection's close, which drops it too.
    _wait_for(lambda: (0, END, 1, None) in pool.frames or 0 in pool.ended)
    client.close()


def _interrupt_once_after(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
    """The next call of ``owner.name`` runs, then raises KeyboardInterrupt (as a SIGINT landing
    just after it would); later calls are the real one."""
    real = getattr(owner, name)

    def interrupted(*args: Any) -> None:
        monkeypatch.setattr(owner, name, real)
        real(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(owner, name, interrupted)


def test_an_interrupt_between_the_send_and_the_read_still_ends_the_call(
    fake_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The request is out whole, the waiter registered, and the interrupt comes before the read.
    pool = fake_pool()
    client = dirty.DirtyClient(pool.path, timeout=5)
    _interrupt_once_after(monkeypatch, _client_sync._SyncConn, "send")
    with pytest.raises(KeyboardInterrupt):
        client.execute("x:App", "echo", "first")
    _wait_for(lambda: (0, END, 1, None) in pool.frames)  # the pool is told to drop it
    assert client.execute("x:App", "echo", "next") == "next"  # the late "first" is dropped
    assert 0 not in pool.ended
    assert client._sync is not None and client._sync.waiters == {}  # nothing left behind
    client.close()


def test_an_interrupt_as_a_call_takes_the_reading_role_passes_the_role_on(
    fake_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interrupt lands after the call took the reading role, before its read began: the
    # role must not stay with the dead call (every later call would sleep to its timeout).
    pool = fake_pool()
    client = dirty.DirtyClient(pool.path, timeout=2)
    real_read = dirty.DirtyClient._read

    def interrupted(*args: Any) -> None:
        monkeypatch.setattr(dirty.DirtyClient, "_read", real_read)
        raise KeyboardInterrupt

    monkeypatch.setattr(dirty.DirtyClient, "_read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        client.execute("x:App", "echo", "first")
    assert client.execute("x:App", "echo", "next") == "next"
    client.close()


def test_an_interrupt_just_after_a_whole_send_drops_the_connection_safely(
    fake_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whether the frame went out whole cannot be known here: the connection goes (the pool
    # drops the call with it), and the next call opens a new one.
    pool = fake_pool()
    client = dirty.DirtyClient(pool.path, timeout=5)
    _interrupt_once_after(monkeypatch, _client_sync, "send_parts")
    with pytest.raises(KeyboardInterrupt):
        client.execute("x:App", "echo", "first")
    _wait_for(lambda: 0 in pool.ended)
    assert client.execute("x:App", "echo", "next") == "next"
    assert [n for n, mtype, _, _ in pool.frames if mtype == REQUEST] == [0, 1]
    client.close()


def test_keyboard_interrupt_mid_send_does_not_desync_the_sync_connection(
    fake_pool: Any, sigint_raises: None
) -> None:
    pool = fake_pool(stall_first=True)
    client = dirty.DirtyClient(pool.path, timeout=2)
    killer = _interrupt_main_when(pool.started)
    with pytest.raises(KeyboardInterrupt):
        client.execute("x:App", "echo", b"\x01" * (32 << 20))  # blocks: the pool stopped reading
    killer.join(BOUND)
    pool.gate.set()
    assert client.execute("x:App", "echo", "after") == "after"
    client.close()


def test_close_mid_send_fails_the_call_and_does_not_resend_it(fake_pool: Any) -> None:
    # The send fails with a broken pipe because close() shut the socket: that is not the pool
    # having gone (which resends an idle call on a new connection), so the call fails.
    pool = fake_pool(stall_first=True)
    client = dirty.DirtyClient(pool.path, timeout=5)

    def close_when_stalled() -> None:
        if pool.started.wait(BOUND):
            client.close()

    closer = threading.Thread(target=close_when_stalled, daemon=True)
    closer.start()
    with pytest.raises(dirty.DirtyConnectionError, match="the client was closed"):
        client.execute("x:App", "echo", b"\x01" * (32 << 20))
    closer.join(BOUND)
    assert not [n for n, mtype, _, _ in pool.frames if n > 0]  # nothing went on a new connection
    pool.gate.set()
    assert client.execute("x:App", "echo", "after") == "after"
    client.close()


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


async def test_asyncio_cancel_mid_send_leaves_the_client_usable(fake_pool: Any) -> None:
    pool = fake_pool(stall_first=True)
    client = dirty.DirtyClient(pool.path, timeout=3)

    async def scenario() -> Any:
        call = asyncio.ensure_future(client.execute_async("x:App", "echo", b"\x01" * (32 << 20)))
        await asyncio.to_thread(pool.started.wait, BOUND)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        pool.gate.set()
        try:
            return await client.execute_async("x:App", "echo", "after")
        finally:
            await client.close_async()

    assert await _in_asyncio(scenario) == "after"


# ------------------------------------------------------------------------------ fork safety


async def _run_child(child: Callable[[], Any]) -> str:
    """Fork; the child runs ``child()`` and reports ``ok`` or its error through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once (never back into trio)
        code = 0
        try:
            os.close(read)
            try:
                child()
                msg = "ok"
            except BaseException as exc:
                msg = f"{type(exc).__name__}: {exc}"
            os.write(write, msg.encode())
        finally:
            os._exit(code)
    os.close(write)
    stream = trio.lowlevel.FdStream(read)
    out = b""
    with trio.fail_after(BOUND):
        while chunk := await stream.receive_some():
            out += chunk
    await stream.aclose()
    await trio.to_thread.run_sync(os.waitpid, pid, 0)
    return out.decode()


async def test_get_dirty_client_in_a_forked_child_is_the_childs_own(
    start_pool: Any, shared_env: str
) -> None:
    # gunicorn --preload: the parent used the shared client before forking its workers.
    await start_pool()
    parent = dirty.get_dirty_client()
    assert await trio.to_thread.run_sync(parent.execute, ECHO, "echo", "warm") == "warm"

    def child() -> None:
        mine = dirty.get_dirty_client()
        assert mine is not parent
        for i in range(20):
            assert mine.execute(ECHO, "echo", [os.getpid(), i]) == [os.getpid(), i]
        dirty.stash.put("forked", "k", os.getpid())
        dirty.close_dirty_client()  # a worker's exit hook

    assert await _run_child(child) == "ok"
    assert dirty.get_dirty_client() is parent
    assert await trio.to_thread.run_sync(parent.execute, ECHO, "echo", "still") == "still"


async def test_an_explicit_client_connected_before_fork_is_not_shared_with_children(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path, timeout=3)
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", "warm") == "warm"

    def child() -> None:
        assert client.execute(ECHO, "echo", "child") == "child"
        client.close()  # the worker exits (max_requests, HUP)

    assert await _run_child(child) == "ok"
    try:
        assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", "parent") == "parent"
    finally:
        client.close()


# ----------------------------------------------------------- shared clients and close()


async def test_close_dirty_client_in_one_thread_spares_other_threads_calls(
    start_pool: Any, shared_env: str
) -> None:
    await start_pool(dirty_threads=2)
    outcome: list[Any] = []

    def run() -> None:
        def slow() -> None:
            try:
                outcome.append(dirty.get_dirty_client().execute(ECHO, "sleep", 0.5))
            except Exception as exc:  # reported below
                outcome.append(exc)

        thread = threading.Thread(target=slow)
        thread.start()
        client = dirty.get_dirty_client()
        _wait_for(lambda: client._sync is not None and bool(client._sync.waiters))
        dirty.close_dirty_client()  # e.g. a request's teardown, as Gunicorn's docs allow
        thread.join(BOUND)

    await trio.to_thread.run_sync(run)
    assert outcome == [0.5]


async def test_get_dirty_client_is_shared_by_threads_and_fresh_after_close(
    start_pool: Any, shared_env: str
) -> None:
    await start_pool()

    def run() -> list[Any]:
        got: list[Any] = []
        threads = [threading.Thread(target=lambda: got.append(dirty.get_dirty_client()))]
        threads[0].start()
        threads[0].join(BOUND)
        first = dirty.get_dirty_client()
        assert got == [first]
        assert first.execute(ECHO, "echo", 1) == 1
        dirty.close_dirty_client()
        second = dirty.get_dirty_client(timeout=7)
        assert second is not first and second.timeout == 7
        assert second.execute(ECHO, "echo", 2) == 2
        assert first.execute(ECHO, "echo", 3) == 3  # a closed client reconnects when used again
        first.close()
        return [first, second]

    await trio.to_thread.run_sync(run)


async def test_close_from_another_thread_fails_every_sync_call_in_flight_then_reconnects(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=2, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=20)
    outcomes: list[Any] = []

    def call() -> None:
        try:
            outcomes.append(client.execute(ECHO, "sleep", 1.5))
        except dirty.DirtyError as exc:
            outcomes.append(exc)

    def stream() -> None:
        try:
            for _ in client.stream(ECHO, "endless", "closed"):
                pass
        except dirty.DirtyError as exc:
            outcomes.append(exc)

    def run() -> None:
        threads = [threading.Thread(target=f) for f in (call, call, call, stream)]
        for t in threads:
            t.start()
        _wait_for(lambda: client._sync is not None and len(client._sync.waiters) == 4)
        t0 = time.monotonic()
        client.close()
        for t in threads:
            t.join(BOUND)
        assert time.monotonic() - t0 < 1  # at once, not when the 1.5 s calls end
        assert client.execute(ECHO, "echo", "again") == "again"

    await trio.to_thread.run_sync(run)
    assert len(outcomes) == 4
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in outcomes), outcomes
    client.close()


async def test_a_stream_abandoned_without_closing_is_ended_when_collected(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path)

    def run() -> None:
        it = client.stream(ECHO, "endless", "dropped")
        assert next(it) == 0
        del it  # a view returned early; the iterator is dropped, never closed
        assert client.execute(ECHO, "echo", "x") == "x"
        _wait_for(lambda: client.execute(ECHO, "was_stopped", "dropped"))

    await trio.to_thread.run_sync(run)
    client.close()


async def test_one_thread_interleaving_two_streams_and_calls(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=2, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=10)

    def run() -> None:
        a = client.stream(ECHO, "count", 300)
        b = client.stream(ECHO, "acount", 300)
        for i in range(300):
            assert next(a) == i and next(b) == i
            if i % 50 == 0:
                assert client.execute(ECHO, "echo", i) == i
        assert next(a, "done") == "done" and next(b, "done") == "done"

    await trio.to_thread.run_sync(run)
    client.close()


# --------------------------------------------------------------------- pool restarts


async def _restart(start_pool: Any) -> None:
    await supervisors.stop_application("dirty")
    await start_pool()


async def test_sync_client_reconnects_after_the_pool_restarts(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path, timeout=5)
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", 1) == 1
    await _restart(start_pool)
    try:
        assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", 2) == 2
    finally:
        client.close()


async def test_trio_client_reconnects_after_the_pool_restarts(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path, timeout=5)
    assert await client.execute_async(ECHO, "echo", 1) == 1
    await _restart(start_pool)
    try:
        assert await client.execute_async(ECHO, "echo", 2) == 2
    finally:
        await client.close_async()


async def test_asyncio_client_reconnects_after_the_pool_restarts(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path, timeout=5)
    restarted = threading.Event()
    first_done = threading.Event()

    async def scenario() -> list[Any]:
        got = [await client.execute_async(ECHO, "echo", 1)]
        first_done.set()
        await asyncio.to_thread(restarted.wait, BOUND)
        got.append(await client.execute_async(ECHO, "echo", 2))
        await client.close_async()
        return got

    async with trio.open_nursery() as nursery:
        results: list[Any] = []

        async def run() -> None:
            results.append(await _in_asyncio(scenario))

        nursery.start_soon(run)
        await trio.to_thread.run_sync(first_done.wait, BOUND)
        await _restart(start_pool)
        restarted.set()
    assert results == [[1, 2]]


async def test_calls_in_flight_when_the_pool_dies_fail_typed_never_hang(
    start_pool: Any, socket_path: str, fake_pool: Any
) -> None:
    # A pool that goes away with calls in flight (sync leader and follower, asyncio, trio).
    pool = fake_pool()
    client = dirty.DirtyClient(pool.path, timeout=30)
    outcomes: list[Any] = []

    def sync_call() -> None:
        try:
            outcomes.append(client.execute("x:App", "hold", 1))
        except dirty.DirtyError as exc:
            outcomes.append(exc)

    async def trio_call() -> None:
        try:
            outcomes.append(await client.execute_async("x:App", "hold", 1))
        except dirty.DirtyError as exc:
            outcomes.append(exc)

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, sync_call)
            nursery.start_soon(trio.to_thread.run_sync, sync_call)
            nursery.start_soon(trio_call)
            nursery.start_soon(trio_call)
            await trio.to_thread.run_sync(pool.held.wait, BOUND)
            await trio.to_thread.run_sync(
                _wait_for,
                lambda: client._sync is not None and len(client._sync.waiters) == 2,
            )
            pool.server.close()
            with pool.lock:
                for conn in pool.conns:
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # (one the client closed already: a racing second connection)
    assert len(outcomes) == 4
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in outcomes), outcomes


# ----------------------------------------------------------------------- asyncio clients


async def test_asyncio_cancel_mid_call_and_mid_stream_then_reuse(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=10)

    async def scenario() -> None:
        first = asyncio.Event()

        async def consume() -> None:
            async for i in client.stream_async(ECHO, "endless", "cancelled"):
                if i == 2:
                    first.set()

        task = asyncio.ensure_future(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        calls = [asyncio.ensure_future(client.execute_async(ECHO, "sleep", 2.0)) for _ in range(3)]
        await asyncio.sleep(0)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        assert await client.execute_async(ECHO, "echo", "after") == "after"
        while not await client.execute_async(ECHO, "was_stopped", "cancelled"):
            await asyncio.sleep(0.01)
        await client.close_async()

    await _in_asyncio(scenario)


async def test_asyncio_close_async_fails_calls_in_flight_at_once(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=20)

    async def scenario() -> list[Any]:
        await client.connect_async()

        async def drain() -> None:
            async for _ in client.stream_async(ECHO, "endless", "closed_async"):
                pass

        calls = [
            asyncio.ensure_future(client.execute_async(ECHO, "sleep", 1.5)),
            asyncio.ensure_future(drain()),
        ]
        while client._async is None or len(client._async.slots) < 2:  # both sent
            await asyncio.sleep(0.001)
        t0 = time.monotonic()
        await client.close_async()
        got = await asyncio.gather(*calls, return_exceptions=True)
        assert time.monotonic() - t0 < 1
        assert await client.execute_async(ECHO, "echo", "again") == "again"
        await client.close_async()
        return got

    got = await _in_asyncio(scenario)
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in got), got


async def test_asyncio_concurrent_first_calls_share_one_connection_that_close_async_closes(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=20)
    probe = dirty.DirtyClient(socket_path, timeout=20)

    async def scenario() -> list[Any]:
        # A fresh app: its first requests arrive together.
        calls = [asyncio.ensure_future(client.execute_async(ECHO, "track", 1.5)) for _ in range(3)]
        while await probe.execute_async(ECHO, "track", 0) < 4:  # the three run in the worker
            await asyncio.sleep(0.01)
        await client.close_async()
        await probe.close_async()
        async with asyncio.timeout(1):
            return await asyncio.gather(*calls, return_exceptions=True)

    got = await _in_asyncio(scenario)
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in got), got


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


async def test_one_client_in_successive_event_loops_and_trio(
    start_pool: Any, socket_path: str
) -> None:
    # Django's async_to_sync, tests, scripts: asyncio.run after asyncio.run with one client.
    await start_pool()
    client = dirty.DirtyClient(socket_path)

    async def scenario() -> Any:
        got = await client.execute_async(ECHO, "echo", "loop")
        return [got, [x async for x in client.stream_async(ECHO, "count", 3)]]

    for _ in range(3):
        assert await _in_asyncio(scenario) == ["loop", [0, 1, 2]]
    assert await client.execute_async(ECHO, "echo", "trio") == "trio"
    await client.close_async()

    async def last() -> Any:
        try:
            return await scenario()
        finally:
            await client.close_async()  # (in the loop that opened it: see the test below)

    assert await _in_asyncio(last) == ["loop", [0, 1, 2]]


async def test_close_async_after_the_connections_event_loop_ended(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)

    async def request() -> Any:
        return await client.execute_async(ECHO, "echo", "view")

    assert await _in_asyncio(request) == "view"  # one loop per request, as async_to_sync does

    async def shutdown() -> None:
        await client.close_async()  # the app's shutdown, on another loop

    await _in_asyncio(shutdown)


async def test_two_event_loops_in_two_threads_share_one_client(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=2, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=10)

    async def scenario(tag: int) -> None:
        for i in range(40):
            assert await client.execute_async(ECHO, "echo", [tag, i]) == [tag, i]

    def run(tag: int) -> None:
        asyncio.run(scenario(tag))

    async with trio.open_nursery() as nursery:
        for tag in range(2):
            nursery.start_soon(trio.to_thread.run_sync, run, tag)
    # (not closed: its loop has ended; see test_close_async_after_the_connections_event_loop_ended)


async def test_many_interleaved_streams_on_asyncio(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=2, dirty_threads=4)
    client = dirty.DirtyClient(socket_path)

    async def scenario() -> list[Any]:
        async def one(n: int) -> list[Any]:
            return [x async for x in client.stream_async(ECHO, "count" if n % 2 else "acount", n)]

        got = await asyncio.gather(*(one(200 + n) for n in range(24)))
        await client.close_async()
        return got

    assert await _in_asyncio(scenario) == [list(range(200 + n)) for n in range(24)]


# --------------------------------------------------------------------------- trio clients


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


# --------------------------------------------------------------- large values, timeouts


async def test_tens_of_mib_each_way_sync_asyncio_and_trio(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    blob = os.urandom(1 << 20) * 24  # 24 MiB
    nested = [b"y" * (8 << 20), {"k": b"z" * (8 << 20)}]  # 16 MiB, encoded inline
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", blob) == blob
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", nested) == nested
    assert await client.execute_async(ECHO, "echo", blob) == blob

    async def scenario() -> bool:
        ok = await client.execute_async(ECHO, "echo", blob) == blob
        await client.close_async()
        return ok

    assert await _in_asyncio(scenario)
    with pytest.raises(dirty.DirtyProtocolError, match=r"exceeds max_"):
        await trio.to_thread.run_sync(client.execute, ECHO, "echo", b"x" * (65 << 20))
    assert await trio.to_thread.run_sync(client.execute, ECHO, "echo", "small") == "small"
    client.close()
    await client.close_async()


async def test_timeout_zero_times_out_at_once_and_none_waits(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=0)
    with pytest.raises(dirty.DirtyTimeoutError):
        await trio.to_thread.run_sync(client.execute, ECHO, "sleep", 0.3)
    with pytest.raises(dirty.DirtyTimeoutError):
        await client.execute_async(ECHO, "sleep", 0.3)

    async def on_asyncio() -> None:
        with pytest.raises(dirty.DirtyTimeoutError):
            await client.execute_async(ECHO, "sleep", 0.3)
        await client.close_async()

    await _in_asyncio(on_asyncio)
    client.timeout = None
    assert await trio.to_thread.run_sync(client.execute, ECHO, "sleep", 0.3) == 0.3
    assert await client.execute_async(ECHO, "sleep", 0.3) == 0.3
    got = await trio.to_thread.run_sync(lambda: list(client.stream(ECHO, "count", 3)))
    assert got == [0, 1, 2]
    client.close()
    await client.close_async()
    never = dirty.DirtyClient(socket_path, timeout=None)  # a fresh socket, no SO_*TIMEO at all
    assert await trio.to_thread.run_sync(never.execute, ECHO, "sleep", 0.2) == 0.2
    never.close()


# ------------------------------------------------------------------- the socket setting


async def test_unset_socket_setting_is_a_typed_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GUNICORN_DIRTY_SOCKET", raising=False)
    for make in (dirty.DirtyClient, dirty.get_dirty_client, dirty.get_dirty_socket_path):
        with pytest.raises(dirty.DirtyError, match="GUNICORN_DIRTY_SOCKET"):
            make()
    with pytest.raises(dirty.DirtyError, match="GUNICORN_DIRTY_SOCKET"):
        await dirty.get_dirty_client_async()
    with pytest.raises(dirty.DirtyError, match="GUNICORN_DIRTY_SOCKET"):
        dirty.stash.get("t", "k")
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", "")
    with pytest.raises(dirty.DirtyError, match="GUNICORN_DIRTY_SOCKET"):
        dirty.get_dirty_client()


@pytest.mark.parametrize("kind", ["missing", "directory", "regular file", "too long"])
async def test_wrong_socket_setting_is_a_connection_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    path = {
        "missing": tmp_path / "none.sock",
        "directory": tmp_path,
        "regular file": tmp_path / "file",
        "too long": tmp_path / ("x" * 120),
    }[kind]
    if kind == "regular file":
        path.write_text("")
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", str(path))
    client = dirty.get_dirty_client()
    try:
        for attempt in range(2):  # a failed connect leaves nothing behind
            with pytest.raises(dirty.DirtyConnectionError, match="GUNICORN_DIRTY_SOCKET") as info:
                await trio.to_thread.run_sync(client.execute, ECHO, "echo", attempt)
            assert info.value.socket_path == str(path)
            with pytest.raises(dirty.DirtyConnectionError, match="GUNICORN_DIRTY_SOCKET"):
                await client.execute_async(ECHO, "echo", attempt)

        async def on_asyncio() -> None:
            with pytest.raises(dirty.DirtyConnectionError, match="GUNICORN_DIRTY_SOCKET"):
                await client.execute_async(ECHO, "echo", 1)

        await _in_asyncio(on_asyncio)
    finally:
        dirty.close_dirty_client()


def test_close_dirty_client_async_is_exported_like_gunicorns() -> None:
    assert callable(getattr(dirty, "close_dirty_client_async", None))
    assert callable(getattr(_client, "close_dirty_client_async", None))
