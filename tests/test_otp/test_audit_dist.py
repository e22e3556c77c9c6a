"""Audit of distribution (otp/_distribution.py, _dist_handshake.py, _pg.py) against OTP 25 and
what a production user expects. Most tests run one real node on trio's virtual clock and play
the other node by hand over a real Unix socket (the wire frames a real node sends), so each race
is taken in a fixed order; the rest start a peer node in a thread (tests/test_otp/peer.py)."""

from __future__ import annotations

import contextlib
import enum
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from otp._dist_handshake import digest
from otp._node import current_node

from .peer import COOKIE, PeerNode, messages_to, raw_peer

A = "a@localhost"
B = "b@localhost"
X = "x@localhost"


async def _listening(path: Path, **config: Any) -> None:
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(f"unix:{path}",), **config))


def _raw_peer(
    path: Path, name: str = X, expected: str = B
) -> contextlib.AbstractAsyncContextManager[tuple[trio.SocketStream, wire.FrameStream]]:
    return raw_peer(path, COOKIE, name, expected)


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


class _HandDial:
    """The initiator's side of the handshake in steps, so a test can act between them."""

    def __init__(self, stream: trio.SocketStream, name: str) -> None:
        self.stream = stream
        self.name = name
        self.frames = wire.FrameStream(stream, versions=frozenset({2}))

    def _handshake(self, auth: dict[str, Any]) -> bytes:
        frame = wire.Handshake(self.name, (2,), (wire.Codec.TLV,), 1, auth).to_frame()
        return wire.encode_frame(frame)

    async def hello(self) -> None:
        await self.stream.send_all(self._handshake({"challenge": b"c" * 32, "listen": []}))

    async def proof(self) -> bytes:
        """Read the acceptor's answer; return the proof frame (for the test to write)."""
        frame = await self.frames.receive_frame()
        assert frame is not None and frame.type is wire.MessageType.HANDSHAKE
        answer = wire.parse_dist(frame)
        assert isinstance(answer, wire.Handshake)
        return self._handshake(
            {"digest": digest(COOKIE, "initiator", self.name, answer.auth["challenge"])}
        )


def _frame(mtype: wire.MessageType, payload: Any) -> bytes:
    return wire.encode_message(mtype, payload, codec=wire.Codec.TLV)


# -- simultaneous connect ----------------------------------------------------------------------


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


# -- bad input from one process costs that process only ---------------------------------------


async def test_a_remote_monitor_of_an_unhashable_name_does_not_cut_the_connection(
    tmp_path: Path,
) -> None:
    # Registered names are str. A (name, node) whose name is a list crosses unchecked; the
    # receiving node then fails to look it up and drops the whole connection as malformed,
    # firing noconnection on every link and monitor between the two nodes.
    address = f"unix:{tmp_path}/b.sock"
    async with PeerNode(B, address), otp.open_node(A):
        await _listening(tmp_path / "a.sock")
        assert await otp.connect(B, address)
        ref = otp.monitor(("echo", B))
        assert await otp.call(("echo", B), "monitor in place") == "monitor in place"
        with contextlib.suppress(TypeError, otp.BadArg):  # refusing it here is fine too
            otp.monitor((["echo"], B))  # type: ignore[arg-type]
        assert await otp.call(("echo", B), "still connected", timeout=3) == "still connected"
        assert (
            await otp.receive(lambda m: getattr(m, "ref", None) == ref, timeout=0, default=None)
            is None
        )


# -- process groups ------------------------------------------------------------------------------


class _Group(enum.Enum):
    WORKERS = "workers"


async def test_a_group_name_that_cannot_cross_never_breaks_later_connections(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Joining works while the node has no peers; every connection made after it crashes at
    # its pg sync (value_to_wire refuses the group name inside Distribution.connection_up).
    async with otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        with contextlib.suppress(otp.BadArg):  # refusing the name at join is fine too
            otp.pg.join(_Group.WORKERS)
        async with _raw_peer(tmp_path / "b.sock") as (_, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None
            await trio.sleep(1)
            assert otp.nodes() == [X]


async def test_a_join_refused_for_its_group_name_changes_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Connected, the same join raises BadArg from the broadcast, after the local membership
    # was recorded: the caller is told it failed, yet it is a member here and nowhere else.
    async with otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (_, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None
            try:
                otp.pg.join(_Group.WORKERS)
            except otp.BadArg:
                assert otp.pg.get_local_members(_Group.WORKERS) == []
                assert otp.pg.get_members(_Group.WORKERS) == []
                assert otp.pg.which_groups() == []


# -- monitor_node --------------------------------------------------------------------------------


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


# -- the end of the handshake --------------------------------------------------------------------


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


# -- names the distribution layer uses for itself ----------------------------------------------


@pytest.mark.parametrize("name", ["pg", "net_kernel"])
async def test_a_process_registered_as_pg_or_net_kernel_gets_its_remote_messages(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, name: str
) -> None:
    # A user's GenServer named "pg" (a PostgreSQL pool, say) is reachable locally, but every
    # send and call to ("pg", node) from another node is taken by the pg protocol (and
    # ("net_kernel", node) by the mesh), so it never arrives and remote calls time out.
    async with otp.open_node(B):
        try:
            otp.register(name, otp.self())
        except otp.BadArg as exc:  # a reserved name, refused with a clear error, is fine too
            assert name in str(exc)
            return
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (stream, _):
            request = ("query", "select 1")
            await stream.send_all(
                _frame(
                    wire.MessageType.REG_SEND,
                    {"from": wire.Pid(X, 1, 1), "to": name, "msg": request},
                )
            )
            assert await otp.receive(timeout=5, default=None) == request


# -- edges of the fixes --------------------------------------------------------------------------


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


async def test_a_peers_messages_to_names_that_are_not_str_reach_nobody(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A peer naming a list (or any non-str) in REG_SEND, MONITOR or DEMONITOR: dropped, or
    # answered noproc, as for an unregistered name; the connection stays.
    async with otp.open_node(B):
        otp.register("inbox", otp.self())
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (stream, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None
            sender = wire.Pid(X, 1, 1)
            ref = wire.Ref(X, 9, 1)
            await stream.send_all(
                _frame(wire.MessageType.REG_SEND, {"from": sender, "to": ["inbox"], "msg": 1})
                + _frame(wire.MessageType.MONITOR, {"from": sender, "to": ["inbox"], "ref": ref})
                + _frame(wire.MessageType.DEMONITOR, {"from": sender, "to": {"x": 1}, "ref": ref})
                + _frame(wire.MessageType.REG_SEND, {"from": sender, "to": "inbox", "msg": 2})
            )
            assert await otp.receive(timeout=5, default=None) == 2
            with trio.fail_after(5):
                async for frame in frames:
                    if frame.type is wire.MessageType.DOWN:
                        break
            assert frame.payload["ref"] == ref
            assert frame.payload["from"] == ["inbox"]
            assert frame.payload["reason"] == wire.ExitReason("noproc")
            assert otp.nodes() == [X]


async def test_a_send_or_monitor_of_a_name_that_is_not_str_on_another_node_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (_, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None
            with pytest.raises(TypeError, match=r"name: str.*\(\['x'\], 'x@localhost'\)"):
                otp.send((["x"], X), "m")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="name: str"):
                otp.monitor((b"x", X))  # type: ignore[arg-type]
            assert otp.disconnect(X)
        # No monitor was left behind to fire with the connection.
        assert await otp.receive(timeout=0, default=None) is None


async def test_a_join_refused_for_its_group_name_says_why(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(B):
        with pytest.raises(otp.BadArg, match=r"pg\.join\(<_Group\.WORKERS.*cannot be sent"):
            otp.pg.join(_Group.WORKERS)
        deep: tuple[Any, ...] = ()
        for _ in range(300):
            deep = (deep,)
        with pytest.raises(otp.BadArg, match=r"able to cross.*max_depth"):
            otp.pg.join(deep)  # deeper than the wire carries
        assert otp.pg.which_groups() == []


@pytest.mark.parametrize("name", ["$pg", "$net_kernel"])
async def test_a_process_registered_under_the_internal_names_gets_its_remote_messages(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, name: str
) -> None:
    async with otp.open_node(B):
        otp.register(name, otp.self())
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (stream, _):
            await stream.send_all(
                _frame(wire.MessageType.REG_SEND, {"from": wire.Pid(X, 1, 1), "to": name, "msg": 1})
            )
            assert await otp.receive(timeout=5, default=None) == 1


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


# -- checked and found right ---------------------------------------------------------------------


async def test_a_remote_call_that_times_out_drops_the_late_reply_and_demonitors(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with otp.open_node(B):
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (stream, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None  # b counts us as up
            with pytest.raises(otp.CallTimeout):
                await otp.call(("srv", X), "slow", timeout=1)
            seen: dict[wire.MessageType, Any] = {}
            with trio.fail_after(5):
                while wire.MessageType.DEMONITOR not in seen:
                    frame = await frames.receive_frame()
                    assert frame is not None
                    seen[frame.type] = frame.payload
            monitor = seen[wire.MessageType.MONITOR]
            assert monitor["to"] == "srv"
            assert seen[wire.MessageType.DEMONITOR]["ref"] == monitor["ref"]
            request = seen.get(wire.MessageType.REG_SEND) or seen[wire.MessageType.REG_SEND_BATCH]
            _, (caller, tag), _ = request["msg"] if "msg" in request else request["msgs"][0]
            # The reply and a DOWN, late: neither reaches the caller's mailbox.
            await stream.send_all(
                _frame(
                    wire.MessageType.SEND,
                    {"to": caller, "msg": (wire.Atom("$gen_reply"), tag, "late")},
                )
                + _frame(
                    wire.MessageType.DOWN,
                    {
                        "from": wire.Atom("srv"),
                        "to": caller,
                        "ref": monitor["ref"],
                        "reason": wire.ExitReason("noproc"),
                    },
                )
            )
            await trio.sleep(1)
            assert await otp.receive(timeout=0, default=None) is None
            assert otp.nodes() == [X]
