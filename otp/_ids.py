"""Opaque handles: :class:`Pid` names a process, :class:`Ref` is a unique reference.

As in Erlang, users never build these; the runtime hands them out (``spawn``, ``make_ref``,
``monitor``). A local Pid carries a direct reference to its process so that ``send`` needs no
table lookup; that reference is not part of its identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ._process import Process


class Pid:
    """A process identifier: node name, a per-node serial number and the node's creation.

    Pids compare and hash by (node, id, creation), order like Erlang's (by node then serial), and
    print as ``<node.id.creation>``. There is no public constructor.
    """

    __slots__ = ("_hash", "_proc", "creation", "id", "node")

    node: str
    id: int
    creation: int
    _proc: Process | None
    _hash: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Pid has no public constructor: pids come from spawn(), self() and friends")

    @classmethod
    def _make(cls, node: str, id: int, creation: int, proc: Process | None = None) -> Pid:
        pid = object.__new__(cls)
        pid.node = node
        pid.id = id
        pid.creation = creation
        pid._proc = proc
        pid._hash = -1  # computed when first hashed: most pids never are (32 bytes a process)
        return pid

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Pid):
            return NotImplemented
        return self.id == other.id and self.node == other.node and self.creation == other.creation

    def __hash__(self) -> int:
        h = self._hash
        if h == -1:  # (never a hash: CPython turns -1 into -2)
            # The whole identity: a peer picks the ids of the pids it sends, so a hash of the id
            # alone would let it fill a dict with colliding keys (quadratic inserts).
            h = self._hash = hash((self.node, self.id, self.creation))
        return h

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


class Ref:
    """A unique reference (Erlang's ``make_ref()``), used for monitors, calls and timers."""

    __slots__ = ("_hash", "creation", "id", "node")

    node: str
    id: int
    creation: int
    _hash: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Ref has no public constructor: use otp.make_ref()")

    @classmethod
    def _make(cls, node: str, id: int, creation: int) -> Ref:
        ref = object.__new__(cls)
        ref.node = node
        ref.id = id
        ref.creation = creation
        ref._hash = hash((node, id, creation))  # the whole identity, as Pid's
        return ref

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Ref):
            return NotImplemented
        return self.id == other.id and self.node == other.node and self.creation == other.creation

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"#Ref<{self.node}.{self.id}.{self.creation}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Ref is never pickled: it crosses processes only through wire/")

    def __copy__(self) -> Ref:
        return self

    def __deepcopy__(self, memo: object) -> Ref:
        return self
