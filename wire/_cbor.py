"""The CBOR value codec of wire version 2: RFC 8949 with deterministic encoding and our tags.

Encoding is ours (``_cbor_encode``); decoding is, where it was built, a C decoder of the common
case (``_speedups.cbor_decode``: no tags, ints of 64 bits, ...), which gives up on anything else;
then cbor2's decoder with every built-in tag switched off except the bignums (which get our size
check), followed by a check that the result holds only wire's types: in C
(``_speedups.cbor_check``) where it was built, which gives up on anything else, and otherwise, or
to name what it gave up on, a Python walk over the result. Large inputs are walked head by head
first so a huge claimed size is refused before anything is built. Nothing is ever unpickled.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import cbor2

from ._accel import C as _C
from ._cbor_encode import CborTag, cbor_encode
from ._cbor_heads import _DEFAULT_LIMITS
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

__all__ = ["CborTag", "cbor_decode", "cbor_encode", "fast_size"]

_TAGS = {int(t) for t in CborTag}
#: The fixed number of fields in the array a tag wraps.
_ARITY: dict[int, int] = {CborTag.PID: 3, CborTag.REF: 3, CborTag.EXIT: 2, CborTag.ERROR: 4}


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


def _bignum(value: Any, max_bytes: int) -> int:
    if type(value) is not bytes:
        raise InvalidValue(f"bignum tag 2/3 must wrap a byte string (got {type(value).__name__})")
    n = int.from_bytes(value, "big")
    if n.bit_length() > 8 * max_bytes:
        raise LimitExceeded(
            f"big int of {(n.bit_length() + 7) // 8} bytes exceeds max_bigint_bytes={max_bytes}"
        )
    return n


def _bignum_decoders(max_bytes: int) -> dict[int, Callable[..., int]]:
    """Decoders of tags 2 and 3 (RFC 8949 §3.4.3) that refuse magnitudes over ``max_bytes``."""

    def positive(value: Any, immutable: bool = False) -> int:
        return _bignum(value, max_bytes)

    def negative(value: Any, immutable: bool = False) -> int:
        return -1 - _bignum(value, max_bytes)

    return {2: positive, 3: negative}


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
# The decoders for the default max_bigint_bytes, and a few others, built once.
_DEFAULT_SEMANTIC = {**_SEMANTIC, **_bignum_decoders(_DEFAULT_LIMITS.max_bigint_bytes)}
_SEMANTIC_BY_BIGINT = {_DEFAULT_LIMITS.max_bigint_bytes: _DEFAULT_SEMANTIC}


def _semantic(max_bigint_bytes: int) -> dict[int, Any]:
    decoders = _SEMANTIC_BY_BIGINT.get(max_bigint_bytes)
    if decoders is None:
        decoders = {**_SEMANTIC, **_bignum_decoders(max_bigint_bytes)}
        if len(_SEMANTIC_BY_BIGINT) < 16:
            _SEMANTIC_BY_BIGINT[max_bigint_bytes] = decoders
    return decoders


# What a decoded value may contain. Anything else cbor2 can produce (undefined, simple values,
# frozendict for a map used as a key, ...) is refused by a walk over the result.
_LEAVES = frozenset({str, int, bool, bytes, type(None), Atom, Pid, Ref})


def _check_result(value: Any) -> int:
    """Refuse any type wire does not define; return how many NaNs the value holds.

    Sizes, counts and depth need no check here: they were bounded before decoding (by the
    payload's length, by cbor2's depth limit, or by the structural scan), and big ints by the
    bignum tag decoders.
    """
    leaves = _LEAVES
    stack = [value]
    pop = stack.pop
    extend = stack.extend
    nans = 0
    while stack:
        v = pop()
        t = type(v)
        if t in leaves:
            continue
        if t is float:
            if v != v:
                nans += 1
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
    return nans


def _refuse_nan_keys(value: Any) -> None:
    """Refuse a map with two NaN keys. They are duplicates (every NaN has one deterministic
    encoding, ``f9 7e 00``), but a dict holds them apart, since NaN is not equal to itself."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is list or t is tuple:
            stack.extend(v)
        elif t is dict:
            if sum(1 for k in v if type(k) is float and k != k) > 1:
                raise InvalidValue(
                    "duplicate map key NaN: a map holds two NaN keys (NaN has one encoding, "
                    "f9 7e 00)"
                )
            stack.extend(v.values())
        elif t is ExitReason:
            stack.append(v.detail)
        elif t is ErrorValue:
            stack.append(v.details)


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
_DEFAULT_SCAN_ABOVE = min(
    _DEFAULT_LIMITS.max_items, _DEFAULT_LIMITS.max_str, _DEFAULT_LIMITS.max_total_items
)


def fast_size(limits: Limits) -> int:
    """The longest payload the C decoder (``_speedups.cbor_decode``) may take under
    ``limits``: one no longer than ``max_total_items`` and ``max_str`` cannot exceed them
    (every item takes at least one byte), and those are the limits it does not check itself.
    It checks depth and ``max_items``, and gives up on the rest (tags, so big ints too)."""
    return min(limits.max_total_items, limits.max_str)


_DEFAULT_FAST_SIZE = fast_size(_DEFAULT_LIMITS)


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
    if _C is not None and len(data) <= (
        _DEFAULT_FAST_SIZE if limits is _DEFAULT_LIMITS else fast_size(limits)
    ):
        fast = _C.cbor_decode(data, limits.max_depth, limits.max_items)
        if fast is not None:
            return fast[0]
    return _decode_exact(data, limits)


def _decode_exact(data: bytes | bytearray | memoryview, limits: Limits) -> Any:
    """:func:`cbor_decode` without the C decoder: cbor2's, then the check of its result (the
    definition of what the C decoder gives, and where every error is named)."""
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data)
    # A payload shorter than every count and size limit cannot exceed one (each item takes at
    # least a byte, and cbor2 never allocates ahead of the bytes it has read); a longer one is
    # walked head by head first, so a huge claimed size is refused before anything is built.
    scanned = size > (
        _DEFAULT_SCAN_ABOVE
        if limits is _DEFAULT_LIMITS
        else min(limits.max_items, limits.max_str, limits.max_total_items)
    )
    if scanned:
        _scan(data, limits)
    try:
        result = cbor2.loads(
            b"\x82" + data + _SUFFIX,
            tag_hook=_tag_hook,
            semantic_decoders=_DEFAULT_SEMANTIC
            if limits is _DEFAULT_LIMITS
            else _semantic(limits.max_bigint_bytes),
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
    # The value's types, checked in C where it was built (it gives up on anything that is not a
    # wire type, and the walk then names it).
    nans = None if _C is None else _C.cbor_check(value)
    if nans is None:
        try:
            nans = _check_result(value)
        except WireError:
            _scan(data, limits)  # the exact offset, where the scan can tell
            raise
    if nans > 1:
        _refuse_nan_keys(value)
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
    # The tag whose content the next item is (0: none).
    tag = 0
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
        content_of = tag
        tag = 0
        if content_of == 2 or content_of == 3:
            if major != 2:
                raise InvalidValue("bignum tag 2/3 must wrap a byte string", start)
            if arg > end - off:
                raise Truncated(
                    f"truncated CBOR bignum: declares {arg} bytes, only {end - off} remain", start
                )
            # The magnitude is bounded, as cbor2's path does: leading zero bytes add nothing,
            # and max_str does not apply (SPEC 2.1).
            if arg > limits.max_bigint_bytes:
                size = len(data[off : off + arg].lstrip(b"\x00"))
                if size > limits.max_bigint_bytes:
                    raise LimitExceeded(
                        f"big int of {size} bytes exceeds max_bigint_bytes="
                        f"{limits.max_bigint_bytes}",
                        start,
                    )
            off += arg
        elif major == 2 or major == 3:
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
            # The array of a pid, ref, exit reason or error value holds the type's fields, not
            # items: max_items does not apply to it (as for TLV and the encoders).
            if arg > limits.max_items and not (major == 4 and arg == _ARITY.get(content_of)):
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
            tag = arg
            if arg != 2 and arg != 3 and arg not in _TAGS:
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
