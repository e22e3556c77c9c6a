"""wire's C fast paths (wire/_speedups.c), called directly: each returns exactly what the Python
code gives, or None (never an error, never a value the Python code refuses), and takes every
ordinary value itself."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import OrderedDict
from typing import Any
from unittest import mock

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire
from wire import (
    _accel,
    _cbor,
    _cbor_general,
    _dirty_bytes,
    _frame,
    _id_triple,
    _raw_frames,
    _tlv,
    _tlv_encode,
)

from .strategies import v1_values, v2_scalars, v2_values

C: Any = _accel.C
SETTINGS = settings(max_examples=300, deadline=None)
DEFAULT = wire.Limits()

pytestmark = pytest.mark.skipif(
    C is None and bool(os.environ.get("WIRE_NO_SPEEDUPS")),
    reason="WIRE_NO_SPEEDUPS is set",
)

limits = st.builds(
    wire.Limits,
    max_depth=st.integers(1, 8),
    max_items=st.integers(1, 8),
    max_total_items=st.integers(1, 60),
    max_str=st.integers(1, 40),
    max_bigint_bytes=st.integers(9, 100),
)


def _has_big_int(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is int and not -(2**63) <= v < 2**63:
            return True
        if isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, wire.ExitReason):
            stack.append(v.detail)
        elif isinstance(v, wire.ErrorValue):
            stack.append(v.details)
    return False


def _exact_tlv(value: Any, v2: bool, lim: wire.Limits) -> bytes | None:
    out = bytearray()
    try:
        _tlv_encode._encode_loop(out, value, v2, False, lim)
    except wire.WireError:
        return None
    return bytes(out)


def _exact_cbor(value: Any, lim: wire.Limits) -> bytes | None:
    out = bytearray()
    try:
        _cbor_general._encode_into(out, value, lim)
    except wire.WireError:
        return None
    return bytes(out)


def _tlv_c(value: Any, v2: bool, lim: wire.Limits) -> bytes | None:
    return C.tlv_encode(value, v2, lim.max_depth, lim.max_items, lim.max_total_items, lim.max_str)


def _cbor_c(value: Any, lim: wire.Limits) -> bytes | None:
    return C.cbor_encode(value, lim.max_depth, lim.max_items, lim.max_total_items, lim.max_str)


def test_the_extension_is_built() -> None:
    # CI has a C compiler: a build failure must not pass unnoticed as the (slower) Python path.
    assert C is not None, (
        "wire/_speedups.c was not built, or was built from an older source: pip install -e . "
        "(it needs a C compiler)"
    )


@SETTINGS
@given(v2_values(), st.booleans(), st.one_of(st.just(DEFAULT), limits))
def test_tlv_encoding_is_the_exact_loops_or_none(value: Any, v2: bool, lim: wire.Limits) -> None:
    got = _tlv_c(value, v2, lim)
    if got is not None:
        assert got == _exact_tlv(value, v2, lim)


@SETTINGS
@given(v2_values(), st.booleans())
def test_tlv_encoding_takes_every_ordinary_value(value: Any, v2: bool) -> None:
    if _has_big_int(value):
        return  # (big ints are the Python code's: version 1 refuses them, version 2 has 0x07)
    want = _exact_tlv(value, v2, DEFAULT)
    if want is not None:  # (version 1 refuses non-str keys)
        assert _tlv_c(value, v2, DEFAULT) == want


@SETTINGS
@given(v2_values(), st.one_of(st.just(DEFAULT), limits))
def test_cbor_encoding_is_the_general_encoders_or_none(value: Any, lim: wire.Limits) -> None:
    got = _cbor_c(value, lim)
    if got is not None:
        assert got == _exact_cbor(value, lim)


@SETTINGS
@given(v1_values())
def test_cbor_encoding_takes_every_value_with_str_keys(value: Any) -> None:
    assert _cbor_c(value, DEFAULT) == _exact_cbor(value, DEFAULT)


@pytest.mark.parametrize(
    "value",
    [
        0.0, -0.0, 1.5, 65504.0, 65520.0, 1e-7, 5.960464477539063e-08, 3.4028234663852886e38,
        3.5e38, 1e300, float("inf"), float("-inf"), float("nan"), 0.1, 1 / 3,
    ],
)  # fmt: skip
def test_cbor_floats_take_the_shortest_exact_form(value: float) -> None:
    assert _cbor_c(value, DEFAULT) == _exact_cbor(value, DEFAULT)


@pytest.mark.parametrize(
    "value",
    [2**64 - 1, 2**63, -(2**63), -(2**63) - 1, -(2**64), 2**64, 24, 23, -24, -25, 255, 256],
)
def test_cbor_ints_at_the_edges(value: int) -> None:
    got = _cbor_c(value, DEFAULT)
    assert got is None or got == _exact_cbor(value, DEFAULT)
    if -(2**63) <= value < 2**64:
        assert got is not None


@pytest.mark.parametrize(
    "value",
    [
        OrderedDict(a=1), {1: "int key"}, {"k": bytearray(b"x")}, [{1, 2}], "\ud800",
        {"\ud800": 1}, 2**70, [2**70], True.__class__, object(),
    ],
)  # fmt: skip
def test_anything_unusual_is_handed_back(value: Any) -> None:
    assert _cbor_c(value, DEFAULT) is None
    assert _tlv_c(value, False, DEFAULT) is None


def test_map_keys_sort_by_their_encoded_bytes() -> None:
    # Longer keys sort after shorter ones whatever their letters (the head holds the length),
    # including across the 23/24-byte head boundary.
    value = {"b": 1, "aa": 2, "a": 3, "x" * 24: 4, "y" * 23: 5, "é": 6}
    assert _cbor_c(value, DEFAULT) == _exact_cbor(value, DEFAULT)


@st.composite
def tlv_payloads(draw: Any) -> tuple[bytes, bool]:
    """A valid payload, or one damaged by truncation, a flipped bit or an overwritten byte."""
    v2 = draw(st.booleans())
    value = draw(v2_values() if v2 else v1_values())
    data = _exact_tlv(value, v2, DEFAULT)
    if data is None:
        data = b"\x00"
    return _damaged(draw, data, ["none", "cut", "flip", "byte"]), v2


def _damaged(draw: Any, data: bytes, damages: list[str]) -> bytes:
    """``data``, or (as drawn from ``damages``) cut short, with a bit flipped, a byte
    overwritten or a byte added at the end."""
    damage = draw(st.sampled_from(damages))
    if damage == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "extra":
        data += bytes([draw(st.integers(0, 255))])
    elif damage in ("flip", "byte") and data:
        i = draw(st.integers(0, len(data) - 1))
        b = (
            data[i] ^ (1 << draw(st.integers(0, 7)))
            if damage == "flip"
            else draw(st.integers(0, 255))
        )
        data = data[:i] + bytes([b]) + data[i + 1 :]
    return data


def _exact_decode(data: bytes, v2: bool, lim: wire.Limits) -> Any:
    try:
        value, off = _tlv._decode_loop_at(data, 0, v2, lim)
    except wire.WireError:
        return _REFUSED
    return value, off


_REFUSED = object()


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or repr(a) == repr(b))


decode_limits = st.builds(
    wire.Limits,
    max_depth=st.integers(1, 8),
    max_items=st.integers(1, 8),
    max_total_items=st.integers(200, 400),
    max_str=st.integers(200, 400),
)


@settings(max_examples=300, deadline=None)
@given(tlv_payloads(), st.one_of(st.just(DEFAULT), decode_limits))
def test_tlv_decoding_is_the_exact_loops_or_none(payload: tuple[bytes, bool], lim: Any) -> None:
    data, v2 = payload
    if len(data) > _tlv._fast_size(lim):
        return  # (callers pass only payloads too short to break max_total_items and max_str)
    got = C.tlv_decode(data, v2, lim.max_depth, lim.max_items)
    want = _exact_decode(data, v2, lim)
    if got is None:
        return
    assert want is not _REFUSED, (data, got)
    assert got[1] == want[1]
    assert _same(got[0], want[0])


@SETTINGS
@given(st.binary(max_size=48), st.booleans())
def test_tlv_decoding_arbitrary_bytes(data: bytes, v2: bool) -> None:
    got = C.tlv_decode(data, v2, DEFAULT.max_depth, DEFAULT.max_items)
    if got is not None:
        want = _exact_decode(data, v2, DEFAULT)
        assert want is not _REFUSED
        assert got[1] == want[1] and _same(got[0], want[0])


@SETTINGS
@given(v2_values(), st.booleans())
def test_tlv_decoding_takes_every_ordinary_payload(value: Any, v2: bool) -> None:
    data = _exact_tlv(value, v2, DEFAULT)
    if data is None or (v2 and _has_big_int(value)):
        return
    got = C.tlv_decode(data, v2, DEFAULT.max_depth, DEFAULT.max_items)
    assert got is not None
    assert got[1] == len(data)
    assert _same(got[0], _exact_decode(data, v2, DEFAULT)[0])


def _c_decode(data: bytes) -> Any:
    got = C.tlv_decode(data, True, DEFAULT.max_depth, DEFAULT.max_items)
    assert got is not None and got[1] == len(data)
    return got[0]


def test_a_repeated_pid_or_atom_decodes_to_one_shared_value() -> None:
    # As Erlang's atom cache: the same bytes give the same (frozen) object, built without the
    # Python constructors; a ref is new each time (every call makes its own).
    pid, ref, atom = wire.Pid("a@host", 7, 3), wire.Ref("a@host", 9, 3), wire.Atom("$gen_call")
    data = _exact_tlv((pid, ref, atom), True, DEFAULT)
    assert data is not None
    first, second = _c_decode(data), _c_decode(data)
    assert _same(first, (pid, ref, atom)) and _same(second, (pid, ref, atom))
    assert first[0] is second[0] and first[2] is second[2]
    assert first[1] is not second[1]


def test_cached_pids_and_atoms_each_decode_to_their_own_bytes() -> None:
    # Far more than the cache holds, with names and fields that differ in one byte: entries
    # collide and are replaced, and every value still decodes to itself, twice.
    values: list[Any] = []
    for i in range(2000):
        values.append(wire.Pid(f"n{i % 37}@h", i // 3, i % 3))
        values.append(wire.Ref(f"n{i % 37}@h", i // 3, i % 3))
        values.append(wire.Atom(f"a{i % 700}"))
    for value in values + values[::-1]:
        data = _exact_tlv(value, True, DEFAULT)
        assert data is not None
        assert _same(_c_decode(data), value)


@st.composite
def gd1_streams(draw: Any) -> bytes:
    """GD v1 frames back to back (any message type, payload sizes from none to a few bytes),
    maybe cut short or damaged, or with a byte added."""
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        mtype = draw(st.sampled_from([t for t in wire.MessageType if t < 0x20]))
        payload = draw(st.binary(max_size=40))
        parts.append(wire.encode_header(mtype, len(payload), draw(st.integers(0, 2**64 - 1))))
        parts.append(payload)
    return _damaged(draw, b"".join(parts), ["none", "cut", "flip", "byte", "extra"])


def _buffer_frames(data: bytes, offset: int, max_payload: int) -> Any:
    """What ``FrameBuffer.frames`` gives for ``data`` received after ``offset`` bytes it has
    already taken: the frames and where the rest starts, or the error's text and raw bytes."""
    buffer = wire.FrameBuffer(size=256, max_payload=max_payload)
    buffer.buf[:offset] = bytes(offset)
    buffer.start = buffer.end = offset
    buffer.buf[offset : offset + len(data)] = data
    try:
        return buffer.frames(len(data)), buffer.start
    except wire.BadFrameHeader as exc:
        return str(exc), exc.raw, buffer.start


@SETTINGS
@given(gd1_streams(), st.integers(0, 16), st.sampled_from([wire.MAX_PAYLOAD, 0, 20]))
def test_the_gd1_scan_is_the_python_loop(data: bytes, offset: int, max_payload: int) -> None:
    # (FrameBuffer.frames: the C scan, or the Python loop naming what the scan handed back.)
    exact = None
    with mock.patch.object(_raw_frames, "_scan", None):
        exact = _buffer_frames(data, offset, max_payload)
    assert _buffer_frames(data, offset, max_payload) == exact
    found = C.gd1_scan(bytearray(bytes(offset) + data), offset, offset + len(data), max_payload)
    assert found == (exact if len(exact) == 2 else None)


def test_the_gd1_scan_takes_its_arguments_as_it_says() -> None:
    frame = wire.encode_header(2, 3, 7) + b"abc"
    assert C.gd1_scan(frame, 0, 19, 100) == ([(2, 7, 16, 19)], 19)
    assert C.gd1_scan(frame, 0, 18, 100) == ([], 0)  # (incomplete)
    assert C.gd1_scan(frame, 3, 2, 100) is None  # (an end before the start)
    assert C.gd1_scan(frame, 0, 20, 100) is None  # (beyond the buffer)
    assert C.gd1_scan("not a buffer", 0, 0, 100) is None
    with pytest.raises(TypeError, match=r"gd1_scan\(\) takes 4 to 4 arguments \(3 given\)"):
        C.gd1_scan(frame, 0, 19)


def test_the_gd1_frame_encoder_hands_back_what_the_header_cannot_hold() -> None:
    lim = (DEFAULT.max_depth, DEFAULT.max_items, DEFAULT.max_total_items, DEFAULT.max_str)
    assert C.gd1_frame(2, 7, {"result": "x"}, *lim, 100) == wire.encode_dirty(2, 7, {"result": "x"})
    assert C.gd1_frame(2, -1, {"result": "x"}, *lim, 100) is None
    assert C.gd1_frame(2, 2**64, {"result": "x"}, *lim, 100) is None
    assert C.gd1_frame(2, 1.0, {"result": "x"}, *lim, 100) is None
    assert C.gd1_frame(256, 7, {"result": "x"}, *lim, 100) is None
    assert C.gd1_frame(2, 7, {"result": "x"}, *lim, 2**32) is None
    assert C.gd1_frame(2, 7, {"result": "x"}, *lim, 15) is None  # (a 16-byte payload)
    with pytest.raises(TypeError, match=r"gd1_frame\(\) takes 8 to 8 arguments \(7 given\)"):
        C.gd1_frame(2, 7, {}, *lim)


@st.composite
def request_payloads(draw: Any) -> bytes:
    """REQUEST payloads: the four keys (some maybe missing, or another added) in any order,
    values of any v1 type, maybe damaged."""
    keys = draw(st.permutations(["app_path", "action", "args", "kwargs"]))
    keys = keys[: draw(st.sampled_from([4, 4, 4, 3]))] + draw(st.sampled_from([[], [], ["x"]]))
    typed = {"app_path": st.text(max_size=6), "action": st.text(max_size=6),
             "args": st.lists(v1_values(), max_size=3),
             "kwargs": st.dictionaries(st.text(max_size=3), v1_values(), max_size=2)}  # fmt: skip
    payload = {
        k: draw(typed[k] if k in typed and draw(st.booleans()) else v1_values()) for k in keys
    }
    return _damaged(draw, wire.tlv_encode(payload, version=1), ["none", "none", "cut", "flip"])


@SETTINGS
@given(request_payloads(), st.integers(0, 8))
def test_the_gd1_request_decoder_is_the_python_one(payload: bytes, offset: int) -> None:
    buffer = bytearray(bytes(offset) + payload + b"\x00\x01")
    with mock.patch.object(_tlv, "_C", None):
        want = _dirty_bytes._request_fields(buffer, offset, offset + len(payload))
    assert wire.request_fields(buffer, offset, offset + len(payload)) == want
    if want is not None:
        assert [type(v) for v in want] == [str, str, list, dict]


def test_the_gd1_request_decoder_hands_the_same_names_back() -> None:
    # app_path and action come from the id cache: the worker's lookups by them hash nothing.
    payload = wire.tlv_encode({"app_path": "m:App", "action": "echo", "args": [], "kwargs": {}})
    first = wire.request_fields(payload, 0, len(payload))
    again = wire.request_fields(bytearray(payload), 0, len(payload))
    assert first is not None and again is not None and first == again
    assert first[0] is again[0] and first[1] is again[1]
    assert first[2] is not again[2]  # (args and kwargs are the caller's own, each time)


def test_the_gd1_request_decoder_takes_its_arguments_as_it_says() -> None:
    payload = wire.tlv_encode({"app_path": "m:A", "action": "a", "args": [[1]], "kwargs": {}})
    n = len(payload)
    assert C.gd1_request(256, 100, 1000, payload, 0, n) == ("m:A", "a", [[1]], {})
    assert C.gd1_request(256, 100, n - 1, payload, 0, n) is None  # (past fast_size)
    assert C.gd1_request(2, 100, 1000, payload, 0, n) is None  # (args' list is too deep)
    assert C.gd1_request(256, 100, 1000, payload, 0, n + 1) is None  # (beyond the buffer)
    assert C.gd1_request(256, 100, 1000, payload, 5, 2) is None
    assert C.gd1_request(256, 100, 1000, "not a buffer", 0, 0) is None
    with pytest.raises(TypeError, match=r"gd1_request\(\) takes 6 to 6 arguments \(5 given\)"):
        C.gd1_request(256, 100, 1000, payload, 0)


@st.composite
def frame_streams(draw: Any) -> bytes:
    """Frames back to back as a peer sends them: mostly version 2 TLV, some CBOR, version 1
    or empty, the stream maybe cut short or damaged (a flipped bit, an overwritten byte)."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["tlv", "tlv", "tlv", "cbor", "v1", "empty"]))
        mtype = draw(st.sampled_from(list(wire.MessageType)))
        request_id = draw(st.integers(0, 2**64 - 1))
        if kind == "v1":
            frame = wire.Frame(wire.MessageType.REQUEST, request_id, draw(v1_values()))
        else:
            payload = None if kind == "empty" else draw(v2_values())
            codec = wire.Codec.CBOR if kind == "cbor" else wire.Codec.TLV
            frame = wire.Frame(mtype, request_id, payload, version=2, codec=codec)
        try:
            parts.append(wire.encode_frame(frame))
        except wire.WireError:
            continue
    data = b"".join(parts)
    return _damaged(draw, data, ["none", "none", "cut", "flip", "byte"])


def _exact_frames(data: bytes, lim: wire.Limits) -> tuple[list[wire.Frame], list[int]]:
    """What the Python loop delivers from ``data`` (the C paths off), and where each frame
    ends."""
    decoder = wire.FrameDecoder(limits=lim)
    frames: list[wire.Frame] = []
    with (
        mock.patch.object(_frame, "_C", None),
        mock.patch.object(_tlv, "_C", None),
        mock.patch.object(_cbor, "_C", None),
    ):
        try:
            frames = decoder.feed(data)
        except wire.WireError:
            pass
    ends = []
    end = 0
    for _ in frames:
        end += wire.HEADER_SIZE + int.from_bytes(data[end + 4 : end + 8], "big")
        ends.append(end)
    return frames, ends


def _c_frames(data: bytes, lim: wire.Limits, *, cbor: bool = True) -> tuple[list[wire.Frame], int]:
    """The C frame loop's frames from ``data`` and where it stopped: ``frames_v2`` (TLV and
    CBOR frames), or ``tlv_frames`` (TLV only) when not ``cbor``."""
    frames: list[wire.Frame] = []
    fast_size = _tlv._fast_size(lim)
    if cbor:
        cbor_size = _cbor.fast_size(lim)
        pos = C.frames_v2(
            data, 0, frames, lim.max_payload, fast_size, cbor_size, lim.max_depth, lim.max_items
        )
    else:
        pos = C.tlv_frames(
            data, 0, frames, lim.max_payload, fast_size, lim.max_depth, lim.max_items
        )
    return frames, pos


def _same_frame(a: wire.Frame, b: wire.Frame) -> bool:
    return (a.type, a.request_id, a.version, a.codec) == (
        b.type,
        b.request_id,
        b.version,
        b.codec,
    ) and _same(a.payload, b.payload)


@SETTINGS
@given(frame_streams(), st.one_of(st.just(DEFAULT), decode_limits), st.booleans())
def test_the_frame_loop_takes_a_prefix_of_the_python_loops_frames(
    data: bytes, lim: Any, cbor: bool
) -> None:
    # It stops wherever it does not take a frame whole; what it took is what the Python loop
    # delivers, frame for frame, and it stopped at a frame's end (both loops: frames_v2, and
    # tlv_frames, which stops at a CBOR frame).
    got, pos = _c_frames(data, lim, cbor=cbor)
    want, ends = _exact_frames(data, lim)
    assert len(got) <= len(want)
    assert all(_same_frame(g, w) for g, w in zip(got, want, strict=False))
    assert pos == (ends[len(got) - 1] if got else 0)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(list(wire.MessageType)), v2_values()), max_size=4))
def test_the_frame_loop_takes_every_ordinary_tlv_frame(frames: list[tuple[Any, Any]]) -> None:
    parts = []
    for mtype, value in frames:
        if _exact_tlv(value, True, DEFAULT) is not None and not _has_big_int(value):
            parts.append(wire.encode_message(mtype, value, request_id=7))
    data = b"".join(parts) + b"GD\x02"  # (and the start of the next frame)
    for cbor in (True, False):
        got, pos = _c_frames(data, DEFAULT, cbor=cbor)
        assert pos == len(data) - 3
        assert len(got) == len(parts)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(list(wire.MessageType)), v2_values()), max_size=4))
def test_the_frame_loop_takes_every_ordinary_cbor_frame(frames: list[tuple[Any, Any]]) -> None:
    parts = []
    for mtype, value in frames:
        if _exact_tlv(value, True, DEFAULT) is not None and not _has_big_int(value):
            data = wire.encode_message(mtype, value, codec=wire.Codec.CBOR, request_id=7)
            if C.cbor_decode(data[wire.HEADER_SIZE :], DEFAULT.max_depth, DEFAULT.max_items):
                parts.append(data)
    data = b"".join(parts) + b"GD\x02"  # (and the start of the next frame)
    got, pos = _c_frames(data, DEFAULT)
    assert pos == len(data) - 3
    assert [f.codec for f in got] == [wire.Codec.CBOR] * len(parts)
    assert _c_frames(data, DEFAULT, cbor=False) == ([], 0)  # (tlv_frames takes none)


def test_the_frame_loop_leaves_what_the_python_loop_must_deliver_or_name() -> None:
    ok = wire.encode_message(wire.MessageType.SEND, {"to": "x", "msg": 1})
    over = b"GD\x02\x21" + (2).to_bytes(4, "big") + bytes(8) + b"\x00\x00"  # a byte over
    cbor = wire.encode_frame(wire.Frame(wire.MessageType.SEND, 0, 1, 2, wire.Codec.CBOR))
    v1 = wire.encode_frame(wire.make_request(3, "m:A", "echo", [], {}))
    big = wire.encode_message(wire.MessageType.SEND, 2**70)
    unknown = b"GD\x02\x7f" + bytes(12)
    for rest in (over, v1, big, unknown):
        got, pos = _c_frames(ok + rest + ok, DEFAULT)
        assert (len(got), pos) == (1, len(ok)), rest
    # A CBOR frame: frames_v2 takes it, tlv_frames leaves it.
    assert _c_frames(ok + cbor + ok, DEFAULT)[1] == len(ok + cbor + ok)
    assert _c_frames(ok + cbor + ok, DEFAULT, cbor=False)[1] == len(ok)
    assert _c_frames(ok + ok[:-1], DEFAULT)[1] == len(ok)  # (an incomplete frame waits)
    decoder = wire.FrameDecoder()
    assert len(decoder.feed(ok + over)) == 1
    with pytest.raises(wire.TrailingBytes):  # (named by the Python loop, after the good frame)
        decoder.feed(b"")


# What cbor2 can give that is not a wire type, and values of subclasses of wire's types.
class _Text(str):
    pass


foreign = st.sampled_from(
    [
        cbor2.undefined,
        cbor2.CBORSimpleValue(16),
        cbor2.frozendict({1: 2}),
        frozenset({1}),
        OrderedDict(a=1),
        _Text("x"),
        bytearray(b"x"),
        1j,
        object(),
    ]
)


def _walk(value: Any) -> int | None:
    try:
        return _cbor._check_result(value)
    except wire.UnknownValueType:
        return None


@SETTINGS
@given(
    v2_values(
        scalars=st.one_of(v2_scalars, st.just(math.nan), st.floats(), foreign),
    )
)
def test_the_cbor_type_check_is_the_walk(value: Any) -> None:
    # None where the walk refuses the value (it then names what it found), else the NaNs.
    assert C.cbor_check(value) == _walk(value)


@SETTINGS
@given(v2_values(scalars=st.one_of(v2_scalars, st.just(math.nan))))
def test_the_cbor_type_check_takes_every_wire_value(value: Any) -> None:
    assert C.cbor_check(value) is not None


def test_deep_nesting_is_handed_back_not_a_crash() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert _cbor_c(deep, DEFAULT) is None
    assert _tlv_c(deep, True, DEFAULT) is None
    data = b"\x20\x00\x00\x00\x01" * 100_000 + b"\x00"
    assert C.tlv_decode(data, True, 256, DEFAULT.max_items) is None
    assert C.tlv_decode(data, True, 10_000, DEFAULT.max_items) is None  # over its own bound
    assert C.cbor_check(deep) is None


def test_the_tlv_functions_take_their_arguments_as_their_formats_said() -> None:
    # (METH_FASTCALL with its own parsing: the errors PyArg_ParseTuple's "Opinnn|n" gave.)
    lim = DEFAULT
    assert C.tlv_encode("x", 0, 8, 10, 10, 10) == wire.tlv_encode("x", version=1)
    assert C.tlv_encode("xyz", False, 8, 10, 10, 10, 7) is None  # over its max_payload
    assert C.tlv_encode("xyz", False, 8, 10, 10, 10, 8) == wire.tlv_encode("xyz", version=1)
    assert C.tlv_decode(b"\x11\x00\x00\x00\x01x", [], 8, 10) == ("x", 6)  # (v2: any truth)
    with pytest.raises(TypeError, match=r"tlv_encode\(\) takes 6 to 7 arguments \(5 given\)"):
        C.tlv_encode("x", False, 8, 10, 10)
    with pytest.raises(TypeError, match=r"tlv_decode\(\) takes 4 to 4 arguments \(5 given\)"):
        C.tlv_decode(b"\x00", False, 8, 10, 1)
    with pytest.raises(TypeError):
        C.tlv_encode("x", False, "8", 10, 10, 10)
    with pytest.raises(TypeError):
        C.tlv_decode(b"\x00", False, 8, 1.5)
    with pytest.raises(OverflowError):
        C.tlv_decode(b"\x00", False, 1 << 40, lim.max_items)
    with pytest.raises(OverflowError):
        C.tlv_encode("x", False, 8, 1 << 70, 10, 10)


def test_the_pure_python_code_runs_when_the_extension_is_off() -> None:
    code = (
        "import wire; from wire import _accel; assert _accel.C is None;"
        "v = {'a': [1, 2.5, None, b'x', (wire.Atom('ok'),)]};"
        "assert wire.tlv_decode(wire.tlv_encode(v)) == v;"
        "assert wire.cbor_decode(wire.cbor_encode(v)) == v"
    )
    env = dict(os.environ, WIRE_NO_SPEEDUPS="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_an_extension_built_from_an_older_source_is_not_used() -> None:
    # One that lacks a function the codecs call (built before it was added, and not rebuilt).
    code = (
        "import sys, types; stale = types.ModuleType('wire._speedups');"
        "stale.init = stale.cbor_encode = stale.tlv_encode = stale.tlv_decode = print;"
        "stale.frames_init = print;"
        "stale.__file__ = 'wire/_speedups.so';"
        "sys.modules['wire._speedups'] = stale;"
        "import wire; from wire import _accel; assert _accel.C is None;"
        "v = {'a': [1, 2.5, None, b'x', (wire.Atom('ok'),)]};"
        "assert wire.cbor_decode(wire.cbor_encode(v)) == v"
    )
    env = {k: v for k, v in os.environ.items() if k != "WIRE_NO_SPEEDUPS"}
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, env=env, timeout=60, capture_output=True
    )
    # ... and says so once, naming what it lacks and how to rebuild it.
    warning = done.stderr.decode()
    assert warning.count("RuntimeWarning") == 1, warning
    assert "wire/_speedups.so was built from an older wire/_speedups.c" in warning
    assert "lacks cbor_check, cbor_decode, tlv_frames, frames_v2, gd1_scan, gd1_frame" in warning
    assert "python setup.py build_ext --inplace" in warning


def test_any_buffer_decodes_a_non_contiguous_one_through_the_python_code() -> None:
    value = {"a": [1, 2, 3], "b": b"x"}
    data = wire.tlv_encode(value)
    spread = bytearray(2 * len(data))
    spread[::2] = data
    assert C.tlv_decode(memoryview(spread)[::2], True, 256, 1 << 20) is None
    assert wire.tlv_decode(memoryview(spread)[::2]) == value
    assert wire.tlv_decode(bytearray(data)) == wire.tlv_decode(memoryview(data)) == value


# -- CBOR decoding: the C decoder of the common case against cbor2 and the check -------------


@st.composite
def cbor_payloads(draw: Any) -> bytes:
    """A valid payload (of any wire value: tags, big ints, ... included), or one damaged by
    truncation, a flipped bit, an overwritten byte or a byte added at the end."""
    data = _exact_cbor(draw(v2_values()), DEFAULT) or b"\x00"
    return _damaged(draw, data, ["none", "cut", "flip", "byte", "extra"])


def _exact_cbor_decode(data: bytes, lim: wire.Limits) -> Any:
    try:
        return _cbor._decode_exact(data, lim)
    except wire.WireError:
        return _REFUSED


def _cbor_decode_c(data: bytes, lim: wire.Limits) -> Any:
    assert len(data) <= _cbor.fast_size(lim)  # (as its callers pass it)
    got = C.cbor_decode(data, lim.max_depth, lim.max_items)
    if got is not None:
        want = _exact_cbor_decode(data, lim)
        assert want is not _REFUSED, (data, got)
        assert _same_deep(got[0], want), (data, got[0], want)
    return got


def _same_deep(a: Any, b: Any) -> bool:
    """Equal, and of the same exact types all the way down (1 is not True, 1.0 not 1)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same_deep(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(
            _same_deep(k, k2) and _same_deep(a[k], b[k2]) for k, k2 in zip(a, b, strict=True)
        )
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and repr(a) == repr(b)


@settings(max_examples=500, deadline=None)
@given(cbor_payloads(), st.one_of(st.just(DEFAULT), decode_limits))
def test_cbor_decoding_is_the_exact_path_or_none(data: bytes, lim: wire.Limits) -> None:
    if len(data) <= _cbor.fast_size(lim):
        _cbor_decode_c(data, lim)


@SETTINGS
@given(st.binary(max_size=48))
def test_cbor_decoding_arbitrary_bytes(data: bytes) -> None:
    _cbor_decode_c(data, DEFAULT)


# What the C decoder takes: no tags (so no tuples, atoms, pids, refs, exit reasons, error
# values, big ints), ints of 64 bits, no float map keys.
_plain_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.binary(max_size=40),
    st.text(max_size=40),
)
_plain_keys = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=8),
    st.text(max_size=40),
)
plain_values = st.recursive(
    _plain_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(_plain_keys, inner, max_size=6)
    ),
    max_leaves=30,
)


@SETTINGS
@given(plain_values)
def test_cbor_decoding_takes_every_plain_payload(value: Any) -> None:
    data = _exact_cbor(value, DEFAULT)
    assert data is not None
    assert _cbor_decode_c(data, DEFAULT) is not None  # (and the same as the exact path's)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xd8\x27\x63abc", "a tag (an atom)"),
        (b"\xc2\x49\x01" + bytes(8), "a bignum"),
        (b"\x3b\x80" + bytes(7), "an int below -2**63"),
        (b"\x9f\x01\xff", "an indefinite length"),
        (b"\xf7", "undefined"),
        (b"\xf0", "a simple value"),
        (b"\xa1\xf9\x7e\x00\x01", "a float key"),
        (b"\xa2\x01\x01\x01\x02", "a duplicate key"),
        (b"\xa2\x01\x01\xf5\x02", "true after the key 1 (a duplicate in Python)"),
        (b"\x62\xc3\x28", "invalid UTF-8"),
        (b"\x62\xed\xa0", "a cut string"),
        (b"\x01\x02", "bytes after the value"),
        (b"\x9b" + bytes(7) + b"\x05\x01", "a count past the end"),
        (b"", "nothing"),
    ],
)
def test_cbor_decoding_hands_back_what_is_not_plain(data: bytes, why: str) -> None:
    assert C.cbor_decode(data, DEFAULT.max_depth, DEFAULT.max_items) is None, why


def test_cbor_decoding_bounds_depth_and_items_as_the_limits_say() -> None:
    nested = b"\x81" * 5 + b"\x01"  # [[[[[1]]]]]
    assert C.cbor_decode(nested, 5, 10) is not None
    assert C.cbor_decode(nested, 4, 10) is None
    assert C.cbor_decode(b"\x83\x01\x02\x03", 10, 3) is not None
    assert C.cbor_decode(b"\x83\x01\x02\x03", 10, 2) is None
    with pytest.raises(wire.LimitExceeded):
        wire.cbor_decode(b"\x83\x01\x02\x03", limits=wire.Limits(max_items=2))
    deep = b"\x81" * 100_000 + b"\x01"
    assert C.cbor_decode(deep, 10_000, DEFAULT.max_items) is None  # (past its own bound)


def test_cbor_map_keys_decoded_again_are_the_same_text() -> None:
    # Keys come from a small cache by their bytes: entries collide and are replaced, and every
    # key still decodes to itself.
    keys = [f"k{i}" for i in range(3000)] + ["", "é" * 10, "x" * 32, "y" * 33]
    for key in keys + keys[::-1]:
        got = C.cbor_decode(wire.cbor_encode({key: 1}), 256, 1 << 20)
        assert got == ({key: 1},)


def _triples() -> list[Any]:
    return [_id_triple.PY_ID_TRIPLE, *([C.IdTriple] if C is not None else [])]


@pytest.mark.parametrize("base", _triples(), ids=lambda b: b.__module__ + "." + b.__name__)
def test_id_triple_is_equal_and_hashed_by_its_three_fields(base: Any) -> None:
    class A(base):  # type: ignore[misc,valid-type]
        __slots__ = ("extra",)

    class B(base):  # type: ignore[misc,valid-type]
        __slots__ = ()

    def make(cls: Any, node: str, id: int, creation: int) -> Any:
        made = cls.__new__(cls, "ignored", key="ignored")
        made.node, made.id, made.creation = node, id, creation
        return made

    a = make(A, "n@h", 7, 1)
    same = make(A, "n@h", 7, 1)
    same.extra = "not part of the identity"
    assert a == same and not a != same and a is not same
    assert hash(a) == hash(same) == hash(("n@h", 7, 1))
    assert {a: 1}[same] == 1
    for other in (make(A, "m@h", 7, 1), make(A, "n@h", 8, 1), make(A, "n@h", 7, 2)):
        assert a != other and not a == other
    # Another class with the same fields is another identity (a Pid is never a Ref).
    b = make(B, "n@h", 7, 1)
    assert a != b and b != a and a.__eq__(b) is NotImplemented
    assert a != ("n@h", 7, 1) and a.__eq__(("n@h", 7, 1)) is NotImplemented
    with pytest.raises(TypeError):
        a < same  # noqa: B015
    # Fields first set are read back; one not set yet is an AttributeError, never a crash.
    assert (a.node, a.id, a.creation) == ("n@h", 7, 1)
    empty = A.__new__(A)
    with pytest.raises(AttributeError):
        empty.node  # noqa: B018
    with pytest.raises(AttributeError):
        hash(empty)
    with pytest.raises(AttributeError):
        empty == a  # noqa: B015
    assert empty == empty
