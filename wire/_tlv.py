"""The TLV value decoder: Gunicorn 27's dirty-protocol TLV (version 1) and our extension
(version 2).

The encoder, the type codes and the shared structs are in :mod:`wire._tlv_encode` (as CBOR's
are in :mod:`wire._cbor_encode`). Like the encoder, the decoder has two paths: the optimistic
recursive fast path of :mod:`wire._tlv_fast`, which gives up on anything unusual, and the exact
loop here, one loop over precompiled :class:`struct.Struct` objects with an explicit stack (deep
values cost no Python recursion, the depth limit is a plain comparison), which decides every
case the fast path leaves to it and names every error with its offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from itertools import repeat
from typing import Any

from . import _tlv_fast
from ._accel import C as _C
from ._errors import (
    InvalidUtf8,
    InvalidValue,
    LimitExceeded,
    TrailingBytes,
    Truncated,
    UnknownValueType,
    WireError,
)
from ._limits import Limits
from ._tlv_encode import (
    _DEFAULT_LEFT,
    _DEFAULT_LIMITS,
    _ENCODERS_SIZE,
    _F64,
    _FAST_MAX_DEPTH,
    _I64_MAX,
    _I64_MIN,
    _V2_ONLY,
    TlvType,
    _bigint_bytes,
    _F64_unpack,
    _I64_unpack,
    _IDS_unpack,
    _nan_duplicate,
    _type_name,
    _U32_unpack,
    tlv_encode,
)
from ._values import MAX_NAME_BYTES, Atom, ErrorValue, ExitReason, trusted_pid, trusted_ref

__all__ = ["TlvType", "tlv_decode", "tlv_encode"]


def tlv_decode(
    data: bytes | bytearray | memoryview,
    *,
    version: int = 2,
    limits: Limits = _DEFAULT_LIMITS,
) -> Any:
    """Decode exactly one TLV value; trailing bytes are an error.

    Args:
        data: The encoded value.
        version: 1 (only Gunicorn's eight types) or 2.
        limits: Bounds checked before anything is allocated.

    Returns:
        The value: None, bool, int, float, bytes, str, list, dict, and in version 2 also tuple,
        :class:`Atom`, :class:`Pid`, :class:`Ref`, :class:`ExitReason`, :class:`ErrorValue`.

    Raises:
        WireError: A subclass naming what was wrong, with ``offset`` into ``data``.
    """
    if _C is not None and (version == 1 or version == 2):
        size = len(data)
        if size <= (_DEFAULT_FAST_SIZE if limits is _DEFAULT_LIMITS else _fast_size(limits)):
            fast = _C.tlv_decode(data, version == 2, limits.max_depth, limits.max_items)
            if fast is not None and fast[1] == size:
                return fast[0]
    if limits is _DEFAULT_LIMITS and type(data) is bytes and len(data) <= _DEFAULT_FAST_SIZE:
        # The common case first, in a few steps: what _decode_at() does, for the default limits.
        if version == 1:
            decoders = _DECODERS[0]
        elif version == 2:
            decoders = _DECODERS[1]
        else:
            raise InvalidValue(f"TLV version must be 1 or 2 (got {version!r})")
        try:
            if data[0] == 0x21:  # a dict, as decode() would (one call fewer)
                value, off = decoders[1](data, 5, _U32_unpack(data, 1)[0], _DEFAULT_LEFT)
            else:
                value, off = decoders[0](data, 0, _DEFAULT_LIMITS.max_depth)
        except Exception:
            pass
        else:
            if off == len(data):
                return value
        # else the exact loop names what is wrong
    elif version != 2 and version != 1:
        raise InvalidValue(f"TLV version must be 1 or 2 (got {version!r})")
    if type(data) is not bytes:
        data = bytes(data)
    value, off = _decode_at(data, 0, version == 2, limits)
    if off != len(data):
        raise TrailingBytes(
            f"{len(data) - off} bytes remain after the TLV value; a payload holds exactly one "
            "value",
            off,
        )
    return value


# Fast decoders by (version 2?, max_items), bounded as the encoders are.
_DECODERS_BY: dict[tuple[bool, int], tuple[_tlv_fast.Decode, _tlv_fast.DecodeDict]] = {}


def _fast_decoder(v2: bool, limits: Limits) -> tuple[_tlv_fast.Decode, _tlv_fast.DecodeDict]:
    key = (v2, limits.max_items)
    decoders = _DECODERS_BY.get(key)
    if decoders is None:
        decoders = _tlv_fast.decoder(v2, limits.max_items)
        if len(_DECODERS_BY) < _ENCODERS_SIZE:
            _DECODERS_BY[key] = decoders
    return decoders


_DECODERS = (_fast_decoder(False, _DEFAULT_LIMITS), _fast_decoder(True, _DEFAULT_LIMITS))


def _decode_fast(data: bytes, v2: bool, limits: Limits) -> tuple[Any, int]:
    """The fast decoder on ``data``; raises if it gives up (the end may lie past the data)."""
    decode, decode_dict = _DECODERS[v2] if limits is _DEFAULT_LIMITS else _fast_decoder(v2, limits)
    max_depth = limits.max_depth
    if data[0] == 0x21 and max_depth:  # as decode() would, one call fewer
        return decode_dict(data, 5, _U32_unpack(data, 1)[0], max_depth - 1)
    return decode(data, 0, max_depth)


def _fast_size(limits: Limits) -> int:
    """The longest payload the fast decoder may take under ``limits``: one no longer than
    ``max_total_items`` and ``max_str`` cannot exceed them (every item takes at least one byte),
    and those are the limits the fast decoder does not check itself."""
    if limits.max_depth > _FAST_MAX_DEPTH:
        return -1
    return min(limits.max_total_items, limits.max_str)


_DEFAULT_FAST_SIZE = _fast_size(_DEFAULT_LIMITS)


def _decode_at(data: bytes, off: int, v2: bool, limits: Limits) -> tuple[Any, int]:
    """Decode one value starting at ``data[off]``; return it and the offset after it.

    The fast decoder runs when the payload is within :func:`_fast_size`; otherwise, and whenever
    it gives up or its value would run past the end, the exact loop decodes the payload and names
    what is wrong.
    """
    size = len(data) - off
    if size <= (_DEFAULT_FAST_SIZE if limits is _DEFAULT_LIMITS else _fast_size(limits)):
        if _C is not None:
            fast = _C.tlv_decode(
                data if off == 0 else memoryview(data)[off:], v2, limits.max_depth, limits.max_items
            )
            if fast is not None:
                return fast[0], off + fast[1]
        try:
            value, stop = _decode_fast(data if off == 0 else data[off:], v2, limits)
        except Exception:  # the exact loop below names what is wrong
            pass
        else:
            if stop <= size:
                return value, off + stop
    return _decode_loop_at(data, off, v2, limits)


def _decode_loop_at(data: bytes, off: int, v2: bool, limits: Limits) -> tuple[Any, int]:
    """:func:`_decode_loop`, with a read past the end reported as :class:`Truncated`."""
    try:
        return _decode_loop(data, off, v2, limits)
    except (IndexError, struct.error):
        raise _truncation(data, off, v2) from None


def _decode_loop(data: bytes, off: int, v2: bool, limits: Limits) -> tuple[Any, int]:
    """The exact decoder: one value starting at ``data[off]``, and the offset after it.

    The current container lives in locals (``kind``, ``cur``, ``append``, ``remaining``); the stack
    only holds the enclosing ones, so a value costs no list indexing and no Python call. Reading
    past the end raises ``IndexError``/``struct.error`` inside the loop, turned into
    :class:`Truncated` once (by :func:`_decode_loop_at`), instead of a bounds check before every
    field. Kinds: 0 top level, 1 list, 2 dict (keys and values alternate until it closes),
    3 tuple, 4 exit reason, 5 error value.
    """
    end = len(data)
    max_depth = limits.max_depth
    max_items = limits.max_items
    max_str = limits.max_str
    max_total = limits.max_total_items
    u32 = _U32_unpack
    i64 = _I64_unpack
    f64 = _F64_unpack
    total = 1
    nans = 0  # from two on, every dict is checked for NaN keys of the same bits
    stack: list[tuple[Any, ...]] = []
    # The current container: its kind, its items so far, and an iterator that yields once per
    # item still to read. The top level is a one-item list.
    kind = 1
    cur: list[Any] = []
    append = cur.append
    it: Iterator[None] = repeat(None, 1)
    cstart = off
    v: Any
    while True:
        for _ in it:
            t = data[off]
            if t == 0x11:
                n = u32(data, off + 1)[0]
                off += 5
                if n > max_str or n > end - off:
                    raise _bad_length("str", n, max_str, off, end, "max_str")
                try:
                    append(data[off : off + n].decode())
                except UnicodeDecodeError as exc:
                    raise InvalidUtf8(f"invalid UTF-8 in str: {exc.reason}", off + exc.start)
                off += n
            elif t == 0x05:
                append(i64(data, off + 1)[0])
                off += 9
            elif t == 0x21 or t == 0x20 or (t == 0x22 and v2):
                n = u32(data, off + 1)[0]
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={max_depth}", off)
                if n:
                    if n > max_items:
                        raise LimitExceeded(
                            f"{_CONTAINER[t]} of {n} items exceeds max_items={max_items}", off
                        )
                    if t == 0x21:
                        n *= 2
                    if n > end - off - 5:
                        raise Truncated(
                            f"truncated {_CONTAINER[t]}: declares {n} items and values, "
                            f"needing at least {n} bytes, only {end - off - 5} remain",
                            off,
                        )
                    total += n
                    if total > max_total:
                        raise LimitExceeded(
                            f"payload holds more than max_total_items={max_total} items", off
                        )
                    stack.append((kind, cur, append, it, cstart))
                    kind = 2 if t == 0x21 else (1 if t == 0x20 else 3)
                    cur = []
                    append = cur.append
                    it = repeat(None, n)
                    cstart = off
                    off += 5
                    break
                off += 5
                append({} if t == 0x21 else ([] if t == 0x20 else ()))
            elif t == 0x00:
                append(None)
                off += 1
            elif t == 0x01:
                b = data[off + 1]
                if b > 1:
                    raise InvalidValue(f"bool byte must be 0x00 or 0x01 (got 0x{b:02x})", off + 1)
                append(b == 1)
                off += 2
            elif t == 0x06:
                v = f64(data, off + 1)[0]
                if v != v:
                    nans += 1
                append(v)
                off += 9
            elif t == 0x10:
                n = u32(data, off + 1)[0]
                off += 5
                if n > max_str or n > end - off:
                    raise _bad_length("bytes", n, max_str, off, end, "max_str")
                append(data[off : off + n])
                off += n
            elif not v2:
                if t in _V2_ONLY:
                    raise UnknownValueType(
                        f"TLV type code 0x{t:02x} ({_V2_ONLY[t]}) exists only in version 2, "
                        "this is a version 1 payload",
                        off,
                    )
                raise UnknownValueType(f"unknown TLV type code 0x{t:02x}", off)
            elif t == 0x12 or t == 0x30 or t == 0x31:
                what = "atom" if t == 0x12 else "node name"
                n = u32(data, off + 1)[0]
                if n > MAX_NAME_BYTES:
                    raise LimitExceeded(
                        f"{what} of {n} bytes exceeds the {MAX_NAME_BYTES}-byte limit", off
                    )
                off += 5
                if n > end - off:
                    raise _bad_length(what, n, MAX_NAME_BYTES, off, end, "MAX_NAME_BYTES")
                try:
                    s = data[off : off + n].decode()
                except UnicodeDecodeError as exc:
                    raise InvalidUtf8(f"invalid UTF-8 in {what}: {exc.reason}", off + exc.start)
                off += n
                if t == 0x12:
                    append(Atom(s))
                else:
                    ident, creation = _IDS_unpack(data, off)
                    off += 12
                    # Every field was checked above (length, UTF-8, u64/u32 by the format).
                    make = trusted_pid if t == 0x30 else trusted_ref
                    append(make(s, ident, creation))
            elif t == 0x07:
                n = u32(data, off + 1)[0]
                if n > limits.max_bigint_bytes:
                    raise LimitExceeded(
                        f"big int of {n} bytes exceeds max_bigint_bytes={limits.max_bigint_bytes}",
                        off,
                    )
                if n > end - off - 5:
                    raise _bad_length(
                        "big int", n, limits.max_bigint_bytes, off + 5, end, "max_bigint_bytes"
                    )
                v = int.from_bytes(data[off + 5 : off + 5 + n], "big", signed=True)
                if _I64_MIN <= v <= _I64_MAX or len(_bigint_bytes(v)) != n:
                    raise InvalidValue(
                        "non-canonical big int: type 0x07 must hold the minimal two's-complement "
                        "bytes of an int outside int64 (smaller ints use 0x05)",
                        off,
                    )
                append(v)
                off += 5 + n
            elif t == 0x32 or t == 0x33:
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={max_depth}", off)
                n = 2 if t == 0x32 else 4
                if n > end - off - 1:
                    raise Truncated(
                        f"truncated {'exit reason' if t == 0x32 else 'error value'}: needs {n} "
                        f"values, only {end - off - 1} bytes remain",
                        off,
                    )
                total += n
                if total > max_total:
                    raise LimitExceeded(
                        f"payload holds more than max_total_items={max_total} items", off
                    )
                stack.append((kind, cur, append, it, cstart))
                kind = 4 if t == 0x32 else 5
                cur = []
                append = cur.append
                it = repeat(None, n)
                cstart = off
                off += 1
                break
            else:
                raise UnknownValueType(f"unknown TLV type code 0x{t:02x}", off)
        else:
            # The current container is complete: it becomes an item of its parent.
            if not stack:
                return cur[0], off
            if kind == 1:
                v = cur
            elif kind == 2:
                keys = cur[0::2]
                try:
                    v = dict(zip(keys, cur[1::2], strict=True))
                except TypeError:
                    v = None
                if v is None or len(v) != len(keys) or nans > 1:
                    v = _make_dict(cur, v2, cstart)
                elif not v2:
                    for k in keys:
                        if type(k) is not str:
                            v = _make_dict(cur, v2, cstart)
            elif kind == 3:
                v = tuple(cur)
            else:
                v = _composite(kind, cur, cstart)
            kind, cur, append, it, cstart = stack.pop()
            append(v)


_CONTAINER = {0x20: "list", 0x21: "dict", 0x22: "tuple"}


def _bad_length(what: str, n: int, limit: int, off: int, end: int, name: str) -> WireError:
    if n > limit:
        return LimitExceeded(f"{what} length {n} exceeds {name}={limit}", off - 5)
    return Truncated(f"truncated {what}: declares {n} bytes, only {end - off} remain", off)


def _truncation(data: bytes, start: int, v2: bool) -> Truncated:
    """Find where a value that ran off the end of ``data`` was cut (the slow path only)."""
    off = start
    # Re-walk headers without building values to name the field that was cut.
    sizes = {0x00: 0, 0x01: 1, 0x05: 8, 0x06: 8}
    while off < len(data):
        t = data[off]
        if t in sizes:
            if off + 1 + sizes[t] > len(data):
                return Truncated(
                    f"truncated value: type 0x{t:02x} needs {sizes[t]} bytes, only "
                    f"{len(data) - off - 1} remain",
                    off,
                )
            off += 1 + sizes[t]
        elif t in (0x20, 0x21, 0x22, 0x32, 0x33):
            if t in (0x32, 0x33):
                off += 1
                continue
            if off + 5 > len(data):
                break
            off += 5
        elif t in (0x10, 0x11, 0x12, 0x07, 0x30, 0x31):
            if off + 5 > len(data):
                break
            off += 5 + _U32_unpack(data, off + 1)[0] + (12 if t in (0x30, 0x31) else 0)
        else:
            break
    if off >= len(data):
        return Truncated("truncated value: expected a type byte, found the end of the data", off)
    return Truncated(
        f"truncated value: the field after type byte 0x{data[off]:02x} is cut short "
        f"({len(data) - off - 1} bytes remain)",
        off,
    )


def _make_dict(flat: list[Any], v2: bool, start: int) -> dict[Any, Any]:
    keys = flat[0::2]
    if not v2:
        for k in keys:
            if type(k) is not str:
                raise InvalidValue(
                    f"dict key {k!r} is a {_type_name(k)}, but version 1 dict keys must be str",
                    start,
                )
    try:
        d = dict(zip(keys, flat[1::2], strict=True))
    except TypeError:
        bad = next(k for k in keys if not _hashable(k))
        raise InvalidValue(f"dict key of type {_type_name(bad)} is not hashable", start)
    if len(d) != len(keys):
        seen: set[Any] = set()
        dup = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise InvalidValue(f"duplicate dict key {dup!r}", start)
    nan = _nan_duplicate(keys)
    if nan is not None:
        raise InvalidValue(
            f"duplicate dict key {nan!r}: two NaN keys with the same bits ({_F64.pack(nan).hex()})",
            start,
        )
    return d


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _composite(kind: int, fields: list[Any], start: int) -> Any:
    try:
        if kind == 4:
            return ExitReason(*fields)
        return ErrorValue(*fields)
    except WireError as exc:
        raise type(exc)(exc.message, start) from None
