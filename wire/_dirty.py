"""Gunicorn 27's dirty protocol messages (wire version 1): builders, typed parse results, ids.

Mirrors ``gunicorn.dirty.protocol`` (``encode_request``, ``make_stash_message``, ...) with one
difference in spirit: a reply's request id is checked against the request (:func:`check_reply`),
where Gunicorn relies on one request in flight per connection.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._errors import MalformedMessage, RequestIdMismatch
from ._frame import Frame, MessageType

__all__ = [
    "Chunk",
    "End",
    "ErrorReply",
    "Manage",
    "ManageOp",
    "Request",
    "Response",
    "Stash",
    "StashOp",
    "Status",
    "check_reply",
    "make_chunk",
    "make_end",
    "make_error",
    "make_manage",
    "make_request",
    "make_response",
    "make_stash",
    "make_status",
    "parse_dirty",
    "request_id_from_str",
]

_U64_MASK = 0xFFFFFFFFFFFFFFFF


class StashOp(enum.IntEnum):
    """Stash (shared table) operation codes of a STASH frame's ``op``."""

    PUT = 1
    GET = 2
    DELETE = 3
    KEYS = 4
    CLEAR = 5
    INFO = 6
    ENSURE = 7
    DELETE_TABLE = 8
    TABLES = 9
    EXISTS = 10


class ManageOp(enum.IntEnum):
    """Worker management operation codes of a MANAGE frame's ``op``."""

    ADD = 1
    REMOVE = 2


def request_id_from_str(request_id: str) -> int:
    """Gunicorn's mapping of a str request id (its clients use ``str(uuid4())``) to a u64.

    This is ``hash(request_id) & 0xFFFFFFFFFFFFFFFF``, so it depends on the process's
    ``PYTHONHASHSEED``: only the process that made the id can map it again. Our own ids are ints.
    """
    return hash(request_id) & _U64_MASK


def make_request(
    request_id: int,
    app_path: str,
    action: str,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> Frame:
    """A REQUEST frame: ``{app_path, action, args, kwargs}`` in that order, as Gunicorn sends."""
    payload = {
        "app_path": app_path,
        "action": action,
        "args": list(args),
        "kwargs": dict(kwargs) if kwargs else {},
    }
    return Frame(MessageType.REQUEST, request_id, payload)


def make_response(request_id: int, result: Any) -> Frame:
    """A RESPONSE frame: ``{result}``."""
    return Frame(MessageType.RESPONSE, request_id, {"result": result})


def make_error(
    request_id: int, error_type: str, message: str, details: Mapping[str, Any] | None = None
) -> Frame:
    """An ERROR frame: ``{error: {error_type, message, details}}`` (Gunicorn's ``to_dict``)."""
    error = {"error_type": error_type, "message": message, "details": dict(details or {})}
    return Frame(MessageType.ERROR, request_id, {"error": error})


def make_chunk(request_id: int, data: Any) -> Frame:
    """A CHUNK frame of a streamed response: ``{data}``."""
    return Frame(MessageType.CHUNK, request_id, {"data": data})


def make_end(request_id: int) -> Frame:
    """The END frame closing a streamed response (empty payload)."""
    return Frame(MessageType.END, request_id)


def make_stash(
    request_id: int,
    op: StashOp | int,
    table: str,
    key: Any = None,
    value: Any = None,
    pattern: str | None = None,
) -> Frame:
    """A STASH frame: ``{op, table[, key][, value][, pattern]}``, omitting ``None`` ones."""
    payload: dict[str, Any] = {"op": int(op), "table": table}
    if key is not None:
        payload["key"] = key
    if value is not None:
        payload["value"] = value
    if pattern is not None:
        payload["pattern"] = pattern
    return Frame(MessageType.STASH, request_id, payload)


def make_status(request_id: int) -> Frame:
    """A STATUS query frame (empty payload)."""
    return Frame(MessageType.STATUS, request_id)


def make_manage(request_id: int, op: ManageOp | int, count: int = 1) -> Frame:
    """A MANAGE frame: ``{op, count}``."""
    return Frame(MessageType.MANAGE, request_id, {"op": int(op), "count": count})


@attrs.frozen
class Request:
    """A parsed REQUEST."""

    request_id: int
    app_path: str
    action: str
    args: list[Any]
    kwargs: dict[str, Any]


@attrs.frozen
class Response:
    """A parsed RESPONSE."""

    request_id: int
    result: Any


@attrs.frozen
class ErrorReply:
    """A parsed ERROR (Gunicorn's ``DirtyError.to_dict()`` fields)."""

    request_id: int
    error_type: str
    message: str
    details: dict[str, Any]


@attrs.frozen
class Chunk:
    """A parsed CHUNK."""

    request_id: int
    data: Any


@attrs.frozen
class End:
    """A parsed END."""

    request_id: int


@attrs.frozen
class Stash:
    """A parsed STASH; absent optional keys are ``None``."""

    request_id: int
    op: StashOp
    table: str
    key: Any = None
    value: Any = None
    pattern: str | None = None


@attrs.frozen
class Status:
    """A parsed STATUS query."""

    request_id: int


@attrs.frozen
class Manage:
    """A parsed MANAGE."""

    request_id: int
    op: ManageOp
    count: int


DirtyMessage = Request | Response | ErrorReply | Chunk | End | Stash | Status | Manage

_NO_DEFAULT: Any = object()


def _field(
    frame: Frame, name: str, kind: type | tuple[type, ...] | None, default: Any = _NO_DEFAULT
) -> Any:
    payload = frame.payload
    if payload is None or name not in payload:
        if default is not _NO_DEFAULT:
            return default
        raise MalformedMessage(
            f"{frame.type.name} payload lacks the key {name!r} (request_id={frame.request_id})"
        )
    value = payload[name]
    if kind is not None and (not isinstance(value, kind) or (type(value) is bool and kind is int)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise MalformedMessage(
            f"{frame.type.name} payload key {name!r} must be a {names} (got "
            f"{type(value).__name__}, request_id={frame.request_id})"
        )
    return value


def _enum(frame: Frame, enum_type: type[enum.IntEnum], value: int) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        codes = ", ".join(f"{m.value} {m.name}" for m in enum_type)
        raise MalformedMessage(
            f"{frame.type.name} payload key 'op' must be one of {codes} (got {value})"
        ) from None


def _empty(frame: Frame) -> None:
    if frame.payload not in (None, {}):
        raise MalformedMessage(
            f"{frame.type.name} carries no payload (got {type(frame.payload).__name__})"
        )


def parse_dirty(frame: Frame) -> DirtyMessage:
    """Check a dirty-protocol frame's payload shape and return it as a typed message.

    Extra payload keys are ignored (as Gunicorn does); missing or mistyped ones raise.

    Raises:
        MalformedMessage: The payload does not have its message type's shape, or the frame is
            not a dirty-protocol message type.
    """
    rid = frame.request_id
    t = frame.type
    if t is MessageType.REQUEST:
        return Request(
            rid,
            _field(frame, "app_path", str),
            _field(frame, "action", str),
            _field(frame, "args", list),
            _field(frame, "kwargs", dict),
        )
    if t is MessageType.RESPONSE:
        return Response(rid, _field(frame, "result", None))
    if t is MessageType.ERROR:
        error = _field(frame, "error", dict)
        inner = Frame(MessageType.ERROR, rid, error)
        return ErrorReply(
            rid,
            _field(inner, "error_type", str),
            _field(inner, "message", str),
            _field(inner, "details", dict, {}) or {},
        )
    if t is MessageType.CHUNK:
        return Chunk(rid, _field(frame, "data", None))
    if t is MessageType.END:
        _empty(frame)
        return End(rid)
    if t is MessageType.STASH:
        return Stash(
            rid,
            _enum(frame, StashOp, _field(frame, "op", int)),
            _field(frame, "table", str),
            _field(frame, "key", None, None),
            _field(frame, "value", None, None),
            _field(frame, "pattern", str, None),
        )
    if t is MessageType.STATUS:
        _empty(frame)
        return Status(rid)
    if t is MessageType.MANAGE:
        return Manage(
            rid, _enum(frame, ManageOp, _field(frame, "op", int)), _field(frame, "count", int)
        )
    raise MalformedMessage(f"{t.name} is not a dirty-protocol message type")


def check_reply(request_id: int, reply: Frame) -> Frame:
    """Return ``reply`` if it answers ``request_id``.

    Raises:
        RequestIdMismatch: The reply carries another request's id.
    """
    if reply.request_id != request_id:
        raise RequestIdMismatch(
            f"{reply.type.name} carries request id {reply.request_id}, but the request in flight "
            f"has id {request_id}; the connection is out of step, close it"
        )
    return reply
