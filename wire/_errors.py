"""Typed errors of the wire layer: one root, :class:`WireError`, which is also a ``ValueError``.

Every decoding error carries the byte ``offset`` where the problem was found (counted from the
start of the buffer given to a decoding function, or from the first byte fed to a
:class:`~wire.FrameDecoder`), so a hex dump and the message together point at the bad byte.
"""

from __future__ import annotations

__all__ = [
    "BadFrameHeader",
    "BadMagic",
    "InvalidUtf8",
    "InvalidValue",
    "LimitExceeded",
    "MalformedMessage",
    "RequestIdMismatch",
    "TrailingBytes",
    "Truncated",
    "UnknownMessageType",
    "UnknownValueType",
    "UnsupportedVersion",
    "ValueOutOfRange",
    "WireError",
]


class WireError(ValueError):
    """Root of every error raised by ``wire``.

    Attributes:
        message: What was wrong, where, and what to do, without the offset.
        offset: The byte offset of the problem, or ``None`` when it is not about a position in
            the input (for example an encoding error).
    """

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset

    def __str__(self) -> str:
        if self.offset is None:
            return self.message
        return f"{self.message} (at byte {self.offset})"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.offset))

    def _shifted(self, base: int) -> WireError:
        """Move the offset by ``base`` (used when a payload sits inside a larger stream)."""
        if self.offset is not None:
            self.offset += base
        return self


class BadMagic(WireError):
    """A frame header does not start with the magic bytes ``47 44`` ("GD")."""


class BadFrameHeader(WireError):
    """Bytes where a GD v1 frame must start are not a GD v1 frame header (raised by the raw
    splitters, :class:`~wire.FrameBuffer` and :class:`~wire.FrameSplitter`; the message names
    the position).

    Attributes:
        raw: The bad bytes (at most a header's 16).
    """

    def __init__(self, message: str, raw: bytes = b"") -> None:
        super().__init__(message)
        self.raw = raw

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.raw))


class UnsupportedVersion(WireError):
    """A frame header names a protocol version this decoder does not accept."""


class UnknownMessageType(WireError):
    """A frame header names a message type that does not exist in its protocol version."""


class UnknownValueType(WireError, TypeError):
    """A value type is not part of the encoding: an unknown type code or CBOR tag when decoding,
    or a Python type that has no wire form when encoding (nothing is ever pickled)."""


class Truncated(WireError):
    """The input ended inside a field: a header, a length, a value or a frame."""


class InvalidUtf8(WireError):
    """A string, atom or node name is not valid UTF-8 (or, when encoding, not encodable)."""


class TrailingBytes(WireError):
    """Bytes remain after the single value a payload must hold."""


class LimitExceeded(WireError):
    """A size, count or depth exceeds the configured :class:`~wire.Limits`."""


class ValueOutOfRange(WireError):
    """A number does not fit its field (an int outside int64 in version 1, a request id outside
    uint64, a pid id outside uint64, ...)."""


class InvalidValue(WireError):
    """A value is well-formed but not allowed: a bool byte other than 0/1, a duplicate or
    unhashable dict key, a non-str key in strict version 1, a non-canonical big int, a composite
    value whose fields have the wrong types, a payload that is not a dict in version 1."""


class MalformedMessage(WireError):
    """A frame's payload does not have the shape its message type requires."""


class RequestIdMismatch(WireError):
    """A reply carries a request id other than the one of the request it answers."""
