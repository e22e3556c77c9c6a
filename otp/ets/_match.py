"""Patterns and match specifications: Erlang's ``ets:match/2`` and ``ets:select/2`` in Python.

A *pattern* is an object shape: a tuple whose elements are literals (compared with ``==``),
:data:`ANY` (Erlang's ``'_'``), :class:`Var` (``'$1'``: binds on first use, must be equal on
every further use) or nested tuples and lists of those. A *match spec* is a list of
``(head, guards, result)`` clauses, as Erlang's ``[{Head, Guards, [Result]}]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ._errors import EtsError, brief
from ._guards import FUNCTIONS, UNARY
from ._order import exact_eq


def _non_negative(_instance: Any, _attribute: Any, value: Any) -> None:
    if value.__class__ is not int or value < 0:
        raise EtsError(f"Var.n must be an int >= 0 (got {brief(value)})", operation="Var")


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

#: Nesting levels a guard expression or a result may have: they are compiled and built
#: recursively, and a typed error beats a RecursionError (patterns are matched iteratively and
#: have no such bound).
MAX_DEPTH = 200

_SPECIAL = ("and", "or", "andalso", "orelse", "const")

#: Every guard operation, for error messages.
GUARD_OPS = (*FUNCTIONS, *_SPECIAL)

#: A compiled guard expression: (bindings, object) -> value; raises to fail the guard.
Compiled = Callable[[dict[int, Any], Any], Any]


class _Unbound(Exception):
    pass


# -- patterns -----------------------------------------------------------------------------------


def bind(pattern: Any, value: Any, bindings: dict[int, Any]) -> bool:
    """Match ``value`` against ``pattern``, adding to ``bindings``; True if it matches.

    Literals and repeated variables match exactly (Erlang's ``=:=``: ``1`` does not match
    ``1.0``). Iterative, so a pattern of any depth is matched without exhausting the stack:
    nested tuples and lists wait on a stack while their siblings are matched (exact match is
    an equivalence, so the order in which a variable is first bound does not matter)."""
    pending: list[tuple[Any, Any]] = []
    pat, val = pattern, value
    while True:
        cls = pat.__class__
        if cls is tuple or cls is list:
            if cls is tuple:
                if not isinstance(val, tuple) or len(val) != len(pat):
                    return False
            elif val.__class__ is not list or len(val) != len(pat):
                return False
            for sub, item in zip(pat, val, strict=True):
                kind = sub.__class__
                if kind is Var:
                    n = sub.n
                    if n in bindings:
                        if not exact_eq(bindings[n], item):
                            return False
                    else:
                        bindings[n] = item
                elif sub is ANY:
                    continue
                elif kind is tuple or kind is list:
                    pending.append((sub, item))
                elif not exact_eq(sub, item):
                    return False
        elif cls is Var:
            n = pat.n
            if n in bindings:
                if not exact_eq(bindings[n], val):
                    return False
            else:
                bindings[n] = val
        elif pat is not ANY and not exact_eq(pat, val):
            return False
        if not pending:
            return True
        pat, val = pending.pop()


def is_ground(pattern: Any) -> bool:
    """True if ``pattern`` holds no variable nor wildcard (it matches only equal values)."""
    stack = [pattern]
    while stack:
        item = stack.pop()
        if item.__class__ is Var or item is ANY or item is OBJECT or item is BINDINGS:
            return False
        if isinstance(item, tuple | list):
            stack.extend(item)
    return True


def ordered_bindings(bindings: dict[int, Any]) -> list[Any]:
    return [bindings[n] for n in sorted(bindings)]


# -- match specs --------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Clause:
    """One compiled ``(head, guards, result)`` clause: ``guards`` are compiled expressions."""

    head: Any
    guards: tuple[Compiled, ...]
    result: Any


def _bad(operation: str, message: str) -> EtsError:
    return EtsError(f"ets.{operation}: {message}", operation=operation)


def _constant(value: Any) -> Compiled:
    return lambda _bindings, _obj: value


def _compile(expr: Any, operation: str, used: set[int], depth: int) -> Compiled:
    """Compile one guard expression, adding the variables it reads to ``used``."""
    if depth > MAX_DEPTH:
        raise _bad(
            operation,
            f"a guard expression is nested deeper than {MAX_DEPTH} levels; flatten it (a"
            " literal of any depth goes in ('const', value))",
        )
    cls = expr.__class__
    if cls is Var:
        n = expr.n
        used.add(n)
        return lambda bindings, _obj: bindings[n]
    if expr is OBJECT:
        return lambda _bindings, obj: obj
    if expr is BINDINGS:
        return lambda bindings, _obj: ordered_bindings(bindings)
    if isinstance(expr, tuple) and expr and isinstance(expr[0], str):
        return _compile_call(expr, operation, used, depth)
    if cls is tuple or cls is list:  # a namedtuple or list subclass stays a literal
        parts = [_compile(item, operation, used, depth + 1) for item in expr]
        if cls is list:
            return lambda bindings, obj: [part(bindings, obj) for part in parts]
        return lambda bindings, obj: tuple([part(bindings, obj) for part in parts])
    return _constant(expr)


def _compile_call(expr: tuple[Any, ...], operation: str, used: set[int], depth: int) -> Compiled:
    op, args = expr[0], expr[1:]
    if op == "const":
        if len(args) != 1:
            raise _arity(operation, op, "1", expr)
        return _constant(args[0])
    parts = [_compile(arg, operation, used, depth + 1) for arg in args]
    if op in ("and", "or", "andalso", "orelse"):
        if not parts:
            raise _bad(
                operation, f"guard operation {op!r} needs at least one argument (got {brief(expr)})"
            )
        return _BOOLEAN_FORMS[op](parts)
    entry = FUNCTIONS.get(op)
    if entry is None:
        raise _bad(
            operation,
            f"unknown guard operation {brief(op)} in {brief(expr)}; a guard tuple starting with"
            f" a str is an operation, one of {', '.join(GUARD_OPS)} (write a literal tuple as"
            " ('const', (...)))",
        )
    fewest, most, fn = entry
    if not fewest <= len(parts) <= most:
        expected = str(fewest) if fewest == most else f"{fewest} to {most}"
        raise _arity(operation, op, expected, expr)
    if len(parts) == 1 and op in UNARY:
        fn = UNARY[op]
    if not parts:
        return lambda _bindings, _obj: fn()
    if len(parts) == 1:
        (first,) = parts
        return lambda bindings, obj: fn(first(bindings, obj))
    first, second = parts
    return lambda bindings, obj: fn(first(bindings, obj), second(bindings, obj))


def _arity(operation: str, op: str, expected: str, expr: Any) -> EtsError:
    return _bad(
        operation,
        f"guard operation {op!r} takes {expected} argument(s) (got {len(expr) - 1} in"
        f" {brief(expr)})",
    )


class _NotBoolean(Exception):
    pass


def _boolean(value: Any) -> bool:
    if value is not True and value is not False:
        raise _NotBoolean()
    return value


def _and(parts: list[Compiled]) -> Compiled:
    # Every argument is evaluated and must be a boolean (OTP's matchAnd).
    def run(bindings: dict[int, Any], obj: Any) -> bool:
        result = True
        for part in parts:
            if not _boolean(part(bindings, obj)):
                result = False
        return result

    return run


def _or(parts: list[Compiled]) -> Compiled:
    def run(bindings: dict[int, Any], obj: Any) -> bool:
        result = False
        for part in parts:
            if _boolean(part(bindings, obj)):
                result = True
        return result

    return run


def _andalso(parts: list[Compiled]) -> Compiled:
    # Left to right, stopping at the first false; the last argument's value is the result,
    # whatever it is (as Erlang's andalso).
    *init, last = parts

    def run(bindings: dict[int, Any], obj: Any) -> Any:
        for part in init:
            if not _boolean(part(bindings, obj)):
                return False
        return last(bindings, obj)

    return run


def _orelse(parts: list[Compiled]) -> Compiled:
    *init, last = parts

    def run(bindings: dict[int, Any], obj: Any) -> Any:
        for part in init:
            if _boolean(part(bindings, obj)):
                return True
        return last(bindings, obj)

    return run


_BOOLEAN_FORMS: dict[str, Callable[[list[Compiled]], Compiled]] = {
    "and": _and,
    "or": _or,
    "andalso": _andalso,
    "orelse": _orelse,
}


def compile_spec(spec: Any, operation: str) -> list[Clause]:
    """Validate a match spec and return its clauses.

    Raises:
        EtsError: the spec is not a list of ``(head, guards, result)`` tuples, a guard list is
            not a list, a guard uses an unknown operation or the wrong number of arguments, a
            guard or result is nested deeper than ``MAX_DEPTH``, or the guards or result use a
            variable the head does not bind (OTP's "variable is unbound").
    """
    if not isinstance(spec, list):
        raise _bad(
            operation,
            f"a match spec is a list of (head, guards, result) tuples (got {brief(spec)})",
        )
    clauses = []
    for clause in spec:
        if not isinstance(clause, tuple) or len(clause) != 3:
            raise _bad(
                operation,
                f"each match spec clause is a (head, guards, result) tuple (got {brief(clause)})",
            )
        head, guards, result = clause
        if not isinstance(guards, list):
            # Not a tuple either: one guard written without its [ ] is a tuple too, and would
            # be taken for a list of guards that each fail.
            raise _bad(
                operation,
                f"the guards of a clause are a list of guard expressions (got {brief(guards)};"
                " write one guard as [guard], none as [])",
            )
        used: set[int] = set()
        compiled = tuple(_compile(guard, operation, used, 1) for guard in guards)
        if _deeper_than(result, MAX_DEPTH):
            raise _bad(operation, f"a match spec result is nested deeper than {MAX_DEPTH} levels")
        _variables(result, used)
        bound: set[int] = set()
        _variables(head, bound)
        unbound = sorted(used - bound)
        if unbound:
            names = ", ".join(repr(Var(n)) for n in unbound)
            raise _bad(
                operation,
                f"{names} unbound in clause {brief(clause)}: a variable the guards or the result"
                " use must appear in the head",
            )
        clauses.append(Clause(head, compiled, result))
    return clauses


def _deeper_than(term: Any, limit: int) -> bool:
    stack = [(term, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, tuple | list):
            if depth > limit:
                return True
            stack.extend((sub, depth + 1) for sub in item)
    return False


def _variables(term: Any, found: set[int]) -> None:
    """Add the numbers of the variables in ``term`` (a pattern or a result) to ``found``."""
    stack = [term]
    while stack:
        item = stack.pop()
        if item.__class__ is Var:
            found.add(item.n)
        elif item.__class__ is tuple or item.__class__ is list:
            stack.extend(item)


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
    ``True``, or ``NO_MATCH``. A guard that raises (arithmetic on a str, ``element`` outside
    the tuple, ``not`` of a non-boolean) fails its clause, as a failing guard does in Erlang
    (``compile_spec`` refuses unbound variables)."""
    for clause in clauses:
        bindings: dict[int, Any] = {}
        if not bind(clause.head, obj, bindings):
            continue
        try:
            for guard in clause.guards:
                if guard(bindings, obj) is not True:
                    break
            else:
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
