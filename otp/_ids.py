"""Opaque handles: :class:`Pid` names a process, :class:`Ref` is a unique reference.

As in Erlang, users never build these; the runtime hands them out (``spawn``, ``make_ref``,
``monitor``). A local Pid carries a direct reference to its process so that ``send`` needs no
table lookup; that reference is not part of its identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import wire

if TYPE_CHECKING:
    from ._process import Process


#: Makes an instance with no fields yet (``wire.IdTriple``'s ``__new__``: past the public
#: ``__init__``, which refuses).
_new = wire.IdTriple.__new__


class Pid(wire.IdTriple):
    """A process identifier: node name, a per-node serial number and the node's creation.

    Pids compare and hash by (node, id, creation) (``wire.IdTriple``: in C where wire's speedups
    are built), order like Erlang's (by node then serial), and print as ``<node.id.creation>``.
    There is no public constructor.
    """

    __slots__ = ("_proc",)

    node: str
    id: int
    creation: int
    _proc: Process | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Pid has no public constructor: pids come from spawn(), self() and friends")

    @classmethod
    def _make(cls, node: str, id: int, creation: int, proc: Process | None = None) -> Pid:
        pid: Pid = _new(cls)
        pid.node = node
        pid.id = id
        pid.creation = creation
        pid._proc = proc
        return pid

    def __lt__(self, other: Pid) -> bool:
        return (self.node, self.creation, self.id) < (other.node, other.creation, other.id)

    def __repr__(self) -> str:
        return f"<{self.node}.{self.id}.{self.creation}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Pid is never pickled: it crosses processes only through wire/")

    def __copy__(self) -> Pid:
        return self

    def __deepcopy__(self, memo: object) -> Pid:
        return self


class Ref(wire.IdTriple):
    """A unique reference (Erlang's ``make_ref()``), used for monitors, calls and timers; equal
    and hashed by (node, id, creation), as a Pid."""

    __slots__ = ()

    node: str
    id: int
    creation: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Ref has no public constructor: use otp.make_ref()")

    @classmethod
    def _make(cls, node: str, id: int, creation: int) -> Ref:
        ref: Ref = _new(cls)
        ref.node = node
        ref.id = id
        ref.creation = creation
        return ref

    def __repr__(self) -> str:
        return f"#Ref<{self.node}.{self.id}.{self.creation}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Ref is never pickled: it crosses processes only through wire/")

    def __copy__(self) -> Ref:
        return self

    def __deepcopy__(self, memo: object) -> Ref:
        return self
