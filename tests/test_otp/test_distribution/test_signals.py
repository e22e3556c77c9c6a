"""Exit signals, links and monitors across nodes, by OTP's rules (noproc, noconnection, kill
reaching a remote link as kill, unlink, name monitors)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp

from ..peer import PeerNode
from .helpers import (
    A,
    B,
    _ask_factory,
    _connected,
    _distributed,
    _listening,
    _log,
    _sink_pid,
    _up,
    _with_factory,
    _with_sink,
)


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


async def test_an_exit_signal_in_a_burst_arrives_after_exactly_the_sends_before_it(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        for i in range(5000):
            otp.send(sink, i)
        otp.exit(sink, "midway")
        for i in range(5000, 10000):
            otp.send(sink, i)
        log = await _log()
        assert log == [*range(5000), ("EXIT", "midway"), *range(5000, 10000)]


async def _linked_burst(sink: otp.Pid, count: int) -> None:
    otp.link(sink)
    for i in range(count):
        otp.send(sink, i)
    otp.exit_self("burst done")


async def test_a_link_exit_after_a_burst_arrives_after_every_message(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        ref = otp.monitor(otp.spawn(_linked_burst, sink, 8000))
        with trio.fail_after(4):
            await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
        assert await _log() == [*range(8000), ("EXIT", "burst done")]


async def _burst_on_go(sink: otp.Pid, count: int) -> None:
    await otp.receive(lambda m: m == "go")
    for i in range(count):
        otp.send(sink, i)
        otp.send(("sink", B), -i)
    otp.exit_self("gone")


async def test_a_remote_down_arrives_after_every_message_of_a_burst(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        worker = otp.spawn(_burst_on_go, sink, 3000)
        otp.send(("sink", B), ("monitor", worker, otp.self()))
        with trio.fail_after(4):
            await otp.receive(lambda m: m == "monitoring")
        await _log()  # empty the sink's log: it holds nothing but what follows
        ref = otp.monitor(worker)
        otp.send(worker, "go")
        with trio.fail_after(4):
            await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
        expected = [x for i in range(3000) for x in (i, -i)]
        assert await _log() == [*expected, ("DOWN", "gone")]


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
