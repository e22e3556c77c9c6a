"""Values across nodes: otp's pids, refs, exit reasons and gen_server envelopes to and from the
plain values of ``wire`` (version 2), so nothing is ever pickled.

A message may hold None, bool, int, float, str, bytes, list, tuple, dict and any of otp's
:class:`~otp.Pid`, :class:`~otp.Ref` and exit reasons (:class:`~otp.Shutdown`, :class:`~otp.Crash`,
a port's :class:`~otp.ExitStatus` and :class:`~otp.Signaled`) nested inside;
values of attrs frozen classes registered with :func:`~otp.remote_value` (``_dist_records``);
anything else cannot leave the node and is refused with :class:`~otp.BadArg` at send time.
A :class:`~otp.Crash` arrives on the other node carrying a :class:`RemoteException` (the type name,
message and traceback text of the original).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import wire

from ._dist_records import RECORD_TAG, UnknownRemoteValue, by_name, refusal, registered
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
    ref crosses two or three times (MONITOR, the request, a DEMONITOR); the wire classes
    validate. The pid converted last is found by identity, without hashing it: a caller's
    own pid, call after call, or a server's caller (which pid_from_wire hands out again)."""
    last = _LAST_WIRE_PID
    if value is last[0]:
        return last[1]
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
        if value.__class__ is Ref:
            # (A call's ref, say: its reply then finds the waiter by identity.)
            _LAST_REF[0] = value
            return made
    if value.__class__ is Pid:
        last[0], last[1] = value, made
    return made


_LAST_WIRE_PID: list[Any] = [None, None]


_set_field = object.__setattr__


def call_ref_to_wire(ref: Ref) -> Any:
    """The wire form of a remote call's new ``ref``: made, not cached (no lookup can find a
    ref just made, and a call answered by its server needs it no more: a DEMONITOR after a
    timeout makes it again); remembered as the ref made last, so the reply's lookups find
    the call's own ref by identity (see ref_from_wire)."""
    made = object.__new__(wire.Ref)
    _set_field(made, "node", ref.node)
    _set_field(made, "id", ref.id)
    _set_field(made, "creation", ref.creation)
    _LAST_REF[0] = ref
    return made


def ref_from_wire(value: wire.Ref) -> Ref:
    """The ref a peer sent, its wire form remembered: a call's tag goes back in the reply.

    The ref made last is handed out again for the same fields: a remote call's MONITOR and
    request carry one ref, and the server's monitor and the call's tag then share one object,
    which the reply's lookups find by identity."""
    last = _LAST_REF[0]
    if last.id == value.id and last.node == value.node and last.creation == value.creation:
        return last
    ref = _LAST_REF[0] = Ref._make(value.node, value.id, value.creation)
    if len(_WIRE_IDS) >= 4096:
        _WIRE_IDS.clear()
    _WIRE_IDS[ref] = value
    return ref


_LAST_REF = [Ref._make("", -1, -1)]


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
        return Shutdown(_detail(detail, node))
    if kind == "crash" and isinstance(detail, wire.ErrorValue):
        return Crash(RemoteException(detail.type, detail.message, detail.traceback))
    if kind == "bad_return_value":
        return BadReturnValue(_detail(detail, node))
    if kind == "term":
        return _detail(detail, node)
    if kind == "exit_status" and type(detail) is int:
        return ExitStatus(detail)
    if kind == "signal" and type(detail) is str:
        return Signaled(detail)
    return kind


def _detail(detail: Any, node: Node) -> Any:
    """A reason's detail; one holding a value this node cannot rebuild becomes the refusal's
    text (an exit signal or DOWN must arrive whatever its reason holds, or links and monitors
    would silently not fire)."""
    try:
        return value_from_wire(detail, node)
    except UnknownRemoteValue as exc:
        return str(exc)


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
    record = registered(cls)
    if record is not None:
        # (checked last: a plain message never pays for it)
        return (
            _RECORD_ATOM,
            record.name,
            {field: value_to_wire(getattr(value, field)) for field, _ in record.fields},
        )
    raise BadArg(
        f"a {cls.__qualname__} cannot be sent to another node: messages between nodes hold"
        " None, bool, int, float, str, bytes, list, tuple, dict, Pid, Ref, exit reasons and"
        f" registered values{refusal(cls)}"
    )


_RECORD_ATOM = wire.Atom(RECORD_TAG)


def _record_from_wire(value: tuple[Any, ...], node: Node) -> Any:
    """A registered value a peer sent: ``(Atom("$record"), name, {field: value})``.

    Raises:
        UnknownRemoteValue: the name is not registered here, or the fields do not fit.
    """
    record = by_name(value[1])
    fields = value[2]
    if fields.__class__ is not dict:
        raise UnknownRemoteValue(record.name, f"its fields are a {type(fields).__name__}")
    aliases = dict(record.fields)
    kwargs = {}
    for field, item in fields.items():
        alias = aliases.get(field) if field.__class__ is str else None
        if alias is None:
            raise UnknownRemoteValue(
                record.name,
                f"field {str(field)[:100]!r} is not one of {record.cls.__qualname__}'s here:"
                " register the same version of the class on both nodes",
            )
        kwargs[alias] = value_from_wire(item, node)
    try:
        return record.cls(**kwargs)
    except (TypeError, ValueError) as exc:
        # Its validators refused it (or a field without a default is missing).
        raise UnknownRemoteValue(record.name, str(exc)[:500]) from exc


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
        if len(value) == 3 and value[0].__class__ is wire.Atom and value[0].name == RECORD_TAG:
            return _record_from_wire(value, node)
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
    last = _LAST_PID
    if value is last[0]:
        # The decoder shares a repeated wire pid (a caller's, call after call): so is the pid
        # made for it, with its hash, and the tables it keys find it by identity.
        pid: Pid = last[1]
        return pid
    pid = Pid._make(value.node, value.id, value.creation)
    last[0], last[1] = value, pid
    return pid


_LAST_PID: list[Any] = [None, None]
