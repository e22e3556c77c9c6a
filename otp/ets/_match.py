"""Patterns and match specifications: Erlang's ``ets:match/2`` and ``ets:select/2`` in Python.

A *pattern* is an object shape: a tuple whose elements are literals (compared with ``==``),
:data:`ANY` (Erlang's ``'_'``), :class:`Var` (``'$1'``: binds on first use, must be equal on
every further use) or nested tuples and lists of those. A *match spec* is a list of
``(head, guards, result)`` clauses, as Erlang's ``[{Head, Guards, [Result]}]``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import EtsError


def _non_negative(_instance: Any, _attribute: Any, value: Any) -> None:
    if value.__class__ is not int or value < 0:
        raise EtsError(f"Var.n must be an int >= 0 (got {value!r})", operation="Var")


@attrs.frozen(slots=True, repr=False)
class Var:
    """A pattern variable, Erlang's ``'$N'``: ``Var(1)`` is ``'$1'``.

    In a pattern it matches anything the first time and binds it; each further use must be
    equal. ``match`` returns the bindings ordered by ``n``.
    """

    n: int = attrs.field(validator=_non_negative)

    def __repr__(self) -> str:
        return f"Var({self.n})"


class _Marker:
    __slots__ = ("_label",)

    def __init__(self, label: str) -> None:
        self._label = label

    def __repr__(self) -> str:
        return self._label

    def __copy__(self) -> _Marker:
        return self

    def __deepcopy__(self, memo: object) -> _Marker:
        return self


#: The wildcard: matches anything and binds nothing (Erlang's ``'_'``).
ANY: Any = _Marker("ANY")
#: In a result or guard: the whole matched object (Erlang's ``'$_'``).
OBJECT: Any = _Marker("OBJECT")
#: In a result or guard: every binding, as a list ordered by variable number (``'$$'``).
BINDINGS: Any = _Marker("BINDINGS")

_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "in": lambda item, container: item in container,
    "element": lambda pos, tup: _element(pos, tup),
}


def _element(pos: Any, tup: Any) -> Any:
    # Python indexing would take -1 as the last element and index lists and strs; Erlang's
    # element/2 fails the guard for anything but a position inside a tuple (0-based here).
    if not isinstance(tup, tuple) or pos.__class__ is not int or not 0 <= pos < len(tup):
        raise IndexError(f"element {pos!r} of {tup!r}: no such element of a tuple")
    return tup[pos]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TESTS: dict[str, Callable[[Any], Any]] = {
    "not": lambda value: value is False,
    "len": len,
    "is_int": _is_int,
    "is_float": lambda value: isinstance(value, float),
    "is_number": lambda value: isinstance(value, int | float) and not isinstance(value, bool),
    "is_bool": lambda value: isinstance(value, bool),
    "is_str": lambda value: isinstance(value, str),
    "is_bytes": lambda value: isinstance(value, bytes),
    "is_tuple": lambda value: isinstance(value, tuple),
    "is_list": lambda value: isinstance(value, list),
    "is_none": lambda value: value is None,
}

_VARIADIC = ("and", "or")

#: Every guard operation, for error messages.
GUARD_OPS = (*_CMP, *_TESTS, *_VARIADIC, "const")


class _Unbound(Exception):
    pass


# -- patterns -----------------------------------------------------------------------------------


def bind(pattern: Any, value: Any, bindings: dict[int, Any]) -> bool:
    """Match ``value`` against ``pattern``, adding to ``bindings``; True if it matches."""
    cls = pattern.__class__
    if cls is tuple:
        if not isinstance(value, tuple) or len(value) != len(pattern):
            return False
        for sub, item in zip(pattern, value, strict=True):
            if not bind(sub, item, bindings):
                return False
        return True
    if cls is Var:
        n = pattern.n
        if n in bindings:
            return bool(bindings[n] == value)
        bindings[n] = value
        return True
    if pattern is ANY:
        return True
    if cls is list:
        if value.__class__ is not list or len(value) != len(pattern):
            return False
        for sub, item in zip(pattern, value, strict=True):
            if not bind(sub, item, bindings):
                return False
        return True
    try:
        return bool(pattern == value)
    except Exception:
        return False


def is_ground(pattern: Any) -> bool:
    """True if ``pattern`` holds no variable nor wildcard (it matches only equal values)."""
    if pattern.__class__ is Var or pattern is ANY or pattern is OBJECT or pattern is BINDINGS:
        return False
    if isinstance(pattern, tuple | list):
        return all(is_ground(item) for item in pattern)
    return True


def ordered_bindings(bindings: dict[int, Any]) -> list[Any]:
    return [bindings[n] for n in sorted(bindings)]


# -- match specs --------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Clause:
    """One compiled ``(head, guards, result)`` clause."""

    head: Any
    guards: tuple[Any, ...]
    result: Any


def _check_guard(expr: Any, operation: str) -> None:
    if isinstance(expr, list):
        for item in expr:
            _check_guard(item, operation)
        return
    if not isinstance(expr, tuple) or not expr or not isinstance(expr[0], str):
        if isinstance(expr, tuple):
            for item in expr:
                _check_guard(item, operation)
        return
    op, args = expr[0], expr[1:]
    if op == "const":
        expected = 1
    elif op in _CMP:
        expected = 2
    elif op in _TESTS:
        expected = 1
    elif op in _VARIADIC:
        expected = -1
    else:
        raise EtsError(
            f"ets.{operation}: unknown guard operation {op!r} in {expr!r}; a guard tuple starting"
            f" with a str is an operation, one of {', '.join(GUARD_OPS)} (write a literal tuple"
            f" as ('const', {expr!r}))",
            operation=operation,
        )
    if expected >= 0 and len(args) != expected:
        raise EtsError(
            f"ets.{operation}: guard operation {op!r} takes {expected} argument(s)"
            f" (got {len(args)} in {expr!r})",
            operation=operation,
        )
    if expected < 0 and not args:
        raise EtsError(
            f"ets.{operation}: guard operation {op!r} needs at least one argument (got {expr!r})",
            operation=operation,
        )
    if op != "const":
        for item in args:
            _check_guard(item, operation)


def compile_spec(spec: Any, operation: str) -> list[Clause]:
    """Validate a match spec and return its clauses.

    Raises:
        EtsError: the spec is not a list of ``(head, guards, result)`` tuples, a guard list is
            not a list, a guard uses an unknown operation or the wrong number of arguments, or
            the guards or result use a variable the head does not bind (OTP's "variable is
            unbound").
    """
    if not isinstance(spec, list):
        raise EtsError(
            f"ets.{operation}: a match spec is a list of (head, guards, result) tuples"
            f" (got {spec!r})",
            operation=operation,
        )
    clauses = []
    for clause in spec:
        if not isinstance(clause, tuple) or len(clause) != 3:
            raise EtsError(
                f"ets.{operation}: each match spec clause is a (head, guards, result) tuple"
                f" (got {clause!r})",
                operation=operation,
            )
        head, guards, result = clause
        if not isinstance(guards, list):
            # Not a tuple either: one guard written without its [ ] is a tuple too, and would
            # be taken for a list of guards that each fail.
            raise EtsError(
                f"ets.{operation}: the guards of a clause are a list of guard expressions"
                f" (got {guards!r}; write one guard as [guard], none as [])",
                operation=operation,
            )
        for guard in guards:
            _check_guard(guard, operation)
        _check_bound(clause, operation)
        clauses.append(Clause(head, tuple(guards), result))
    return clauses


def _check_bound(clause: tuple[Any, Any, Any], operation: str) -> None:
    head, guards, result = clause
    bound: set[int] = set()
    _variables(head, bound, guard=False)
    used: set[int] = set()
    _variables(guards, used, guard=True)
    _variables(result, used, guard=False)
    unbound = sorted(used - bound)
    if unbound:
        names = ", ".join(repr(Var(n)) for n in unbound)
        raise EtsError(
            f"ets.{operation}: {names} unbound in clause {clause!r}: a variable the guards or"
            " the result use must appear in the head",
            operation=operation,
        )


def _variables(expr: Any, found: set[int], *, guard: bool) -> None:
    """Add the numbers of the variables in ``expr`` to ``found`` (in a guard, a ``const``'s
    argument is a literal)."""
    cls = expr.__class__
    if cls is Var:
        found.add(expr.n)
    elif cls is tuple or cls is list:
        if guard and cls is tuple and expr and isinstance(expr[0], str) and expr[0] == "const":
            return
        for item in expr:
            _variables(item, found, guard=guard)


def _eval(expr: Any, bindings: dict[int, Any], obj: Any) -> Any:
    cls = expr.__class__
    if cls is Var:
        try:
            return bindings[expr.n]
        except KeyError:
            raise _Unbound() from None
    if expr is OBJECT:
        return obj
    if expr is BINDINGS:
        return ordered_bindings(bindings)
    if cls is tuple:
        if expr and isinstance(expr[0], str):
            op = expr[0]
            if op == "const":
                return expr[1]
            if op == "and":
                return all(_eval(arg, bindings, obj) is True for arg in expr[1:])
            if op == "or":
                return any(_eval(arg, bindings, obj) is True for arg in expr[1:])
            fn2 = _CMP.get(op)
            if fn2 is not None:
                return fn2(_eval(expr[1], bindings, obj), _eval(expr[2], bindings, obj))
            return _TESTS[op](_eval(expr[1], bindings, obj))
        return tuple([_eval(item, bindings, obj) for item in expr])
    if cls is list:
        return [_eval(item, bindings, obj) for item in expr]
    return expr


def build(result: Any, bindings: dict[int, Any], obj: Any) -> Any:
    """Build a clause's result: variables, ``OBJECT`` and ``BINDINGS`` are substituted anywhere
    in tuples and lists; everything else is taken literally."""
    cls = result.__class__
    if cls is Var:
        try:
            return bindings[result.n]
        except KeyError:
            raise _Unbound() from None
    if result is OBJECT:
        return obj
    if result is BINDINGS:
        return ordered_bindings(bindings)
    if cls is tuple:
        return tuple([build(item, bindings, obj) for item in result])
    if cls is list:
        return [build(item, bindings, obj) for item in result]
    return result


_NO_MATCH: Any = object()


def run_spec(clauses: list[Clause], obj: Any) -> Any:
    """The result of the first clause whose head matches ``obj`` and whose guards are all
    ``True``, or ``NO_MATCH``. A guard that raises (say, ``<`` between a str and an int) fails
    its clause, as a failing guard does in Erlang (``compile_spec`` refuses unbound variables)."""
    for clause in clauses:
        bindings: dict[int, Any] = {}
        if not bind(clause.head, obj, bindings):
            continue
        try:
            if all(_eval(guard, bindings, obj) is True for guard in clause.guards):
                return build(clause.result, bindings, obj)
        except Exception:
            continue
    return _NO_MATCH


NO_MATCH = _NO_MATCH


def key_hints(heads: list[Any], keypos: int) -> list[Any] | None:
    """The keys every head pins down at ``keypos``, or None if some head leaves the key open
    (then the whole table is scanned)."""
    keys = []
    for head in heads:
        if head.__class__ is not tuple or len(head) <= keypos or not is_ground(head[keypos]):
            return None
        keys.append(head[keypos])
    return keys
