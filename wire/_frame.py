"""Frames: the 16-byte "GD" header of Gunicorn's dirty protocol, and the sans-IO frame decoder.

Version 1 frames are Gunicorn 27's dirty protocol byte for byte; version 2 frames share the
header, add message types for distribution and the matching service, and flag a CBOR payload
with the type byte's high bit. :class:`FrameDecoder` is incremental and does no I/O: feed it
bytes, get frames back.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

import attrs

from ._cbor import cbor_decode, cbor_encode
from ._cbor import fast_size as _cbor_fast_size
from ._errors import (
    BadMagic,
    InvalidValue,
    LimitExceeded,
    MalformedMessage,
    TrailingBytes,
    Truncated,
    UnknownMessageType,
    UnsupportedVersion,
    ValueOutOfRange,
    WireError,
)
from ._limits import Limits
from ._tlv import _C, _decode_at, _fast_size
from ._tlv_encode import _encode_into

__all__ = [
    "CBOR_FLAG",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "Codec",
    "Frame",
    "FrameDecoder",
    "MessageType",
    "encode_frame",
    "encode_message",
]

MAGIC = b"GD"
HEADER_SIZE = 16
#: In a version 2 header, this bit of the type byte marks a CBOR payload (clear: TLV).
CBOR_FLAG = 0x80
#: The 16-byte header (``SPEC.md``): magic, version, type (``| CBOR_FLAG`` for a version 2
#: CBOR payload), payload length, request id; for code that reads or writes headers itself.
HEADER = struct.Struct(">2sBBIQ")
_U64_MAX = (1 << 64) - 1
_DEFAULT_LIMITS = Limits()


class MessageType(enum.IntEnum):
    """Frame message types.

    0x01..0x12 are Gunicorn's dirty protocol (versions 1 and 2); 0x20..0x2E are distribution
    messages (version 2 only; 0x2F..0x3F reserved for distribution); 0x40..0x53 are the
    matching service's messages (version 2 only, ``M_`` names, see ``wire/_matching.py``;
    0x54..0x5F reserved for the matching service); 0x60..0x7F are reserved.
    """

    REQUEST = 0x01
    RESPONSE = 0x02
    ERROR = 0x03
    CHUNK = 0x04
    END = 0x05
    STASH = 0x10
    STATUS = 0x11
    MANAGE = 0x12
    HANDSHAKE = 0x20
    SEND = 0x21
    REG_SEND = 0x22
    LINK = 0x23
    UNLINK = 0x24
    EXIT = 0x25
    MONITOR = 0x26
    DEMONITOR = 0x27
    DOWN = 0x28
    PING = 0x29
    PONG = 0x2A
    EXIT2 = 0x2B
    SEND_BATCH = 0x2C
    REG_SEND_BATCH = 0x2D
    MONITOR_SEND = 0x2E
    M_HELLO = 0x40
    M_WELCOME = 0x41
    M_REGISTER = 0x42
    M_REGISTERED = 0x43
    M_REJECTED = 0x44
    M_TASK = 0x45
    M_ACCEPT = 0x46
    M_DECLINE = 0x47
    M_OUTPUT = 0x48
    M_RESULT = 0x49
    M_FAILURE = 0x4A
    M_PING = 0x4B
    M_PONG = 0x4C
    M_DRAINING = 0x4D
    M_RECONNECT = 0x4E
    M_CLOSE = 0x4F
    M_CALL = 0x50
    M_REPLY = 0x51
    M_ERROR = 0x52
    M_CANCEL = 0x53


class Codec(enum.Enum):
    """How a frame's payload is encoded. Version 1 frames are always TLV."""

    TLV = "tlv"
    CBOR = "cbor"


#: The codecs, read once for encode_message: a member of an Enum class costs a metaclass
#: lookup (~800 instructions in 3.11), a module global a dict probe.
_TLV, _CBOR = Codec.TLV, Codec.CBOR

_V1_TYPES = {int(t): t for t in MessageType if t < 0x20}
_V2_TYPES = {int(t): t for t in MessageType}


def _check_type(inst: Frame, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not MessageType:
        raise UnknownMessageType(
            f"Frame.type must be a MessageType (got {value!r}); use MessageType(code)"
        )


def _check_version(inst: Frame, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in (1, 2) or type(value) is not int:
        raise UnsupportedVersion(f"Frame.version must be 1 or 2 (got {value!r})")


def _check_request_id(inst: Frame, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or not 0 <= value <= _U64_MAX:
        raise ValueOutOfRange(
            f"Frame.request_id must be an int 0..2**64-1 (got {value!r}); for Gunicorn's str "
            "ids use request_id_from_str()"
        )


@attrs.frozen
class Frame:
    """One message: header fields plus the decoded payload.

    Attributes:
        type: The message type.
        request_id: The unsigned 64-bit request id (0 where a message type has none).
        payload: The payload value; ``None`` means an empty payload (length 0). Version 1
            payloads are a dict or ``None``.
        version: 1 (Gunicorn's dirty protocol) or 2.
        codec: How the payload is (or was) encoded; CBOR only in version 2.
    """

    type: MessageType = attrs.field(validator=_check_type)
    request_id: int = attrs.field(default=0, validator=_check_request_id)
    payload: Any = None
    version: int = attrs.field(default=1, validator=_check_version)
    codec: Codec = attrs.field(default=Codec.TLV)

    def __attrs_post_init__(self) -> None:
        if self.version == 1:
            if self.type >= 0x20:
                raise UnknownMessageType(
                    f"message type {self.type.name} exists only in version 2 (got version=1)"
                )
            if self.codec is not Codec.TLV:
                raise InvalidValue("version 1 frames are always TLV (got codec=Codec.CBOR)")
        elif type(self.codec) is not Codec:
            raise InvalidValue(f"Frame.codec must be a Codec (got {self.codec!r})")


def encode_frame(
    frame: Frame,
    *,
    codec: Codec | None = None,
    coerce_keys: bool = False,
    limits: Limits = _DEFAULT_LIMITS,
) -> bytes:
    """Encode a frame: header plus payload.

    Args:
        frame: The frame.
        codec: Encode a version 2 payload with this codec instead of ``frame.codec``.
        coerce_keys: Version 1 compatibility mode: non-str dict keys become ``str(key)``.
        limits: Limits the peer enforces; ``max_payload`` is checked on the encoded payload.

    Returns:
        The frame's bytes.

    Raises:
        WireError: The payload cannot be encoded (see :func:`tlv_encode`), a version 1 payload
            is not a dict, the payload exceeds ``limits.max_payload``, or ``codec`` is not a
            :class:`Codec` (:class:`InvalidValue`).
    """
    if codec is None or frame.version == 1:
        codec = frame.codec
    return _encode(
        frame.type, frame.request_id, frame.payload, frame.version, codec, coerce_keys, limits
    )


def encode_message(
    type: MessageType,
    payload: Any,
    *,
    codec: Codec = Codec.TLV,
    request_id: int = 0,
    limits: Limits = _DEFAULT_LIMITS,
) -> bytes:
    """Encode a version 2 frame straight from its parts, without building a :class:`Frame`
    (the hot path of distribution, which sends one frame per message).

    Raises:
        ValueOutOfRange: ``request_id`` is not an int 0..2**64-1.
        WireError: as :func:`encode_frame`.
    """
    if type.__class__ is not MessageType:
        raise UnknownMessageType(f"type must be a MessageType (got {type!r})")
    tlv = codec is _TLV
    if _C is not None and payload is not None and (tlv or codec is _CBOR):
        # The common case in one step (what _encode does through _encode_into or
        # cbor_encode): the C encoder checks every limit, max_payload included, or hands the
        # payload back.
        limited = (
            limits.max_depth,
            limits.max_items,
            limits.max_total_items,
            limits.max_str,
            limits.max_payload,
        )
        body = _C.tlv_encode(payload, True, *limited) if tlv else _C.cbor_encode(payload, *limited)
        if body is not None:
            try:
                return (
                    HEADER.pack(MAGIC, 2, type if tlv else type | CBOR_FLAG, len(body), request_id)
                    + body
                )
            except struct.error:
                raise _bad_request_id(request_id) from None
    return _encode(type, request_id, payload, 2, codec, False, limits)


def _encode(
    type: MessageType,
    request_id: int,
    payload: Any,
    version: int,
    codec: Codec,
    coerce_keys: bool,
    limits: Limits,
) -> bytes:
    mtype = int(type)
    if payload is None:
        body = b""
        if codec is Codec.CBOR:
            mtype |= CBOR_FLAG
        elif codec is not Codec.TLV:
            raise _bad_codec(codec)
    elif codec is Codec.TLV:
        if version == 1 and payload.__class__ is not dict:
            raise MalformedMessage(
                f"a version 1 {type.name} payload must be a dict (got {payload.__class__.__name__})"
            )
        out = bytearray(HEADER_SIZE)
        _encode_into(out, payload, version == 2, coerce_keys, limits)
        length = len(out) - HEADER_SIZE
        if length > limits.max_payload:
            raise LimitExceeded(
                f"{type.name} payload of {length} bytes exceeds max_payload="
                f"{limits.max_payload}; split it into CHUNK frames"
            )
        try:
            HEADER.pack_into(out, 0, MAGIC, version, mtype, length, request_id)
        except struct.error:
            raise _bad_request_id(request_id) from None
        return bytes(out)
    elif codec is Codec.CBOR:
        body = cbor_encode(payload, limits=limits)
        mtype |= CBOR_FLAG
    else:
        raise _bad_codec(codec)
    if len(body) > limits.max_payload:
        raise LimitExceeded(
            f"{type.name} payload of {len(body)} bytes exceeds max_payload="
            f"{limits.max_payload}; split it into CHUNK frames"
        )
    try:
        return HEADER.pack(MAGIC, version, mtype, len(body), request_id) + body
    except struct.error:
        # The only field a caller gives unchecked (encode_message builds no Frame); checked
        # here, where it costs nothing unless it is wrong.
        raise _bad_request_id(request_id) from None


def _bad_request_id(request_id: object) -> ValueOutOfRange:
    return ValueOutOfRange(
        f"request_id must be an int 0..2**64-1 (got {request_id!r}); for Gunicorn's str ids use "
        "request_id_from_str()"
    )


def _bad_codec(codec: object) -> InvalidValue:
    return InvalidValue(
        f"codec must be Codec.TLV or Codec.CBOR (got {codec!r}); a handshake's codec name "
        "converts with Codec(name)"
    )


if _C is not None:
    _C.frames_init(Frame, _V2_TYPES, Codec.TLV, Codec.CBOR)

_new_frame = object.__new__
_set_type = Frame.__dict__["type"].__set__
_set_request_id = Frame.__dict__["request_id"].__set__
_set_payload = Frame.__dict__["payload"].__set__
_set_version = Frame.__dict__["version"].__set__
_set_codec = Frame.__dict__["codec"].__set__


class FrameDecoder:
    """Incremental, sans-IO frame decoder: ``feed(bytes)`` returns the frames completed so far.

    Every header is checked as soon as its 16 bytes arrive (magic, version, type, payload length
    against ``limits.max_payload``), before its payload is buffered; payload values are checked
    against ``limits`` before anything is allocated for them. A malformed input raises a
    :class:`WireError` subclass whose ``offset`` counts from the first byte ever fed; after that
    the stream cannot be resynchronised and every later call raises the same error.

    Args:
        limits: Decoding limits (the ``limits`` attribute; a change applies to the frames
            parsed after it).
        versions: The protocol versions to accept (``{1}`` for a Gunicorn-only endpoint).
    """

    def __init__(
        self, *, limits: Limits = _DEFAULT_LIMITS, versions: frozenset[int] = frozenset({1, 2})
    ) -> None:
        if not versions or not versions <= {1, 2}:
            raise UnsupportedVersion(
                f"versions must be a non-empty subset of {{1, 2}} (got {versions!r})"
            )
        self.limits = limits
        self._versions = versions
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._need = 2
        self._consumed = 0
        self._error: WireError | None = None
        #: The fast decoders' payload sizes for the limits they were worked out for (a frozen
        #: Limits: worked out again only when ``limits`` is replaced, not on every feed).
        self._sizes: tuple[Limits | None, int, int] = (None, -1, -1)
        #: The C loop's arguments for ``limits`` (once ``_parse`` ran it under them): ``feed``
        #: runs it itself then.
        self._c_args: tuple[Limits, Callable[..., int], int, int, int, int, int] | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return self._buffered

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add bytes; return every frame they complete, in order.

        Raises:
            WireError: The input is malformed, now or in an earlier call; see the class docs.
        """
        if self._error is not None:
            raise self._error
        size = len(data)
        if not size:
            return []
        if self._buffered + size < self._need:
            self._chunks.append(bytes(data))
            self._buffered += size
            return []
        if self._chunks:
            self._chunks.append(bytes(data))
            buf = b"".join(self._chunks)
            self._chunks = []
        else:
            buf = bytes(data)
        frames: list[Frame] = []
        try:
            fast = self._c_args
            if fast is not None and fast[0] is self.limits:
                # (``_parse``'s C loop straight, with the arguments it worked out: once a read)
                pos = fast[1](buf, 0, frames, fast[2], fast[3], fast[4], fast[5], fast[6])
                if pos == len(buf):
                    self._need = HEADER_SIZE
                else:
                    pos = self._parse(buf, frames, pos)
            else:
                pos = self._parse(buf, frames)
        except WireError as exc:
            self._error = exc
            if not frames:
                raise
            # Deliver what came before the bad bytes; the error is raised by the next call.
            self._chunks = []
            self._buffered = 0
            return frames
        rest = len(buf) - pos
        self._consumed += pos
        self._buffered = rest
        if rest:
            self._chunks.append(buf[pos:])
        return frames

    def skip(self, n: int) -> None:
        """Count ``n`` bytes of whole frames that were read without this decoder, between two
        feeds (a reader's shortcut for a frame it reads straight from its bytes), so that the
        offsets of later errors still count from the first byte of the stream.

        Raises:
            ValueError: ``n`` is negative, or part of a frame is buffered (bytes read elsewhere
                cannot follow it).
        """
        if n < 0 or self._buffered:
            raise ValueError(
                f"FrameDecoder.skip({n}): only whole frames' bytes (n >= 0) may be counted,"
                f" and only between frames ({self._buffered} bytes of one are buffered);"
                " feed the bytes instead"
            )
        self._consumed += n

    def feed_eof(self) -> None:
        """Declare the end of the input.

        Raises:
            Truncated: The input ended inside a frame.
        """
        if self._error is not None:
            raise self._error
        if self._buffered:
            exc = Truncated(
                f"the stream ended inside a frame: {self._buffered} bytes of a frame that needs "
                f"{self._need} were received",
                self._consumed,
            )
            self._error = exc
            raise exc

    def _parse(self, buf: bytes, frames: list[Frame], pos: int = 0) -> int:
        """Append the frames of ``buf`` from ``pos`` on to ``frames``; return where the first
        incomplete one starts (``self._need`` is the bytes it needs)."""
        limits = self.limits
        max_payload = limits.max_payload
        versions = self._versions
        unpack = HEADER.unpack_from
        append = frames.append
        end = len(buf)
        base = self._consumed
        # The C decoder straight on each TLV payload within its size (_decode_at's first step,
        # without two Python calls a frame); anything else takes _decode_at's whole path.
        sizes = self._sizes
        if sizes[0] is not limits:
            sizes = self._sizes = (
                limits,
                _fast_size(limits) if _C is not None else -1,
                _cbor_fast_size(limits) if _C is not None else -1,
            )
        fast_size, cbor_fast_size = sizes[1], sizes[2]
        max_depth = limits.max_depth
        max_items = limits.max_items
        if _C is not None and fast_size >= 0 and 2 in versions:
            # The C loop takes the version 2 frames (TLV and CBOR) it decodes whole; this loop
            # goes on from where it stopped, and delivers or names what it left.
            pos = _C.frames_v2(
                buf, pos, frames, max_payload, fast_size, cbor_fast_size, max_depth, max_items
            )
            self._c_args = (
                limits,
                _C.frames_v2,
                max_payload,
                fast_size,
                cbor_fast_size,
                max_depth,
                max_items,
            )
        while end - pos >= HEADER_SIZE:
            magic, version, code, length, request_id = unpack(buf, pos)
            if magic != MAGIC or version not in versions:
                raise self._bad_header(buf, pos, base)
            if version == 1:
                mtype = _V1_TYPES.get(code)
                codec = Codec.TLV
            else:
                mtype = _V2_TYPES.get(code & 0x7F)
                codec = Codec.CBOR if code & CBOR_FLAG else Codec.TLV
            if mtype is None:
                raise self._bad_header(buf, pos, base)
            if length > max_payload:
                raise LimitExceeded(
                    f"frame payload length {length} exceeds max_payload={max_payload}",
                    base + pos + 4,
                )
            stop = pos + HEADER_SIZE + length
            if stop > end:
                self._need = HEADER_SIZE + length
                return pos
            if length == 0:
                payload = None
            else:
                try:
                    if codec is Codec.TLV:
                        data = buf[pos + HEADER_SIZE : stop]
                        fast = (
                            _C.tlv_decode(data, version == 2, max_depth, max_items)
                            if _C is not None and length <= fast_size
                            else None
                        )
                        if fast is not None:
                            payload, used = fast
                        else:
                            payload, used = _decode_at(data, 0, version == 2, limits)
                        if used != length:
                            raise TrailingBytes(
                                f"{length - used} bytes remain after the payload's value; a "
                                "payload holds exactly one value",
                                used,
                            )
                    else:
                        data = buf[pos + HEADER_SIZE : stop]
                        # (the C decoder straight, as for TLV: one Python call fewer a frame)
                        fast = (
                            _C.cbor_decode(data, max_depth, max_items)
                            if _C is not None and length <= cbor_fast_size
                            else None
                        )
                        payload = fast[0] if fast is not None else cbor_decode(data, limits=limits)
                except WireError as exc:
                    raise exc._shifted(base + pos + HEADER_SIZE)
                if version == 1 and type(payload) is not dict:
                    raise MalformedMessage(
                        f"a version 1 {mtype.name} payload must be a dict (got "
                        f"{type(payload).__name__})",
                        base + pos + HEADER_SIZE,
                    )
            # Built without re-running the validators the header checks above applied; the
            # slots' setters cost half of object.__setattr__ (once per frame received).
            frame = _new_frame(Frame)
            _set_type(frame, mtype)
            _set_request_id(frame, request_id)
            _set_payload(frame, payload)
            _set_version(frame, version)
            _set_codec(frame, codec)
            append(frame)
            pos = stop
        if pos < end and buf[pos : pos + 2] != MAGIC[: min(2, end - pos)]:
            raise BadMagic(
                f'bad magic {buf[pos : pos + 2].hex(" ")}: a frame starts with 47 44 ("GD")',
                base + pos,
            )
        self._need = HEADER_SIZE
        return pos

    def _bad_header(self, buf: bytes, pos: int, base: int) -> WireError:
        magic, version, code, _length, _rid = HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            return BadMagic(
                f'bad magic {magic.hex(" ")}: a frame starts with 47 44 ("GD"); is the peer '
                "speaking this protocol?",
                base + pos,
            )
        if version not in self._versions:
            accepted = ", ".join(str(v) for v in sorted(self._versions))
            return UnsupportedVersion(
                f"unsupported protocol version {version}; this endpoint accepts {accepted}",
                base + pos + 2,
            )
        if version == 1 and code in _V2_TYPES:
            return UnknownMessageType(
                f"message type 0x{code:02x} ({_V2_TYPES[code].name}) exists only in version 2",
                base + pos + 3,
            )
        if version == 1 and code & CBOR_FLAG:
            return UnknownMessageType(
                f"unknown message type 0x{code:02x}: the CBOR flag 0x80 exists only in version 2",
                base + pos + 3,
            )
        return UnknownMessageType(
            f"unknown message type 0x{code:02x} in version {version}", base + pos + 3
        )
