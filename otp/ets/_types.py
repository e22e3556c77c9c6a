"""The values of ``otp.ets``: table types and access modes, the opaque :class:`Table` handle
(Erlang's tid), the ``EtsTransfer`` message and the :class:`TableInfo` snapshot."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NoReturn

import attrs

from .._ids import Pid

if TYPE_CHECKING:
    from ._table import Tab


class TableType(enum.StrEnum):
    """The four table types of ETS.

    - ``SET``: one object per key; ``insert`` overwrites.
    - ``ORDERED_SET``: as ``SET``, traversed in key order (see ``otp.ets`` for the order).
    - ``BAG``: many objects per key, but equal objects are stored once.
    - ``DUPLICATE_BAG``: many objects per key, equal objects included.
    """

    SET = "set"
    ORDERED_SET = "ordered_set"
    BAG = "bag"
    DUPLICATE_BAG = "duplicate_bag"


class Access(enum.StrEnum):
    """Who may read and write a table.

    - ``PUBLIC``: every process reads and writes.
    - ``PROTECTED`` (the default): every process reads, only the owner writes.
    - ``PRIVATE``: only the owner reads and writes.
    """

    PUBLIC = "public"
    PROTECTED = "protected"
    PRIVATE = "private"


SET = TableType.SET
ORDERED_SET = TableType.ORDERED_SET
BAG = TableType.BAG
DUPLICATE_BAG = TableType.DUPLICATE_BAG
PUBLIC = Access.PUBLIC
PROTECTED = Access.PROTECTED
PRIVATE = Access.PRIVATE


class Table:
    """An opaque table identifier (Erlang's tid), returned by ``ets.new`` for unnamed tables.

    Tables compare and hash by (node, id, creation) and print as ``#Table<node.id>``. A handle
    made on this node reaches its table directly; the handle also names the table's actor, which
    is how other nodes reach it (``ets.rpc``). There is no public constructor.
    """

    __slots__ = ("_reads", "_tab", "actor", "creation", "id", "node")

    node: str
    id: int
    creation: int
    actor: Pid
    _tab: Tab
    #: The table's data dict while a read needs no check (see ``Tab.refresh``), else None:
    #: a fast ``lookup`` is one ``dict.get`` on it.
    _reads: dict[Any, Any] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Table has no public constructor: tables come from otp.ets.new()")

    @classmethod
    def _make(cls, node: str, id: int, creation: int, actor: Pid, tab: Tab) -> Table:
        handle = object.__new__(cls)
        handle.node = node
        handle.id = id
        handle.creation = creation
        handle.actor = actor
        handle._tab = tab
        handle._reads = None
        return handle

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Table:
            return NotImplemented
        assert isinstance(other, Table)
        return self.id == other.id and self.node == other.node and self.creation == other.creation

    def __hash__(self) -> int:
        return hash((self.id, self.creation))

    def __repr__(self) -> str:
        return f"#Table<{self.node}.{self.id}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Table is never pickled: it crosses processes only through wire/")

    def __copy__(self) -> Table:
        return self

    def __deepcopy__(self, memo: object) -> Table:
        return self


#: A table as the ``ets`` functions take it: its handle, or its name if it is a named table.
TableRef = Table | str


@attrs.frozen(slots=True)
class EtsTransfer:
    """Erlang's ``{'ETS-TRANSFER', Tab, FromPid, Data}``: the receiver now owns ``table``.

    Sent to an heir when the owner dies, and to the new owner by ``give_away``. ``table`` is the
    table's name if it is named, else its :class:`Table` handle.
    """

    table: Table | str
    old_owner: Pid
    heir_data: Any


@attrs.frozen(slots=True)
class TableInfo:
    """What ``ets.info`` reports about a table at the moment it is called.

    ``memory`` is an estimate in bytes of the table's containers and the objects' top-level
    tuples (elements shared with other data are not counted), computed in O(size).
    """

    id: Table
    name: str
    named: bool
    type: TableType
    access: Access
    owner: Pid
    heir: Pid | None
    keypos: int
    size: int
    memory: int
    node: str
    expire_after: float | None
    #: OTP's performance options, hints here (see ``ets.new``).
    read_concurrency: bool = False
    write_concurrency: bool | str = False
    compressed: bool = False
    decentralized_counters: bool = False


class _EndOfTable:
    __slots__ = ()

    def __repr__(self) -> str:
        return "END_OF_TABLE"

    def __copy__(self) -> _EndOfTable:
        return self

    def __deepcopy__(self, memo: object) -> _EndOfTable:
        return self


#: What ``first``/``next``/``last``/``prev`` return past the last key (Erlang's
#: ``'$end_of_table'``). A unique object, so no key can be mistaken for it.
END_OF_TABLE: Any = _EndOfTable()
