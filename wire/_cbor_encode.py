"""Deterministic CBOR encoding with wire's tags (RFC 8949 §4.2.1 core deterministic encoding).

Shortest heads, shortest exact floats, definite lengths, map keys sorted by their encoded bytes.
Three encoders give the same bytes, tried in turn: the C one (``_speedups.cbor_encode``) where it
was built, the recursive fast path (``_cbor_fast``) for values built from the exact types wire
defines, each handing anything unusual (a subclass, an unknown type, a limit reached, deep
nesting) to the next, and the general iterative encoder (``_cbor_general``), which handles every
case and raises every error.
"""

from __future__ import annotations

from ._accel import C as _C
from ._cbor_fast import _fast_encode
from ._cbor_general import _encode_into
from ._cbor_heads import _DEFAULT_LIMITS, CborTag
from ._limits import Limits, payload_too_large

__all__ = ["CborTag", "cbor_encode"]


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
