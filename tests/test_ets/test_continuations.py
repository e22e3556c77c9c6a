"""Chunked traversals: select/match/match_object with a limit, select_reverse, and the
continuations they return (valid across inserts and deletes without safe_fixtable)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import otp
from otp import ets
from otp.ets import ANY, END_OF_TABLE, OBJECT, Var

from .helpers import in_process

ALL = [((Var(1), ANY), [], Var(1))]
EVEN = [((Var(1), ANY), [("==", ("%", Var(1), 2), 0)], Var(1))]


def _drain(first: Any, more: Any = ets.select) -> list[list[Any]]:
    """Every chunk of a chunked traversal, from its first answer to END_OF_TABLE."""
    chunks = []
    answer = first
    while answer is not END_OF_TABLE:
        results, cont = answer
        chunks.append(results)
        answer = more(cont)
    return chunks


@pytest.mark.parametrize("kind", list(ets.TableType))
async def test_select_with_a_limit_returns_every_result_in_chunks_of_the_limit(kind):
    async with otp.open_node():
        table = ets.new("t", type=kind)
        ets.insert(table, [(n, "v") for n in range(23)])
        chunks = _drain(ets.select(table, EVEN, 5))
        assert [len(chunk) for chunk in chunks] == [5, 5, 2]
        assert sorted(n for chunk in chunks for n in chunk) == list(range(0, 23, 2))
        if kind is ets.ORDERED_SET:
            assert [n for chunk in chunks for n in chunk] == list(range(0, 23, 2))


async def test_the_last_chunk_comes_with_end_of_table_and_end_of_table_continues_to_itself():
    async with otp.open_node():
        table = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(table, [(n,) for n in range(1, 11)])
        assert ets.select(table, [((Var(1),), [], Var(1))], 20) == (
            list(range(1, 11)),
            END_OF_TABLE,
        )
        assert ets.select(END_OF_TABLE) is END_OF_TABLE
        assert ets.match(END_OF_TABLE) is END_OF_TABLE


async def test_nothing_to_return_is_end_of_table_for_an_empty_table_and_for_no_match():
    async with otp.open_node():
        table = ets.new("t")
        assert ets.select(table, ALL, 3) is END_OF_TABLE
        ets.insert(table, ("a", 1))
        assert ets.select(table, [(("b", ANY), [], OBJECT)], 3) is END_OF_TABLE
        assert ets.match_object(table, ("b", ANY), 3) is END_OF_TABLE


async def test_select_reverse_returns_the_last_objects_first_as_in_otps_example():
    async with otp.open_node():
        table = ets.new("x", type=ets.ORDERED_SET)
        ets.insert(table, [(n,) for n in range(1, 11)])
        spec = [(ANY, [], OBJECT)]
        chunks = _drain(ets.select_reverse(table, spec, 4), ets.select_reverse)
        assert chunks == [[(10,), (9,), (8,), (7,)], [(6,), (5,), (4,), (3,)], [(2,), (1,)]]
        assert ets.select_reverse(table, spec) == [(n,) for n in range(10, 0, -1)]


async def test_select_reverse_of_a_set_is_select():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [(n,) for n in range(6)])
        spec = [(ANY, [], OBJECT)]
        assert ets.select_reverse(table, spec) == ets.select(table, spec)
        assert _drain(ets.select_reverse(table, spec, 4)) == _drain(ets.select(table, spec, 4))


async def test_match_and_match_object_take_a_limit_and_continue_with_their_continuation():
    async with otp.open_node():
        table = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(table, [(n, "even" if n % 2 == 0 else "odd") for n in range(7)])
        first, cont = ets.match(table, (Var(1), "even"), 3)
        assert first == [[0], [2], [4]]
        assert ets.match(cont) == ([[6]], END_OF_TABLE)
        chunks = _drain(ets.match_object(table, (ANY, "odd"), 2), ets.match_object)
        assert chunks == [[(1, "odd"), (3, "odd")], [(5, "odd")]]


async def test_a_continuation_is_a_value_resuming_it_twice_gives_the_same_chunk():
    async with otp.open_node():
        table = ets.new("t", type=ets.SET)
        ets.insert(table, [(n,) for n in range(9)])
        _, cont = ets.select(table, [(ANY, [], OBJECT)], 4)
        once, twice = ets.select(cont), ets.select(cont)
        assert once[0] == twice[0] == [(4,), (5,), (6,), (7,)]
        assert ets.select(once[1]) == ets.select(twice[1]) == ([(8,)], END_OF_TABLE)


@pytest.mark.parametrize("kind", list(ets.TableType))
async def test_a_continuation_stays_valid_across_inserts_and_deletes_without_fixing(kind):
    async with otp.open_node():
        table = ets.new("t", type=kind)
        ets.insert(table, [(n, "v") for n in range(100)])
        deleted_early = set(range(50, 100, 3))
        seen: list[int] = []
        answer = ets.select(table, ALL, 7)
        step = 0
        while answer is not END_OF_TABLE:
            results, cont = answer
            seen.extend(results)
            # Between chunks: delete keys not visited yet and keys already visited, insert.
            for key in list(deleted_early)[step : step + 2]:
                ets.delete(table, key)
            if seen:
                ets.delete(table, seen[0])
            ets.insert(table, [(1000 + step, "v"), (seen[-1], "again")])
            step += 2
            answer = ets.select(cont)
        assert len(seen) == len(set(seen)), "no key is visited twice"
        throughout = set(range(100)) - deleted_early
        assert throughout <= set(seen), "every key present all along is visited"
        removed_before_their_turn = {k for k in deleted_early if k not in seen}
        assert not removed_before_their_turn & set(seen)
        if kind is ets.ORDERED_SET:
            assert seen == sorted(seen)


async def test_chunks_of_a_bag_hold_exactly_the_limit_even_when_a_key_has_more_objects():
    async with otp.open_node():
        table = ets.new("t", type=ets.DUPLICATE_BAG)
        ets.insert(table, [("k", n) for n in range(5)] + [("j", 9)])
        chunks = _drain(ets.select(table, [(ANY, [], OBJECT)], 2))
        assert [len(chunk) for chunk in chunks] == [2, 2, 2]
        assert sorted(obj for chunk in chunks for obj in chunk) == sorted(ets.tab2list(table))


async def test_heads_that_fix_the_key_chunk_only_those_keys():
    async with otp.open_node():
        table = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(table, [(n, n) for n in range(50)])
        spec = [((key, Var(1)), [], Var(1)) for key in (40, 3, 17, 3)]
        assert _drain(ets.select(table, spec, 2)) == [[3, 17], [40]]
        assert _drain(ets.select_reverse(table, spec, 2), ets.select_reverse) == [[40, 17], [3]]


async def test_the_limit_must_be_an_int_of_at_least_one():
    async with otp.open_node():
        table = ets.new("t")
        for limit in (0, -1, 1.5, True, "3"):
            with pytest.raises(ets.EtsError, match=r"the limit is .* an int >= 1"):
                ets.select(table, ALL, limit)
        with pytest.raises(ets.EtsError, match="limit"):
            ets.match(table, (Var(1), ANY), 0)


async def test_the_one_argument_forms_take_only_a_continuation():
    async with otp.open_node():
        table = ets.new("t")
        with pytest.raises(ets.EtsError, match=r"ets.select/1 takes a continuation"):
            ets.select(table)
        with pytest.raises(ets.EtsError, match=r"ets.match_object/1 takes a continuation"):
            ets.match_object([1, 2])


async def test_a_continuation_checks_access_again_and_fails_once_its_table_is_gone():
    async with otp.open_node():
        table = ets.new("t", access=ets.PRIVATE)
        ets.insert(table, [(n,) for n in range(5)])
        _, cont = ets.select(table, [(ANY, [], OBJECT)], 2)
        with pytest.raises(ets.AccessDenied):
            await in_process(ets.select, cont)
        ets.delete(table)
        with pytest.raises(ets.NoSuchTable):
            ets.select(cont)


async def test_a_continuation_has_no_constructor_and_is_never_pickled():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [(n,) for n in range(5)])
        _, cont = ets.select(table, [(ANY, [], OBJECT)], 2)
        assert isinstance(cont, ets.Continuation)
        with pytest.raises(TypeError, match="no public constructor"):
            ets.Continuation()
        with pytest.raises(TypeError, match="never pickled"):
            pickle.dumps(cont)
