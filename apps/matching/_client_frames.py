"""The frames of a blocking client's call, made and read straight from their bytes: the M_CALL
it writes (``wire.encode_call``'s bytes) and the M_REPLY that answers a lone caller (a whole
frame, alone in one read of the socket, as ``wire.FrameDecoder`` and ``wire.parse_matching``
read it).

The same bytes, values and errors as wire's own code, for less: a CBOR payload goes through
``wire.cbor_encode`` / ``wire.cbor_decode`` and the 16-byte header (``wire/SPEC.md``) through
``wire.HEADER``, with none of the frame's and message's objects nor their checks and enum
look-ups in between (about 20,000 instructions a call less, of ~90,000). Anything else (a TLV
connection, a read that holds other frames or part of one) goes to wire's own code.
"""

from __future__ import annotations

from typing import Any

import wire

__all__ = ["LIMITS", "encode_call", "lone_reply"]

#: The limits of a client's frames both ways: wire's defaults, which ``wire.cbor_encode`` and
#: ``wire.cbor_decode`` apply when given none (a decode given another ``Limits`` object works
#: out its sizes anew each call).
LIMITS = wire.Limits()

_HEADER_SIZE = wire.HEADER_SIZE
_MAGIC = wire.MAGIC
_CALL_CBOR = int(wire.MessageType.M_CALL) | wire.CBOR_FLAG
_REPLY_CBOR = int(wire.MessageType.M_REPLY) | wire.CBOR_FLAG
_CBOR = wire.Codec.CBOR
_cbor_encode = wire.cbor_encode
_cbor_decode = wire.cbor_decode
_pack = wire.HEADER.pack
_unpack_from = wire.HEADER.unpack_from
_WireError = wire.WireError


def encode_call(op: str, args: dict[str, Any], rid: int, codec: wire.Codec) -> bytes:
    """``wire.encode_call(op, args, rid, codec, limits=LIMITS)``: the same bytes and errors
    (``op``, ``args`` and ``rid`` are the client's own: a non-empty str, a dict, a call id)."""
    if codec is _CBOR:
        body = _cbor_encode({"op": op, "args": args})
        return _pack(_MAGIC, 2, _CALL_CBOR, len(body), rid) + body
    return wire.encode_call(op, args, rid, codec, limits=LIMITS)


def lone_reply(buffer: bytearray, n: int) -> tuple[int, Any] | None:
    """The call id and value of the M_REPLY that ``buffer[:n]`` is, when it is exactly one
    whole CBOR M_REPLY frame whose payload wire reads; else None (wire's decoder is then
    given the bytes, and reads them or names what is wrong)."""
    if n < _HEADER_SIZE:
        return None
    magic, version, code, length, rid = _unpack_from(buffer)
    if code != _REPLY_CBOR or length != n - _HEADER_SIZE or magic != _MAGIC or version != 2:
        return None
    try:
        payload = _cbor_decode(buffer[_HEADER_SIZE:n])
    except _WireError:
        return None
    if type(payload) is not dict or "value" not in payload or not rid:
        return None
    return rid, payload["value"]
