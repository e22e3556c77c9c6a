"""Erlang's term order and exact match, mapped onto Python values.

One mapping of Python types to Erlang terms serves the ``ordered_set`` order, ``first``/``next``,
and the comparison guards of match specs, so a guard never disagrees with the table:

``None`` < number (``int``, ``float``, ``bool``, ``Fraction``, ``Decimal``) < atom (``str``,
``wire.Atom``) < reference (``Ref``) < fun (any other callable) < pid (``Pid``; ports are
processes here) < tuple (size first, then elements) < map (``dict``: size, then keys, then
values) < list (``[]`` first, then element by element) < binary (``bytes``, ``bytearray``) <
anything else (by qualified type name, then ``repr``).

``order_key(term)`` flattens a term into one flat tuple whose lexicographic order is the term
order: comparing two of them never recurses, so a deeply nested term cannot exhaust the stack.
"""

from __future__ import annotations

from decimal import Decimal
from numbers import Real
from typing import Any

from wire import Atom

from .._ids import Pid, Ref

# Ranks in Erlang's ``number < atom < reference < fun < port < pid < tuple < map < nil < list <
# bitstring``, with None first and everything else last. _END closes a list: it sorts below
# every rank, so a list that is a prefix of another sorts first (and [] before any list).
_END = 0
_NONE = 1
_NUMBER = 2
_ATOM = 3
_REF = 4
_FUN = 5
_PID = 6
_TUPLE = 7
_MAP = 8
_LIST = 9
_BYTES = 10
_OTHER = 11


class UnorderableKey(ValueError):
    """A term that has no place in the order (a NaN, which equals nothing, itself included)."""


class _Marker:
    __slots__ = ()


_CLOSE_LIST: Any = _Marker()


class _Encoded:
    """An already encoded subterm (a map's keys, sorted by their own encodings)."""

    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


def is_number(value: Any) -> bool:
    """An Erlang number: ``int``, ``float``, ``Fraction``, ``Decimal`` (not ``bool``)."""
    cls = value.__class__
    if cls is int or cls is float:
        return True
    if cls is bool:
        return False
    return isinstance(value, Real | Decimal)


def _nan(value: Any) -> bool:
    if value.__class__ is Decimal:
        return bool(value.is_nan())
    return bool(value != value)


def _number_kind(value: Any) -> int:
    """0 for integers (``bool`` included, as Python's dict keeps ``True`` and ``1`` one key),
    1 for the others: in a map's key order Erlang sorts an integer before an equal float."""
    return 0 if isinstance(value, int) else 1


def order_key(term: Any, *, exact: bool = False) -> tuple[Any, ...]:
    """The flat sort key of ``term`` in the term order (see the module docstring).

    Numbers compare by value, so ``1``, ``1.0`` and ``True`` have equal keys; with
    ``exact=True`` an integer sorts before an equal float (Erlang's map key order).

    Raises:
        UnorderableKey: the term is or contains a NaN.
    """
    cls = term.__class__
    if cls is int or cls is str:
        if cls is str:
            return (_ATOM, term, 0)
        return (_NUMBER, term, 0) if exact else (_NUMBER, term)
    out: list[Any] = []
    stack = [term]
    push, pop, emit = stack.append, stack.pop, out.append
    while stack:
        item = pop()
        cls = item.__class__
        if cls is int or cls is float or cls is bool:
            if cls is float and item != item:
                raise UnorderableKey("it equals nothing, itself included")
            emit(_NUMBER)
            emit(item)
            if exact:
                emit(_number_kind(item))
        elif cls is str:
            out += (_ATOM, item, 0)
        elif cls is tuple:
            emit(_TUPLE)
            emit(len(item))
            stack.extend(reversed(item))
        elif item is _CLOSE_LIST:
            emit(_END)
        elif cls is _Encoded:
            out += item.items
        elif item is None:
            emit(_NONE)
        elif cls is Ref or cls is Pid:
            out += (_REF if cls is Ref else _PID, item.node, item.creation, item.id)
        elif cls is Atom:
            out += (_ATOM, item.name, 1)
        elif isinstance(item, Real | Decimal):
            if _nan(item):
                raise UnorderableKey("it equals nothing, itself included")
            emit(_NUMBER)
            emit(item)
            if exact:
                emit(_number_kind(item))
        elif isinstance(item, str):
            out += (_ATOM, str(item), 0)
        elif isinstance(item, tuple):
            emit(_TUPLE)
            emit(len(item))
            stack.extend(reversed(item))
        elif isinstance(item, list):
            emit(_LIST)
            push(_CLOSE_LIST)
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            # Keys in ascending (exact) term order, then the values in that key order.
            keyed = sorted(((order_key(k, exact=True), k) for k in item), key=_first)
            emit(_MAP)
            emit(len(item))
            stack.extend(reversed([item[k] for _, k in keyed]))
            stack.extend(reversed([_Encoded(list(sk)) for sk, _ in keyed]))
        elif isinstance(item, bytes | bytearray):
            emit(_BYTES)
            emit(bytes(item))
        elif callable(item):
            kind = item.__class__
            name = getattr(item, "__qualname__", kind.__qualname__)
            out += (_FUN, f"{getattr(item, '__module__', kind.__module__)}.{name}", repr(item))
        else:
            out += (_OTHER, f"{cls.__module__}.{cls.__qualname__}", repr(item))
    return tuple(out)


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def compare(a: Any, b: Any) -> int:
    """-1, 0 or 1 as ``a`` is below, equal to (Erlang's ``==``) or above ``b`` in the term order.

    Raises:
        UnorderableKey: either term is or contains a NaN.
    """
    ca, cb = a.__class__, b.__class__
    if (ca is int or ca is float) and (cb is int or cb is float):
        if a != a or b != b:
            raise UnorderableKey("it equals nothing, itself included")
        return (a > b) - (a < b)
    if ca is cb and (ca is str or ca is bytes):
        return (a > b) - (a < b)
    ka, kb = order_key(a), order_key(b)
    return (ka > kb) - (ka < kb)


def _exact_kind(value: Any) -> int:
    """Which Erlang type a scalar maps to for exact match: -1 not a number, 0 an integer,
    1 a float, 2 a boolean (Erlang's ``true``/``false`` atoms)."""
    cls = value.__class__
    if cls is int:
        return 0
    if cls is float:
        return 1
    if cls is bool:
        return 2
    if isinstance(value, int):
        return 0
    if isinstance(value, Real | Decimal):
        return 1
    return -1


def exact_eq(a: Any, b: Any) -> bool:
    """Erlang's ``=:=``: equal, and every number pairs with a number of the same type (``1``
    and ``1.0`` differ, so do ``1`` and ``True``), in tuples, lists and dict values alike.
    Iterative: a deep term cannot exhaust the stack."""
    if a is b:
        return True
    cls = a.__class__
    if cls is b.__class__:
        if cls is str or cls is int or cls is bytes or cls is float:
            return bool(a == b)
        if cls is tuple and _flat_exact(a, b):
            return bool(a == b)
    try:
        if not a == b:
            return False  # exact match implies ==
    except RecursionError:
        pass  # too deep for ==: the walk below decides
    except Exception:
        return False
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if isinstance(x, tuple) or isinstance(x, list):
            if x.__class__ is not y.__class__ and not (
                isinstance(x, tuple) and isinstance(y, tuple)
            ):
                return False
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
            continue
        if isinstance(x, dict):
            if not isinstance(y, dict) or len(x) != len(y):
                return False
            y_keys = {key: key for key in y}
            for key, value in x.items():
                if key not in y_keys:
                    return False
                other = y_keys[key]
                stack.append((key, other))
                stack.append((value, y[other]))
            continue
        kind = _exact_kind(x)
        if kind != _exact_kind(y):
            return False
        try:
            if not x == y:
                return False
        except Exception:
            return False
    return True


#: Types whose values are exactly equal when they are == and of the same type.
_SCALARS = frozenset({str, int, float, bytes, bool, type(None)})


def _flat_exact(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """True if two tuples hold plain scalars of the same types, element by element: then they
    are exactly equal if and only if they are == (False: the general walk decides). The work
    is done in C."""
    types = tuple(map(type, a))
    return types == tuple(map(type, b)) and _SCALARS.issuperset(types)


def exact_index(objs: list[Any], obj: Any) -> int:
    """The index of the first element of ``objs`` that exactly matches ``obj``, or -1."""
    flat = obj.__class__ is tuple
    try:
        # Exact match implies ==, so C-speed list search finds every candidate.
        if obj not in objs:
            return -1
        index = objs.index(obj)
        while True:
            other = objs[index]
            if (flat and other.__class__ is tuple and _flat_exact(other, obj)) or exact_eq(
                other, obj
            ):
                return index
            index = objs.index(obj, index + 1)
    except ValueError:
        return -1
    except RecursionError:
        pass  # too deep for ==: walk them all
    for index, other in enumerate(objs):
        if exact_eq(other, obj):
            return index
    return -1
