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
