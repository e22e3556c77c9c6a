"""foldl and foldr: order, an empty table, and changes made while folding."""

from __future__ import annotations

import pytest

import otp
from otp import ets

from .helpers import in_process


def _keys(obj, acc):
    return [*acc, obj[0]]


async def test_foldl_goes_first_to_last_and_foldr_last_to_first_in_an_ordered_set():
    async with otp.open_node():
        table = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(table, [(3,), ("b",), (1.5,), ((0,),)])
        assert ets.foldl(_keys, [], table) == [1.5, 3, "b", (0,)]
        assert ets.foldr(_keys, [], table) == [(0,), "b", 3, 1.5]


@pytest.mark.parametrize("kind", list(ets.TableType))
async def test_a_fold_visits_every_object_once_and_an_empty_table_gives_acc0(kind):
    async with otp.open_node():
        table = ets.new("t", type=kind)
        assert ets.foldl(_keys, "acc0", table) == "acc0"
        objects = (
            [(1, "a"), (1, "b"), (2, "c")]
            if kind not in (ets.SET, ets.ORDERED_SET)
            else [
                (1, "a"),
                (2, "c"),
            ]
        )
        ets.insert(table, objects)
        assert sorted(ets.foldl(lambda obj, acc: [*acc, obj], [], table)) == sorted(objects)
        assert ets.foldr(lambda obj, total: total + len(obj), 0, table) == 2 * len(objects)


@pytest.mark.parametrize("kind", [ets.SET, ets.ORDERED_SET])
async def test_a_fold_that_deletes_objects_ahead_of_it_skips_them(kind):
    async with otp.open_node():
        table = ets.new("t", type=kind)
        ets.insert(table, [(n,) for n in range(10)])

        def visit(obj, acc):
            ets.delete(table, obj[0] + 1)  # the next key, before its turn
            return [*acc, obj[0]]

        visited = ets.foldl(visit, [], table)
        assert len(visited) == 5 and len(set(visited)) == 5
        assert sorted(visited + [key + 1 for key in visited]) == list(range(10))


async def test_deleting_the_table_while_folding_ends_the_fold_with_no_such_table():
    async with otp.open_node():
        table = ets.new("t")
        ets.insert(table, [(n,) for n in range(3)])
        with pytest.raises(ets.NoSuchTable):
            ets.foldl(lambda obj, acc: ets.delete(table), None, table)


async def test_folding_a_private_table_from_another_process_is_denied():
    async with otp.open_node():
        table = ets.new("t", access=ets.PRIVATE)
        with pytest.raises(ets.AccessDenied, match=r"ets.foldr"):
            await in_process(ets.foldr, _keys, [], table)
