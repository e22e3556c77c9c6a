"""Distribution between nodes: each peer node runs its own trio.run in a thread, so everything
between them crosses real sockets, the handshake and the wire codec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import COOKIE, PeerNode, raw_peer
from .helpers import B, X, _ask_factory, _connected, _frame, _listening, _raw_peer, _with_factory


async def _distributed(name: str, address: str, **config: Any) -> None:
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(address,), **config))


async def test_call_cast_and_send_reach_a_process_on_another_node(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            assert await otp.connect("b@localhost", sockets("b"))
            assert otp.nodes() == ["b@localhost"]
            remote = ("echo", "b@localhost")
            assert await otp.call(remote, "whoami") == "b@localhost"
            assert await otp.call(remote, {"nested": [1, (2, 3), b"x", None]}) == {
                "nested": [1, (2, 3), b"x", None]
            }
            otp.cast(remote, (otp.self(), "cast back"))
            assert await otp.receive() == "cast back"
            otp.send(remote, (otp.self(), "plain"))
            assert await otp.receive() == ("echo", "plain")


async def test_remote_call_errors_carry_the_remote_reason(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            await otp.connect("b@localhost", sockets("b"))
            with pytest.raises(otp.CallTimeout):
                await otp.call(("echo", "b@localhost"), "hang", timeout=0.2)
            with pytest.raises(otp.CallError) as info:
                await otp.call(("nobody", "b@localhost"), "x")
            assert info.value.reason == otp.NOPROC
            with pytest.raises(otp.CallError) as info:
                await otp.call(("echo", "b@localhost"), "crash")
            reason = info.value.reason
            assert isinstance(reason, otp.Crash)
            assert isinstance(reason.exception, otp.RemoteException)
            assert reason.exception.type_name == "RuntimeError"
            assert "remote crash" in reason.exception.remote_traceback


async def test_links_and_monitors_cross_nodes(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            await otp.connect("b@localhost", sockets("b"))
            otp.process_flag(trap_exit=True)
            # A remote pid, learnt from a message.
            otp.send(("echo", "b@localhost"), (otp.self(), "hello"))
            await otp.receive()
            echo = await otp.call(("echo", "b@localhost"), "whoami")
            assert echo == "b@localhost"
            ref = otp.monitor(("echo", "b@localhost"))
            assert otp.demonitor(ref) is True

            async def local_then_crash() -> None:
                await otp.receive()
                otp.exit_self("bye")

            # A remote process links to a local one through a cast that makes it send: simpler,
            # link from here to a process spawned remotely is what a supervisor does.
            pid = otp.spawn(local_then_crash)
            otp.link(pid)
            otp.send(pid, "go")
            assert await otp.receive(otp.Exit) == otp.Exit(pid, "bye")


async def test_exit_signals_cross_nodes_by_otps_rules(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            await otp.connect("b@localhost", sockets("b"))
            otp.process_flag(trap_exit=True)
            echo = ("echo", "b@localhost")
            # A remote process dies with a reason: the link brings it here.
            remote = await otp.call(echo, ("spawn", "remote_reason"))
            assert remote.node == "b@localhost"
            otp.link(remote)
            otp.send(remote, "go")
            assert await otp.receive(otp.Exit) == otp.Exit(remote, "remote_reason")
            # exit(Pid, kill) across nodes is untrappable and becomes killed.
            remote = await otp.call(echo, ("spawn", "unused"))
            ref = otp.monitor(remote)
            otp.exit(remote, otp.KILL)
            assert await otp.receive(otp.Down) == otp.Down(ref, remote, otp.KILLED)
            # Linking to a dead remote process while trapping gives Exit(noproc).
            otp.link(remote)
            assert await otp.receive(otp.Exit) == otp.Exit(remote, otp.NOPROC)
            # A local crash reaches a linked remote process, which dies of it.
            remote = await otp.call(echo, ("spawn", "unused"))
            ref = otp.monitor(remote)

            async def crash_linked(pid: otp.Pid) -> None:
                otp.link(pid)
                raise ValueError("local crash")

            otp.spawn(crash_linked, remote)
            down = await otp.receive(otp.Down)
            assert down.ref == ref
            assert isinstance(down.reason, otp.Crash)
            assert down.reason.exception.type_name == "ValueError"


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


async def test_a_wrong_cookie_is_refused(sockets: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with PeerNode("b@localhost", sockets("b"), cookie=b"another-cookie-entirely"):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            assert await otp.connect("b@localhost", sockets("b")) is False
            assert otp.nodes() == []
    assert any("does not know our cookie" in r.getMessage() for r in caplog.records)


async def test_messages_to_an_unreachable_node_are_dropped(sockets: Any) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert await otp.connect("ghost@localhost", sockets("ghost")) is False
        otp.send(("echo", "ghost@localhost"), "dropped")
        with pytest.raises(otp.CallError) as info:
            await otp.call(("echo", "ghost@localhost"), "x")
        assert info.value.reason == otp.NOCONNECTION


async def test_unix_sockets_are_created_mode_0600(sockets: Any, tmp_path: Path) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert (tmp_path / "a.sock").stat().st_mode & 0o777 == 0o600


async def test_tcp_without_tls_needs_insecure_tcp() -> None:
    async with otp.open_node("a@localhost"):
        with pytest.raises(otp.DistributionError, match="needs TLS certificates"):
            await _distributed("a", "tcp:127.0.0.1:0")


async def test_a_node_needs_a_real_name_to_be_distributed(sockets: Any) -> None:
    async with otp.open_node():
        with pytest.raises(otp.DistributionError, match="needs a name like 'a@host'"):
            await _distributed("a", sockets("a"))


async def test_process_groups_converge_across_nodes(sockets: Any) -> None:
    async def join_remote() -> None:
        async def member() -> None:
            otp.pg.join("workers")
            await otp.receive()

        otp.spawn(member)
        otp.spawn(member)

    async with PeerNode("b@localhost", sockets("b"), setup=join_remote):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            ref, _ = otp.pg.monitor_scope()
            otp.pg.join("workers")
            await otp.connect("b@localhost", sockets("b"))
            joined = await otp.receive(otp.pg.PgJoin)
            while len(otp.pg.get_members("workers")) < 3:
                await otp.receive(otp.pg.PgJoin)
            members = otp.pg.get_members("workers")
            assert sorted(p.node for p in members) == ["a@localhost", "b@localhost", "b@localhost"]
            assert otp.pg.get_local_members("workers") == [otp.self()]
            assert joined.ref == ref
            otp.disconnect("b@localhost")
            leave = await otp.receive(otp.pg.PgLeave)
            assert {p.node for p in leave.pids} == {"b@localhost"}
            assert otp.pg.get_members("workers") == [otp.self()]


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


async def test_a_burst_of_sends_casts_and_calls_keeps_per_pair_order(sockets: Any) -> None:
    # Bursts travel as batch frames; calls, other routes and plain frames interleave with them.
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            await otp.connect("b@localhost", sockets("b"))
            me = otp.self()
            echo = ("echo", "b@localhost")
            expected = []
            for i in range(3000):
                if i % 500 == 499:
                    assert await otp.call(echo, i) == i
                    continue
                if i % 3 == 0:
                    otp.send(echo, (me, i))  # echoed back as ("echo", i)
                    expected.append(("echo", i))
                else:
                    otp.cast(echo, (me, i))  # sent back as i
                    expected.append(i)
                if i % 7 == 0:
                    otp.send(("nobody", "b@localhost"), i)  # another route, dropped there
            got = [await otp.receive() for _ in expected]
            assert got == expected


async def test_a_bad_message_in_a_burst_fails_in_its_sender_only(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"), limits=wire.Limits(max_payload=4096))
            await otp.connect("b@localhost", sockets("b"))
            me = otp.self()
            echo = ("echo", "b@localhost")
            for i in range(200):
                otp.send(echo, (me, i))
                if i == 50:
                    with pytest.raises(otp.BadArg, match="a set cannot be sent to another node"):
                        otp.send(echo, (me, {1, 2}))
                if i == 100:
                    with pytest.raises(otp.BadArg, match="max_payload=4096"):
                        otp.send(echo, (me, b"x" * 10_000))
            assert [await otp.receive() for _ in range(200)] == [("echo", i) for i in range(200)]


async def test_a_clean_stop_removes_the_unix_socket_file(sockets: Any, tmp_path: Path) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert (tmp_path / "a.sock").is_socket()
    assert not (tmp_path / "a.sock").exists()


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


def test_the_queue_bounds_are_set_by_the_nodes_flags(tmp_path: Path) -> None:
    from otp.node._config import load_config

    cookie = tmp_path / "cookie"
    cookie.write_bytes(COOKIE)
    cookie.chmod(0o600)
    base = ["--name", "a@localhost", "--cookie-file", str(cookie)]
    default = load_config(base).distribution
    assert default is not None
    assert (default.config.busy_limit, default.config.queue_limit) == (1 << 20, 64 << 20)
    flags = ["--dist-busy-limit", "4096", "--dist-queue-limit", "65536"]
    settings = load_config(base + flags).distribution
    assert settings is not None
    assert (settings.config.busy_limit, settings.config.queue_limit) == (4096, 65536)


async def test_senders_suspended_by_a_busy_connection_resume_as_the_peer_reads(
    sockets: Any,
) -> None:
    # A 64 KiB busy limit, 4 MiB sent by two processes: each is suspended many times, resumed
    # as the peer reads, and every message arrives once, in order per sender.
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"), busy_limit=64 * 1024)
            await otp.connect("b@localhost", sockets("b"))
            me = otp.self()

            async def sender(tag: str) -> None:
                for i in range(2000):
                    otp.cast(("echo", "b@localhost"), (me, (tag, i, b"x" * 1024)))
                    await otp.receive(timeout=0, default=None)
                otp.send(me, (tag, "done"))

            otp.spawn(sender, "p")
            otp.spawn(sender, "q")
            got: dict[str, list[int]] = {"p": [], "q": []}
            done = 0
            with trio.fail_after(60):
                while done < 2 or len(got["p"]) + len(got["q"]) < 4000:
                    message = await otp.receive()
                    if message[1] == "done":
                        done += 1
                    else:
                        got[message[0]].append(message[1])
            assert got == {"p": list(range(2000)), "q": list(range(2000))}


# -- how frames are written and read: direct writes, lazy frames, the socket reader ----------


def _connection_on(sock: Any, **config: Any) -> Any:
    """A Connection that is up on ``sock`` (one end of a socketpair), of the current node's
    Distribution; its writer is not started."""
    from otp._distribution import Connection, Distribution

    dist = Distribution(otp.current_node(), otp.DistConfig(cookie=COOKIE, **config))
    conn = Connection(dist, "b@localhost")
    conn.codec = wire.Codec.TLV
    conn.state = "up"
    conn.direct_fd = sock.fileno()
    return conn


def _frames_in(data: bytes) -> list[tuple[wire.MessageType, Any]]:
    return [(f.type, f.payload) for f in wire.FrameDecoder().feed(data)]


def _ping_payload(i: int) -> dict[str, Any]:
    return {"to": wire.Pid("b@localhost", 1, 1), "msg": i}


async def test_a_lazy_frame_waits_for_the_next_frame_and_goes_first_in_its_write() -> None:
    import socket

    SEND, DEMONITOR = wire.MessageType.SEND, wire.MessageType.DEMONITOR
    async with otp.open_node("a@localhost"):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.setblocking(False)
            conn = _connection_on(ours)
            conn.enqueue(DEMONITOR, {"ref": 1}, lazy=True)
            # Nothing written, nobody woken: it waits for the next frame.
            with pytest.raises(BlockingIOError):
                theirs.recv(65536)
            assert not conn.idle
            conn.enqueue(SEND, _ping_payload(1))
            assert conn.idle  # both went out in one direct write, the lazy frame first
            assert _frames_in(theirs.recv(65536)) == [
                (DEMONITOR, {"ref": 1}),
                (SEND, _ping_payload(1)),
            ]


async def test_a_lone_lazy_frame_is_written_by_the_writer_after_lazy_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from otp._distribution import LAZY_DELAY

    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.write_loop, trio.SocketStream(ours))
                await trio.testing.wait_all_tasks_blocked()
                start = trio.current_time()
                conn.enqueue(wire.MessageType.DEMONITOR, {"ref": 2}, lazy=True)
                data = await theirs.recv(65536)
                assert trio.current_time() - start >= LAZY_DELAY
                assert _frames_in(data) == [(wire.MessageType.DEMONITOR, {"ref": 2})]
                nursery.cancel_scope.cancel()


async def test_a_frame_sent_while_the_writer_writes_queues_behind_it_in_order() -> None:
    # The direct write is only for an idle connection: a frame sent while a long one is
    # still being written (the peer reads slowly) must not cut into it.
    SEND = wire.MessageType.SEND
    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours)
            big = {"to": wire.Pid("b@localhost", 1, 1), "msg": b"x" * (4 << 20)}
            received = bytearray()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.write_loop, trio.SocketStream(ours))
                await trio.testing.wait_all_tasks_blocked()
                conn.enqueue(SEND, big)  # the socket takes part of it: the writer has the rest
                await trio.testing.wait_all_tasks_blocked()
                assert not conn.idle
                for i in range(3):
                    conn.enqueue(SEND, _ping_payload(i))
                conn.enqueue(wire.MessageType.DEMONITOR, {"ref": 3}, lazy=True)
                while len(_frames_in(bytes(received))) < 5:
                    received += await theirs.recv(1 << 20)
                nursery.cancel_scope.cancel()
            frames = _frames_in(bytes(received))
            assert [payload["msg"] if t is SEND else payload for t, payload in frames] == [
                big["msg"],
                0,
                1,
                2,
                {"ref": 3},
            ]


async def test_the_busy_limit_still_suspends_a_sender_of_direct_writes() -> None:
    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours, busy_limit=64 * 1024, queue_limit=1 << 30)
            from otp._process import current_process

            me = current_process()
            payload = {"to": wire.Pid("b@localhost", 1, 1), "msg": b"y" * 4096}
            while not conn.busy:  # nobody reads: past what the socket takes, frames queue
                conn.enqueue(wire.MessageType.SEND, payload)
            assert me.suspended is not None  # its next receive waits until half is written


async def test_the_socket_reader_returns_frames_as_they_complete_and_then_the_error() -> None:
    from otp._distribution import _SocketFrames

    SEND = wire.MessageType.SEND
    frame = wire.encode_message(SEND, _ping_payload(7))
    ours, theirs = trio.socket.socketpair()
    with ours, theirs:
        reader = _SocketFrames(ours.fileno(), wire.Limits())
        await theirs.send(frame[:5])
        async with trio.open_nursery() as nursery:
            got: list[Any] = []

            async def read() -> None:
                got.append(await reader.receive_frames())

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # half a header: it waits for the rest
            await theirs.send(frame[5:] + frame)
        assert [(f.type, f.payload) for f in got[0]] == [(SEND, _ping_payload(7))] * 2
        await theirs.send(frame + b"XX" + b"\0" * 14)
        assert [f.payload for f in await reader.receive_frames()] == [_ping_payload(7)]
        with pytest.raises(wire.WireError):
            await reader.receive_frames()  # the bad header behind the good frame


async def test_the_socket_reader_tells_a_clean_end_from_one_inside_a_frame() -> None:
    from otp._distribution import _SocketFrames

    frame = wire.encode_message(wire.MessageType.PING, None)
    for tail, clean in ((b"", True), (frame[:3], False)):
        ours, theirs = trio.socket.socketpair()
        with ours:
            reader = _SocketFrames(ours.fileno(), wire.Limits())
            await theirs.send(frame + tail)
            theirs.close()
            assert [f.type for f in await reader.receive_frames()] == [wire.MessageType.PING]
            if clean:
                assert await reader.receive_frames() == []
            else:
                with pytest.raises(wire.Truncated):
                    await reader.receive_frames()


async def test_a_remote_call_whose_request_cannot_cross_records_nothing(sockets: Any) -> None:
    async with PeerNode("b@localhost", sockets("b")):
        async with otp.open_node("a@localhost"):
            await _distributed("a", sockets("a"))
            assert await otp.connect("b@localhost", sockets("b"))
            remote = ("echo", "b@localhost")
            with pytest.raises(otp.BadArg):
                await otp.call(remote, object())
            info = otp.process_info(otp.self())
            assert info is not None and info.monitors == ()
            assert await otp.call(remote, "after") == "after"
            info = otp.process_info(otp.self())
            assert info is not None and info.monitors == ()


async def test_a_call_to_a_dead_remote_pid_fails_with_noproc(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        worker = await _ask_factory("worker", 0, otp.NORMAL)
        ref = otp.monitor(worker)
        otp.send(worker, "go")
        assert await otp.receive(otp.Down) == otp.Down(ref, worker, otp.NORMAL)
        with pytest.raises(otp.CallError) as info:
            await otp.call(worker, "anything", timeout=3)
        assert info.value.reason == otp.NOPROC
        assert not isinstance(info.value, otp.CallTimeout)


async def test_a_call_to_a_pid_on_an_unknown_node_fails_with_noconnection(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        remote = await otp.call(("echo", B), ("spawn", "unused"))
        ghost = otp.Pid._make("ghost@localhost", remote.id, remote.creation)
        with pytest.raises(otp.CallError) as info:
            await otp.call(ghost, "x", timeout=3)
        assert info.value.reason == otp.NOCONNECTION
        otp.send(ghost, "dropped silently")
        otp.send(("echo", "ghost@localhost"), "dropped silently")
        assert await otp.call(("echo", B), "still fine") == "still fine"


async def test_send_to_an_unregistered_remote_name_is_dropped_silently(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.send(("nobody", B), "lost")
        otp.cast(("nobody", B), "lost")
        assert await otp.call(("echo", B), "ok") == "ok"
        assert otp.nodes() == [B]


async def test_a_call_in_flight_fails_with_noconnection_when_the_connection_drops(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        me = otp.self()

        async def caller() -> None:
            try:
                await otp.call(("echo", B), "hang", timeout=10)
            except otp.CallError as exc:
                otp.send(me, ("call failed", exc.reason, isinstance(exc, otp.CallTimeout)))

        otp.spawn(caller)
        # The request reached B (per-pair order) once a later call from here is answered.
        assert await otp.call(("echo", B), "sync") == "sync"
        otp.disconnect(B)
        with trio.fail_after(3):
            assert await otp.receive() == ("call failed", otp.NOCONNECTION, False)


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("read x; exit 3", otp.ExitStatus(3)),
        ("read x; kill -9 $$", otp.Signaled("SIGKILL")),
    ],
)
async def test_a_ports_exit_reason_crosses_nodes_intact(
    sockets: Any, script: str, reason: Any
) -> None:
    # A remote monitor of a port must still tell an exit status from a signal.
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        port = await otp.open_port(["sh", "-c", script], link=False)
        await _ask_factory("watch", port)  # B's MONITOR reached us before this reply
        otp.port_command(port, b"\n")
        with trio.fail_after(3):
            report = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "watched_down")
        assert report == ("watched_down", reason)


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
