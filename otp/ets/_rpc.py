"""``ets.rpc``: run an ``ets`` function on a table through its actor, which is how another
node (or a caller that wants a round trip) reaches a table."""

from __future__ import annotations

from typing import Any

from .._errors import CallError
from .._gen_server import call as _gen_call
from .._ids import Pid
from ._access import resolve as _resolve
from ._actor import request
from ._errors import AccessDenied, EtsError, KeyNotFound, NameTaken, NoSuchTable, brief
from ._lifecycle import delete, delete_all_objects, give_away, rename, setopts
from ._read import first, info, last, lookup, lookup_element, member, next, prev, tab2list
from ._select import (
    match,
    match_delete,
    match_object,
    select,
    select_count,
    select_delete,
    select_reverse,
)
from ._table import describe
from ._traversal import select_replace, slot
from ._types import (
    Table,
    TableRef,
)
from ._write import delete_object, insert, insert_new, take, update_counter, update_element


async def rpc(
    table: TableRef | Pid,
    operation: str,
    *args: Any,
    timeout: float | None = 5.0,
    **kwargs: Any,
) -> Any:
    """Run the ``ets`` function named ``operation`` on ``table`` through the table's actor.

    This is how a process on another node reaches a table (the functions above work on local
    tables only); locally it works too, at the cost of a round trip. Access is checked
    against the calling process, exactly as for a direct call. ``rpc(t, "lookup", key)``
    returns what ``lookup(t, key)`` would.

    ``table`` is a :class:`Table`, a local table's name, or the pid of a table's actor
    (``table.actor``): a pid is what crosses nodes, so that is how another node names a
    table. Requests and replies are plain tuples; arguments and results must be values that
    can cross nodes (match specs with ``Var``/``ANY`` and ``END_OF_TABLE`` cannot yet).

    Raises:
        The error the operation raised (an ``EtsError`` subclass); :class:`NoSuchTable` if the
        table's actor is gone; ``otp.CallTimeout`` after ``timeout`` seconds.
    """
    if operation not in OPERATIONS:
        raise EtsError(
            f"ets.rpc: {brief(operation)} is not an ets operation (one of"
            f" {', '.join(sorted(OPERATIONS))})",
            table=table,
            operation="rpc",
        )
    if isinstance(table, str):
        tab = _resolve(table, operation)
        if not tab.alive:
            raise tab.gone(operation, table)
        actor = tab.handle.actor
    elif table.__class__ is Table:
        actor = table.actor
    elif table.__class__ is Pid:
        actor = table
    else:
        _resolve(table, operation)
        raise AssertionError("unreachable")
    try:
        reply = await _gen_call(actor, request(operation, args, kwargs), timeout)
    except CallError as exc:
        if exc.reason == "timeout":
            raise
        raise NoSuchTable(
            f"ets.{operation}({describe(table)}): the table's actor is gone ({brief(exc.reason)}):"
            " the table was deleted",
            table=table,
            operation=operation,
        ) from exc
    if reply[0] == "error":
        raise _ERRORS.get(reply[1], EtsError)(reply[2], table=table, operation=operation)
    return reply[1]


_ERRORS: dict[str, type[EtsError]] = {
    cls.__name__: cls for cls in (EtsError, NoSuchTable, AccessDenied, NameTaken, KeyNotFound)
}

#: What the table actor may run for a requester: every function on an existing table.
OPERATIONS: dict[str, Any] = {
    fn.__name__: fn
    for fn in (
        delete,
        delete_all_objects,
        delete_object,
        first,
        give_away,
        info,
        insert,
        insert_new,
        last,
        lookup,
        lookup_element,
        match,
        match_delete,
        match_object,
        member,
        next,
        prev,
        rename,
        select,
        select_count,
        select_delete,
        select_replace,
        select_reverse,
        setopts,
        slot,
        tab2list,
        take,
        update_counter,
        update_element,
    )
}
