"""Backpressure on a connection: the busy and queue limits, senders suspended while a peer
does not read and resumed as it reads, and peers that read nothing or flood."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import COOKIE, PeerNode
from .helpers import _b_with_x, _distributed, _frame, _marker


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


def _rss() -> int:
    """This OS process's resident memory now, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _pings(stream: trio.SocketStream, every: float) -> None:
    """Keep telling the node we are alive, reading nothing of what it sends."""
    ping = _frame(wire.MessageType.PING, None)
    while True:
        await stream.send_all(ping)
        await trio.sleep(every)


async def _send_to_a_peer_that_reads_nothing(
    tmp_path: Path, yield_: Any, **config: Any
) -> tuple[list[int], int, otp.Down]:
    """Send 50,000 x 1 KiB to ("sink", x) from a process that awaits ``yield_()`` every 16
    sends, while x pings and reads nothing; returns the sends done when the connection was
    lost, the RSS growth at its peak, and the Down of a monitor across the connection."""
    n = 50_000
    payload = b"x" * 1024
    sent: list[int] = [0]
    peak = [0]
    async with _b_with_x(tmp_path, liveness_timeout=4, **config) as stream:
        with trio.fail_after(5):
            while "x@localhost" not in otp.nodes():
                await trio.sleep(0.01)
        ref = otp.monitor(("sink", "x@localhost"))
        base = _rss()

        async def sender() -> None:
            for i in range(n):
                otp.send(("sink", "x@localhost"), payload)
                sent[0] += 1
                if i % 16 == 15:
                    await yield_()
                if i % 500 == 0:
                    peak[0] = max(peak[0], _rss() - base)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pings, stream, 0.5)
            otp.spawn(sender)
            with trio.fail_after(60):
                down = await otp.receive(otp.Down)
            sent_then = sent[0]
            nursery.cancel_scope.cancel()
    assert down.ref == ref
    return [sent_then], peak[0], down


async def test_a_sender_to_a_peer_that_reads_nothing_is_suspended_and_the_peer_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # Past busy_limit (1 MiB) the sender is suspended at its next receive, as Erlang's
    # busy_dist_port suspends it; a peer that keeps pinging but reads nothing for the
    # liveness timeout is dropped, with noconnection for what crosses the connection.
    async def receive() -> None:
        await otp.receive(timeout=0, default=None)

    [sent], peak, down = await _send_to_a_peer_that_reads_nothing(tmp_path, receive)
    assert down.reason == otp.NOCONNECTION
    assert sent < 3000  # 1 MiB and what the socket buffers (50,000 if never suspended)
    assert peak < 20 * 1024 * 1024, peak
    assert any("read nothing for 4" in r.getMessage() for r in caplog.records)


async def test_a_sender_that_never_receives_is_bounded_by_queue_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # A sender that only yields to trio (no receive to be suspended in) cannot be held back:
    # past queue_limit the connection counts as lost, rather than the queue growing.
    [sent], peak, down = await _send_to_a_peer_that_reads_nothing(
        tmp_path, trio.lowlevel.checkpoint, queue_limit=4 * 1024 * 1024
    )
    assert down.reason == otp.NOCONNECTION
    assert sent < 6000
    assert peak < 20 * 1024 * 1024, peak
    assert any("queue_limit" in r.getMessage() for r in caplog.records)


async def test_a_peer_that_floods_pings_and_reads_nothing_costs_no_memory(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Each PING was answered by a PONG queued behind the ones the peer never read.
    n = 600_000
    async with _b_with_x(tmp_path) as stream:
        flood = _frame(wire.MessageType.PING, None) * n
        base = _rss()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                stream.send_all, flood + _frame(wire.MessageType.REG_SEND, _marker())
            )
            with trio.fail_after(120):
                assert await otp.receive() == "done"
        grown = _rss() - base
        assert otp.nodes() == ["x@localhost"]
    assert grown < 12 * 1024 * 1024, grown  # 600,000 queued PONGs held 38 MB


async def test_a_peer_that_floods_requests_and_reads_no_answer_is_dropped_at_queue_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    # Each MONITOR of a dead process is answered by a DOWN: the answers of a peer that reads
    # none of them stop at queue_limit, with the connection.
    n = 200_000
    async with _b_with_x(tmp_path, busy_limit=256 * 1024, queue_limit=1024 * 1024) as stream:
        ghost = wire.Pid("b@localhost", 999_999, otp.self().creation)
        flood = b"".join(
            _frame(
                wire.MessageType.MONITOR,
                {"from": wire.Pid("x@localhost", 1, 1), "to": ghost, "ref": wire.Ref("x", i, 1)},
            )
            for i in range(n)
        )
        base = _rss()
        with trio.move_on_after(60):
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(flood)  # until the node drops us
        grown = _rss() - base
        assert otp.nodes() == []
    assert grown < 12 * 1024 * 1024, grown  # 200,000 queued DOWNs held 35 MB, connected
    assert any("queue_limit" in r.getMessage() for r in caplog.records)
