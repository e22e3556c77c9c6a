"""Whole-table traversals beyond ``select``: ``foldl``/``foldr``, ``slot`` and
``select_replace`` (Erlang's ``ets:foldl/3``, ``foldr/3``, ``slot/2``, ``select_replace/2``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._access import reader, writer
from ._continuation import hinted_keys
from ._errors import EtsError, brief
from ._fixtable import fixed_keys
from ._match import ANY, NO_MATCH, OBJECT, Clause, Var, compile_spec, run_spec
from ._order import exact_eq
from ._table import Tab, describe
from ._types import BAG, END_OF_TABLE, TableRef


def foldl(function: Callable[[Any, Any], Any], acc0: Any, table: TableRef) -> Any:
    """``function(obj, acc)`` over every object, first to last in an ordered_set (Erlang's
    ``ets:foldl/3``, arguments in its order); ``acc0`` if the table is empty.

    ``function`` may change the table: objects deleted before their turn are skipped, objects
    it (or anyone) inserts may or may not be visited; every object present throughout is
    visited once. Access is checked before each key, so deleting the table ends the fold with
    :class:`NoSuchTable`.
    """
    acc = acc0
    for obj in _walk(table, "foldl", reverse=False):
        acc = function(obj, acc)
    return acc


def foldr(function: Callable[[Any, Any], Any], acc0: Any, table: TableRef) -> Any:
    """As :func:`foldl`, last to first in an ordered_set (in table order for the others)."""
    acc = acc0
    for obj in _walk(table, "foldr", reverse=True):
        acc = function(obj, acc)
    return acc


def _walk(table: TableRef, operation: str, *, reverse: bool) -> Iterator[Any]:
    tab = reader(table, operation)
    if not tab.ordered:
        for key in tab.fix.keys if tab.fix is not None else list(tab.data):
            yield from reader(table, operation).get(key)
        return
    key = tab.last() if reverse else tab.first()
    while key is not END_OF_TABLE:
        yield from tab.get(key)
        tab = reader(table, operation)
        key = tab.prev(key, operation) if reverse else tab.next(key, operation)


def slot(table: TableRef, i: int) -> Any:
    """The objects in slot ``i`` (Erlang's ``ets:slot/2``, for debugging): slots count from 0
    and ``END_OF_TABLE`` comes right after the last one.

    In an ordered_set slot ``i`` is ``[object i]`` in term order. In a set or bag it is the
    objects of the ``i``-th key in table order; while the table is fixed (``safe_fixtable``)
    the keys are those of the moment it was fixed, so a deleted key's slot is ``[]``.

    Raises:
        EtsError: ``i`` is not an int >= 0, or it is past ``END_OF_TABLE``'s slot.
    """
    tab = reader(table, "slot")
    keys = None if tab.ordered else fixed_keys(tab)
    count = tab.size() if keys is None else len(keys)
    if i.__class__ is not int or not 0 <= i <= count:
        raise EtsError(
            f"ets.slot({describe(table)}, {brief(i)}): the slot must be an int from 0 to {count}"
            f" (the last being END_OF_TABLE)",
            table=table,
            operation="slot",
        )
    if i == count:
        return END_OF_TABLE
    return tab.get(tab.index.at(i) if keys is None else keys[i])


def select_replace(table: TableRef, spec: list[tuple[Any, list[Any], Any]]) -> int:
    """Replace each object the match spec matches with the spec's result; returns how many
    (Erlang's ``ets:select_replace/2``). Atomic, as every other write.

    As in OTP, every clause must visibly keep the key: its result is ``OBJECT``, or a tuple
    whose element at the key position is the head's (the same ``Var``, or an equal literal
    of the same type); else :class:`EtsError` and nothing is replaced. Not for bag tables
    (OTP's rule; duplicate_bag is allowed). A replaced object keeps its time to live.

    Example:
        ``select_replace(t, [((Var(1), "new"), [], (Var(1), "seen"))])`` marks every new
        pair seen (results are built from the head's variables and literals).
    """
    tab = writer(table, "select_replace")
    if tab.kind is BAG:
        raise EtsError(
            f"ets.select_replace({describe(table)}): not for bag tables (OTP refuses them:"
            " a replacement could equal another object of the key); use a set, ordered_set"
            " or duplicate_bag, or delete_object then insert",
            table=table,
            operation="select_replace",
        )
    clauses = compile_spec(spec, "select_replace")
    for number, clause in enumerate(clauses):
        if not _keeps_key(clause, tab.kp):
            raise EtsError(
                f"ets.select_replace({describe(table)}): clause {number} ({brief(clause.head)} ->"
                f" {brief(clause.result)}) does not keep the key: its result must be OBJECT or a"
                f" tuple whose element {tab.kp} is the head's (the same Var or literal);"
                " nothing was replaced",
                table=table,
                operation="select_replace",
            )
    keys = hinted_keys(tab, [clause.head for clause in clauses])
    replaced = 0
    for key in tab.keys() if keys is None else keys:
        replaced += _replace_key(tab, clauses, key)
    return replaced


def _replace_key(tab: Tab, clauses: list[Clause], key: Any) -> int:
    stored = tab.data.get(key)
    if stored is None:
        return 0
    if tab.unique:
        new = run_spec(clauses, stored)
        if new is NO_MATCH:
            return 0
        tab.data[key] = new
        return 1
    replaced = 0
    for index, obj in enumerate(stored):
        new = run_spec(clauses, obj)
        if new is not NO_MATCH:
            stored[index] = new
            replaced += 1
    return replaced


def _keeps_key(clause: Clause, keypos: int) -> bool:
    """OTP's static test: the result's key is, term for term, the head's key."""
    result, head = clause.result, clause.head
    if result is OBJECT:
        return True
    if (
        head.__class__ is not tuple
        or result.__class__ is not tuple
        or len(head) <= keypos
        or len(result) <= keypos
    ):
        return False
    return _same_term(head[keypos], result[keypos])


def _same_term(pattern: Any, built: Any) -> bool:
    # Term for term, by exact match (a head's 1 is not a result's 1.0), and iterative: a head
    # may nest deeper than the stack.
    stack = [(pattern, built)]
    while stack:
        want, got = stack.pop()
        cls = want.__class__
        if want is ANY or got.__class__ is not cls:
            return False
        if cls is Var:
            if want.n != got.n:
                return False
        elif cls is tuple or cls is list:
            if len(want) != len(got):
                return False
            stack.extend(zip(want, got, strict=True))
        elif not exact_eq(want, got):
            return False
    return True
