"""Table creation, the core operations on each table type, and argument errors."""

from __future__ import annotations

import pytest
import trio

import otp
from otp import ets


async def test_new_returns_a_handle_and_named_new_returns_the_name():
    async with otp.open_node():
        handle = ets.new("plain")
        assert isinstance(handle, ets.Table)
        assert ets.new("by_name", named=True) == "by_name"
        ets.insert("by_name", ("k", 1))
        assert ets.lookup("by_name", "k") == [("k", 1)]
        assert ets.whereis("by_name") == ets.info("by_name").id


async def test_a_second_table_with_a_taken_name_is_an_error():
    async with otp.open_node():
        ets.new("cache", named=True)
        with pytest.raises(ets.NameTaken, match="a table named 'cache' already exists"):
            ets.new("cache", named=True)
        ets.new("cache")  # an unnamed table may share the name


async def test_invalid_options_are_rejected_with_the_field_named():
    async with otp.open_node():
        with pytest.raises(ets.EtsError, match=r"type must be one of set, ordered_set, bag"):
            ets.new("t", type="sett")
        with pytest.raises(ets.EtsError, match=r"access must be one of public, protected"):
            ets.new("t", access="open")
        with pytest.raises(ets.EtsError, match=r"keypos must be an int >= 0.*got -1"):
            ets.new("t", keypos=-1)
        with pytest.raises(ets.EtsError, match=r"expire_after must be a number of seconds > 0"):
            ets.new("t", expire_after=0)
        with pytest.raises(ets.EtsError, match="non-empty str"):
            ets.new("")


async def test_new_outside_a_process_raises_not_a_process():
    async with otp.open_node():
        done = trio.Event()
        holder = {}

        async def system_task():
            try:
                ets.new("t")
            except otp.NotAProcess as exc:
                holder["exc"] = exc
            done.set()

        trio.lowlevel.spawn_system_task(system_task)
        await done.wait()
        assert "exc" in holder


async def test_ets_errors_are_otp_badarg():
    assert issubclass(ets.EtsError, otp.BadArg)
    assert issubclass(ets.NoSuchTable, LookupError)
    assert issubclass(ets.AccessDenied, PermissionError)
    assert issubclass(ets.KeyNotFound, LookupError)


async def test_set_insert_overwrites_and_lookup_returns_a_list():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("a", 1))
        ets.insert(t, ("a", 2))
        assert ets.lookup(t, "a") == [("a", 2)]
        assert ets.lookup(t, "missing") == []
        assert ets.info(t).size == 1


async def test_list_insert_is_all_or_nothing():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.EtsError, match="objects are tuples"):
            ets.insert(t, [("a", 1), "not a tuple"])
        assert ets.tab2list(t) == []
        with pytest.raises(ets.EtsError, match="keys must be hashable"):
            ets.insert(t, [("a", 1), ([1], 2)])
        assert ets.tab2list(t) == []


async def test_objects_need_an_element_at_keypos():
    async with otp.open_node():
        t = ets.new("t", keypos=1)
        with pytest.raises(ets.EtsError, match=r"no element at keypos 1"):
            ets.insert(t, ("only",))
        ets.insert(t, ("value", "key"))
        assert ets.lookup(t, "key") == [("value", "key")]


async def test_insert_new_inserts_nothing_if_any_key_exists():
    async with otp.open_node():
        t = ets.new("t")
        assert ets.insert_new(t, ("a", 1)) is True
        assert ets.insert_new(t, [("b", 2), ("a", 3)]) is False
        assert ets.tab2list(t) == [("a", 1)]
        assert ets.insert_new(t, [("b", 2), ("c", 3)]) is True
        assert ets.info(t).size == 3


async def test_bag_stores_equal_objects_once_and_duplicate_bag_every_copy():
    async with otp.open_node():
        bag = ets.new("b", type=ets.BAG)
        dup = ets.new("d", type="duplicate_bag")
        for t in (bag, dup):
            ets.insert(t, [("k", 1), ("k", 2), ("k", 1)])
        assert ets.lookup(bag, "k") == [("k", 1), ("k", 2)]
        assert ets.lookup(dup, "k") == [("k", 1), ("k", 2), ("k", 1)]
        assert ets.info(dup).size == 3


async def test_delete_object_removes_only_that_object():
    async with otp.open_node():
        dup = ets.new("d", type=ets.DUPLICATE_BAG)
        ets.insert(dup, [("k", 1), ("k", 2), ("k", 1)])
        ets.delete_object(dup, ("k", 1))
        assert ets.lookup(dup, "k") == [("k", 2)]
        s = ets.new("s")
        ets.insert(s, ("k", 1))
        ets.delete_object(s, ("k", 2))
        assert ets.member(s, "k")
        ets.delete_object(s, ("k", 1))
        assert not ets.member(s, "k")


async def test_bag_objects_are_told_apart_by_exact_match():
    async with otp.open_node():
        bag = ets.new("b", type=ets.BAG)
        ets.insert(bag, [("a", 1), ("a", 1.0), ("a", True), ("a", 1)])
        assert ets.lookup(bag, "a") == [("a", 1), ("a", 1.0), ("a", True)]
        ets.delete_object(bag, ("a", 1.0))
        assert ets.lookup(bag, "a") == [("a", 1), ("a", True)]


async def test_bags_compare_objects_nested_deeper_than_the_stack():
    async with otp.open_node():
        bag = ets.new("b", type=ets.BAG)
        one, other = 0, 0
        for _ in range(5000):
            one, other = [one], [other]
        ets.insert(bag, [("k", one), ("k", other), ("k", 1)])
        assert ets.info(bag).size == 2  # other is exactly one
        ets.delete_object(bag, ("k", other))
        assert ets.lookup(bag, "k") == [("k", 1)]


async def test_delete_object_deletes_only_the_exact_object():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, (1, "x"))
        ets.delete_object(t, (1.0, "x"))
        assert ets.lookup(t, 1) == [(1, "x")]
        ets.delete_object(t, (1, "x"))
        assert ets.tab2list(t) == []


async def test_delete_key_take_and_delete_all_objects():
    async with otp.open_node():
        t = ets.new("t", type=ets.BAG)
        ets.insert(t, [("a", 1), ("a", 2), ("b", 3)])
        assert ets.take(t, "a") == [("a", 1), ("a", 2)]
        assert ets.take(t, "a") == []
        ets.delete(t, "b")
        assert ets.tab2list(t) == []
        ets.insert(t, [("a", 1), ("c", 2)])
        ets.delete_all_objects(t)
        assert ets.info(t).size == 0


async def test_key_equality_is_pythons_in_set_tables():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, (1, "int"))
        ets.insert(t, (1.0, "float"))
        ets.insert(t, (True, "bool"))
        assert ets.info(t).size == 1
        assert ets.lookup(t, 1) == [(True, "bool")]


async def test_unhashable_key_is_an_error_naming_the_table():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.EtsError, match=r"ets.lookup\(table #Table.*keys must be hashable"):
            ets.lookup(t, [1])
        with pytest.raises(ets.EtsError, match="keys must be hashable"):
            ets.insert(t, ([1], 2))


async def test_update_counter_adds_and_returns_the_new_value():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("hits", 0, 100))
        assert ets.update_counter(t, "hits", 5) == 5
        assert ets.update_counter(t, "hits", (2, -1)) == 99
        assert ets.update_counter(t, "hits", [(1, 1), (2, 1)]) == [6, 100]
        assert ets.lookup(t, "hits") == [("hits", 6, 100)]


async def test_update_counter_threshold_resets_to_set_value():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("c", 9))
        assert ets.update_counter(t, "c", (1, 1, 10, 0)) == 10
        assert ets.update_counter(t, "c", (1, 1, 10, 0)) == 0
        assert ets.update_counter(t, "c", (1, -1, 0, 5)) == 5


async def test_update_counter_missing_key_needs_a_default():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.KeyNotFound, match="no object has this key"):
            ets.update_counter(t, "x", 1)
        assert ets.update_counter(t, "x", 3, default=("ignored", 10)) == 13
        assert ets.lookup(t, "x") == [("x", 13)]


async def test_update_counter_rejects_bad_positions_and_non_ints_atomically():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("c", 1, "text"))
        with pytest.raises(ets.EtsError, match="position 0 is the key"):
            ets.update_counter(t, "c", (0, 1))
        with pytest.raises(ets.EtsError, match=r"element 2 of .* is not an int"):
            ets.update_counter(t, "c", [(1, 1), (2, 1)])
        with pytest.raises(ets.EtsError, match="out of range"):
            ets.update_counter(t, "c", (7, 1))
        assert ets.lookup(t, "c") == [("c", 1, "text")]
        bag = ets.new("b", type=ets.BAG)
        with pytest.raises(ets.EtsError, match="only for set and ordered_set"):
            ets.update_counter(bag, "c", 1)


async def test_update_counter_checks_the_default_even_when_the_key_exists():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("c", 1))
        with pytest.raises(ets.EtsError, match=r"default must be a tuple .* \(got \['c', 0\]\)"):
            ets.update_counter(t, "c", 1, default=["c", 0])
        with pytest.raises(ets.EtsError, match="element at keypos 0"):
            ets.update_counter(t, "c", 1, default=())
        assert ets.lookup(t, "c") == [("c", 1)]


async def test_update_element_on_a_missing_key_is_false_whatever_the_update():
    async with otp.open_node():
        t = ets.new("t")
        assert ets.update_element(t, "missing", "not an update") is False
        assert ets.update_element(t, "missing", [(1, 0), (1,)]) is False
        ets.insert(t, ("k", 1))
        with pytest.raises(ets.EtsError, match="an update is"):
            ets.update_element(t, "k", "not an update")


async def test_update_element_replaces_elements():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1, 2))
        assert ets.update_element(t, "k", [(1, "a"), (2, "b")]) is True
        assert ets.lookup(t, "k") == [("k", "a", "b")]
        assert ets.update_element(t, "missing", (1, 0)) is False
        with pytest.raises(ets.EtsError, match="is the key"):
            ets.update_element(t, "k", (0, "new key"))


async def test_lookup_element_returns_an_element_or_a_list_for_bags():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1, 2))
        assert ets.lookup_element(t, "k", 2) == 2
        assert ets.lookup_element(t, "nope", 1, default=None) is None
        with pytest.raises(ets.KeyNotFound):
            ets.lookup_element(t, "nope", 1)
        with pytest.raises(ets.EtsError, match="has no element 5"):
            ets.lookup_element(t, "k", 5)
        bag = ets.new("b", type=ets.BAG)
        ets.insert(bag, [("k", 1), ("k", 2)])
        assert ets.lookup_element(bag, "k", 1) == [1, 2]


async def test_first_next_visit_every_key_of_a_set_once():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, [(k, k) for k in range(50)])
        seen = []
        key = ets.first(t)
        while key is not ets.END_OF_TABLE:
            seen.append(key)
            key = ets.next(t, key)
        assert sorted(seen) == list(range(50))
        with pytest.raises(ets.KeyNotFound, match="traversed from first"):
            ets.next(t, "absent")
        assert ets.first(ets.new("empty")) is ets.END_OF_TABLE


async def test_info_reports_the_table():
    async with otp.open_node():
        me = otp.self()
        t = ets.new("t", type=ets.ORDERED_SET, access=ets.PUBLIC, keypos=1, expire_after=30)
        ets.insert(t, ("v", "k"))
        info = ets.info(t)
        assert info.type is ets.ORDERED_SET and info.access is ets.PUBLIC
        assert (info.owner, info.heir, info.keypos, info.size) == (me, None, 1, 1)
        assert info.name == "t" and not info.named and info.expire_after == 30
        assert info.memory > 0


async def test_rename_moves_a_named_table_to_the_new_name():
    async with otp.open_node():
        ets.new("old", named=True)
        ets.new("taken", named=True)
        with pytest.raises(ets.NameTaken):
            ets.rename("old", "taken")
        assert ets.rename("old", "new") == "new"
        assert ets.whereis("old") is None
        with pytest.raises(ets.NoSuchTable, match="no table is named 'old'"):
            ets.lookup("old", 1)
        assert ets.info("new").name == "new"


async def test_all_lists_live_tables():
    async with otp.open_node():
        t = ets.new("t")
        ets.new("n", named=True)
        assert set(ets.all()) == {t, "n"}
        ets.delete(t)
        assert ets.all() == ["n"]


async def test_deleted_table_is_gone_for_every_operation():
    async with otp.open_node():
        t = ets.new("t", named=True)
        ets.delete(t)
        assert ets.info(t) is None
        with pytest.raises(ets.NoSuchTable, match="no table is named 't'"):
            ets.insert(t, ("a", 1))
        h = ets.new("h")
        ets.delete(h)
        for op, args in [(ets.lookup, (1,)), (ets.insert, (("a", 1),)), (ets.tab2list, ())]:
            with pytest.raises(ets.NoSuchTable, match="the table does not exist"):
                op(h, *args)
        ets.new("t", named=True)  # the name is free again


async def test_bad_table_argument_is_explained():
    async with otp.open_node():
        with pytest.raises(ets.EtsError, match="a table is a Table"):
            ets.lookup(42, 1)


async def test_table_handle_has_no_public_constructor():
    with pytest.raises(TypeError, match="no public constructor"):
        ets.Table()


async def test_namedtuples_are_objects_and_keep_their_class():
    from typing import NamedTuple

    class Hit(NamedTuple):
        path: str
        count: int

    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, Hit("/", 1))
        ets.update_counter(t, "/", 1)
        [hit] = ets.lookup(t, "/")
        assert hit == Hit("/", 2) and isinstance(hit, Hit)
        assert ets.match(t, (ets.Var(1), ets.ANY)) == [["/"]]


async def test_update_counter_threshold_applies_to_a_zero_increment():
    # OTP: "Incr is not negative (>= 0) and the result would be greater than (>) Threshold".
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("c", 10))
        assert ets.update_counter(t, "c", (1, 0, 5, 0)) == 0
        assert ets.lookup(t, "c") == [("c", 0)]


async def test_update_counter_ops_on_one_position_chain_and_each_checks_its_threshold():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("c", 0))
        # 0 + 5 = 5; then 5 + 5 = 10 > 8 -> 1. Each op sees the previous result.
        assert ets.update_counter(t, "c", [(1, 5), (1, 5, 8, 1)]) == [5, 1]
        assert ets.lookup(t, "c") == [("c", 1)]


async def test_update_counter_default_takes_the_key_at_keypos_and_counts_after_it():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET, keypos=1)
        assert ets.update_counter(t, "key", 1, default=("x", "ignored", 0)) == 1
        assert ets.lookup(t, "key") == [("x", "key", 1)]
        assert ets.first(t) == "key"
