"""Edges of the distribution and ports layer against OTP 25 semantics (that the other tests do
not cover). Ports run real OS programs; peer nodes run in threads and talk over real sockets."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

import otp
import wire

from .peer import COOKIE, PeerNode

PY = sys.executable
B = "b@localhost"


def _gone(os_pid: int) -> bool:
    try:
        os.kill(os_pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _wait_gone(os_pid: int, within: float = 3.0) -> bool:
    # The OS reaps asynchronously from our view only through polling: there is no event for
    # "some other process's pid vanished". Poll briefly, bounded.
    with trio.move_on_after(within):
        while not _gone(os_pid):
            await trio.sleep(0.01)
    return _gone(os_pid)


@pytest.fixture
def sockets(tmp_path: Path) -> Any:
    return lambda name: f"unix:{tmp_path / name}.sock"


async def _distributed(address: str, **config: Any) -> None:
    config["listen"] = (address,)
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, **config))


# -- ports ----------------------------------------------------------------------------------------


async def test_a_port_closes_even_while_its_program_does_not_read_stdin() -> None:
    # Erlang queues port commands in the port: port_close/exit signals are never held up by a
    # program that does not read its stdin.
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        os_pid = await otp.port_os_pid(port)
        ref = otp.monitor(port)
        otp.port_command(port, b"x" * 1_000_000)  # far more than a pipe buffer holds
        otp.port_close(port)
        with trio.fail_after(2):
            down = await otp.receive(otp.Down)
        assert down == otp.Down(ref, port, otp.NORMAL)
        assert await _wait_gone(os_pid)


async def test_a_port_whose_owner_dies_kills_a_program_that_does_not_read_stdin() -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"])
            otp.send(me, (port, await otp.port_os_pid(port)))
            otp.port_command(port, b"x" * 1_000_000)
            await otp.receive()
            otp.exit_self("owner gone")

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        otp.send(owner_pid, "die")
        with trio.fail_after(2):
            down = await otp.receive(otp.Down)
        assert down == otp.Down(ref, port, "owner gone")
        assert await _wait_gone(os_pid)


async def test_a_port_answers_os_pid_while_its_program_does_not_read_stdin() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        otp.port_command(port, b"x" * 1_000_000)
        with trio.fail_after(2):
            os_pid = await otp.port_os_pid(port)
        assert os_pid > 0
        otp.exit(port, otp.KILL)


async def test_a_program_killed_by_sigterm_names_sigterm() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sh", "-c", "kill -TERM $$"], link=False)
        ref = otp.monitor(port)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.Signaled("SIGTERM"))


async def test_a_high_exit_status_is_an_exit_status_not_a_signal() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sh", "-c", "exit 137"], link=False)
        ref = otp.monitor(port)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.ExitStatus(137))


async def test_a_non_trapping_owner_dies_of_its_ports_exit_status() -> None:
    async with otp.open_node():

        async def owner() -> None:
            await otp.open_port(["sh", "-c", "exit 5"])
            await otp.receive()

        pid, ref = otp.spawn_monitor(owner)
        assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.ExitStatus(5))


async def test_argv_is_passed_literally_without_a_shell() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        args = ["a b", "$HOME", "*", "'q'", ""]
        port = await otp.open_port(
            [PY, "-c", "import sys; print(repr(sys.argv[1:]))", *args], mode="line"
        )
        assert (await otp.receive(otp.PortData)).data.decode() == repr(args)
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)


async def test_other_descriptors_are_closed_on_exec_unless_passed() -> None:
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, True)
    os.set_inheritable(write_fd, True)
    script = (
        "import os, sys\n"
        "for fd in map(int, sys.argv[1:]):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        print(fd, 'open')\n"
        "    except OSError:\n"
        "        print(fd, 'closed')\n"
    )
    try:
        async with otp.open_node():
            otp.process_flag(trap_exit=True)
            await otp.open_port(
                [PY, "-c", script, str(read_fd), str(write_fd)], mode="line", pass_fds=[write_fd]
            )
            lines = {(await otp.receive(otp.PortData)).data.decode() for _ in range(2)}
            assert lines == {f"{read_fd} closed", f"{write_fd} open"}
            assert (await otp.receive(otp.Exit)).reason == otp.NORMAL
    finally:
        os.close(read_fd)
        os.close(write_fd)


async def test_stderr_goes_to_stdout_only_when_asked() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        script = "import sys; sys.stderr.write('err\\n'); sys.stderr.flush(); print('out')"
        await otp.open_port([PY, "-c", script], mode="line", stderr_to_stdout=True)
        got = {(await otp.receive(otp.PortData)).data for _ in range(2)}
        assert got == {b"err", b"out"}
        await otp.receive(otp.Exit)


async def test_a_normal_exit_signal_from_a_non_owner_is_ignored_by_a_port() -> None:
    async with otp.open_node():
        port = await otp.open_port(["cat"], mode="line", link=False)

        async def stranger() -> None:
            otp.exit(port, otp.NORMAL)

        otp.spawn_monitor(stranger)
        await otp.receive(otp.Down)
        otp.port_command(port, b"still here\n")
        assert (await otp.receive(otp.PortData)).data == b"still here"
        port_ref = otp.monitor(port)
        otp.port_close(port)
        assert await otp.receive(otp.Down) == otp.Down(port_ref, port, otp.NORMAL)


async def test_a_port_whose_owner_exits_normally_kills_its_program() -> None:
    async with otp.open_node():
        me = otp.self()

        async def owner() -> None:
            port = await otp.open_port(["sleep", "60"])
            otp.send(me, (port, await otp.port_os_pid(port)))
            await otp.receive()

        owner_pid = otp.spawn(owner)
        port, os_pid = await otp.receive()
        ref = otp.monitor(port)
        otp.send(owner_pid, "return normally")
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.NORMAL)
        assert await _wait_gone(os_pid)


async def test_a_supervisor_style_shutdown_then_kill_never_leaks_the_program() -> None:
    # shutdown first; the program ignores SIGTERM and the port's kill_timeout is long; the
    # "supervisor" then kills the port outright after its own shutdown time.
    async with otp.open_node():
        script = (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n"
        )
        port = await otp.open_port([PY, "-c", script], mode="line", kill_timeout=30, link=False)
        await otp.receive(otp.PortData)
        os_pid = await otp.port_os_pid(port)
        ref = otp.monitor(port)
        otp.exit(port, otp.SHUTDOWN)
        assert await otp.receive(otp.Down, timeout=0.3, default=None) is None
        assert not _gone(os_pid)
        otp.exit(port, otp.KILL)
        assert await otp.receive(otp.Down) == otp.Down(ref, port, otp.KILLED)
        assert await _wait_gone(os_pid)


async def test_port_commands_reach_the_program_in_order() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(["cat"], mode="line")
        for i in range(200):
            otp.port_command(port, f"{i}\n".encode())
        got = [int((await otp.receive(otp.PortData)).data) for _ in range(200)]
        assert got == list(range(200))
        otp.port_close(port)
        assert await otp.receive(otp.Exit) == otp.Exit(port, otp.NORMAL)


# -- distribution ---------------------------------------------------------------------------------


async def _worker(report_to: otp.Pid, count: int, reason: Any) -> None:
    await otp.receive(lambda m: m == "go")
    for i in range(count):
        otp.send(report_to, ("msg", i))
    otp.exit_self(reason)


async def _pg_member(group: str, times: int) -> None:
    for _ in range(times):
        otp.pg.join(group)
    await otp.receive()


async def _watcher(report_to: otp.Pid, target: otp.Pid) -> None:
    ref = otp.monitor(target)
    otp.send(report_to, ("watch", otp.self()))
    down = await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
    otp.send(report_to, ("watched_down", down.reason))


async def _node_watcher(report_to: otp.Pid, node: str) -> None:
    otp.monitor_node(node)
    otp.send(report_to, ("node_watching", node))
    down = await otp.receive(otp.NodeDown)
    otp.send(("collector", node), ("node_down_seen", down.node))


async def _factory() -> None:
    """A registered process on the peer that spawns helpers on request and tells their pids."""
    while True:
        request = await otp.receive()
        if request[0] == "worker":
            _, to, count, reason = request
            otp.send(to, ("worker", otp.spawn(_worker, to, count, reason)))
        elif request[0] == "watch":
            _, to, target = request
            otp.spawn(_watcher, to, target)
        elif request[0] == "node_watch":
            _, to, node = request
            otp.spawn(_node_watcher, to, node)
        elif request[0] == "pg_member":
            _, to, group, times = request
            pid = otp.spawn(_pg_member, group, times)
            otp.send(to, ("pg_member", pid))


async def _with_factory() -> None:
    otp.register("factory", otp.spawn(_factory))


async def _ask_factory(*request: Any) -> otp.Pid:
    otp.send(("factory", B), (request[0], otp.self(), *request[1:]))
    _, pid = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == request[0])
    assert isinstance(pid, otp.Pid) and pid.node == B
    return pid


async def _connected(sockets: Any) -> None:
    await _distributed(sockets("a"))
    assert await otp.connect(B, sockets("b"))


async def test_exit_normal_to_a_non_trapping_remote_process_is_ignored(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        remote = await otp.call(("echo", B), ("spawn", "its own reason"))
        ref = otp.monitor(remote)
        otp.exit(remote, otp.NORMAL)
        otp.send(remote, "go")
        assert await otp.receive(otp.Down) == otp.Down(ref, remote, "its own reason")


async def test_exit_with_a_reason_kills_a_non_trapping_remote_process(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        remote = await otp.call(("echo", B), ("spawn", "unused"))
        ref = otp.monitor(remote)
        otp.exit(remote, ("custom", 1))
        assert await otp.receive(otp.Down) == otp.Down(ref, remote, ("custom", 1))


async def test_a_local_exit_with_reason_kill_reaches_a_remote_link_as_kill(sockets: Any) -> None:
    # OTP_SEMANTICS 1, rule 1: kill becomes killed only for exit/2; a link carries kill.
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        remote = await otp.call(("echo", B), ("spawn", "unused"))
        ref = otp.monitor(remote)

        async def die_with_kill() -> None:
            otp.link(remote)
            otp.exit_self(otp.KILL)

        otp.spawn(die_with_kill)
        assert await otp.receive(otp.Down) == otp.Down(ref, remote, otp.KILL)


async def test_monitoring_an_unregistered_remote_name_gives_noproc(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        ref = otp.monitor(("nobody", B))
        assert await otp.receive(otp.Down) == otp.Down(ref, ("nobody", B), otp.NOPROC)


async def test_a_remote_name_monitor_reports_the_name_and_the_exit_reason(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        ref = otp.monitor(("echo", B))
        with pytest.raises(otp.CallError):
            await otp.call(("echo", B), "crash")
        down = await otp.receive(otp.Down)
        assert down.ref == ref and down.pid == ("echo", B)
        assert isinstance(down.reason, otp.Crash)
        assert isinstance(down.reason.exception, otp.RemoteException)
        assert down.reason.exception.type_name == "RuntimeError"


async def test_a_remote_demonitor_stops_the_down_and_flush_removes_a_queued_one(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        worker = await _ask_factory("worker", 0, "done")
        ref = otp.monitor(worker)
        assert otp.demonitor(ref) is True
        witness = otp.monitor(worker)
        otp.send(worker, "go")
        assert await otp.receive(otp.Down) == otp.Down(witness, worker, "done")
        assert await otp.receive(otp.Down, timeout=0, default=None) is None
        # A DOWN already queued: flush removes it, and the monitor is no longer active.
        again = otp.monitor(worker)
        otp.send(("echo", B), (otp.self(), "sync"))
        # Per-pair order: the noproc DOWN (answer to the MONITOR sent first) is queued by now.
        assert await otp.receive(lambda m: m == ("echo", "sync")) == ("echo", "sync")
        assert otp.demonitor(again, flush=True) is False
        assert await otp.receive(timeout=0, default=None) is None


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


async def test_linking_to_a_dead_remote_pid_kills_a_non_trapping_caller_with_noproc(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        worker = await _ask_factory("worker", 0, otp.NORMAL)
        worker_ref = otp.monitor(worker)
        otp.send(worker, "go")
        assert await otp.receive(otp.Down) == otp.Down(worker_ref, worker, otp.NORMAL)

        async def linker() -> None:
            otp.link(worker)
            await otp.receive()

        pid, ref = otp.spawn_monitor(linker)
        with trio.fail_after(3):
            assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.NOPROC)


async def test_after_unlink_a_local_crash_does_not_reach_the_remote_process(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        remote = await otp.call(("echo", B), ("spawn", "its own reason"))
        ref = otp.monitor(remote)

        async def link_unlink_crash() -> None:
            otp.link(remote)
            otp.unlink(remote)
            raise ValueError("local crash")

        _, local_ref = otp.spawn_monitor(link_unlink_crash)
        await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == local_ref)
        otp.send(remote, "go")
        assert await otp.receive(otp.Down) == otp.Down(ref, remote, "its own reason")


async def test_after_unlink_a_remote_death_does_not_reach_the_caller(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.process_flag(trap_exit=True)
        remote = await otp.call(("echo", B), ("spawn", "boom"))
        ref = otp.monitor(remote)
        otp.link(remote)
        otp.unlink(remote)
        otp.send(remote, "go")
        assert await otp.receive(otp.Down) == otp.Down(ref, remote, "boom")
        assert await otp.call(("echo", B), "sync") == "sync"
        assert await otp.receive(otp.Exit, timeout=0, default=None) is None


async def test_messages_from_a_remote_process_arrive_before_its_down(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.process_flag(trap_exit=True)
        worker = await _ask_factory("worker", 500, "done")
        ref = otp.monitor(worker)
        otp.link(worker)
        otp.send(worker, "go")
        got = [await otp.receive() for _ in range(502)]
        assert got[:500] == [("msg", i) for i in range(500)]
        assert set(map(type, got[500:])) == {otp.Down, otp.Exit}
        assert otp.Down(ref, worker, "done") in got[500:]
        assert otp.Exit(worker, "done") in got[500:]


async def test_monitor_node_of_an_unknown_node_delivers_nodedown_at_once(sockets: Any) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed(sockets("a"))
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


async def test_disconnect_fires_links_with_noconnection_on_both_sides(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.process_flag(trap_exit=True)
        remote = await otp.call(("echo", B), ("spawn", "unused"))
        await _ask_factory("watch", remote)
        otp.link(remote)
        ref = otp.monitor(remote)
        name_ref = otp.monitor(("echo", B))
        otp.monitor_node(B)
        # Per-pair order: the LINK and MONITORs are set up on B once this reply is here.
        assert await otp.call(("echo", B), "sync") == "sync"
        otp.disconnect(B)
        with trio.fail_after(3):
            got = [await otp.receive() for _ in range(4)]
        assert otp.Exit(remote, otp.NOCONNECTION) in got
        assert otp.Down(ref, remote, otp.NOCONNECTION) in got
        assert otp.Down(name_ref, ("echo", B), otp.NOCONNECTION) in got
        assert otp.NodeDown(B) in got
        assert otp.nodes() == []
        # On B the link fired noconnection too: the non-trapping process died of it, and a
        # watcher there tells us (B connects back to us on first use).
        with trio.fail_after(3):
            report = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "watched_down")
        assert report == ("watched_down", otp.NOCONNECTION)


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


async def test_send_to_an_unregistered_remote_name_is_dropped_silently(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.send(("nobody", B), "lost")
        otp.cast(("nobody", B), "lost")
        assert await otp.call(("echo", B), "ok") == "ok"
        assert otp.nodes() == [B]


# -- pg -------------------------------------------------------------------------------------------


async def test_pg_counts_repeated_joins_locally_and_on_peers(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_factory), otp.open_node("a@localhost"):
        await _connected(sockets)
        ref, groups = otp.pg.monitor_scope()
        assert groups == {}
        otp.pg.join("g")
        otp.pg.join("g")
        me = otp.self()
        assert otp.pg.get_local_members("g") == [me, me]
        member = await _ask_factory("pg_member", "g", 2)
        with trio.fail_after(3):
            while otp.pg.get_members("g").count(member) < 2:
                await otp.receive(otp.pg.PgJoin)
        assert sorted(otp.pg.get_members("g"), key=str) == sorted([me, me, member, member], key=str)
        assert otp.pg.get_local_members("g") == [me, me]
        assert otp.pg.leave("g") is True
        assert otp.pg.get_members("g").count(me) == 1
        # The remote member exits: both its memberships go, in one PgLeave.
        otp.send(member, "exit")
        with trio.fail_after(3):
            leave = await otp.receive(lambda m: isinstance(m, otp.pg.PgLeave) and member in m.pids)
        assert leave.ref == ref and leave.group == "g" and leave.pids == (member, member)
        assert otp.pg.get_members("g") == [me]
        assert otp.pg.leave("g") is True
        assert otp.pg.leave("g") is False
        assert otp.pg.which_groups() == []


async def test_pg_group_monitor_sees_only_its_group_and_remote_members_go_with_their_node(
    sockets: Any,
) -> None:
    peer = PeerNode(B, sockets("b"), setup=_with_factory)
    async with peer, otp.open_node("a@localhost"):
        await _connected(sockets)
        ref, members = otp.pg.monitor("watched")
        assert members == []
        other = await _ask_factory("pg_member", "other", 1)
        member = await _ask_factory("pg_member", "watched", 1)
        with trio.fail_after(3):
            join = await otp.receive(otp.pg.PgJoin)
        assert join == otp.pg.PgJoin(ref, "watched", (member,))
        assert otp.pg.get_members("other") == [other]
        otp.monitor_node(B)
        peer.stop()
        with trio.fail_after(3):
            leave = await otp.receive(otp.pg.PgLeave)
            await otp.receive(otp.NodeDown)
        assert leave == otp.pg.PgLeave(ref, "watched", (member,))
        # Whether B's members left one by one or went with the connection, none is left.
        assert otp.pg.which_groups() == []
        assert await otp.receive(otp.pg.PgLeave, timeout=0, default=None) is None
        assert otp.pg.demonitor(ref) is True
        assert otp.pg.demonitor(ref) is False


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


async def test_a_pid_of_an_older_incarnation_of_a_remote_node_is_dead(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.process_flag(trap_exit=True)
        live = await otp.call(("echo", B), ("spawn", "unused"))
        stale = otp.Pid._make(B, live.id, live.creation ^ 1)
        ref = otp.monitor(stale)
        assert await otp.receive(otp.Down, timeout=3) == otp.Down(ref, stale, otp.NOPROC)
        otp.link(stale)
        assert await otp.receive(otp.Exit, timeout=3) == otp.Exit(stale, otp.NOPROC)
        with pytest.raises(otp.CallError) as info:
            await otp.call(stale, "x", timeout=3)
        assert info.value.reason == otp.NOPROC
        otp.exit(stale, otp.KILL)  # reaches nobody: the live process is untouched
        live_ref = otp.monitor(live)
        otp.send(live, "go")
        assert await otp.receive(otp.Down, timeout=3) == otp.Down(live_ref, live, "unused")


async def test_dialling_an_address_where_another_node_answers_fails(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _distributed(sockets("a"))
        assert await otp.connect("c@localhost", sockets("b")) is False
        assert otp.nodes() == []
        assert await otp.connect(B, sockets("b"))
        assert otp.nodes() == [B]


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


async def test_stopping_the_node_kills_its_ports_programs() -> None:
    async with otp.open_node():
        port = await otp.open_port(["sleep", "60"], link=False)
        os_pid = await otp.port_os_pid(port)
    assert await _wait_gone(os_pid)


def test_a_connection_ended_by_several_tasks_at_once_is_named_by_the_first_ordinary_cause() -> None:
    from otp._dist_session import _sole

    reset, broken = ConnectionResetError("reset"), trio.BrokenResourceError("pipe")
    assert _sole(ExceptionGroup("x", [ExceptionGroup("y", [reset])])) is reset
    assert _sole(ExceptionGroup("x", [reset, ExceptionGroup("y", [broken])])) is reset
    bug = ExceptionGroup("x", [reset, RuntimeError("a bug")])
    assert _sole(bug) is bug  # a real bug is never hidden behind an ordinary ending


async def test_a_process_spawned_while_the_node_stops_dies_at_once() -> None:
    # A peer may dial in after kill_all ran: its connection process must not keep the
    # stopping node waiting (the node waited on it for ever).
    async with otp.open_node() as node:
        node.closing = True  # (what kill_all sets)
        try:
            pid = otp.spawn(trio.sleep_forever)
        finally:
            node.closing = False
        ref = otp.monitor(pid)
        with trio.fail_after(1):
            assert await otp.receive(otp.Down) == otp.Down(ref, pid, otp.KILLED)
