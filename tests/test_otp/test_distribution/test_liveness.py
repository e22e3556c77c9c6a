"""Liveness of a connection (net_ticktime): a silent peer is declared down, one that answers
ticks stays connected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import COOKIE, PeerNode
from .helpers import B, X, _listening_at, _node_is_healthy, _raw_peer


async def test_a_silent_peer_is_declared_down_between_1_and_1_25_liveness_timeouts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening_at(f"unix:{path}", liveness_timeout=8)
        async with _raw_peer(path) as (_, frames):
            assert await frames.receive_frame() is not None  # b counts us as up
            last_heard = trio.current_time()
            assert otp.nodes() == [X]
            otp.monitor_node(X)
            with trio.fail_after(100):
                assert await otp.receive(otp.NodeDown) == otp.NodeDown(X)
            assert 8 <= trio.current_time() - last_heard <= 10
            assert otp.nodes() == []


async def test_a_peer_that_only_answers_pings_stays_connected(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / "b.sock"
    async with otp.open_node(B):
        await _listening_at(f"unix:{path}", liveness_timeout=8)
        async with _raw_peer(path) as (stream, frames):
            # b's first frame: b counts us as up (our handshake ends with our proof, which b
            # may not have read yet, and monitor_node of a node not up is a NodeDown at once).
            assert await frames.receive_frame() is not None
            pongs = 0

            async def answer_pings(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                nonlocal pongs
                task_status.started()
                async for frame in frames:
                    if frame.type is wire.MessageType.PING:
                        await stream.send_all(
                            wire.encode_message(wire.MessageType.PONG, None, codec=wire.Codec.TLV)
                        )
                        pongs += 1

            async with trio.open_nursery() as nursery:
                await nursery.start(answer_pings)
                otp.monitor_node(X)
                # Ten liveness timeouts of virtual time with nothing but pongs from us.
                assert await otp.receive(otp.NodeDown, timeout=80, default=None) is None
                assert otp.nodes() == [X]
                assert pongs >= 20
                nursery.cancel_scope.cancel()
            # Now silent: down within 1.25 timeouts.
            start = trio.current_time()
            with trio.fail_after(100):
                assert await otp.receive(otp.NodeDown) == otp.NodeDown(X)
            assert trio.current_time() - start <= 10


async def test_a_connected_peer_that_falls_silent_is_dropped_after_the_liveness_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from otp._dist_handshake import initiate

    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode("b@localhost", address, liveness_timeout=0.4):
        stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        await initiate(
            frames,
            name="x@localhost",
            creation=1,
            cookie=COOKIE,
            codecs=(wire.Codec.TLV,),
            listen=(),
            expected="b@localhost",
        )
        start = trio.current_time()
        pings = 0
        with trio.fail_after(10):
            # The node pings us (we never answer) and then gives up on us.
            async for frame in frames:
                pings += frame.type is wire.MessageType.PING
        assert trio.current_time() - start >= 0.4
        assert pings >= 2
        await stream.aclose()
        await _node_is_healthy(address, expected_processes=4)
    assert any("sent nothing for 0.4 s" in record.getMessage() for record in caplog.records)
