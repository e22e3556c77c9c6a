"""The general CBOR encoder: iterative, every wire type and every subclass of one, every limit,
every error (what ``wire.cbor_encode`` runs where its fast paths hand over).

Map keys are sorted by their encoded bytes (RFC 8949 §4.2.1); the orders of all-str key tuples
are cached, and the fast path (``_cbor_fast``) reads the same cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain, pairwise
from typing import Any

from ._cbor_heads import (
    _ARRAY_HEADS,
    _CACHE_LEN,
    _CACHE_SIZE,
    _MAP_HEADS,
    _SMALL_INTS,
    _STR_CACHE,
    _TAG_HEADS,
    _U64_MAX,
    CborTag,
    _encode_str,
    _float,
    _head,
    _Raw,
    _str_key,
)
from ._errors import InvalidValue, LimitExceeded, UnknownValueType
from ._limits import Limits, payload_too_large
from ._values import Atom, ErrorValue, ExitReason, Pid, Ref

# An exhausted iterator: pushed on the encoder's stack for a tag, so the stack's length counts
# tags as nesting levels the way decoders do; popping it resumes the enclosing container at once.
_DONE: Iterator[Any] = iter(())


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
