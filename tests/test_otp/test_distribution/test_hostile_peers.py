"""Hostile or broken peers: one that sends garbage, a wrong version or an oversized frame, turns
to garbage once connected, or plays with ids and third nodes' processes is dropped with a logged
reason (or its request refused) and costs nothing else."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otp
import wire

from ..peer import COOKIE, PeerNode, raw_peer
from .helpers import _b_with_x, _exchange, _frame, _hello, _marker, _node_is_healthy


@pytest.mark.parametrize(
    ("name", "data", "logged"),
    [
        ("garbage", b"\x00garbage that is not a frame at all" * 3, "malformed input"),
        ("wrong version", _hello(version=1).replace(b"GD\x02", b"GD\x01", 1), "malformed input"),
        ("unsupported protocol", _hello(version=7), "speaks versions [7]"),
        ("oversized", b"GD\x02\x20" + struct.pack(">IQ", 0xFFFFFFFF, 0), "malformed input"),
        ("nothing", b"", "handshake timed out"),
    ],
)
async def test_a_bad_peer_is_dropped_and_costs_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, data: bytes, logged: str
) -> None:
    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode("b@localhost", address, handshake_timeout=0.3):
        answer = await trio.to_thread.run_sync(_exchange, str(tmp_path / "b.sock"), data)
        assert b"challenge" not in answer or name == "unsupported protocol"
        await _node_is_healthy(address, expected_processes=4)
    assert any(logged in record.getMessage() for record in caplog.records), name


def test_random_and_mutated_frames_never_hurt_a_listening_node(tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/b.sock"
    path = str(tmp_path / "b.sock")
    hello = _hello()

    mutated = st.tuples(
        st.integers(0, len(hello) - 1), st.integers(0, 255), st.integers(1, len(hello))
    ).map(lambda m: (hello[: m[0]] + bytes([m[1]]) + hello[m[0] + 1 :])[: m[2]])
    inputs = st.one_of(st.binary(min_size=1, max_size=256), mutated)

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(inputs)
    def one_peer(data: bytes) -> None:
        _exchange(path, data)

    async def scenario() -> None:
        async with PeerNode("b@localhost", address, handshake_timeout=0.1):
            await trio.to_thread.run_sync(one_peer)
            await _node_is_healthy(address, expected_processes=4)

    trio.run(scenario)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("garbage", b"\x00garbage that is not a frame at all"),
        ("a dirty-protocol frame", wire.encode_frame(wire.Frame(wire.MessageType.STATUS, 1))),
        ("a bad SEND payload", wire.encode_message(wire.MessageType.SEND, {"msg": 1})),
        (
            "a batch whose msgs is no list",
            wire.encode_message(
                wire.MessageType.SEND_BATCH, {"to": wire.Pid("b@localhost", 1, 1), "msgs": 5}
            ),
        ),
    ],
)
async def test_a_connected_peer_that_turns_to_garbage_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, data: bytes
) -> None:
    from otp._dist_handshake import initiate

    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode("b@localhost", address):
        stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        peer = await initiate(
            frames,
            name="x@localhost",
            creation=1,
            cookie=COOKIE,
            codecs=(wire.Codec.TLV,),
            listen=(),
            expected="b@localhost",
        )
        assert peer.name == "b@localhost"
        await stream.send_all(data)
        with trio.fail_after(5):
            while await stream.receive_some(65536):
                pass  # the node closes the connection
        await stream.aclose()
        await _node_is_healthy(address, expected_processes=4)
    assert any("dropped: malformed input" in record.getMessage() for record in caplog.records), name


async def test_monitors_and_links_whose_ids_collide_cost_linear_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    # A peer picks the ids in the refs and pids it sends: 2,000 MONITORs whose refs share one id
    # (and LINKs from pids sharing one) must not turn the target's tables into one hash bucket.
    from otp._ids import Pid, Ref

    compared = 0
    for cls in (Pid, Ref):
        plain_eq = cls.__eq__

        def counting(self: Any, other: object, _eq: Any = plain_eq) -> bool:
            nonlocal compared
            compared += 1
            return bool(_eq(self, other))

        monkeypatch.setattr(cls, "__eq__", counting)
    n = 2000
    async with _b_with_x(tmp_path) as stream:
        me = wire.Pid("b@localhost", otp.self().id, otp.self().creation)
        data = b"".join(
            _frame(
                wire.MessageType.MONITOR,
                {"from": wire.Pid("x@localhost", 1, 1), "to": me, "ref": wire.Ref("x", 7, i)},
            )
            + _frame(wire.MessageType.LINK, {"from": wire.Pid("x@localhost", 7, i), "to": me})
            for i in range(n)
        )
        await stream.send_all(data + _frame(wire.MessageType.REG_SEND, _marker()))
        assert await otp.receive(timeout=30) == "done"
        info = otp.process_info(otp.self())
        assert info is not None
        assert len(info.monitored_by) == n and len(info.links) == n
    # About a comparison per entry at most (the old id-only hash made ~n*n/2 = 2,000,000).
    assert compared < 4 * n, compared


async def test_a_monitor_or_link_for_a_third_nodes_process_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # What x plants for a process of c would outlive x's connection (only x's own processes'
    # are dropped with it): the frame is refused with the connection, as ERTS does.
    async with otp.open_node("b@localhost"):
        otp.register("inbox", otp.self())
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/b.sock",))
        )
        me = wire.Pid("b@localhost", otp.self().id, otp.self().creation)
        third = wire.Pid("c@localhost", 5, 1)
        for frame in (
            _frame(wire.MessageType.MONITOR, {"from": third, "to": me, "ref": wire.Ref("c", 1, 1)}),
            _frame(
                wire.MessageType.MONITOR_SEND,
                {"from": third, "to": me, "ref": wire.Ref("c", 1, 1), "msg": "planted"},
            ),
            _frame(wire.MessageType.LINK, {"from": third, "to": me}),
        ):
            async with raw_peer(tmp_path / "b.sock", COOKIE, "x@localhost", "b@localhost") as (
                stream,
                _,
            ):
                await stream.send_all(frame)
                with trio.fail_after(5):
                    while await stream.receive_some(65536):
                        pass  # the node closes the connection
            with trio.fail_after(5):
                while otp.nodes():
                    await trio.sleep(0.01)
            info = otp.process_info(otp.self())
            assert info is not None
            assert info.monitored_by == () and info.links == ()
        assert await otp.receive(timeout=0, default=None) is None  # nor the message delivered
    assert any("no process of that node" in r.getMessage() for r in caplog.records)


# -- bounded memory toward a peer that does not read ---------------------------------------------


# -- names, and the lists of nodes peers tell -----------------------------------------------------
