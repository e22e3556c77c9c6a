"""Frames and the incremental, sans-IO FrameDecoder."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire

from .strategies import v2_values

SETTINGS = settings(max_examples=100, deadline=None)

frames_v2 = st.builds(
    wire.Frame,
    st.sampled_from(list(wire.MessageType)),
    st.integers(0, 2**64 - 1),
    v2_values(15),
    version=st.just(2),
    codec=st.sampled_from(list(wire.Codec)),
)


@SETTINGS
@given(st.lists(frames_v2, min_size=1, max_size=5), st.data())
def test_frames_survive_any_split_of_the_stream(frames: list[wire.Frame], data: Any) -> None:
    stream = b"".join(wire.encode_frame(f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = wire.FrameDecoder()
    got: list[wire.Frame] = []
    last = 0
    for cut in [*cuts, len(stream)]:
        got.extend(decoder.feed(stream[last:cut]))
        last = cut
    decoder.feed_eof()
    assert got == frames
    assert decoder.buffered == 0


def test_byte_at_a_time() -> None:
    frame = wire.make_request(3, "m:A", "echo", [1, "x"], {"k": b"v"})
    data = wire.encode_frame(frame) * 2
    decoder = wire.FrameDecoder()
    got = [f for i in range(len(data)) for f in decoder.feed(data[i : i + 1])]
    assert got == [frame, frame]


def test_header_is_checked_before_the_payload_arrives() -> None:
    decoder = wire.FrameDecoder(limits=wire.Limits(max_payload=1024))
    header = b"GD\x01\x02" + (2048).to_bytes(4, "big") + bytes(8)
    with pytest.raises(wire.LimitExceeded, match="exceeds max_payload=1024") as info:
        decoder.feed(header)
    assert info.value.offset == 4


def test_the_public_header_struct_reads_the_headers_wire_writes() -> None:
    assert wire.HEADER.size == wire.HEADER_SIZE
    data = wire.MatchReply("v", rid=7).encode(wire.Codec.CBOR)
    magic, version, code, length, rid = wire.HEADER.unpack_from(data)
    assert (magic, version, rid) == (wire.MAGIC, 2, 7)
    assert code == int(wire.MessageType.M_REPLY) | wire.CBOR_FLAG
    assert length == len(data) - wire.HEADER_SIZE


def test_bad_magic_is_reported_after_two_bytes() -> None:
    with pytest.raises(wire.BadMagic, match='47 44 \\("GD"\\)'):
        wire.FrameDecoder().feed(b"HT")


def test_offsets_count_from_the_first_byte_fed() -> None:
    decoder = wire.FrameDecoder()
    good = wire.encode_frame(wire.make_end(1))
    decoder.feed(good)
    bad = b"GD\x01\x02\x00\x00\x00\x02" + bytes(8) + b"\x01\x07"
    with pytest.raises(wire.MalformedMessage):
        # a bool is a valid value but not a dict: the v1 payload rule
        decoder.feed(bad[:-1] + b"\x01")
    decoder = wire.FrameDecoder()
    decoder.feed(good)
    with pytest.raises(wire.InvalidValue, match="bool byte") as info:
        decoder.feed(bad)
    assert info.value.offset == len(good) + 17


def test_bytes_skipped_between_frames_count_in_later_offsets() -> None:
    decoder = wire.FrameDecoder()
    good = wire.encode_frame(wire.make_end(1))
    decoder.skip(len(good))  # (read straight from its bytes by the decoder's owner)
    decoder.feed(good)
    with pytest.raises(wire.BadMagic) as info:
        decoder.feed(b"XX" + bytes(14))
    assert info.value.offset == 2 * len(good)


def test_only_whole_frames_may_be_skipped() -> None:
    decoder = wire.FrameDecoder()
    with pytest.raises(ValueError, match="n >= 0"):
        decoder.skip(-1)
    decoder.feed(wire.encode_frame(wire.make_end(1))[:5])
    with pytest.raises(ValueError, match="5 bytes of one are buffered"):
        decoder.skip(16)


def test_a_failed_decoder_keeps_failing() -> None:
    decoder = wire.FrameDecoder()
    with pytest.raises(wire.BadMagic):
        decoder.feed(b"XX" + bytes(14))
    with pytest.raises(wire.BadMagic):
        decoder.feed(wire.encode_frame(wire.make_end(1)))


def test_eof_inside_a_frame_is_truncated() -> None:
    decoder = wire.FrameDecoder()
    decoder.feed(wire.encode_frame(wire.make_response(1, "x"))[:-1])
    with pytest.raises(wire.Truncated, match="ended inside a frame"):
        decoder.feed_eof()


def test_version_1_only_endpoint_refuses_version_2() -> None:
    data = wire.encode_frame(wire.Ping(1).to_frame())
    with pytest.raises(wire.UnsupportedVersion, match="accepts 1") as info:
        wire.FrameDecoder(versions=frozenset({1})).feed(data)
    assert info.value.offset == 2


def test_cbor_flag_selects_the_payload_codec() -> None:
    frame = wire.Frame(wire.MessageType.RESPONSE, 1, {"result": (1, 2)}, version=2)
    tlv = wire.encode_frame(frame)
    cbor = wire.encode_frame(frame, codec=wire.Codec.CBOR)
    assert tlv[3] == 0x02 and cbor[3] == 0x82
    decoder = wire.FrameDecoder()
    assert [f.codec for f in decoder.feed(tlv + cbor)] == [wire.Codec.TLV, wire.Codec.CBOR]


def test_frame_validation_names_the_field() -> None:
    with pytest.raises(wire.ValueOutOfRange, match=r"request_id must be an int 0\.\.2\*\*64-1"):
        wire.Frame(wire.MessageType.END, -1)
    with pytest.raises(wire.UnknownMessageType, match="exists only in version 2"):
        wire.Frame(wire.MessageType.SEND, 0, {}, version=1)
    with pytest.raises(wire.InvalidValue, match="always TLV"):
        wire.Frame(wire.MessageType.END, 0, version=1, codec=wire.Codec.CBOR)
    with pytest.raises(wire.UnknownMessageType, match="must be a MessageType"):
        wire.Frame(5, 0)  # type: ignore[arg-type]


def test_version_1_payload_must_be_a_dict() -> None:
    with pytest.raises(wire.MalformedMessage, match="must be a dict"):
        wire.encode_frame(wire.Frame(wire.MessageType.RESPONSE, 1, [1]))


def test_encoder_refuses_payloads_over_max_payload() -> None:
    limits = wire.Limits(max_payload=32)
    with pytest.raises(wire.LimitExceeded, match="max_payload=32; split it into CHUNK frames"):
        wire.encode_frame(wire.make_chunk(1, b"x" * 64), limits=limits)


def test_frames_before_bad_bytes_are_delivered_then_the_error() -> None:
    good = wire.encode_frame(wire.make_end(1))
    decoder = wire.FrameDecoder()
    assert decoder.feed(good + b"XX" + bytes(14)) == [wire.make_end(1)]
    with pytest.raises(wire.BadMagic) as info:
        decoder.feed(b"")
    assert info.value.offset == len(good)
