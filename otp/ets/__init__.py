"""otp.ets: Erlang's ETS tables, owned by processes, with OTP's types, access rules and heirs.

A table belongs to the process that created it. Its data lives on the node, next to a small
*table actor* (a GenServer) that sweeps expired objects and serves other nodes; local processes
call the ``ets`` functions directly. They are plain functions, like Erlang's BIFs, and each one
is atomic and isolated (local processes share one trio thread and no operation awaits).

Tables::

    t = ets.new("sessions", type=ets.SET, access=ets.PUBLIC)   # -> Table handle
    ets.new("config", named=True)                              # -> "config", usable as the table
    ets.insert(t, ("alice", 3))
    ets.lookup(t, "alice")                                     # -> [("alice", 3)]
    ets.update_counter(t, "alice", 1)                          # -> 4

Who may call: any process on the node, and any other task of the node's ``trio.run``. A task a
process starts in its own nursery acts as that process; a task outside every process (a system
task, say) is never the owner, so it counts as "another process" for the access rules.
Processes on other nodes use ``await ets.rpc(table.actor, "lookup", key)``, which goes through
the table actor (the actor's pid is what crosses nodes).

Access (``access=``): ``PROTECTED`` (default) lets every process read and only the owner write;
``PUBLIC`` lets everyone write; ``PRIVATE`` keeps reads and writes to the owner. A breach raises
:class:`AccessDenied` naming the table, the operation and the rule.

Owner death: when the owner exits the table is deleted, unless its heir (``heir=pid``) is alive:
then the heir owns it and receives ``EtsTransfer(table, old_owner, heir_data)``. This happens
after the owner's registered name is freed and before its links and monitors fire, as in OTP, so
whoever gets the owner's ``Down`` or ``Exit`` already sees the table deleted or transferred.

Keys: objects are tuples; the key is element ``keypos`` (0-based, default 0) and must be
hashable. Key equality is Python's ``==`` in every table type: ``1``, ``1.0`` and ``True`` are
one key in a set as in an ordered_set (Erlang's set tables would keep ``1`` and ``1.0`` apart;
Python's dict cannot). Whole objects compare exactly, as Erlang's ``=:=``: a bag keeps both
``("a", 1)`` and ``("a", 1.0)``, ``delete_object((1.0, "x"))`` leaves ``(1, "x")``, and a
pattern's ``1`` does not match ``1.0``.

Term order: ``ordered_set`` keys, ``first``/``next``/``prev``/``last`` and the comparison guards
of match specs all use Erlang's term order over one mapping of Python values: ``None`` <
numbers (``int``, ``float``, ``bool``, ``Fraction``, ``Decimal``, by value) < atoms (``str``,
``wire.Atom``) < ``Ref`` < funs (other callables) < ``Pid`` < ``tuple`` (shorter first, then
element by element) < ``dict`` (size, keys, values) < ``list`` (``[]`` first) < ``bytes`` <
anything else (by type name, then ``repr``). NaN is not a valid ordered_set key; lists, being
unhashable, are never keys, but ``next``/``prev`` accept them.

Traversals: ``select``/``match``/``match_object`` with a ``limit`` return ``(results,
continuation)``, continued by ``select(continuation)`` until ``END_OF_TABLE``; a
:class:`Continuation` holds its own place (the last key of an ordered_set, a snapshot of the
keys otherwise), so it stays valid across writes with no ``safe_fixtable``. ``foldl``/``foldr``,
``select_reverse``, ``select_replace`` and ``slot`` are OTP's; ``safe_fixtable`` lets
``next`` continue from a key deleted since the table was fixed. ``await tab2file(t, path)``
and ``await file2tab(path)`` save and load a table in wire's CBOR with a SHA-256 checksum.

Expiry (an extension; OTP has none): ``new(..., expire_after=s)`` gives objects a time to live
on trio's clock, ``insert(..., expire_after=s)`` overrides it per insert. An expired object is
gone for every operation at once; the table actor then frees its memory.
"""

from ._continuation import Continuation as Continuation
from ._errors import AccessDenied as AccessDenied
from ._errors import EtsError as EtsError
from ._errors import KeyNotFound as KeyNotFound
from ._errors import NameTaken as NameTaken
from ._errors import NoSuchTable as NoSuchTable
from ._fixtable import safe_fixtable as safe_fixtable
from ._fun2ms import fun2ms as fun2ms
from ._lifecycle import delete as delete
from ._lifecycle import delete_all_objects as delete_all_objects
from ._lifecycle import give_away as give_away
from ._lifecycle import rename as rename
from ._lifecycle import setopts as setopts
from ._match import ANY as ANY
from ._match import BINDINGS as BINDINGS
from ._match import OBJECT as OBJECT
from ._match import Var as Var
from ._new import new as new
from ._read import all as all
from ._read import first as first
from ._read import info as info
from ._read import last as last
from ._read import lookup as lookup
from ._read import lookup_element as lookup_element
from ._read import member as member
from ._read import next as next
from ._read import prev as prev
from ._read import tab2list as tab2list
from ._read import whereis as whereis
from ._rpc import rpc as rpc
from ._select import match as match
from ._select import match_delete as match_delete
from ._select import match_object as match_object
from ._select import select as select
from ._select import select_count as select_count
from ._select import select_delete as select_delete
from ._select import select_reverse as select_reverse
from ._tabfile import TableFileError as TableFileError
from ._tabfile import file2tab as file2tab
from ._tabfile import tab2file as tab2file
from ._traversal import foldl as foldl
from ._traversal import foldr as foldr
from ._traversal import select_replace as select_replace
from ._traversal import slot as slot
from ._types import BAG as BAG
from ._types import DUPLICATE_BAG as DUPLICATE_BAG
from ._types import END_OF_TABLE as END_OF_TABLE
from ._types import ORDERED_SET as ORDERED_SET
from ._types import PRIVATE as PRIVATE
from ._types import PROTECTED as PROTECTED
from ._types import PUBLIC as PUBLIC
from ._types import SET as SET
from ._types import Access as Access
from ._types import EtsTransfer as EtsTransfer
from ._types import Table as Table
from ._types import TableInfo as TableInfo
from ._types import TableRef as TableRef
from ._types import TableType as TableType
from ._write import DEFAULT as DEFAULT
from ._write import delete_object as delete_object
from ._write import insert as insert
from ._write import insert_new as insert_new
from ._write import take as take
from ._write import update_counter as update_counter
from ._write import update_element as update_element

__all__ = [
    "ANY",
    "BAG",
    "BINDINGS",
    "DEFAULT",
    "DUPLICATE_BAG",
    "END_OF_TABLE",
    "OBJECT",
    "ORDERED_SET",
    "PRIVATE",
    "PROTECTED",
    "PUBLIC",
    "SET",
    "Access",
    "AccessDenied",
    "Continuation",
    "EtsError",
    "EtsTransfer",
    "KeyNotFound",
    "NameTaken",
    "NoSuchTable",
    "Table",
    "TableFileError",
    "TableInfo",
    "TableRef",
    "TableType",
    "Var",
    "all",
    "delete",
    "delete_all_objects",
    "delete_object",
    "file2tab",
    "first",
    "foldl",
    "foldr",
    "fun2ms",
    "give_away",
    "info",
    "insert",
    "insert_new",
    "last",
    "lookup",
    "lookup_element",
    "match",
    "match_delete",
    "match_object",
    "member",
    "new",
    "next",
    "prev",
    "rename",
    "rpc",
    "safe_fixtable",
    "select",
    "select_count",
    "select_delete",
    "select_replace",
    "select_reverse",
    "setopts",
    "slot",
    "tab2file",
    "tab2list",
    "take",
    "update_counter",
    "update_element",
    "whereis",
]


def _publish() -> None:
    # Public classes and functions say they come from ``otp.ets``, not a private module.
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_publish()
del _publish
