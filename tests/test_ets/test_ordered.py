"""ordered_set: key order over mixed types, traversal, and 1 == 1.0."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import otp
import wire
from otp import ets
from otp.ets import ANY, Var, _ordered_index


def _keys(table):
    keys, key = [], ets.first(table)
    while key is not ets.END_OF_TABLE:
        keys.append(key)
        key = ets.next(table, key)
    return keys


async def test_mixed_key_types_follow_the_documented_order():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ref, pid = otp.make_ref(), otp.self()
        keys = [b"bin", (2, 0), (9,), pid, ref, "atom", 2.5, -1, None, frozenset({1})]
        ets.insert(t, [(k, i) for i, k in enumerate(keys)])
        expected = [None, -1, 2.5, "atom", ref, pid, (9,), (2, 0), b"bin", frozenset({1})]
        assert _keys(t) == expected
        assert ets.next(t, [1]) == b"bin"  # lists sort between tuples and bytes


async def test_numbers_compare_by_value_so_1_and_1_0_are_one_key():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, (1, "int"))
        ets.insert(t, (1.0, "float"))
        ets.insert(t, [(Fraction(1, 2), "half"), (Decimal("0.25"), "quarter"), (True, "bool")])
        assert ets.info(t).size == 3
        assert ets.lookup(t, 1) == [(True, "bool")]
        assert _keys(t) == [Decimal("0.25"), Fraction(1, 2), 1]


async def test_last_and_prev_walk_backwards():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(k, None) for k in (5, 1, 3)])
        assert ets.last(t) == 5
        assert ets.prev(t, 5) == 3
        assert ets.prev(t, 1) is ets.END_OF_TABLE


async def test_next_and_prev_accept_keys_not_in_the_table():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(k, None) for k in (10, 20, 30)])
        assert ets.next(t, 15) == 20
        assert ets.prev(t, 15) == 10
        assert ets.next(t, "a string sorts after numbers") is ets.END_OF_TABLE
        assert ets.next(t, None) == 10


async def test_tab2list_and_select_are_in_key_order():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(k, k * 2) for k in (3, 1, 2)])
        assert ets.tab2list(t) == [(1, 2), (2, 4), (3, 6)]
        assert ets.select(t, [((ets.Var(1), ets.ANY), [], ets.Var(1))]) == [1, 2, 3]


async def test_nan_is_not_a_valid_ordered_set_key():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        with pytest.raises(ets.EtsError, match="NaN is not a valid ordered_set key"):
            ets.insert(t, [(1, 1), (float("nan"), 2)])
        assert ets.tab2list(t) == []


async def test_deleting_keeps_the_order_consistent():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(k, None) for k in range(10)])
        for k in (0, 5, 9):
            ets.delete(t, k)
        ets.take(t, 3)
        assert _keys(t) == [1, 2, 4, 6, 7, 8]
        assert ets.first(t) == 1 and ets.last(t) == 8


def _fun():
    return None


async def test_funs_sort_between_refs_and_pids_and_atoms_with_strs():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ref, pid = otp.make_ref(), otp.self()
        keys = [pid, _fun, ref, wire.Atom("b"), "c", "a", 1]
        ets.insert(t, [(k, None) for k in keys])
        assert _keys(t) == [1, "a", wire.Atom("b"), "c", ref, _fun, pid]
        assert ets.next(t, "a") == wire.Atom("b")
        assert ets.prev(t, pid) is _fun
        assert ets.prev(t, {"a map": 1}) == pid  # a map sorts after pids (and tuples)
        assert ets.next(t, (9, 9)) is ets.END_OF_TABLE


async def test_a_deeply_nested_key_is_ordered_without_exhausting_the_stack():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        deep: object = 0
        for _ in range(5000):
            deep = (deep,)
        ets.insert(t, [(deep, "deep"), ((1, 2), "pair"), ((0,), "one")])
        assert _keys(t) == [(0,), deep, (1, 2)]
        assert ets.next(t, (0,)) == deep


# Terms of every rank the order maps, nested a little.
_scalars = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0, -2.0, True, False, None, "a", "b", "", b"", b"a", wire.Atom("a")]),
)
_terms = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.tuples(inner), st.tuples(inner, inner), st.lists(inner, max_size=3)),
    max_leaves=6,
)
_keys_st = st.recursive(
    _scalars, lambda inner: st.one_of(st.tuples(inner), st.tuples(inner, inner)), max_leaves=5
)


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(_keys_st, min_size=1, max_size=8), probe=_terms)
def test_guards_agree_with_the_ordered_set_order(keys, probe):
    async def main():
        async with otp.open_node():
            t = ets.new("t", type=ets.ORDERED_SET)
            ets.insert(t, [(k, i) for i, k in enumerate(keys)])
            walked = _keys(t)
            below = ets.select(t, [((Var(1), ANY), [("<", Var(1), ("const", probe))], Var(1))])
            equal = ets.select(t, [((Var(1), ANY), [("==", Var(1), ("const", probe))], Var(1))])
            above = ets.select(t, [((Var(1), ANY), [(">", Var(1), ("const", probe))], Var(1))])
            assert below + equal + above == walked  # the guards split the table in its order
            nxt = ets.next(t, probe)
            assert nxt == (above[0] if above else ets.END_OF_TABLE)
            prv = ets.prev(t, probe)
            assert prv == (below[-1] if below else ets.END_OF_TABLE)

    trio.run(main)


async def test_ordered_set_delete_by_an_equal_key_keeps_the_index_consistent():
    # frozenset({1}) == frozenset({1.0}) (same hash, lookup finds it), but their reprs differ,
    # and _index_remove recomputes the order key from the caller's key, not the stored one.
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(frozenset({1}), "a"), ("z", 1)])
        assert ets.lookup(t, frozenset({1.0})) == [(frozenset({1}), "a")]
        # next() of a key in the table is the key after it, never the key itself (a walk with
        # such keys would loop forever); today it places the probe by its own repr.
        assert ets.next(t, frozenset({1.0})) is ets.END_OF_TABLE
        ets.delete(t, frozenset({1.0}))
        assert ets.lookup(t, frozenset({1})) == []
        assert ets.last(t) == "z"  # today: the deleted frozenset({1})
        assert ets.tab2list(t) == [("z", 1)]  # today: KeyError from Tab.objects


async def test_ordered_set_list_insert_is_all_or_nothing_on_a_sort_collision():
    class Tag:
        # Identity equality, but every instance sorts the same (its repr): two are not one key
        # and cannot be ordered, so the insert must fail, and fail as a whole.
        def __repr__(self) -> str:
            return "Tag"

    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        with pytest.raises(ets.EtsError, match="sorts equal"):
            ets.insert(t, [("a", 1), (Tag(), 2), (Tag(), 3)])
        assert ets.tab2list(t) == []  # today: [("a", 1), (Tag, 2)]
        with pytest.raises(ets.EtsError):
            ets.insert_new(t, [("b", 1), (Tag(), 2), (Tag(), 3)])
        assert ets.tab2list(t) == []


async def test_ordered_set_traversal_reports_the_key_of_the_object_that_replaced_it():
    # OTP replaces the whole object, key included: 1.0 replacing 1 is what first() returns.
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(1, "a"), (2, "b")])
        ets.insert(t, (1.0, "c"))
        assert [ets.first(t), ets.prev(t, 2), ets.next(t, 1)] == [1.0, 1.0, 2]
        assert type(ets.first(t)) is float
        assert ets.tab2list(t) == [(1.0, "c"), (2, "b")]


async def test_ordered_set_list_insert_of_two_equal_new_keys_keeps_the_last():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [(1, "a"), (1.0, "b"), (frozenset({2}), 1), (frozenset({2.0}), 2)])
        assert ets.tab2list(t) == [(1, "b"), (frozenset({2}), 2)]
        assert ets.insert_new(t, [(3, 1), (3.0, 2)]) is True
        assert ets.lookup(t, 3) == [(3.0, 2)]


async def test_ordered_set_next_of_an_unhashable_key_places_it_by_its_order():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [((1,), "a"), (b"x", "b")])
        assert ets.next(t, [0]) == b"x"  # tuples < lists < bytes
        assert ets.prev(t, [0]) == (1,)


# The index keeps its keys in chunks that split and merge as the table grows and shrinks; with
# chunks of a handful of keys, a few dozen operations cross every boundary case.
_ops = st.lists(
    st.tuples(st.sampled_from(["insert", "delete"]), st.integers(0, 60)), min_size=1, max_size=150
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, probes=st.lists(st.integers(-1, 61).map(lambda k: k + 0.5), max_size=6))
def test_order_holds_while_the_index_splits_and_merges_its_chunks(ops, probes):
    async def main():
        async with otp.open_node():
            t = ets.new("t", type=ets.ORDERED_SET)
            model: set[int] = set()
            for op, key in ops:
                if op == "insert":
                    ets.insert(t, (key, -key))
                    model.add(key)
                else:
                    ets.delete(t, key)
                    model.discard(key)
            ordered = sorted(model)
            assert _keys(t) == ordered
            assert ets.tab2list(t) == [(k, -k) for k in ordered]
            backwards, key = [], ets.last(t)
            while key is not ets.END_OF_TABLE:
                backwards.append(key)
                key = ets.prev(t, key)
            assert backwards == ordered[::-1]
            assert [ets.slot(t, i)[0][0] for i in range(len(ordered))] == ordered
            for probe in probes:
                above = [k for k in ordered if k > probe]
                below = [k for k in ordered if k < probe]
                assert ets.next(t, probe) == (above[0] if above else ets.END_OF_TABLE)
                assert ets.prev(t, probe) == (below[-1] if below else ets.END_OF_TABLE)
            for reverse in (False, True):
                spec = [((Var(1), ANY), [], Var(1))]
                chunks, step = [], (ets.select_reverse if reverse else ets.select)(t, spec, 3)
                while step is not ets.END_OF_TABLE:
                    found, cont = step
                    chunks += found
                    step = ets.END_OF_TABLE if cont is ets.END_OF_TABLE else ets.select(cont)
                assert chunks == (ordered[::-1] if reverse else ordered)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_ordered_index, "CHUNK", 4)
        trio.run(main)
