"""safe_fixtable: a first/next traversal that deletes as it goes, fixation counts and
release at exit, info's fixation items, and slot."""

from __future__ import annotations

import pytest
import trio

import otp
from otp import ets
from otp.ets import END_OF_TABLE

from .helpers import in_process


def _clean_all_with_value(table, value):
    """OTP's own safe_fixtable example, in Python."""
    ets.safe_fixtable(table, True)
    key = ets.first(table)
    while key is not END_OF_TABLE:
        if ets.lookup(table, key) == [(key, value)]:
            ets.delete(table, key)
        key = ets.next(table, key)
    ets.safe_fixtable(table, False)


@pytest.mark.parametrize("kind", [ets.SET, ets.BAG, ets.DUPLICATE_BAG])
async def test_next_of_a_key_deleted_since_the_table_was_fixed_goes_on(kind):
    async with otp.open_node():
        table = ets.new("t", type=kind)
        ets.insert(table, [(n, "x" if n % 3 else "keep") for n in range(30)])
        _clean_all_with_value(table, "x")
        assert sorted(ets.tab2list(table)) == [(n, "keep") for n in range(0, 30, 3)]


async def test_without_fixing_next_of_a_deleted_key_is_key_not_found():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [(n,) for n in range(3)])
        key = ets.first(table)
        ets.delete(table, key)
        with pytest.raises(ets.KeyNotFound):
            ets.next(table, key)


async def test_a_fixed_traversal_visits_each_key_present_throughout_exactly_once():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [(n,) for n in range(20)])
        ets.safe_fixtable(table, True)
        seen, key, extra = [], ets.first(table), 100
        while key is not END_OF_TABLE:
            seen.append(key)
            ets.delete(table, key)
            ets.insert(table, [(extra,), (key,)])  # a new key, and the visited one again
            extra += 1
            key = ets.next(table, key)
        assert sorted(seen) == list(range(20))


async def test_fixes_count_per_process_and_info_reports_who_fixed_and_since(autojump_clock):
    async with otp.open_node():
        table = ets.new("t")
        assert ets.info(table, "fixed") is False
        assert ets.info(table, "safe_fixed") is False
        await trio.sleep(5)
        fixed_at = trio.current_time()
        ets.safe_fixtable(table, True)
        ets.safe_fixtable(table, True)
        await trio.sleep(1)
        assert ets.info(table, "safe_fixed_monotonic_time") == (fixed_at, [(otp.self(), 2)])
        since, holders = ets.info(table, "safe_fixed")
        assert isinstance(since, float) and holders == [(otp.self(), 2)]
        ets.safe_fixtable(table, False)
        assert ets.info(table, "fixed") is True
        ets.safe_fixtable(table, False)
        assert ets.info(table, "fixed") is False
        ets.safe_fixtable(table, False)  # releasing what is not fixed does nothing


async def test_a_process_that_exits_releases_its_fixes():
    async with otp.open_node():
        table = ets.new("t", access=ets.PUBLIC)
        done = trio.Event()

        async def fixer():
            ets.safe_fixtable(table, True)
            ets.safe_fixtable(table, True)
            done.set()
            await otp.receive()

        pid = otp.spawn(fixer)
        await done.wait()
        assert ets.info(table, "safe_fixed_monotonic_time")[1] == [(pid, 2)]
        ref = otp.monitor(pid)
        otp.exit(pid, "kill")
        await otp.receive(match=lambda m: isinstance(m, otp.Down) and m.ref == ref)
        assert ets.info(table, "fixed") is False


async def test_safe_fixtable_takes_a_bool_needs_read_access_and_a_process():
    async with otp.open_node():
        table = ets.new("t", access=ets.PRIVATE)
        with pytest.raises(ets.EtsError, match="fix must be True or False"):
            ets.safe_fixtable(table, 1)
        with pytest.raises(ets.AccessDenied):
            await in_process(ets.safe_fixtable, table, True)


async def test_slot_of_an_ordered_set_is_the_object_at_that_place_in_term_order():
    async with otp.open_node():
        table = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(table, [("b",), (2,), ("a",)])
        assert [ets.slot(table, i) for i in range(4)] == [[(2,)], [("a",)], [("b",)], END_OF_TABLE]
        for bad in (4, -1, "0"):
            with pytest.raises(ets.EtsError, match=r"the slot must be an int from 0 to 3"):
                ets.slot(table, bad)


async def test_slots_of_a_bag_cover_every_object_and_keep_their_keys_while_fixed():
    async with otp.open_node():
        table = ets.new("t", type=ets.BAG)
        ets.insert(table, [("k", 1), ("k", 2), ("j", 1)])
        slots = []
        i = 0
        while (objects := ets.slot(table, i)) is not END_OF_TABLE:
            slots.append(objects)
            i += 1
        assert sorted(obj for objects in slots for obj in objects) == sorted(ets.tab2list(table))
        ets.safe_fixtable(table, True)
        first_key = ets.slot(table, 0)[0][0]
        ets.delete(table, first_key)
        assert ets.slot(table, 0) == []
        assert ets.slot(table, 2) is END_OF_TABLE
