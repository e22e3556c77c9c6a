"""node(), nodes(), connect, disconnect and monitor_node, including this node itself, unknown
nodes and listeners that never answer."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio
import trio.testing

import otp

from ..peer import COOKIE
from .helpers import B, _listening_at


async def test_connecting_to_a_listener_that_never_answers_returns_false_and_calls_fail(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    mute = tmp_path / "mute.sock"
    accepted: list[trio.SocketStream] = []
    listener_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener_sock.bind(str(mute))
    listener_sock.listen(16)
    listener = trio.SocketListener(listener_sock)

    async def hold() -> None:
        while True:
            accepted.append(await listener.accept())

    async with otp.open_node("a@localhost"), trio.open_nursery() as nursery:
        nursery.start_soon(hold)
        await _listening_at(f"unix:{tmp_path}/a.sock", handshake_timeout=3)
        start = trio.current_time()
        assert await otp.connect(B, f"unix:{mute}") is False
        assert 3 <= trio.current_time() - start <= 4
        assert otp.nodes() == []
        with pytest.raises(otp.CallError) as info:
            await otp.call(("echo", B), "x", timeout=60)
        assert info.value.reason == otp.NOCONNECTION
        assert not isinstance(info.value, otp.CallTimeout)
        assert len(accepted) == 2  # the call dialled again
        nursery.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    await listener.aclose()


async def test_connecting_to_a_refused_tcp_port_returns_false(
    autojump_clock: trio.testing.MockClock,
) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens there
    async with otp.open_node("a@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE, insecure_tcp=True))
        assert await otp.connect(B, f"tcp:127.0.0.1:{port}") is False
        assert otp.nodes() == []
        ref = otp.monitor(("echo", B))
        assert await otp.receive(otp.Down, timeout=10) == otp.Down(
            ref, ("echo", B), otp.NOCONNECTION
        )


async def test_node_name_nodes_and_disconnect_of_self_or_unknown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node("a@localhost"):
        assert otp.nodes() == []  # not distributed yet
        await _listening_at(f"unix:{tmp_path}/a.sock")
        assert otp.node_name() == "a@localhost"
        assert otp.nodes() == []  # never lists itself
        assert otp.disconnect("a@localhost") is False  # net_kernel: disconnect(node()) -> false
        assert otp.disconnect("ghost@localhost") is False


async def test_connecting_to_this_node_itself_is_true(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node("a@localhost"):
        await _listening_at(f"unix:{tmp_path}/a.sock")
        assert await otp.connect("a@localhost") is True
        assert otp.nodes() == []


async def test_monitoring_this_node_itself_delivers_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node("a@localhost"):
        await _listening_at(f"unix:{tmp_path}/a.sock")
        otp.monitor_node("a@localhost")
        assert await otp.receive(otp.NodeDown, timeout=5, default=None) is None


async def test_after_disconnect_returns_nodes_no_longer_lists_the_node(tmp_path: Path) -> None:
    from test_otp.peer import PeerNode

    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode(B, address, cookie=COOKIE), otp.open_node("a@localhost"):
        await _listening_at(f"unix:{tmp_path}/a.sock")
        assert await otp.connect(B, address)
        assert otp.disconnect(B) is True
        assert otp.nodes() == []
