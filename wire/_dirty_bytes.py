"""GD v1 frames built straight to bytes, for the hot paths of the dirty pool, its clients and
workers: no :class:`Frame` is built, and a large ``bytes`` value is sent by reference
(:func:`request_parts`, :func:`reply_parts`: the frame as a list of buffers for ``sendmsg``),
never copied into the encoded frame. The bytes are those of :func:`encode_frame` with
``coerce_keys=True`` (Gunicorn's encoding) for the payloads of :func:`make_request`,
:func:`make_response` and :func:`make_chunk`. The read side: :func:`peek_route` reads a
REQUEST's route (:func:`opens_with`: does another open with the same bytes) and
:func:`big_bytes` a reply's large ``bytes`` value without decoding the rest;
:func:`request_fields` decodes a worker's REQUEST without building its payload dict.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._accel import C
from ._errors import LimitExceeded, WireError
from ._frame import HEADER, MessageType
from ._limits import MAX_PAYLOAD, Limits
from ._tlv import _DEFAULT_FAST_SIZE, tlv_decode
from ._tlv_encode import tlv_encode

__all__ = [
    "BIG_BYTES",
    "big_bytes",
    "encode_dirty",
    "encode_header",
    "fast_opens_with",
    "opens_with",
    "peek_route",
    "reply_parts",
    "request_fields",
    "request_parts",
    "route_length",
]

_U32 = struct.Struct(">I")
_LIMITS = Limits()
REQUEST = int(MessageType.REQUEST)
RESPONSE = int(MessageType.RESPONSE)
CHUNK = int(MessageType.CHUNK)
#: A ``bytes`` value at least this long is sent by reference, not copied into its frame.
BIG_BYTES = 65536


def encode_header(mtype: int, length: int, request_id: int) -> bytes:
    """A GD v1 frame header (the payload's ``length`` bytes follow it)."""
    return HEADER.pack(b"GD", 1, mtype, length, request_id)


_pack = HEADER.pack


def _body(value: Any) -> bytes:
    return tlv_encode(value, version=1, coerce_keys=True)


def _too_big(mtype: int, length: int, limit: int = MAX_PAYLOAD) -> LimitExceeded:
    name = MessageType(mtype).name
    return LimitExceeded(
        f"{name} payload of {length} bytes exceeds max_payload={limit}; split it into CHUNK frames"
    )


def encode_dirty(
    mtype: int, request_id: int, payload: dict[str, Any], max_payload: int = MAX_PAYLOAD
) -> bytes:
    """A GD v1 frame's bytes: ``encode_frame(Frame(mtype, request_id, payload), coerce_keys=True)``
    without building the Frame (in one step where wire's C fast paths are built).

    Args:
        max_payload: The payload's bound (at most 64 MiB): a caller that sends larger payloads
            another way (:func:`reply_parts`) learns early that this one is one.

    Raises:
        WireError: The payload cannot be encoded or exceeds ``max_payload``.
    """
    if _frame is not None and max_payload <= MAX_PAYLOAD:
        data = _frame(mtype, request_id, payload, _DEPTH, _ITEMS, _TOTAL, _STR, max_payload)
        if data is not None:
            return data
    body = _body(payload)
    limit = min(max_payload, MAX_PAYLOAD)
    if len(body) > limit:
        raise _too_big(mtype, len(body), limit)
    return _pack(b"GD", 1, mtype, len(body), request_id) + body


#: The C encoder of :func:`encode_dirty` (None where wire's C fast paths are off), and the
#: default limits it is given (those of ``_body``'s ``tlv_encode``).
_frame = None if C is None else C.gd1_frame
_DEPTH, _ITEMS, _TOTAL, _STR = (
    _LIMITS.max_depth,
    _LIMITS.max_items,
    _LIMITS.max_total_items,
    _LIMITS.max_str,
)
_SCALARS = (str, int, float, bool, type(None))
_DICT4 = b"\x21\x00\x00\x00\x04"
_DICT1 = b"\x21\x00\x00\x00\x01"
_K_APP = _body("app_path")
_K_ACTION = _body("action")
_K_ARGS = _body("args")
_K_KWARGS = _body("kwargs")


def _big_ok(value: Any) -> bool:
    return type(value) is bytes and BIG_BYTES <= len(value) <= _LIMITS.max_str


def _leaf(value: Any, parts: list[Any], pending: bytearray) -> bytearray:
    """Add one scalar (or a big bytes, by reference) to ``parts``/``pending``."""
    if type(value) is bytes and len(value) >= BIG_BYTES:
        pending += struct.pack(">BI", 0x10, len(value))
        parts.append(bytes(pending))
        parts.append(value)
        return bytearray()
    pending += _body(value)
    return pending


def _scatter(mtype: int, request_id: int, prefix: bytes, values: Iterable[Any]) -> list[Any]:
    parts: list[Any] = [b""]
    pending = bytearray(prefix)
    pending = _fill(values, parts, pending)
    if pending:
        parts.append(bytes(pending))
    length = sum(len(p) for p in parts)
    if length > MAX_PAYLOAD:
        raise _too_big(mtype, length)
    parts[0] = _pack(b"GD", 1, mtype, length, request_id)
    return parts


def _fill(values: Iterable[Any], parts: list[Any], pending: bytearray) -> bytearray:
    for item in values:
        if type(item) is bytearray:  # a pre-encoded run (keys, container heads)
            pending += item
        else:
            pending = _leaf(item, parts, pending)
    return pending


def request_parts(
    request_id: int,
    app_path: str,
    action: str,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> list[Any]:
    """A REQUEST frame (:func:`make_request`'s payload) as buffers whose concatenation is its
    encoding; one buffer unless an argument is a large ``bytes`` (sent by reference).

    Raises:
        WireError: An argument cannot be encoded, or the payload exceeds 64 MiB.
    """
    args = list(args)
    kwargs = dict(kwargs) if kwargs else {}
    big = False
    for a in args:
        if type(a) is bytes and len(a) >= BIG_BYTES:
            big = True
            break
    else:
        for a in kwargs.values():
            if type(a) is bytes and len(a) >= BIG_BYTES:
                big = True
                break
    if (
        not big
        or not (any(_big_ok(a) for a in args) or any(_big_ok(v) for v in kwargs.values()))
        or type(app_path) is not str
        or type(action) is not str
        or len(args) > _LIMITS.max_items
        or len(kwargs) > _LIMITS.max_items
        or not all(type(a) in _SCALARS or type(a) is bytes for a in args)
        or not all(type(k) is str for k in kwargs)
        or not all(type(v) in _SCALARS or type(v) is bytes for v in kwargs.values())
    ):
        payload = {"app_path": app_path, "action": action, "args": args, "kwargs": kwargs}
        return [encode_dirty(REQUEST, request_id, payload)]
    values: list[Any] = [bytearray(_K_APP + _body(app_path) + _K_ACTION + _body(action) + _K_ARGS)]
    values.append(bytearray(struct.pack(">BI", 0x20, len(args))))
    values.extend(args)
    values.append(bytearray(_K_KWARGS + struct.pack(">BI", 0x21, len(kwargs))))
    for key, value in kwargs.items():
        values.append(bytearray(_body(key)))
        values.append(value)
    return _scatter(REQUEST, request_id, _DICT4, values)


_KEYS = {RESPONSE: _body("result"), CHUNK: _body("data")}
_NAMES = {RESPONSE: "result", CHUNK: "data"}


def reply_parts(mtype: int, request_id: int, value: Any) -> list[Any]:
    """A RESPONSE (``{result: value}``) or CHUNK (``{data: value}``) frame as buffers; a large
    ``bytes`` value is sent by reference.

    Raises:
        WireError: The value cannot be encoded, or the payload exceeds 64 MiB.
    """
    if _big_ok(value):
        return _scatter(mtype, request_id, _DICT1 + _KEYS[mtype], (value,))
    return [encode_dirty(mtype, request_id, {_NAMES[mtype]: value})]


_BYTES_HEADS = {t: _DICT1 + _KEYS[t] + b"\x10" for t in (RESPONSE, CHUNK)}


def big_bytes(mtype: int, view: memoryview, start: int, stop: int) -> bytes | None:
    """The value of a RESPONSE/CHUNK payload ``view[start:stop]`` that is exactly one large
    ``bytes`` (``{result: b"..."}``, as :func:`reply_parts` sends it), copied straight out of
    the buffer (one copy instead of two); None for any other payload."""
    head = _BYTES_HEADS.get(mtype)
    if head is None or stop - start < BIG_BYTES:
        return None
    body = start + len(head) + 4
    if view[start : body - 4] != head or _U32.unpack_from(view, body - 4)[0] != stop - body:
        return None
    return bytes(view[body:stop])


def route_length(app_path: str, action: str) -> int:
    """How many bytes of a REQUEST payload :func:`peek_route` read to find ``(app_path,
    action)``: any payload opening with those same bytes has the same route (a reader of many
    requests may keep them and compare, instead of reading each route again)."""
    return 15 + len(_K_APP) + len(_K_ACTION) + len(app_path.encode()) + len(action.encode())


def opens_with(buf: bytes | bytearray, start: int, stop: int, prefix: bytes) -> bool:
    """Whether ``buf[start:stop]`` opens with ``prefix`` (``buf.startswith(prefix, start,
    stop)``): a reader of many requests comparing one with the :func:`route_length` bytes of the
    route it read last."""
    return buf.startswith(prefix, start, stop)


#: :func:`opens_with` in one C call where wire's fast paths are built (``startswith`` parses its
#: arguments through a format string it builds on every call); there it returns None where
#: ``buf`` is not a bytes or bytearray, ``prefix`` not a bytes, or a bound not an int (the
#: caller then calls :func:`opens_with`, or, for whom a no is always safe, takes it as one).
fast_opens_with: Callable[[Any, int, int, bytes], bool | None] = (
    opens_with if C is None else C.gd1_opens
)


def peek_route(view: memoryview, start: int, stop: int) -> tuple[str, str] | None:
    """``(app_path, action)`` of a REQUEST payload that opens with them as str values (as
    Gunicorn's client and ours encode it), read without decoding the rest; None otherwise
    (the caller decodes the payload). The rest is checked where it is decoded (the worker)."""
    try:
        if view[start] != 0x21 or _U32.unpack_from(view, start + 1)[0] < 2:
            return None
        pos = start + 5
        found = []
        for key in (_K_APP, _K_ACTION):
            end = pos + len(key)
            if view[pos:end] != key or view[end] != 0x11:
                return None
            n = _U32.unpack_from(view, end + 1)[0]
            pos = end + 5 + n
            if pos > stop or n > _LIMITS.max_str:
                return None
            found.append(str(view[end + 5 : pos], "utf-8"))
    except (IndexError, UnicodeDecodeError, struct.error):
        return None
    return found[0], found[1]


#: What :func:`request_fields` returns: a REQUEST's app_path, action, args and kwargs.
RequestFields = tuple[str, str, list[Any], dict[str, Any]]
_REQUEST_KEYS = frozenset(("app_path", "action", "args", "kwargs"))


def _request_fields(buffer: Any, start: int, stop: int) -> RequestFields | None:
    """A REQUEST payload ``buffer[start:stop]`` decoded for a worker: ``(app_path, action,
    args, kwargs)`` when it is a TLV dict of exactly those four keys (in any order), app_path
    and action str, args a list and kwargs a dict, as every client sends it; None for anything
    else (the caller decodes it its own way, which names what is wrong)."""
    try:
        payload = tlv_decode(memoryview(buffer)[start:stop], version=1)
    except WireError:
        return None
    if type(payload) is not dict or payload.keys() != _REQUEST_KEYS:
        return None
    fields = payload["app_path"], payload["action"], payload["args"], payload["kwargs"]
    if type(fields[0]) is str and type(fields[1]) is str and type(fields[2]) is list:
        if type(fields[3]) is dict:
            return fields
    return None


#: :func:`_request_fields` in one C call where wire's C fast paths are built (it builds no
#: dict of the payload, and the same app_path and action come back as the same str objects;
#: a payload past the fast decoder's size is left to the caller's own decoding).
request_fields: Callable[[Any, int, int], RequestFields | None] = (
    _request_fields
    if C is None
    else functools.partial(C.gd1_request, _LIMITS.max_depth, _LIMITS.max_items, _DEFAULT_FAST_SIZE)
)
