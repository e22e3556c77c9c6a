"""The async client on asyncio (what FastAPI, Starlette and uvicorn apps use): each scenario runs
``asyncio.run`` in a thread against a real pool (worker processes) in the test's trio node."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from apps import dirty
from apps.dirty._client_asyncio import _AsyncioConn, _Protocol
from wire import encode_header as header

from .conftest import ECHO


async def _in_asyncio(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``scenario()`` on an asyncio event loop in a worker thread, with a deadline."""

    async def bounded() -> Any:
        async with asyncio.timeout(30):
            return await scenario()

    return await trio.to_thread.run_sync(asyncio.run, bounded())


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
