"""How an ``ets`` function reaches its table: by handle or name, with the access check the
operation needs (read, write or owner-only), and expired objects dropped first."""

from __future__ import annotations

from typing import Any

from .._process import CURRENT_PROCESS
from ._errors import EtsError, NoSuchTable, brief
from ._registry import registry
from ._table import Tab, describe


def resolve(table: Any, operation: str) -> Tab:
    """The slow way to a table: by name, or an explanation of why ``table`` names none."""
    if isinstance(table, str):
        tab = registry().names.get(table)
        if tab is None:
            raise NoSuchTable(
                f"ets.{operation}({brief(table)}): no table is named {brief(table)} on this node",
                table=table,
                operation=operation,
            )
        return tab
    raise EtsError(
        f"ets.{operation}: a table is a Table (from ets.new) or the name of a named table"
        f" (got {brief(table)})",
        table=table,
        operation=operation,
    )


def reader(table: Any, operation: str) -> Tab:
    try:
        tab: Tab = table._tab
    except AttributeError:
        tab = resolve(table, operation)
    if tab.rguard and CURRENT_PROCESS.get(None) is not tab.owner_proc:
        tab.check_read(operation, table)
    if tab.heap:
        tab.expire_due()
    return tab


def writer(table: Any, operation: str) -> Tab:
    try:
        tab: Tab = table._tab
    except AttributeError:
        tab = resolve(table, operation)
    if tab.wguard and CURRENT_PROCESS.get(None) is not tab.owner_proc:
        tab.check_write(operation, table)
    if tab.heap:
        tab.expire_due()
    return tab


def owned(table: Any, operation: str) -> Tab:
    try:
        tab: Tab = table._tab
    except AttributeError:
        tab = resolve(table, operation)
    tab.check_owner(operation, table)
    return tab


def unique_only(tab: Tab, table: Any, operation: str) -> None:
    if not tab.unique:
        raise EtsError(
            f"ets.{operation}({describe(table)}): only for set and ordered_set tables"
            f" (this one is a {tab.kind})",
            table=table,
            operation=operation,
        )
