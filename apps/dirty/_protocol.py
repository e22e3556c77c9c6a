"""The dirty pool's use of GD v1 (the framing itself is ``wire``'s: ``wire.FrameBuffer``,
``wire.request_parts``, ...): message type numbers as plain ints for the hot paths, errors as
ERROR frames, payloads decoded into :class:`DirtyProtocolError` on failure, and the node <->
worker notices that are private to the pool (a call queued or started in a worker thread).
"""

from __future__ import annotations

from typing import Any

import wire

from ._errors import DirtyError, DirtyProtocolError

REQUEST = int(wire.MessageType.REQUEST)
RESPONSE = int(wire.MessageType.RESPONSE)
ERROR = int(wire.MessageType.ERROR)
CHUNK = int(wire.MessageType.CHUNK)
END = int(wire.MessageType.END)
STASH = int(wire.MessageType.STASH)
STATUS = int(wire.MessageType.STATUS)
MANAGE = int(wire.MessageType.MANAGE)


def encode(frame: wire.Frame) -> bytes:
    """A frame's bytes (Gunicorn's encoding; non-str dict keys are ``str()``-ed as it does)."""
    return wire.encode_frame(frame, coerce_keys=True)


def _body(value: Any) -> bytes:
    return wire.tlv_encode(value, version=1, coerce_keys=True)


def error_bytes(rid: int, error: DirtyError) -> bytes:
    """An ERROR frame for ``rid``; the caller gets it whatever the error's text holds.

    Text that is not valid UTF-8 (a lone surrogate: an OS file name or path decoded with
    ``surrogateescape``) goes backslash-escaped, and a detail that still cannot be encoded is
    left out.
    """
    e = error.to_dict()
    try:
        return encode(wire.make_error(rid, e["error_type"], e["message"], e["details"]))
    except wire.WireError:
        pass
    details: dict[str, Any] = {}
    for key, value in e["details"].items():
        value = _escaped(value) if isinstance(value, str) else value
        try:
            _body(value)
        except wire.WireError:
            continue
        details[_escaped(str(key))] = value
    return encode(wire.make_error(rid, e["error_type"], _escaped(e["message"]), details))


def _escaped(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


#: Worker -> node notices (private to the pool): a STATUS frame carrying a request's id says
#: the request waits for a free thread (``QUEUED``) or has started in one (``STARTED``), so
#: ``dirty_timeout`` charges a call only for the time it runs.
QUEUED = _body("queued")
STARTED = _body("started")


def notice(body: bytes, request_id: int) -> bytes:
    """The STATUS notice ``body`` (``QUEUED`` or ``STARTED``) for ``request_id``."""
    return wire.encode_header(STATUS, len(body), request_id) + body


def decode_payload(payload: bytes | bytearray | memoryview) -> Any:
    """Decode a v1 payload (empty -> None).

    Raises:
        DirtyProtocolError: The payload is not one valid TLV dict.
    """
    if not payload:
        return None
    try:
        value = wire.tlv_decode(payload, version=1)  # (the default limits: its fast path)
    except wire.WireError as exc:
        raise DirtyProtocolError(f"malformed payload: {exc}") from exc
    if type(value) is not dict:
        raise DirtyProtocolError(f"a payload must be a dict (got {type(value).__name__})")
    return value
