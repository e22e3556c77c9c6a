"""Ownership: owner death, heirs, give_away, and OTP's order (tables before links/monitors)."""

from __future__ import annotations

import pytest
import trio

import otp
from otp import ets
from otp._ids import Pid

from .helpers import start_idle


async def _owner_of(table_opts, ready_msg="ready"):
    """Spawn a process that creates a table with ``table_opts`` and waits; returns (pid, table)."""
    me = otp.self()

    async def owner():
        table = ets.new("owned", **table_opts)
        ets.insert(table, ("k", 1))
        otp.send(me, (ready_msg, table))
        await otp.receive()

    pid = otp.spawn(owner)
    _, table = await otp.receive(match=lambda m: isinstance(m, tuple) and m[0] == ready_msg)
    return pid, table


async def test_owner_death_deletes_the_table_before_its_monitors_fire():
    async with otp.open_node():
        pid, table = await _owner_of({"named": True})
        ref = otp.monitor(pid)
        seen = {}

        otp.exit(pid, "kill")
        down = await otp.receive(match=otp.Down)
        seen["info"] = ets.info(table)
        seen["whereis"] = ets.whereis("owned")
        assert down.ref == ref
        assert seen == {"info": None, "whereis": None}
        ets.new("owned", named=True)  # the name is free


async def test_table_is_already_gone_when_a_linked_trapping_process_gets_the_exit():
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        pid, table = await _owner_of({})
        otp.link(pid)
        otp.send(pid, "stop")
        exit_msg = await otp.receive(match=otp.Exit)
        assert exit_msg.reason == otp.NORMAL
        assert ets.info(table) is None
        with pytest.raises(ets.NoSuchTable):
            ets.lookup(table, "k")


async def test_live_heir_inherits_the_table_and_gets_ets_transfer():
    async with otp.open_node():
        me = otp.self()
        pid, table = await _owner_of({"heir": me, "heir_data": "inheritance"})
        otp.monitor(pid)
        otp.exit(pid, "boom")
        transfer = await otp.receive(match=ets.EtsTransfer)
        assert transfer == ets.EtsTransfer(table, pid, "inheritance")
        await otp.receive(match=otp.Down)
        info = ets.info(table)
        assert info.owner == me
        ets.insert(table, ("k", 2))  # the heir may now write
        assert ets.lookup(table, "k") == [("k", 2)]


async def test_transfer_arrives_before_the_down_of_the_old_owner():
    async with otp.open_node():
        me = otp.self()
        pid, _ = await _owner_of({"heir": me, "named": True})
        otp.monitor(pid)
        otp.exit(pid, "kill")
        first = await otp.receive(match=(ets.EtsTransfer, otp.Down))
        assert isinstance(first, ets.EtsTransfer)
        assert first.table == "owned"


async def test_dead_heir_means_the_table_is_deleted():
    async with otp.open_node():
        heir = await start_idle()
        pid, table = await _owner_of({"heir": heir})
        otp.send(heir, "stop")
        ref = otp.monitor(heir)
        await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
        otp.exit(pid, "kill")
        ref = otp.monitor(pid)
        await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
        assert ets.info(table) is None


async def test_heir_that_is_not_alive_at_creation_is_no_heir():
    async with otp.open_node():
        heir = await start_idle()
        otp.send(heir, "stop")
        otp.monitor(heir)
        await otp.receive(match=otp.Down)
        t = ets.new("t", heir=heir)
        assert ets.info(t).heir is None


async def test_inherited_table_is_deleted_when_the_heir_dies_too():
    async with otp.open_node():
        me = otp.self()

        async def heir_proc():
            transfer = await otp.receive(match=ets.EtsTransfer)
            otp.send(me, ("inherited", transfer.table))
            await otp.receive(match=str)

        heir = otp.spawn(heir_proc)
        pid, table = await _owner_of({"heir": heir})
        otp.exit(pid, "kill")
        await otp.receive(match=lambda m: isinstance(m, tuple) and m[0] == "inherited")
        assert ets.info(table).owner == heir
        ref = otp.monitor(heir)
        otp.send(heir, "stop")
        await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
        assert ets.info(table) is None


async def test_give_away_transfers_ownership_with_a_message():
    async with otp.open_node():
        me = otp.self()
        t = ets.new("t")

        async def receiver():
            transfer = await otp.receive(match=ets.EtsTransfer)
            ets.insert(transfer.table, ("from", transfer.old_owner, transfer.heir_data))
            otp.send(me, "done")
            await otp.receive(match=str)

        other = otp.spawn(receiver)
        ets.give_away(t, other, "gift")
        assert ets.info(t).owner == other
        await otp.receive(match=str)
        assert ets.lookup(t, "from") == [("from", me, "gift")]
        with pytest.raises(ets.AccessDenied):
            ets.insert(t, ("x", 1))
        # The old owner's death no longer affects the table; the new owner's does.
        ref = otp.monitor(other)
        otp.send(other, "stop")
        await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
        assert ets.info(t) is None


async def test_give_away_to_the_owner_or_a_dead_process_is_an_error():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.EtsError, match="already owns the table"):
            ets.give_away(t, otp.self(), None)
        dead = await start_idle()
        otp.send(dead, "stop")
        ref = otp.monitor(dead)
        await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
        with pytest.raises(ets.EtsError, match="must be a live local process"):
            ets.give_away(t, dead, None)


async def test_setopts_sets_and_clears_the_heir():
    async with otp.open_node():
        me = otp.self()
        heir = await start_idle()

        async def owner():
            t = ets.new("t", named=True)
            ets.setopts(t, heir=heir, heir_data=1)
            ets.setopts(t, heir=None)
            ets.setopts(t, heir=me, heir_data=2)
            otp.send(me, "ready")
            await otp.receive()

        pid = otp.spawn(owner)
        await otp.receive(match=str)
        otp.exit(pid, "kill")
        transfer = await otp.receive(match=ets.EtsTransfer)
        assert transfer.heir_data == 2


async def test_deleting_a_table_stops_its_actor():
    async with otp.open_node():
        t = ets.new("t")
        actor = t.actor
        assert otp.process_info(actor) is not None
        ref = otp.monitor(actor)
        ets.delete(t)
        down = await otp.receive(match=otp.Down)
        assert down.ref == ref and down.reason == otp.NORMAL


async def test_table_survives_a_crash_of_a_writer():
    async with otp.open_node():
        t = ets.new("t", access=ets.PUBLIC)

        async def writer():
            ets.insert(t, [("a", 1), ("b", 2)])
            raise RuntimeError("crash after writing")

        otp.spawn_monitor(writer)
        await otp.receive(match=otp.Down)
        assert sorted(ets.tab2list(t)) == [("a", 1), ("b", 2)]


def _remote_pid() -> Pid:
    # A pid of another node, as one arrives in a message from it.
    return Pid._make("other@host", 7, 1)


async def test_a_remote_heir_is_refused():
    async with otp.open_node():
        with pytest.raises(ets.EtsError, match="heir"):
            ets.new("t", heir=_remote_pid())
        t = ets.new("t2")
        with pytest.raises(ets.EtsError, match="heir"):
            ets.setopts(t, heir=_remote_pid())


async def test_a_pid_of_an_earlier_incarnation_of_this_node_is_no_heir():
    async with otp.open_node():
        me = otp.self()
        stale = Pid._make(me.node, me.id, me.creation + 1)
        with pytest.raises(ets.EtsError, match="heir must be a process of this node"):
            ets.new("t", heir=stale)
        assert ets.all() == []


async def test_transfer_of_a_renamed_named_table_carries_its_current_name():
    async with otp.open_node():
        me = otp.self()

        async def receiver():
            transfer = await otp.receive(match=ets.EtsTransfer)
            otp.send(me, ("got", transfer.table, ets.lookup(transfer.table, "k")))
            await otp.receive(match=str)

        t = ets.new("old", named=True)
        ets.insert(t, ("k", 1))
        ets.rename(t, "new")
        other = otp.spawn(receiver)
        ets.give_away("new", other, None)
        got = await otp.receive(match=lambda m: isinstance(m, tuple) and m[0] == "got")
        assert got == ("got", "new", [("k", 1)])
        with pytest.raises(ets.NoSuchTable):
            ets.lookup("old", "k")
        otp.send(other, "stop")


async def test_a_table_cannot_be_owned_by_a_process_that_already_exited():
    async with otp.open_node():
        outcome = {}
        async with trio.open_nursery() as nursery:
            owner_gone = trio.Event()

            async def late_task():
                # Started by the process into an outside nursery: it inherits the process's
                # context, so it still "is" that process after the process exited.
                await owner_gone.wait()
                try:
                    outcome["table"] = ets.new("orphan")
                except (otp.NotAProcess, ets.EtsError) as exc:
                    outcome["refused"] = exc

            async def short_lived():
                nursery.start_soon(late_task)

            pid = otp.spawn(short_lived)
            ref = otp.monitor(pid)
            await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
            owner_gone.set()
        if "table" in outcome:
            # Today: the table lives on, owned by the dead pid, for the rest of the node's life.
            assert ets.info(outcome["table"]) is None
            assert ets.all() == []
