"""The fast path of the CBOR encoder: recursive, one Python frame a container, the common
leaves handled inline in the loop over a container's items.

It gives exactly the general encoder's bytes (``_cbor_general``) or hands the value over to it.
"""

from __future__ import annotations

import struct
from typing import Any

from ._cbor_general import _ORDER_CACHE, _key_order
from ._cbor_heads import (
    _ARRAY_HEADS,
    _CACHE_LEN,
    _CACHE_SIZE,
    _DEFAULT_LIMITS,
    _MAP_HEADS,
    _SMALL_INTS,
    _STR_CACHE,
    _TAG_HEADS,
    _U64_MAX,
    CborTag,
    _float,
    _head,
    _Raw,
)
from ._errors import WireError
from ._limits import FAST_MAX_PARTS, FAST_PIECE_BYTES, NO_PIECE, Limits
from ._values import Atom, ErrorValue, ExitReason, Pid, Ref

# One recursive call per container, the common leaves handled inline in the loop over a container's
# items, map key orders from the general encoder's cache. It never raises a WireError of its own: on
# anything it does not handle exactly as the general encoder does (a subclass, an unknown type, a
# limit reached or nearly reached, a lone surrogate, a map key the general encoder refuses, nesting
# past _FAST_MAX_DEPTH) it raises _Fallback and cbor_encode starts over with the general encoder,
# which gives the same bytes or the error. Every limit is either checked exactly as the general
# encoder checks it (max_items, max_str, max_bigint_bytes, max_depth) or bounded from above
# (max_total_items: every counted item adds at least one part to ``parts``, so ``len(parts)`` bounds
# the count), so the fast path accepts nothing the general one refuses. It also gives up past
# FAST_MAX_PARTS parts, long strs and bytes adding the empty parts they count for, so that the parts
# hold a bounded number of bytes (wire._limits); cbor_encode checks max_payload on what it joins.


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
