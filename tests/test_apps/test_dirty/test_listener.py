"""The listener: a GenServer owning the socket (private mode, ``GUNICORN_DIRTY_SOCKET``), with a
linked acceptor starting connection processes under ``dirty_connections``."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

import otp
import supervisors
from apps import dirty
from apps.dirty._listener import CONNECTIONS, LISTENER, Listener

from .conftest import ECHO


def _child(children: list[Any], child_id: str) -> Any:
    [pid] = [pid for cid, pid, _, _ in children if cid == child_id]
    return pid


async def _connection_pids() -> list[otp.Pid]:
    return [pid for _, pid, _, _ in await supervisors.which_children(CONNECTIONS)]


async def _await_down(pids: list[otp.Pid]) -> None:
    refs = {otp.monitor(pid) for pid in pids}
    while refs:
        msg = await otp.receive(lambda m: type(m) is otp.Down and m.ref in refs, timeout=20)
        refs.discard(msg.ref)


async def test_the_listener_is_a_supervised_gen_server_owning_a_private_socket(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    children = await supervisors.which_children("dirty_sup")
    assert [c[0] for c in children] == ["listener", "router", "pool", "connections", "stash"]
    assert _child(children, "listener") == otp.whereis(LISTENER)
    assert await Listener.address() == socket_path
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    assert os.environ["GUNICORN_DIRTY_SOCKET"] == socket_path
    assert await Listener.connections() == 0
    assert await otp.call(LISTENER, "nonsense") == ("error", ("unknown_request", "nonsense"))


async def test_the_listener_counts_the_connections_it_serves(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    clients = [dirty.DirtyClient(socket_path) for _ in range(3)]
    assert await clients[0].execute_async(ECHO, "echo", 0) == 0
    [first] = await _connection_pids()
    for i, client in enumerate(clients[1:], 1):
        assert await client.execute_async(ECHO, "echo", i) == i
    stats = await Listener.statistics()
    assert stats["connections"] == 3 and stats["accepted"] == 3
    assert stats["address"] == socket_path
    await clients[0].close_async()
    await _await_down([first])
    assert await Listener.connections() == 2  # its Down reached the listener before this call
    for client in clients[1:]:
        await client.close_async()


async def test_a_crashed_acceptor_restarts_the_listener_and_open_connections_carry_on(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool()
    before = dirty.DirtyClient(socket_path)
    assert await before.execute_async(ECHO, "echo", "before") == "before"
    old = otp.whereis(LISTENER)
    assert old is not None
    acceptor = (await Listener.statistics())["acceptor"]
    otp.exit(acceptor, "crash")  # as if accept() had raised
    await _await_down([old])
    # dirty_sup handled the listener's exit (a restart) before it answers this.
    new = _child(await supervisors.which_children("dirty_sup"), "listener")
    assert new not in (old, None) and otp.whereis(LISTENER) == new
    stats = await Listener.statistics()
    assert stats["connections"] == 1 and stats["accepted"] == 0  # counted from its last life
    assert stats["acceptor"] != acceptor
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
    assert await before.execute_async(ECHO, "echo", "still") == "still"
    after = dirty.DirtyClient(socket_path)
    assert await after.execute_async(ECHO, "echo", "after") == "after"
    assert await Listener.connections() == 2
    await before.close_async()
    await after.close_async()


async def test_a_socket_that_cannot_be_bound_fails_the_pool_start(
    start_pool: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dirty.sock").mkdir()  # the socket path is taken by a directory
    with pytest.raises(supervisors.ApplicationError, match="dirty_socket"):
        await start_pool()
    assert otp.whereis(LISTENER) is None


async def test_a_path_that_is_not_a_socket_is_refused_and_left_alone(
    start_pool: Any, socket_path: str
) -> None:
    Path(socket_path).write_text("precious")
    with pytest.raises(supervisors.ApplicationError, match="not a socket"):
        await start_pool()
    assert Path(socket_path).read_text() == "precious"


async def test_a_live_listeners_socket_is_refused_and_a_dead_ones_is_taken(
    start_pool: Any, socket_path: str
) -> None:
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(socket_path)
    live.listen(1)
    try:
        with pytest.raises(supervisors.ApplicationError, match="a live process listens there"):
            await start_pool()
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(socket_path)  # still the first listener's
        probe.close()
    finally:
        live.close()  # now a dead listener's leftover file
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    await start_pool()
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(ECHO, "echo", "taken") == "taken"
    await client.close_async()


def _listening_sockets(path: str) -> int:
    """How many of this process's sockets listen on ``path`` (from /proc/net/unix)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            # Flags 00010000 is __SO_ACCEPTCON: a listening socket.
            if len(fields) >= 8 and fields[6] in inodes and fields[7] == path:
                count += int(fields[3], 16) & 0x10000 != 0
    return count


async def test_killing_the_listener_leaves_no_acceptor_or_listening_socket_behind(
    start_pool: Any, socket_path: str
) -> None:
    # The acceptor is the listener's (linked, not trapping exits): the listener's death, even
    # by kill (no terminate), takes the acceptor and the listening socket with it.
    await start_pool()
    old = otp.whereis(LISTENER)
    assert old is not None
    acceptor = (await Listener.statistics())["acceptor"]
    assert _listening_sockets(socket_path) == 1
    otp.exit(old, otp.KILL)
    await _await_down([old, acceptor])
    new = _child(await supervisors.which_children("dirty_sup"), "listener")
    assert new not in (old, None)
    assert acceptor not in otp.processes()
    assert _listening_sockets(socket_path) == 1  # the new listener's only
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(ECHO, "echo", "after") == "after"
    await client.close_async()
