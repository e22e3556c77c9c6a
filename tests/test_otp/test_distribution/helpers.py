"""Node names and hand-made peers shared by the distribution tests."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

import otp
import wire
from otp._dist_handshake import FEATURES, digest

from ..peer import COOKIE, raw_peer

B = "b@localhost"
C = "c@localhost"
X = "x@localhost"


async def _listening_at(address: str, **config: Any) -> list[str]:
    config["listen"] = (address,)
    return await otp.start_distribution(otp.DistConfig(cookie=COOKIE, **config))


def _raw_peer(
    path: Path, name: str = X, expected: str = B, features: Sequence[str] = FEATURES
) -> contextlib.AbstractAsyncContextManager[tuple[trio.SocketStream, wire.FrameStream]]:
    return raw_peer(path, COOKIE, name, expected, features)


async def _still_serves(path: Path) -> None:
    """A fresh peer passes the handshake with the node at ``path`` and gets its first frame."""
    async with _raw_peer(path, name="probe@localhost") as (_, frames):
        with trio.fail_after(5):
            assert await frames.receive_frame() is not None


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
    await _listening_at(sockets("a"))
    assert await otp.connect(B, sockets("b"))


A = "a@localhost"


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


async def _listening(path: Path, **config: Any) -> None:
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(f"unix:{path}",), **config))


def _frame(mtype: wire.MessageType, payload: Any) -> bytes:
    return wire.encode_message(mtype, payload, codec=wire.Codec.TLV)


async def _sink() -> None:
    """Registered as "sink" on the peer: logs every message (exit signals and DOWNs as tagged
    tuples) and hands the log over on ("report", pid)."""
    otp.process_flag(trap_exit=True)
    log: list[Any] = []
    while True:
        message = await otp.receive()
        if isinstance(message, tuple) and message and message[0] == "report":
            otp.send(message[1], ("log", log))
            log = []
        elif isinstance(message, tuple) and message and message[0] == "pid":
            otp.send(message[1], ("sink", otp.self()))
        elif isinstance(message, tuple) and message and message[0] == "monitor":
            otp.monitor(message[1])
            otp.send(message[2], "monitoring")
        elif isinstance(message, otp.Exit):
            log.append(("EXIT", message.reason))
        elif isinstance(message, otp.Down):
            log.append(("DOWN", message.reason))
        elif isinstance(message, list) and message and isinstance(message[0], list):
            log.append(("depth", _depth(message)))  # too deep to send back whole
        else:
            log.append(message)


async def _with_sink() -> None:
    otp.register("sink", otp.spawn(_sink))


async def _up(sockets: Any, **config: Any) -> None:
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(sockets("a"),), **config))
    assert await otp.connect(B, sockets("b"))


async def _log(within: float = 4.0) -> list[Any]:
    otp.send(("sink", B), ("report", otp.self()))
    with trio.fail_after(within):
        _, log = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "log")
    assert isinstance(log, list)
    return log


async def _sink_pid() -> otp.Pid:
    otp.send(("sink", B), ("pid", otp.self()))
    with trio.fail_after(4):
        _, pid = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "sink")
    assert isinstance(pid, otp.Pid)
    return pid


def _depth(value: Any) -> int:
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    return depth


async def _distributed(name: str, address: str, **config: Any) -> None:
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(address,), **config))


def _exchange(path: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the node closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received


def _hello(version: int = 2) -> bytes:
    frame = wire.Handshake(
        "x@localhost", (version,), (wire.Codec.TLV,), 0, {"challenge": b"c" * 32}
    )
    return wire.encode_frame(frame.to_frame())


async def _node_is_healthy(peer_address: str, expected_processes: int) -> None:
    async with otp.open_node("probe@localhost"):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
        assert await otp.connect("b@localhost", peer_address)
        # Its main process, net_kernel, the echo server and our connection: nothing left of the
        # bad peers.
        assert await otp.call(("echo", "b@localhost"), "process_count") == expected_processes


@contextlib.asynccontextmanager
async def _b_with_x(tmp_path: Path, **config: Any) -> AsyncIterator[trio.SocketStream]:
    """Node b (this test's node, its main process registered as "inbox") listening at
    ``tmp_path/b.sock``, and a connection to it made by hand as node x."""
    async with otp.open_node("b@localhost"):
        otp.register("inbox", otp.self())
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{tmp_path}/b.sock",), **config)
        )
        async with raw_peer(tmp_path / "b.sock", COOKIE, "x@localhost", "b@localhost") as (
            stream,
            _,
        ):
            yield stream


def _marker() -> dict[str, Any]:
    return {"from": wire.Pid("x@localhost", 1, 1), "to": "inbox", "msg": "done"}
