"""Match and select: ``match``, ``match_object``, ``select`` (and reverse, count, delete)
with match specs, whole or in chunks with continuations (Erlang's ``ets:select/1,2,3``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._access import reader as _reader
from ._access import writer as _writer
from ._continuation import Continuation, check_limit, hinted_keys, resume, start
from ._errors import EtsError, brief
from ._match import (
    BINDINGS,
    NO_MATCH,
    OBJECT,
    bind,
    compile_spec,
    ordered_bindings,
    run_spec,
)
from ._table import Tab
from ._types import (
    END_OF_TABLE,
    TableRef,
)

_NO_SPEC: Any = object()


def _candidates(tab: Tab, heads: list[Any]) -> Iterable[Any]:
    """The objects worth matching against ``heads``: those under the keys the heads pin down,
    or every object (in table order)."""
    keys = hinted_keys(tab, heads)
    if keys is None:
        return tab.objects()
    found: list[Any] = []
    for key in keys:
        found.extend(tab.get(key))
    return found


def match(table: Any, pattern: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """For each object matching ``pattern``, the values of its variables ordered by number
    (Erlang's ``ets:match/2``). ``Var(n)`` binds, ``ANY`` matches anything, other values
    match exactly (Erlang's ``=:=``: ``1`` does not match ``1.0``).

    With ``limit`` (``ets:match/3``) it returns the first chunk as :func:`select` does, and
    ``match(continuation)`` (``ets:match/1``) the next one.
    """
    if pattern is _NO_SPEC:
        return _continue(table, "match")
    tab = _reader(table, "match")
    if limit is not None:
        return _first_chunk(tab, [(pattern, [], BINDINGS)], limit, False, "match")
    results = []
    for obj in _candidates(tab, [pattern]):
        bindings: dict[int, Any] = {}
        if bind(pattern, obj, bindings):
            results.append(ordered_bindings(bindings))
    return results


def match_object(table: Any, pattern: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """The objects matching ``pattern`` (Erlang's ``ets:match_object/2``); with ``limit``
    the first chunk (``match_object/3``), and ``match_object(continuation)`` the next."""
    if pattern is _NO_SPEC:
        return _continue(table, "match_object")
    tab = _reader(table, "match_object")
    if limit is not None:
        return _first_chunk(tab, [(pattern, [], OBJECT)], limit, False, "match_object")
    return [obj for obj in _candidates(tab, [pattern]) if bind(pattern, obj, {})]


def _first_chunk(tab: Tab, spec: Any, limit: Any, reverse: bool, operation: str) -> Any:
    check_limit(limit, operation)
    return start(tab, compile_spec(spec, operation), limit, reverse)


def _continue(cont: Any, operation: str) -> Any:
    """The chunk after ``cont``: access is checked again, against the caller of now."""
    if cont is END_OF_TABLE:
        return END_OF_TABLE
    if cont.__class__ is not Continuation:
        raise EtsError(
            f"ets.{operation}/1 takes a continuation from ets.{operation} with a limit, or"
            f" END_OF_TABLE (got {brief(cont)}); to run over a table pass it and a"
            f" {'pattern' if operation.startswith('match') else 'match spec'}",
            operation=operation,
        )
    return resume(_reader(cont.table, operation), cont)


def match_delete(table: TableRef, pattern: Any) -> None:
    """Delete the objects matching ``pattern`` (Erlang's ``ets:match_delete/2``)."""
    _select_delete(table, [(pattern, [], True)], "match_delete")


def select(table: Any, spec: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """Run a match spec over the table (Erlang's ``ets:select/2``); returns the results.

    ``spec`` is a list of ``(head, guards, result)`` clauses, ``guards`` a list. For each
    object the first clause whose ``head`` pattern matches (literals and repeated variables
    exactly, as Erlang's ``=:=``) and whose guards all evaluate to ``True`` gives the object's
    result; every ``Var(n)`` the guards or result use must be bound by the head (else
    :class:`EtsError`, as OTP's ``badarg``). Guards are expressions: ``Var(n)``, ``OBJECT``,
    ``BINDINGS``, literals, tuples and lists of expressions, ``("const", term)`` for a literal
    tuple, and calls ``(op, *args)`` with Erlang's semantics (OTP's "Match Specifications in
    Erlang"):

    - comparisons in the term order (see ``otp.ets``): ``==  /=  =:=  =/=  <  =<  >  >=``
      (``!=`` and ``<=`` are aliases), ``min  max``;
    - arithmetic on numbers only: ``+  -`` (also unary) ``*  /  div  rem`` (truncating),
      ``band  bor  bxor  bnot  bsl  bsr  abs  round`` (half away from zero) ``trunc  floor
      ceil  float``, and Python's ``//  %`` (floor);
    - booleans only: ``and  or`` (every argument), ``andalso  orelse`` (left to right, the
      last argument is the value), ``not  xor``;
    - terms: ``element`` (0-based), ``hd  tl  length  size  tuple_size  byte_size  map_get
      map_size  is_map_key``, ``("self",)``, ``("node",)`` and ``("node", pid_or_ref)``, and
      Python's ``in  len``;
    - type tests: ``is_integer  is_float  is_number  is_atom  is_boolean  is_binary  is_tuple
      is_list  is_map  is_pid  is_reference  is_function  is_none`` (and ``is_int  is_bool
      is_str  is_bytes``).

    A guard that raises (arithmetic on a str, ``not`` of a non-boolean, ``element`` outside
    the tuple, an integer over 2**20 bits) fails its clause. Guards and results nest at most
    ``MAX_DEPTH`` (200) levels. The result is a template built from ``Var(n)``, ``OBJECT``
    (the object), ``BINDINGS`` (all bindings) and literals, inside tuples and lists (not
    evaluated). An ordered_set yields results in key order; when every head fixes the key,
    only those keys are looked at.

    With ``limit`` (``ets:select/3``, an int >= 1) it returns one chunk: ``(results,
    continuation)`` with ``limit`` results, or ``(results, END_OF_TABLE)`` with the last ones
    (at most ``limit``), or ``END_OF_TABLE`` if nothing (more) matched; ``select(continuation)``
    (``ets:select/1``) returns the next chunk in the same shapes, and ``select(END_OF_TABLE)``
    is ``END_OF_TABLE``. A full chunk may be followed by ``END_OF_TABLE``. Continuations stay
    valid across inserts and deletes without ``safe_fixtable`` (see :class:`Continuation`).

    Example:
        ``select(t, [((Var(1), Var(2)), [(">", Var(2), 10)], Var(1))])`` -- the keys of the
        pairs whose second element is above 10.
    """
    if spec is _NO_SPEC:
        return _continue(table, "select")
    tab = _reader(table, "select")
    if limit is not None:
        return _first_chunk(tab, spec, limit, False, "select")
    return _select(tab, compile_spec(spec, "select"))


def _select(tab: Tab, clauses: list[Any]) -> list[Any]:
    results = []
    for obj in _candidates(tab, [clause.head for clause in clauses]):
        result = run_spec(clauses, obj)
        if result is not NO_MATCH:
            results.append(result)
    return results


def select_reverse(table: Any, spec: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """:func:`select` from the last key to the first in an ordered_set (Erlang's
    ``ets:select_reverse/1,2,3``); for the other types, exactly :func:`select`. With
    ``limit`` the first chunk holds the *last* ``limit`` results, largest key first."""
    if spec is _NO_SPEC:
        return _continue(table, "select_reverse")
    tab = _reader(table, "select_reverse")
    if limit is not None:
        return _first_chunk(tab, spec, limit, True, "select_reverse")
    results = _select(tab, compile_spec(spec, "select_reverse"))
    if tab.ordered:
        results.reverse()
    return results


def select_count(table: TableRef, spec: list[tuple[Any, list[Any], Any]]) -> int:
    """How many objects the match spec maps to ``True`` (Erlang's ``ets:select_count/2``)."""
    tab = _reader(table, "select_count")
    clauses = compile_spec(spec, "select_count")
    return sum(
        1
        for obj in _candidates(tab, [clause.head for clause in clauses])
        if run_spec(clauses, obj) is True
    )


def select_delete(table: TableRef, spec: list[tuple[Any, list[Any], Any]]) -> int:
    """Delete the objects the match spec maps to ``True``; returns how many
    (Erlang's ``ets:select_delete/2``). Atomic, as every other write."""
    return _select_delete(table, spec, "select_delete")


def _select_delete(table: Any, spec: Any, operation: str) -> int:
    tab = _writer(table, operation)
    clauses = compile_spec(spec, operation)
    doomed: dict[int, Any] = {}
    keys = []
    for obj in _candidates(tab, [clause.head for clause in clauses]):
        if run_spec(clauses, obj) is True:
            doomed[id(obj)] = obj
            keys.append(obj[tab.kp])
    removed = 0
    for key in keys:
        removed += len(tab.keep(key, lambda obj, _deadline: id(obj) not in doomed))
    return removed
