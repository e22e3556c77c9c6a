"""Deterministic CBOR encoding with wire's tags (RFC 8949 §4.2.1 core deterministic encoding).

Shortest heads, shortest exact floats, definite lengths, map keys sorted by their encoded bytes.
Two encoders give the same bytes: a recursive fast path for values built from the exact types
wire defines, which hands anything unusual (a subclass, an unknown type, a limit reached, deep
nesting) to the general iterative encoder, which handles every case and raises every error.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from itertools import chain, pairwise
from typing import Any

from ._accel import C as _C
from ._errors import InvalidUtf8, InvalidValue, LimitExceeded, UnknownValueType, WireError
from ._limits import FAST_MAX_PARTS, FAST_PIECE_BYTES, NO_PIECE, Limits, payload_too_large
from ._values import Atom, ErrorValue, ExitReason, Pid, Ref

__all__ = ["CborTag", "cbor_encode"]


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


# An exhausted iterator: pushed on the encoder's stack for a tag, so the stack's length counts
# tags as nesting levels the way decoders do; popping it resumes the enclosing container at once.
_DONE: Iterator[Any] = iter(())


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


def cbor_encode(value: object, *, limits: Limits = _DEFAULT_LIMITS) -> bytes:
    """Encode one value as deterministic CBOR with wire's tags.

    Args:
        value: None, bool, int (any size; bignum tags 2/3 outside 64 bits), float, bytes, str,
            list, tuple (tag 61441), dict with hashable keys, :class:`Atom`, :class:`Pid`,
            :class:`Ref`, :class:`ExitReason`, :class:`ErrorValue`.
        limits: The limits a decoder enforces, so nothing is sent a peer must reject.

    Returns:
        The encoded bytes; equal values always give equal bytes.

    Raises:
        UnknownValueType: A value has no wire form.
        LimitExceeded: A string, container, depth or item total exceeds ``limits``.
        InvalidUtf8: A string holds lone surrogates.
    """
    if _C is not None:
        data = _C.cbor_encode(
            value,
            limits.max_depth,
            limits.max_items,
            limits.max_total_items,
            limits.max_str,
            limits.max_payload,
        )
        if data is not None:
            return data
    data = _fast_encode(value, limits)
    if data is None:
        out = bytearray()
        _encode_into(out, value, limits)
        data = bytes(out)
    elif len(data) > limits.max_payload:
        raise payload_too_large(len(data), limits.max_payload)
    return data


def _encode_into(
    out: bytearray, value: object, limits: Limits, base: int = 0, total: int = 1
) -> int:
    """Encode ``value`` into ``out``; ``base`` is how deep the value sits and ``total`` how many
    items were counted before it, itself included (both for map keys). Returns the new count.

    ``out`` is checked against ``max_payload`` after every str, bytes and bignum (the only items
    that are not a few bytes each), so an encoding far over it is never built whole.
    """
    max_depth = limits.max_depth - base
    max_items = limits.max_items
    max_str = limits.max_str
    max_total = limits.max_total_items
    max_payload = limits.max_payload
    cache = _STR_CACHE
    cached: Any = cache.get if max_str >= 4 * _CACHE_LEN else (lambda _: None)
    small = _SMALL_INTS
    orders = _ORDER_CACHE.get
    stack: list[Iterator[Any]] = []
    it: Iterator[Any] = iter((value,))
    while True:
        for v in it:
            t = type(v)
            if t is str:
                b = cached(v)
                if b is None:
                    b = _encode_str(v, max_str)
                    if len(v) <= _CACHE_LEN and len(cache) < _CACHE_SIZE and max_str >= 256:
                        cache[v] = b
                out += b
                if len(out) > max_payload:
                    raise payload_too_large(len(out), max_payload)
            elif t is _Raw:
                out += v
            elif t is int:
                if 0 <= v < 256:
                    out += small[v]
                elif 0 <= v <= _U64_MAX:
                    out += _head(0, v)
                elif -_U64_MAX - 1 <= v < 0:
                    out += _head(1, -1 - v)
                else:
                    m = v if v >= 0 else -1 - v
                    b = m.to_bytes((m.bit_length() + 7) // 8, "big")
                    if len(b) > limits.max_bigint_bytes:
                        raise LimitExceeded(
                            f"int of {len(b)} bytes exceeds max_bigint_bytes="
                            f"{limits.max_bigint_bytes}"
                        )
                    if len(stack) >= max_depth:
                        raise LimitExceeded(f"value nests deeper than max_depth={limits.max_depth}")
                    out += b"\xc2" if v >= 0 else b"\xc3"
                    out += _head(2, len(b))
                    out += b
                    if len(out) > max_payload:
                        raise payload_too_large(len(out), max_payload)
            elif t is dict:
                n = len(v)
                if n > max_items:
                    raise LimitExceeded(f"dict of {n} pairs exceeds max_items={max_items}")
                out += _MAP_HEADS[n] if n < 256 else _head(5, n)
                if n:
                    if len(stack) >= max_depth:
                        raise LimitExceeded(f"value nests deeper than max_depth={limits.max_depth}")
                    total += 2 * n
                    if total > max_total:
                        raise LimitExceeded(
                            f"value holds more than max_total_items={max_total} items "
                            "(is it cyclic?)"
                        )
                    order = orders(tuple(v))
                    if order is None:
                        order, total = _key_order(v, limits, base + len(stack) + 1, total)
                    pairs = [(raw, v[k]) for raw, k in order]
                    stack.append(it)
                    it = chain.from_iterable(pairs)
                    break
            elif t is list or t is tuple:
                n = len(v)
                if n > max_items:
                    raise LimitExceeded(f"{t.__name__} of {n} items exceeds max_items={max_items}")
                # Depth counts every array, map and tag enclosing an item (cbor2's rule).
                level = len(stack)
                if t is tuple:
                    if level >= max_depth:
                        raise LimitExceeded(f"value nests deeper than max_depth={limits.max_depth}")
                    out += _TAG_HEADS[CborTag.TUPLE]
                    level += 1
                out += _ARRAY_HEADS[n] if n < 256 else _head(4, n)
                if n:
                    if level >= max_depth:
                        raise LimitExceeded(f"value nests deeper than max_depth={limits.max_depth}")
                    total += n
                    if total > max_total:
                        raise LimitExceeded(
                            f"value holds more than max_total_items={max_total} items "
                            "(is it cyclic?)"
                        )
                    stack.append(it)
                    if t is tuple:
                        stack.append(_DONE)
                    it = iter(v)
                    break
            elif v is None:
                out.append(0xF6)
            elif t is bool:
                out.append(0xF5 if v else 0xF4)
            elif t is float:
                out += _float(v)
            elif t is bytes:
                if len(v) > max_str:
                    raise LimitExceeded(f"bytes of length {len(v)} exceeds max_str={max_str}")
                out += _head(2, len(v))
                out += v
                if len(out) > max_payload:
                    raise payload_too_large(len(out), max_payload)
            elif t is Atom:
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={limits.max_depth}")
                out += _TAG_HEADS[CborTag.ATOM]
                out += _encode_str(v.name, max_str)
            elif t is Pid or t is Ref or t is ExitReason or t is ErrorValue:
                if len(stack) + 1 >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={limits.max_depth}")
                fields: tuple[Any, ...]
                if t is Pid or t is Ref:
                    out += _TAG_HEADS[CborTag.PID if t is Pid else CborTag.REF]
                    fields = (v.node, v.id, v.creation)
                elif t is ExitReason:
                    out += _TAG_HEADS[CborTag.EXIT]
                    fields = (v.kind, v.detail)
                else:
                    out += _TAG_HEADS[CborTag.ERROR]
                    fields = (v.type, v.message, v.details, v.traceback)
                total += len(fields)
                if total > max_total:
                    raise LimitExceeded(f"value holds more than max_total_items={max_total} items")
                out += _head(4, len(fields))
                stack.append(it)
                stack.append(_DONE)
                it = iter(fields)
                break
            else:
                it = chain((_normalise(v),), it)
                break
        else:
            if not stack:
                return total
            it = stack.pop()


def _first(pair: tuple[bytes, Any]) -> bytes:
    return pair[0]


# The deterministic key order (encoded key, key) of dicts whose keys are all str, by key tuple:
# payload dicts have a few recurring shapes. Bounded; filled until full, never evicted. Only
# all-str key tuples go in, and a tuple of other keys never equals one of those, so a hit is
# always right (1 == True == 1.0 is why non-str keys stay out).
_ORDER_CACHE: dict[tuple[Any, ...], list[tuple[_Raw, Any]]] = {}


def _key_order(
    d: dict[Any, Any], limits: Limits, level: int, total: int
) -> tuple[list[tuple[_Raw, Any]], int]:
    """The keys of ``d`` in deterministic order with their encodings, and ``total`` (the items
    counted so far) plus the items inside the keys (a tuple or pid key holds some)."""
    order = []
    plain = True
    for k in d:
        if type(k) is str:
            raw = _str_key(k, limits)
        else:
            plain = False
            out = bytearray()
            total = _encode_into(out, k, limits, level, total)
            raw = _Raw(out)
        order.append((raw, k))
    order.sort(key=_first)
    if plain:
        if len(_ORDER_CACHE) < _CACHE_SIZE and len(d) <= 64:
            _ORDER_CACHE[tuple(d)] = order
    else:
        _refuse_equal_keys(order)
    return order, total


def _refuse_equal_keys(order: list[tuple[_Raw, Any]]) -> None:
    """Refuse two keys with one encoding, which the peer must reject as duplicates: keys a
    dict holds apart only because they are not equal to themselves (every NaN encodes as
    ``f9 7e 00``)."""
    for (prev, _), (raw, k) in pairwise(order):
        if raw == prev:
            raise InvalidValue(
                f"duplicate dict key {k!r}: two keys encode to the same CBOR bytes "
                f"({bytes(raw).hex()}), which a decoder must reject; use one NaN key at most"
            )


def _normalise(value: object) -> object:
    bases: tuple[Any, ...] = (int, float, bytes, dict, list, tuple)
    if isinstance(value, str):
        return str.__str__(value)  # the text itself, not an Enum's str()
    for base in bases:
        if isinstance(value, base):
            return base(value)
    hint = "; convert it with bytes(...)" if isinstance(value, (bytearray, memoryview)) else ""
    raise UnknownValueType(
        f"cannot encode a value of type {type(value).__name__} in CBOR: supported types are "
        "None, bool, int, float, bytes, str, list, tuple, dict, Atom, Pid, Ref, ExitReason, "
        f"ErrorValue{hint}"
    )


# ---------------------------------------------------------------------------------------------
# The fast path
#
# One recursive call per container, the common leaves handled inline in the loop over a
# container's items, map key orders from the cache above. It never raises a WireError of its
# own: on anything it does not handle exactly as the general encoder does (a subclass, an unknown
# type, a limit reached or nearly reached, a lone surrogate, a map key the general encoder
# refuses, nesting past _FAST_MAX_DEPTH) it raises _Fallback and cbor_encode starts over with
# the general encoder, which gives the same bytes or the error. Every limit is either checked
# exactly as the general encoder checks it (max_items, max_str, max_bigint_bytes, max_depth) or
# bounded from above (max_total_items: every counted item adds at least one part to ``parts``, so
# ``len(parts)`` bounds the count), so the fast path accepts nothing the general one refuses.
# It also gives up past FAST_MAX_PARTS parts, long strs and bytes adding the empty parts they
# count for, so that the parts hold a bounded number of bytes (wire._limits); cbor_encode checks
# max_payload on what it joins.


class _Fallback(Exception):
    """Raised inside the fast path to hand the value to the general encoder; never escapes."""


#: Nesting the recursive fast path goes to before handing over to the iterative encoder (it
#: costs one Python frame a level).
_FAST_MAX_DEPTH = 200
_F64_ITEM = struct.Struct(">Bd")
_NO_LOW_BYTES = b"\x00\x00\x00"
_TUPLE_HEAD = _TAG_HEADS[CborTag.TUPLE]
_EMPTY_TUPLE = _TUPLE_HEAD + b"\x80"
_ATOM_HEAD = _TAG_HEADS[CborTag.ATOM]
_PID_HEAD = _TAG_HEADS[CborTag.PID] + b"\x83"
_REF_HEAD = _TAG_HEADS[CborTag.REF] + b"\x83"
_EXIT_HEAD = _TAG_HEADS[CborTag.EXIT] + b"\x82"
_ERROR_HEAD = _TAG_HEADS[CborTag.ERROR] + b"\x84"

# What the fast path needs of a Limits, as a tuple it indexes:
# (depth bound, max_items, max_total_items lowered as above, max_str, max_bigint_bytes, the
# Limits itself).
_Bounds = tuple[int, int, int, int, int, Limits]


def _bounds(limits: Limits) -> _Bounds:
    return (
        min(limits.max_depth, _FAST_MAX_DEPTH),
        limits.max_items,
        min(limits.max_total_items, FAST_MAX_PARTS),
        limits.max_str,
        limits.max_bigint_bytes,
        limits,
    )


_DEFAULT_BOUNDS = _bounds(_DEFAULT_LIMITS)


def _fast_encode(value: object, limits: Limits) -> bytes | None:
    """The encoding of ``value``, or ``None`` when the general encoder must produce it."""
    if limits is _DEFAULT_LIMITS:
        bounds = _DEFAULT_BOUNDS
    elif limits.max_str >= 4 * _CACHE_LEN:  # so every cached str fits
        bounds = _bounds(limits)
    else:
        return None
    try:
        if type(value) is dict and 0 < len(value) <= min(255, bounds[1]):  # most payloads
            parts = [_MAP_HEADS[len(value)]]
            _fast_map(value, parts, 1, bounds)
        else:
            parts = []
            _fast_items((value,), parts, 0, bounds)
    except (_Fallback, RecursionError):
        return None
    if len(parts) > bounds[2]:
        return None
    return b"".join(parts)


def _fast_items(
    items: Any,
    parts: list[bytes],
    depth: int,
    bounds: _Bounds,
    cache: dict[str, bytes] = _STR_CACHE,
) -> None:
    """Append the encodings of ``items``, each inside ``depth`` arrays, maps and tags."""
    for x in items:
        t = type(x)
        if t is str:
            parts.append(cache.get(x) or _fast_str(x, parts, bounds))
        elif t is int:
            parts.append(_SMALL_INTS[x] if 0 <= x < 256 else _fast_int(x, depth, bounds))
        elif t is dict:
            n = len(x)
            if n:
                if n > bounds[1] or depth >= bounds[0] or len(parts) + n > bounds[2]:
                    raise _Fallback
                parts.append(_MAP_HEADS[n] if n < 256 else _head(5, n))
                _fast_map(x, parts, depth + 1, bounds)
            else:
                parts.append(b"\xa0")
        elif t is list:
            n = len(x)
            if n:
                if n > bounds[1] or depth >= bounds[0] or len(parts) + n > bounds[2]:
                    raise _Fallback
                parts.append(_ARRAY_HEADS[n] if n < 256 else _head(4, n))
                _fast_items(x, parts, depth + 1, bounds)
            else:
                parts.append(b"\x80")
        elif t is float:
            if x == x:
                # A binary64 whose low 24 mantissa bits are not all zero fits no shorter float.
                b = _F64_ITEM.pack(0xFB, x)
                parts.append(b if b[6:] != _NO_LOW_BYTES else _float(x))
            else:
                parts.append(b"\xf9\x7e\x00")
        elif x is None:
            parts.append(b"\xf6")
        elif t is bool:
            parts.append(b"\xf5" if x else b"\xf4")
        elif t is bytes:
            n = len(x)
            if n > bounds[3]:
                raise _Fallback
            parts.append(_head(2, n))
            parts.append(x)
            if n > FAST_PIECE_BYTES:
                _count_pieces(n, parts, bounds)
        elif t is tuple:
            n = len(x)
            if n:
                if n > bounds[1] or depth + 1 >= bounds[0] or len(parts) + n > bounds[2]:
                    raise _Fallback
                parts.append(_TUPLE_HEAD)
                parts.append(_ARRAY_HEADS[n] if n < 256 else _head(4, n))
                _fast_items(x, parts, depth + 2, bounds)
            elif depth >= bounds[0]:
                raise _Fallback
            else:
                parts.append(_EMPTY_TUPLE)
        else:
            _fast_composite(x, t, parts, depth, bounds)


def _fast_map(
    d: dict[Any, Any],
    parts: list[bytes],
    depth: int,
    bounds: _Bounds,
    cache: dict[str, bytes] = _STR_CACHE,
    orders: dict[tuple[Any, ...], list[tuple[_Raw, Any]]] = _ORDER_CACHE,
) -> None:
    """Append the pairs of the non-empty map ``d``, its keys and values ``depth`` deep."""
    order = orders.get(tuple(d))
    if order is None:
        try:
            order, inside = _key_order(d, bounds[5], depth, 0)
        except WireError:
            raise _Fallback from None
        # One (empty) part for each item inside the keys keeps len(parts) a bound on the count.
        parts += NO_PIECE * inside
    for raw, k in order:
        parts.append(raw)
        x = d[k]
        t = type(x)
        if t is str:
            parts.append(cache.get(x) or _fast_str(x, parts, bounds))
        elif t is int:
            parts.append(_SMALL_INTS[x] if 0 <= x < 256 else _fast_int(x, depth, bounds))
        elif t is list:
            n = len(x)
            if n:
                if n > bounds[1] or depth >= bounds[0] or len(parts) + n > bounds[2]:
                    raise _Fallback
                parts.append(_ARRAY_HEADS[n] if n < 256 else _head(4, n))
                _fast_items(x, parts, depth + 1, bounds)
            else:
                parts.append(b"\x80")
        elif t is dict:
            n = len(x)
            if n:
                if n > bounds[1] or depth >= bounds[0] or len(parts) + n > bounds[2]:
                    raise _Fallback
                parts.append(_MAP_HEADS[n] if n < 256 else _head(5, n))
                _fast_map(x, parts, depth + 1, bounds)
            else:
                parts.append(b"\xa0")
        elif t is float and x == x:
            b = _F64_ITEM.pack(0xFB, x)
            parts.append(b if b[6:] != _NO_LOW_BYTES else _float(x))
        else:
            _fast_items((x,), parts, depth, bounds)


def _fast_str(text: str, parts: list[bytes], bounds: _Bounds) -> bytes:
    """A str the cache does not hold (it is added when short)."""
    try:
        b = text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Fallback from None
    if len(b) > bounds[3]:
        raise _Fallback
    encoded = _head(3, len(b)) + b
    if len(text) <= _CACHE_LEN and len(_STR_CACHE) < _CACHE_SIZE:
        _STR_CACHE[text] = encoded
    elif len(b) > FAST_PIECE_BYTES:
        _count_pieces(len(b), parts, bounds)
    return encoded


def _count_pieces(size: int, parts: list[bytes], bounds: _Bounds) -> None:
    """Add the empty pieces a long str or bytes counts for, so that the number of pieces bounds
    the bytes they hold (wire._limits)."""
    parts += NO_PIECE * (size // FAST_PIECE_BYTES)
    if len(parts) > bounds[2]:
        raise _Fallback


def _fast_int(x: int, depth: int, bounds: _Bounds) -> bytes:
    """An int outside 0..255: major type 0 or 1, or a bignum tag."""
    if 0 <= x <= _U64_MAX:
        return _head(0, x)
    if -_U64_MAX - 1 <= x < 0:
        return _head(1, -1 - x)
    m = x if x >= 0 else -1 - x
    b = m.to_bytes((m.bit_length() + 7) // 8, "big")
    if len(b) > bounds[4] or depth >= bounds[0]:
        raise _Fallback
    return (b"\xc2" if x >= 0 else b"\xc3") + _head(2, len(b)) + b


def _fast_composite(x: Any, t: type, parts: list[bytes], depth: int, bounds: _Bounds) -> None:
    """An atom, pid, ref, exit reason or error value; anything else goes to the general path."""
    if t is Atom:
        if depth >= bounds[0]:
            raise _Fallback
        parts.append(_ATOM_HEAD)
        parts.append(_STR_CACHE.get(x.name) or _fast_str(x.name, parts, bounds))
        return
    fields: tuple[Any, ...]
    if t is Pid or t is Ref:
        head = _PID_HEAD if t is Pid else _REF_HEAD
        fields = (x.node, x.id, x.creation)
    elif t is ExitReason:
        head = _EXIT_HEAD
        fields = (x.kind, x.detail)
    elif t is ErrorValue:
        head = _ERROR_HEAD
        fields = (x.type, x.message, x.details, x.traceback)
    else:
        raise _Fallback
    if depth + 1 >= bounds[0] or len(parts) > bounds[2]:
        raise _Fallback
    parts.append(head)
    _fast_items(fields, parts, depth + 2, bounds)
