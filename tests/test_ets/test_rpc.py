"""The table actor's path (how other nodes reach a table): ``ets.rpc``."""

from __future__ import annotations

import pytest

import otp
from otp import ets

from .helpers import in_process


async def test_rpc_runs_the_operation_through_the_actor():
    async with otp.open_node():
        t = ets.new("t")
        await ets.rpc(t, "insert", ("k", 1))
        assert await ets.rpc(t, "lookup", "k") == [("k", 1)]
        assert await ets.rpc(t, "update_counter", "k", 2) == 3
        named = ets.new("n", named=True)
        await ets.rpc(named, "insert", [("a", 1), ("b", 2)])
        assert await ets.rpc("n", "select_count", [(ets.ANY, [], True)]) == 2


async def test_rpc_serves_the_table_first_operations_added_for_otp_25():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(1, "a"), (2, "b")])
        assert await ets.rpc(t, "slot", 1) == [(2, "b")]
        assert await ets.rpc(t, "select_reverse", [(ets.ANY, [], ets.OBJECT)]) == [
            (2, "b"),
            (1, "a"),
        ]
        assert await ets.rpc(t, "select_replace", [((1, "a"), [], (1, "z"))]) == 1
        assert await ets.rpc(t, "info", "size") == 2
        assert ets.lookup(t, 1) == [(1, "z")]


async def test_rpc_checks_access_against_the_requester_not_the_actor():
    async with otp.open_node():
        t = ets.new("t")

        async def attempt():
            return await ets.rpc(t, "insert", ("k", 1))

        me = otp.self()

        async def other():
            try:
                await ets.rpc(t, "insert", ("k", 1))
            except ets.AccessDenied as exc:
                otp.send(me, ("denied", str(exc)))

        otp.spawn(other)
        _, message = await otp.receive(match=tuple)
        assert "the table is protected, only its owner" in message
        assert ets.tab2list(t) == []
        assert await in_process(ets.lookup, t, "k") == []


async def test_rpc_reraises_the_operations_typed_error():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.KeyNotFound, match="no object has this key"):
            await ets.rpc(t, "update_counter", "missing", 1)
        with pytest.raises(ets.EtsError, match="TypeError"):
            await ets.rpc(t, "lookup")
        with pytest.raises(ets.EtsError, match="'new' is not an ets operation"):
            await ets.rpc(t, "new", "x")


async def test_rpc_to_a_deleted_table_raises_no_such_table():
    async with otp.open_node():
        t = ets.new("t")
        ref = otp.monitor(t.actor)
        ets.delete(t)
        await otp.receive(match=otp.Down)
        assert ref is not None
        with pytest.raises(ets.NoSuchTable, match="the table's actor is gone"):
            await ets.rpc(t, "lookup", 1)


async def test_rpc_reaches_a_table_by_its_actors_pid_with_plain_tuples():
    async with otp.open_node():
        t = ets.new("t", access=ets.PUBLIC)
        await ets.rpc(t.actor, "insert", ("k", 1))
        assert await ets.rpc(t.actor, "lookup", "k") == [("k", 1)]
        # What crosses nodes is plain data: a tagged tuple in, ("ok", value) out.
        reply = await otp.call(t.actor, ("$ets_request", "member", ("k",), {}))
        assert reply == ("ok", True)
        bad = await otp.call(t.actor, "nonsense")
        assert bad[0] == "error" and "bad request" in bad[2]
