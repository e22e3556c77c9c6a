"""What every client transport (sync, asyncio, trio) shares: the module-level helpers
(``get_dirty_client``, ``close_dirty_client``, ``set_dirty_socket_path``,
``GUNICORN_DIRTY_SOCKET``), successive and concurrent event loops, timeouts, large payloads,
reconnecting after a pool restart."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import supervisors
import wire
from apps import dirty
from apps.dirty import _client, _client_shared
from apps.dirty._protocol import RESPONSE

from .conftest import ECHO
from .helpers import BOUND, EchoPool, _in_asyncio


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
    client = dirty.DirtyClient(socket_path, timeout=BOUND)
    restarted = threading.Event()
    first_done = threading.Event()

    async def scenario() -> list[Any]:
        got = [await client.execute_async(ECHO, "echo", 1)]
        first_done.set()
        # (a restart, two workers stopped and two started, takes seconds on a loaded machine:
        # the second call must follow it, not race it)
        assert await asyncio.to_thread(restarted.wait, 2 * BOUND), "the pool did not restart"
        got.append(await client.execute_async(ECHO, "echo", 2))
        await client.close_async()
        return got

    async with trio.open_nursery() as nursery:
        results: list[Any] = []

        async def run() -> None:
            results.append(await _in_asyncio(scenario))

        nursery.start_soon(run)
        assert await trio.to_thread.run_sync(first_done.wait, BOUND)
        await _restart(start_pool)
        restarted.set()
    assert results == [[1, 2]]


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


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        (("hello",), {}),
        ((1, 2.5, None, True, [1, {"a": b"x"}]), {"k": "v", "n": {1: 2}}),
        ((b"\x00" * (1 << 16), "small"), {}),  # a large bytes goes by reference
        ((), {"blob": b"\x01" * (1 << 16)}),
    ],
)
def test_every_client_sends_a_request_as_wire_request_parts_encodes_it(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    parts = _client_shared._request(7, ECHO, "echo", args, kwargs)
    expected = wire.request_parts(7, ECHO, "echo", args, kwargs)
    assert b"".join(bytes(p) for p in parts) == b"".join(bytes(p) for p in expected)
    assert len(parts) == len(expected)


def test_a_request_that_cannot_be_encoded_is_the_callers_protocol_error() -> None:
    with pytest.raises(dirty.DirtyProtocolError, match="cannot be sent"):
        _client_shared._request(7, ECHO, "echo", ({1, 2},), {})
    with pytest.raises(dirty.DirtyProtocolError, match="cannot be sent"):
        _client_shared._request(7, ECHO, "echo", (), {"big": 1 << 70})


def test_a_reply_payload_gives_its_result_or_a_typed_error() -> None:
    def payload(value: Any) -> bytes:
        return wire.tlv_encode(value, version=1)

    assert _client_shared._result(RESPONSE, payload({"result": [1, "x"]})) == [1, "x"]
    assert _client_shared._result(RESPONSE, payload({"other": 1})) is None
    assert _client_shared._result(RESPONSE, b"") is None  # (an empty payload: no result)
    with pytest.raises(dirty.DirtyProtocolError, match="must be a dict"):
        _client_shared._result(RESPONSE, payload([1]))
    with pytest.raises(dirty.DirtyProtocolError, match="malformed payload"):
        _client_shared._result(RESPONSE, b"\x21\x00\x00\x00\x09")
