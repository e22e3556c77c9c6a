"""The store's ``servers`` table (schema version 2): the matching servers sharing one database
register, beat, are listed while their heartbeat is recent, and are removed; on SQLite and on
the real PostgreSQL, directly and through the ``StoreServer``."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import otp
from apps.matching._postgres_store import PostgresStore
from apps.matching._sqlite_schema import MIGRATIONS
from apps.matching._sqlite_store import SCHEMA_VERSION, SqliteStore
from apps.matching._store import ServerRecord, StoreError, StoreServer


def server(server_id: str = "m1@host", **kw: Any) -> ServerRecord:
    fields: dict[str, Any] = {
        "node": server_id if "@" in server_id else None,
        "addresses": ("unix:/tmp/m1.sock", "tcp:127.0.0.1:4401"),
        "started_at": 100.0,
        "heartbeat_at": 100.0,
    }
    fields.update(kw)
    return ServerRecord(server_id=server_id, **fields)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    s: Any
    if request.param == "sqlite":
        s = SqliteStore(":memory:")
    else:
        s = PostgresStore(request.getfixturevalue("postgres").url())
    await s.open()
    yield s
    await s.close()


def test_server_record_refuses_a_malformed_field() -> None:
    with pytest.raises(ValueError, match=r"ServerRecord\.server_id must be a non-empty str"):
        server("")
    with pytest.raises(ValueError, match=r"ServerRecord\.addresses must be a list of str"):
        server(addresses="unix:/tmp/a.sock")
    with pytest.raises(ValueError, match="at most 16 non-empty str"):
        server(addresses=[f"unix:/tmp/{i}" for i in range(17)])
    with pytest.raises(ValueError, match=r"ServerRecord\.heartbeat_at must be a finite number"):
        server(heartbeat_at=float("nan"))


async def test_a_registered_server_is_live_until_its_heartbeat_is_older_than_the_timeout(
    store: Any,
) -> None:
    await store.register_server(server("m1@host"))
    await store.register_server(server("host/42/0badc0de", heartbeat_at=103.0))
    assert await store.servers(104.0, 5.0) == [
        server("host/42/0badc0de", heartbeat_at=103.0),
        server("m1@host"),
    ]
    assert [s.server_id for s in await store.servers(105.0, 5.0)] == ["host/42/0badc0de"]
    assert await store.beat("m1@host", 106.0) is True
    assert [s.server_id for s in await store.servers(108.0, 5.0)] == ["m1@host"]
    assert (await store.servers(108.0, 5.0))[0].heartbeat_at == 106.0


async def test_registering_again_replaces_the_row_of_that_server_id(store: Any) -> None:
    await store.register_server(server("m1@host"))
    again = server("m1@host", addresses=["unix:/tmp/new.sock"], started_at=200.0)
    again = attrs.evolve(again, heartbeat_at=200.0)
    await store.register_server(again)
    assert await store.servers(201.0, 5.0) == [again]


async def test_beat_and_remove_of_an_unknown_server_say_so(store: Any) -> None:
    assert await store.beat("nobody@host", 1.0) is False
    await store.register_server(server("m1@host"))
    assert await store.remove_server("m1@host") is True
    assert await store.remove_server("m1@host") is False
    assert await store.beat("m1@host", 101.0) is False  # (removed: register again)
    assert await store.servers(101.0, 5.0) == []


async def test_register_server_refuses_what_is_not_a_server_record(store: Any) -> None:
    with pytest.raises(StoreError, match="register_server takes a ServerRecord"):
        await store.register_server({"server_id": "m1@host"})


async def test_a_version_1_database_migrates_to_the_servers_table_keeping_its_flows(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "v1.db")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        for statement in MIGRATIONS[0][1]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (1, 0)")
        conn.execute(
            "INSERT INTO flows (flow_id, flow_type, status, args, state, step_index, step_input,"
            " result, error, created_at, updated_at, version, definition)"
            " VALUES ('f1', 't', 'completed', x'80', x'a0', 0, x'80', x'f6', x'f6', 1, 1, 1, x'a0')"
        )
    s = SqliteStore(path)
    await s.open()
    assert (await s.get_flow("f1")) is not None
    await s.register_server(server())
    assert await s.servers(101.0, 5.0) == [server()]
    await s.close()
    with sqlite3.connect(path) as conn:
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert versions.fetchall() == [(1,), (2,)] == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


async def test_the_store_server_answers_the_servers_operations() -> None:
    async with otp.open_node():
        await StoreServer.start_link(SqliteStore(":memory:"), name="store_s")
        s = "store_s"
        await StoreServer.register_server(server(), server=s)
        assert await StoreServer.beat("m1@host", 102.0, server=s) is True
        assert await StoreServer.servers(103.0, 5.0, server=s) == [server(heartbeat_at=102.0)]
        assert await StoreServer.remove_server("m1@host", server=s) is True
        assert await StoreServer.servers(103.0, 5.0, server=s) == []
