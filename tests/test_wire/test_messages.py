"""Dirty-protocol and distribution message helpers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wire

P = wire.Pid("a@h", 1, 1)
Q = wire.Pid("b@h", 2, 1)
R = wire.Ref("a@h", 5, 1)


@pytest.mark.parametrize(
    ("frame", "parsed"),
    [
        (
            wire.make_request(1, "m:A", "go", (1,), {"k": 2}),
            wire.Request(1, "m:A", "go", [1], {"k": 2}),
        ),
        (wire.make_response(1, [1]), wire.Response(1, [1])),
        (
            wire.make_error(1, "DirtyError", "Key not found: k"),
            wire.ErrorReply(1, "DirtyError", "Key not found: k", {}),
        ),
        (wire.make_chunk(1, b"x"), wire.Chunk(1, b"x")),
        (wire.make_end(1), wire.End(1)),
        (
            wire.make_stash(1, wire.StashOp.PUT, "t", "k", 3),
            wire.Stash(1, wire.StashOp.PUT, "t", "k", 3),
        ),
        (wire.make_status(1), wire.Status(1)),
        (wire.make_manage(1, wire.ManageOp.REMOVE, 2), wire.Manage(1, wire.ManageOp.REMOVE, 2)),
    ],
)
def test_dirty_messages_parse_back(frame: wire.Frame, parsed: object) -> None:
    (decoded,) = wire.FrameDecoder().feed(wire.encode_frame(frame))
    assert wire.parse_dirty(decoded) == parsed


def test_stash_omits_none_fields_like_gunicorn() -> None:
    assert wire.make_stash(1, wire.StashOp.KEYS, "t", pattern="a*").payload == {
        "op": 4,
        "table": "t",
        "pattern": "a*",
    }


def test_malformed_dirty_payloads_name_the_key() -> None:
    frame = wire.Frame(wire.MessageType.REQUEST, 9, {"app_path": "m:A", "action": 1})
    with pytest.raises(wire.MalformedMessage, match="key 'action' must be a str"):
        wire.parse_dirty(frame)
    frame = wire.Frame(wire.MessageType.MANAGE, 9, {"op": 7, "count": 1})
    with pytest.raises(wire.MalformedMessage, match="must be one of 1 ADD, 2 REMOVE"):
        wire.parse_dirty(frame)
    with pytest.raises(wire.MalformedMessage, match="lacks the key 'result'"):
        wire.parse_dirty(wire.Frame(wire.MessageType.RESPONSE, 9, {}))


def test_replies_are_checked_against_the_request_id() -> None:
    assert wire.check_reply(5, wire.make_response(5, 1)).request_id == 5
    with pytest.raises(wire.RequestIdMismatch, match=r"carries request id 6.*has id 5"):
        wire.check_reply(5, wire.make_response(6, 1))


@pytest.mark.parametrize(
    "message",
    [
        wire.Send(P, [1, (2, wire.Atom("x"))]),
        wire.Send(P, "m", sender=Q),
        wire.RegSend(P, wire.Atom("logger"), {"a": 1}),
        wire.RegSend(P, "logger", None),
        wire.SendBatch(P, [1, "two", (wire.Atom("x"),)]),
        wire.SendBatch(P, [], sender=Q),
        wire.RegSendBatch(P, wire.Atom("logger"), [{"a": 1}, None]),
        wire.Link(P, Q),
        wire.Unlink(P, Q),
        wire.Exit(P, Q, wire.ExitReason("shutdown", "bye")),
        wire.Monitor(P, Q, R),
        wire.Monitor(P, wire.Atom("name"), R),
        wire.MonitorSend(P, Q, R, (wire.Atom("$gen_call"), (P, R), [1, "x"])),
        wire.MonitorSend(P, "name", R, None),
        wire.Demonitor(P, Q, R),
        wire.Down(Q, P, R, wire.ExitReason("noconnection")),
        wire.Ping(3),
        wire.Pong(3),
    ],
)
@pytest.mark.parametrize("codec", list(wire.Codec))
def test_dist_messages_round_trip(message: object, codec: wire.Codec) -> None:
    frame = message.to_frame(codec)  # type: ignore[attr-defined]
    (decoded,) = wire.FrameDecoder().feed(wire.encode_frame(frame))
    assert decoded.version == 2 and decoded.codec is codec
    assert wire.parse_dist(decoded) == message


batch_items = st.lists(
    st.one_of(
        st.none(),
        st.integers(-(2**70), 2**70),
        st.text(max_size=30),
        st.binary(max_size=30),
        st.tuples(st.integers(), st.text(max_size=5)),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    ),
    max_size=300,
)


@given(batch_items, st.sampled_from(list(wire.Codec)), st.booleans())
def test_a_batch_built_from_encoded_items_equals_the_whole_payload_encoded(
    items: list[object], codec: wire.Codec, registered: bool
) -> None:
    message: wire.SendBatch | wire.RegSendBatch = (
        wire.RegSendBatch(Q, wire.Atom("logger"), items)
        if registered
        else wire.SendBatch(P, items, sender=Q)
    )
    frame = message.to_frame(codec)
    fields = {k: v for k, v in frame.payload.items() if k != "msgs"}
    built = wire.encode_batch(
        frame.type, fields, [wire.encode_value(item, codec) for item in items], codec
    )
    assert built == wire.encode_frame(frame)
    (decoded,) = wire.FrameDecoder().feed(built)
    assert wire.parse_dist(decoded) == message


def test_encode_batch_refuses_what_a_peer_would_reject() -> None:
    one = [wire.encode_value(1, wire.Codec.TLV)]
    with pytest.raises(wire.MalformedMessage, match="SEND is not a batch message type"):
        wire.encode_batch(wire.MessageType.SEND, {"to": P}, one, wire.Codec.TLV)
    with pytest.raises(wire.MalformedMessage, match="must not hold msgs"):
        wire.encode_batch(wire.MessageType.SEND_BATCH, {"to": P, "msgs": []}, one, wire.Codec.TLV)
    small = wire.Limits(max_items=2, max_payload=64)
    with pytest.raises(wire.LimitExceeded, match="batch of 3 messages exceeds max_items=2"):
        wire.encode_batch(
            wire.MessageType.SEND_BATCH, {"to": P}, one * 3, wire.Codec.TLV, limits=small
        )
    with pytest.raises(wire.LimitExceeded, match="exceeds max_payload=64"):
        wire.encode_batch(
            wire.MessageType.SEND_BATCH,
            {"to": P},
            [b"\x10" + bytes(60)],
            wire.Codec.TLV,
            limits=small,
        )
    frame = wire.Frame(wire.MessageType.SEND_BATCH, 0, {"to": P, "msgs": 1}, version=2)
    with pytest.raises(wire.MalformedMessage, match="msgs must be a list"):
        wire.parse_dist(frame)


def test_handshake_and_codec_choice() -> None:
    ours = wire.Handshake("a@h", codecs=(wire.Codec.CBOR, wire.Codec.TLV), auth={"challenge": b"n"})
    (frame,) = wire.FrameDecoder().feed(wire.encode_frame(ours.to_frame()))
    theirs = wire.parse_dist(frame)
    assert theirs == ours
    assert wire.choose_codec(ours.codecs, (wire.Codec.TLV, wire.Codec.CBOR)) is wire.Codec.CBOR
    assert wire.choose_codec(ours.codecs, (wire.Codec.TLV,)) is wire.Codec.TLV
    with pytest.raises(wire.InvalidValue, match="no common codec"):
        wire.choose_codec((wire.Codec.CBOR,), (wire.Codec.TLV,))


def test_malformed_dist_payload_names_the_field() -> None:
    frame = wire.Frame(wire.MessageType.LINK, 0, {"from": P, "to": "x"}, version=2)
    with pytest.raises(wire.MalformedMessage, match=r"Link\.to must be a Pid \(got str\)"):
        wire.parse_dist(frame)
    frame = wire.Frame(wire.MessageType.EXIT, 0, {"from": P, "to": Q}, version=2)
    with pytest.raises(wire.MalformedMessage, match="lacks the key 'reason'"):
        wire.parse_dist(frame)
    frame = wire.Frame(
        wire.MessageType.MONITOR_SEND, 0, {"from": P, "to": "x", "ref": R}, version=2
    )
    with pytest.raises(wire.MalformedMessage, match="MONITOR_SEND payload lacks the key 'msg'"):
        wire.parse_dist(frame)


def test_request_id_from_str_is_gunicorns_hash() -> None:
    assert wire.request_id_from_str("x") == hash("x") & (2**64 - 1)


@pytest.mark.parametrize("request_id", [-1, 2**64])
@pytest.mark.parametrize("payload", [None, {"a": 1}])
def test_encode_message_refuses_a_request_id_outside_u64_with_a_wire_error(
    request_id: int, payload: Any
) -> None:
    with pytest.raises(wire.ValueOutOfRange, match="request_id"):
        wire.encode_message(wire.MessageType.PING, payload, request_id=request_id)


@pytest.mark.parametrize("encode", ["frame", "message"])
def test_a_codec_given_as_a_str_is_refused_not_written_as_cbor(encode: str) -> None:
    frame = wire.Frame(wire.MessageType.RESPONSE, 1, {"result": 1}, version=2)
    codec: Any = "tlv"
    with pytest.raises(wire.WireError, match="codec"):  # was: a frame with the CBOR flag
        if encode == "frame":
            wire.encode_frame(frame, codec=codec)
        else:
            wire.encode_message(frame.type, frame.payload, codec=codec)
