"""The CBOR heads and leaf encodings wire's two CBOR encoders share (RFC 8949 §4.2.1).

Shortest heads, shortest exact floats, wire's tag numbers, and the bounded caches of encoded
strs and map keys that both the general encoder (``_cbor_general``) and its fast path
(``_cbor_fast``) read, so that both give the same bytes.
"""

from __future__ import annotations

import enum
import struct

from ._errors import InvalidUtf8, LimitExceeded
from ._limits import Limits

__all__ = ["CborTag"]


class CborTag(enum.IntEnum):
    """CBOR tag numbers for the OTP types (first-come-first-served range of the IANA registry;
    61446..61455 are reserved for the distribution and matching services)."""

    ATOM = 61440
    TUPLE = 61441
    PID = 61442
    REF = 61443
    EXIT = 61444
    ERROR = 61445


_DEFAULT_LIMITS = Limits()
_U64_MAX = (1 << 64) - 1
_B8 = struct.Struct(">BB")
_B16 = struct.Struct(">BH")
_B32 = struct.Struct(">BI")
_B64 = struct.Struct(">BQ")
_F16 = struct.Struct(">e")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")


def _head(major: int, n: int) -> bytes:
    """The shortest head for major type ``major`` (0..7) and argument ``n``."""
    mt = major << 5
    if n < 24:
        return bytes((mt | n,))
    if n < 0x100:
        return _B8.pack(mt | 24, n)
    if n < 0x10000:
        return _B16.pack(mt | 25, n)
    if n < 0x100000000:
        return _B32.pack(mt | 26, n)
    return _B64.pack(mt | 27, n)


def _float(v: float) -> bytes:
    """The shortest of binary16/32/64 that holds ``v`` exactly (most floats need binary64)."""
    if v != v:
        return b"\xf9\x7e\x00"
    try:
        f = _F32.pack(v)
    except OverflowError:
        return b"\xfb" + _F64.pack(v)
    if _F32.unpack(f)[0] != v:
        return b"\xfb" + _F64.pack(v)
    try:
        h = _F16.pack(v)
        if _F16.unpack(h)[0] == v:
            return b"\xf9" + h
    except OverflowError:
        pass
    return b"\xfa" + f


class _Raw(bytes):
    """Already encoded bytes (a sorted map key) passed through the encoder's loop."""


_SMALL_INTS = [_head(0, i) for i in range(256)]
_ARRAY_HEADS = [_head(4, i) for i in range(256)]
_MAP_HEADS = [_head(5, i) for i in range(256)]
_STR_CACHE: dict[str, bytes] = {}
_KEY_CACHE: dict[str, _Raw] = {}
_CACHE_LEN = 64
_CACHE_SIZE = 4096
_TAG_HEADS = {t: _head(6, int(t)) for t in CborTag}


def _encode_str(text: str, max_str: int) -> bytes:
    try:
        b = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidUtf8(
            f"cannot encode a str as UTF-8: {exc.reason} at character {exc.start} "
            "(lone surrogates have no UTF-8 form; fix the text before sending it)"
        ) from exc
    if len(b) > max_str:
        raise LimitExceeded(f"str of {len(b)} UTF-8 bytes exceeds max_str={max_str}")
    return _head(3, len(b)) + b


def _str_key(key: str, limits: Limits) -> _Raw:
    raw = _KEY_CACHE.get(key)
    if raw is None:
        raw = _Raw(_encode_str(key, limits.max_str))
        if len(key) <= _CACHE_LEN and len(_KEY_CACHE) < _CACHE_SIZE:
            _KEY_CACHE[key] = raw
    return raw
