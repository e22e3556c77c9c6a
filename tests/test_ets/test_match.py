"""Patterns (match, match_object, match_delete) and match specs (select, select_count,
select_delete)."""

from __future__ import annotations

import pytest

import otp
from otp import ets
from otp.ets import ANY, BINDINGS, OBJECT, Var


async def _people():
    t = ets.new("people", type=ets.BAG)
    ets.insert(
        t,
        [
            ("ann", 31, "oslo"),
            ("bob", 17, "rome"),
            ("cid", 45, "oslo"),
            ("dan", "unknown", "rome"),
            ("ann", 31, "paris"),
        ],
    )
    return t


async def test_match_returns_bindings_ordered_by_variable_number():
    async with otp.open_node():
        t = await _people()
        result = ets.match(t, (Var(2), ANY, Var(1)))
        assert sorted(result) == sorted(
            [["oslo", "ann"], ["rome", "bob"], ["oslo", "cid"], ["rome", "dan"], ["paris", "ann"]]
        )


async def test_a_repeated_variable_must_bind_equal_values():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, [(1, 1), (2, 3), (4, 4)])
        assert sorted(ets.match_object(t, (Var(1), Var(1)))) == [(1, 1), (4, 4)]


async def test_match_object_with_a_bound_key_looks_only_at_that_key():
    async with otp.open_node():
        t = await _people()
        assert ets.match_object(t, ("ann", ANY, ANY)) == [("ann", 31, "oslo"), ("ann", 31, "paris")]
        assert ets.match_object(t, ("ann", 31, "rome")) == []


async def test_match_delete_removes_matching_objects():
    async with otp.open_node():
        t = await _people()
        ets.match_delete(t, (ANY, ANY, "rome"))
        assert sorted(obj[0] for obj in ets.tab2list(t)) == ["ann", "ann", "cid"]


async def test_select_with_guards_on_fields():
    async with otp.open_node():
        t = await _people()
        spec = [((Var(1), Var(2), ANY), [("is_int", Var(2)), (">=", Var(2), 18)], Var(1))]
        assert sorted(ets.select(t, spec)) == ["ann", "ann", "cid"]


async def test_a_guard_that_raises_fails_its_clause_and_traversal_goes_on():
    async with otp.open_node():
        t = await _people()
        spec = [((Var(1), Var(2), ANY), [(">", Var(2), 40)], Var(1))]
        assert ets.select(t, spec) == ["cid"]  # "unknown" > 40 raises: that clause fails


async def test_the_first_matching_clause_gives_the_result():
    async with otp.open_node():
        t = await _people()
        spec = [
            ((Var(1), ANY, "oslo"), [], ("norway", Var(1))),
            ((Var(1), ANY, ANY), [("!=", Var(1), "dan")], ("elsewhere", Var(1))),
        ]
        assert sorted(ets.select(t, spec)) == [
            ("elsewhere", "ann"),
            ("elsewhere", "bob"),
            ("norway", "ann"),
            ("norway", "cid"),
        ]


async def test_results_can_be_the_object_or_all_bindings():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("k", 1, 2))
        assert ets.select(t, [((Var(1), Var(3), Var(2)), [], OBJECT)]) == [("k", 1, 2)]
        assert ets.select(t, [((Var(1), Var(3), Var(2)), [], BINDINGS)]) == [["k", 2, 1]]
        assert ets.select(t, [((Var(1), ANY, ANY), [], [Var(1), "literal"])]) == [["k", "literal"]]


async def test_boolean_arithmetic_and_membership_guards():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, [(n, n * n) for n in range(10)])
        spec = [
            (
                (Var(1), Var(2)),
                [("or", ("in", Var(1), ("const", (1, 2))), ("==", ("%", Var(2), 7), 1))],
                Var(1),
            )
        ]
        assert sorted(ets.select(t, spec)) == [1, 2, 6, 8]
        not_spec = [((Var(1), ANY), [("not", ("<", Var(1), 8))], Var(1))]
        assert sorted(ets.select(t, not_spec)) == [8, 9]


async def test_select_count_and_select_delete():
    async with otp.open_node():
        t = ets.new("t", type=ets.DUPLICATE_BAG)
        ets.insert(t, [("a", 1), ("a", 1), ("a", 2), ("b", 5)])
        spec = [((ANY, Var(1)), [("<", Var(1), 3)], True)]
        assert ets.select_count(t, spec) == 3
        assert ets.select_delete(t, spec) == 3
        assert ets.tab2list(t) == [("b", 5)]


async def test_malformed_specs_are_rejected_with_an_explanation():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.EtsError, match="a match spec is a list"):
            ets.select(t, ((ANY,), [], True))
        with pytest.raises(ets.EtsError, match="unknown guard operation '=<'"):
            ets.select(t, [((Var(1),), [("=<", Var(1), 3)], True)])
        with pytest.raises(ets.EtsError, match="'<' takes 2 argument"):
            ets.select(t, [((Var(1),), [("<", Var(1))], True)])
        with pytest.raises(ets.EtsError, match=r"Var.n must be an int >= 0"):
            Var(-1)
