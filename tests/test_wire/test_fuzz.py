"""Malformed input: only WireError ever comes out, and memory stays bounded."""

from __future__ import annotations

import tracemalloc
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wire

from .strategies import v1_values, v2_values

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = wire.Limits(max_payload=1 << 16, max_str=1 << 14, max_items=1 << 10, max_depth=32)


def _decode_all(data: bytes) -> None:
    for decode in (
        lambda d: wire.tlv_decode(d, version=1, limits=SMALL),
        lambda d: wire.tlv_decode(d, version=2, limits=SMALL),
        lambda d: wire.cbor_decode(d, limits=SMALL),
    ):
        try:
            decode(data)
        except wire.WireError:
            pass
    decoder = wire.FrameDecoder(limits=SMALL)
    try:
        decoder.feed(data)
        decoder.feed_eof()
    except wire.WireError:
        pass


@st.composite
def mutated(draw: Any) -> bytes:
    """Valid frames, then truncated, bit-flipped, spliced, or given huge lengths."""
    version = draw(st.sampled_from([1, 2]))
    if version == 1:
        frame = wire.make_response(draw(st.integers(0, 2**64 - 1)), draw(v1_values(10)))
    else:
        frame = wire.Frame(
            draw(st.sampled_from(list(wire.MessageType))),
            0,
            draw(v2_values(10)),
            version=2,
            codec=draw(st.sampled_from(list(wire.Codec))),
        )
    data = bytearray(wire.encode_frame(frame))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "huge", "insert", "delete"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[i:]
        elif op == "huge":
            data[i : i + 4] = draw(
                st.sampled_from([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x04\x00\x00\x00"])
            )
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[i : i + draw(st.integers(1, 4))]
    return bytes(data)


@SETTINGS
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_wire_errors(data: bytes) -> None:
    _decode_all(data)
    _decode_all(b"GD\x01\x02" + data)
    _decode_all(b"GD\x02\x21" + data)
    _decode_all(b"GD\x02\xa1" + data)


@SETTINGS
@given(mutated())
def test_mutated_frames_raise_only_wire_errors(data: bytes) -> None:
    _decode_all(data)
    _decode_all(data[16:])


@SETTINGS
@given(mutated())
def test_memory_stays_bounded(data: bytes) -> None:
    tracemalloc.start()
    try:
        _decode_all(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Claimed lengths (up to 4 GiB) are never allocated: the peak is a small multiple of the
    # input, whatever the headers say.
    assert peak < 200_000 + 200 * len(data)


def test_huge_declared_lengths_allocate_nothing() -> None:
    cases = [
        b"\x11\xff\xff\xff\xff",
        b"\x10\x03\xff\xff\xff",
        b"\x20\x00\x0f\xff\xff",
        b"\x21\x00\x0f\xff\xff" + b"\x00" * 10,
        b"\x9a\x00\x0f\xff\xff",
        b"\x5a\x03\xff\xff\xff",
    ]
    tracemalloc.start()
    try:
        for data in cases:
            for decode in (wire.tlv_decode, wire.cbor_decode):
                try:
                    decode(data)
                except wire.WireError:
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000
