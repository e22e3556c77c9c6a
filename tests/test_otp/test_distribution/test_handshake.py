"""The handshake between nodes: cookies, names, versions, and peers that stall, lie or send too
much before they are connected."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import PeerNode
from .helpers import (
    B,
    X,
    _distributed,
    _exchange,
    _frame,
    _HandDial,
    _listening,
    _listening_at,
    _raw_peer,
    _still_serves,
)


async def _read_until_closed(stream: trio.SocketStream) -> bytes:
    received = b""
    try:
        while chunk := await stream.receive_some(65536):
            received += chunk
    except trio.BrokenResourceError:
        pass
    return received


def _hello_header(length: int) -> bytes:
    frame = wire.Handshake(X, (2,), (wire.Codec.TLV,), 0, {"challenge": b"c" * 32})
    encoded = wire.encode_frame(frame.to_frame())
    return encoded[:4] + struct.pack(">I", length) + encoded[8:16]


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


async def test_a_peer_that_stalls_mid_handshake_is_dropped_and_the_node_keeps_serving(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening_at(f"unix:{path}", handshake_timeout=5)
        stream = await trio.open_unix_socket(str(path))
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        hello = wire.Handshake(X, (2,), (wire.Codec.TLV,), 1, {"challenge": b"c" * 32})
        await frames.send_frame(hello.to_frame())
        answer = await frames.receive_frame()
        assert answer is not None and answer.type is wire.MessageType.HANDSHAKE
        start = trio.current_time()
        with trio.fail_after(60):
            await _read_until_closed(stream)  # we never send the proof
        assert 5 <= trio.current_time() - start <= 6
        await stream.aclose()
        assert otp.nodes() == []
        await _still_serves(path)
    assert _logged(caplog, "handshake timed out")


async def test_an_oversized_handshake_frame_is_refused_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening_at(f"unix:{path}", handshake_timeout=30)
        stream = await trio.open_unix_socket(str(path))
        await stream.send_all(_hello_header(8 * 1024 * 1024) + b"\0" * 1024)
        start = trio.current_time()
        with trio.fail_after(60):
            await _read_until_closed(stream)
        await stream.aclose()
        assert trio.current_time() - start < 1
        await _still_serves(path)
    assert not _logged(caplog, "handshake timed out")


async def test_a_peer_claiming_this_nodes_own_name_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening_at(f"unix:{path}")
        with pytest.raises(Exception):  # noqa: B017 - closed during the handshake, any way
            async with _raw_peer(path, name=B) as (_, frames):
                await frames.receive_frame()
        assert otp.nodes() == []
        await _still_serves(path)
    assert _logged(caplog, "claims this node's own name")


async def test_a_large_message_right_behind_the_initiators_proof_is_delivered(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The initiator may write as soon as its proof is out (a real one flushes what was queued
    # while connecting). Bytes that arrive with the proof are decoded under the handshake's
    # 64 KiB limit, so a larger message there drops the new connection as malformed.
    async with otp.open_node(B):
        otp.register("inbox", otp.self())
        await _listening(tmp_path / "b.sock")
        stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
        async with stream:
            dial = _HandDial(stream, X)
            await dial.hello()
            proof = await dial.proof()
            big = b"x" * 100_000
            message = _frame(
                wire.MessageType.REG_SEND,
                {"from": wire.Pid(X, 1, 1), "to": "inbox", "msg": big},
            )
            await stream.send_all(proof + message)
            assert await otp.receive(timeout=5, default=None) == big
            assert otp.nodes() == [X]


async def test_an_exact_frame_stream_reads_nothing_past_the_frame_it_returns() -> None:
    # Two frames in one write: the first read under a tight limit, the second (larger than
    # that limit) under the one set after it.
    left, right = trio.testing.memory_stream_pair()
    frames = wire.FrameStream(right, limits=wire.Limits(max_payload=100), exact=True)
    small = _frame(wire.MessageType.PING, None)
    big = _frame(
        wire.MessageType.REG_SEND, {"from": wire.Pid(X, 1, 1), "to": "x", "msg": b"y" * 500}
    )
    await left.send_all(small + big)
    first = await frames.receive_frame()
    assert first is not None and first.type is wire.MessageType.PING
    frames.limits = wire.Limits(max_payload=1000)
    frames.exact = False
    (second,) = await frames.receive_frames()
    assert second.payload["msg"] == b"y" * 500


async def test_a_wrong_cookie_is_refused(sockets: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with PeerNode("b@localhost", sockets("b"), cookie=b"another-cookie-entirely"):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            assert await otp.connect("b@localhost", sockets("b")) is False
            assert otp.nodes() == []
    assert any("does not know our cookie" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "name", ["x\n2026-01-01 ERROR forged@localhost", "x@local host", "@localhost", "x" * 300]
)
async def test_a_peer_whose_name_is_no_node_name_is_refused_at_the_handshake(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    async with PeerNode("b@localhost", f"unix:{tmp_path}/b.sock"):
        hello = wire.Handshake(name, (2,), (wire.Codec.TLV,), 0, {"challenge": b"c" * 32})
        data = wire.encode_frame(hello.to_frame())
        answer = await trio.to_thread.run_sync(_exchange, str(tmp_path / "b.sock"), data)
        assert b"challenge" not in answer
    [refusal] = [r.getMessage() for r in caplog.records if "no node name" in r.getMessage()]
    assert "\n" not in refusal
