"""The total order of ``ordered_set`` keys: Erlang's term order, mapped onto Python values.

``order_key(key)`` turns any key into a tuple that compares the way the table sorts, so keys of
different types never raise mid-traversal. Two keys with equal order keys are the same key.
"""

from __future__ import annotations

from decimal import Decimal
from numbers import Real
from typing import Any

from .._ids import Pid, Ref

# Ranks, in the order of Erlang's ``number < atom < reference < pid < tuple < list < binary``,
# with None first and everything else last.
_NONE = 0
_NUMBER = 1
_STR = 2
_REF = 3
_PID = 4
_TUPLE = 5
_LIST = 6
_BYTES = 7
_OTHER = 8


class UnorderableKey(ValueError):
    """A key that has no place in the order (a NaN)."""


def order_key(key: Any) -> tuple[Any, ...]:
    """The sort key of ``key`` in the ``ordered_set`` order.

    The order: ``None`` < numbers (``bool``, ``int``, ``float``, ``Fraction``, ``Decimal``, by
    value, so ``1``, ``1.0`` and ``True`` are one key) < ``str`` < :class:`~otp.Ref` <
    :class:`~otp.Pid` < ``tuple`` (shorter first, then element by element) < ``list`` (element
    by element) < ``bytes``/``bytearray`` < any other type (by qualified type name, then
    ``repr``).

    Raises:
        UnorderableKey: the key is or contains a NaN, which equals nothing, itself included.
    """
    cls = key.__class__
    if cls is int or cls is str:
        return (_NUMBER if cls is int else _STR, key)
    if cls is float or cls is bool or isinstance(key, Real) or cls is Decimal:
        if key != key:
            raise UnorderableKey("NaN is not a valid ordered_set key: it equals nothing")
        return (_NUMBER, key)
    if key is None:
        return (_NONE,)
    if cls is tuple:
        return (_TUPLE, len(key), tuple([order_key(item) for item in key]))
    if cls is Ref or cls is Pid:
        return (_REF if cls is Ref else _PID, key.node, key.creation, key.id)
    if isinstance(key, str):
        return (_STR, str(key))
    if isinstance(key, list):
        return (_LIST, tuple([order_key(item) for item in key]))
    if isinstance(key, bytes | bytearray):
        return (_BYTES, bytes(key))
    if isinstance(key, tuple):
        return (_TUPLE, len(key), tuple([order_key(item) for item in key]))
    return (_OTHER, f"{cls.__module__}.{cls.__qualname__}", repr(key))
