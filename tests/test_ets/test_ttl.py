"""Per-object time to live (an extension): expiry on trio's clock, swept by the table actor."""

from __future__ import annotations

import pytest
import trio

import otp
from otp import ets


async def test_objects_expire_after_the_tables_default_ttl(autojump_clock):
    async with otp.open_node():
        t = ets.new("cache", expire_after=60)
        ets.insert(t, ("k", 1))
        await trio.sleep(59)
        assert ets.lookup(t, "k") == [("k", 1)]
        await trio.sleep(1)
        assert ets.lookup(t, "k") == []
        assert ets.info(t).size == 0


async def test_insert_can_override_the_ttl_per_object(autojump_clock):
    async with otp.open_node():
        t = ets.new("t", expire_after=10)
        ets.insert(t, ("short", 1), expire_after=1)
        ets.insert(t, ("forever", 1), expire_after=None)
        ets.insert(t, ("default", 1))
        await trio.sleep(5)
        assert sorted(ets.tab2list(t)) == [("default", 1), ("forever", 1)]
        await trio.sleep(5)
        assert ets.tab2list(t) == [("forever", 1)]


async def test_reinserting_refreshes_or_clears_the_deadline(autojump_clock):
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1), expire_after=5)
        await trio.sleep(4)
        ets.insert(t, ("k", 2), expire_after=5)
        await trio.sleep(4)
        assert ets.lookup(t, "k") == [("k", 2)]
        ets.insert(t, ("k", 3))
        await trio.sleep(100)
        assert ets.lookup(t, "k") == [("k", 3)]


async def test_expired_objects_are_invisible_to_every_operation(autojump_clock):
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET, expire_after=1)
        ets.insert(t, [(1, 0), (2, 0)])
        ets.insert(t, (3, 0), expire_after=None)
        await trio.sleep(1)
        assert not ets.member(t, 1)
        assert ets.first(t) == 3
        assert ets.insert_new(t, (1, "again")) is True
        with pytest.raises(ets.KeyNotFound):
            ets.update_counter(t, 2, 1)


async def test_the_actor_sweeps_expired_objects_without_any_read(autojump_clock):
    async with otp.open_node():
        t = ets.new("t", type=ets.BAG, expire_after=2)
        ets.insert(t, [("k", 1), ("k", 2)])
        ets.insert(t, ("k", 3), expire_after=None)
        await trio.sleep(3)
        # No ets call has run since the insert: only the actor's sweep can have removed them.
        assert t._tab.data == {"k": [("k", 3)]}
        assert t._tab.heap == []


async def test_expiry_in_a_duplicate_bag_is_per_object(autojump_clock):
    async with otp.open_node():
        t = ets.new("t", type=ets.DUPLICATE_BAG)
        ets.insert(t, ("k", 1), expire_after=1)
        ets.insert(t, ("k", 1), expire_after=3)
        await trio.sleep(2)
        assert ets.lookup(t, "k") == [("k", 1)]
        await trio.sleep(2)
        assert ets.lookup(t, "k") == []


async def test_update_counter_keeps_the_objects_deadline(autojump_clock):
    async with otp.open_node():
        t = ets.new("t", expire_after=10)
        assert ets.update_counter(t, "hits", 1, default=("hits", 0)) == 1
        await trio.sleep(9)
        assert ets.update_counter(t, "hits", 1) == 2
        await trio.sleep(1)
        assert ets.lookup(t, "hits") == []


async def test_insert_rejects_a_bad_ttl():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.EtsError, match="expire_after must be a number of seconds > 0"):
            ets.insert(t, ("k", 1), expire_after=-1)


async def test_deleting_a_table_cancels_its_sweep_timer(autojump_clock):
    async with otp.open_node() as node:
        before = len(node.timers)
        t = ets.new("t", expire_after=100)
        ets.insert(t, ("k", 1))
        assert len(node.timers) == before + 1
        ets.delete(t)
        assert len(node.timers) == before


async def test_bag_reinsert_of_an_equal_object_without_ttl_clears_only_its_deadline(
    autojump_clock,
):
    async with otp.open_node():
        t = ets.new("t", type=ets.BAG)
        ets.insert(t, [("k", 1), ("k", 2)], expire_after=2)
        ets.insert(t, ("k", 1), expire_after=None)  # stored once; now never expires
        await trio.sleep(5)
        assert ets.lookup(t, "k") == [("k", 1)]
        assert ets.info(t).size == 1
