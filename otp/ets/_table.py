"""The runtime state of one table: its objects, its owner, heir and access mode, and what
happens when its owner dies (the ``ordered_set`` index is ``_ordered_index``, time to live
``_expiry``, the node's table registry ``_registry``).

This mirrors ERTS's ``DbTable``: the data lives here, on the node, so reads and writes by local
processes are plain function calls (atomic and isolated because every local process runs in one
trio thread and no operation awaits). The owner's death is handled by an exit hook on the owner,
which runs before its links and monitors fire, as OTP releases "directly visible resources".
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from .._ids import Pid, Ref
from .._node import Node
from .._process import Process
from ._errors import AccessDenied, EtsError, KeyNotFound, NoSuchTable, brief
from ._expiry import ActorSignal, Expiry
from ._order import UnorderableKey, exact_index, order_key
from ._ordered_index import ABSENT, OrderedIndex
from ._registry import Registry, caller_pid
from ._types import (
    DUPLICATE_BAG,
    END_OF_TABLE,
    ORDERED_SET,
    PRIVATE,
    PUBLIC,
    SET,
    Access,
    EtsTransfer,
    Table,
    TableType,
)


class _Nobody:
    """Stands in for the owner of a deleted table, so the fast access test always fails."""

    __slots__ = ()


NOBODY: Any = _Nobody()


def describe(table: Any) -> str:
    return f"table {brief(table)}"


class Tab(Expiry):
    """One table: data structure, metadata and lifecycle."""

    __slots__ = (
        "_hook",
        "access",
        "actor_proc",
        "alive",
        "count",
        "data",
        "default_ttl",
        "dl",
        "dup",
        "fix",
        "handle",
        "heap",
        "heir",
        "heir_data",
        "hints",
        "index",
        "kind",
        "kp",
        "name",
        "named",
        "node",
        "ordered",
        "owner",
        "owner_proc",
        "registry",
        "removed",
        "rfast",
        "rguard",
        "seq",
        "snap",
        "sweep_at",
        "sweep_timer",
        "unique",
        "wfast",
        "wguard",
        "writer",
    )

    def __init__(
        self,
        node: Node,
        reg: Registry,
        name: str,
        named: bool,
        kind: TableType,
        access: Access,
        keypos: int,
        expire_after: float | None,
        owner: Process,
    ) -> None:
        self.node = node
        self.registry = reg
        self.name = name
        self.named = named
        self.kind = kind
        self.access = access
        self.kp = keypos
        self.default_ttl = expire_after
        self.unique = kind is SET or kind is ORDERED_SET
        self.ordered = kind is ORDERED_SET
        self.dup = kind is DUPLICATE_BAG
        self.data: dict[Any, Any] = {}
        #: The ordered_set's keys in term order (empty for the other types).
        self.index = OrderedIndex()
        self.count = 0
        self.dl: dict[Any, Any] = {}
        self.heap: list[tuple[float, int, Any]] = []
        self.seq = itertools.count()
        self.removed = 0
        self.snap: tuple[list[Any], dict[Any, int], int, int] | None = None
        self.alive = True
        self.rguard = access is PRIVATE
        self.wguard = access is not PUBLIC
        self.owner_proc: Any = owner
        #: The data dict when a read needs no check at all (see ``refresh``), else None.
        self.rfast: dict[Any, Any] | None = None
        #: The data dict when a one-object insert needs only the ``writer`` check, else None.
        self.wfast: dict[Any, Any] | None = None
        #: The process allowed to write (the owner), or None when anyone may (public).
        self.writer: Process | None = None
        self.owner: Pid = owner.pid
        self.heir: Pid | None = None
        self.heir_data: Any = None
        self.actor_proc: Process | None = None
        self.sweep_timer: Ref | None = None
        self.sweep_at = math.inf
        self.handle: Table = None  # type: ignore[assignment]  # set by ets.new right after
        #: The ``new`` options OTP tunes performance with (``_hints.Hints``), kept for ``info``.
        self.hints: Any = None
        #: Who fixed the table with ``safe_fixtable`` (``_fixtable.Fixation``), or None.
        self.fix: Any = None
        self._hook = self.on_owner_exit
        add_hook(owner, self._hook)
        self.refresh()

    def __repr__(self) -> str:
        return f"<Tab {self.ref!r} {self.kind} alive={self.alive}>"

    def refresh(self) -> None:
        """Recompute the fast-path fields after a change of owner, of expiry state or of life.

        Reads of a live, non-private set or ordered_set with no pending expiry need no check;
        one-object inserts into a live ``set`` with keypos 0 and no expiry need only the
        writer check. Everything else takes the checked path.
        """
        plain = self.alive and not self.heap and not self.dl
        self.rfast = self.data if plain and self.unique and self.access is not PRIVATE else None
        self.wfast = (
            self.data
            if plain and self.kind is SET and self.kp == 0 and self.default_ttl is None
            else None
        )
        self.writer = None if self.access is PUBLIC else self.owner_proc if self.alive else NOBODY
        handle = self.handle
        if handle is not None:
            handle._reads = self.rfast

    @property
    def ref(self) -> Table | str:
        """How users name this table: its name if named, else its handle."""
        return self.name if self.named else self.handle

    def set_access(self, access: Access) -> None:
        """Change the access mode (``setopts``): the access checks follow at once."""
        self.access = access
        self.rguard = access is PRIVATE
        self.wguard = access is not PUBLIC
        self.refresh()

    # -- access ----------------------------------------------------------------------------

    def check_read(self, operation: str, table: Any) -> None:
        """The slow half of the read check (the fast half is ``rguard``/``owner_proc``)."""
        if not self.alive:
            raise self.gone(operation, table)
        if self.access is PRIVATE and caller_pid() != self.owner:
            raise AccessDenied(
                f"ets.{operation}({describe(table)}): access denied: the table is private, only"
                f" its owner {self.owner!r} may read it (caller {caller_pid()!r})",
                table=table,
                operation=operation,
            )

    def check_write(self, operation: str, table: Any) -> None:
        if not self.alive:
            raise self.gone(operation, table)
        if self.access is not PUBLIC and caller_pid() != self.owner:
            raise AccessDenied(
                f"ets.{operation}({describe(table)}): access denied: the table is"
                f" {self.access}, only its owner {self.owner!r} may write to it"
                f" (caller {caller_pid()!r})",
                table=table,
                operation=operation,
            )

    def check_owner(self, operation: str, table: Any) -> None:
        if not self.alive:
            raise self.gone(operation, table)
        if caller_pid() != self.owner:
            raise AccessDenied(
                f"ets.{operation}({describe(table)}): access denied: only the table's owner"
                f" {self.owner!r} may do this (caller {caller_pid()!r})",
                table=table,
                operation=operation,
            )

    def gone(self, operation: str, table: Any) -> NoSuchTable:
        return NoSuchTable(
            f"ets.{operation}({describe(table)}): the table does not exist (it was deleted,"
            " or its owner died with no live heir)",
            table=table,
            operation=operation,
        )

    # -- objects ---------------------------------------------------------------------------

    def key_of(self, obj: Any, operation: str) -> Any:
        """The key of ``obj``, checking that it is an object of this table."""
        if not isinstance(obj, tuple):
            raise EtsError(
                f"ets.{operation}({describe(self.ref)}): objects are tuples (got {brief(obj)})",
                table=self.ref,
                operation=operation,
            )
        if len(obj) <= self.kp:
            raise EtsError(
                f"ets.{operation}({describe(self.ref)}): the object {brief(obj)} has no element at"
                f" keypos {self.kp} (it needs at least {self.kp + 1} elements)",
                table=self.ref,
                operation=operation,
            )
        key = obj[self.kp]
        try:
            hash(key)
        except TypeError:
            raise EtsError(
                f"ets.{operation}({describe(self.ref)}): keys must be hashable"
                f" (got {brief(key)} of type {type(key).__name__})",
                table=self.ref,
                operation=operation,
            ) from None
        return key

    def bad_key(self, key: Any, operation: str) -> EtsError:
        return EtsError(
            f"ets.{operation}({describe(self.ref)}): keys must be hashable"
            f" (got {brief(key)} of type {type(key).__name__})",
            table=self.ref,
            operation=operation,
        )

    def put(self, obj: Any, key: Any, deadline: float | None, operation: str) -> None:
        """Store ``obj`` under ``key`` (already validated), expiring at ``deadline``."""
        data = self.data
        if self.unique:
            if self.ordered and key not in data:
                self._index_add(key, operation)
            data[key] = obj
            if deadline is not None:
                self.dl[key] = deadline
                self._push_deadline(deadline, key)
            elif self.dl:
                self.dl.pop(key, None)
            return
        objs = data.get(key)
        when = math.inf if deadline is None else deadline
        if objs is None:
            data[key] = [obj]
            self.count += 1
            if deadline is not None:
                self.dl[key] = [when]
        else:
            deadlines = self.dl.get(key)
            if deadline is not None and deadlines is None:
                deadlines = self.dl[key] = [math.inf] * len(objs)
            # A bag stores an object once by exact match (OTP's =:=): (k, 1) and (k, 1.0) both stay.
            index = -1 if self.dup else exact_index(objs, obj)
            if index >= 0:
                if deadlines is not None:
                    deadlines[index] = when
            else:
                objs.append(obj)
                self.count += 1
                if deadlines is not None:
                    deadlines.append(when)
        if deadline is not None:
            self._push_deadline(deadline, key)

    def get(self, key: Any) -> list[Any]:
        objs = self.data.get(key)
        if objs is None:
            return []
        return [objs] if self.unique else list(objs)

    def remove_key(self, key: Any) -> list[Any]:
        """Delete every object under ``key``; returns them."""
        objs = self.data.pop(key, None)
        if objs is None:
            return []
        self.removed += 1
        if self.dl:
            self.dl.pop(key, None)
        if self.unique:
            if self.ordered:
                self._index_remove(key)
            return [objs]
        self.count -= len(objs)
        return objs

    def keep(self, key: Any, keep: Callable[[Any, float], bool]) -> list[Any]:
        """Keep only the objects under ``key`` that ``keep(obj, deadline)`` accepts; returns
        the others (removed)."""
        objs = self.data.get(key)
        if objs is None:
            return []
        if self.unique:
            deadline = self.dl.get(key, math.inf) if self.dl else math.inf
            if keep(objs, deadline):
                return []
            return self.remove_key(key)
        deadlines = self.dl.get(key) if self.dl else None
        if deadlines is None:
            deadlines = [math.inf] * len(objs)
        kept, kept_deadlines, dropped = [], [], []
        for obj, deadline in zip(objs, deadlines, strict=True):
            if keep(obj, deadline):
                kept.append(obj)
                kept_deadlines.append(deadline)
            else:
                dropped.append(obj)
        if not dropped:
            return []
        if not kept:
            return self.remove_key(key)
        self.data[key] = kept
        self.count -= len(dropped)
        if key in self.dl:
            self.dl[key] = kept_deadlines
        return dropped

    def objects(self) -> Iterator[Any]:
        """Every object, in key order for ``ordered_set``, else in insertion order of keys."""
        data = self.data
        if self.ordered:
            return (data[raw] for raw in self.index.keys())
        if self.unique:
            return iter(list(data.values()))
        return (obj for objs in list(data.values()) for obj in objs)

    def keys(self) -> list[Any]:
        return self.index.keys() if self.ordered else list(self.data)

    def size(self) -> int:
        return len(self.data) if self.unique else self.count

    def clear(self) -> None:
        self.removed += len(self.data)
        self.data.clear()
        self.index.clear()
        self.dl.clear()
        self.heap.clear()
        self.count = 0
        self.snap = None
        self.refresh()

    def memory(self) -> int:
        size = sys.getsizeof(self.data) + self.index.memory() + sys.getsizeof(self.dl)
        if self.unique:
            size += sum(sys.getsizeof(obj) for obj in self.data.values())
        else:
            for objs in self.data.values():
                size += sys.getsizeof(objs) + sum(sys.getsizeof(obj) for obj in objs)
        return size

    # -- ordered_set index -------------------------------------------------------------------

    def _index_add(self, key: Any, operation: str) -> None:
        holder = self.index.add(key, self._order_probe(key, operation))
        if holder is not ABSENT:
            raise self._sort_collision(key, holder, operation)

    def _index_remove(self, key: Any) -> None:
        self.index.remove(key)

    def check_new_keys(self, keys: list[Any], operation: str) -> None:
        """Check that the keys of a list insert not in the table yet can all be indexed, before
        any is written (a list insert is all or nothing).

        Raises:
            EtsError: a key cannot be ordered, or sorts equal to another key (stored or in
                ``keys``) without being == to it.
        """
        data = self.data
        index = self.index
        fresh: dict[Any, Any] = {}
        for key in keys:
            if key in data:
                continue
            sk = self._order_probe(key, operation)
            other = fresh.setdefault(sk, key)
            if other is not key and other != key:
                raise self._sort_collision(key, other, operation)
            holder = index.holder(sk)
            if holder is not ABSENT:
                raise self._sort_collision(key, holder, operation)

    def _sort_collision(self, key: Any, other: Any, operation: str) -> EtsError:
        return EtsError(
            f"ets.{operation}({describe(self.ref)}): the key {brief(key)} sorts equal to the key"
            f" {brief(other)} but is not == to it; keys of type {type(key).__qualname__} need a"
            " repr that agrees with ==",
            table=self.ref,
            operation=operation,
        )

    def _order_probe(self, key: Any, operation: str) -> Any:
        try:
            return order_key(key)
        except UnorderableKey as exc:
            raise EtsError(
                f"ets.{operation}({describe(self.ref)}): NaN is not a valid ordered_set key: {exc}"
                f" (got {brief(key)})",
                table=self.ref,
                operation=operation,
            ) from None

    def _sort_key_of(self, key: Any, operation: str) -> Any:
        """Where ``key`` sits in the order: a stored key's own sort key (see
        ``OrderedIndex.ords``); an unhashable key, never stored, is placed by its own order."""
        sk = self.index.sort_key(key)
        return sk if sk is not None else self._order_probe(key, operation)

    # -- traversal ---------------------------------------------------------------------------

    def first(self) -> Any:
        if self.ordered:
            return self._stored_key(self.index.first()) if self.index else END_OF_TABLE
        for key in self.data:
            return key
        return END_OF_TABLE

    def last(self) -> Any:
        if self.ordered:
            return self._stored_key(self.index.last()) if self.index else END_OF_TABLE
        return self.first()

    def next(self, key: Any, operation: str) -> Any:
        if self.ordered:
            raw = self.index.after(self._sort_key_of(key, operation))
            return END_OF_TABLE if raw is ABSENT else self._stored_key(raw)
        data = self.data
        snap = self.snap
        if snap is None or len(data) - snap[2] + self.removed - snap[3] > 0:
            snap = self._snapshot()
        keys, positions, _, _ = snap
        try:
            at = positions.get(key)
        except TypeError:
            raise self.bad_key(key, operation) from None
        if at is None or key not in data:
            raise KeyNotFound(
                f"ets.{operation}({describe(self.ref)}, {brief(key)}): the key is not in the table;"
                f" a {self.kind} table is traversed from first() with keys it returned",
                table=self.ref,
                operation=operation,
            )
        for candidate in itertools.islice(keys, at + 1, None):
            if candidate in data:
                return candidate
        return END_OF_TABLE

    def prev(self, key: Any, operation: str) -> Any:
        if self.ordered:
            raw = self.index.before(self._sort_key_of(key, operation))
            return END_OF_TABLE if raw is ABSENT else self._stored_key(raw)
        return self.next(key, operation)

    def keys_from(self, key: Any, count: int, reverse: bool, *, start: bool = False) -> list[Any]:
        """Up to ``count`` ordered_set keys (as indexed) after ``key`` in the order, or before
        it if ``reverse``; from the first (last) key if ``start``. ``key`` need not be stored."""
        return self.index.run(None if start else self._sort_key_of(key, "select"), count, reverse)

    def _stored_key(self, raw: Any) -> Any:
        # The stored object's key, as OTP reports it: an insert replaces the object under an ==
        # key (1.0 replacing 1) but the index keeps the key it was first indexed by.
        return self.data[raw][self.kp]

    def key_snapshot(self) -> tuple[list[Any], dict[Any, int]]:
        """The keys of a set or bag in table order and each one's index there, shared until a
        key is added or removed: callers keep them (continuations do) but never change them."""
        data = self.data
        snap = self.snap
        if snap is None or len(data) - snap[2] + self.removed - snap[3] > 0:
            snap = self._snapshot()
        return snap[0], snap[1]

    def _snapshot(self) -> tuple[list[Any], dict[Any, int], int, int]:
        keys = list(self.data)
        snap = (keys, {key: at for at, key in enumerate(keys)}, len(keys), self.removed)
        self.snap = snap
        return snap

    # -- lifecycle ---------------------------------------------------------------------------

    def set_owner(self, proc: Process) -> None:
        old = self.owner_proc
        if isinstance(old, Process) and old.alive and old.exit_hooks is not None:
            try:
                old.exit_hooks.remove(self._hook)
            except ValueError:
                pass
        self.owner_proc = proc
        self.owner = proc.pid
        add_hook(proc, self._hook)
        self.refresh()

    def on_owner_exit(self, proc: Process, _reason: Any) -> None:
        """The owner died: hand the table to a live heir, else delete it (OTP's rule)."""
        if not self.alive or self.owner_proc is not proc:
            return
        heir = self.heir
        if heir is not None and heir != proc.pid:
            heir_proc = self.node.resolve(heir)
            if heir_proc is not None:
                self.set_owner(heir_proc)
                heir_proc.deliver(EtsTransfer(self.ref, proc.pid, self.heir_data))
                return
        self.destroy()

    def destroy(self) -> None:
        """Delete the table: free its name, drop its objects, stop its actor."""
        if not self.alive:
            return
        self.alive = False
        self.rguard = self.wguard = True
        owner = self.owner_proc
        self.owner_proc = NOBODY
        if isinstance(owner, Process) and owner.exit_hooks is not None:
            try:
                owner.exit_hooks.remove(self._hook)
            except ValueError:
                pass
        reg = self.registry
        reg.by_id.pop(self.handle.id, None)
        if self.named and reg.names.get(self.name) is self:
            del reg.names[self.name]
        self.clear()
        self.refresh()
        if self.sweep_timer is not None:
            self.node.timers.cancel(self.sweep_timer)
            self.sweep_timer = None
        actor = self.actor_proc
        self.actor_proc = None
        if actor is not None:
            actor.deliver(STOP)

    def actor_exited(self, proc: Process, _reason: Any) -> None:
        if self.actor_proc is proc:
            self.actor_proc = None


def add_hook(proc: Process, hook: Callable[[Process, Any], None]) -> None:
    if proc.exit_hooks is None:
        proc.exit_hooks = [hook]
    else:
        proc.exit_hooks.append(hook)


#: Tells the table actor that its table was deleted.
STOP: Any = ActorSignal("ets_stop")
