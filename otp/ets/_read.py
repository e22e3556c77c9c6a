"""The ``ets`` reads: lookup, member, lookup_element, tab2list, first/next/prev/last, info,
whereis and all (Erlang's read BIFs; plain calls, no await)."""

from __future__ import annotations

from typing import Any

from ._access import reader as _reader
from ._access import resolve as _resolve
from ._errors import EtsError, KeyNotFound, NoSuchTable, brief
from ._fixtable import fixed_next
from ._info import check_item
from ._registry import registry
from ._table import Tab, describe
from ._types import (
    Table,
    TableInfo,
    TableRef,
)

_NO_DEFAULT: Any = object()


def lookup(table: TableRef, key: Any) -> list[tuple[Any, ...]]:
    """The objects with ``key``: ``[]`` or ``[obj]`` for sets, any number for bags.

    Raises:
        AccessDenied: the table is private and the caller is not its owner.
        NoSuchTable: the table does not exist.
    """
    try:
        found = table._reads.get(key)  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        return _lookup(table, key)  # private, expiring, a bag, a name, or a bad key
    if found is not None:
        return [found]
    return []


def _lookup(table: Any, key: Any) -> list[tuple[Any, ...]]:
    tab = _reader(table, "lookup")
    try:
        found = tab.data.get(key)
    except TypeError:
        raise tab.bad_key(key, "lookup") from None
    if found is None:
        return []
    if tab.unique:
        return [found]
    return list(found)


def member(table: TableRef, key: Any) -> bool:
    """True if an object with ``key`` is in the table."""
    try:
        data: Any = table._reads  # type: ignore[union-attr]
        return data.__contains__(key)
    except (AttributeError, TypeError):
        pass
    tab = _reader(table, "member")
    try:
        return key in tab.data
    except TypeError:
        raise tab.bad_key(key, "member") from None


def lookup_element(table: TableRef, key: Any, pos: int, default: Any = _NO_DEFAULT) -> Any:
    """Element ``pos`` (0-based) of the object with ``key``; for a bag, a list with that
    element of each object.

    Raises:
        KeyNotFound: no object has ``key`` and no ``default`` was given.
        EtsError: an object has no element ``pos``.
    """
    tab = _reader(table, "lookup_element")
    try:
        objs = tab.get(key)
    except TypeError:
        raise tab.bad_key(key, "lookup_element") from None
    if not objs:
        if default is not _NO_DEFAULT:
            return default
        raise KeyNotFound(
            f"ets.lookup_element({describe(table)}, {brief(key)}, {brief(pos)}): no object has"
            " this key",
            table=table,
            operation="lookup_element",
        )
    for obj in objs:
        if pos.__class__ is not int or not 0 <= pos < len(obj):
            raise EtsError(
                f"ets.lookup_element({describe(table)}, {brief(key)}, {brief(pos)}):"
                f" {brief(obj)} has no element {brief(pos)}",
                table=table,
                operation="lookup_element",
            )
    if tab.unique:
        return objs[0][pos]
    return [obj[pos] for obj in objs]


def tab2list(table: TableRef) -> list[tuple[Any, ...]]:
    """Every object; in key order for an ordered_set."""
    return list(_reader(table, "tab2list").objects())


def first(table: TableRef) -> Any:
    """The first key (the smallest of an ordered_set), or ``END_OF_TABLE`` if empty."""
    return _reader(table, "first").first()


def last(table: TableRef) -> Any:
    """The last key of an ordered_set (for other types, as :func:`first`), or ``END_OF_TABLE``."""
    return _reader(table, "last").last()


def next(table: TableRef, key: Any) -> Any:
    """The key after ``key``, or ``END_OF_TABLE``.

    For an ordered_set, the next key in the order, whether ``key`` is in the table or not.
    For the other types the order is unspecified but visits each key once if the table is
    not changed meanwhile; keys added during the traversal may be missed, and ``key`` must be
    in the table (else :class:`KeyNotFound`), so traverse with keys ``first``/``next`` gave,
    or fix the table first (:func:`safe_fixtable`): then a key deleted since is accepted.
    """
    tab = _reader(table, "next")
    if tab.fix is not None and not tab.ordered:
        return fixed_next(tab, key, "next")
    return tab.next(key, "next")


def prev(table: TableRef, key: Any) -> Any:
    """The key before ``key`` in an ordered_set (for other types, as :func:`next`)."""
    tab = _reader(table, "prev")
    if tab.fix is not None and not tab.ordered:
        return fixed_next(tab, key, "prev")
    return tab.prev(key, "prev")


def info(table: TableRef, item: str | None = None) -> Any:
    """A :class:`TableInfo` snapshot, or None if the table does not exist (Erlang's
    ``undefined``). Any process may ask, whatever the access mode.

    ``info(table, item)`` (``ets:info/2``) is one item, by OTP's name (``"protection"``,
    ``"named_table"``, ...) or the field's, plus ``"fixed"`` (is the table fixed?) and
    ``"safe_fixed"`` / ``"safe_fixed_monotonic_time"``: ``(since, [(pid, count), ...])``
    (``time.time()`` or trio's clock when it was fixed) or False.

    Raises:
        EtsError: ``item`` is not an info item.
    """
    compute = None if item is None else check_item(item)
    try:
        tab: Tab = table._tab  # type: ignore[union-attr]
    except AttributeError:
        try:
            tab = _resolve(table, "info")
        except NoSuchTable:
            return None
    if not tab.alive:
        return None
    tab.expire_due()
    if compute is not None:
        return compute(tab)
    hints = tab.hints
    return TableInfo(
        id=tab.handle,
        name=tab.name,
        named=tab.named,
        type=tab.kind,
        access=tab.access,
        owner=tab.owner,
        heir=tab.heir,
        keypos=tab.kp,
        size=tab.size(),
        memory=tab.memory(),
        node=tab.node.name,
        expire_after=tab.default_ttl,
        read_concurrency=hints.read_concurrency,
        write_concurrency=hints.write_concurrency,
        compressed=hints.compressed,
        decentralized_counters=hints.decentralized(tab.ordered),
    )


def whereis(name: str) -> Table | None:
    """The handle of the table named ``name``, or None (Erlang's ``ets:whereis/1``)."""
    tab = registry().names.get(name)
    return tab.handle if tab is not None else None


def all() -> list[Table | str]:
    """Every table on this node: names for named tables, handles for the others."""
    return [tab.ref for tab in registry().by_id.values() if tab.alive]
