"""The plain values ``wire`` version 2 adds for actors: pids, refs, atoms, exit reasons, errors.

They mirror Erlang's external term format (``PID_EXT``, ``REF_EXT``, ``ATOM_UTF8_EXT``) with the
smallest field sets a distribution layer needs; ``otp`` converts its own handles to and from them.
Tuples are Python ``tuple`` and big integers are Python ``int``; those need no class.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._errors import InvalidUtf8, InvalidValue, ValueOutOfRange

__all__ = ["MAX_NAME_BYTES", "Atom", "ErrorValue", "ExitReason", "Pid", "Ref"]

#: Longest atom, node name or exit-reason kind, in UTF-8 bytes (Erlang's atom limit is 255).
MAX_NAME_BYTES = 255
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1


def _check_name(owner: str, field: str, value: object) -> None:
    if type(value) is not str:
        raise InvalidValue(f"{owner}.{field} must be a str (got {type(value).__name__})")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidUtf8(
            f"{owner}.{field} must be encodable as UTF-8 (got {value!r}: {exc.reason})"
        ) from exc
    if size > MAX_NAME_BYTES:
        raise InvalidValue(
            f"{owner}.{field} must be at most {MAX_NAME_BYTES} UTF-8 bytes (got {size})"
        )


def _check_uint(owner: str, field: str, value: object, maximum: int, bits: int) -> None:
    if type(value) is not int:
        raise InvalidValue(f"{owner}.{field} must be an int (got {type(value).__name__})")
    if not 0 <= value <= maximum:
        raise ValueOutOfRange(
            f"{owner}.{field} must be an unsigned {bits}-bit int, 0..{maximum} (got {value})"
        )


def _node(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_name(type(inst).__name__, attribute.name, value)


def _u64(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_uint(type(inst).__name__, attribute.name, value, _U64_MAX, 64)


def _u32(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_uint(type(inst).__name__, attribute.name, value, _U32_MAX, 32)


@attrs.frozen
class Pid:
    """A process identifier as it travels between nodes.

    Attributes:
        node: The node's name (UTF-8, at most 255 bytes), e.g. ``"a@host"``.
        id: The process number on that node, unsigned 64-bit.
        creation: The node incarnation, unsigned 32-bit, so pids of a restarted node differ.
    """

    node: str = attrs.field(validator=_node)
    id: int = attrs.field(validator=_u64)
    creation: int = attrs.field(default=0, validator=_u32)


@attrs.frozen
class Ref:
    """A unique reference (monitor refs, call tags) as it travels between nodes.

    Attributes:
        node: The name of the node that made the reference.
        id: The reference number on that node, unsigned 64-bit.
        creation: The node incarnation, unsigned 32-bit.
    """

    node: str = attrs.field(validator=_node)
    id: int = attrs.field(validator=_u64)
    creation: int = attrs.field(default=0, validator=_u32)


@attrs.frozen
class Atom:
    """An Erlang atom: an interned name distinct from a string (``Atom("ok") != "ok"``).

    Attributes:
        name: The atom's text, at most 255 UTF-8 bytes.
    """

    name: str = attrs.field(validator=_node)


def _kind(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    _check_name("ExitReason", "kind", value)
    if not value:
        raise InvalidValue('ExitReason.kind must be a non-empty name such as "normal" (got "")')


@attrs.frozen
class ExitReason:
    """Why a process exited, in OTP's taxonomy.

    Well-known kinds are ``normal``, ``shutdown``, ``kill``, ``killed``, ``noproc``,
    ``noconnection`` and ``crash``; any other non-empty name is allowed (an Erlang exit reason may
    be any term).

    Attributes:
        kind: The reason's name.
        detail: Any wire value: ``None``, the ``shutdown`` detail, or for ``crash`` usually an
            :class:`ErrorValue` describing the exception.
    """

    kind: str = attrs.field(validator=_kind)
    detail: Any = None


def _str_field(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not str:
        raise InvalidValue(
            f"ErrorValue.{attribute.name} must be a str (got {type(value).__name__})"
        )


def _dict_field(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not dict:
        raise InvalidValue(f"ErrorValue.details must be a dict (got {type(value).__name__})")


@attrs.frozen
class ErrorValue:
    """An exception as data: what crossed the wire instead of a pickled exception object.

    Attributes:
        type: The exception's type name, e.g. ``"ValueError"``.
        message: ``str(exception)``.
        details: A dict of further wire values (application specific).
        traceback: The formatted traceback text, or ``""``.
    """

    type: str = attrs.field(validator=_str_field)
    message: str = attrs.field(validator=_str_field)
    details: dict[Any, Any] = attrs.field(factory=dict, validator=_dict_field)
    traceback: str = attrs.field(default="", validator=_str_field)


def trusted_pid(node: str, id: int, creation: int) -> Pid:
    """A :class:`Pid` from fields a decoder has already checked (no validators run)."""
    pid = object.__new__(Pid)
    object.__setattr__(pid, "node", node)
    object.__setattr__(pid, "id", id)
    object.__setattr__(pid, "creation", creation)
    return pid


def trusted_ref(node: str, id: int, creation: int) -> Ref:
    """A :class:`Ref` from fields a decoder has already checked (no validators run)."""
    ref = object.__new__(Ref)
    object.__setattr__(ref, "node", node)
    object.__setattr__(ref, "id", id)
    object.__setattr__(ref, "creation", creation)
    return ref
