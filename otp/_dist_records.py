"""Values of your own across nodes: an explicit registry of attrs frozen classes.

A message between nodes holds plain values, pids, refs and exit reasons (``_dist_values``).
An application whose actors talk across nodes in attrs values registers each class that may
cross, on every node, under a stable name::

    @otp.remote_value
    @attrs.frozen
    class Task:
        ...

    otp.remote_value(Completed, name="matching.Completed")

A registered value crosses as the tagged tuple ``(Atom("$record"), name, {field: value})``
(Erlang's records are tagged tuples too), its fields converted as any message (so they may hold
registered values in turn). The receiver rebuilds it only from its own registry: a name it does
not know is refused (the message is dropped and logged; the connection stays up), a class is
never imported by name and nothing is unpickled. Rebuilding calls the class, so its validators
and converters check what a peer sent.

Fields travel by name, not position: a node that added a field with a default still reads a
peer's value of the older shape (rolling upgrades), while a field it does not know refuses the
value with a message that names it.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import attrs

from ._errors import BadArg

__all__ = [
    "RECORD_TAG",
    "RemoteRecord",
    "UnknownRemoteValue",
    "by_name",
    "refusal",
    "registered",
    "remote_value",
]

#: The atom name that opens a registered value's tuple on the wire.
RECORD_TAG = "$record"

_T = TypeVar("_T", bound=type)


class UnknownRemoteValue(Exception):
    """A peer sent a value this node cannot rebuild: its name is not registered here, or its
    fields do not fit the registered class. The message holding it is dropped (and logged)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"a remote value {name[:200]!r} was refused: {problem}")
        self.name = name


@attrs.frozen
class RemoteRecord:
    """One registered class: ``name`` on the wire, its init fields as (field name, init arg)."""

    cls: type
    name: str
    fields: tuple[tuple[str, str], ...]


_BY_CLASS: dict[type, RemoteRecord] = {}
_BY_NAME: dict[str, RemoteRecord] = {}


def _is_frozen(cls: type) -> bool:
    # attrs has no public "is frozen": a frozen class's __setattr__ is attrs' refusal.
    return getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"


@overload
def remote_value(cls: _T, *, name: str | None = None) -> _T: ...


@overload
def remote_value(cls: None = None, *, name: str | None = None) -> Any: ...


def remote_value(cls: type | None = None, *, name: str | None = None) -> Any:
    """Allow the attrs frozen class ``cls`` to cross to other nodes, under ``name`` (default
    ``module.QualifiedName``). Usable as a decorator (``@otp.remote_value`` or
    ``@otp.remote_value(name=...)``); returns the class. Register it on every node that sends
    or receives it: a node refuses the names it does not know. Registering the same class
    under the same name again does nothing.

    Raises:
        BadArg: ``cls`` is not an attrs frozen class, one of its fields is not an init
            argument, or ``name`` (or ``cls``) is registered already the other way round.
    """
    if cls is None:
        return lambda c: remote_value(c, name=name)
    label = getattr(cls, "__qualname__", repr(cls))
    if not (isinstance(cls, type) and attrs.has(cls) and _is_frozen(cls)):
        raise BadArg(
            f"otp.remote_value({label}): only attrs frozen classes (@attrs.frozen) can cross"
            " nodes: a value sent to another node is a copy, so it must not be one to change"
        )
    wire_name = name if name is not None else f"{cls.__module__}.{cls.__qualname__}"
    if not isinstance(wire_name, str) or not wire_name or len(wire_name) > 255:
        raise BadArg(
            f"otp.remote_value({label}, name={wire_name!r}): a name is a str of 1 to 255 characters"
        )
    skipped = [a.name for a in attrs.fields(cls) if not a.init]
    if skipped:
        raise BadArg(
            f"otp.remote_value({label}): field(s) {', '.join(skipped)} are not init arguments,"
            " so the receiver could not rebuild the value: make them init fields"
        )
    fields = tuple((a.name, a.alias or a.name) for a in attrs.fields(cls))
    known = _BY_CLASS.get(cls)
    if known is not None:
        if known.name == wire_name:
            return cls
        raise BadArg(
            f"otp.remote_value({label}, name={wire_name!r}): the class is registered as"
            f" {known.name!r} already; a class crosses under one name"
        )
    other = _BY_NAME.get(wire_name)
    if other is not None:
        raise BadArg(
            f"otp.remote_value({label}, name={wire_name!r}): that name is registered for"
            f" {other.cls.__module__}.{other.cls.__qualname__} already; pass another name="
        )
    record = RemoteRecord(cls, wire_name, fields)
    _BY_CLASS[cls] = record
    _BY_NAME[wire_name] = record
    return cls


def registered(cls: type) -> RemoteRecord | None:
    """The registration of ``cls``, or None."""
    return _BY_CLASS.get(cls)


def by_name(name: Any) -> RemoteRecord:
    """The registration named ``name`` (a peer's value).

    Raises:
        UnknownRemoteValue: no class is registered under that name on this node.
    """
    record = _BY_NAME.get(name) if name.__class__ is str else None
    if record is None:
        raise UnknownRemoteValue(
            str(name),
            "no class is registered under that name on this node: register it with"
            " otp.remote_value(cls) on every node that receives it",
        )
    return record


def refusal(cls: type) -> str:
    """What to do about an unregistered value of ``cls`` that was to be sent."""
    if attrs.has(cls) and cls.__module__.partition(".")[0] not in ("wire", "otp"):
        return (
            f"; an attrs value crosses once its class is registered on both nodes:"
            f" otp.remote_value({cls.__qualname__}) (it must be @attrs.frozen)"
        )
    return ""
