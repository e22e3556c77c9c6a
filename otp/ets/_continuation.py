"""Traversals in chunks: ``select/3``, ``match/3``, ``match_object/3``, ``select_reverse/3`` and
the :class:`Continuation` that ``select/1`` (and ``match/1``...) resume from.

A continuation is a value, as in OTP: resuming it twice gives the same chunk, and it needs no
``safe_fixtable``. It holds its own place: in an ``ordered_set`` the last key it visited (the
next chunk starts after it in term order, whatever was inserted or deleted meanwhile, which is
OTP's own rule for ordered_set); in other tables the list of keys the traversal started with (a
snapshot of references, shared with ``next``'s, no objects copied), whose current objects each
chunk reads. So every object present for the whole traversal is returned exactly once, an
object deleted before its turn is not returned, and one inserted after the first chunk is
returned only in an ordered_set whose traversal has not yet passed its key.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ._errors import EtsError, brief
from ._match import NO_MATCH, Clause, key_hints, run_spec
from ._order import UnorderableKey, order_key
from ._table import Tab
from ._types import END_OF_TABLE, Table

#: Where an ordered_set walk starts: before the first key (after the last one in reverse).
_START: Any = object()


class Continuation:
    """Where a chunked traversal stopped (Erlang's opaque continuation); pass it to
    :func:`select` (or :func:`match`, :func:`match_object`, :func:`select_reverse`, which
    accept each other's) for the next chunk. There is no public constructor and it is never
    pickled; it names its table by handle, so a renamed table still continues."""

    __slots__ = ("_at", "_clauses", "_keys", "_last", "_limit", "_rest", "_reverse", "table")

    table: Table
    _clauses: list[Clause]
    _limit: int
    _reverse: bool
    _keys: list[Any] | None
    _at: int
    _last: Any
    _rest: tuple[Any, ...]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Continuation has no public constructor: it comes from ets.select/3")

    @classmethod
    def _make(
        cls,
        table: Table,
        clauses: list[Clause],
        limit: int,
        reverse: bool,
        keys: list[Any] | None,
        at: int,
        last: Any,
        rest: tuple[Any, ...],
    ) -> Continuation:
        cont = object.__new__(cls)
        cont.table = table
        cont._clauses = clauses
        cont._limit = limit
        cont._reverse = reverse
        cont._keys = keys
        cont._at = at
        cont._last = last
        cont._rest = rest
        return cont

    def __repr__(self) -> str:
        direction = "reverse" if self._reverse else "forward"
        return f"<Continuation of {self.table!r}, {direction}, chunks of {self._limit}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Continuation is never pickled: it is valid only on its table's node")


def hinted_keys(tab: Tab, heads: list[Any]) -> list[Any] | None:
    """The keys the heads pin down, without repeats and unhashable ones (no stored key equals
    those), in term order for an ordered_set; None if some head leaves the key open."""
    keys = key_hints(heads, tab.kp)
    if keys is None:
        return None
    unique: list[Any] = []
    for key in keys:
        try:
            hash(key)
            if key not in unique:
                unique.append(key)
        except TypeError:
            continue
    if tab.ordered and len(unique) > 1:
        return _in_order(unique)
    return unique


def _in_order(keys: list[Any]) -> list[Any]:
    """``keys`` in the ordered_set order, without those that have no place in it (a NaN
    equals nothing, so no stored key matches it)."""
    placed = []
    for key in keys:
        try:
            placed.append((order_key(key), key))
        except UnorderableKey:
            continue
    placed.sort(key=_first)
    return [key for _, key in placed]


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def check_limit(limit: Any, operation: str) -> None:
    if limit.__class__ is not int or limit < 1:
        raise EtsError(
            f"ets.{operation}: the limit is the number of results per chunk, an int >= 1"
            f" (got {brief(limit)})",
            operation=operation,
        )


def start(tab: Tab, clauses: list[Clause], limit: int, reverse: bool) -> Any:
    """The first chunk: ``(results, continuation)``, ``(results, END_OF_TABLE)`` when the
    table has nothing more, or ``END_OF_TABLE`` when nothing matched at all."""
    keys = hinted_keys(tab, [clause.head for clause in clauses])
    if keys is None and not tab.ordered:
        keys = list(tab.data)
    elif keys is not None and reverse and tab.ordered:
        keys = keys[::-1]
    return _run(tab, tab.handle, clauses, limit, reverse, keys, 0, _START, ())


def resume(tab: Tab, cont: Continuation) -> Any:
    """The chunk after ``cont``, in the same shapes as :func:`start`."""
    return _run(
        tab,
        cont.table,
        cont._clauses,
        cont._limit,
        cont._reverse,
        cont._keys,
        cont._at,
        cont._last,
        cont._rest,
    )


def _run(
    tab: Tab,
    table: Table,
    clauses: list[Clause],
    limit: int,
    reverse: bool,
    keys: list[Any] | None,
    at: int,
    last: Any,
    rest: tuple[Any, ...],
) -> Any:
    results = list(rest)
    if keys is not None:
        count = len(keys)
        while at < count and len(results) < limit:
            _collect(tab, clauses, keys[at], results)
            at += 1
        more = at < count
    else:
        more = True
        while more and len(results) < limit:
            batch = tab.keys_from(last, limit, reverse, start=last is _START)
            # A short batch ends the table; a chunk filled before a batch's end leaves keys.
            more = len(batch) == limit
            for index, key in enumerate(batch, 1):
                _collect(tab, clauses, key, results)
                last = key
                if len(results) >= limit:
                    more = more or index < len(batch)
                    break
        if more:
            more = bool(tab.keys_from(last, 1, reverse, start=last is _START))
    if not results:
        return END_OF_TABLE
    chunk, left = results[:limit], tuple(results[limit:])
    if not more and not left:
        return (chunk, END_OF_TABLE)
    return (chunk, Continuation._make(table, clauses, limit, reverse, keys, at, last, left))


def _collect(tab: Tab, clauses: list[Clause], key: Any, results: list[Any]) -> None:
    for obj in tab.get(key):
        result = run_spec(clauses, obj)
        if result is not NO_MATCH:
            results.append(result)
