"""Errors a caller of the pool gets: typed classes carrying their fields, refused actions,
unencodable results, no worker for an app."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import otp
from apps import dirty
from apps.dirty._context import ROUTER, WorkerDraining

from .conftest import AUDIT, ECHO, LIMITED


async def test_error_classes_carry_their_fields(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[ECHO, AUDIT], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    with pytest.raises(dirty.DirtyAppNotFoundError) as nf:
        await client.execute_async("no.such:App", "x")
    assert nf.value.app_path == "no.such:App" and isinstance(nf.value, dirty.DirtyAppError)
    with pytest.raises(dirty.DirtyAppError) as ae:
        await client.execute_async(AUDIT, "araise")
    assert ae.value.app_path == AUDIT and ae.value.action == "araise"
    assert "ZeroDivisionError: async boom" in (ae.value.traceback or "")
    assert "traceback" not in str(ae.value)
    got: list[Any] = []
    with pytest.raises(dirty.DirtyAppError) as me:
        async for x in client.stream_async(AUDIT, "afail_midway", 2):
            got.append(x)
    assert got == [0, 1] and me.value.action == "afail_midway"
    assert "KeyError" in (me.value.traceback or "")
    await client.close_async()


async def test_private_dunder_and_non_callable_actions_are_refused(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[ECHO, AUDIT], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    for action in ("_private", "__init__", "__class__", "workers", "stashes", "no_such"):
        with pytest.raises(dirty.DirtyAppError, match=f"Unknown action: {action}"):
            await client.execute_async(ECHO, action)
    with pytest.raises(dirty.DirtyAppError, match="Unknown action: _private"):
        async for _ in client.stream_async(ECHO, "_private"):
            pass
    with pytest.raises(dirty.DirtyAppError, match="Unknown action: _private"):
        await trio.to_thread.run_sync(lambda: list(client.stream(ECHO, "_private")))
    assert await client.execute_async(ECHO, "echo", "ok") == "ok"
    await client.close_async()
    client.close()


async def test_unencodable_results_and_chunks_are_typed_errors(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[AUDIT], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=10)
    for _ in range(5):  # also once the action runs inline on the worker's reader thread
        with pytest.raises(dirty.DirtyAppError, match="set"):
            await client.execute_async(AUDIT, "bad_result")
    for action in ("bad_chunk", "abad_chunk"):
        got: list[Any] = []
        with pytest.raises(dirty.DirtyAppError):
            async for x in client.stream_async(AUDIT, action):
                got.append(x)
        assert got == [1]
    sync_got: list[Any] = []

    def sync() -> None:
        with pytest.raises(dirty.DirtyAppError):
            for x in client.stream(AUDIT, "bad_chunk"):
                sync_got.append(x)

    await trio.to_thread.run_sync(sync)
    assert sync_got == [1]
    assert await client.execute_async(AUDIT, "nothing") is None
    assert [x async for x in client.stream_async(AUDIT, "gen_none")] == [None, 0, ""]
    assert await trio.to_thread.run_sync(lambda: list(client.stream(AUDIT, "gen_none"))) == [
        None,
        0,
        "",
    ]
    assert await client.execute_async(AUDIT, "echo", "usable") == "usable"
    await client.close_async()
    client.close()


async def test_no_workers_available_carries_the_app_path(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[ECHO, LIMITED], dirty_workers=2)
    workers = await otp.call(ROUTER, "workers")
    [holder] = [pid for pid, info in workers.items() if LIMITED in info.apps]
    otp.cast(ROUTER, WorkerDraining(holder))  # the router stops routing to it
    await otp.call(ROUTER, "status")  # (handled after the cast)
    client = dirty.DirtyClient(socket_path)
    with pytest.raises(dirty.DirtyNoWorkersAvailableError) as info:
        await client.execute_async(LIMITED, "pid")
    assert info.value.app_path == LIMITED
    assert await client.execute_async(ECHO, "echo", 1) == 1
    await client.close_async()


async def test_unencodable_arguments_and_values_are_typed_dirty_errors(
    start_pool: Any, socket_path: str
) -> None:
    """Gunicorn's client raises DirtyProtocolError for a value TLV cannot carry; web apps
    catch DirtyError (as examples/flask_dirty does), so an untyped ValueError becomes a 500."""
    await start_pool(dirty_apps=[ECHO], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        deep: Any = 0
        for _ in range(300):
            deep = [deep]
        for bad in ({1, 2}, object(), 2**64, deep):
            with pytest.raises(dirty.DirtyError):
                client.execute(ECHO, "echo", bad)
            with pytest.raises(dirty.DirtyError):
                s.put("enc", "k", bad)
        assert client.execute(ECHO, "echo", "still fine") == "still fine"

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()
