"""Values across nodes: otp's pids, refs, exit reasons and gen_server envelopes to and from the
plain values of ``wire`` (version 2), so nothing is ever pickled.

A message may hold None, bool, int, float, str, bytes, list, tuple, dict and any of otp's
:class:`~otp.Pid`, :class:`~otp.Ref` and exit reasons (:class:`~otp.Shutdown`, :class:`~otp.Crash`,
a port's :class:`~otp.ExitStatus` and :class:`~otp.Signaled`) nested inside;
anything else cannot leave the node and is refused with :class:`~otp.BadArg` at send time.
A :class:`~otp.Crash` arrives on the other node carrying a :class:`RemoteException` (the type name,
message and traceback text of the original).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import wire

from ._errors import BadArg
from ._ids import Pid, Ref
from ._reasons import BadReturnValue, Crash, ExitStatus, Shutdown, Signaled

if TYPE_CHECKING:
    from ._node import Node


class RemoteException(Exception):
    """An exception that crashed a process on another node, as data: its type's name, its
    message and its traceback text."""

    def __init__(self, type_name: str, message: str, traceback: str = "") -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = traceback


_SCALARS = (type(None), bool, int, float, str, bytes)

#: Reasons that are plain atoms travel as ExitReason(kind) with no detail.
_ATOM_REASONS = frozenset({"normal", "shutdown", "kill", "killed", "noproc", "noconnection"})


#: otp's exit reason classes: they cross as wire exit reasons, wherever they are in a message.
_REASON_CLASSES = frozenset({Shutdown, Crash, BadReturnValue, ExitStatus, Signaled})

_WIRE_IDS: dict[Pid | Ref, Any] = {}


def wire_id(value: Pid | Ref) -> Any:
    """The wire form of a pid or ref, cached: the same few pids send most messages, and a call's
    ref crosses three times (MONITOR, the request, DEMONITOR); the wire classes validate."""
    made = _WIRE_IDS.get(value)
    if made is None:
        if len(_WIRE_IDS) >= 4096:
            _WIRE_IDS.clear()
        # Made without the wire classes' validators: a Pid or Ref's fields were checked where
        # it was made (our node's name and counters, or a peer's decoded frame).
        made = object.__new__(wire.Pid if value.__class__ is Pid else wire.Ref)
        _set_field(made, "node", value.node)
        _set_field(made, "id", value.id)
        _set_field(made, "creation", value.creation)
        _WIRE_IDS[value] = made
    return made


_set_field = object.__setattr__


def ref_from_wire(value: wire.Ref) -> Ref:
    """The ref a peer sent, its wire form remembered: a call's tag goes back in the reply."""
    ref = Ref._make(value.node, value.id, value.creation)
    if len(_WIRE_IDS) >= 4096:
        _WIRE_IDS.clear()
    _WIRE_IDS[ref] = value
    return ref


def reason_to_wire(reason: Any) -> wire.ExitReason:
    """An exit reason as a wire ``ExitReason``."""
    if isinstance(reason, str) and reason in _ATOM_REASONS:
        return wire.ExitReason(reason)
    if isinstance(reason, Shutdown):
        return wire.ExitReason("shutdown", value_to_wire(reason.detail))
    if isinstance(reason, Crash):
        return wire.ExitReason("crash", error_to_wire(reason.exception))
    if isinstance(reason, BadReturnValue):
        return wire.ExitReason("bad_return_value", _safe(reason.value))
    if isinstance(reason, ExitStatus):
        return wire.ExitReason("exit_status", reason.status)
    if isinstance(reason, Signaled):
        return wire.ExitReason("signal", reason.signal)
    return wire.ExitReason("term", _safe(reason))


def reason_from_wire(reason: wire.ExitReason, node: Node) -> Any:
    kind, detail = reason.kind, reason.detail
    if kind == "shutdown" and detail is not None:
        return Shutdown(value_from_wire(detail, node))
    if kind == "crash" and isinstance(detail, wire.ErrorValue):
        return Crash(RemoteException(detail.type, detail.message, detail.traceback))
    if kind == "bad_return_value":
        return BadReturnValue(value_from_wire(detail, node))
    if kind == "term":
        return value_from_wire(detail, node)
    if kind == "exit_status" and type(detail) is int:
        return ExitStatus(detail)
    if kind == "signal" and type(detail) is str:
        return Signaled(detail)
    return kind


def error_to_wire(exc: BaseException) -> wire.ErrorValue:
    if isinstance(exc, RemoteException):
        return wire.ErrorValue(exc.type_name, exc.message, {}, exc.remote_traceback)
    return wire.ErrorValue(type(exc).__name__, str(exc), {}, Crash(exc).traceback)


def _safe(value: Any) -> Any:
    """A value for a reason's detail: converted if it can be, else its repr (a reason must
    always be able to cross, or links would silently not fire)."""
    try:
        return value_to_wire(value)
    except BadArg:
        return repr(value)


def value_to_wire(value: Any) -> Any:
    """Convert a message to wire values.

    Raises:
        BadArg: a part of it cannot cross a node boundary (say, an arbitrary object).
    """
    cls = value.__class__
    if cls in _SCALARS:
        return value
    if cls is Pid or cls is Ref:
        return wire_id(value)
    if cls is list:
        return [value_to_wire(item) for item in value]
    if cls is tuple:
        return tuple(value_to_wire(item) for item in value)
    if cls is dict:
        return {value_to_wire(k): value_to_wire(v) for k, v in value.items()}
    if cls in _REASON_CLASSES:
        return reason_to_wire(value)
    if cls in (wire.Atom, wire.ExitReason, wire.ErrorValue):
        return value
    raise BadArg(
        f"a {cls.__qualname__} cannot be sent to another node: messages between nodes hold"
        " None, bool, int, float, str, bytes, list, tuple, dict, Pid, Ref and exit reasons"
    )


def value_from_wire(value: Any, node: Node) -> Any:
    """Convert wire values back: wire pids of this node become its live local pids."""
    cls = value.__class__
    if cls in _SCALARS:
        return value
    if cls is wire.Pid:
        return pid_from_wire(value, node)
    if cls is wire.Ref:
        return Ref._make(value.node, value.id, value.creation)
    if cls is list:
        return [value_from_wire(item, node) for item in value]
    if cls is tuple:
        return tuple(value_from_wire(item, node) for item in value)
    if cls is dict:
        return {value_from_wire(k, node): value_from_wire(v, node) for k, v in value.items()}
    if cls is wire.ExitReason:
        return reason_from_wire(value, node)
    if cls is wire.ErrorValue:
        return RemoteException(value.type, value.message, value.traceback)
    return value


def pid_from_wire(value: wire.Pid, node: Node) -> Pid:
    if value.node == node.name and value.creation == node.creation:
        proc = node.processes.get(value.id)
        if proc is not None:
            return proc.pid
    return Pid._make(value.node, value.id, value.creation)
