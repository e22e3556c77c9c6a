"""Access modes: protected, private and public, as seen from the owner and other processes."""

from __future__ import annotations

import pytest
import trio

import otp
from otp import ets

from .helpers import in_process


async def test_protected_table_is_read_by_all_and_written_by_the_owner_only():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1))
        assert await in_process(ets.lookup, t, "k") == [("k", 1)]
        with pytest.raises(
            ets.AccessDenied,
            match=r"ets.insert\(table #Table.*\): access denied: the table is"
            r" protected, only its owner .* may write to it \(caller .*\)",
        ) as info:
            await in_process(ets.insert, t, ("k", 2))
        assert info.value.operation == "insert" and info.value.table == t
        assert ets.lookup(t, "k") == [("k", 1)]


async def test_private_table_refuses_reads_from_other_processes():
    async with otp.open_node():
        t = ets.new("secret", access=ets.PRIVATE, named=True)
        ets.insert(t, ("k", 1))
        assert ets.lookup(t, "k") == [("k", 1)]
        with pytest.raises(ets.AccessDenied, match="the table is private, only its owner"):
            await in_process(ets.lookup, t, "k")
        with pytest.raises(ets.AccessDenied):
            await in_process(ets.tab2list, t)
        with pytest.raises(ets.AccessDenied, match="may write"):
            await in_process(ets.insert, t, ("k", 2))
        assert (await in_process(ets.info, t)).size == 1  # info is always allowed


async def test_public_table_is_written_by_anyone():
    async with otp.open_node():
        t = ets.new("t", access=ets.PUBLIC)
        await in_process(ets.insert, t, ("k", 1))
        assert await in_process(ets.update_counter, t, "k", 1) == 2
        assert ets.lookup(t, "k") == [("k", 2)]
        await in_process(ets.delete, t)
        assert ets.info(t) is None


@pytest.mark.parametrize(
    "operation, args",
    [
        (ets.insert_new, (("x", 1),)),
        (ets.delete, ("k",)),
        (ets.delete_object, (("k", 1),)),
        (ets.delete_all_objects, ()),
        (ets.take, ("k",)),
        (ets.update_counter, ("k", 1)),
        (ets.update_element, ("k", (1, 5))),
        (ets.select_delete, ([(ets.ANY, [], True)],)),
        (ets.rename, ("other",)),
        (ets.delete, ()),
    ],
)
async def test_every_write_to_a_protected_table_checks_the_owner(operation, args):
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1))
        with pytest.raises(ets.AccessDenied, match=f"ets.{operation.__name__}"):
            await in_process(operation, t, *args)
        assert ets.tab2list(t) == [("k", 1)]


async def test_give_away_and_setopts_are_owner_only_even_on_public_tables():
    async with otp.open_node():
        me = otp.self()
        t = ets.new("t", access=ets.PUBLIC)
        with pytest.raises(ets.AccessDenied, match="only the table's owner"):
            await in_process(ets.give_away, t, me, None)
        with pytest.raises(ets.AccessDenied, match="only the table's owner"):
            await in_process(lambda: ets.setopts(t, heir=me))


async def test_a_task_that_is_not_a_process_counts_as_another_process():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1))
        results = {}
        done = trio.Event()

        async def system_task():
            results["read"] = ets.lookup(t, "k")
            try:
                ets.insert(t, ("k", 2))
            except ets.AccessDenied as exc:
                results["write"] = exc
            done.set()

        trio.lowlevel.spawn_system_task(system_task)
        await done.wait()
        assert results["read"] == [("k", 1)]
        assert "caller None" in str(results["write"])
