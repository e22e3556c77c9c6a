"""The matching service's messages (wire/_matching.py, SPEC.md section 4.3): the table, round
trips in both codecs, every validator's message, malformed payloads, forward compatibility."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire
from wire import _matching

from .strategies import hashable, v2_values

SETTINGS = settings(max_examples=60, deadline=None)
U64 = 2**64 - 1
T = wire.MessageType
TLV, CBOR = wire.Codec.TLV, wire.Codec.CBOR

TABLE = {
    T.M_HELLO: 0x40,
    T.M_WELCOME: 0x41,
    T.M_REGISTER: 0x42,
    T.M_REGISTERED: 0x43,
    T.M_REJECTED: 0x44,
    T.M_TASK: 0x45,
    T.M_ACCEPT: 0x46,
    T.M_DECLINE: 0x47,
    T.M_OUTPUT: 0x48,
    T.M_RESULT: 0x49,
    T.M_FAILURE: 0x4A,
    T.M_PING: 0x4B,
    T.M_PONG: 0x4C,
    T.M_DRAINING: 0x4D,
    T.M_RECONNECT: 0x4E,
    T.M_CLOSE: 0x4F,
    T.M_CALL: 0x50,
    T.M_REPLY: 0x51,
    T.M_ERROR: 0x52,
    T.M_CANCEL: 0x53,
}

FLOWS = {"Order": {"steps": ["charge", "ship"], "rpcs": ["status"]}}


def _task(**changes: Any) -> wire.MatchTask:
    fields: dict[str, Any] = {
        "delivery": 7,
        "kind": "step",
        "flow_type": "Order",
        "flow_id": "o-1",
        "name": "charge",
        "execution_id": "o-1/0/charge",
        "attempt": 1,
        "args": [1],
        "state": {"n": 1},
        "timeout": 30.0,
        "rid": 1,
    }
    return wire.MatchTask(**{**fields, **changes})


#: One valid example of every message.
EXAMPLES: list[Any] = [
    wire.MatchHello("worker", "s-1", token="t", worker_id="w1", flows=FLOWS),
    wire.MatchHello("client", "s-2", codecs=(CBOR,)),
    wire.MatchWelcome("dex", CBOR, 10.0, 30.0),
    wire.MatchRegister("flow", "Order", rid=1),
    wire.MatchRegistered("worker", "w1", rid=2),
    wire.MatchRejected("already_registered", "held", True, rid=2),
    _task(),
    wire.MatchAccept(7, rid=1),
    wire.MatchDecline(7, "unknown_name", rid=1),
    wire.MatchOutput(7, {"pct": 50}, rid=1),
    wire.MatchResult(7, "ok", {"set": {"a": 1}, "delete": ["b"]}, rid=1),
    wire.MatchResult(8, None, not_yet=True, rid=1),
    _task(step_kind="wait_for"),
    wire.MatchFailure(7, "ValueError", "bad", True, rid=1),
    wire.MatchPing(rid=1),
    wire.MatchPong(),
    wire.MatchDraining(),
    wire.MatchReconnect("upgrade"),
    wire.MatchClose(rid=3),
    wire.MatchCall("describe", {"flow_id": "o-1"}, rid=9),
    wire.MatchReply([1, 2], rid=9),
    wire.MatchError("flow_not_found", "no o-2", False, {"flow_id": "o-2"}, rid=9),
    wire.MatchCancel(7, rid=1),
]


def _roundtrip(frame: wire.Frame) -> Any:
    (decoded,) = wire.FrameDecoder().feed(wire.encode_frame(frame))
    assert decoded == frame
    return wire.parse_matching(decoded)


def _frame(mtype: wire.MessageType, payload: Any, rid: int = 0, codec: wire.Codec = TLV) -> Any:
    return wire.Frame(mtype, rid, payload, version=2, codec=codec)


# -- the table -----------------------------------------------------------------------------


def test_message_types_have_the_codes_of_the_table() -> None:
    assert {t: int(t) for t in T if t.name.startswith("M_")} == TABLE


def test_every_message_type_has_one_class_and_an_example() -> None:
    assert {e.to_frame().type for e in EXAMPLES} == set(TABLE)
    assert len({type(e) for e in EXAMPLES}) == len(TABLE)


@pytest.mark.parametrize("code", sorted(TABLE.values()))
def test_frame_decoder_accepts_matching_types_in_version_2_only(code: int) -> None:
    v2 = b"GD\x02" + bytes([code]) + bytes(4) + (5).to_bytes(8, "big")
    (frame,) = wire.FrameDecoder().feed(v2)
    assert frame.type is T(code) and frame.version == 2 and frame.request_id == 5
    (frame,) = wire.FrameDecoder().feed(b"GD\x02" + bytes([code | 0x80]) + bytes(12))
    assert frame.codec is CBOR
    with pytest.raises(wire.UnknownMessageType, match="exists only in version 2") as info:
        wire.FrameDecoder().feed(b"GD\x01" + bytes([code]) + bytes(12))
    assert info.value.offset == 3
    with pytest.raises(wire.UnsupportedVersion):
        wire.FrameDecoder(versions=frozenset({1})).feed(v2)
    with pytest.raises(wire.UnknownMessageType, match="exists only in version 2"):
        wire.Frame(T(code), 0, None, version=1)


# -- round trips ---------------------------------------------------------------------------

names = st.text(min_size=1, max_size=10)
rids = st.integers(1, U64)
deliveries = st.integers(0, U64)
seconds = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)
timeouts = st.none() | st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
values = v2_values(10)
str_lists = st.lists(st.text(max_size=6), max_size=3)
flows = st.dictionaries(
    names, st.fixed_dictionaries({"steps": str_lists, "rpcs": str_lists}), max_size=3
)
codec_lists = st.lists(st.sampled_from(list(wire.Codec)), max_size=3).map(tuple)
dicts = st.dictionaries(hashable, values, max_size=4)
patches = st.fixed_dictionaries(
    {"set": st.dictionaries(st.text(max_size=5), values, max_size=3), "delete": str_lists}
)

messages = st.one_of(
    st.builds(
        wire.MatchHello,
        st.just("worker"),
        names,
        token=st.text(max_size=8),
        worker_id=names,
        codecs=codec_lists,
        flows=flows,
    ),
    st.builds(wire.MatchHello, st.just("client"), names, st.text(max_size=8), codecs=codec_lists),
    st.builds(
        wire.MatchWelcome, st.text(max_size=8), st.sampled_from(list(wire.Codec)), seconds, seconds
    ),
    st.builds(wire.MatchRegister, st.sampled_from(["flow", "worker"]), names, rid=rids),
    st.builds(wire.MatchRegistered, st.sampled_from(["flow", "worker"]), names, rid=rids),
    st.builds(wire.MatchRejected, names, st.text(max_size=8), st.booleans(), rid=rids),
    st.builds(
        wire.MatchTask,
        deliveries,
        st.sampled_from(["step", "rpc"]),
        names,
        names,
        names,
        names,
        st.integers(0, 2**70),
        st.lists(values, max_size=4),
        dicts,
        timeouts,
        rid=rids,
    ),
    st.builds(wire.MatchAccept, deliveries, rid=rids),
    st.builds(
        wire.MatchDecline,
        deliveries,
        st.sampled_from(["no_capacity", "unknown_name", "draining"]),
        st.text(max_size=8),
        rid=rids,
    ),
    st.builds(wire.MatchOutput, deliveries, values, rid=rids),
    st.builds(wire.MatchResult, deliveries, values, patches, rid=rids),
    st.builds(wire.MatchFailure, deliveries, names, st.text(max_size=8), st.booleans(), rid=rids),
    st.builds(wire.MatchPing, rid=st.integers(0, U64)),
    st.builds(wire.MatchPong, rid=st.integers(0, U64)),
    st.just(wire.MatchDraining()),
    st.builds(wire.MatchReconnect, st.text(max_size=8)),
    st.builds(wire.MatchClose, rid=rids),
    st.builds(wire.MatchCall, names, dicts, rid=rids),
    st.builds(wire.MatchReply, values, rid=rids),
    st.builds(
        wire.MatchError, names, st.text(max_size=8), st.booleans(), dicts, rid=st.integers(0, U64)
    ),
)


@SETTINGS
@given(messages, st.sampled_from(list(wire.Codec)))
def test_every_message_survives_a_round_trip_in_both_codecs(
    message: Any, codec: wire.Codec
) -> None:
    frame = message.to_frame(codec)
    assert frame.version == 2
    if type(message) in (wire.MatchHello, wire.MatchWelcome):
        assert frame.codec is TLV
    else:
        assert frame.codec is codec
    assert _roundtrip(frame) == message


@SETTINGS
@given(messages, st.sampled_from(list(wire.Codec)))
def test_encode_writes_the_bytes_of_the_messages_frame(message: Any, codec: wire.Codec) -> None:
    # (the connections' hot path skips the Frame; the bytes must be the frame's, TLV for
    # M_HELLO and M_WELCOME whatever the codec asked)
    frame = message.to_frame(codec)
    assert message.encode(codec) == wire.encode_frame(frame, codec=frame.codec)


@SETTINGS
@given(names, dicts, rids, st.sampled_from(list(wire.Codec)))
def test_encode_call_writes_the_bytes_of_its_match_call(
    op: str, args: dict[Any, Any], rid: int, codec: wire.Codec
) -> None:
    assert wire.encode_call(op, args, rid, codec) == wire.MatchCall(op, args, rid=rid).encode(codec)


@pytest.mark.parametrize(
    ("op", "args", "rid", "field"),
    [("", {}, 1, "op"), (1, {}, 1, "op"), ("x", [], 1, "args"), ("x", {}, 0, "rid")],
)
def test_encode_call_refuses_what_match_call_refuses(
    op: Any, args: Any, rid: Any, field: str
) -> None:
    with pytest.raises(wire.InvalidValue, match=f"MatchCall.{field}"):
        wire.encode_call(op, args, rid)
    with pytest.raises(wire.LimitExceeded):
        wire.encode_call("x", {"a": "x" * 100}, 1, limits=wire.Limits(max_payload=50))


def test_encode_checks_the_limits_it_is_given() -> None:
    reply = wire.MatchReply("x" * 100, rid=1)
    with pytest.raises(wire.LimitExceeded):
        reply.encode(CBOR, limits=wire.Limits(max_payload=50))
    with pytest.raises(wire.LimitExceeded):
        reply.encode(TLV, limits=wire.Limits(max_payload=50))


@pytest.mark.parametrize("codec", list(wire.Codec))
@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_example_round_trips(message: Any, codec: wire.Codec) -> None:
    assert _roundtrip(message.to_frame(codec)) == message


def test_request_id_is_rid_and_payload_keys_are_the_attributes() -> None:
    frame = wire.MatchAccept(7, rid=3).to_frame()
    assert (frame.request_id, frame.payload) == (3, {"delivery": 7})
    frame = wire.MatchHello("client", "s").to_frame(CBOR)
    assert frame.codec is TLV and frame.request_id == 0
    assert frame.payload == {
        "role": "client",
        "session": "s",
        "token": "",
        "codecs": ["tlv", "cbor"],
        "flows": {},
    }
    assert wire.MatchWelcome("dex", "cbor", 1, 3).to_frame().payload == {
        "server": "dex",
        "codec": "cbor",
        "ping_interval": 1.0,
        "peer_timeout": 3.0,
    }
    for empty in (
        wire.MatchPing(rid=2),
        wire.MatchPong(),
        wire.MatchDraining(),
        wire.MatchClose(rid=1),
    ):
        assert empty.to_frame().payload is None


def test_defaults_and_conversions() -> None:
    hello = wire.MatchHello("worker", "s", worker_id="w", codecs=["cbor", TLV])
    assert hello.token == "" and hello.codecs == (CBOR, TLV) and hello.flows == {}
    assert wire.MatchHello("client", "s").codecs == (TLV, CBOR)
    welcome = wire.MatchWelcome("dex", "tlv", 5, 15)
    assert welcome.codec is TLV and type(welcome.ping_interval) is float
    assert _task(timeout=2).timeout == 2.0 and _task(timeout=None).timeout is None
    assert wire.MatchResult(1, None, rid=1).patch == {"set": {}, "delete": []}
    assert wire.MatchDecline(1, "draining", rid=1).message == ""
    error = wire.MatchError("internal", "boom")
    assert (error.retryable, error.details, error.rid) == (False, {}, 0)
    assert wire.MatchPing().rid == 0 and wire.MatchReconnect().reason == ""


def test_vectors_of_the_matching_frames_parse_and_re_encode() -> None:
    vectors = json.loads((Path(wire.__file__).parent / "vectors.json").read_text())
    matching = [v for v in vectors["frames"] if v["frame"]["type"].startswith("M_")]
    assert {v["frame"]["type"] for v in matching} == {t.name for t in TABLE}
    for vector in matching:
        data = bytes.fromhex(vector["hex"])
        (frame,) = wire.FrameDecoder().feed(data)
        message = wire.parse_matching(frame)
        assert wire.encode_frame(message.to_frame(frame.codec)) == data, vector["name"]


# -- validators: every message names the field, what it must be, and what it got ------------

BAD: list[tuple[Callable[[], object], str]] = [
    (
        lambda: wire.MatchHello("admin", "s"),
        "MatchHello.role must be 'worker' or 'client' (got 'admin')",
    ),
    (lambda: wire.MatchHello("client", ""), "MatchHello.session must be a non-empty str (got '')"),
    (lambda: wire.MatchHello("client", "s", None), "MatchHello.token must be a str (got None)"),
    (
        lambda: wire.MatchHello("worker", "s", worker_id=""),
        "MatchHello.worker_id must be None or a non-empty str (got '')",
    ),
    (
        lambda: wire.MatchHello("worker", "s"),
        "MatchHello.worker_id must be a non-empty str for role 'worker' (got None)",
    ),
    (
        lambda: wire.MatchHello("client", "s", worker_id="w"),
        "MatchHello.worker_id must be None for role 'client' (got 'w')",
    ),
    (
        lambda: wire.MatchHello("client", "s", flows=FLOWS),
        "MatchHello.flows must be empty for role 'client' (got 1 flow type)",
    ),
    (
        lambda: wire.MatchHello("client", "s", codecs="tlv"),
        "MatchHello.codecs must be a list of Codec (or 'tlv'/'cbor') (got 'tlv')",
    ),
    (
        lambda: wire.MatchHello("client", "s", codecs=["tlv", "json"]),
        "MatchHello.codecs must be a list of Codec (or 'tlv'/'cbor') (got 'json' in the list)",
    ),
    (
        lambda: wire.MatchHello("worker", "s", worker_id="w", flows=[]),
        'MatchHello.flows must be a dict {flow_type: {"steps": [str], "rpcs": [str]}} (got list)',
    ),
    (
        lambda: wire.MatchHello("worker", "s", worker_id="w", flows={"": FLOWS["Order"]}),
        "MatchHello.flows must be keyed by non-empty str flow types (got '')",
    ),
    (
        lambda: wire.MatchHello("worker", "s", worker_id="w", flows={"F": ["a"]}),
        'MatchHello.flows[\'F\'] must be a dict {"steps": [str], "rpcs": [str]} (got list)',
    ),
    (
        lambda: wire.MatchHello("worker", "s", worker_id="w", flows={"F": {"rpcs": []}}),
        "MatchHello.flows['F']['steps'] must be a list of str (got no 'steps' key)",
    ),
    (
        lambda: wire.MatchHello(
            "worker", "s", worker_id="w", flows={"F": {"steps": [], "rpcs": [1]}}
        ),
        "MatchHello.flows['F']['rpcs'] must be a list of str (got list)",
    ),
    (lambda: wire.MatchWelcome(b"dex", TLV, 1, 3), "MatchWelcome.server must be a str (got bytes)"),
    (
        lambda: wire.MatchWelcome("dex", "json", 1, 3),
        "MatchWelcome.codec must be a Codec (or 'tlv' or 'cbor') (got 'json')",
    ),
    (
        lambda: wire.MatchWelcome("dex", TLV, 0, 3),
        "MatchWelcome.ping_interval must be a number of seconds > 0 (got 0.0)",
    ),
    (
        lambda: wire.MatchWelcome("dex", TLV, 1, float("inf")),
        "MatchWelcome.peer_timeout must be a number of seconds > 0 (got inf)",
    ),
    (
        lambda: wire.MatchWelcome("dex", TLV, True, 3),
        "MatchWelcome.ping_interval must be a number of seconds > 0 (got True)",
    ),
    (
        lambda: wire.MatchRegister("queue", "Order", rid=1),
        "MatchRegister.queue must be 'flow' or 'worker' (got 'queue')",
    ),
    (
        lambda: wire.MatchRegister("flow", "", rid=1),
        "MatchRegister.name must be a non-empty str (got '')",
    ),
    (
        lambda: wire.MatchRegister("flow", "Order", rid=0),
        "MatchRegister.rid must be a stream id (the frame's request id), an int 1..2**64-1 (got 0)",
    ),
    (
        lambda: wire.MatchRegistered("flow", "Order", rid=2**64),
        "MatchRegistered.rid must be a stream id (the frame's request id), an int 1..2**64-1 "
        "(got 18446744073709551616)",
    ),
    (
        lambda: wire.MatchRejected("limit", "too many", 1, rid=1),
        "MatchRejected.permanent must be a bool (got 1)",
    ),
    (
        lambda: _task(delivery=-1),
        "MatchTask.delivery must be a delivery id, an int 0..2**64-1 (got -1)",
    ),
    (
        lambda: _task(delivery=True),
        "MatchTask.delivery must be a delivery id, an int 0..2**64-1 (got True)",
    ),
    (lambda: _task(kind="job"), "MatchTask.kind must be 'step' or 'rpc' (got 'job')"),
    (lambda: _task(flow_id=None), "MatchTask.flow_id must be a non-empty str (got None)"),
    (lambda: _task(attempt=-1), "MatchTask.attempt must be an int >= 0 (got -1)"),
    (lambda: _task(args=(1,)), "MatchTask.args must be a list (got tuple)"),
    (lambda: _task(state=[]), "MatchTask.state must be a dict (got list)"),
    (
        lambda: _task(timeout=-1.0),
        "MatchTask.timeout must be None or a number of seconds >= 0 (got -1.0)",
    ),
    (
        lambda: _task(timeout="5"),
        "MatchTask.timeout must be None or a number of seconds >= 0 (got '5')",
    ),
    (
        lambda: wire.MatchAccept(7, rid=None),
        "MatchAccept.rid must be a stream id (the frame's request id), an int 1..2**64-1 "
        "(got None)",
    ),
    (
        lambda: wire.MatchDecline(7, "busy", rid=1),
        "MatchDecline.reason must be 'no_capacity', 'unknown_name' or 'draining' (got 'busy')",
    ),
    (
        lambda: wire.MatchResult(7, 1, {"set": {}}, rid=1),
        "MatchResult.patch['delete'] must be a list (got no 'delete' key)",
    ),
    (
        lambda: wire.MatchResult(7, 1, {"set": [], "delete": []}, rid=1),
        "MatchResult.patch['set'] must be a dict (got list)",
    ),
    (
        lambda: wire.MatchResult(7, 1, None, rid=1),
        'MatchResult.patch must be a dict {"set": dict, "delete": list} (got None)',
    ),
    (
        lambda: wire.MatchFailure(7, "", "bad", False, rid=1),
        "MatchFailure.type must be a non-empty str (got '')",
    ),
    (
        lambda: wire.MatchPing(rid=-1),
        "MatchPing.rid must be a stream id (the frame's request id), an int 1..2**64-1, or 0 for "
        "the connection (got -1)",
    ),
    (
        lambda: wire.MatchClose(rid=0),
        "MatchClose.rid must be a stream id (the frame's request id), an int 1..2**64-1 (got 0)",
    ),
    (lambda: wire.MatchReconnect(None), "MatchReconnect.reason must be a str (got None)"),
    (lambda: wire.MatchCall("", {}, rid=1), "MatchCall.op must be a non-empty str (got '')"),
    (lambda: wire.MatchCall("list", [], rid=1), "MatchCall.args must be a dict (got list)"),
    (
        lambda: wire.MatchCall("list", {}, rid=0),
        "MatchCall.rid must be a call id (the frame's request id), an int 1..2**64-1 (got 0)",
    ),
    (
        lambda: wire.MatchReply(1, rid=0),
        "MatchReply.rid must be a call id (the frame's request id), an int 1..2**64-1 (got 0)",
    ),
    (
        lambda: wire.MatchError("internal", "x", rid=-1),
        "MatchError.rid must be a call id (the frame's request id), an int 1..2**64-1, or 0 for "
        "the connection (got -1)",
    ),
    (
        lambda: wire.MatchError("internal", "x", details=None),
        "MatchError.details must be a dict (got None)",
    ),
]


@pytest.mark.parametrize(("build", "message"), BAD, ids=[m for _, m in BAD])
def test_validator_names_field_expectation_and_value(
    build: Callable[[], object], message: str
) -> None:
    with pytest.raises(wire.InvalidValue) as info:
        build()
    assert info.value.message == message


def test_a_long_value_is_shortened_in_the_message() -> None:
    with pytest.raises(wire.InvalidValue, match=r"\(got 'xxxx.*\.\.\.\)$"):
        wire.MatchHello("x" * 100, "s")
    with pytest.raises(wire.InvalidValue, match=r"ping_interval must be .* \(got 10+\.\.\.\)$"):
        wire.MatchWelcome("dex", TLV, 10**400, 3)


# -- parse_matching: malformed frames ----------------------------------------------------------


def _payload(message: Any) -> dict[str, Any]:
    payload = message.to_frame().payload
    assert type(payload) is dict
    return dict(payload)


MALFORMED: list[tuple[wire.Frame, str]] = [
    (
        _frame(T.M_TASK, {k: v for k, v in _payload(_task()).items() if k != "attempt"}, 1),
        "M_TASK payload lacks the key 'attempt'",
    ),
    (
        _frame(T.M_TASK, {**_payload(_task()), "delivery": "7"}, 1),
        "malformed M_TASK frame: MatchTask.delivery must be a delivery id, an int 0..2**64-1 "
        "(got '7')",
    ),
    (
        _frame(T.M_TASK, {**_payload(_task()), "kind": "job"}, 1, CBOR),
        "malformed M_TASK frame: MatchTask.kind must be 'step' or 'rpc' (got 'job')",
    ),
    (
        _frame(T.M_HELLO, {**_payload(EXAMPLES[1]), "role": "admin"}),
        "malformed M_HELLO frame: MatchHello.role must be 'worker' or 'client' (got 'admin')",
    ),
    (
        _frame(T.M_HELLO, {k: v for k, v in _payload(EXAMPLES[1]).items() if k != "session"}),
        "M_HELLO payload lacks the key 'session'",
    ),
    (
        _frame(T.M_HELLO, _payload(EXAMPLES[1]), codec=CBOR),
        "M_HELLO frames are always TLV (got a CBOR payload)",
    ),
    (
        _frame(T.M_WELCOME, _payload(EXAMPLES[2]), codec=CBOR),
        "M_WELCOME frames are always TLV (got a CBOR payload)",
    ),
    (
        _frame(T.M_WELCOME, {**_payload(EXAMPLES[2]), "codec": "json"}),
        "malformed M_WELCOME frame: MatchWelcome.codec must be a Codec (or 'tlv' or 'cbor') "
        "(got 'json')",
    ),
    (
        _frame(T.M_WELCOME, _payload(EXAMPLES[2]), 4),
        "M_WELCOME is a connection-level message: its request id must be 0 (got 4)",
    ),
    (
        _frame(T.M_DRAINING, None, 4),
        "M_DRAINING is a connection-level message: its request id must be 0 (got 4)",
    ),
    (
        _frame(T.M_ACCEPT, {"delivery": 7}, 0),
        "malformed M_ACCEPT frame: MatchAccept.rid must be a stream id (the frame's request id), "
        "an int 1..2**64-1 (got 0)",
    ),
    (
        _frame(T.M_CLOSE, None, 0),
        "malformed M_CLOSE frame: MatchClose.rid must be a stream id (the frame's request id), "
        "an int 1..2**64-1 (got 0)",
    ),
    (
        _frame(T.M_REPLY, {"value": 1}, 0, CBOR),
        "malformed M_REPLY frame: MatchReply.rid must be a call id (the frame's request id), an "
        "int 1..2**64-1 (got 0)",
    ),
    (
        _frame(T.M_DECLINE, {"delivery": 7, "reason": "busy", "message": ""}, 1),
        "malformed M_DECLINE frame: MatchDecline.reason must be 'no_capacity', 'unknown_name' or "
        "'draining' (got 'busy')",
    ),
    (
        _frame(T.M_RESULT, {"delivery": 7, "value": 1, "patch": {"set": {}}}, 1),
        "malformed M_RESULT frame: MatchResult.patch['delete'] must be a list (got no 'delete' "
        "key)",
    ),
    (
        _frame(T.M_FAILURE, {"delivery": 7, "type": "E", "message": "m", "retryable": 0}, 1),
        "malformed M_FAILURE frame: MatchFailure.retryable must be a bool (got 0)",
    ),
    (_frame(T.M_ACCEPT, [7], 1), "the M_ACCEPT payload must be a dict (got list)"),
    (_frame(T.M_REPLY, None, 1), "the M_REPLY payload must be a dict (got an empty payload)"),
    (_frame(T.M_PING, "x", 1), "the M_PING payload must be a dict (got str)"),
    (_frame(T.SEND, {}, 0), "SEND is not a matching message type"),
]


@pytest.mark.parametrize(("frame", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_frame_names_message_and_key(frame: wire.Frame, message: str) -> None:
    data = wire.encode_frame(frame)
    (decoded,) = wire.FrameDecoder().feed(data)
    with pytest.raises(wire.MalformedMessage) as info:
        wire.parse_matching(decoded)
    assert info.value.message == message


@SETTINGS
@given(messages, st.data())
def test_any_missing_required_key_is_malformed(message: Any, data: Any) -> None:
    frame = message.to_frame()
    if not frame.payload:
        return
    key = data.draw(st.sampled_from(sorted(frame.payload)))
    optional = {"worker_id", "flows", "step_kind", "not_yet"}
    if type(message) in (wire.MatchHello, wire.MatchTask, wire.MatchResult) and key in optional:
        return
    payload = {k: v for k, v in frame.payload.items() if k != key}
    with pytest.raises(
        wire.MalformedMessage, match=f"{frame.type.name} payload lacks the key {key!r}"
    ):
        wire.parse_matching(_frame(frame.type, payload, frame.request_id))


# What a field of the messages parse_matching builds without their constructor may be instead
# (``wire/_matching_fast.py``): every shape the validators tell apart, and a missing key.
_MISSING = object()
odd_values = st.one_of(
    st.sampled_from(
        [_MISSING, None, True, False, 0, 1, -1, 2**64 - 1, 2**64, 0.0, 1.5, -1.0, "", "x"]
    ),
    st.sampled_from(["step", "rpc", "execute", "wait_for", math.inf, math.nan, [], {}]),
    st.sampled_from([{"set": {}}, {"set": {}, "delete": []}, {"set": [], "delete": []}]),
    v2_values(),
)


@SETTINGS
@given(
    st.sampled_from(
        [
            _task(),
            _task(timeout=None, step_kind="execute"),
            wire.MatchReply([1], rid=3),
            wire.MatchAccept(7, rid=2),
            wire.MatchResult(7, "v", {"set": {"a": 1}, "delete": ["b"]}, rid=2),
            wire.MatchResult(7, None, not_yet=True, rid=2),
            wire.MatchFailure(7, "E", "m", True, rid=2),
            wire.MatchCall("start_flow", {"a": 1}, rid=5),
        ]
    ),
    st.data(),
)
def test_the_fast_builds_give_what_the_constructors_give(message: Any, data: Any) -> None:
    # A valid message with its fields changed: the same message or the same error, with the
    # fast builders and without them.
    frame = message.to_frame()
    payload = dict(frame.payload)
    keys = [*payload, "step_kind", "not_yet"]
    for key in data.draw(st.lists(st.sampled_from(keys), max_size=3)):
        value = data.draw(odd_values)
        if value is _MISSING:
            payload.pop(key, None)
        else:
            payload[key] = value
    rid = data.draw(st.sampled_from([frame.request_id, 0, 2**64 - 1]))
    changed = _frame(frame.type, payload, rid)

    def parse() -> tuple[str, Any]:
        try:
            got = wire.parse_matching(changed)
        except wire.MalformedMessage as exc:
            return "error", exc.message
        return "message", (type(got), repr(got))

    fast = parse()
    with mock.patch.object(_matching, "_FAST", {}):
        assert parse() == fast


def test_hello_optional_keys_may_be_left_out() -> None:
    client = {"role": "client", "session": "s", "token": "", "codecs": ["tlv"]}
    assert wire.parse_matching(_frame(T.M_HELLO, client)) == wire.MatchHello(
        "client", "s", codecs=(TLV,)
    )
    worker = {**client, "role": "worker", "worker_id": "w"}
    assert wire.parse_matching(_frame(T.M_HELLO, worker)).flows == {}
    with pytest.raises(
        wire.MalformedMessage, match="worker_id must be a non-empty str for role 'worker'"
    ):
        wire.parse_matching(_frame(T.M_HELLO, {**client, "role": "worker"}))


def test_a_tasks_step_kind_and_a_results_not_yet_may_be_left_out() -> None:
    task = _task().to_frame()
    assert "step_kind" not in task.payload
    assert wire.parse_matching(task).step_kind is None
    check = _task(step_kind="wait_for").to_frame()
    assert check.payload["step_kind"] == "wait_for"
    assert wire.parse_matching(check).step_kind == "wait_for"
    result = wire.MatchResult(7, 1, rid=1).to_frame()
    assert "not_yet" not in result.payload
    assert wire.parse_matching(result).not_yet is None
    assert wire.MatchResult(7, None, not_yet=True, rid=1).to_frame().payload["not_yet"] is True
    with pytest.raises(wire.MalformedMessage, match="step_kind"):
        wire.parse_matching(_frame(T.M_TASK, {**task.payload, "step_kind": "sleep"}, 1))
    with pytest.raises(wire.MalformedMessage, match="not_yet"):
        wire.parse_matching(_frame(T.M_RESULT, {**result.payload, "not_yet": 1}, 1))


# -- forward compatibility -----------------------------------------------------------------


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_unknown_payload_keys_are_ignored(message: Any) -> None:
    frame = message.to_frame()
    payload = {**(frame.payload or {}), "added_in_v3": [1, 2], 7: None}
    assert wire.parse_matching(_frame(frame.type, payload, frame.request_id)) == message


def test_unknown_codec_names_in_hello_are_dropped() -> None:
    payload = {**_payload(EXAMPLES[1]), "codecs": ["zstd-cbor", "cbor"]}
    assert wire.parse_matching(_frame(T.M_HELLO, payload)).codecs == (CBOR,)
    payload["codecs"] = ["zstd-cbor"]
    assert wire.parse_matching(_frame(T.M_HELLO, payload)).codecs == ()
    payload["codecs"] = ["tlv", 1]
    with pytest.raises(
        wire.MalformedMessage, match=r"codecs must be a list .*\(got 1 in the list\)"
    ):
        wire.parse_matching(_frame(T.M_HELLO, payload))


def test_further_keys_of_a_flow_entry_and_a_patch_are_kept() -> None:
    flows = {"F": {"steps": ["a"], "rpcs": [], "queues": ["x"]}}
    hello = wire.MatchHello("worker", "s", worker_id="w", flows=flows)
    assert _roundtrip(hello.to_frame()).flows == flows
    result = wire.MatchResult(1, None, {"set": {}, "delete": [], "merge": {}}, rid=1)
    assert _roundtrip(result.to_frame(CBOR)) == result


@SETTINGS
@given(
    st.one_of(st.just(7), odd_values),
    st.one_of(v2_values(), odd_values),
    st.one_of(st.just({"set": {"a": 1}, "delete": ["b"]}), odd_values),
    st.one_of(st.just(3), odd_values),
    st.sampled_from(list(wire.Codec)),
    st.booleans(),
)
def test_encode_result_gives_the_bytes_of_the_messages(
    delivery: Any, value: Any, patch: Any, rid: Any, codec: wire.Codec, accept: bool
) -> None:
    # The same bytes as the messages built and encoded, or the same error.
    def built() -> tuple[str, Any]:
        try:
            data = wire.MatchResult(delivery, value, patch, rid=rid).encode(codec)
            if accept:
                data = wire.MatchAccept(delivery, rid=rid).encode(codec) + data
        except wire.WireError as exc:
            return type(exc).__name__, exc.message
        return "bytes", data

    def direct() -> tuple[str, Any]:
        try:
            data = wire.encode_result(
                delivery, value, patch, rid, codec, limits=wire.Limits(), accept=accept
            )
        except wire.WireError as exc:
            return type(exc).__name__, exc.message
        return "bytes", data

    assert direct() == built()
