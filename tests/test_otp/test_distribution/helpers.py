"""Node names and hand-made peers shared by the distribution tests."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import trio
import trio.testing

import otp
import wire
from otp._dist_handshake import digest

from ..peer import COOKIE, raw_peer

B = "b@localhost"
C = "c@localhost"
X = "x@localhost"


async def _listening_at(address: str, **config: Any) -> list[str]:
    config["listen"] = (address,)
    return await otp.start_distribution(otp.DistConfig(cookie=COOKIE, **config))


def _raw_peer(
    path: Path, name: str = X, expected: str = B
) -> contextlib.AbstractAsyncContextManager[tuple[trio.SocketStream, wire.FrameStream]]:
    return raw_peer(path, COOKIE, name, expected)


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
