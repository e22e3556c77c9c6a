"""Patterns (match, match_object, match_delete) and match specs (select, select_count,
select_delete)."""

from __future__ import annotations

import pytest

import otp
from otp import ets
from otp.ets import ANY, BINDINGS, OBJECT, Var

from .helpers import in_process


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
        spec = [((Var(1), Var(2), ANY), [(">", ("+", Var(2), 1), 40)], Var(1))]
        assert ets.select(t, spec) == ["cid"]  # "unknown" + 1 is badarith: that clause fails


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
        with pytest.raises(ets.EtsError, match="unknown guard operation '=>'"):
            ets.select(t, [((Var(1),), [("=>", Var(1), 3)], True)])
        with pytest.raises(ets.EtsError, match="'<' takes 2 argument"):
            ets.select(t, [((Var(1),), [("<", Var(1))], True)])
        with pytest.raises(ets.EtsError, match=r"Var.n must be an int >= 0"):
            Var(-1)


# -- Erlang's term order and semantics in guards ----------------------------------------------


def _passes(table, guard):
    """Whether ``guard`` holds for the one object of ``table`` (``Var(1)`` its key,
    ``Var(2)`` its value)."""
    found = ets.select(table, [((Var(1), Var(2)), [guard], True)])
    assert found in ([], [True])
    return found == [True]


async def _one(value):
    t = ets.new("one")
    ets.insert(t, ("k", value))
    return t


async def test_guards_compare_tuples_by_size_first_as_the_table_orders_them():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, [((3,), "short"), ((1, 2), "long")])
        assert ets.first(t) == (3,)  # the table's own order: size first
        spec = [((Var(1), ANY), [("<", Var(1), ("const", (1, 2)))], Var(1))]
        assert ets.select(t, spec) == [(3,)]


async def test_guards_compare_across_types_in_the_term_order():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, (3, 0.5, b"\x00"))
        # binary > tuple in the term order: OTP deletes the object.
        assert ets.select_delete(t, [((ANY, ANY, Var(2)), [(">", Var(2), (10,))], True)]) == 1
        u = await _one([])
        assert _passes(u, (">", Var(2), 3))  # list > number
        assert _passes(u, ("<", "atom", Var(2)))
        assert _passes(u, ("<", ("const", (1,)), Var(2)))  # tuple < list
        assert _passes(u, ("<", Var(2), b""))  # list < binary


async def test_arithmetic_on_non_numbers_fails_the_guard():
    async with otp.open_node():
        t = await _one("a")
        assert not _passes(t, ("==", ("+", Var(2), "b"), "ab"))
        assert not _passes(t, ("==", ("*", Var(2), 2), "aa"))
        u = await _one((1,))
        assert not _passes(u, ("==", ("+", Var(2), (2,)), ("const", (1, 2))))
        assert not _passes(u, ("is_tuple", ("-", Var(2))))


async def test_boolean_operators_on_non_booleans_fail_the_guard():
    async with otp.open_node():
        t = await _one(1)
        assert not _passes(t, ("or", Var(2), True))
        assert not _passes(t, ("and", True, Var(2)))
        assert not _passes(t, ("orelse", Var(2), True))
        assert not _passes(t, ("not", ("not", Var(2))))
        assert not _passes(t, ("xor", Var(2), False))
        assert _passes(t, ("xor", ("==", Var(2), 1), False))
        # andalso/orelse stop at the first false/true; their last argument is the value.
        assert _passes(t, ("andalso", ("==", Var(2), 1), True))
        assert not _passes(t, ("andalso", ("==", Var(2), 2), ("+", "x", 1)))
        assert _passes(t, ("orelse", ("==", Var(2), 1), ("+", "x", 1)))
        assert _passes(t, ("==", ("andalso", True, Var(2)), 1))


async def test_exact_and_arithmetic_equality_differ_on_ints_and_floats():
    async with otp.open_node():
        t = await _one(1)
        assert _passes(t, ("==", Var(2), 1.0))
        assert not _passes(t, ("=:=", Var(2), 1.0))
        assert _passes(t, ("=/=", Var(2), 1.0))
        assert not _passes(t, ("/=", Var(2), 1.0))
        assert _passes(t, ("=:=", ("const", (1, [2])), ("const", (1, [2]))))
        assert not _passes(t, ("=:=", ("const", (1, [2])), ("const", (1, [2.0]))))
        assert _passes(t, ("=<", Var(2), 1.0))


async def test_integer_division_and_bit_operations_follow_erlang():
    async with otp.open_node():
        t = await _one(-7)
        assert _passes(t, ("=:=", ("div", Var(2), 2), -3))  # truncates (Python's // gives -4)
        assert _passes(t, ("=:=", ("rem", Var(2), 2), -1))  # the dividend's sign
        assert _passes(t, ("=:=", ("rem", 7, -2), 1))
        assert not _passes(t, ("is_int", ("div", Var(2), 0)))
        assert not _passes(t, ("is_int", ("div", 7.0, 2)))
        assert _passes(t, ("=:=", ("band", 12, 10), 8))
        assert _passes(t, ("=:=", ("bor", 12, 10), 14))
        assert _passes(t, ("=:=", ("bxor", 12, 10), 6))
        assert _passes(t, ("=:=", ("bnot", 0), -1))
        assert _passes(t, ("=:=", ("bsl", 1, 4), 16))
        assert _passes(t, ("=:=", ("bsr", Var(2), 1), -4))
        assert _passes(t, ("=:=", ("bsl", 16, -2), 4))
        assert not _passes(t, ("is_int", ("bsl", 1, 10**12)))  # past MAX_INT_BITS: fails
        assert not _passes(t, ("is_int", ("band", 1.0, 1)))


async def test_number_functions_follow_erlang():
    async with otp.open_node():
        t = await _one(-2.5)
        assert _passes(t, ("=:=", ("abs", Var(2)), 2.5))
        assert _passes(t, ("=:=", ("round", Var(2)), -3))  # half away from zero
        assert _passes(t, ("=:=", ("round", 2.5), 3))
        assert _passes(t, ("=:=", ("round", 0.49999999999999994), 0))
        assert _passes(t, ("=:=", ("trunc", Var(2)), -2))
        assert _passes(t, ("=:=", ("floor", Var(2)), -3))
        assert _passes(t, ("=:=", ("ceil", Var(2)), -2))
        assert _passes(t, ("=:=", ("float", 3), 3.0))
        assert _passes(t, ("=:=", ("/", 7, 2), 3.5))
        assert not _passes(t, ("is_float", ("/", 1, 0)))
        assert not _passes(t, ("is_float", ("*", 1e308, 10.0)))  # float overflow is badarith
        assert _passes(t, ("=:=", ("min", 1, 1.0), 1))  # equal terms: the first one
        assert _passes(t, ("=:=", ("max", 1.0, 1), 1.0))
        assert _passes(t, ("=:=", ("max", 5, "a"), "a"))  # term order: atom > number


async def test_term_functions_follow_erlang():
    async with otp.open_node():
        t = await _one([1, 2, 3])
        assert _passes(t, ("=:=", ("hd", Var(2)), 1))
        assert _passes(t, ("=:=", ("tl", Var(2)), [2, 3]))
        assert _passes(t, ("=:=", ("length", Var(2)), 3))
        assert not _passes(t, ("is_int", ("length", ("const", (1, 2)))))
        assert not _passes(t, ("is_int", ("hd", [])))
        assert _passes(t, ("=:=", ("size", ("const", (1, 2))), 2))
        assert _passes(t, ("=:=", ("size", b"abc"), 3))
        assert _passes(t, ("=:=", ("tuple_size", ("const", ())), 0))
        assert _passes(t, ("=:=", ("byte_size", b"ab"), 2))
        assert not _passes(t, ("is_int", ("byte_size", "ab")))
        m = await _one({"a": 1, "b": 2})
        assert _passes(m, ("=:=", ("map_get", "a", Var(2)), 1))
        assert not _passes(m, ("is_int", ("map_get", "z", Var(2))))
        assert _passes(m, ("=:=", ("map_size", Var(2)), 2))
        assert _passes(m, ("is_map_key", "b", Var(2)))
        assert _passes(m, ("is_map", Var(2)))


async def test_type_tests_self_and_node():
    async with otp.open_node():
        t = ets.new("t")
        me, ref = otp.self(), otp.make_ref()
        ets.insert(t, [("pid", me), ("ref", ref), ("fun", len), ("int", 1), ("atom", "a")])

        def having(test):
            return sorted(ets.select(t, [((Var(1), Var(2)), [(test, Var(2))], Var(1))]))

        assert having("is_pid") == ["pid"]
        assert having("is_reference") == ["ref"]
        assert having("is_function") == ["fun"]
        assert having("is_integer") == ["int"]
        assert having("is_atom") == ["atom"]
        assert ets.select(t, [((Var(1), Var(2)), [("=:=", Var(2), ("self",))], Var(1))]) == ["pid"]
        node = me.node
        assert ets.select(t, [(("int", ANY), [], ("node",))]) == [("node",)]  # results: templates
        assert ets.select_count(t, [(("int", ANY), [("==", ("node",), node)], True)]) == 1
        assert ets.select_count(t, [((ANY, Var(2)), [("==", ("node", Var(2)), node)], True)]) == 2


async def test_patterns_match_exactly_so_1_does_not_match_1_0():
    async with otp.open_node():
        t = ets.new("t", type=ets.BAG)
        ets.insert(t, [("a", 1), ("a", 1.0), ("b", 2, 2.0)])
        assert ets.match_object(t, ("a", 1)) == [("a", 1)]
        assert ets.match_object(t, (ANY, 1.0)) == [("a", 1.0)]
        assert ets.match(t, ("b", Var(1), Var(1))) == []  # a repeated variable: exact too
        assert ets.select_count(t, [(("a", 1.0), [], True)]) == 1


async def test_deep_guards_raise_a_typed_error_and_deep_patterns_match():
    async with otp.open_node():
        t = ets.new("t")
        deep_value = 0
        for _ in range(5000):
            deep_value = (deep_value,)
        ets.insert(t, ("k", deep_value))
        guard = Var(1)
        for _ in range(5000):
            guard = ("not", guard)
        with pytest.raises(ets.EtsError, match="nested deeper than 200 levels"):
            ets.select(t, [((Var(1), ANY), [guard], True)])
        result = Var(1)
        for _ in range(5000):
            result = [result]
        with pytest.raises(ets.EtsError, match="result is nested deeper than 200 levels"):
            ets.select(t, [((Var(1), ANY), [], result)])
        assert ets.match_object(t, ("k", deep_value)) == [("k", deep_value)]
        assert ets.select(t, [(("k", deep_value), [], True)]) == [True]
        exactly = ("=:=", Var(1), ("const", deep_value))
        assert ets.select_count(t, [((ANY, Var(1)), [exactly], True)]) == 1
        assert ets.select_count(t, [((ANY, Var(1)), [(">", Var(1), 0)], True)]) == 1


async def test_error_messages_show_a_bounded_repr_of_any_value():
    async with otp.open_node():
        t = ets.new("t")
        huge = 10**5000  # has no repr: Python refuses ints over 4,300 digits
        with pytest.raises(ets.EtsError, match=r"\(got <int of 16610 bits>\)"):
            ets.insert(t, huge)
        with pytest.raises(ets.EtsError, match=r"keys must be hashable \(got \[<int of 16610"):
            ets.insert(t, ([huge], 1))
        with pytest.raises(ets.EtsError, match=r"object \(<int of 16610 bits>,\) has no element"):
            ets.insert(ets.new("k", keypos=2), (huge,))
        with pytest.raises(ets.EtsError) as caught:
            ets.lookup(huge, 1)
        assert len(str(caught.value)) < 400
        deep: object = ()
        for _ in range(5000):
            deep = [deep]
        with pytest.raises(ets.EtsError) as caught:
            ets.select(t, [((ANY,), [], True), deep])
        assert "each match spec clause" in str(caught.value) and len(str(caught.value)) < 400


# -- fun2ms ---------------------------------------------------------------------------------------

LIMIT = 18


def _adults(name, age, _city):
    """The names of people of age (a docstring is allowed)."""
    if age >= LIMIT and is_integer(age):  # noqa: F821  (a guard function, not Python)
        return name


def _where(name, age, city="oslo"):
    if not age < 40:
        return ("old", name)
    return (name, [city, age])


def test_fun2ms_writes_the_match_spec_a_function_describes():
    assert ets.fun2ms(_adults) == [
        (
            (Var(1), Var(2), ANY),
            [("andalso", (">=", Var(2), ("const", 18)), ("is_integer", Var(2)))],
            Var(1),
        )
    ]
    assert ets.fun2ms(_where) == [
        ((Var(1), Var(2), "oslo"), [("not", ("<", Var(2), 40))], ("old", Var(1))),
        ((Var(1), Var(2), "oslo"), [], (Var(1), ["oslo", Var(2)])),
    ]


async def test_fun2ms_specs_select_like_hand_written_ones():
    async with otp.open_node():
        t = await _people()
        assert sorted(ets.select(t, ets.fun2ms(_adults))) == ["ann", "ann", "cid"]

        dan = "dan"

        def pairs(name, age, city):
            # orelse stops at dan, whose age - 30 would fail the whole guard.
            if name is dan or (0 < age - 30 < 10 and city in ("oslo", "rome")):
                return OBJECT

        assert sorted(ets.select(t, ets.fun2ms(pairs))) == [
            ("ann", 31, "oslo"),
            ("dan", "unknown", "rome"),
        ]


def test_fun2ms_refuses_what_a_match_spec_cannot_say():
    def loops(key, value):
        for item in value:
            return item

    def computes(key, value):
        return value + 1

    def calls(key, value):
        if print(value):
            return key

    with pytest.raises(ets.EtsError, match=r"the body is 'if GUARD: return RESULT' clauses"):
        ets.fun2ms(loops)
    with pytest.raises(ets.EtsError, match="a result is a template"):
        ets.fun2ms(computes)
    with pytest.raises(ets.EtsError, match=r"print\(\.\.\.\) is not a guard function"):
        ets.fun2ms(calls)
    with pytest.raises(ets.EtsError, match="defined with def"):
        ets.fun2ms(lambda key: key)


async def test_select_with_several_heads_and_a_nan_key_gives_results_or_an_ets_error():
    async with otp.open_node():
        t = ets.new("t", type=ets.ORDERED_SET)
        ets.insert(t, (1, "a"))
        # One head with a NaN key simply matches nothing:
        assert ets.select(t, [((float("nan"), ANY), [], OBJECT)]) == []
        spec = [((1, ANY), [], OBJECT), ((float("nan"), ANY), [], OBJECT)]
        try:
            got = ets.select(t, spec)
        except ets.EtsError:
            pass  # a typed, explained refusal would do too
        else:
            assert got == [(1, "a")]


async def test_guards_given_as_a_single_tuple_are_refused_or_applied():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, [("a", 1), ("b", 3)])
        spec = [((Var(1), Var(2)), (">", Var(2), 2), Var(1))]  # forgot the [ ]
        try:
            got = ets.select(t, spec)
        except ets.EtsError:
            pass
        else:
            assert got == ["b"]  # today: [] -- ">" , Var(2) and 2 each "fail" as guards


async def test_an_unbound_variable_in_a_spec_is_an_error():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("a", 1, 2))
        with pytest.raises(ets.EtsError):
            ets.select(t, [((Var(1), Var(2), ANY), [(">", Var(3), 0)], Var(1))])
        with pytest.raises(ets.EtsError):
            ets.select(t, [((Var(1), ANY, ANY), [], Var(2))])


async def test_element_guard_with_a_negative_position_fails_the_guard():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("a", 1, 2))
        spec = [((Var(1), ANY, ANY), [("==", ("element", -1, OBJECT), 2)], Var(1))]
        assert ets.select(t, spec) == []  # today: ["a"]


async def test_a_guard_tuple_instead_of_a_list_is_refused_with_what_to_write():
    async with otp.open_node():
        t = ets.new("t")
        with pytest.raises(ets.EtsError, match=r"write one guard as \[guard\]"):
            ets.select(t, [((Var(1), Var(2)), (">", Var(2), 2), Var(1))])
        with pytest.raises(ets.EtsError, match="list of guard"):
            ets.select(t, [((Var(1), Var(2)), (), Var(1))])


async def test_unbound_variable_error_names_it_and_const_args_are_literals():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("a", 1))
        with pytest.raises(ets.EtsError, match=r"Var\(3\) unbound"):
            ets.select(t, [((Var(1), ANY), [], (Var(1), [Var(3)]))])
        # A const's argument is a literal, not a use; a variable bound inside a list head counts.
        assert ets.select(t, [((Var(1), ANY), [("!=", ("const", Var(9)), 0)], Var(1))]) == ["a"]
        ets.insert(t, ("b", [2]))
        assert ets.select(t, [((ANY, [Var(2)]), [], Var(2))]) == [2]


async def test_element_guard_takes_positions_inside_a_tuple_only():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("a", [1, 2], (3, 4)))
        spec = [((Var(1), Var(2), Var(3)), [("==", ("element", 1, Var(3)), 4)], Var(1))]
        assert ets.select(t, spec) == ["a"]
        on_a_list = [((Var(1), Var(2), ANY), [("==", ("element", 0, Var(2)), 1)], Var(1))]
        assert ets.select(t, on_a_list) == []
        past_the_end = [((Var(1), ANY, Var(3)), [("==", ("element", 2, Var(3)), 4)], Var(1))]
        assert ets.select(t, past_the_end) == []


async def test_match_delete_errors_name_match_delete():
    async with otp.open_node():
        t = ets.new("t")
        ets.insert(t, ("a", 1))
        with pytest.raises(ets.AccessDenied) as info:
            await in_process(ets.match_delete, t, (ANY, ANY))
        assert info.value.operation == "match_delete"
        assert "ets.match_delete(" in str(info.value)


async def test_select_delete_tells_equal_copies_apart_by_their_guard():
    # In a duplicate_bag (k, 1) == (k, 1.0); a guard on the float removes that copy only.
    async with otp.open_node():
        t = ets.new("t", type=ets.DUPLICATE_BAG)
        ets.insert(t, [("k", 1), ("k", 1.0), ("k", 1)])
        spec = [((ANY, Var(1)), [("is_float", Var(1))], True)]
        assert ets.select_delete(t, spec) == 1
        assert [type(obj[1]) for obj in ets.lookup(t, "k")] == [int, int]
