"""The ``matching_cluster`` process: this server among those sharing its database. It registers
and beats its row, lists the live servers, warns once when it cannot reach them (not
distributed), connects to every live peer's node at its recorded addresses, deletes the rows
of servers silent for long (they died), and removes its row on a clean stop; on a store that
cannot be shared (SQLite) it is inert. Also ``--help``."""

from __future__ import annotations

import argparse
import logging
import socket
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from test_otp.peer import COOKIE, PeerNode

import otp
import supervisors
from apps.matching._cluster import CLUSTER, Cluster, ClusterOptions
from apps.matching._config import add_arguments
from apps.matching._postgres_store import PostgresStore
from apps.matching._server_id import server_id
from apps.matching._sqlite_store import SqliteStore
from apps.matching._store import SERVER_NAME, ServerRecord, StoreServer

from ._in_process import matching_server


def _other(sid: str = "other/1/cafe", *, node: str | None = None, at: float | None = None) -> Any:
    now = time.time() if at is None else at
    return ServerRecord(sid, node, (), now, now)


async def _start(store: Any, sid: str = "me/1/beef", **kw: Any) -> None:
    await StoreServer.start_link(store, name="matching_store")
    await Cluster.start_link(ClusterOptions(sid, **kw), name=CLUSTER)


async def test_on_sqlite_the_servers_cluster_is_inert(autojump_clock: Any) -> None:
    async with matching_server():
        assert await Cluster.live() == []
        await trio.sleep(5)
        assert await StoreServer.servers(time.time(), 60.0) == []  # no row, no beat


async def test_a_shared_store_lists_this_server_live_and_beats_its_row(
    autojump_clock: Any,
) -> None:
    async with otp.open_node():
        await _start(SqliteStore(":memory:", threads=False))
        [me] = await Cluster.live()
        assert (me.server_id, me.node, me.addresses) == ("me/1/beef", None, ())
        assert await StoreServer.remove_server("me/1/beef")  # (as another server would)
        await trio.sleep(1.5)  # the next beat finds no row and registers again
        assert [s.server_id for s in await StoreServer.servers(time.time(), 5.0)] == ["me/1/beef"]
        assert await Cluster.owner_node("me/1/beef") is None  # this server: never forwarded


async def test_the_rows_of_servers_silent_for_long_are_deleted_by_a_live_ones_beat(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "apps.matching")
    async with otp.open_node():
        await _start(SqliteStore(":memory:", threads=False), forget_after=600.0)
        # servers that died without a clean stop: long ago, and a moment ago
        await StoreServer.register_server(_other("long/1/dead", at=time.time() - 601))
        await StoreServer.register_server(_other("just/1/dead", at=time.time() - 10))
        await trio.sleep(1.5)  # the next beat
        rows = await StoreServer.servers(time.time(), 86400.0)
    assert [s.server_id for s in rows] == ["just/1/dead", "me/1/beef"]
    assert "matching cluster: deleted the rows of 1 server(s) silent for over 600 s" in [
        r.getMessage() for r in caplog.records
    ]


async def test_a_clean_stop_removes_the_row(autojump_clock: Any) -> None:
    async with otp.open_node():
        await _start(SqliteStore(":memory:", threads=False))
        await otp.GenServer.stop(CLUSTER)
        assert await StoreServer.servers(time.time(), 60.0) == []


async def test_not_distributed_beside_a_live_server_warns_once_at_start(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with otp.open_node():
        store = SqliteStore(":memory:", threads=False)
        await StoreServer.start_link(store, name="matching_store")
        await StoreServer.register_server(_other(node="o@host"))
        await StoreServer.register_server(_other("dead/2/0000", at=time.time() - 60))
        with caplog.at_level(logging.WARNING, logger="apps.matching"):
            await Cluster.start_link(ClusterOptions("me/1/beef"), name=CLUSTER)
            await trio.sleep(3.5)  # (beats log nothing more)
        [warning] = [r.getMessage() for r in caplog.records if "matching cluster" in r.getMessage()]
        assert warning == (
            "matching cluster: this node is not distributed, but 1 other matching server(s) use"
            " the same database (other/1/cafe): calls for flows they own will answer"
            " 'unavailable'; start every server with --name NAME@HOST --listen ADDRESS"
            " --cookie-file PATH"
        )
        # not distributed: no server is reachable from here
        assert await Cluster.owner_node("other/1/cafe") is None


async def _peer_cluster(url: str) -> None:
    await StoreServer.start_link(PostgresStore(url), name="matching_store")
    await Cluster.start_link(ClusterOptions(server_id()), name=CLUSTER)


async def test_a_distributed_server_connects_to_each_live_peer_and_forgets_a_dead_one(
    tmp_path: Path, postgres: Any
) -> None:
    url = postgres.url()
    b = "b@localhost"
    async with PeerNode(b, f"unix:{tmp_path}/b.sock", setup=lambda: _peer_cluster(url)) as peer:
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(
                otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",))
            )
            assert server_id() == "a@localhost"
            await _start(PostgresStore(url), "a@localhost", heartbeat=0.05)
            with trio.fail_after(20):  # b's row names its address: a connects to it
                while await Cluster.owner_node(b) != b:
                    await trio.sleep(0.02)
            assert b in otp.nodes()
            live = {s.server_id: s for s in await Cluster.live()}
            assert sorted(live) == ["a@localhost", b]
            assert live[b].addresses == tuple(peer.listening)
            assert live["a@localhost"].addresses == (f"unix:{tmp_path}/a.sock",)
            peer.stop()  # its node goes down: out at once, not when its heartbeat ages
            with trio.fail_after(20):
                while await Cluster.owner_node(b) is not None:
                    await trio.sleep(0.02)
            assert b in {s.server_id for s in await Cluster.live()}  # (its row is still fresh)


def test_help_says_how_servers_share_a_postgresql_store() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "Several matching servers may share one PostgreSQL database" in text
    assert "--name NAME@HOST --listen ADDRESS --cookie-file PATH" in text
    assert "postgresql://USER@HOST/DB, which several distributed servers may share" in text


async def test_the_application_starts_the_cluster_before_the_engine(autojump_clock: Any) -> None:
    async with matching_server():
        children = [c[0] for c in await supervisors.which_children("matching_sup")]
        assert children.index("cluster") == children.index("engine") + 1  # (newest first)


async def test_a_peer_that_never_answers_a_connect_delays_no_heartbeat(
    autojump_clock: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # listens, never accepts
    silent.bind(str(tmp_path / "x.sock"))
    silent.listen()
    try:
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(
                otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/a.sock",))
            )
            await StoreServer.start_link(SqliteStore(":memory:", threads=False), name=SERVER_NAME)
            peer = ServerRecord("x@localhost", "x@localhost", (f"unix:{tmp_path}/x.sock",), 0, 0)
            with caplog.at_level(logging.WARNING, logger="apps.matching"):
                await Cluster.start_link(ClusterOptions("a@localhost"), name=CLUSTER)
                for _ in range(8):  # (its heartbeat kept fresh: the connect hangs meanwhile)
                    now = time.time()
                    await StoreServer.register_server(attrs.evolve(peer, heartbeat_at=now))
                    assert await StoreServer.remove_server("a@localhost")
                    await trio.sleep(1.5)  # a beat finds its row gone and registers again
                    live = await StoreServer.servers(time.time(), 5.0)
                    assert [s.server_id for s in live] == ["a@localhost", "x@localhost"]
            assert await Cluster.owner_node("x@localhost") is None
            said = [r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage()]
            assert said == [
                "matching cluster: cannot connect to server x@localhost (no answer at"
                f" unix:{tmp_path}/x.sock); calls for its flows wait for it or answer"
                " 'unavailable'"
            ]  # (once, though every connect since failed too)
    finally:
        silent.close()


async def test_a_server_on_postgresql_registers_at_start_and_its_row_goes_when_it_stops(
    postgres: Any,
) -> None:
    url = postgres.url()
    async with matching_server(store=url):
        [me] = await Cluster.live()
        stored = await StoreServer.servers(time.time(), 60.0)
        assert [s.server_id for s in stored] == [me.server_id]
    store = PostgresStore(url)
    await store.open()
    try:
        assert await store.servers(time.time(), 60.0) == []  # (stop_application removed it)
    finally:
        await store.close()
