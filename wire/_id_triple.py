"""``IdTriple``: the base of otp's ``Pid`` and ``Ref``, a (node, id, creation) identity that is
equal and hashed by its three fields.

It lives in wire because wire holds the project's only C extension: where ``wire._speedups``
was built, ``IdTriple`` is its C type (``wire/_speedups_ids.c``), whose hash is a field read
where a ``__hash__`` written in Python costs a frame (~400 instructions; a runtime hashes its
pids and refs several times per message: monitors, aliases, tables keyed by them). Otherwise it
is the class below, which defines the behaviour the C type must match.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._accel import C

__all__ = ["IdTriple"]


class IdTriple:
    """A (node, id, creation) identity: equal to an instance of its own class (or a subclass)
    with equal fields, hashed as ``hash((node, id, creation))`` computed when first asked. No
    ordering (a subclass defines its own). ``cls.__new__(cls)`` makes one with no fields yet,
    ignoring any arguments (a subclass's ``__init__`` decides what to accept); the fields are
    then set, once, before it is compared or hashed."""

    __slots__ = ("_hash", "creation", "id", "node")

    node: str
    id: int
    creation: int
    _hash: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = object.__new__(cls)
        self._hash = -1  # (never a hash: CPython turns -1 into -2)
        return self

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, self.__class__):
            return NotImplemented
        return self.id == other.id and self.node == other.node and self.creation == other.creation

    def __hash__(self) -> int:
        h = self._hash
        if h == -1:
            # The whole identity: a peer picks the ids it sends, so a hash of the id alone
            # would let it fill a dict with colliding keys (quadratic inserts).
            h = self._hash = hash((self.node, self.id, self.creation))
        return h


#: The Python definition, whichever ``IdTriple`` is in use (the tests hold the C type to it).
PY_ID_TRIPLE = IdTriple

if C is not None and not TYPE_CHECKING:
    IdTriple = C.IdTriple
