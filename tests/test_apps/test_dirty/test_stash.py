"""The stash (Gunicorn's dirty stash: shared tables served by the pool): the client API, Gunicorn's
reply shapes, TTLs and counters, contention from threads and workers, bad keys, values and
tables, and the server side surviving crashes."""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from apps import dirty
from apps.dirty import _application, _connection, _protocol
from apps.dirty import _stash as stash_server
from apps.dirty._protocol import ERROR, RESPONSE
from otp import ets

from .conftest import APPS, AUDIT, ECHO


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


async def _stash_op(
    op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
) -> tuple[int, Any]:
    """One STASH as a client sends it; the reply's (type, body)."""
    payload = _protocol.encode(wire.make_stash(3, op, table, key, value, pattern))[16:]
    [(mtype, _rid, body)] = wire.FrameSplitter().feed(await _connection._stash(3, payload))
    return mtype, _protocol.decode_payload(body)


async def _stash_result(op: int, table: str, **kw: Any) -> Any:
    mtype, body = await _stash_op(op, table, **kw)
    assert mtype == RESPONSE, body
    return body["result"]


PUT, GET, DELETE, KEYS, INFO, ENSURE, DELETE_TABLE, TABLES, EXISTS = 1, 2, 3, 4, 6, 7, 8, 9, 10
INCR, INSERT_NEW, CAS, PUT_TTL = 11, 12, 13, 14


@pytest.fixture
async def stash_node() -> Any:
    """A node running only the pool's stash (its supervisor, tables and manager)."""
    async with otp.open_node():
        await _application._start_stash_sup(("declared",))
        yield


@pytest.mark.parametrize("op", [INCR, INSERT_NEW, CAS, PUT_TTL])
async def test_an_extension_op_with_a_non_dict_value_is_refused(stash_node: Any, op: int) -> None:
    mtype, body = await _stash_op(op, "ext", key="k", value=5)
    assert await _stash_result(EXISTS, "ext", key="k") is False  # nothing was written
    assert mtype == ERROR and body["error"]["error_type"] == "StashError", body


@pytest.mark.parametrize("key", [math.nan, ["a", math.nan]], ids=["nan", "list-with-nan"])
async def test_a_nan_key_is_readable_back_or_refused(stash_node: Any, key: Any) -> None:
    for i in range(3):
        mtype, body = await _stash_op(PUT, "nan", key=key, value=i)
        if mtype == ERROR:  # refused: fine, if typed and nothing stored
            assert body["error"]["error_type"] == "StashError"
            assert await _stash_result(KEYS, "nan") == []
            return
    assert await _stash_result(INFO, "nan") == {"size": 1, "table": "nan"}
    assert await _stash_result(GET, "nan", key=key) == 2


@pytest.mark.parametrize(
    ("op", "key", "value"),
    [(PUT, math.nan, 1), (INCR, "k", 5), (PUT_TTL, ["a", math.nan], {"value": 1})],
    ids=["nan-key", "non-dict-args", "nan-in-list-key"],
)
async def test_a_refused_first_write_creates_no_table(
    stash_node: Any, op: int, key: Any, value: Any
) -> None:
    mtype, body = await _stash_op(op, "never", key=key, value=value)
    assert mtype == ERROR and body["error"]["error_type"] == "StashError", body
    assert await _stash_result(EXISTS, "never") is False


@pytest.mark.parametrize("op", [GET, DELETE, EXISTS])
async def test_a_bad_key_is_refused_on_a_missing_table_too(stash_node: Any, op: int) -> None:
    mtype, body = await _stash_op(op, "missing", key=["a", math.nan])
    assert mtype == ERROR and body["error"]["error_type"] == "StashError", body


async def test_tables_and_entries_survive_a_stash_manager_crash(stash_node: Any) -> None:
    """rest_for_one puts the table owners' supervisor before the manager: a crashed manager
    is restarted without touching a table; the declared stash is still there once."""
    assert await _stash_result(PUT, "keep", key="k", value={"v": [1, 2]}) is True
    manager = otp.whereis(stash_server.MANAGER)
    assert manager is not None
    otp.exit(manager, "kill")
    with trio.fail_after(5):
        while otp.whereis(stash_server.MANAGER) in (None, manager):
            await trio.sleep(0.01)
    assert await _stash_result(GET, "keep", key="k") == {"v": [1, 2]}
    assert await _stash_result(TABLES, "") == ["declared", "keep"]
    assert await _stash_result(PUT, "after", key="x", value=1) is True  # ensure works again


async def test_a_killed_table_owner_drops_only_its_table_and_it_can_be_recreated(
    stash_node: Any,
) -> None:
    for table in ("a", "b"):
        assert await _stash_result(PUT, table, key="k", value=table) is True
    info = ets.info(stash_server._ets_name("a"))
    assert info is not None
    otp.exit(info.owner, "kill")
    with trio.fail_after(5):
        while ets.whereis(stash_server._ets_name("a")) is not None:
            await trio.sleep(0.01)
    assert await _stash_result(EXISTS, "a") is False
    mtype, body = await _stash_op(GET, "a", key="k")
    assert mtype == ERROR and body["error"]["error_type"] == "StashKeyNotFoundError"
    assert await _stash_result(GET, "b", key="k") == "b"
    assert await _stash_result(PUT, "a", key="k", value=2) is True
    assert await _stash_result(GET, "a", key="k") == 2


async def test_concurrent_first_writes_to_a_new_table_all_land(
    stash_node: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """Twenty connections writing to a table that does not exist yet: one table is created
    (the manager serialises ensure), and no write is lost."""
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(functools.partial(_stash_result, PUT, "fresh", key=i, value=i))
        nursery.start_soon(
            functools.partial(_stash_result, INCR, "fresh", key="n", value={"incr": 1})
        )
        nursery.start_soon(
            functools.partial(_stash_result, INSERT_NEW, "fresh", key="once", value={"value": 1})
        )
    assert await _stash_result(INFO, "fresh") == {"size": 22, "table": "fresh"}
    assert sorted(await _stash_result(KEYS, "fresh", pattern="[0-9]*"), key=int) == list(range(20))
    assert [t for t in await _stash_result(TABLES, "") if t == "fresh"] == ["fresh"]


async def _stash(
    op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
) -> tuple[int, Any]:
    """One STASH as a client sends it (``None`` fields left out); the reply's (type, body)."""
    payload = _protocol.encode(_wire_stash(op, table, key, value, pattern))[16:]
    [(mtype, rid, body)] = wire.FrameSplitter().feed(await _connection._stash(3, payload))
    assert rid == 3
    return mtype, _protocol.decode_payload(body)


def _wire_stash(op: int, table: str, key: Any, value: Any, pattern: str | None) -> Any:
    return wire.make_stash(3, op, table, key, value, pattern)


async def _result(op: int, table: str, **kw: Any) -> Any:
    mtype, body = await _stash(op, table, **kw)
    assert mtype == RESPONSE, body
    return body["result"]


async def test_stash_replies_are_gunicorns_shapes(stash_node: Any) -> None:
    """Every op's RESPONSE is what Gunicorn's arbiter answers (``keys`` in insertion order,
    an overwrite keeping its place, fnmatch globs, case-sensitive); "not found" ERRORs carry
    the table and key, and rebuild as the stash classes with their fields."""
    assert await _result(9, "") == ["declared"]  # TABLES: the declared stash
    for key in ("user:1", "b", "user:2", "User:3"):
        assert await _result(1, "t", key=key, value={"k": key}) is True  # PUT
    assert await _result(1, "t", key="b", value=None) is True  # overwrite: same place
    assert await _result(3, "t", key="user:1") is True  # DELETE
    assert await _result(3, "t", key="user:1") is False
    assert await _result(1, "t", key="user:1", value=1) is True  # back, at the end
    assert await _result(4, "t") == ["b", "user:2", "User:3", "user:1"]  # KEYS
    assert await _result(4, "t", pattern="user:*") == ["user:2", "user:1"]
    assert await _result(4, "t", pattern="[!u]*") == ["b", "User:3"]
    assert await _result(4, "t", pattern="user:[12]") == ["user:2", "user:1"]
    assert await _result(2, "t", key="b") is None  # GET of a stored None
    assert await _result(10, "t") is True  # EXISTS table
    assert await _result(10, "t", key="b") is True
    assert await _result(10, "t", key="zz") is False
    assert await _result(10, "nope") is False
    assert await _result(6, "t") == {"size": 4, "table": "t"}  # INFO
    assert await _result(5, "t") is True  # CLEAR
    assert await _result(5, "nope") is True
    assert await _result(7, "e") is True  # ENSURE
    assert await _result(7, "e") is True
    assert await _result(8, "e") is True  # DELETE_TABLE
    assert await _result(8, "e") is False
    assert await _result(9, "") == ["declared", "t"]

    mtype, body = await _stash(2, "t", key="gone")
    assert mtype == ERROR
    assert body["error"] == {
        "error_type": "StashKeyNotFoundError",
        "message": "Key not found in t: gone",
        "details": {"table": "t", "key": "gone"},
    }
    key_error = dirty.DirtyError.from_dict(body["error"])
    assert isinstance(key_error, dirty.StashKeyNotFoundError) and isinstance(key_error, KeyError)
    assert (key_error.table_name, key_error.key, str(key_error)) == (
        "t",
        "gone",
        "Key not found in t: gone",
    )
    mtype, body = await _stash(6, "nope")
    assert body["error"]["error_type"] == "StashTableNotFoundError"
    assert body["error"]["details"] == {"table": "nope"}
    table_error = dirty.DirtyError.from_dict(body["error"])
    assert isinstance(table_error, dirty.StashTableNotFoundError)
    assert table_error.table_name == "nope"
    mtype, body = await _stash(99, "t")
    assert body["error"]["error_type"] == "StashError"
    assert body["error"]["message"] == "Unknown stash operation: 99"
    assert await _result(4, "nope") == []  # KEYS of a missing table: empty, not created
    assert "nope" not in await _result(9, "")


async def test_stash_ttl_window_survives_counter_updates(
    stash_node: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """A rate-limit window: insert_new with a TTL, then update_counter; the increments keep the
    entry's expiry (the window resets on time), and a bad TTL is a StashError, never stored."""
    insert_new, incr, put_ttl = 12, 11, 14
    assert await _result(insert_new, "rl", key="ip", value={"value": 0, "ttl": 10}) is True
    for expected in (1, 2, 3):
        assert await _result(incr, "rl", key="ip", value={"incr": 1, "default": 0}) == expected
    await trio.sleep(9)
    assert await _result(2, "rl", key="ip") == 3
    await trio.sleep(2)
    assert await _result(10, "rl", key="ip") is False
    assert await _result(incr, "rl", key="ip", value={"incr": 1, "default": 0}) == 1
    for bad in (float("nan"), float("inf"), -1, 0, True, "5"):
        mtype, body = await _stash(put_ttl, "rl", key="bad", value={"value": 1, "ttl": bad})
        assert mtype == ERROR and body["error"]["error_type"] == "StashError", bad
    assert await _result(10, "rl", key="bad") is False


async def test_update_counter_past_int64_fails_without_changing_the_value(
    stash_node: Any,
) -> None:
    top = 2**63 - 1
    assert await _result(1, "c", key="n", value=top) is True
    mtype, body = await _stash(11, "c", key="n", value={"incr": 1, "default": 0})
    assert mtype == ERROR and body["error"]["error_type"] == "StashError"
    assert await _result(2, "c", key="n") == top  # unchanged by the refused increment


async def test_update_counter_refuses_a_bad_default_or_an_underflow_without_writing(
    stash_node: Any,
) -> None:
    for default, incr in (("zero", 1), (-(2**63), -1)):
        mtype, body = await _stash(11, "c", key="n", value={"incr": incr, "default": default})
        assert mtype == ERROR and body["error"]["error_type"] == "StashError", body
        assert "update_counter" in body["error"]["message"]
        assert await _result(10, "c", key="n") is False  # nothing was created


STASHER = f"{APPS}:StashUserApp"


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


CONTENDER = f"{APPS}:ContendApp"


async def test_stash_counters_from_threads_and_workers_lose_no_update(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[CONTENDER], dirty_workers=2)
    threads, per = 6, 40

    def web_side(shared: dirty.DirtyClient) -> None:
        own = dirty.DirtyClient(socket_path, timeout=20)
        s_own, s_shared = dirty.stash.StashClient(own), dirty.stash.StashClient(shared)
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                s = s_own if i % 2 else s_shared
                for _ in range(per):
                    s.update_counter("cnt", "hits", 1)
                    s.update_counter("cnt", ("by", i), 2)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def in_workers() -> None:
            try:
                for _ in range(2):
                    shared.execute(CONTENDER, "bump", "cnt", "hits", per)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        ts += [threading.Thread(target=in_workers) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert not errors, errors
        total = threads * per + 4 * per
        assert s_shared.get("cnt", "hits") == total
        for i in range(threads):
            assert s_shared.get("cnt", ["by", i]) == 2 * per
        assert s_shared.info("cnt")["size"] == 1 + threads
        own.close()

    shared = dirty.DirtyClient(socket_path, timeout=20)
    with trio.fail_after(60):
        await trio.to_thread.run_sync(web_side, shared)
    shared.close()


async def test_stash_cas_and_insert_new_races(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[CONTENDER], dirty_workers=2)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)
    per, threads = 25, 4

    def race() -> None:
        s.put("race", "cas", 0)
        wins: list[int] = []
        errors: list[BaseException] = []

        def cas(i: int) -> None:
            try:
                for _ in range(per):
                    while True:
                        current = s.get("race", "cas", 0)
                        if s.compare_and_set("race", "cas", current, current + 1):
                            break
                if s.insert_new("race", "once", i):
                    wins.append(i)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        def worker() -> None:
            try:
                client.execute(CONTENDER, "cas_bump", "race", "cas", per)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        ts = [threading.Thread(target=cas, args=(i,)) for i in range(threads)]
        ts += [threading.Thread(target=worker) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert not errors, errors
        assert s.get("race", "cas") == (threads + 2) * per
        assert len(wins) == 1 and s.get("race", "once") == wins[0]

    with trio.fail_after(60):
        await trio.to_thread.run_sync(race)
    client.close()


async def test_stash_keys_pattern_while_others_write(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                for i in range(150):
                    s.put("kp", f"user:{w}:{i}", i)
                    s.put("kp", f"other:{w}:{i}", i)
                    if i % 3 == 0:
                        s.delete("kp", f"user:{w}:{i}")
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        def reader() -> None:
            try:
                while not stop.is_set():
                    for key in s.keys("kp", "user:*"):
                        assert isinstance(key, str) and key.startswith("user:")
            except BaseException as exc:
                errors.append(exc)

        ws = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        r = threading.Thread(target=reader)
        r.start()
        for t in ws:
            t.start()
        for t in ws:
            t.join(30)
        stop.set()
        r.join(30)
        assert not errors, errors
        users = s.keys("kp", "user:*")
        assert len(users) == 3 * 100 and len(s.keys("kp")) == 3 * 250

    with trio.fail_after(60):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_ttl_expiry_while_counters_run(start_pool: Any, socket_path: str) -> None:
    """A short-lived lock taken with insert_new(ttl) expires under concurrent traffic, and the
    next insert_new wins exactly once."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        # (a TTL the next calls, the first from a thread just started, come well within on a
        # loaded machine: at 0.3 s the lock once expired before the second insert_new)
        assert s.insert_new("ttlc", "lock", "a", ttl=1.0) is True
        stop = threading.Event()

        def noise() -> None:
            while not stop.is_set():
                s.update_counter("ttlc", "n")
                s.exists("ttlc", "lock")

        t = threading.Thread(target=noise)
        t.start()
        try:
            assert s.insert_new("ttlc", "lock", "b") is False
            deadline = threading.Event()
            while s.exists("ttlc", "lock"):
                deadline.wait(0.02)
            assert s.get("ttlc", "lock", "gone") == "gone"
            wins = [s.insert_new("ttlc", "lock", i) for i in range(5)]
            assert wins == [True, False, False, False, False]
            assert s.get("ttlc", "lock") == 0
        finally:
            stop.set()
            t.join(10)

    with trio.fail_after(20):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_worker_killed_mid_action_leaves_table_usable(
    start_pool: Any, socket_path: str
) -> None:
    import signal

    await start_pool(dirty_apps=[CONTENDER], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    async def hang() -> None:
        with pytest.raises(dirty.DirtyError):
            await client.execute_async(CONTENDER, "put_then_hang", "killed", 30)

    with trio.fail_after(30):
        pid = await client.execute_async(CONTENDER, "pid")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang)
            while not await trio.to_thread.run_sync(s.exists, "killed", "before"):
                await trio.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
        assert await trio.to_thread.run_sync(s.get, "killed", "before") == 1
        assert await trio.to_thread.run_sync(s.update_counter, "killed", "n") == 1
        while True:  # the supervisor starts a replacement worker
            try:
                new_pid = await client.execute_async(CONTENDER, "pid")
                break
            except dirty.DirtyNoWorkersAvailableError:
                await trio.sleep(0.05)
        assert new_pid != pid
        assert await client.execute_async(CONTENDER, "bump", "killed", "n", 3) == 4
        assert await trio.to_thread.run_sync(s.info, "killed") == {"size": 2, "table": "killed"}
    await client.close_async()
    client.close()


async def test_stash_large_and_nested_values_round_trip(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=30)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        big = os.urandom(8 << 20)
        s.put("lim", "big", big)
        assert s.get("lim", "big") == big
        nested: Any = "leaf"
        for i in range(100):
            nested = {"level": i, "child": [nested, b"x", None, 1.5, -(2**63)]}
        s.put("lim", "nested", nested)
        assert s.get("lim", "nested") == nested
        many = {f"k{i}": i for i in range(20000)}
        s.put("lim", "many", many)
        assert s.get("lim", "many") == many
        for key in (b"bytes-key", 7, -1.25, ("t", 1)):
            s.put("lim", key, repr(key))
            assert s.get("lim", key) == repr(key)

    with trio.fail_after(60):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_too_large_value_is_a_typed_error_and_client_still_works(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=30)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        with pytest.raises(dirty.DirtyProtocolError):
            s.put("lim2", "huge", b"\0" * (65 << 20))
        assert not s.exists("lim2", "huge")
        s.put("lim2", "ok", 1)
        assert s.get("lim2", "ok") == 1

    with trio.fail_after(60):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_too_deep_value_is_a_stash_error_and_the_connection_survives(
    start_pool: Any, socket_path: str
) -> None:
    """A value nested deeper than the protocol allows is refused for that call only: other
    calls sharing the client's connection go on."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        s.put("deep", "before", 1)
        deep: Any = 0
        for _ in range(400):
            deep = [deep]
        with pytest.raises(dirty.DirtyProtocolError):
            s.put("deep", "v", deep)
        assert s.get("deep", "before") == 1
        assert not s.exists("deep", "v")

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_unhashable_and_bad_keys_are_stash_errors(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        for key in ({"a": 1}, ["nested", {"b": 2}]):
            for op in (
                lambda k: s.put("bk", k, 1),
                lambda k: s.get("bk", k),
                lambda k: s.update_counter("bk", k),
                lambda k: s.insert_new("bk", k, 1),
                lambda k: s.compare_and_set("bk", k, dirty.stash.ABSENT, 1),
                lambda k: s.exists("bk", k),
                lambda k: s.delete("bk", k),
            ):
                with pytest.raises(dirty.StashError):
                    op(key)
        assert s.keys("bk") == []
        s.put("bk", "fine", 1)
        assert s.keys("bk") == ["fine"]

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_cas_compares_types_exactly(start_pool: Any, socket_path: str) -> None:
    """compare_and_set(expected=1) must not match a stored True (nor 1.0): the wire keeps
    them apart, so a CAS must too."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        s.put("cas_t", "flag", True)
        assert s.compare_and_set("cas_t", "flag", 1, "swapped") is False
        s.put("cas_t", "f", 1.0)
        assert s.compare_and_set("cas_t", "f", 1, "swapped") is False

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_bad_table_names(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[ECHO], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        for name in (123, None, b"bytes"):
            with pytest.raises((dirty.StashError, dirty.DirtyProtocolError)):
                s.put(name, "k", 1)  # type: ignore[arg-type]
        assert s.get("echo_table", "x", "d") == "d"  # the connection still works
        assert all(isinstance(t, str) for t in s.tables())

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_keys_refuses_a_pattern_over_its_length_limit(
    start_pool: Any, socket_path: str
) -> None:
    # A 256K-character glob held the node's loop for seconds (and stayed compiled in a cache).
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        s.put("long", "a" * 10, 1)
        assert s.keys("long", "a" * 1024) == []  # the limit itself is accepted
        assert s.keys("long", "a" + "*" * 1023) == ["a" * 10]
        for pattern in ("*" * 1025, "a" * (256 << 10)):
            with pytest.raises(dirty.StashError, match="MAX_PATTERN=1024"):
                s.keys("long", pattern)
        with pytest.raises(dirty.StashError, match="MAX_PATTERN"):
            s.keys("no-such-table", "*" * 2000)  # refused whether or not the table exists

    try:
        with trio.fail_after(30):
            await trio.to_thread.run_sync(go)
    finally:
        client.close()


async def test_a_long_stash_keys_scan_lets_the_nodes_other_tasks_run(
    start_pool: Any, socket_path: str
) -> None:
    # Each key costs the glob microseconds; 300,000 of them took the node's loop for the whole
    # scan. Sliced, the node's other tasks run between slices: a task of the node that ticks
    # as often as it is let run never waits anywhere near the scan's length. (How many other
    # clients' calls get through meanwhile depends on the machine's load; the longest gap
    # between ticks does not, against the scan's own length.)
    await start_pool(dirty_workers=1)
    scanner = dirty.DirtyClient(socket_path, timeout=60)
    s = dirty.stash.StashClient(scanner)
    await trio.to_thread.run_sync(s.ensure, "scan")
    # (Filled from inside the node, where this test runs: 300,000 puts over the socket are slow.)
    ets.insert(stash_server._ets_name("scan"), [("a" * 150 + str(i), i) for i in range(300_000)])
    pattern = "*a" * 60 + "*b"  # no key matches: every key is tried to its end
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await trio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    def scan() -> tuple[int, float]:
        t0 = time.perf_counter()
        found = s.keys("scan", pattern)
        return len(found), time.perf_counter() - t0

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                found, took = await trio.to_thread.run_sync(scan)
                nursery.cancel_scope.cancel()
    finally:
        scanner.close()
    assert found == 0
    assert took > 0.05, f"the scan took {took:.3f}s: too short to tell slicing from blocking"
    assert max(gaps) < took / 3, f"the node's loop stalled {max(gaps):.3f}s of a {took:.3f}s scan"
