"""Delete, empty, hand over, rename and set options of a table: what changes a table as a
whole (Erlang's ``ets:delete/1``, ``give_away/3``, ``setopts/2``, ``rename/2``, ...)."""

from __future__ import annotations

from typing import Any

from .._ids import Pid
from .._node import Node
from ._access import owned as _owned
from ._access import writer as _writer
from ._errors import EtsError, NameTaken, brief
from ._table import Tab, describe
from ._types import (
    Access,
    EtsTransfer,
    TableRef,
)

_WHOLE_TABLE: Any = object()
_NO_DEFAULT: Any = object()


def remote_pid(pid: Pid, node: Node) -> bool:
    # A pid of an earlier incarnation of this node (another creation) is remote too, as in OTP.
    return pid.node != node.name or pid.creation != node.creation


def set_heir(tab: Tab, heir: Pid | None, heir_data: Any) -> None:
    if heir is not None and tab.node.resolve(heir) is None:
        heir = None  # as OTP: an heir that is not alive is no heir
    tab.heir = heir
    tab.heir_data = heir_data if heir is not None else None


def delete(table: TableRef, key: Any = _WHOLE_TABLE) -> None:
    """``delete(table)`` deletes the table; ``delete(table, key)`` deletes the objects with
    ``key`` (Erlang's ``ets:delete/1,2``). Both need write access.

    Deleting the table frees its name at once and stops its actor.
    """
    if key is _WHOLE_TABLE:
        _writer(table, "delete").destroy()
        return
    tab = _writer(table, "delete")
    try:
        tab.remove_key(key)
    except TypeError:
        raise tab.bad_key(key, "delete") from None


def delete_all_objects(table: TableRef) -> None:
    """Remove every object (the table itself stays)."""
    _writer(table, "delete_all_objects").clear()


def give_away(table: TableRef, pid: Pid, gift_data: Any) -> None:
    """Make ``pid`` the owner; it receives ``EtsTransfer(table, old_owner, gift_data)``.

    Raises:
        AccessDenied: the caller is not the owner.
        EtsError: ``pid`` is not a live local process, or it is the owner already.
    """
    tab = _owned(table, "give_away")
    target = tab.node.resolve(pid) if pid.__class__ is Pid else None
    if target is None:
        raise EtsError(
            f"ets.give_away({describe(table)}, {brief(pid)}): the new owner must be a live local"
            " process",
            table=table,
            operation="give_away",
        )
    if target is tab.owner_proc:
        raise EtsError(
            f"ets.give_away({describe(table)}, {brief(pid)}): the process already owns the table",
            table=table,
            operation="give_away",
        )
    old = tab.owner
    tab.set_owner(target)
    target.deliver(_transfer(tab, old, gift_data))


def _transfer(tab: Tab, old: Pid, data: Any) -> EtsTransfer:
    return EtsTransfer(tab.ref, old, data)


def setopts(
    table: TableRef, *, heir: Any = _NO_DEFAULT, heir_data: Any = None, access: Any = None
) -> None:
    """Set the table's heir (``heir=None`` clears it) and/or its access mode; only the owner
    may (``ets:setopts/2``, whose options are OTP 25's: ``heir`` and ``protection``). Options
    left out are unchanged; all are checked before any is set.

    Raises:
        AccessDenied: the caller is not the owner.
        EtsError: ``heir`` is not a pid of this node, ``access`` not an access mode, or
            ``heir_data`` is given without ``heir``.
    """
    tab = _owned(table, "setopts")
    if heir is _NO_DEFAULT and heir_data is not None:
        raise EtsError(
            f"ets.setopts({describe(table)}): heir_data goes with heir=pid (got no heir)",
            table=table,
            operation="setopts",
        )
    if heir is not _NO_DEFAULT and heir is not None and heir.__class__ is not Pid:
        raise EtsError(
            f"ets.setopts({describe(table)}): heir must be a Pid or None (got {brief(heir)})",
            table=table,
            operation="setopts",
        )
    if heir.__class__ is Pid and remote_pid(heir, tab.node):
        raise EtsError(
            f"ets.setopts({describe(table)}): the heir must be a process of this node"
            f" ({tab.node.name}): a table never leaves its node (got {brief(heir)})",
            table=table,
            operation="setopts",
        )
    mode = None
    if access is not None:
        try:
            mode = Access(access)
        except ValueError:
            raise EtsError(
                f"ets.setopts({describe(table)}): access must be one of"
                f" {', '.join(member.value for member in Access)} (got {brief(access)})",
                table=table,
                operation="setopts",
            ) from None
    if heir is not _NO_DEFAULT:
        set_heir(tab, heir, heir_data)
    if mode is not None:
        tab.set_access(mode)


def rename(table: TableRef, name: str) -> str:
    """Rename a table (needs write access); a named table is then reached by the new name only.

    Raises:
        NameTaken: another named table has ``name``.
    """
    tab = _writer(table, "rename")
    if not isinstance(name, str) or not name:
        raise EtsError(
            f"ets.rename({describe(table)}): the name must be a non-empty str (got {brief(name)})",
            table=table,
            operation="rename",
        )
    if tab.named:
        names = tab.registry.names
        holder = names.get(name)
        if holder is not None and holder is not tab:
            raise NameTaken(
                f"ets.rename({describe(table)}, {brief(name)}): a table named {brief(name)}"
                " already exists",
                table=table,
                operation="rename",
            )
        del names[tab.name]
        names[name] = tab
    tab.name = name
    return name
