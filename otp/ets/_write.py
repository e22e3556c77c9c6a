"""The ``ets`` writes: insert, insert_new, delete_object, take, update_counter and
update_element. Each is atomic: a list is validated whole before anything is written."""

from __future__ import annotations

import builtins
import math
from typing import Any

from .._process import CURRENT_PROCESS
from ._access import unique_only as _unique_only
from ._access import writer as _writer
from ._errors import EtsError, KeyNotFound, brief
from ._order import exact_eq
from ._table import Tab, describe
from ._types import (
    TableRef,
)


class _Default:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFAULT"


#: ``expire_after=DEFAULT`` means "the table's ``expire_after``".
DEFAULT: Any = _Default()
#: The current process, raising LookupError outside one (a bound method: the fastest way).
_current = CURRENT_PROCESS.get


def check_ttl(expire_after: Any, operation: str, table: Any) -> None:
    if expire_after is None:
        return
    if (
        not isinstance(expire_after, int | float)
        or isinstance(expire_after, bool)
        or not expire_after > 0
        or expire_after == math.inf
    ):
        raise EtsError(
            f"ets.{operation}({brief(table)}): expire_after must be a number of seconds > 0 or None"
            f" (got {brief(expire_after)})",
            table=table,
            operation=operation,
        )


def _deadline(tab: Tab, expire_after: Any, operation: str, table: Any) -> float | None:
    if expire_after is DEFAULT:
        expire_after = tab.default_ttl
    else:
        check_ttl(expire_after, operation, table)
    return tab.deadline_after(expire_after)


def _keys_of(tab: Tab, objects: Any, operation: str, table: Any) -> list[tuple[Any, Any]]:
    """Validate a list of objects before anything is written (so a list insert is atomic)."""
    if not isinstance(objects, list):
        raise EtsError(
            f"ets.{operation}({describe(table)}): takes an object (a tuple) or a list of objects"
            f" (got {brief(objects)})",
            table=table,
            operation=operation,
        )
    pairs = [(obj, tab.key_of(obj, operation)) for obj in objects]
    if tab.ordered:
        tab.check_new_keys([key for _, key in pairs], operation)
    return pairs


def insert(table: TableRef, objects: Any, *, expire_after: Any = DEFAULT) -> None:
    """Insert one object (a tuple) or a list of them, atomically (``ets:insert/2``).

    In a set or ordered_set an object replaces the one with the same key; in a bag an object
    equal to one already stored is stored once; a duplicate_bag stores every copy.

    Args:
        expire_after: seconds until these objects expire (``None``: never); by default the
            table's ``expire_after``. Expired objects are never returned and are swept by the
            table's actor.

    Raises:
        AccessDenied: the caller may not write to the table.
        EtsError: an object is not a tuple, has no element at the key position, or its key is
            unhashable (nothing is inserted).
    """
    # The fast path: one object into a plain set by an allowed writer (see Tab.refresh).
    try:
        tab: Tab = table._tab  # type: ignore[union-attr]
        data = tab.wfast
        if data is not None and objects.__class__ is tuple and expire_after is DEFAULT:
            writer = tab.writer
            if writer is None or writer is _current():
                data[objects[0]] = objects
                return
    except (AttributeError, LookupError, TypeError):
        pass  # the checked path below explains the problem
    _insert(table, objects, expire_after)


def _insert(table: Any, objects: Any, expire_after: Any) -> None:
    tab = _writer(table, "insert")
    if expire_after is DEFAULT and tab.default_ttl is None:
        deadline = None
    else:
        deadline = _deadline(tab, expire_after, "insert", table)
    if isinstance(objects, tuple):
        tab.put(objects, tab.key_of(objects, "insert"), deadline, "insert")
        return
    for obj, key in _keys_of(tab, objects, "insert", table):
        tab.put(obj, key, deadline, "insert")


def insert_new(table: TableRef, objects: Any, *, expire_after: Any = DEFAULT) -> bool:
    """Insert like :func:`insert`, but only if no key of ``objects`` is in the table yet;
    returns False (inserting nothing) otherwise."""
    tab = _writer(table, "insert_new")
    deadline = _deadline(tab, expire_after, "insert_new", table)
    pairs = _keys_of(tab, [objects] if isinstance(objects, tuple) else objects, "insert_new", table)
    data = tab.data
    for _, key in pairs:
        if key in data:
            return False
    for obj, key in pairs:
        tab.put(obj, key, deadline, "insert_new")
    return True


def delete_object(table: TableRef, obj: tuple[Any, ...]) -> None:
    """Delete exactly this object (every copy of it in a duplicate_bag), by exact match as
    OTP's ``=:=``: deleting ``(1.0, "x")`` leaves ``(1, "x")`` in place."""
    tab = _writer(table, "delete_object")
    key = tab.key_of(obj, "delete_object")
    tab.keep(key, lambda stored, _deadline: not exact_eq(stored, obj))


def take(table: TableRef, key: Any) -> list[tuple[Any, ...]]:
    """Delete the objects with ``key`` and return them."""
    tab = _writer(table, "take")
    try:
        return tab.remove_key(key)
    except TypeError:
        raise tab.bad_key(key, "take") from None


def _counter_ops(tab: Tab, incr: Any, table: Any) -> list[tuple[int, int, Any, Any]]:
    if incr.__class__ is int:
        return [(tab.kp + 1, incr, None, None)]
    ops = []
    for spec in incr if isinstance(incr, list) else [incr]:
        if (
            isinstance(spec, tuple)
            and len(spec) in (2, 4)
            and builtins.all(item.__class__ is int for item in spec)
        ):
            if len(spec) == 2:
                ops.append((spec[0], spec[1], None, None))
            else:
                ops.append((spec[0], spec[1], spec[2], spec[3]))
            continue
        raise EtsError(
            f"ets.update_counter({describe(table)}): an increment is an int, (pos, incr),"
            f" (pos, incr, threshold, set_value) or a list of those tuples (got {brief(spec)})",
            table=table,
            operation="update_counter",
        )
    return ops


def update_counter(
    table: TableRef,
    key: Any,
    incr: int | tuple[int, ...] | list[tuple[int, ...]],
    default: tuple[Any, ...] | None = None,
) -> int | list[int]:
    """Add to integer elements of the object with ``key``, atomically; returns the new value.

    ``incr`` is an int (added to the element right after the key), ``(pos, incr)``,
    ``(pos, incr, threshold, set_value)`` (if the result passes ``threshold`` — above it for
    an ``incr >= 0``, below it for a negative one — it becomes ``set_value``), or a list of
    those tuples (then a list of new values is returned, in order). Positions are 0-based.

    Args:
        default: the object to insert first if ``key`` is missing (its key element is
            replaced by ``key``), with the table's default time to live.

    Raises:
        KeyNotFound: ``key`` is missing and no ``default`` was given.
        EtsError: the table is a bag, a position is the key's or out of range, or an element
            to update is not an int (the object is left unchanged).
    """
    tab = _writer(table, "update_counter")
    _unique_only(tab, table, "update_counter")
    try:
        obj: Any = tab.data.get(key)
    except TypeError:
        raise tab.bad_key(key, "update_counter") from None
    if default is not None and (not isinstance(default, tuple) or len(default) <= tab.kp):
        # Checked whether or not the key exists, as OTP does.
        raise EtsError(
            f"ets.update_counter({describe(table)}, {brief(key)}): the default must be a tuple"
            f" with an element at keypos {tab.kp} (got {brief(default)})",
            table=table,
            operation="update_counter",
        )
    insert_default = obj is None
    if insert_default:
        if default is None:
            raise KeyNotFound(
                f"ets.update_counter({describe(table)}, {brief(key)}): no object has this key"
                " (pass default=... to insert one)",
                table=table,
                operation="update_counter",
            )
        obj = (*default[: tab.kp], key, *default[tab.kp + 1 :])
    elements = list(obj)
    results = []
    for pos, step, threshold, set_value in _counter_ops(tab, incr, table):
        _check_pos(tab, pos, obj, "update_counter", table)
        value = elements[pos]
        if value.__class__ is not int:
            raise EtsError(
                f"ets.update_counter({describe(table)}, {brief(key)}): element {pos} of"
                f" {brief(obj)} is not an int",
                table=table,
                operation="update_counter",
            )
        value += step
        if threshold is not None and (
            (step >= 0 and value > threshold) or (step < 0 and value < threshold)
        ):
            value = set_value
        elements[pos] = value
        results.append(value)
    updated = _rebuild(obj, elements)
    if insert_default:
        tab.put(updated, key, tab.deadline_after(tab.default_ttl), "update_counter")
    else:
        tab.data[key] = updated
    return results if isinstance(incr, list) else results[0]


def _rebuild(obj: tuple[Any, ...], elements: list[Any]) -> tuple[Any, ...]:
    """``elements`` as an object of the same class as ``obj`` (a namedtuple stays one)."""
    if obj.__class__ is tuple:
        return tuple(elements)
    make = getattr(obj, "_make", None)
    return make(elements) if make is not None else tuple(elements)


def _check_pos(tab: Tab, pos: Any, obj: tuple[Any, ...], operation: str, table: Any) -> None:
    if pos.__class__ is not int or not 0 <= pos < len(obj):
        raise EtsError(
            f"ets.{operation}({describe(table)}): position {brief(pos)} is out of range for"
            f" {brief(obj)} (0 to {len(obj) - 1})",
            table=table,
            operation=operation,
        )
    if pos == tab.kp:
        raise EtsError(
            f"ets.{operation}({describe(table)}): position {pos} is the key; a key cannot be"
            " updated in place",
            table=table,
            operation=operation,
        )


def update_element(table: TableRef, key: Any, element: Any) -> bool:
    """Replace elements of the object with ``key``: ``element`` is ``(pos, value)`` or a list
    of them. Returns False if no object has ``key``. Set and ordered_set tables only."""
    tab = _writer(table, "update_element")
    _unique_only(tab, table, "update_element")
    try:
        obj = tab.data.get(key)
    except TypeError:
        raise tab.bad_key(key, "update_element") from None
    if obj is None:
        return False  # OTP looks the key up before it looks at the update
    changes = element if isinstance(element, list) else [element]
    for change in changes:
        if not isinstance(change, tuple) or len(change) != 2:
            raise EtsError(
                f"ets.update_element({describe(table)}): an update is (pos, value) or a list of"
                f" them (got {brief(change)})",
                table=table,
                operation="update_element",
            )
    elements = list(obj)
    for pos, value in changes:
        _check_pos(tab, pos, obj, "update_element", table)
        elements[pos] = value
    tab.data[key] = _rebuild(obj, elements)
    return True
