"""otp.observer: snapshots of processes, ETS tables, ports and connections of a running node."""

from __future__ import annotations

import sys
from pathlib import Path

import trio
import trio.testing

import otp
import wire
from otp import ets
from otp.observer import (
    observe_connections,
    observe_ports,
    observe_process,
    observe_processes,
    observe_tables,
    snapshot,
)

from .peer import COOKIE, PeerNode, raw_peer


async def _idle() -> None:
    await otp.receive(lambda message: message == "stop")


class _Echo(otp.GenServer):
    def init(self) -> otp.Ok:
        return otp.Ok(None)


async def test_a_process_snapshot_shows_links_monitors_mailbox_and_initial_call() -> None:
    async with otp.open_node():
        me = otp.self()
        worker = otp.spawn_link(_idle)
        watcher_ref = otp.monitor(worker)
        otp.register("worker", worker)
        for n in range(3):
            otp.send(worker, ("job", n))
        await trio.testing.wait_all_tasks_blocked()
        found = observe_process(worker)
        assert found is not None
        assert found.pid == worker
        assert found.registered_name == "worker"
        assert found.status == "waiting"
        assert found.message_queue_len == 3
        assert found.links == (me,)
        assert found.monitored_by == (me,)
        assert found.initial_call == f"{__name__}._idle"
        assert found.parent == me
        assert found.trap_exit is False
        # The mailbox's messages are in the estimate: three queued tuples weigh more than none.
        assert found.memory > observe_process(otp.spawn(_idle)).memory  # type: ignore[union-attr]
        mine = observe_process(me)
        assert mine is not None
        assert mine.status == "running"
        assert mine.monitors == (worker,)
        assert mine.initial_call is None  # open_node's body is an adopted task
        otp.demonitor(watcher_ref)


async def test_observe_processes_lists_live_processes_with_behaviour_and_handled() -> None:
    async with otp.open_node():
        server = await _Echo.start()
        otp.send(server, "stray")
        await trio.testing.wait_all_tasks_blocked()
        exited = otp.spawn(_idle)
        otp.exit(exited, "kill")
        await trio.testing.wait_all_tasks_blocked()
        found = {p.pid: p for p in observe_processes()}
        assert set(found) == set(otp.processes())
        assert exited not in found
        assert found[server].behaviour == f"GenServer {__name__}._Echo"
        assert found[server].messages_handled >= 1
        assert found[server].trap_exit is False
        assert observe_process(exited) is None


async def test_tables_show_owner_type_size_and_memory() -> None:
    async with otp.open_node():
        table = ets.new("observed", type="bag")
        ets.insert(table, [(1, "a"), (1, "b"), (2, "c")])
        (info,) = [t for t in observe_tables() if t.id == table]
        assert info.owner == otp.self()
        assert info.type is ets.TableType.BAG
        assert info.size == 3
        assert info.memory > 0
        ets.delete(table)
        assert all(t.id != table for t in observe_tables())


async def test_ports_show_os_pid_and_command_until_closed() -> None:
    async with otp.open_node():
        argv = [sys.executable, "-c", "import sys; sys.stdin.read()"]
        port = await otp.open_port(argv, link=False)
        (found,) = observe_ports()
        assert found.port == port
        assert found.owner == otp.self()
        assert found.command == tuple(argv)
        assert found.os_pid == await otp.port_os_pid(port)
        ref = otp.monitor(port)
        otp.port_close(port)
        assert observe_ports() == []
        await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)


async def test_connections_show_each_connected_node(tmp_path: Path) -> None:
    b_address = f"unix:{tmp_path / 'b'}.sock"
    async with PeerNode("b@localhost", b_address):
        async with otp.open_node("a@localhost"):
            assert observe_connections() == []
            await otp.start_distribution(
                otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path / 'a'}.sock",))
            )
            assert await otp.connect("b@localhost", b_address)
            (conn,) = observe_connections()
            assert conn.node == "b@localhost"
            assert conn.state == "up"
            assert conn.bytes_written > 0
            taken = snapshot()
            assert taken.node == "a@localhost"
            assert [c.node for c in taken.connections] == ["b@localhost"]
            assert {p.pid for p in taken.processes} == set(otp.processes())


async def test_a_connection_counts_the_bytes_it_read_and_wrote(tmp_path: Path) -> None:
    # Counted per read and write on the socket, after the handshake: exactly what crossed.
    async with otp.open_node("a@localhost"):
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path / 'a'}.sock",))
        )
        async with raw_peer(tmp_path / "a.sock", COOKIE, "x@localhost", "a@localhost") as (
            stream,
            _,
        ):
            with trio.fail_after(5):
                # A PING gets its PONG once nothing waits to be written (its peer list, ...).
                while [(c.state, c.bytes_queued) for c in observe_connections()] != [("up", 0)]:
                    await trio.sleep(0.01)
            ping = wire.encode_message(wire.MessageType.PING, None, codec=wire.Codec.TLV)
            await stream.send_all(ping)
            decoder = wire.FrameDecoder()
            read = 0
            with trio.fail_after(5):
                while True:  # what the node wrote since the handshake, its PONG last
                    data = await stream.receive_some(65536)
                    assert data
                    read += len(data)
                    frames = decoder.feed(data)
                    if any(f.type is wire.MessageType.PONG for f in frames):
                        break
            (conn,) = observe_connections()
            assert conn.node == "x@localhost"
            assert (conn.bytes_received, conn.bytes_written) == (len(ping), read)
