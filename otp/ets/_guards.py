"""The guard functions of match specs, with Erlang's semantics (OTP's "Match Specifications in
Erlang", the functions allowed in ``MatchConditions``).

Each function takes evaluated arguments and returns a value or raises :class:`GuardFailure`
(Erlang's ``badarg``/``badarith`` inside a guard: the guard fails, the object is not
selected). Comparisons follow the term order of ``_order``; arithmetic takes numbers only;
boolean operators take ``True``/``False`` only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from wire import Atom

from .._ids import Pid, Ref
from .._node import current_node
from ._order import compare, exact_eq, is_number
from ._registry import caller_pid

#: The largest integer (in bits) a guard computes: past it the guard fails, as Erlang's
#: ``system_limit`` does, so a hostile spec cannot make one object cost unbounded memory.
MAX_INT_BITS = 1 << 20


class GuardFailure(Exception):
    """A guard function got arguments it does not take: the guard fails."""


def _fail(what: str) -> GuardFailure:
    return GuardFailure(what)


def _num(value: Any) -> Any:
    if not is_number(value):
        raise _fail("badarith: not a number")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or value.__class__ is bool:
        raise _fail("badarith: not an integer")
    return value


def _bool(value: Any) -> bool:
    if value is not True and value is not False:
        raise _fail("badarg: not a boolean")
    return value


def _checked(value: Any) -> Any:
    cls = value.__class__
    if cls is float:
        if not math.isfinite(value):
            raise _fail("badarith: float overflow")
    elif cls is int and value.bit_length() > MAX_INT_BITS:
        raise _fail("system_limit: integer too large")
    return value


# -- comparisons (term order) -----------------------------------------------------------------


def _eq(a: Any, b: Any) -> bool:
    if a.__class__ is int and b.__class__ is int:
        return a == b
    return compare(a, b) == 0


def _ne(a: Any, b: Any) -> bool:
    if a.__class__ is int and b.__class__ is int:
        return a != b
    return compare(a, b) != 0


def _lt(a: Any, b: Any) -> bool:
    if a.__class__ is int and b.__class__ is int:
        return a < b
    return compare(a, b) < 0


def _le(a: Any, b: Any) -> bool:
    if a.__class__ is int and b.__class__ is int:
        return a <= b
    return compare(a, b) <= 0


def _gt(a: Any, b: Any) -> bool:
    if a.__class__ is int and b.__class__ is int:
        return a > b
    return compare(a, b) > 0


def _ge(a: Any, b: Any) -> bool:
    if a.__class__ is int and b.__class__ is int:
        return a >= b
    return compare(a, b) >= 0


def _exact(a: Any, b: Any) -> bool:
    return exact_eq(a, b)


def _not_exact(a: Any, b: Any) -> bool:
    return not exact_eq(a, b)


def _min(a: Any, b: Any) -> Any:
    return b if compare(b, a) < 0 else a


def _max(a: Any, b: Any) -> Any:
    return b if compare(b, a) > 0 else a


# -- arithmetic (numbers only) ----------------------------------------------------------------


def _add(a: Any, b: Any) -> Any:
    return _checked(_num(a) + _num(b))


def _sub(a: Any, b: Any) -> Any:
    return _checked(_num(a) - _num(b))


def _mul(a: Any, b: Any) -> Any:
    _num(a)
    _num(b)
    if a.__class__ is int and b.__class__ is int and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise _fail("system_limit: integer too large")
    return _checked(a * b)


def _truediv(a: Any, b: Any) -> Any:
    return _checked(_num(a) / _num(b))


def _floordiv(a: Any, b: Any) -> Any:
    return _checked(_num(a) // _num(b))


def _mod(a: Any, b: Any) -> Any:
    return _checked(_num(a) % _num(b))


def _neg(a: Any) -> Any:
    return -_num(a)


def _pos(a: Any) -> Any:
    return _num(a)


def _div(a: Any, b: Any) -> int:
    # Erlang's div truncates toward zero; Python's // floors.
    quotient = abs(_int(a)) // abs(_int(b))
    return -quotient if (a < 0) != (b < 0) else quotient


def _rem(a: Any, b: Any) -> int:
    # The remainder of the truncating division: it has the dividend's sign.
    remainder = abs(_int(a)) % abs(_int(b))
    return -remainder if a < 0 else remainder


def _band(a: Any, b: Any) -> int:
    return _int(a) & _int(b)


def _bor(a: Any, b: Any) -> int:
    return _int(a) | _int(b)


def _bxor(a: Any, b: Any) -> int:
    return _int(a) ^ _int(b)


def _bnot(a: Any) -> int:
    return ~_int(a)


def _bsl(a: Any, n: Any) -> int:
    _int(a)
    _int(n)
    if n < 0:
        return a >> -n if -n <= a.bit_length() else (-1 if a < 0 else 0)
    if a and a.bit_length() + n > MAX_INT_BITS:
        raise _fail("system_limit: integer too large")
    return a << n if a else 0


def _bsr(a: Any, n: Any) -> int:
    return _bsl(a, -_int(n))


def _abs(a: Any) -> Any:
    return abs(_num(a))


def _round(a: Any) -> int:
    # Erlang rounds half away from zero (Python's round() goes to even). x - floor(x) is
    # exact, so no float error creeps in.
    _num(a)
    if isinstance(a, int):
        return a
    if a < 0:
        return -_round(-a)
    down = math.floor(a)
    return down + 1 if a - down >= 0.5 else down


def _trunc(a: Any) -> int:
    return math.trunc(_num(a))


def _floor(a: Any) -> int:
    return math.floor(_num(a))


def _ceil(a: Any) -> int:
    return math.ceil(_num(a))


def _float(a: Any) -> float:
    return _checked(float(_num(a)))


# -- booleans ---------------------------------------------------------------------------------


def _not(a: Any) -> bool:
    return not _bool(a)


def _xor(a: Any, b: Any) -> bool:
    return _bool(a) is not _bool(b)


# -- terms ------------------------------------------------------------------------------------


def _element(pos: Any, tup: Any) -> Any:
    # Python indexing would take -1 as the last element and index lists and strs; Erlang's
    # element/2 fails the guard for anything but a position inside a tuple (0-based here).
    if not isinstance(tup, tuple) or pos.__class__ is not int or not 0 <= pos < len(tup):
        raise _fail("badarg: no such element of a tuple")
    return tup[pos]


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _fail("badarg: not a list")
    return value


def _hd(value: Any) -> Any:
    if not _list(value):
        raise _fail("badarg: hd of []")
    return value[0]


def _tl(value: Any) -> list[Any]:
    if not _list(value):
        raise _fail("badarg: tl of []")
    return value[1:]


def _length(value: Any) -> int:
    return len(_list(value))


def _tuple_size(value: Any) -> int:
    if not isinstance(value, tuple):
        raise _fail("badarg: not a tuple")
    return len(value)


def _byte_size(value: Any) -> int:
    if not isinstance(value, bytes | bytearray):
        raise _fail("badarg: not a binary")
    return len(value)


def _size(value: Any) -> int:
    if isinstance(value, tuple):
        return len(value)
    return _byte_size(value)


def _map(value: Any) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _fail("badmap: not a dict")
    return value


def _map_get(key: Any, mapping: Any) -> Any:
    try:
        return _map(mapping)[key]
    except (KeyError, TypeError):
        raise _fail("badkey") from None


def _map_size(mapping: Any) -> int:
    return len(_map(mapping))


def _is_map_key(key: Any, mapping: Any) -> bool:
    try:
        return key in _map(mapping)
    except TypeError:
        raise _fail("badarg: unhashable key") from None


def _node_of(value: Any) -> str:
    if value.__class__ is not Pid and value.__class__ is not Ref:
        raise _fail("badarg: node/1 takes a pid or a reference")
    return str(value.node)


def _self() -> Any:
    pid = caller_pid()
    if pid is None:
        raise _fail("badarg: self() outside a process")
    return pid


def _node() -> str:
    return current_node().name


def _in(item: Any, container: Any) -> bool:
    return item in container


# -- type tests -------------------------------------------------------------------------------


def is_int(value: Any) -> bool:
    return isinstance(value, int) and value.__class__ is not bool


def is_float(value: Any) -> bool:
    return isinstance(value, float)


def is_bool(value: Any) -> bool:
    return value is True or value is False


def is_atom(value: Any) -> bool:
    return isinstance(value, str | Atom)


def is_bytes(value: Any) -> bool:
    return isinstance(value, bytes | bytearray)


def is_function(value: Any) -> bool:
    return callable(value)


#: name -> (fewest arguments, most arguments, function). ``and``/``or``/``andalso``/``orelse``
#: and ``const`` are special forms, compiled by ``_match``.
FUNCTIONS: dict[str, tuple[int, int, Callable[..., Any]]] = {
    "==": (2, 2, _eq),
    "!=": (2, 2, _ne),
    "/=": (2, 2, _ne),
    "=:=": (2, 2, _exact),
    "=/=": (2, 2, _not_exact),
    "<": (2, 2, _lt),
    "<=": (2, 2, _le),
    "=<": (2, 2, _le),
    ">": (2, 2, _gt),
    ">=": (2, 2, _ge),
    "min": (2, 2, _min),
    "max": (2, 2, _max),
    "+": (1, 2, _add),
    "-": (1, 2, _sub),
    "*": (2, 2, _mul),
    "/": (2, 2, _truediv),
    "//": (2, 2, _floordiv),
    "%": (2, 2, _mod),
    "div": (2, 2, _div),
    "rem": (2, 2, _rem),
    "band": (2, 2, _band),
    "bor": (2, 2, _bor),
    "bxor": (2, 2, _bxor),
    "bnot": (1, 1, _bnot),
    "bsl": (2, 2, _bsl),
    "bsr": (2, 2, _bsr),
    "abs": (1, 1, _abs),
    "round": (1, 1, _round),
    "trunc": (1, 1, _trunc),
    "floor": (1, 1, _floor),
    "ceil": (1, 1, _ceil),
    "float": (1, 1, _float),
    "not": (1, 1, _not),
    "xor": (2, 2, _xor),
    "element": (2, 2, _element),
    "in": (2, 2, _in),
    "len": (1, 1, len),
    "hd": (1, 1, _hd),
    "tl": (1, 1, _tl),
    "length": (1, 1, _length),
    "size": (1, 1, _size),
    "tuple_size": (1, 1, _tuple_size),
    "byte_size": (1, 1, _byte_size),
    "map_get": (2, 2, _map_get),
    "map_size": (1, 1, _map_size),
    "is_map_key": (2, 2, _is_map_key),
    "self": (0, 0, _self),
    "node": (0, 1, _node),
    "is_int": (1, 1, is_int),
    "is_integer": (1, 1, is_int),
    "is_float": (1, 1, is_float),
    "is_number": (1, 1, is_number),
    "is_bool": (1, 1, is_bool),
    "is_boolean": (1, 1, is_bool),
    "is_str": (1, 1, lambda value: isinstance(value, str)),
    "is_atom": (1, 1, is_atom),
    "is_bytes": (1, 1, is_bytes),
    "is_binary": (1, 1, is_bytes),
    "is_tuple": (1, 1, lambda value: isinstance(value, tuple)),
    "is_list": (1, 1, lambda value: isinstance(value, list)),
    "is_map": (1, 1, lambda value: isinstance(value, dict)),
    "is_none": (1, 1, lambda value: value is None),
    "is_pid": (1, 1, lambda value: value.__class__ is Pid),
    "is_reference": (1, 1, lambda value: value.__class__ is Ref),
    "is_function": (1, 1, is_function),
}

#: Unary forms of the operators that have both (``("-", x)`` negates).
UNARY: dict[str, Callable[[Any], Any]] = {"+": _pos, "-": _neg, "node": _node_of}
