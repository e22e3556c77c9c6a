"""node(), nodes(), connect, disconnect and monitor_node, including this node itself, unknown
nodes and listeners that never answer."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from otp import current_node

from ..peer import COOKIE, PeerNode, messages_to, raw_peer
from .helpers import (
    A,
    B,
    X,
    _b_with_x,
    _connected,
    _distributed,
    _frame,
    _HandDial,
    _listening,
    _listening_at,
    _raw_peer,
    _with_factory,
)


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


async def test_monitor_node_of_an_unknown_node_delivers_nodedown_at_once(sockets: Any) -> None:
    async with otp.open_node("a@localhost"):
        await _listening_at(sockets("a"))
        otp.monitor_node("ghost@localhost")
        assert await otp.receive(otp.NodeDown, timeout=1) == otp.NodeDown("ghost@localhost")


async def test_monitor_node_stacks_and_disabling_removes_one(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        for _ in range(3):
            otp.monitor_node(B)
        otp.monitor_node(B, False)
        assert otp.disconnect(B) is True
        assert await otp.receive(otp.NodeDown) == otp.NodeDown(B)
        assert await otp.receive(otp.NodeDown) == otp.NodeDown(B)
        assert await otp.receive(otp.NodeDown, timeout=0.2, default=None) is None
        assert otp.nodes() == []


@contextlib.asynccontextmanager
async def _old_incarnation(path: Path) -> AsyncIterator[tuple[trio.SocketStream, Any]]:
    """A connection to B as a@localhost (creation 1), made by hand: it stays open and does
    only what the test writes on it, like a node that hung or restarted unnoticed."""
    from otp._dist_handshake import initiate

    stream = await trio.open_unix_socket(str(path))
    try:
        frames = wire.FrameStream(stream, versions=frozenset({2}))
        await initiate(
            frames,
            name="a@localhost",
            creation=1,
            cookie=COOKIE,
            codecs=(wire.Codec.TLV,),
            listen=(),
            expected=B,
        )
        yield stream, frames
    finally:
        await stream.aclose()


async def test_a_restarted_node_can_reconnect_while_its_old_connection_lingers(
    tmp_path: Path,
) -> None:
    # OTP's handshake answers an attempt from a node it believes connected with status
    # "alive"; the new incarnation confirms and the old connection is dropped. A node that
    # restarted before its peer noticed the old connection die must be able to reconnect.
    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode(B, address), _old_incarnation(tmp_path / "b.sock") as (_, frames):
        # B's first frame (its peer list) tells it counts the connection as up.
        with trio.fail_after(3):
            assert await frames.receive_frame() is not None
        async with otp.open_node("a@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
            with trio.fail_after(4):
                assert await otp.connect(B, address)
                assert await otp.call(("echo", B), "whoami") == B
                assert otp.nodes() == [B]


async def test_a_reconnect_replaces_the_old_connection_with_nodedown_on_the_peer(
    tmp_path: Path,
) -> None:
    # What watched the old connection on the peer sees it go (NodeDown, as for any lost
    # connection) when the new one replaces it.
    address = f"unix:{tmp_path}/b.sock"
    async with (
        PeerNode(B, address, setup=_with_factory),
        _old_incarnation(tmp_path / "b.sock") as (stream, frames),
    ):
        old = wire.Pid("a@localhost", 1, 1)
        request = wire.encode_message(
            wire.MessageType.REG_SEND,
            {"from": old, "to": "factory", "msg": ("node_watch", old, "a@localhost")},
            codec=wire.Codec.TLV,
        )
        await stream.send_all(request)
        with trio.fail_after(3):  # B's watcher has its monitor_node in place
            while True:
                frame = await frames.receive_frame()
                assert frame is not None
                if frame.type is wire.MessageType.SEND:
                    assert frame.payload["msg"] == ("node_watching", "a@localhost")
                    break
        async with otp.open_node("a@localhost"):
            otp.register("collector", otp.self())
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
            with trio.fail_after(4):
                assert await otp.connect(B, address)
                assert await otp.receive() == ("node_down_seen", "a@localhost")


async def test_dialling_an_address_where_another_node_answers_fails(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _listening_at(sockets("a"))
        assert await otp.connect("c@localhost", sockets("b")) is False
        assert otp.nodes() == []
        assert await otp.connect(B, sockets("b"))
        assert otp.nodes() == [B]


def test_a_connection_ended_by_several_tasks_at_once_is_named_by_the_first_ordinary_cause() -> None:
    from otp._dist_session import _sole

    reset, broken = ConnectionResetError("reset"), trio.BrokenResourceError("pipe")
    assert _sole(ExceptionGroup("x", [ExceptionGroup("y", [reset])])) is reset
    assert _sole(ExceptionGroup("x", [reset, ExceptionGroup("y", [broken])])) is reset
    bug = ExceptionGroup("x", [reset, RuntimeError("a bug")])
    assert _sole(bug) is bug  # a real bug is never hidden behind an ordinary ending


@contextlib.asynccontextmanager
async def _mute_listener(path: Path) -> AsyncIterator[list[trio.SocketStream]]:
    """A Unix socket at ``path`` that accepts connections and never answers: a node's dial to
    it stays pending until the test closes what was accepted."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(8)
    listener = trio.SocketListener(sock)
    accepted: list[trio.SocketStream] = []

    async def hold() -> None:
        while True:
            accepted.append(await listener.accept())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            try:
                yield accepted
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for stream in accepted:
                await stream.aclose()
            await listener.aclose()


async def _pending_dial(
    nursery: trio.Nursery, accepted: list[trio.SocketStream], peer: str, path: Path
) -> list[bool]:
    """Start this node's dial to ``peer`` at ``path`` (a mute listener) and return once the
    listener holds it: a pending dial. Its connect() result is appended to the list returned."""
    results: list[bool] = []

    async def dial() -> None:
        results.append(await otp.connect(peer, f"unix:{path}"))

    nursery.start_soon(dial)
    while not accepted:
        await trio.sleep(0.001)
    return results


async def test_connect_is_true_when_the_peers_own_dial_replaces_ours(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # b dials a; a dials b at the same time. b's name is the greater, so b gives up its own
    # dial for a's (Distribution.admit): b is connected to a, and its connect() must say so.
    async with _mute_listener(tmp_path / "a.sock") as accepted, otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with trio.open_nursery() as nursery:
            results = await _pending_dial(nursery, accepted, A, tmp_path / "a.sock")
            async with _raw_peer(tmp_path / "b.sock", name=A, expected=B) as (_, frames):
                assert await frames.receive_frame() is not None  # b counts a as up
                with trio.fail_after(1):
                    while not results:
                        await trio.sleep(0.001)
                assert otp.nodes() == [A]
                assert results == [True]


async def test_a_simultaneous_connect_keeps_what_was_queued_and_reports_no_nodedown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The order real nodes produce: a (the smaller name, which keeps its own dial) refuses
    # b's dial the moment b's hello arrives, a round trip before a's own dial is through on b.
    async with _mute_listener(tmp_path / "a.sock") as accepted, otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with trio.open_nursery() as nursery:
            results = await _pending_dial(nursery, accepted, A, tmp_path / "a.sock")
            otp.monitor_node(A)
            otp.send(("inbox", A), "queued while connecting")
            stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
            async with stream:
                dial_a = _HandDial(stream, A)
                await dial_a.hello()
                await accepted[0].aclose()  # a refuses b's dial (simultaneous connect)
                proof = await dial_a.proof()
                await trio.sleep(0.01)  # b has seen its dial refused
                await stream.send_all(proof)
                with trio.fail_after(1):
                    while not results:
                        await trio.sleep(0.001)
                otp.send(("inbox", A), "sent once connected")
                with trio.fail_after(5):
                    first = await messages_to(dial_a.frames, "inbox").__anext__()
                assert first == "queued while connecting"
                assert otp.nodes() == [A]
                assert await otp.receive(otp.NodeDown, timeout=0, default=None) is None
                assert results == [True]


async def test_monitor_node_requests_of_dead_processes_are_released(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Erlang drops a process's node monitors when it exits; here every short-lived process
    # that called monitor_node stays in Distribution.node_watchers until the node goes down.
    async with otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (_, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None

            async def watch_then_exit() -> None:
                otp.monitor_node(X)

            for _ in range(100):
                otp.spawn(watch_then_exit)
            await trio.sleep(1)
            assert len(otp.processes()) == 3  # this one, net_kernel and the connection
            watchers = current_node().distribution.node_watchers
            assert len(watchers.get(X, [])) == 0


async def test_a_simultaneous_connect_whose_other_dial_fails_too_is_a_lost_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Our dial refused for the peer's, and the peer's then failing its handshake: only now is
    # the connection lost (NodeDown, connect False), with nothing delivered.
    async with _mute_listener(tmp_path / "a.sock") as accepted, otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with trio.open_nursery() as nursery:
            results = await _pending_dial(nursery, accepted, A, tmp_path / "a.sock")
            otp.monitor_node(A)
            stream = await trio.open_unix_socket(str(tmp_path / "b.sock"))
            async with stream:
                dial_a = _HandDial(stream, A)
                await dial_a.hello()
                await accepted[0].aclose()
                await dial_a.proof()
                await trio.sleep(0.01)
                assert results == []  # still waiting for a's dial
                assert await otp.receive(otp.NodeDown, timeout=0, default=None) is None
            with trio.fail_after(1):
                assert await otp.receive(otp.NodeDown) == otp.NodeDown(A)
                while not results:
                    await trio.sleep(0.001)
            assert results == [False]
            assert otp.nodes() == []


async def test_a_dial_refused_by_a_peer_with_a_greater_name_is_lost_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Only the node with the greater name waits for the peer's own dial (the smaller keeps its
    # own): a refusal seen by the smaller name is a lost connection at once.
    async with _mute_listener(tmp_path / "b.sock") as accepted, otp.open_node(A):
        await _listening(tmp_path / "a.sock")
        async with trio.open_nursery() as nursery:
            results = await _pending_dial(nursery, accepted, B, tmp_path / "b.sock")
            start = trio.current_time()
            await accepted[0].aclose()
            with trio.fail_after(1):
                while not results:
                    await trio.sleep(0.001)
            assert results == [False]
            assert trio.current_time() - start < 0.5


async def test_a_cancelled_monitor_node_request_leaves_nothing_behind(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (_, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None
            otp.monitor_node(X)
            otp.monitor_node(X, False)
            assert current_node().distribution.node_watchers == {}


async def test_losing_a_connection_fires_noconnection_and_nodedown(sockets: Any) -> None:
    peer = PeerNode("b@localhost", sockets("b"))
    async with peer:
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            await otp.connect("b@localhost", sockets("b"))
            otp.process_flag(trap_exit=True)
            remote_echo_ref = otp.monitor(("echo", "b@localhost"))
            otp.monitor_node("b@localhost")
            peer.stop()
            down = await otp.receive(otp.Down)
            assert down.ref == remote_echo_ref
            assert down.reason in (otp.NOCONNECTION, otp.KILLED)
            assert await otp.receive(otp.NodeDown) == otp.NodeDown("b@localhost")
            assert otp.nodes() == []


async def test_a_node_needs_a_real_name_to_be_distributed(sockets: Any) -> None:
    async with otp.open_node():
        with pytest.raises(otp.DistributionError, match="needs a name like 'a@host'"):
            await _distributed("a", sockets("a"))


async def test_a_full_mesh_forms_through_a_common_peer(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")), PeerNode("c@localhost", sockets("c")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            await otp.connect("b@localhost", sockets("b"))
            await otp.connect("c@localhost", sockets("c"))
            # b and c learn of each other through a, and connect.
            with trio.fail_after(5):
                while "c@localhost" not in await otp.call(("echo", "b@localhost"), "nodes"):
                    await trio.sleep(0.01)
            assert await otp.call(("echo", "c@localhost"), "nodes") == [
                "a@localhost",
                "b@localhost",
            ]


async def test_killing_net_kernel_leaves_nothing_of_the_distribution_behind(
    sockets: Any, tmp_path: Path
) -> None:
    # Every connection process, dialled or accepted, is linked to the node's net_kernel, which
    # owns the listeners: killed, it takes them all with it.
    async with PeerNode("b@localhost", sockets("b")), otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert await otp.connect("b@localhost", sockets("b"))  # dialled by a
        async with raw_peer(tmp_path / "a.sock", COOKIE, "x@localhost", "a@localhost"):
            with trio.fail_after(5):  # accepted by a
                while "x@localhost" not in otp.nodes():
                    await trio.sleep(0.01)
            kernel = otp.whereis("otp.net_kernel")
            assert kernel is not None
            others = [p for p in otp.processes() if p not in (otp.self(), kernel)]
            assert len(others) == 2
            refs = {otp.monitor(p): p for p in [kernel, *others]}
            echo = otp.monitor(("echo", "b@localhost"))
            otp.exit(kernel, otp.KILL)
            with trio.fail_after(5):
                down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == echo)
                assert down.reason == otp.NOCONNECTION
                while refs:
                    refs.pop((await otp.receive(otp.Down)).ref, None)
            assert otp.processes() == [otp.self()]
            assert otp.nodes() == []
            assert not (tmp_path / "a.sock").exists()
            with pytest.raises(otp.DistributionError, match="not distributed"):
                await otp.connect("b@localhost", sockets("b"))
        # Distribution may be started again.
        await _distributed("a", sockets("a"))
        assert await otp.connect("b@localhost", sockets("b"))


async def test_a_peers_list_is_capped_and_dialled_at_a_bounded_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="otp.dist")
    nodes = {f"n{i}@localhost": f"unix:{tmp_path}/n{i}.sock" for i in range(5000)}
    nodes["evil\n@localhost"] = f"unix:{tmp_path}/evil.sock"
    nodes["m@localhost"] = f"unix:{tmp_path}/m\n.sock"

    def dials() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith("distribution connection to ")
        ]

    async with _b_with_x(tmp_path) as stream:
        peers = {"from": wire.Pid("x@localhost", 0, 1), "to": wire.Atom("$net_kernel")}
        await stream.send_all(_frame(wire.MessageType.REG_SEND, {**peers, "msg": ("peers", nodes)}))
        await trio.sleep(1.0)
        assert 1 <= len(dials()) <= 11  # mesh_dial_rate=10 a second
        await trio.sleep(600)
        dialled = dials()
        assert len(dialled) == 256  # mesh_max_nodes
        assert not any("evil" in d or "\n" in d for d in dialled)
    assert any("mesh_max_nodes=256" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", ["unreachable", "bad_cookie", "wrong_node"])
async def test_a_failed_dial_says_why_in_its_connections_failure(sockets: Any, case: str) -> None:
    from otp._distribution import dial

    cookie = b"another-cookie-entirely" if case == "bad_cookie" else COOKIE
    async with PeerNode("b@localhost", sockets("b"), cookie=cookie):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            peer, address = {
                "unreachable": ("ghost@localhost", sockets("ghost")),
                "bad_cookie": ("b@localhost", sockets("b")),
                "wrong_node": ("c@localhost", sockets("b")),
            }[case]
            conn = await dial(peer, address)
            assert conn is not None and conn.state == "down"
            assert conn.failure is not None
            assert conn.failure.kind == case
            says = {
                "unreachable": "No such file",
                "bad_cookie": "does not know our cookie",
                "wrong_node": "but 'b@localhost' answered",
            }[case]
            assert says in conn.failure.reason
            assert otp.nodes() == []
