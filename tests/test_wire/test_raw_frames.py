"""The raw GD v1 frame splitter and receive buffer (``wire.FrameSplitter``, ``wire.FrameBuffer``):
frames of any size, fed in pieces of any size, come out whole; the hot encoders
(``wire.request_parts``, ...) give exactly the bytes of ``wire``'s encoder."""

from __future__ import annotations

import os
import random
import select
import socket
import struct
import threading
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wire
from wire import _dirty_bytes

from .strategies import v1_values


def _encode(frame: wire.Frame) -> bytes:
    return wire.encode_frame(frame, coerce_keys=True)


_ALL = (0, 5, 100, 65535, 65536, 70000, 300000)
#: Byte-at-a-time feeding is quadratic in a frame's size: small frames only there.
_SMALL = (0, 5, 100, 3000)


def _stream(sizes: tuple[int, ...]) -> tuple[list[tuple[int, int, bytes]], bytes]:
    rng = random.Random(7)
    frames = [(1, i, rng.randbytes(rng.choice(sizes))) for i in range(1, 40)]
    return frames, b"".join(wire.encode_header(t, len(p), r) + p for t, r, p in frames)


@pytest.mark.parametrize("sizes", [(1,), (7, 16), (1000,), (65536,), (200000, 3), (1 << 22,)])
def test_splitter_reassembles_frames_fed_in_pieces(sizes: tuple[int, ...]) -> None:
    frames, data = _stream(_SMALL if sizes[0] < 100 else _ALL)
    splitter = wire.FrameSplitter()
    got = []
    pos = 0
    turn = 0
    while pos < len(data):
        n = sizes[turn % len(sizes)]
        turn += 1
        assert splitter.read_size() >= 262144
        got += splitter.feed(data[pos : pos + n])
        pos += n
    assert got == frames
    assert splitter.buffered == 0


@pytest.mark.parametrize("sizes", [(1,), (7, 16), (1000,), (65536,), (200000, 3), (1 << 22,)])
def test_frame_buffer_reassembles_frames_received_in_pieces(sizes: tuple[int, ...]) -> None:
    frames, data = _stream(_SMALL if sizes[0] < 100 else _ALL)
    buffer = wire.FrameBuffer(size=4096, keep=100000)
    got = []
    pos = 0
    turn = 0
    while pos < len(data):
        space = buffer.space()
        n = min(sizes[turn % len(sizes)], len(space), len(data) - pos)
        turn += 1
        space[:n] = data[pos : pos + n]
        pos += n
        for mtype, rid, start, stop in buffer.frames(n):
            got.append((mtype, rid, bytes(buffer.view[start:stop])))
        if buffer.missing():
            assert len(buffer.space()) >= buffer.missing()  # a large frame fits once grown
    assert got == frames
    assert buffer.buffered == 0
    assert len(buffer.space()) == 4096  # shrunk back after the frames larger than keep


def test_frame_buffer_rejects_garbage() -> None:
    buffer = wire.FrameBuffer()
    space = buffer.space()
    data = wire.encode_header(2, 3, 1) + b"abc" + b"GET / HTTP/1.1\r\n\r\n"
    space[: len(data)] = data
    with pytest.raises(wire.BadFrameHeader, match="bad frame header at byte 19") as caught:
        buffer.frames(len(data))
    assert caught.value.raw == data[19:35]


def test_splitter_asks_for_the_rest_of_a_large_frame() -> None:
    payload = b"x" * (1 << 20)
    data = wire.encode_header(2, len(payload), 9) + payload
    splitter = wire.FrameSplitter()
    assert splitter.feed(data[:1000]) == []
    assert splitter.read_size() == len(payload) - (1000 - 16)
    assert splitter.buffered == 1000 - 16
    assert splitter.feed(data[1000:] + wire.encode_header(5, 0, 9)) == [
        (2, 9, payload),
        (5, 9, b""),
    ]


def test_splitter_rejects_garbage_after_a_large_frame() -> None:
    payload = b"x" * 100000
    splitter = wire.FrameSplitter()
    with pytest.raises(wire.BadFrameHeader):
        splitter.feed(wire.encode_header(2, len(payload), 1) + payload + b"XX" + b"\0" * 14)


BLOB = b"\x00\xff" * 40000


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, "a", None, 2.5), {"k": True}), ((BLOB,), {}), ((1, BLOB, "x"), {"b": BLOB}),
     (([1, BLOB],), {}), ((BLOB,), {"nested": {"a": 1}})],
)  # fmt: skip
def test_request_parts_are_the_encoded_request(args: tuple[object, ...], kwargs: dict) -> None:
    parts = wire.request_parts(7, "m:App", "act", args, kwargs)
    assert b"".join(parts) == _encode(wire.make_request(7, "m:App", "act", args, kwargs))
    scalars = all(type(a) is not list for a in args) and "nested" not in kwargs
    assert any(p is BLOB for p in parts) == (scalars and BLOB in (*args, *kwargs.values()))


@pytest.mark.parametrize("value", [None, 1, "é", [1, {"a": b"x"}], BLOB, b"short"])
def test_reply_parts_and_big_bytes(value: object) -> None:
    for mtype, make in ((2, wire.make_response), (4, wire.make_chunk)):
        data = b"".join(wire.reply_parts(mtype, 3, value))
        assert data == _encode(make(3, value))
        view = memoryview(data)
        assert wire.big_bytes(mtype, view, 16, len(data)) == (value if value is BLOB else None)
    parts = wire.request_parts(1, "m:App", "act", (1,))
    view = memoryview(parts[0])
    assert wire.peek_route(view, 16, len(parts[0])) == ("m:App", "act")
    assert wire.peek_route(view, 16, 30) is None


@given(
    st.sampled_from([t for t in wire.MessageType if t < 0x20]),
    st.integers(0, 2**64 - 1),
    st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), v1_values(), max_size=4),
    st.booleans(),
)
def test_encode_dirty_is_the_encoders_bytes(
    mtype: int, rid: int, payload: dict, c_path: bool
) -> None:
    # (in one C call, or in Python where wire's C fast paths are off: the same bytes)
    with mock.patch.object(_dirty_bytes, "_frame", _dirty_bytes._frame if c_path else None):
        data = wire.encode_dirty(mtype, rid, payload)
        assert data == _encode(wire.Frame(wire.MessageType(mtype), rid, payload))
        assert wire.encode_dirty(mtype, rid, payload, len(data) - 16) == data
        with pytest.raises(wire.LimitExceeded, match=f"exceeds max_payload={len(data) - 17}"):
            wire.encode_dirty(mtype, rid, payload, len(data) - 17)


@pytest.mark.parametrize("c_path", [True, False])
def test_encode_dirty_refuses_what_the_encoder_refuses(c_path: bool) -> None:
    with mock.patch.object(_dirty_bytes, "_frame", _dirty_bytes._frame if c_path else None):
        with pytest.raises(wire.UnknownValueType):
            wire.encode_dirty(2, 1, {"result": {1, 2}})
        with pytest.raises(wire.ValueOutOfRange):
            wire.encode_dirty(2, 1, {"result": 2**63})
        with pytest.raises(struct.error):
            wire.encode_dirty(2, -1, {"result": 1})  # (a request id the header cannot hold)


_BOUND = st.integers(-80, 80) | st.sampled_from([-(2**70), 2**70, -(2**63), 2**63 - 1])


@given(
    data=st.binary(max_size=64),
    start=_BOUND,
    stop=_BOUND,
    prefix=st.binary(max_size=8),
    cut=st.integers(0, 64),
    mutable=st.booleans(),
)
def test_opens_with_is_startswith_in_c_and_python(
    data: bytes, start: int, stop: int, prefix: bytes, cut: int, mutable: bool
) -> None:
    # (Half the time the prefix is taken from the data, so that matches are found too.)
    if cut % 2:
        prefix = data[cut // 2 : cut // 2 + len(prefix)]
    buf = bytearray(data) if mutable else data
    want = data.startswith(prefix, start, stop)
    assert wire.opens_with(buf, start, stop, prefix) is want
    assert wire.fast_opens_with(buf, start, stop, prefix) is want


def test_opens_with_fast_path_declines_what_it_does_not_read() -> None:
    if wire.fast_opens_with is wire.opens_with:
        pytest.skip("wire's C fast paths are off")
    # (The Python path answers these, or names what is wrong.)
    assert wire.fast_opens_with(memoryview(b"abc"), 0, 3, b"a") is None
    assert wire.fast_opens_with(b"abc", 0, 3, bytearray(b"a")) is None
    assert wire.fast_opens_with(b"abc", None, 3, b"a") is None
    assert wire.opens_with(b"abc", None, 3, b"a") is True  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        wire.opens_with(b"abc", 0, 3, "a")  # type: ignore[arg-type]


def test_peek_route_leaves_other_key_orders_to_the_decoder() -> None:
    payload = wire.tlv_encode({"action": "a", "app_path": "m:App", "args": [], "kwargs": {}})
    assert wire.peek_route(memoryview(payload), 0, len(payload)) is None


@given(
    app=st.text(max_size=40),
    action=st.text(max_size=20),
    args=st.lists(st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8), max_size=3),
)
def test_route_length_spans_exactly_the_bytes_peek_route_reads(
    app: str, action: str, args: list[object]
) -> None:
    # A reader may keep a request's first route_length bytes and route any request opening
    # with them the same way: they hold the whole route, and nothing after it.
    def payload(*call: object) -> bytes:
        return wire.request_parts(1, *call)[0][16:]  # type: ignore[arg-type]

    ours = payload(app, action, args)
    n = wire.route_length(app, action)
    assert wire.peek_route(memoryview(ours), 0, len(ours)) == (app, action)
    assert payload(app, action, [*args, "more"], {"k": 1})[:n] == ours[:n]
    assert payload(app + "x", action, args)[:n] != ours[:n]
    assert payload(app, action + "x", args)[:n] != ours[:n]


def _request_fields_both(payload: bytes, offset: int = 3) -> object:
    """``wire.request_fields`` of ``payload`` at ``offset`` in a larger buffer: what the C
    path and the Python one both give (they must agree)."""
    buffer = bytearray(bytes(offset) + payload + b"\x00")
    view = memoryview(buffer)
    got = wire.request_fields(view, offset, offset + len(payload))
    assert _dirty_bytes._request_fields(view, offset, offset + len(payload)) == got
    return got


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((1, "é", None, [2.5, {"a": b"x"}]), {"k": True}), ((BLOB,), {"b": BLOB})],
)  # fmt: skip
def test_request_fields_read_every_clients_request(args: tuple[object, ...], kwargs: dict) -> None:
    payload = b"".join(wire.request_parts(7, "m:App", "act", args, kwargs))[16:]
    assert _request_fields_both(payload) == ("m:App", "act", list(args), kwargs)
    other_order = {"kwargs": kwargs, "args": list(args), "action": "act", "app_path": "m:App"}
    assert _request_fields_both(wire.tlv_encode(other_order, version=1)) == (
        "m:App", "act", list(args), kwargs
    )  # fmt: skip


@pytest.mark.parametrize(
    "payload",
    [
        {"app_path": "m:A", "action": "a", "args": [], "kwargs": {}, "more": 1},
        {"app_path": "m:A", "action": "a", "args": []},
        {"app_path": 1, "action": "a", "args": [], "kwargs": {}},
        {"app_path": "m:A", "action": None, "args": [], "kwargs": {}},
        {"app_path": "m:A", "action": "a", "args": "ab", "kwargs": {}},
        {"app_path": "m:A", "action": "a", "args": [], "kwargs": []},
        ["m:A", "a", [], {}],
    ],
)
def test_request_fields_leave_any_other_payload_to_the_decoder(payload: object) -> None:
    assert _request_fields_both(wire.tlv_encode(payload, version=1)) is None


def test_request_fields_leave_bad_bytes_to_the_decoder() -> None:
    good = wire.tlv_encode({"app_path": "m:A", "action": "a", "args": [1], "kwargs": {}})
    assert _request_fields_both(good) == ("m:A", "a", [1], {})
    assert _request_fields_both(good + b"\x00") is None  # (a byte after the dict)
    assert _request_fields_both(good[:-1]) is None
    assert _request_fields_both(b"") is None
    bad_utf8 = good.replace(b"m:A", b"m:\xff")
    assert _request_fields_both(bad_utf8) is None
    twice = wire.tlv_encode({"app_path": "m:A", "action": "a", "args": [], "kwargs": {}})
    twice = twice.replace(b"\x06action", b"\x08app_path")  # (app_path twice, no action)
    with pytest.raises(wire.WireError):
        wire.tlv_decode(twice, version=1)
    assert _request_fields_both(twice) is None


def test_a_client_buffer_grows_only_as_a_frames_bytes_arrive() -> None:
    # A header claiming 64 MiB costs nothing until its bytes come; a large frame that is there
    # still lands in one buffer, whole.
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        buffer = wire.FrameBuffer(size=65536, fd=ours.fileno())
        theirs.sendall(wire.encode_header(1, wire.MAX_PAYLOAD, 1) + b"x")
        n = os.readv(ours.fileno(), [buffer.space()])
        assert buffer.frames(n) == []
        assert len(buffer.buf) == 65536 and len(buffer.space()) == 65536 - 17
        payload = bytes(range(256)) * 1024 * 3  # 768 KiB, after a small frame
        data = (
            wire.encode_header(2, 3, 2) + b"abc" + wire.encode_header(2, len(payload), 3) + payload
        )
        fresh = wire.FrameBuffer(size=65536, fd=ours.fileno())
        got: list[tuple[int, int, bytes]] = []
        sender = threading.Thread(target=theirs.sendall, args=(data,))
        sender.start()
        while len(got) < 2:
            try:
                n = os.readv(ours.fileno(), [fresh.space()])
            except BlockingIOError:
                select.select([ours], [], [], 5)
                continue
            got += [(t, r, bytes(fresh.view[a:b])) for t, r, a, b in fresh.frames(n)]
            assert len(fresh.buf) <= 2 * len(data)
        sender.join()
        assert got == [(2, 2, b"abc"), (2, 3, payload)]
    finally:
        ours.close()
        theirs.close()


def test_a_bad_header_raises_the_callers_protocol_error() -> None:
    class Refused(Exception):
        def __init__(self, message: str, raw: bytes) -> None:
            super().__init__(message)
            self.raw = raw

    with pytest.raises(Refused, match="a frame starts with 47 44") as caught:
        wire.FrameSplitter(error=Refused).feed(b"GD\x01\x02" + b"\0" * 12 + b"XY")
    assert caught.value.raw == b"XY"


@given(
    st.binary(max_size=64),
    st.binary(max_size=300),
    st.integers(0, (1 << 64) - 1),
)
def test_readdressed_frames_are_the_frame_with_its_new_id(
    before: bytes, payload: bytes, rid: int
) -> None:
    frame = bytes(wire.encode_header(wire.MessageType.REQUEST, len(payload), 7)) + payload
    src = bytearray(b"x" * 5 + frame + b"y" * 3)
    start, stop = 5 + 16, 5 + len(frame)
    want = before + frame[:8] + struct.pack(">Q", rid) + payload
    for append in (wire.append_readdressed, wire.readdress_into):
        dst = bytearray(before)
        assert append(dst, memoryview(src), start, stop, rid) is True
        assert bytes(dst) == want


@pytest.mark.parametrize(
    ("start", "stop", "rid"),
    [(15, 20, 1), (21, 20, 1), (16, 41, 1), (16, 20, -1), (16, 20, 1 << 64)],
)
def test_readdressing_refuses_a_frame_outside_the_buffer_or_a_bad_id(
    start: int, stop: int, rid: int
) -> None:
    src = bytes(40)
    dst = bytearray(b"kept")
    with pytest.raises(ValueError):
        wire.readdress_into(dst, src, start, stop, rid)
    assert dst == b"kept"
    if wire.append_readdressed is not wire.readdress_into:
        # The C path declines instead (its caller then runs the Python one), leaving ``dst``.
        assert wire.append_readdressed(dst, src, start, stop, rid) is None
        assert dst == b"kept"
