"""select_replace: OTP's rules (the result keeps the key, no bags) and its atomic replacement."""

from __future__ import annotations

import pytest
import trio

import otp
from otp import ets
from otp.ets import ANY, OBJECT, Var

from .helpers import in_process


@pytest.mark.parametrize("kind", [ets.SET, ets.ORDERED_SET, ets.DUPLICATE_BAG])
async def test_matched_objects_are_replaced_by_the_result_and_counted(kind):
    async with otp.open_node():
        table = ets.new("t", type=kind)
        ets.insert(table, [("a", "new"), ("b", "old"), ("c", "new")])
        spec = [((Var(1), "new"), [], (Var(1), "seen"))]
        assert ets.select_replace(table, spec) == 2
        assert sorted(ets.tab2list(table)) == [("a", "seen"), ("b", "old"), ("c", "seen")]


async def test_every_copy_in_a_duplicate_bag_is_replaced():
    async with otp.open_node():
        table = ets.new("t", type=ets.DUPLICATE_BAG)
        ets.insert(table, [("k", 1), ("k", 1), ("k", 2)])
        assert ets.select_replace(table, [(("k", 1), [], ("k", 3))]) == 2
        assert sorted(ets.lookup(table, "k")) == [("k", 2), ("k", 3), ("k", 3)]


async def test_a_result_that_may_change_the_key_is_refused_and_nothing_is_replaced():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [("a", 1), ("b", 2)])
        keeps = ((Var(1), Var(2)), [], (Var(1), 0))
        changes = ((Var(1), Var(2)), [], (Var(2), Var(1)))
        for spec in ([keeps, changes], [((ANY, 1), [], ("z", 1))], [(Var(1), [], Var(1))]):
            with pytest.raises(ets.EtsError, match=r"does not keep the key.*nothing was replaced"):
                ets.select_replace(table, spec)
        assert sorted(ets.tab2list(table)) == [("a", 1), ("b", 2)]


async def test_results_that_keep_the_key_as_otp_recognises_it_are_accepted():
    async with otp.open_node():
        table = ets.new("t", keypos=1)
        ets.insert(table, [(1, "k", "x"), (2, "j", "y")])
        assert ets.select_replace(table, [((ANY, "k", ANY), [], ("new", "k", "z"))]) == 1
        assert ets.select_replace(table, [((ANY, Var(1), "y"), [], OBJECT)]) == 1
        assert ets.lookup(table, "k") == [("new", "k", "z")]
        with pytest.raises(ets.EtsError, match="does not keep the key"):
            ets.select_replace(table, [((ANY, 1, ANY), [], (0, 1.0, 0))])  # 1.0 is not 1


async def test_a_compare_and_swap_replaces_only_the_exact_old_object():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, ("counter", 1))
        [old] = ets.lookup(table, "counter")
        assert ets.select_replace(table, [(old, [], ("counter", 2))]) == 1
        assert ets.select_replace(table, [(old, [], ("counter", 3))]) == 0
        assert ets.lookup(table, "counter") == [("counter", 2)]


async def test_bags_are_refused_as_in_otp():
    async with otp.open_node():
        table = ets.new("t", type=ets.BAG)
        ets.insert(table, ("k", 1))
        with pytest.raises(ets.EtsError, match="not for bag tables"):
            ets.select_replace(table, [((Var(1), ANY), [], (Var(1), 2))])


async def test_select_replace_needs_write_access():
    async with otp.open_node():
        table = ets.new("t", access=ets.PROTECTED)
        ets.insert(table, ("k", 1))
        with pytest.raises(ets.AccessDenied):
            await in_process(ets.select_replace, table, [(("k", 1), [], ("k", 2))])


async def test_a_replaced_object_keeps_its_time_to_live(autojump_clock):
    async with otp.open_node():
        table = ets.new("t", expire_after=10)
        ets.insert(table, ("k", 1))
        await trio.sleep(6)
        assert ets.select_replace(table, [(("k", 1), [], ("k", 2))]) == 1
        await trio.sleep(5)
        assert ets.lookup(table, "k") == []
