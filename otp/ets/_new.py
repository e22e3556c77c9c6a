"""``ets.new``: create a table, its owner hook and the actor that serves other nodes
(Erlang's ``ets:new/2``)."""

from __future__ import annotations

import builtins
from typing import Any, Literal, overload

from .._ids import Pid
from .._process import current_process
from ._actor import spawn_actor
from ._errors import EtsError, NameTaken, brief
from ._hints import make_hints
from ._lifecycle import remote_pid, set_heir
from ._registry import registry
from ._rpc import OPERATIONS
from ._table import Tab
from ._types import (
    PROTECTED,
    SET,
    Access,
    Table,
    TableType,
)
from ._write import check_ttl


def _option(kind: type[Any], value: Any, field: str, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise EtsError(
            f"ets.new({brief(name)}): {field} must be one of {choices} (got {brief(value)})",
            operation="new",
        ) from None


@overload
def new(
    name: str,
    *,
    type: TableType | str = ...,
    access: Access | str = ...,
    named: Literal[False] = ...,
    heir: Pid | None = ...,
    heir_data: Any = ...,
    keypos: int = ...,
    expire_after: float | None = ...,
    read_concurrency: bool = ...,
    write_concurrency: bool | Literal["auto"] = ...,
    compressed: bool = ...,
    decentralized_counters: bool | None = ...,
) -> Table: ...


@overload
def new(
    name: str,
    *,
    type: TableType | str = ...,
    access: Access | str = ...,
    named: Literal[True],
    heir: Pid | None = ...,
    heir_data: Any = ...,
    keypos: int = ...,
    expire_after: float | None = ...,
    read_concurrency: bool = ...,
    write_concurrency: bool | Literal["auto"] = ...,
    compressed: bool = ...,
    decentralized_counters: bool | None = ...,
) -> str: ...


def new(
    name: str,
    *,
    type: TableType | str = SET,
    access: Access | str = PROTECTED,
    named: bool = False,
    heir: Pid | None = None,
    heir_data: Any = None,
    keypos: int = 0,
    expire_after: float | None = None,
    read_concurrency: bool = False,
    write_concurrency: bool | Literal["auto"] = False,
    compressed: bool = False,
    decentralized_counters: bool | None = None,
) -> Table | str:
    """Create a table owned by the calling process (Erlang's ``ets:new/2``).

    Args:
        name: the table's name; with ``named=True`` it is how the table is reached.
        type: ``SET`` (default), ``ORDERED_SET``, ``BAG`` or ``DUPLICATE_BAG`` (or their
            string values).
        access: ``PROTECTED`` (default: the owner writes, every process reads), ``PUBLIC``
            or ``PRIVATE`` (the owner only).
        named: make the table reachable by ``name``; then ``new`` returns the name.
        heir: a process of this node that inherits the table when the owner dies (it
            receives ``EtsTransfer(table, old_owner, heir_data)``). A pid that is not alive
            now is ignored, as in OTP.
        heir_data: sent to the heir with the table.
        keypos: the index of the key in each object (0-based; Erlang's is 1-based).
        expire_after: the default time to live of objects, in seconds of trio's clock
            (``None``: objects never expire). An extension: OTP has no TTL.
        read_concurrency, write_concurrency, compressed, decentralized_counters: OTP's
            performance options, accepted as hints (``write_concurrency`` may be ``"auto"``):
            ``info`` reports them, they change nothing here (one thread, objects shared by
            reference: no locks to split, nothing to compress).

    Returns:
        The table's :class:`Table` handle, or its name if ``named``.

    Raises:
        NameTaken: ``named`` and another table already has the name.
        EtsError: an option is invalid (a remote ``heir`` included), or the calling process
            has exited (a task it started elsewhere still runs as it).
        NotAProcess: the caller is not a process (a table needs an owner).
    """
    owner = current_process()
    if not owner.alive:
        # A task the process started elsewhere outlives it with its context: a table it
        # made would belong to a dead process and never be deleted.
        raise EtsError(
            f"ets.new({brief(name)}): the calling process {owner.pid!r} has exited; a table"
            " needs a live owner (create it from a running process)",
            operation="new",
        )
    if not isinstance(name, str) or not name:
        raise EtsError(
            f"ets.new: the name must be a non-empty str (got {brief(name)})", operation="new"
        )
    kind = _option(TableType, type, "type", name)
    mode = _option(Access, access, "access", name)
    if keypos.__class__ is not int or keypos < 0:
        raise EtsError(
            f"ets.new({brief(name)}): keypos must be an int >= 0, the index of the key in each"
            f" object (got {brief(keypos)})",
            operation="new",
        )
    check_ttl(expire_after, "new", name)
    hints = make_hints(
        name, read_concurrency, write_concurrency, compressed, decentralized_counters
    )
    if heir is not None and heir.__class__ is not Pid:
        raise EtsError(
            f"ets.new({brief(name)}): heir must be a Pid or None (got {brief(heir)})",
            operation="new",
        )
    if heir is not None and remote_pid(heir, owner.node):
        raise EtsError(
            f"ets.new({brief(name)}): the heir must be a process of this node ({owner.node.name}):"
            f" a table never leaves its node (got {brief(heir)})",
            operation="new",
        )
    reg = registry()
    if named and name in reg.names:
        raise NameTaken(
            f"ets.new({brief(name)}): a table named {brief(name)} already exists (names are"
            " unique on a node; delete or rename the other table first)",
            table=name,
            operation="new",
        )
    node = owner.node
    tab = Tab(node, reg, name, bool(named), kind, mode, keypos, expire_after, owner)
    tab.hints = hints
    if heir is not None:
        set_heir(tab, heir, heir_data)
    actor = spawn_actor(tab, OPERATIONS)
    tab.handle = Table._make(node.name, builtins.next(reg.ids), node.creation, actor.pid, tab)
    tab.refresh()
    reg.by_id[tab.handle.id] = tab
    if named:
        reg.names[name] = tab
    return tab.ref
