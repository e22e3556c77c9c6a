"""The pool end to end: real worker processes, our async client on trio."""

from __future__ import annotations

from typing import Any

from apps import dirty

from .conftest import ECHO


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
