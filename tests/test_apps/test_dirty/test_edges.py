"""Edges of the dirty pool against Gunicorn 27's documented behaviour and the spec.

Real worker processes (the ``start_pool`` fixture); the apps below are loaded by the workers
from this module (``tests.test_apps.test_dirty.test_edges:...``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from apps import dirty
from apps.dirty import _protocol
from apps.dirty._context import ROUTER, WorkerDraining

from .conftest import ECHO, LIMITED

HERE = "tests.test_apps.test_dirty.test_edges"
AUDIT = f"{HERE}:AuditApp"
STASHER = f"{HERE}:StashUserApp"
GAPP = f"{HERE}:GunicornStyleApp"


class AuditApp(dirty.DirtyApp):
    """Actions for the edges the tests probe."""

    stashes = ("audit_declared",)

    def bad_result(self) -> Any:
        return {1, 2}  # a set: not TLV-encodable

    def bad_chunk(self) -> Iterator[Any]:
        yield 1
        yield object()  # not TLV-encodable
        yield 3

    async def abad_chunk(self) -> AsyncIterator[Any]:
        yield 1
        await asyncio.sleep(0)
        yield object()

    async def afail_midway(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i
        raise KeyError("async broke")

    async def araise(self) -> None:
        await asyncio.sleep(0)
        raise ZeroDivisionError("async boom")

    def stall_stream(self, seconds: float) -> Iterator[int]:
        yield 1
        time.sleep(seconds)
        yield 2

    def nothing(self) -> None:
        return None

    def echo(self, value: Any) -> Any:
        return value

    def gen_none(self) -> Iterator[Any]:
        yield None
        yield 0
        yield ""


class StashUserApp(dirty.DirtyApp):
    """Uses the stash from inside a dirty worker (sync and async actions)."""

    def use(self, table: str) -> dict[str, Any]:
        from apps.dirty import stash

        stash.put(table, "user:1", {"n": 1})
        stash.put(table, "user:2", None)
        stash.put(table, "other", 3)
        t = stash.table(table)
        t["k"] = "v"
        out: dict[str, Any] = {
            "get": stash.get(table, "user:1"),
            "none_value": stash.get(table, "user:2", "dflt"),
            "default": stash.get(table, "missing", "dflt"),
            "keys": sorted(stash.keys(table, "user:*")),
            "info": stash.info(table),
            "exists": [stash.exists(table), stash.exists(table, "other"), stash.exists(table, "x")],
            "counter": [stash.update_counter(table, "c"), stash.update_counter(table, "c", 4)],
            "insert_new": [stash.insert_new(table, "once", 1), stash.insert_new(table, "once", 2)],
            "cas": [
                stash.compare_and_set(table, "once", 1, 10),
                stash.compare_and_set(table, "once", 1, 11),
                stash.compare_and_set(table, "fresh", stash.ABSENT, "x"),
            ],
            "len": len(t),
            "contains": ["k" in t, "nope" in t],
            "table_get": t.get("nope", "d"),
        }
        try:
            t["nope"]
        except KeyError:
            out["missing_item"] = "KeyError"
        return out

    async def ause(self, table: str) -> list[Any]:
        from apps.dirty import stash

        stash.ensure(table)
        stash.put(table, "a", 1)
        return [stash.get(table, "a"), stash.get(table, "zz", "dflt"), stash.tables()]


try:
    _GunicornDirtyApp: Any = importlib.import_module("gunicorn.dirty.app").DirtyApp
except ImportError:  # pragma: no cover - gunicorn is a test extra
    _GunicornDirtyApp = dirty.DirtyApp


class GunicornStyleApp(_GunicornDirtyApp):
    """An app written for Gunicorn (subclassing gunicorn.dirty.app.DirtyApp)."""

    def init(self) -> None:
        self.base = 10

    def add(self, a: int) -> int:
        return self.base + a

    async def aadd(self, a: int) -> int:
        await asyncio.sleep(0)
        return self.base + a

    def gen(self, n: int) -> Iterator[int]:
        yield from range(n)

    async def agen(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    def _hidden(self) -> str:
        return "no"


# --------------------------------------------------------------------------- helpers


async def _raw(socket_path: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(socket_path)
    return sock


async def _read_frames(sock: Any, count: int) -> list[tuple[int, int, bytes]]:
    """Read until ``count`` frames came (or the pool closed the socket)."""
    splitter = wire.FrameSplitter()
    frames: list[tuple[int, int, bytes]] = []
    with trio.fail_after(5):
        while len(frames) < count:
            data = await sock.recv(65536)
            if not data:
                break
            frames += splitter.feed(data)
    return frames


async def _read_until_closed(sock: Any) -> bytes:
    data = b""
    with trio.fail_after(5):
        while chunk := await sock.recv(65536):
            data += chunk
    return data


def _error_of(payload: bytes) -> dict[str, Any]:
    body = _protocol.decode_payload(payload)
    assert isinstance(body, dict)
    error = body["error"]
    assert isinstance(error, dict)
    return error


# ---------------------------------------------------------------- stash, our client


async def test_stash_edges_sync_client(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[ECHO, AUDIT], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)

    def ops() -> None:
        assert "audit_declared" in s.tables()  # AuditApp.stashes, created at start
        assert s.info("audit_declared") == {"size": 0, "table": "audit_declared"}
        s.put("e", "none", None)
        assert s.get("e", "none", "dflt") is None  # a stored None is not "missing"
        assert s.exists("e", "none")
        assert s.keys("missing_table") == []
        assert s.get("missing_table", "k", 5) == 5
        assert not s.exists("missing_table") and not s.exists("missing_table", "k")
        s.clear("missing_table")  # no error, and no table created
        assert "missing_table" not in s.tables()
        assert s.delete("missing_table", "k") is False
        assert s.delete_table("missing_table") is False
        s.ensure("ens")
        s.ensure("ens")  # idempotent
        assert s.info("ens") == {"size": 0, "table": "ens"}
        for key in ("user:1", "user:22", "usr:3", "User:4"):
            s.put("g", key, key)
        assert sorted(s.keys("g", "user:?")) == ["user:1"]
        assert sorted(s.keys("g", "u[sS]*")) == ["user:1", "user:22", "usr:3"]
        assert sorted(s.keys("g", "")) == ["User:4", "user:1", "user:22", "usr:3"]
        s.put("g", ["composite", 1], "list key")
        assert s.get("g", ["composite", 1]) == "list key"
        assert ["composite", 1] in s.keys("g", "*composite*")
        with pytest.raises(dirty.StashError):
            s.put("g", {"a": 1}, "dict key")
        assert s.delete_table("g") is True
        with pytest.raises(dirty.StashTableNotFoundError) as info:
            s.info("g")
        assert info.value.table_name == "g" and isinstance(info.value, LookupError)
        for i in range(3):  # a deleted table comes back on the next put, empty
            s.put("g", "k", i)
            assert s.keys("g") == ["k"] and s.get("g", "k") == i
            assert s.delete_table("g") is True and not s.exists("g")

    await trio.to_thread.run_sync(ops)
    client.close()


async def test_stash_table_object_is_dict_like(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)

    def ops() -> None:
        t = s.table("dl")
        assert t.name == "dl"
        assert len(t) == 0  # a missing table is empty
        assert "x" not in t
        assert t.get("x") is None and t.get("x", 1) == 1
        with pytest.raises(KeyError):
            t["x"]
        with pytest.raises(KeyError):
            del t["x"]
        t["a"] = 1
        t["b"] = None
        assert t["b"] is None  # a stored None is returned, not a KeyError
        assert len(t) == 2 and sorted(t) == ["a", "b"]
        assert sorted(t.items()) == [("a", 1), ("b", None)]
        assert sorted(t.values(), key=repr) == [1, None]
        del t["a"]
        assert "a" not in t and len(t) == 1
        t.clear()
        assert len(t) == 0 and list(t) == []

    await trio.to_thread.run_sync(ops)
    client.close()


async def test_stash_atomic_operations_edges(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)

    def ops() -> None:
        assert s.update_counter("at", "n", 5, default=100) == 105  # default, then the incr
        assert s.update_counter("at", "n", -10) == 95
        s.put("at", "str", "x")
        with pytest.raises(dirty.StashError):
            s.update_counter("at", "str")
        with pytest.raises(dirty.StashError):
            s.update_counter("at", "n", 1.5)  # type: ignore[arg-type]
        assert s.get("at", "n") == 95  # unchanged by the failed ones
        assert s.compare_and_set("at", "missing", None, 1) is False  # missing is not None
        s.put("at", "nv", None)
        assert s.compare_and_set("at", "nv", None, 2) is True
        assert s.compare_and_set("at", "nv", dirty.stash.ABSENT, 3) is False
        assert s.get("at", "nv") == 2
        assert s.insert_new("at", "nv", 9) is False
        for bad in (0, -1):
            with pytest.raises(dirty.StashError):
                s.put("at", "ttl", 1, ttl=bad)
            with pytest.raises(dirty.StashError):
                s.insert_new("at", "ttl2", 1, ttl=bad)
        assert not s.exists("at", "ttl") and not s.exists("at", "ttl2")

    await trio.to_thread.run_sync(ops)
    client.close()


async def test_stash_ttl_edges_on_a_mock_clock(
    start_pool: Any, socket_path: str, mock_clock: trio.testing.MockClock
) -> None:
    """Per-key TTL runs on the node's trio clock: jump it instead of sleeping."""
    mock_clock.rate = 1.0
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    s = dirty.stash.StashClient(client)
    run = trio.to_thread.run_sync
    await run(lambda: s.put("ttl", "gone", 1, ttl=5))
    await run(lambda: s.put("ttl", "kept", 1, ttl=5))
    await run(lambda: s.put("ttl", "kept", 2))  # a plain put makes it permanent
    await run(lambda: s.insert_new("ttl", "new", 1, ttl=5))
    await run(lambda: s.compare_and_set("ttl", "cas", dirty.stash.ABSENT, 1, ttl=5))
    await run(lambda: s.put("ttl", "forever", 0))
    assert await run(s.info, "ttl") == {"size": 5, "table": "ttl"}
    mock_clock.jump(10)
    assert sorted(await run(s.keys, "ttl")) == ["forever", "kept"]
    assert await run(s.info, "ttl") == {"size": 2, "table": "ttl"}
    assert await run(s.exists, "ttl", "gone") is False
    assert await run(s.get, "ttl", "gone", "dflt") == "dflt"
    assert await run(s.get, "ttl", "kept") == 2
    assert await run(lambda: s.insert_new("ttl", "new", 2)) is True  # expired: insertable
    assert await run(lambda: s.update_counter("ttl", "cas", 1)) == 1  # expired: default 0
    client.close()


async def test_stash_key_not_found_over_the_wire_keeps_its_key(
    start_pool: Any, socket_path: str
) -> None:
    """A StashKeyNotFoundError rebuilt from its ERROR frame has Gunicorn's fields
    (``table_name`` and ``key``), like the one raised in the pool."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    with pytest.raises(dirty.StashKeyNotFoundError) as info:
        await trio.to_thread.run_sync(client.stash_request, 2, "kt", "the-key")
    assert info.value.table_name == "kt"
    assert "the-key" in str(info.value)
    client.close()


async def test_stash_key_not_found_over_the_wire_has_the_key_field(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    try:
        with pytest.raises(dirty.StashKeyNotFoundError) as info:
            await trio.to_thread.run_sync(client.stash_request, 2, "kt", "the-key")
        assert info.value.key == "the-key"
    finally:
        client.close()


async def test_stash_from_inside_a_dirty_worker(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[STASHER], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    with trio.fail_after(10):
        out = await client.execute_async(STASHER, "use", "inside")
    assert out == {
        "get": {"n": 1},
        "none_value": None,
        "default": "dflt",
        "keys": ["user:1", "user:2"],
        "info": {"size": 4, "table": "inside"},
        "exists": [True, True, False],
        "counter": [1, 5],
        "insert_new": [True, False],
        "cas": [True, False, True],
        "len": 7,
        "contains": [True, False],
        "table_get": "d",
        "missing_item": "KeyError",
    }
    with trio.fail_after(10):
        got = await client.execute_async(STASHER, "ause", "from_async")
    assert got[:2] == [1, "dflt"] and "from_async" in got[2] and "inside" in got[2]
    # The web side sees what the worker wrote.
    s = dirty.stash.StashClient(client)
    assert await trio.to_thread.run_sync(s.get, "inside", "once") == 10
    await client.close_async()
    client.close()


async def test_stash_module_functions_use_the_shared_client(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    assert dirty.get_dirty_socket_path() == socket_path  # the listener set it

    def ops() -> list[Any]:
        dirty.stash.put("mod", "k", [1])
        return [
            dirty.stash.get("mod", "k"),
            dirty.stash.get("mod", "x", "d"),
            dirty.stash.keys("mod"),
            dirty.stash.exists("mod", "k"),
            dirty.stash.delete("mod", "k"),
            dirty.stash.info("mod"),
        ]

    try:
        got = await trio.to_thread.run_sync(ops)
    finally:
        dirty.close_dirty_client()
    assert got == [[1], "d", ["k"], True, True, {"size": 0, "table": "mod"}]


# ------------------------------------------------------------ Gunicorn's own client


async def test_gunicorn_client_errors_are_typed_with_their_fields(
    start_pool: Any, socket_path: str
) -> None:
    gd = pytest.importorskip("gunicorn.dirty")
    await start_pool(dirty_apps=[ECHO, AUDIT], dirty_workers=1)

    def use() -> None:
        client = gd.DirtyClient(socket_path, timeout=10)
        try:
            with pytest.raises(gd.DirtyAppNotFoundError) as nf:
                client.execute("no.such:App", "x")
            assert nf.value.app_path == "no.such:App"
            with pytest.raises(gd.DirtyAppError) as ae:
                client.execute(ECHO, "fail", "kaput")
            assert ae.value.app_path == ECHO and ae.value.action == "fail"
            assert "RuntimeError: kaput" in ae.value.traceback
            with pytest.raises(gd.DirtyAppError, match="Unknown action: _private"):
                client.execute(ECHO, "_private")
            got: list[Any] = []
            with pytest.raises(gd.DirtyAppError, match="broke mid-stream"):
                for x in client.stream(ECHO, "fail_midway", 2):
                    got.append(x)
            assert got == [0, 1]
            assert list(client.stream(AUDIT, "gen_none")) == [None, 0, ""]
            with pytest.raises(gd.DirtyAppError):
                client.execute(AUDIT, "bad_result")
            assert client.execute(ECHO, "add", 1, b=2) == 3
            assert client.execute(ECHO, "async_add", 1, 2) == 3
            assert list(client.stream(ECHO, "acount", 3)) == [0, 1, 2]
        finally:
            client.close()

    await trio.to_thread.run_sync(use)


async def test_gunicorn_async_client_against_the_pool(start_pool: Any, socket_path: str) -> None:
    gd = pytest.importorskip("gunicorn.dirty")
    await start_pool(dirty_workers=1)

    async def main() -> list[Any]:
        client = gd.DirtyClient(socket_path, timeout=10)
        try:
            out = [await client.execute_async(ECHO, "add", 40, 2)]
            out.append([x async for x in client.stream_async(ECHO, "count", 3)])
            try:
                await client.execute_async(ECHO, "fail", "async kaput")
            except gd.DirtyAppError as exc:
                out.append(exc.message)
            out.append(await client.execute_async(ECHO, "echo", "after"))
            return out
        finally:
            await client.close_async()

    got = await trio.to_thread.run_sync(asyncio.run, main())
    assert got == [42, [0, 1, 2], "async kaput", "after"]


async def test_gunicorn_stash_client_full_api(start_pool: Any, socket_path: str) -> None:
    pytest.importorskip("gunicorn.dirty")
    gstash: Any = importlib.import_module("gunicorn.dirty.stash")

    await start_pool(dirty_workers=1)

    def use() -> None:
        s = gstash.StashClient(socket_path, timeout=10)
        try:
            s.ensure("gs")
            assert s.info("gs") == {"size": 0, "table": "gs"}
            s.put("gs", "user:1", 1)
            s.put("gs", "user:2", 2)
            s.put("gs", "x", None)
            assert sorted(s.keys("gs", pattern="user:*")) == ["user:1", "user:2"]
            assert s.exists("gs") and s.exists("gs", "x") and not s.exists("gs", "y")
            assert s.delete("gs", "user:2") is True and s.delete("gs", "user:2") is False
            t = s.table("gs")
            assert len(t) == 2 and "user:1" in t and t["x"] is None
            with pytest.raises(KeyError):
                t["nope"]
            with pytest.raises(KeyError):
                del t["nope"]
            assert sorted(t.items(), key=repr) == [("user:1", 1), ("x", None)]
            s.clear("gs")
            assert s.keys("gs") == [] and s.info("gs")["size"] == 0
            s.delete_table("gs")
            assert "gs" not in s.tables() and not s.exists("gs")
            with pytest.raises(gstash.StashTableNotFoundError):
                s.info("gs")
            with pytest.raises(gstash.StashError):
                s._execute(99, "gs")  # unknown op
            assert s.get("gs", "k", "d") == "d"  # still usable after the errors
        finally:
            s.close()

    await trio.to_thread.run_sync(use)


async def test_gunicorn_protocol_status_and_manage_messages(
    start_pool: Any, socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``gunicornc``'s handlers send: dict messages, a str id for STATUS."""
    pytest.importorskip("gunicorn.dirty")
    protocol: Any = importlib.import_module("gunicorn.dirty.protocol")
    MANAGE_OP_ADD, MANAGE_OP_REMOVE = protocol.MANAGE_OP_ADD, protocol.MANAGE_OP_REMOVE
    DirtyProtocol = protocol.DirtyProtocol

    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:2"], dirty_workers=2)

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(socket_path)
        try:
            DirtyProtocol.write_message(sock, request)
            response: dict[str, Any] = DirtyProtocol.read_message(sock)
            return response
        finally:
            sock.close()

    status = await trio.to_thread.run_sync(
        ask, {"type": DirtyProtocol.MSG_TYPE_STATUS, "id": "ctl-status-1"}
    )
    assert status["type"] == DirtyProtocol.MSG_TYPE_RESPONSE
    workers = status["result"]["workers"]
    assert len(workers) == 2
    for w in workers:
        assert {"pid", "age", "apps", "booted", "last_heartbeat"} <= set(w)
    with caplog.at_level(logging.WARNING, logger="apps.dirty"):
        removed = await trio.to_thread.run_sync(
            ask,
            {"type": DirtyProtocol.MSG_TYPE_MANAGE, "id": 1, "op": MANAGE_OP_REMOVE, "count": 1},
        )
    assert removed["type"] == DirtyProtocol.MSG_TYPE_RESPONSE
    assert removed["result"]["removed"] == 0 and removed["result"]["total_workers"] == 2
    assert any("never shrinks below 2" in r.getMessage() for r in caplog.records)
    added = await trio.to_thread.run_sync(
        ask, {"type": DirtyProtocol.MSG_TYPE_MANAGE, "id": 2, "op": MANAGE_OP_ADD, "count": 1}
    )
    assert added["result"]["spawned"] == 1 and added["result"]["total_workers"] == 3
    bad = await trio.to_thread.run_sync(
        ask, {"type": DirtyProtocol.MSG_TYPE_MANAGE, "id": 3, "op": 7, "count": 1}
    )
    assert bad["type"] == DirtyProtocol.MSG_TYPE_ERROR


async def test_gunicorn_written_app_runs_in_the_pool(start_pool: Any, socket_path: str) -> None:
    pytest.importorskip("gunicorn.dirty")
    await start_pool(dirty_apps=[GAPP], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(GAPP, "add", 1) == 11
    assert await client.execute_async(GAPP, "aadd", 2) == 12
    assert [x async for x in client.stream_async(GAPP, "gen", 3)] == [0, 1, 2]
    assert [x async for x in client.stream_async(GAPP, "agen", 3)] == [0, 1, 2]
    with pytest.raises(dirty.DirtyAppError, match="Unknown action: _hidden"):
        await client.execute_async(GAPP, "_hidden")
    await client.close_async()


# ------------------------------------------------------------------ errors, actions


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


# ------------------------------------------------------------- timeouts, streams


async def test_client_timeout_mid_stream_is_a_dirty_timeout_error(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[AUDIT], dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=0.3)
    got: list[Any] = []
    with pytest.raises(dirty.DirtyTimeoutError) as info:
        async for x in client.stream_async(AUDIT, "stall_stream", 1.5):
            got.append(x)
    assert got == [1] and info.value.timeout == 0.3
    sync_got: list[Any] = []

    def sync() -> None:
        with pytest.raises(dirty.DirtyTimeoutError):
            for x in client.stream(AUDIT, "stall_stream", 1.5):
                sync_got.append(x)

    await trio.to_thread.run_sync(sync)
    assert sync_got == [1]
    assert await client.execute_async(AUDIT, "echo", "a") == "a"
    assert await trio.to_thread.run_sync(client.execute, AUDIT, "echo", "s") == "s"
    await client.close_async()
    client.close()


async def test_dirty_timeout_mid_stream_is_a_dirty_timeout_error(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[AUDIT], dirty_workers=1, dirty_timeout=0.5)
    client = dirty.DirtyClient(socket_path, timeout=10)
    got: list[Any] = []
    with trio.fail_after(5):
        with pytest.raises(dirty.DirtyTimeoutError) as info:
            async for x in client.stream_async(AUDIT, "stall_stream", 10):
                got.append(x)
    assert got == [1] and info.value.timeout == 0.5
    await client.close_async()


async def test_abandoned_streams_then_the_same_stream_again(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=1)
    client = dirty.DirtyClient(socket_path, timeout=10)
    for round_ in range(3):
        it = client.stream_async(ECHO, "endless", f"a{round_}")
        assert await it.__anext__() == 0
        await it.aclose()  # type: ignore[attr-defined]
        assert [x async for x in client.stream_async(ECHO, "count", 5)] == list(range(5))

    def sync() -> list[Any]:
        it = client.stream(ECHO, "endless", "s")
        first = next(it)
        it.close()  # type: ignore[attr-defined]
        return [first, list(client.stream(ECHO, "count", 4))]

    assert await trio.to_thread.run_sync(sync) == [0, [0, 1, 2, 3]]
    with trio.fail_after(5):  # every abandoned generator was stopped in the worker
        for tag in ("a0", "a1", "a2", "s"):
            while not await client.execute_async(ECHO, "was_stopped", tag):
                await trio.sleep(0.01)
    await client.close_async()
    client.close()


# -------------------------------------------------------------------- manage


async def test_manage_edges(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[LIMITED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    added = await trio.to_thread.run_sync(client.manage, "add", 1)
    assert added["spawned"] == 0 and added["success"] is True
    assert added["reason"] == "All apps have reached their worker limits"
    removed = await trio.to_thread.run_sync(client.manage, "remove", 5)
    assert removed["removed"] == 0 and removed["total_workers"] == 1
    status = await client.status_async()
    assert status["worker_count"] == 1
    client.close()
    await client.close_async()


async def test_manage_remove_never_drops_a_limited_app_below_n(
    start_pool: Any, socket_path: str
) -> None:
    # Workers 1..2 hold LIMITED:2; add two more (ECHO only), then remove three: the two extra
    # go, and the pool stops at 2 with LIMITED on both remaining workers.
    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:2"], dirty_workers=2)
    client = dirty.DirtyClient(socket_path)
    added = await trio.to_thread.run_sync(client.manage, "add", 2)
    assert added["spawned"] == 2
    removed = await trio.to_thread.run_sync(client.manage, "remove", 3)
    assert removed["removed"] == 2 and removed["total_workers"] == 2
    status = await client.status_async()
    live = [w for w in status["workers"] if not w["draining"]]
    assert all(LIMITED in w["apps"] for w in live) and len(live) == 2
    assert status["app_workers"][LIMITED] == 2
    client.close()
    await client.close_async()


# ---------------------------------------------------------------- bad frames


async def test_bad_frames_from_a_client(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    # A known type a client may not send: an ERROR for that id; the connection carries on.
    sock = await _raw(socket_path)
    good = wire.request_parts(8, ECHO, "echo", ("x",))[0]
    await sock.send(wire.encode_header(0x02, 0, 7) + good)
    frames = await _read_frames(sock, 2)
    by_id = {rid: (mtype, payload) for mtype, rid, payload in frames}
    assert by_id[7][0] == 0x03
    assert _error_of(by_id[7][1])["error_type"] == "DirtyProtocolError"
    assert by_id[8][0] == 0x02
    # A STASH whose payload is not a dict, and one with no int op: errors, then still served.
    not_dict = b"\x11\x00\x00\x00\x01x"
    data = wire.encode_header(0x10, len(not_dict), 20) + not_dict
    data += wire.encode_dirty(0x10, 21, {"table": "t"})  # no op
    data += wire.encode_dirty(0x12, 22, {"op": 9, "count": 1})  # no such MANAGE op
    await sock.send(data + wire.request_parts(30, ECHO, "echo", ("y",))[0])
    frames = await _read_frames(sock, 4)
    by_id = {rid: (mtype, payload) for mtype, rid, payload in frames}
    assert [by_id[r][0] for r in (20, 21, 22)] == [0x03] * 3
    assert by_id[30][0] == 0x02
    sock.close()
    # An unknown message type or an oversized length: an ERROR (id 0), then the close.
    for head in (
        struct.pack(">2sBBIQ", b"GD", 1, 0x06, 0, 1),
        struct.pack(">2sBBIQ", b"GD", 1, 0x01, (64 << 20) + 1, 1),
        struct.pack(">2sBBIQ", b"GD", 2, 0x01, 0, 1),
    ):
        sock = await _raw(socket_path)
        await sock.send(head)
        data = await _read_until_closed(sock)
        [(mtype, rid, payload)] = wire.FrameSplitter().feed(data)
        assert mtype == 0x03 and rid == 0
        assert _error_of(payload)["error_type"] == "DirtyProtocolError"
        sock.close()
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(ECHO, "echo", "fine") == "fine"
    await client.close_async()


async def test_many_requests_in_flight_on_one_raw_connection(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=2, dirty_threads=2)
    sock = await _raw(socket_path)
    data = b"".join(
        wire.request_parts(rid, ECHO, "sleep" if rid % 2 else "echo", (0.2 if rid % 2 else rid,))[0]
        for rid in range(1, 11)
    )
    # and a stash and a status on the same connection, mixed in
    stash = wire.encode_dirty(0x10, 50, {"op": 9, "table": ""})
    await sock.send(data + stash + wire.encode_header(0x11, 0, 60))
    frames = await _read_frames(sock, 12)
    by_id = {rid: (mtype, _protocol.decode_payload(p)) for mtype, rid, p in frames}
    assert set(by_id) == set(range(1, 11)) | {50, 60}
    for rid in range(1, 11):
        assert by_id[rid] == (0x02, {"result": 0.2 if rid % 2 else rid})
    assert by_id[60][1]["result"]["worker_count"] == 2
    sock.close()


async def test_client_disconnecting_mid_call_and_mid_stash(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=1)
    sock = await _raw(socket_path)
    await sock.send(wire.request_parts(1, ECHO, "sleep", (0.3,))[0])
    await trio.testing.wait_all_tasks_blocked()
    sock.close()  # gone before its reply
    client = dirty.DirtyClient(socket_path, timeout=10)
    with trio.fail_after(5):
        assert await client.execute_async(ECHO, "echo", "after") == "after"
        status = await client.status_async()
    assert status["worker_count"] == 1
    await client.close_async()


async def test_dirty_timeout_does_not_count_time_queued_behind_busy_threads(
    start_pool: Any, socket_path: str
) -> None:
    """dirty_threads=1: four 0.4 s calls run one after another in the worker. None runs
    anywhere near dirty_timeout=1 s, so none may time out and the worker must not be killed."""
    await start_pool(dirty_workers=1, dirty_threads=1, dirty_timeout=1.0)
    client = dirty.DirtyClient(socket_path, timeout=10)
    before = [w["pid"] for w in (await client.status_async())["workers"]]
    outcomes: list[Any] = []

    async def call() -> None:
        try:
            outcomes.append(await client.execute_async(ECHO, "sleep", 0.4))
        except dirty.DirtyError as exc:
            outcomes.append(type(exc).__name__)

    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(call)
        assert outcomes == [0.4] * 4
        assert [w["pid"] for w in (await client.status_async())["workers"]] == before
    finally:
        await client.close_async()


async def test_dirty_timeout_counts_from_when_a_queued_call_starts(
    start_pool: Any, socket_path: str
) -> None:
    """dirty_threads=1: a call queued behind a 0.3 s call is exempt while it waits, and timed
    from when its thread takes it: stuck there, it still gets the worker killed."""
    await start_pool(dirty_workers=1, dirty_threads=1, dirty_timeout=1.0)
    client = dirty.DirtyClient(socket_path, timeout=20)
    before = [w["pid"] for w in (await client.status_async())["workers"]]
    outcomes: dict[str, Any] = {}

    async def call(name: str, seconds: float) -> None:
        try:
            outcomes[name] = await client.execute_async(ECHO, "sleep", seconds)
        except dirty.DirtyError as exc:
            outcomes[name] = exc

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "first", 0.3)
                await trio.sleep(0.05)
                nursery.start_soon(call, "stuck", 30.0)
        assert outcomes["first"] == 0.3
        assert isinstance(outcomes["stuck"], dirty.DirtyTimeoutError)
        with trio.fail_after(10):
            while [w["pid"] for w in (await client.status_async())["workers"]] in ([], before):
                await trio.sleep(0.05)
    finally:
        await client.close_async()
