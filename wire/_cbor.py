"""The CBOR value codec of wire version 2: RFC 8949 with deterministic encoding and our tags.

Encoding is our own one-pass loop (RFC 8949 §4.2.1 core deterministic encoding: shortest heads,
shortest exact floats, definite lengths, map keys sorted by their encoded bytes); decoding is
cbor2's C decoder with every built-in tag except bignums switched off, guarded by a structural
scan wherever the input could hold what cbor2 would accept but we must not (simple values,
``undefined``, oversized items). Nothing is ever unpickled.
"""

from __future__ import annotations

import enum
import secrets
import struct
from collections.abc import Iterator
from itertools import chain
from typing import Any

import cbor2

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
from ._values import Atom, ErrorValue, ExitReason, Pid, Ref

__all__ = ["CborTag", "cbor_decode", "cbor_encode"]


class CborTag(enum.IntEnum):
    """CBOR tag numbers for the OTP types (first-come-first-served range of the IANA registry)."""

    ATOM = 61440
    TUPLE = 61441
    PID = 61442
    REF = 61443
    EXIT = 61444
    ERROR = 61445


#: Tags 61446..61455 are reserved for the distribution and matching services.
_RESERVED_TAGS = range(61446, 61456)
_TAGS = {int(t) for t in CborTag}

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


def _encode_key(key: object, limits: Limits, level: int) -> _Raw:
    if type(key) is str:
        raw = _KEY_CACHE.get(key)
        if raw is None:
            raw = _Raw(_encode_str(key, limits.max_str))
            if len(key) <= _CACHE_LEN and len(_KEY_CACHE) < _CACHE_SIZE:
                _KEY_CACHE[key] = raw
        return raw
    out = bytearray()
    _encode_into(out, key, limits, level)
    return _Raw(out)


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
    out = bytearray()
    _encode_into(out, value, limits)
    return bytes(out)


def _encode_into(out: bytearray, value: object, limits: Limits, base: int = 0) -> None:
    """Encode ``value`` into ``out``; ``base`` is how deep the value sits (map keys)."""
    max_depth = limits.max_depth - base
    max_items = limits.max_items
    max_str = limits.max_str
    max_total = limits.max_total_items
    total = 1
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
                        order = _key_order(v, limits, base + len(stack) + 1)
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
                return
            it = stack.pop()


def _first(pair: tuple[bytes, Any]) -> bytes:
    return pair[0]


# The deterministic key order (encoded key, key) of dicts whose keys are all str, by key tuple:
# payload dicts have a few recurring shapes. Bounded; filled until full, never evicted. Only
# all-str key tuples go in, and a tuple of other keys never equals one of those, so a hit is
# always right (1 == True == 1.0 is why non-str keys stay out).
_ORDER_CACHE: dict[tuple[Any, ...], list[tuple[_Raw, Any]]] = {}


def _key_order(d: dict[Any, Any], limits: Limits, level: int) -> list[tuple[_Raw, Any]]:
    order = sorted(((_encode_key(k, limits, level), k) for k in d), key=_first)
    if len(_ORDER_CACHE) < _CACHE_SIZE and len(d) <= 64 and all(type(k) is str for k in d):
        _ORDER_CACHE[tuple(d)] = order
    return order


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
# Decoding


def _array(number: int, value: Any, immutable: bool, arity: int | None) -> Any:
    name = CborTag(number).name.lower()
    if type(value) is not list and not (immutable and type(value) is tuple):
        raise InvalidValue(f"tag {number} ({name}) must wrap an array (got {type(value).__name__})")
    if arity is not None and len(value) != arity:
        raise InvalidValue(
            f"tag {number} ({name}) must wrap an array of {arity} items (got {len(value)})"
        )
    return value


def _decode_tuple(value: Any, immutable: bool = False) -> tuple[Any, ...]:
    return tuple(_array(CborTag.TUPLE, value, immutable, None))


def _decode_atom(value: Any, immutable: bool = False) -> Atom:
    if type(value) is not str:
        raise InvalidValue(
            f"tag {int(CborTag.ATOM)} (atom) must wrap a text string (got {type(value).__name__})"
        )
    return Atom(value)


def _decode_pid(value: Any, immutable: bool = False) -> Pid:
    return Pid(*_array(CborTag.PID, value, immutable, 3))


def _decode_ref(value: Any, immutable: bool = False) -> Ref:
    return Ref(*_array(CborTag.REF, value, immutable, 3))


def _decode_exit(value: Any, immutable: bool = False) -> ExitReason:
    return ExitReason(*_array(CborTag.EXIT, value, immutable, 2))


def _decode_error(value: Any, immutable: bool = False) -> ErrorValue:
    return ErrorValue(*_array(CborTag.ERROR, value, immutable, 4))


def _tag_hook(tag: cbor2.CBORTag, immutable: bool = False) -> Any:
    raise UnknownValueType(
        f"unknown CBOR tag {tag.tag}: wire accepts only tags 2 and 3 (bignums) and "
        f"{min(_TAGS)}..{max(_TAGS)}"
    )


def _refuse_builtin(*args: object) -> Any:
    raise UnknownValueType(
        "a CBOR tag cbor2 knows (date, decimal, set, shared reference, ...) is not a wire type; "
        "wire accepts only tags 2 and 3 (bignums) and its own"
    )


# Every tag cbor2 0..6 decodes by itself, except the bignums, is refused.
_BUILTIN_TAGS = (0, 1, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261, 1004)
_BUILTIN_TAGS_MORE = (43000, 55799)
_SEMANTIC: dict[int, Any] = dict.fromkeys(_BUILTIN_TAGS + _BUILTIN_TAGS_MORE, _refuse_builtin)
# Our tags go through semantic decoders, not the tag hook: cbor2 decodes a tag hook's content as
# immutable (tuples, frozendicts), a semantic decoder's as ordinary lists and dicts.
_SEMANTIC.update(
    {
        CborTag.ATOM: _decode_atom,
        CborTag.TUPLE: _decode_tuple,
        CborTag.PID: _decode_pid,
        CborTag.REF: _decode_ref,
        CborTag.EXIT: _decode_exit,
        CborTag.ERROR: _decode_error,
    }
)
# What a decoded value may contain. Anything else cbor2 can produce (undefined, simple values,
# frozendict for a map used as a key, ...) is refused by a walk over the result.
_LEAVES = frozenset({str, int, float, bool, bytes, type(None), Atom, Pid, Ref})


def _check_result(value: Any, limits: Limits, check_ints: bool) -> None:
    """Refuse any type wire does not define, and big ints over ``max_bigint_bytes``.

    Sizes, counts and depth need no check here: they were bounded before decoding (by the
    payload's length, by cbor2's depth limit, or by the structural scan).
    """
    leaves = _LEAVES
    max_bits = limits.max_bigint_bytes * 8
    stack = [value]
    pop = stack.pop
    extend = stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t in leaves:
            if check_ints and t is int and v.bit_length() > max_bits:
                raise LimitExceeded(
                    f"big int of {(v.bit_length() + 7) // 8} bytes exceeds max_bigint_bytes="
                    f"{limits.max_bigint_bytes}"
                )
        elif t is list or t is tuple:
            extend(v)
        elif t is dict:
            extend(v)
            extend(v.values())
        elif t is ExitReason:
            stack.append(v.detail)
        elif t is ErrorValue:
            stack.append(v.details)
        else:
            raise UnknownValueType(
                f"the CBOR payload holds a {_cbor_name(v)}, which is not a wire type "
                "(only false, true and null of the simple values; no undefined; no map as a "
                "map key)"
            )


def _cbor_name(value: object) -> str:
    if value is cbor2.undefined:
        return "undefined"
    if type(value) is cbor2.CBORSimpleValue:
        return f"simple value {value.value}"
    return type(value).__name__


# A per-process secret appended after the payload: cbor2 ignores trailing bytes, so the payload
# is decoded as the first item of a two-item array whose second item must be this number. Any
# trailing bytes in the payload become the second item instead and the check fails.
_NONCE = secrets.randbits(63) | (1 << 62)
_SUFFIX = b"\x1b" + _NONCE.to_bytes(8, "big")


def cbor_decode(data: bytes | bytearray | memoryview, *, limits: Limits = _DEFAULT_LIMITS) -> Any:
    """Decode exactly one CBOR value with wire's tags; trailing bytes are an error.

    Args:
        data: The encoded value.
        limits: Bounds checked before anything is allocated.

    Returns:
        The value, with the same types as :func:`tlv_decode` gives for version 2.

    Raises:
        WireError: A subclass naming what was wrong; the offset is exact for structural errors
            and ``None`` for errors cbor2 reports (invalid UTF-8 in a string, bad tag content).
    """
    if type(data) is not bytes:
        data = bytes(data)
    # A payload shorter than every count and size limit cannot exceed one (each item takes at
    # least a byte, and cbor2 never allocates ahead of the bytes it has read); a longer one is
    # walked head by head first, so a huge claimed size is refused before anything is built.
    if len(data) > min(limits.max_items, limits.max_str, limits.max_total_items):
        _scan(data, limits)
    try:
        result = cbor2.loads(
            b"\x82" + data + _SUFFIX,
            tag_hook=_tag_hook,
            semantic_decoders=_SEMANTIC,
            max_depth=limits.max_depth + 1,
            allow_indefinite=False,
            allow_duplicate_keys=False,
        )
    except cbor2.CBORDecodeError as exc:
        _scan(data, limits)  # names structural problems with their exact offset
        cause = exc.__cause__
        if isinstance(cause, WireError):
            raise cause from None
        message = str(exc)
        if "text string" in message or "utf-8" in message.lower():
            raise InvalidUtf8(f"invalid CBOR text string: {message}") from exc
        if "duplicate" in message:
            raise InvalidValue(f"duplicate map key: {message}") from exc
        if "depth" in message:
            raise LimitExceeded(
                f"value nests deeper than max_depth={limits.max_depth}: {message}"
            ) from exc
        raise InvalidValue(f"invalid CBOR: {message}") from exc
    except WireError:
        raise
    if type(result) is not list or len(result) != 2 or result[1] != _NONCE:
        _scan(data, limits)
        raise TrailingBytes("bytes remain after the CBOR value; a payload holds exactly one value")
    value = result[0]
    try:
        _check_result(value, limits, len(data) > limits.max_bigint_bytes)
    except WireError:
        _scan(data, limits)  # the exact offset, where the scan can tell
        raise
    return value


def _scan(data: bytes, limits: Limits) -> None:
    """Walk the item heads of one CBOR value without building it.

    Checks well-formedness and everything cbor2 does not: definite lengths only, no simple
    values but false/true/null, no ``undefined``, only wire's tags, every limit, and no trailing
    bytes. Raises the first problem with its exact offset.
    """
    end = len(data)
    off = 0
    total = 1
    # Each entry: items still expected in an open container.
    stack: list[int] = []
    pending_bignum = False
    while True:
        if off >= end:
            raise Truncated("truncated CBOR: expected an item, found the end of the data", off)
        start = off
        if len(stack) > limits.max_depth:
            raise LimitExceeded(
                f"value nests deeper than max_depth={limits.max_depth} (an item inside more "
                f"than {limits.max_depth} arrays, maps and tags)",
                start,
            )
        ib = data[off]
        major = ib >> 5
        info = ib & 0x1F
        off += 1
        if info < 24:
            arg = info
        elif info <= 27:
            size = 1 << (info - 24)
            if off + size > end:
                raise Truncated(
                    f"truncated CBOR head: needs {size} argument bytes, only {end - off} remain",
                    start,
                )
            arg = int.from_bytes(data[off : off + size], "big")
            off += size
        elif info == 31:
            raise InvalidValue(
                "indefinite-length CBOR items are not allowed (deterministic encoding)", start
            )
        else:
            raise InvalidValue(f"malformed CBOR head 0x{ib:02x} (reserved additional info)", start)
        if pending_bignum:
            pending_bignum = False
            if major != 2:
                raise InvalidValue("bignum tag 2/3 must wrap a byte string", start)
            if arg > limits.max_bigint_bytes:
                raise LimitExceeded(
                    f"big int of {arg} bytes exceeds max_bigint_bytes={limits.max_bigint_bytes}",
                    start,
                )
        if major == 2 or major == 3:
            if arg > limits.max_str:
                raise LimitExceeded(
                    f"{'bytes' if major == 2 else 'str'} length {arg} exceeds "
                    f"max_str={limits.max_str}",
                    start,
                )
            if arg > end - off:
                raise Truncated(
                    f"truncated CBOR {'byte' if major == 2 else 'text'} string: declares {arg} "
                    f"bytes, only {end - off} remain",
                    start,
                )
            off += arg
        elif major == 4 or major == 5:
            if arg > limits.max_items:
                raise LimitExceeded(
                    f"{'array' if major == 4 else 'map'} of {arg} items exceeds "
                    f"max_items={limits.max_items}",
                    start,
                )
            count = arg * 2 if major == 5 else arg
            if count > end - off:
                raise Truncated(
                    f"truncated CBOR container: declares {count} items, only {end - off} bytes "
                    "remain",
                    start,
                )
            total += count
            if total > limits.max_total_items:
                raise LimitExceeded(
                    f"payload holds more than max_total_items={limits.max_total_items} items",
                    start,
                )
            if count:
                if stack:
                    stack[-1] -= 1
                stack.append(count)
                continue
        elif major == 6:
            if arg == 2 or arg == 3:
                pending_bignum = True
            elif arg not in _TAGS:
                raise UnknownValueType(
                    f"unknown CBOR tag {arg}: wire accepts only tags 2 and 3 (bignums) and "
                    f"{min(_TAGS)}..{max(_TAGS)}",
                    start,
                )
            # A tag is a one-item container: its content is one level deeper.
            if stack:
                stack[-1] -= 1
            stack.append(1)
            continue
        elif major == 7:
            if info < 20 or info == 23 or info == 24:
                raise UnknownValueType(
                    f"CBOR simple value {'undefined' if info == 23 else arg} is not a wire type "
                    "(only false, true and null are)",
                    start,
                )
            if 25 <= info <= 27:
                pass  # floats; their bytes were consumed as the argument
        # One item done: close every container it completes.
        if stack:
            stack[-1] -= 1
            while stack and stack[-1] == 0:
                stack.pop()
        if not stack:
            break
    if off != end:
        raise TrailingBytes(
            f"{end - off} bytes remain after the CBOR value; a payload holds exactly one value",
            off,
        )
