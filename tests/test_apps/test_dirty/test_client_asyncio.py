"""The async client on asyncio (what FastAPI, Starlette and uvicorn apps use): each scenario runs
``asyncio.run`` in a thread against a real pool (worker processes) in the test's trio node."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apps import dirty
from apps.dirty._client_asyncio import _AsyncioConn, _Protocol
from apps.dirty._protocol import CHUNK, END, REQUEST, RESPONSE, decode_payload
from wire import FrameSplitter, reply_parts
from wire import encode_header as header

from .conftest import ECHO
from .helpers import BOUND, FloodingPool, StallingPool, _in_asyncio


async def test_execute_stream_errors_and_stash(start_pool: Any, socket_path: str) -> None:
    await start_pool()
    client = dirty.DirtyClient(socket_path)

    async def scenario() -> None:
        assert await client.execute_async(ECHO, "echo", {"a": [1, 2.5, b"x", None]}) == {
            "a": [1, 2.5, b"x", None]
        }
        assert await client.execute_async(ECHO, "add", 1, b=2) == 3
        assert await client.execute_async(ECHO, "async_add", 2, 3) == 5
        assert [x async for x in client.stream_async(ECHO, "count", 5)] == [0, 1, 2, 3, 4]
        assert [x async for x in client.stream_async(ECHO, "acount", 3)] == [0, 1, 2]
        with pytest.raises(dirty.DirtyAppError, match="kaput") as info:
            await client.execute_async(ECHO, "fail", "kaput")
        assert "RuntimeError: kaput" in (info.value.traceback or "")
        got = []
        with pytest.raises(dirty.DirtyAppError, match="broke mid-stream"):
            async for x in client.stream_async(ECHO, "fail_midway", 2):
                got.append(x)
        assert got == [0, 1]
        with pytest.raises(dirty.DirtyAppNotFoundError):
            await client.execute_async("no.such:App", "x")
        blob = bytes(range(256)) * 4096  # 1 MiB each way, by reference
        assert await client.execute_async(ECHO, "echo", blob) == blob
        assert (await client.status_async())["worker_count"] >= 1
        await client.stash_request_async(1, "asyncio_table", "k", [1, 2])  # put
        assert await client.stash_request_async(2, "asyncio_table", "k") == [1, 2]  # get
        await client.close_async()

    await _in_asyncio(scenario)


async def test_many_tasks_share_one_client(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=2, dirty_threads=4)
    client = dirty.DirtyClient(socket_path)

    blobs = [bytes([i]) * (1 << 20) for i in range(6)]  # writes that fill the socket

    async def scenario() -> list[Any]:
        results = await asyncio.gather(
            *(client.execute_async(ECHO, "add", i, 1000) for i in range(200)),
            *(client.execute_async(ECHO, "echo", blob) for blob in blobs),
        )
        await client.close_async()
        return results

    assert await _in_asyncio(scenario) == [i + 1000 for i in range(200)] + blobs


async def test_abandoned_stream_timeout_and_cancellation_leave_the_client_usable(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=2)
    client = dirty.DirtyClient(socket_path, timeout=5)

    async def scenario() -> None:
        async for i in client.stream_async(ECHO, "endless", "asyncio"):
            if i == 3:
                break
        assert await client.execute_async(ECHO, "echo", "after") == "after"
        while not await client.execute_async(ECHO, "was_stopped", "asyncio"):
            await asyncio.sleep(0.01)  # (the END reaches the worker's generator)
        client.timeout = 0.2
        with pytest.raises(dirty.DirtyTimeoutError):
            await client.execute_async(ECHO, "sleep", 1.0)
        client.timeout = 5
        call = asyncio.ensure_future(client.execute_async(ECHO, "sleep", 1.0))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await client.execute_async(ECHO, "echo", "still") == "still"
        await client.close_async()

    await _in_asyncio(scenario)


def _serve_once(path: str, reply: bytes) -> threading.Thread:
    """A fake pool: accepts one connection, reads one request, writes ``reply``, closes."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        if reply:
            conn.sendall(reply)
        conn.close()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("reply", "error", "match"),
    [
        (b"", dirty.DirtyConnectionError, "closed the connection"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", dirty.DirtyProtocolError, "magic=b'HT'"),
        (header(0x7F, 0, 1), dirty.DirtyProtocolError, "type=0x7f"),
    ],
)
async def test_a_pool_that_hangs_up_or_sends_garbage_fails_the_call_typed(
    tmp_path: Any, reply: bytes, error: type[Exception], match: str
) -> None:
    path = str(tmp_path / "fake.sock")
    thread = _serve_once(path, reply)
    client = dirty.DirtyClient(path, timeout=10)

    async def scenario() -> None:
        with pytest.raises(error, match=match):
            await client.execute_async(ECHO, "echo", 1)
        await client.close_async()

    await _in_asyncio(scenario)
    thread.join(5)


async def test_missing_socket_is_a_connection_error(tmp_path: Any) -> None:
    client = dirty.DirtyClient(os.path.join(tmp_path, "none.sock"))

    async def scenario() -> None:
        with pytest.raises(dirty.DirtyConnectionError, match="cannot connect"):
            await client.execute_async(ECHO, "echo", 1)

    await _in_asyncio(scenario)


def _lost(why: object) -> dirty.DirtyConnectionError:
    return dirty.DirtyConnectionError(str(why))


def test_writes_wait_while_the_transport_is_paused() -> None:
    # Flow control, deterministically: a send waits from pause_writing to resume_writing, and
    # a lost connection releases it (the call then fails on the broken connection).
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for release in ("resume", "lost"):
            conn = _AsyncioConn(loop, _lost)
            protocol = _Protocol(conn, _lost)
            protocol.pause_writing()
            drained = asyncio.ensure_future(protocol.drain())
            await asyncio.sleep(0)
            assert not drained.done()
            if release == "resume":
                protocol.resume_writing()
            else:
                protocol.connection_lost(None)
                assert isinstance(conn.broken, dirty.DirtyConnectionError)
            await asyncio.wait_for(drained, 5)
            await protocol.drain()  # not paused: returns at once

    asyncio.run(scenario())


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
