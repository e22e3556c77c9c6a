"""Version 1 is Gunicorn 27's dirty protocol byte for byte, in both directions."""

from __future__ import annotations

import enum
import socket
from collections import OrderedDict, namedtuple
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire

from .strategies import I64, v1_values

tlv = pytest.importorskip("gunicorn.dirty.tlv")
protocol = pytest.importorskip("gunicorn.dirty.protocol")
TLVEncoder = tlv.TLVEncoder
BinaryProtocol = protocol.BinaryProtocol

SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(v1_values())
def test_our_tlv_bytes_equal_gunicorns(value: Any) -> None:
    assert wire.tlv_encode(value, version=1) == TLVEncoder.encode(value)


@SETTINGS
@given(v1_values())
def test_gunicorn_decodes_our_tlv_to_the_value(value: Any) -> None:
    assert TLVEncoder.decode_full(wire.tlv_encode(value, version=1)) == value


@SETTINGS
@given(v1_values())
def test_we_decode_gunicorns_tlv_to_the_value(value: Any) -> None:
    assert wire.tlv_decode(TLVEncoder.encode(value), version=1) == value


@SETTINGS
@given(st.floats())
def test_float_bits_match_including_nan(value: float) -> None:
    assert wire.tlv_encode(value, version=1) == TLVEncoder.encode(value)


@SETTINGS
@given(st.lists(I64, max_size=5).map(tuple))
def test_tuples_are_lists_in_version_1_as_in_gunicorn(value: tuple[int, ...]) -> None:
    data = wire.tlv_encode(value, version=1)
    assert data == TLVEncoder.encode(value)
    assert wire.tlv_decode(data, version=1) == list(value)


@SETTINGS
@given(
    st.dictionaries(st.one_of(I64, st.none(), st.booleans(), st.text(max_size=5)), I64, max_size=5)
)
def test_compat_mode_coerces_keys_like_gunicorn(value: dict[Any, int]) -> None:
    assert wire.tlv_encode(value, version=1, coerce_keys=True) == TLVEncoder.encode(value)


def test_strict_mode_refuses_non_str_keys_gunicorn_would_coerce() -> None:
    with pytest.raises(wire.InvalidValue, match="keys must be str"):
        wire.tlv_encode({1: "a"}, version=1)


def test_int_outside_int64_is_a_clear_error_where_gunicorn_raises_struct_error() -> None:
    with pytest.raises(wire.ValueOutOfRange, match="does not fit in int64"):
        wire.tlv_encode(2**63, version=1)


frames = st.one_of(
    st.builds(
        wire.make_request,
        st.integers(0, 2**64 - 1),
        st.text(max_size=20),
        st.text(max_size=20),
        st.lists(v1_values(8), max_size=3),
        st.dictionaries(st.text(max_size=5), v1_values(8), max_size=3),
    ),
    st.builds(wire.make_response, st.integers(0, 2**64 - 1), v1_values(10)),
    st.builds(wire.make_chunk, st.integers(0, 2**64 - 1), v1_values(10)),
    st.builds(wire.make_end, st.integers(0, 2**64 - 1)),
    st.builds(wire.make_status, st.integers(0, 2**64 - 1)),
    st.builds(
        wire.make_error,
        st.integers(0, 2**64 - 1),
        st.text(max_size=10),
        st.text(max_size=10),
        st.dictionaries(st.text(max_size=5), v1_values(5), max_size=3),
    ),
    st.builds(
        wire.make_stash,
        st.integers(0, 2**64 - 1),
        st.sampled_from(list(wire.StashOp)),
        st.text(max_size=10),
        st.one_of(st.none(), st.text(max_size=5)),
        st.one_of(st.none(), v1_values(5)),
        st.one_of(st.none(), st.text(max_size=5)),
    ),
    st.builds(
        wire.make_manage,
        st.integers(0, 2**64 - 1),
        st.sampled_from(list(wire.ManageOp)),
        st.integers(0, 100),
    ),
)


def _gunicorn_encode(frame: wire.Frame) -> bytes:
    m = wire.parse_dirty(frame)
    rid = frame.request_id
    if isinstance(m, wire.Request):
        return BinaryProtocol.encode_request(rid, m.app_path, m.action, m.args, m.kwargs)
    if isinstance(m, wire.Response):
        return BinaryProtocol.encode_response(rid, m.result)
    if isinstance(m, wire.ErrorReply):
        error = {"error_type": m.error_type, "message": m.message, "details": m.details}
        return BinaryProtocol.encode_error(rid, error)
    if isinstance(m, wire.Chunk):
        return BinaryProtocol.encode_chunk(rid, m.data)
    if isinstance(m, wire.End):
        return BinaryProtocol.encode_end(rid)
    if isinstance(m, wire.Stash):
        return BinaryProtocol.encode_stash(rid, m.op, m.table, m.key, m.value, m.pattern)
    if isinstance(m, wire.Status):
        return BinaryProtocol.encode_status(rid)
    assert isinstance(m, wire.Manage)
    return BinaryProtocol.encode_manage(rid, m.op, m.count)


@SETTINGS
@given(frames)
def test_our_frames_are_byte_identical_to_gunicorns(frame: wire.Frame) -> None:
    assert wire.encode_frame(frame) == _gunicorn_encode(frame)


@SETTINGS
@given(frames)
def test_gunicorn_decodes_our_frames(frame: wire.Frame) -> None:
    name, rid, payload = BinaryProtocol.decode_message(wire.encode_frame(frame))
    assert name == frame.type.name.lower()
    assert rid == frame.request_id
    assert payload == (frame.payload or {})


@SETTINGS
@given(frames)
def test_we_decode_gunicorns_frames(frame: wire.Frame) -> None:
    assert wire.FrameDecoder(versions=frozenset({1})).feed(_gunicorn_encode(frame)) == [frame]


def test_gunicorn_str_request_id_maps_like_gunicorn() -> None:
    message = protocol.make_request("2c1a5d1e-uuid", "m:A", "echo", ("x",))
    data = BinaryProtocol._encode_from_dict(message)
    (frame,) = wire.FrameDecoder().feed(data)
    assert frame.request_id == wire.request_id_from_str("2c1a5d1e-uuid")


def test_gunicorns_socket_reader_reads_our_frames_and_we_read_its_writes() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(wire.encode_frame(wire.make_request(7, "m:A", "echo", ["hi"], {"n": 1})))
        message = BinaryProtocol.read_message(right)
        assert message == {
            "type": "request",
            "id": 7,
            "app_path": "m:A",
            "action": "echo",
            "args": ["hi"],
            "kwargs": {"n": 1},
        }
        BinaryProtocol.write_message(right, protocol.make_response(7, {"ok": [1, 2.5, None]}))
        decoder = wire.FrameDecoder()
        frames: list[wire.Frame] = []
        while not frames:
            frames = decoder.feed(left.recv(65536))
        (reply,) = frames
        wire.check_reply(7, reply)
        assert wire.parse_dirty(reply) == wire.Response(7, {"ok": [1, 2.5, None]})


class _Int(enum.IntEnum):
    A = 3
    B = 2**40


class _Str(enum.StrEnum):
    X = "x"


_Pair = namedtuple("_Pair", "a b")


def test_subclasses_and_coerced_keys_are_byte_identical_to_gunicorn() -> None:
    value = {
        "ints": [_Int.A, _Int.B, True, -(2**63)],
        "s": _Str.X,
        "pair": _Pair(1.5, -0.0),
        "od": OrderedDict([("b", None), ("a", b"\x00")]),
        1: "one",
        "1": "str one",  # coerced, key 1 becomes a second "1"
        _Int.A: float("inf"),
    }
    ours = wire.tlv_encode(value, version=1, coerce_keys=True)
    assert ours == tlv.TLVEncoder.encode(value)
    # Gunicorn's decoder keeps the last "1"; ours refuses the duplicate, as SPEC 3.3 says.
    assert tlv.TLVEncoder.decode_full(ours)["1"] == "str one"
    with pytest.raises(wire.InvalidValue, match="duplicate dict key '1'"):
        wire.tlv_decode(ours, version=1)
