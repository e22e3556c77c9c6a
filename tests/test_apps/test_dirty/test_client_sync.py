"""The sync client (what a threaded or forked web worker uses): interrupts in every state, forked
children, threads sharing ``get_dirty_client``, closing from another thread, pool restarts."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import wire
from apps import dirty
from apps.dirty import _client_sync
from apps.dirty._protocol import END, REQUEST, RESPONSE, decode_payload, encode
from wire import FrameSplitter

from .conftest import ECHO
from .helpers import BOUND, FloodingPool, _wait_for, watch_sync_sends


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
    _wait_for(lambda: (0, END, 1, None) in pool.frames or 0 in pool.ended, pool.changed)
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
    _wait_for(lambda: (0, END, 1, None) in pool.frames, pool.changed)  # the pool drops it
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
    _wait_for(lambda: 0 in pool.ended, pool.changed)
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


async def test_close_dirty_client_in_one_thread_spares_other_threads_calls(
    start_pool: Any, shared_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await start_pool(dirty_threads=2)
    sends = watch_sync_sends(monkeypatch)
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
        _wait_for(lambda: client._sync is not None and bool(client._sync.waiters), sends)
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
    start_pool: Any, socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await start_pool(dirty_workers=2, dirty_threads=4)
    sends = watch_sync_sends(monkeypatch)
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
        _wait_for(lambda: client._sync is not None and len(client._sync.waiters) == 4, sends)
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
        assert client.execute(ECHO, "wait_stopped", "dropped", BOUND)

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


async def test_calls_in_flight_when_the_pool_dies_fail_typed_never_hang(
    start_pool: Any, socket_path: str, fake_pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool that goes away with calls in flight (sync leader and follower, asyncio, trio).
    pool = fake_pool()
    sends = watch_sync_sends(monkeypatch)
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
                sends,
            )
            # (The trio calls' connection may not be in yet: it is shut down when it comes.)
            pool.kill()
    assert len(outcomes) == 4
    assert all(isinstance(o, dirty.DirtyConnectionError) for o in outcomes), outcomes


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


def test_threads_whose_replies_come_in_one_read_are_all_woken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reader wakes the first of them and each the next (``_SyncConn.ready``): every call
    # returns its own reply, none is left asleep.
    a, b = socket.socketpair()
    # (A call left asleep would wake at its timeout only: past the bound of the joins below.)
    client = dirty.DirtyClient("/nowhere", timeout=3 * BOUND)
    client._sync = _client_sync._SyncConn(a)
    sends = watch_sync_sends(monkeypatch)
    asleep = threading.Condition()
    sleepers = [0]

    class Sleeper:
        """A call's lock to sleep on, which says when its call goes to sleep."""

        def __init__(self) -> None:
            self.lock = threading.Lock()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if self.lock.locked():
                with asleep:
                    sleepers[0] += 1
                    asleep.notify_all()
            return self.lock.acquire(blocking, timeout)

        def release(self) -> None:
            self.lock.release()

    monkeypatch.setattr(_client_sync, "_allocate_lock", Sleeper)
    results: dict[int, Any] = {}

    def call(i: int) -> None:
        results[i] = client.execute("x:App", "echo", i)

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(6)]
    try:
        for thread in threads:
            thread.start()
        _wait_for(lambda: len(client._sync.waiters) == 6, sends)  # type: ignore[union-attr]
        _wait_for(lambda: sleepers[0] == 5, asleep)  # (the sixth reads)
        splitter = FrameSplitter()
        requests: list[tuple[int, Any]] = []
        while len(requests) < 6:
            for _, rid, payload in splitter.feed(b.recv(1 << 16)):
                requests.append((rid, decode_payload(payload)["args"][0]))
        b.sendall(b"".join(encode(wire.make_response(rid, arg)) for rid, arg in requests))
        deadline = time.monotonic() + BOUND
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(thread.is_alive() for thread in threads)
        assert results == {i: i for i in range(6)}
        assert not client._sync.ready and not client._sync.sleeping  # type: ignore[union-attr]
    finally:
        client.close()
        b.close()


def test_a_call_woken_to_wake_the_next_and_abandoned_wakes_it_still() -> None:
    # An interrupt (or its timeout) may end a call woken by the chain before it takes its
    # frame: its end passes the wake on, or the next call would sleep until its own timeout.
    a, b = socket.socketpair()
    client = dirty.DirtyClient("/nowhere", timeout=BOUND)
    conn = client._sync = _client_sync._SyncConn(a)
    waiters = []
    for rid in (1, 2):
        waiter = _client_sync._Waiter()
        waiter.conn = conn
        waiter.lock = threading.Lock()
        waiter.lock.acquire()  # (asleep on it)
        waiter.frames.append((RESPONSE, b""))
        conn.waiters[rid] = waiter
        conn.ready.append(waiter)
        waiters.append(waiter)
    try:
        conn.wake_one()  # the reader wakes call 1 ...
        assert not waiters[1].lock.acquire(False)
        client._abandon(waiters[0], 1)  # ... which ends before it takes its frame
        assert waiters[1].lock.acquire(False)  # call 2 was woken
        assert not conn.ready and list(conn.waiters) == [2]
    finally:
        client.close()
        b.close()
