"""The TLV value encoder: Gunicorn 27's dirty-protocol TLV (version 1) and our extension
(version 2); the decoder is :mod:`wire._tlv`.

Version 1 is byte-for-byte ``gunicorn.dirty.tlv.TLVEncoder``; version 2 adds atoms, tuples, big
ints, pids, refs, exit reasons and error values (see ``wire/SPEC.md``). The encoder has two
paths: the optimistic recursive fast path of :mod:`wire._tlv_fast`, which gives up on anything
unusual, and the exact loop here, one loop over precompiled :class:`struct.Struct` objects with an
explicit stack (deep values cost no Python recursion, the depth limit is a plain comparison), which
decides every case the fast path leaves to it and names every error with its offset.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from itertools import chain
from typing import Any

from . import _tlv_fast
from ._accel import C as _C
from ._errors import (
    InvalidUtf8,
    InvalidValue,
    LimitExceeded,
    UnknownValueType,
    ValueOutOfRange,
)
from ._limits import FAST_MAX_PARTS, FAST_PIECE_BYTES, NO_PIECE, Limits, payload_too_large
from ._values import (
    Atom,
    ErrorValue,
    ExitReason,
    Pid,
    Ref,
)

__all__ = ["TlvType", "tlv_encode"]


class TlvType(enum.IntEnum):
    """TLV type codes. Codes 0x07, 0x12, 0x22 and 0x30..0x33 exist only in version 2."""

    NONE = 0x00
    BOOL = 0x01
    INT64 = 0x05
    FLOAT64 = 0x06
    BIGINT = 0x07
    BYTES = 0x10
    STR = 0x11
    ATOM = 0x12
    LIST = 0x20
    DICT = 0x21
    TUPLE = 0x22
    PID = 0x30
    REF = 0x31
    EXIT = 0x32
    ERROR = 0x33


_V1_CODES = frozenset({0x00, 0x01, 0x05, 0x06, 0x10, 0x11, 0x20, 0x21})
_V2_ONLY = {int(t): t.name.lower() for t in TlvType if int(t) not in _V1_CODES}

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_NAMEHDR = struct.Struct(">BI")  # type byte + u32 length/count
_INT = struct.Struct(">Bq")
_FLOAT = struct.Struct(">Bd")
_IDS = struct.Struct(">QI")  # pid/ref id + creation
_U32_unpack = _U32.unpack_from
_I64_unpack = _I64.unpack_from
_F64_unpack = _F64.unpack_from
_IDS_unpack = _IDS.unpack_from
_hdr = _NAMEHDR.pack
_int = _INT.pack
_float = _FLOAT.pack
_ids = _IDS.pack

_DEFAULT_LIMITS = Limits()
# Encoded headers of short lists and dicts, and small ints (shared with the fast path).
_LIST_HEADS = _tlv_fast.HEADS[0x20]
_DICT_HEADS = _tlv_fast.HEADS[0x21]
_SMALL_INTS = _tlv_fast.SMALL_INTS
_DEFAULT_LEFT = _DEFAULT_LIMITS.max_depth - 1  # what a dict payload leaves to its contents


def _type_name(value: object) -> str:
    return type(value).__name__


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidUtf8(
            f"cannot encode {what} as UTF-8: {exc.reason} at character {exc.start} "
            "(lone surrogates have no UTF-8 form; fix the text before sending it)"
        ) from exc


def _bigint_bytes(value: int) -> bytes:
    size = ((value if value >= 0 else ~value).bit_length() + 8) // 8
    return value.to_bytes(size, "big", signed=True)


def _normalise(value: object, v2: bool) -> object:
    """Map a subclass of a supported type (IntEnum, StrEnum, OrderedDict, namedtuple, ...) to the
    base type; anything else has no wire form."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)  # the text itself, not an Enum's str()
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    if isinstance(value, tuple):
        return tuple(value) if v2 else list(value)
    allowed = (
        "None, bool, int, float, bytes, str, list, tuple, dict, Atom, Pid, Ref, ExitReason, "
        "ErrorValue"
        if v2
        else "None, bool, int (int64), float, bytes, str, list, tuple (sent as a list), dict"
    )
    hint = ""
    if isinstance(value, (bytearray, memoryview)):
        hint = "; convert it with bytes(...)"
    elif not v2 and isinstance(value, (Atom, Pid, Ref, ExitReason, ErrorValue)):
        hint = "; it exists only in wire version 2"
    raise UnknownValueType(
        f"cannot encode a value of type {_type_name(value)} in TLV version {2 if v2 else 1}: "
        f"supported types are {allowed}{hint}"
    )


# Encoded forms (type byte, length and UTF-8) of short strings: dict keys, action names and
# other strings that repeat in every frame. Bounded; filled until full, never evicted.
_STR_CACHE: dict[str, bytes] = {}
_STR_CACHE_LEN = 64
_STR_CACHE_SIZE = 4096


def _no_cache(text: str) -> None:
    return None


def _encode_str(text: str, max_str: int) -> bytes:
    try:
        b = text.encode("utf-8")
    except UnicodeEncodeError:
        b = _utf8(text, "a str")
    n = len(b)
    if n > max_str:
        raise LimitExceeded(f"str of {n} UTF-8 bytes exceeds max_str={max_str}; send it in chunks")
    return _hdr(0x11, n) + b


def tlv_encode(
    value: object,
    *,
    version: int = 2,
    coerce_keys: bool = False,
    limits: Limits = _DEFAULT_LIMITS,
) -> bytes:
    """Encode one value as TLV.

    Args:
        value: The value. Version 1 takes None, bool, int (int64), float, bytes, str, list,
            tuple (written as a list, as Gunicorn does) and dict with str keys; version 2 also
            takes tuples (as tuples), ints of any size, :class:`Atom`, :class:`Pid`,
            :class:`Ref`, :class:`ExitReason`, :class:`ErrorValue` and hashable non-str keys.
        version: 1 (Gunicorn's dirty protocol) or 2.
        coerce_keys: Version 1 only: turn non-str dict keys into ``str(key)`` as Gunicorn does,
            instead of raising :class:`InvalidValue` (the compatibility mode).
        limits: The same limits a decoder enforces, so nothing is sent a peer must reject.

    Returns:
        The encoded bytes.

    Raises:
        UnknownValueType: A value has no wire form (sets, custom objects, bytearray, ...).
        ValueOutOfRange: An int outside int64 in version 1.
        InvalidValue: A non-str dict key in strict version 1.
        LimitExceeded: A string, container, depth or item total exceeds ``limits``.
        InvalidUtf8: A string holds lone surrogates.
    """
    if _C is not None and (version == 1 or version == 2):
        data = _C.tlv_encode(
            value,
            version == 2,
            limits.max_depth,
            limits.max_items,
            limits.max_total_items,
            limits.max_str,
            limits.max_payload,
        )
        if data is not None:
            return data
    if limits is _DEFAULT_LIMITS and type(value) is dict:
        # The common case first, in a few steps: what _encode_fast() does, for a dict under the
        # default limits.
        if version == 1:
            encode_dict = _V1_ENCODE_DICT
        elif version == 2:
            encode_dict = _V2_ENCODE_DICT
        else:
            raise InvalidValue(f"TLV version must be 1 or 2 (got {version!r})")
        parts: list[bytes] = []
        try:
            encode_dict(value, parts, _DEFAULT_LEFT)
        except Exception:
            pass
        else:
            if len(parts) <= _DEFAULT_MAX_PARTS:
                data = b"".join(parts)
                if len(data) > _DEFAULT_MAX_PAYLOAD:
                    raise payload_too_large(len(data), _DEFAULT_MAX_PAYLOAD)
                return data
        # else the exact loop names what is wrong
    else:
        if version != 2 and version != 1:
            raise InvalidValue(f"TLV version must be 1 or 2 (got {version!r})")
        fast = _encode_fast(value, version == 2, limits)
        if fast is not None:
            data = b"".join(fast)
            if len(data) > limits.max_payload:
                raise payload_too_large(len(data), limits.max_payload)
            return data
    out = bytearray()
    _encode_loop(out, value, version == 2, coerce_keys, limits)
    return bytes(out)


def _encode_into(
    out: bytearray, value: object, v2: bool, coerce_keys: bool, limits: Limits
) -> None:
    """Append the encoding of ``value`` to ``out`` (the frame encoder's entry point)."""
    if _C is not None:
        data = _C.tlv_encode(
            value,
            v2,
            limits.max_depth,
            limits.max_items,
            limits.max_total_items,
            limits.max_str,
            limits.max_payload,
        )
        if data is not None:
            out += data
            return
    parts = _encode_fast(value, v2, limits)
    if parts is not None:
        out += b"".join(parts)
    else:
        _encode_loop(out, value, v2, coerce_keys, limits)


#: The fast paths recurse once per container level; deeper limits use the exact loops alone.
_FAST_MAX_DEPTH = 300

# Fast encoders by (version 2?, max_items, max_total_items, max_str); bounded, since every
# distinct Limits makes one. Past the bound, encoders are built per call (still correct).
_ENCODERS: dict[tuple[bool, int, int, int], tuple[_tlv_fast.Encode, _tlv_fast.Encode]] = {}
_ENCODERS_SIZE = 64


def _fast_encoder(v2: bool, limits: Limits) -> tuple[_tlv_fast.Encode, _tlv_fast.Encode]:
    key = (v2, limits.max_items, limits.max_total_items, limits.max_str)
    encode = _ENCODERS.get(key)
    if encode is None:
        max_str = limits.max_str
        max_parts = min(limits.max_total_items, FAST_MAX_PARTS)

        def cache_str(text: str, parts: list[bytes]) -> bytes:
            b = _encode_str(text, max_str)
            if len(text) <= _STR_CACHE_LEN and len(_STR_CACHE) < _STR_CACHE_SIZE:
                _STR_CACHE[text] = b
            elif len(b) > FAST_PIECE_BYTES:  # the empty pieces it counts for (wire._limits)
                parts += NO_PIECE * (len(b) // FAST_PIECE_BYTES)
                if len(parts) > max_parts:
                    raise _tlv_fast.Fallback
            return b

        # The cached encodings are of strs of up to _STR_CACHE_LEN characters, so at most four
        # times as many bytes: only a max_str that large may skip the check by using them.
        cache = _STR_CACHE if max_str >= 4 * _STR_CACHE_LEN else {}
        encode = _tlv_fast.encoder(v2, limits.max_items, max_parts, max_str, cache, cache_str)
        if len(_ENCODERS) < _ENCODERS_SIZE:
            _ENCODERS[key] = encode
    return encode


_DEFAULT_ENCODERS = (_fast_encoder(False, _DEFAULT_LIMITS), _fast_encoder(True, _DEFAULT_LIMITS))
_V1_ENCODE_DICT = _DEFAULT_ENCODERS[0][1]
_V2_ENCODE_DICT = _DEFAULT_ENCODERS[1][1]
_DEFAULT_MAX_PARTS = min(_DEFAULT_LIMITS.max_total_items, FAST_MAX_PARTS)
_DEFAULT_MAX_PAYLOAD = _DEFAULT_LIMITS.max_payload


def _encode_fast(value: object, v2: bool, limits: Limits) -> list[bytes] | None:
    """The pieces of the encoding of ``value``, or None when the exact loop must encode it."""
    max_depth = limits.max_depth
    if max_depth > _FAST_MAX_DEPTH:
        return None
    encode, encode_dict = (
        _DEFAULT_ENCODERS[v2] if limits is _DEFAULT_LIMITS else _fast_encoder(v2, limits)
    )
    parts: list[bytes] = []
    try:
        if type(value) is dict:  # as encode() would, one call fewer
            encode_dict(value, parts, max_depth - 1)
        else:
            encode(value, parts, max_depth)
    except Exception:  # the exact loop gives the same bytes or names the error
        return None
    if len(parts) > (
        _DEFAULT_MAX_PARTS
        if limits is _DEFAULT_LIMITS
        else min(limits.max_total_items, FAST_MAX_PARTS)
    ):
        return None  # maybe over max_total_items or max_payload: the exact loop counts
    return parts


def _encode_loop(
    out: bytearray, value: object, v2: bool, coerce_keys: bool, limits: Limits
) -> None:
    """The exact encoder: append the encoding of ``value`` to ``out``, or raise the error.

    ``out`` is checked against ``max_payload`` after every str, bytes and big int (the only
    values that are not a few bytes each), so an encoding far over it is never built whole.
    """
    max_depth = limits.max_depth
    max_items = limits.max_items
    max_str = limits.max_str
    max_total = limits.max_total_items
    # out may already hold a frame header: the payload may take it to this length.
    start = len(out)
    max_out = start + limits.max_payload
    total = 1
    nans = 0
    cache = _STR_CACHE
    short_ok = max_str >= 4 * _STR_CACHE_LEN
    cached: Any = cache.get if short_ok else _no_cache
    small = _SMALL_INTS
    stack: list[Iterator[Any]] = []
    it: Iterator[Any] = iter((value,))
    while True:
        for v in it:
            t = type(v)
            if t is str:
                b = cached(v)
                if b is None:
                    b = _encode_str(v, max_str)
                    if len(v) <= _STR_CACHE_LEN and len(cache) < _STR_CACHE_SIZE and short_ok:
                        cache[v] = b
                out += b
                if len(out) > max_out:
                    raise payload_too_large(len(out) - start, limits.max_payload)
            elif t is int:
                if 0 <= v < 256:
                    out += small[v]
                elif _I64_MIN <= v <= _I64_MAX:
                    out += _int(0x05, v)
                elif v2:
                    b = _bigint_bytes(v)
                    if len(b) > limits.max_bigint_bytes:
                        raise LimitExceeded(
                            f"int of {len(b)} bytes exceeds max_bigint_bytes="
                            f"{limits.max_bigint_bytes}"
                        )
                    out += _hdr(0x07, len(b))
                    out += b
                    if len(out) > max_out:
                        raise payload_too_large(len(out) - start, limits.max_payload)
                else:
                    raise ValueOutOfRange(
                        f"int {v} does not fit in int64 ({_I64_MIN}..{_I64_MAX}), the only int "
                        "type of TLV version 1; send it as a str, or use wire version 2 "
                        "(big ints)"
                    )
            elif t is dict:
                n = len(v)
                if n > max_items:
                    raise LimitExceeded(f"dict of {n} pairs exceeds max_items={max_items}")
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={max_depth}")
                out += _DICT_HEADS[n] if n < 256 else _hdr(0x21, n)
                if n:
                    total += 2 * n
                    if total > max_total:
                        raise LimitExceeded(
                            f"value holds more than max_total_items={max_total} items "
                            "(is it cyclic?)"
                        )
                    items: Any = v.items()
                    if not v2:
                        for k in v:
                            if not isinstance(k, str):
                                if not coerce_keys:
                                    raise InvalidValue(
                                        f"dict key {k!r} is a {_type_name(k)}, but TLV version "
                                        "1 keys must be str; convert the keys, or use "
                                        "coerce_keys=True for Gunicorn's str(key) coercion"
                                    )
                                items = [
                                    (k2 if isinstance(k2, str) else str(k2), x)
                                    for k2, x in v.items()
                                ]
                                break
                    stack.append(it)
                    it = chain.from_iterable(items)
                    break
            elif t is list or (t is tuple and not v2):
                n = len(v)
                if n > max_items:
                    raise LimitExceeded(f"list of {n} items exceeds max_items={max_items}")
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={max_depth}")
                out += _LIST_HEADS[n] if n < 256 else _hdr(0x20, n)
                if n:
                    total += n
                    if total > max_total:
                        raise LimitExceeded(
                            f"value holds more than max_total_items={max_total} items "
                            "(is it cyclic?)"
                        )
                    stack.append(it)
                    it = iter(v)
                    break
            elif v is None:
                out.append(0x00)
            elif t is bool:
                out += b"\x01\x01" if v else b"\x01\x00"
            elif t is float:
                out += _float(0x06, v)
                if v != v:
                    nans += 1
            elif t is bytes:
                n = len(v)
                if n > max_str:
                    raise LimitExceeded(
                        f"bytes of length {n} exceeds max_str={max_str}; send it in chunks"
                    )
                out += _hdr(0x10, n)
                out += v
                if len(out) > max_out:
                    raise payload_too_large(len(out) - start, limits.max_payload)
            elif not v2:
                it = chain((_normalise(v, v2),), it)
                break
            elif t is tuple:
                n = len(v)
                if n > max_items:
                    raise LimitExceeded(f"tuple of {n} items exceeds max_items={max_items}")
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={max_depth}")
                out += _hdr(0x22, n)
                if n:
                    total += n
                    if total > max_total:
                        raise LimitExceeded(
                            f"value holds more than max_total_items={max_total} items "
                            "(is it cyclic?)"
                        )
                    stack.append(it)
                    it = iter(v)
                    break
            elif t is Atom:
                b = _utf8(v.name, "an atom")
                out += _hdr(0x12, len(b))
                out += b
            elif t is Pid or t is Ref:
                b = _utf8(v.node, "a node name")
                out += _hdr(0x30 if t is Pid else 0x31, len(b))
                out += b
                out += _ids(v.id, v.creation)
            elif t is ExitReason or t is ErrorValue:
                if len(stack) >= max_depth:
                    raise LimitExceeded(f"value nests deeper than max_depth={max_depth}")
                total += 2 if t is ExitReason else 4
                if total > max_total:
                    raise LimitExceeded(f"value holds more than max_total_items={max_total} items")
                if t is ExitReason:
                    out.append(0x32)
                    fields: tuple[Any, ...] = (v.kind, v.detail)
                else:
                    out.append(0x33)
                    fields = (v.type, v.message, v.details, v.traceback)
                stack.append(it)
                it = iter(fields)
                break
            else:
                it = chain((_normalise(v, v2),), it)
                break
        else:
            if not stack:
                if nans > 1 and v2:  # (version 1 keys are str)
                    _refuse_nan_keys(value)
                return
            it = stack.pop()


def _refuse_nan_keys(value: object) -> None:
    """Refuse a dict (anywhere in ``value``) with two NaN keys of the same bits, which the peer
    must reject as duplicates (a dict holds them apart: NaN is not equal to itself)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            dup = _nan_duplicate(v)
            if dup is not None:
                raise InvalidValue(
                    f"duplicate dict key {dup!r}: two NaN keys with the same bits "
                    f"({_F64.pack(dup).hex()}) have one encoding, which a decoder must reject"
                )
            stack.extend(v.values())
        elif isinstance(v, ExitReason):
            stack.append(v.detail)
        elif isinstance(v, ErrorValue):
            stack.append(v.details)


def _nan_duplicate(keys: Any) -> float | None:
    """A NaN among ``keys`` whose bits another NaN key shares, or None."""
    seen: set[bytes] = set()
    for k in keys:
        if type(k) is float and k != k:
            bits = _F64.pack(k)
            if bits in seen:
                return k
            seen.add(bits)
    return None
