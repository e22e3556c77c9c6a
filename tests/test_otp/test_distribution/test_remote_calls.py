"""gen_server calls across nodes: replies and errors carry the remote reason, large values,
many callers, and calls that cannot cross or time out leave no monitor and no late reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import PeerNode
from .helpers import (
    A,
    B,
    X,
    _ask_factory,
    _connected,
    _distributed,
    _frame,
    _listening,
    _raw_peer,
    _up,
    _with_factory,
    _with_sink,
)


async def test_a_call_whose_request_and_reply_are_large_values(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node(A):
        await _up(sockets)
        blob = bytes(range(256)) * 20_000  # 5 MB
        items = list(range(200_000))
        with trio.fail_after(4):
            assert await otp.call(("echo", B), blob) == blob
            assert await otp.call(("echo", B), ("many", items)) == ("many", items)


async def _caller(report_to: otp.Pid, n: int) -> None:
    reply = await otp.call(("echo", B), ("req", n, [n] * (n % 5)))
    otp.send(report_to, ("replied", n, reply))


async def test_many_processes_calling_one_remote_server_each_get_their_own_reply(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node(A):
        await _up(sockets)
        me = otp.self()
        for n in range(300):
            otp.spawn(_caller, me, n)
        seen: set[int] = set()
        with trio.fail_after(4):
            while len(seen) < 300:
                _, n, reply = await otp.receive(
                    lambda m: isinstance(m, tuple) and m[0] == "replied"
                )
                assert reply == ("req", n, [n] * (n % 5))
                seen.add(n)


async def test_a_call_with_an_unencodable_request_leaves_no_monitor_behind(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        target = await otp.call(("echo", B), ("spawn", "bye"))
        assert isinstance(target, otp.Pid)
        with pytest.raises(otp.BadArg):
            await otp.call(target, object())
        ref = otp.monitor(target)
        otp.send(target, "die")
        with trio.fail_after(4):
            down = await otp.receive(otp.Down)
        # Both DOWNs come from the target, in the order its monitors were set: a stray one
        # from the failed call would be first.
        assert down.ref == ref
        assert await otp.receive(otp.Down, timeout=0, default=None) is None


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
