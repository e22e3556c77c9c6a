"""The ``ets`` functions: create and delete tables, read and write objects, traverse, match.

Like Erlang's ETS BIFs they are plain (synchronous) functions: a local caller reads and writes
the table's data directly, and because no operation awaits, each one is atomic and isolated
(a list ``insert`` included). Only :func:`rpc`, which goes through the table's actor (as other
nodes must), is async.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable
from typing import Any, Literal, overload

from .._errors import CallError
from .._gen_server import call as _gen_call
from .._ids import Pid
from .._node import Node
from .._process import _CURRENT, current_process
from ._access import owned as _owned
from ._access import reader as _reader
from ._access import resolve as _resolve
from ._access import unique_only as _unique_only
from ._access import writer as _writer
from ._actor import request, spawn_actor
from ._continuation import Continuation, check_limit, hinted_keys, resume, start
from ._errors import AccessDenied, EtsError, KeyNotFound, NameTaken, NoSuchTable, brief
from ._fixtable import fixed_next
from ._hints import make_hints
from ._info import check_item
from ._match import (
    BINDINGS,
    NO_MATCH,
    OBJECT,
    bind,
    compile_spec,
    ordered_bindings,
    run_spec,
)
from ._order import exact_eq
from ._table import Tab, describe, registry
from ._traversal import select_replace, slot
from ._types import (
    END_OF_TABLE,
    PROTECTED,
    SET,
    Access,
    EtsTransfer,
    Table,
    TableInfo,
    TableRef,
    TableType,
)


class _Default:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFAULT"


#: ``expire_after=DEFAULT`` means "the table's ``expire_after``".
DEFAULT: Any = _Default()
_WHOLE_TABLE: Any = object()
#: The current process, raising LookupError outside one (a bound method: the fastest way).
_current = _CURRENT.get
_NO_DEFAULT: Any = object()
_NO_SPEC: Any = object()


# -- creating and deleting tables -------------------------------------------------------------


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
    _check_ttl(expire_after, "new", name)
    hints = make_hints(
        name, read_concurrency, write_concurrency, compressed, decentralized_counters
    )
    if heir is not None and heir.__class__ is not Pid:
        raise EtsError(
            f"ets.new({brief(name)}): heir must be a Pid or None (got {brief(heir)})",
            operation="new",
        )
    if heir is not None and _remote(heir, owner.node):
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
        _set_heir(tab, heir, heir_data)
    actor = spawn_actor(tab, OPERATIONS)
    tab.handle = Table._make(node.name, builtins.next(reg.ids), node.creation, actor.pid, tab)
    tab.refresh()
    reg.by_id[tab.handle.id] = tab
    if named:
        reg.names[name] = tab
    return tab.ref


def _check_ttl(expire_after: Any, operation: str, table: Any) -> None:
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


def _remote(pid: Pid, node: Node) -> bool:
    # A pid of an earlier incarnation of this node (another creation) is remote too, as in OTP.
    return pid.node != node.name or pid.creation != node.creation


def _set_heir(tab: Tab, heir: Pid | None, heir_data: Any) -> None:
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
    if heir.__class__ is Pid and _remote(heir, tab.node):
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
        _set_heir(tab, heir, heir_data)
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


# -- writing ----------------------------------------------------------------------------------


def _deadline(tab: Tab, expire_after: Any, operation: str, table: Any) -> float | None:
    if expire_after is DEFAULT:
        expire_after = tab.default_ttl
    else:
        _check_ttl(expire_after, operation, table)
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


# -- reading ----------------------------------------------------------------------------------


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


# -- matching ---------------------------------------------------------------------------------


def _candidates(tab: Tab, heads: list[Any]) -> Iterable[Any]:
    """The objects worth matching against ``heads``: those under the keys the heads pin down,
    or every object (in table order)."""
    keys = hinted_keys(tab, heads)
    if keys is None:
        return tab.objects()
    found: list[Any] = []
    for key in keys:
        found.extend(tab.get(key))
    return found


def match(table: Any, pattern: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """For each object matching ``pattern``, the values of its variables ordered by number
    (Erlang's ``ets:match/2``). ``Var(n)`` binds, ``ANY`` matches anything, other values
    match exactly (Erlang's ``=:=``: ``1`` does not match ``1.0``).

    With ``limit`` (``ets:match/3``) it returns the first chunk as :func:`select` does, and
    ``match(continuation)`` (``ets:match/1``) the next one.
    """
    if pattern is _NO_SPEC:
        return _continue(table, "match")
    tab = _reader(table, "match")
    if limit is not None:
        return _first_chunk(tab, [(pattern, [], BINDINGS)], limit, False, "match")
    results = []
    for obj in _candidates(tab, [pattern]):
        bindings: dict[int, Any] = {}
        if bind(pattern, obj, bindings):
            results.append(ordered_bindings(bindings))
    return results


def match_object(table: Any, pattern: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """The objects matching ``pattern`` (Erlang's ``ets:match_object/2``); with ``limit``
    the first chunk (``match_object/3``), and ``match_object(continuation)`` the next."""
    if pattern is _NO_SPEC:
        return _continue(table, "match_object")
    tab = _reader(table, "match_object")
    if limit is not None:
        return _first_chunk(tab, [(pattern, [], OBJECT)], limit, False, "match_object")
    return [obj for obj in _candidates(tab, [pattern]) if bind(pattern, obj, {})]


def _first_chunk(tab: Tab, spec: Any, limit: Any, reverse: bool, operation: str) -> Any:
    check_limit(limit, operation)
    return start(tab, compile_spec(spec, operation), limit, reverse)


def _continue(cont: Any, operation: str) -> Any:
    """The chunk after ``cont``: access is checked again, against the caller of now."""
    if cont is END_OF_TABLE:
        return END_OF_TABLE
    if cont.__class__ is not Continuation:
        raise EtsError(
            f"ets.{operation}/1 takes a continuation from ets.{operation} with a limit, or"
            f" END_OF_TABLE (got {brief(cont)}); to run over a table pass it and a"
            f" {'pattern' if operation.startswith('match') else 'match spec'}",
            operation=operation,
        )
    return resume(_reader(cont.table, operation), cont)


def match_delete(table: TableRef, pattern: Any) -> None:
    """Delete the objects matching ``pattern`` (Erlang's ``ets:match_delete/2``)."""
    _select_delete(table, [(pattern, [], True)], "match_delete")


def select(table: Any, spec: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """Run a match spec over the table (Erlang's ``ets:select/2``); returns the results.

    ``spec`` is a list of ``(head, guards, result)`` clauses, ``guards`` a list. For each
    object the first clause whose ``head`` pattern matches (literals and repeated variables
    exactly, as Erlang's ``=:=``) and whose guards all evaluate to ``True`` gives the object's
    result; every ``Var(n)`` the guards or result use must be bound by the head (else
    :class:`EtsError`, as OTP's ``badarg``). Guards are expressions: ``Var(n)``, ``OBJECT``,
    ``BINDINGS``, literals, tuples and lists of expressions, ``("const", term)`` for a literal
    tuple, and calls ``(op, *args)`` with Erlang's semantics (OTP's "Match Specifications in
    Erlang"):

    - comparisons in the term order (see ``otp.ets``): ``==  /=  =:=  =/=  <  =<  >  >=``
      (``!=`` and ``<=`` are aliases), ``min  max``;
    - arithmetic on numbers only: ``+  -`` (also unary) ``*  /  div  rem`` (truncating),
      ``band  bor  bxor  bnot  bsl  bsr  abs  round`` (half away from zero) ``trunc  floor
      ceil  float``, and Python's ``//  %`` (floor);
    - booleans only: ``and  or`` (every argument), ``andalso  orelse`` (left to right, the
      last argument is the value), ``not  xor``;
    - terms: ``element`` (0-based), ``hd  tl  length  size  tuple_size  byte_size  map_get
      map_size  is_map_key``, ``("self",)``, ``("node",)`` and ``("node", pid_or_ref)``, and
      Python's ``in  len``;
    - type tests: ``is_integer  is_float  is_number  is_atom  is_boolean  is_binary  is_tuple
      is_list  is_map  is_pid  is_reference  is_function  is_none`` (and ``is_int  is_bool
      is_str  is_bytes``).

    A guard that raises (arithmetic on a str, ``not`` of a non-boolean, ``element`` outside
    the tuple, an integer over 2**20 bits) fails its clause. Guards and results nest at most
    ``MAX_DEPTH`` (200) levels. The result is a template built from ``Var(n)``, ``OBJECT``
    (the object), ``BINDINGS`` (all bindings) and literals, inside tuples and lists (not
    evaluated). An ordered_set yields results in key order; when every head fixes the key,
    only those keys are looked at.

    With ``limit`` (``ets:select/3``, an int >= 1) it returns one chunk: ``(results,
    continuation)`` with ``limit`` results, or ``(results, END_OF_TABLE)`` with the last ones
    (at most ``limit``), or ``END_OF_TABLE`` if nothing (more) matched; ``select(continuation)``
    (``ets:select/1``) returns the next chunk in the same shapes, and ``select(END_OF_TABLE)``
    is ``END_OF_TABLE``. A full chunk may be followed by ``END_OF_TABLE``. Continuations stay
    valid across inserts and deletes without ``safe_fixtable`` (see :class:`Continuation`).

    Example:
        ``select(t, [((Var(1), Var(2)), [(">", Var(2), 10)], Var(1))])`` -- the keys of the
        pairs whose second element is above 10.
    """
    if spec is _NO_SPEC:
        return _continue(table, "select")
    tab = _reader(table, "select")
    if limit is not None:
        return _first_chunk(tab, spec, limit, False, "select")
    return _select(tab, compile_spec(spec, "select"))


def _select(tab: Tab, clauses: list[Any]) -> list[Any]:
    results = []
    for obj in _candidates(tab, [clause.head for clause in clauses]):
        result = run_spec(clauses, obj)
        if result is not NO_MATCH:
            results.append(result)
    return results


def select_reverse(table: Any, spec: Any = _NO_SPEC, limit: int | None = None) -> Any:
    """:func:`select` from the last key to the first in an ordered_set (Erlang's
    ``ets:select_reverse/1,2,3``); for the other types, exactly :func:`select`. With
    ``limit`` the first chunk holds the *last* ``limit`` results, largest key first."""
    if spec is _NO_SPEC:
        return _continue(table, "select_reverse")
    tab = _reader(table, "select_reverse")
    if limit is not None:
        return _first_chunk(tab, spec, limit, True, "select_reverse")
    results = _select(tab, compile_spec(spec, "select_reverse"))
    if tab.ordered:
        results.reverse()
    return results


def select_count(table: TableRef, spec: list[tuple[Any, list[Any], Any]]) -> int:
    """How many objects the match spec maps to ``True`` (Erlang's ``ets:select_count/2``)."""
    tab = _reader(table, "select_count")
    clauses = compile_spec(spec, "select_count")
    return sum(
        1
        for obj in _candidates(tab, [clause.head for clause in clauses])
        if run_spec(clauses, obj) is True
    )


def select_delete(table: TableRef, spec: list[tuple[Any, list[Any], Any]]) -> int:
    """Delete the objects the match spec maps to ``True``; returns how many
    (Erlang's ``ets:select_delete/2``). Atomic, as every other write."""
    return _select_delete(table, spec, "select_delete")


def _select_delete(table: Any, spec: Any, operation: str) -> int:
    tab = _writer(table, operation)
    clauses = compile_spec(spec, operation)
    doomed: dict[int, Any] = {}
    keys = []
    for obj in _candidates(tab, [clause.head for clause in clauses]):
        if run_spec(clauses, obj) is True:
            doomed[id(obj)] = obj
            keys.append(obj[tab.kp])
    removed = 0
    for key in keys:
        removed += len(tab.keep(key, lambda obj, _deadline: id(obj) not in doomed))
    return removed


# -- other nodes --------------------------------------------------------------------------------


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
