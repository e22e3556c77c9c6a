"""gen_server calls across nodes: replies and errors carry the remote reason, large values,
many callers, and calls that cannot cross or time out leave no monitor and no late reply."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from otp._dist_handshake import FEATURES

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


def _reply_to(caller: wire.Pid, reply_atom: str, tag: Any, value: Any) -> bytes:
    """A server's reply to a call from ``caller`` (``$gen_reply`` or ``$gen_reply_demonitor``)."""
    return _frame(wire.MessageType.SEND, {"to": caller, "msg": (wire.Atom(reply_atom), tag, value)})


@pytest.mark.parametrize("reply_atom", ["$gen_reply", "$gen_reply_demonitor"])
async def test_a_remote_call_that_times_out_drops_the_late_reply_and_demonitors(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, reply_atom: str
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
            # (The peer listed monitor_send: the MONITOR and the request are one frame.)
            monitor = seen[wire.MessageType.MONITOR_SEND]
            assert monitor["to"] == "srv"
            assert seen[wire.MessageType.DEMONITOR]["ref"] == monitor["ref"]
            _, (caller, tag), _ = monitor["msg"]
            # The reply and a DOWN, late: neither reaches the caller's mailbox.
            await stream.send_all(
                _reply_to(caller, reply_atom, tag, "late")
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


# -- a reply from the monitored server ends the call's monitor on both sides -------------------


class _Deferring(otp.GenServer):
    """Answers "direct" itself; "deferred" is answered by another process (a deferred
    reply, OTP's gen_server:reply from anywhere)."""

    def init(self) -> Any:
        return otp.Ok(None)

    def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request == "deferred":
            otp.spawn(_reply_later, from_)
            return otp.NoReply(state)
        return otp.Reply(("answer", request), state)


async def _reply_later(from_: otp.From) -> None:
    otp.GenServer.reply(from_, ("answer", "deferred"))


def _call_frames(caller: wire.Pid, ref: wire.Ref, request: Any, *, combined: bool) -> bytes:
    """What a node's call of ``srv`` on b writes: one MONITOR_SEND (``combined``), or MONITOR
    then the request (a node of an older release)."""
    message = (wire.Atom("$gen_call"), (caller, ref), request)
    if combined:
        return _frame(
            wire.MessageType.MONITOR_SEND,
            {"from": caller, "to": "srv", "ref": ref, "msg": message},
        )
    return _frame(wire.MessageType.MONITOR, {"from": caller, "to": "srv", "ref": ref}) + _frame(
        wire.MessageType.REG_SEND, {"from": caller, "to": "srv", "msg": message}
    )


async def _next_frame(frames: wire.FrameStream, kind: wire.MessageType) -> wire.Frame:
    """The next frame of type ``kind`` the hand-made peer receives (the others are skipped)."""
    with trio.fail_after(5):
        while True:
            frame = await frames.receive_frame()
            assert frame is not None
            if frame.type is kind:
                return frame


async def _reply_frame(frames: wire.FrameStream) -> Any:
    return (await _next_frame(frames, wire.MessageType.SEND)).payload["msg"]


@contextlib.asynccontextmanager
async def _b_and_raw_x(
    tmp_path: Path, features: Sequence[str] = FEATURES
) -> AsyncIterator[tuple[trio.SocketStream, wire.FrameStream]]:
    """Node b (this test's node, its main process registered as "inbox") and a connection to
    it made by hand as node x (saying it understands ``features``), once b counts it as up."""
    async with otp.open_node(B):
        otp.register("inbox", otp.self())
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock", features=features) as (stream, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None  # b counts us as up
            yield stream, frames


@pytest.mark.parametrize("combined", [True, False])
@pytest.mark.parametrize(
    ("request_", "features", "reply_atom", "monitor_left"),
    [
        ("direct", FEATURES, "$gen_reply_demonitor", False),
        ("deferred", FEATURES, "$gen_reply", True),
        # A caller of an older release (its handshake lists no reply_demonitor) would not
        # know the demonitoring reply: it gets a plain one and demonitors itself.
        ("direct", (), "$gen_reply", True),
        ("direct", ("a_later_feature",), "$gen_reply", True),  # unknown names: ignored
    ],
)
async def test_only_the_servers_own_reply_to_a_remote_call_ends_its_monitor(
    tmp_path: Path,
    request_: str,
    features: tuple[str, ...],
    reply_atom: str,
    monitor_left: bool,
    combined: bool,
) -> None:
    async with _b_and_raw_x(tmp_path, features) as (stream, frames):
        server = await _Deferring.start(name="srv")
        caller, ref = wire.Pid(X, 1, 1), wire.Ref(X, 7, 1)
        await stream.send_all(_call_frames(caller, ref, request_, combined=combined))
        # The server's reply says the monitor is gone, and it is: no DEMONITOR need follow.
        # Another process's (deferred) reply holds no monitor, so it ends none.
        reply = await _reply_frame(frames)
        assert reply == (wire.Atom(reply_atom), ref, ("answer", request_))
        info = otp.process_info(server)
        assert info is not None
        assert info.monitored_by == ((otp.Pid._make(X, 1, 1),) if monitor_left else ())
        # The caller's DEMONITOR (it sends one when the reply did not end the monitor, or
        # when it gave up first, crossing the reply): the monitor is gone either way.
        await stream.send_all(
            _frame(wire.MessageType.DEMONITOR, {"from": caller, "to": "srv", "ref": ref})
            + _frame(wire.MessageType.REG_SEND, {"from": caller, "to": "inbox", "msg": "done"})
        )
        with trio.fail_after(5):
            assert await otp.receive() == "done"
        info = otp.process_info(server)
        assert info is not None and info.monitored_by == ()


@pytest.mark.parametrize("other", ["tag", "pid"])
async def test_a_monitor_send_whose_call_names_another_tag_or_pid_is_answered_as_it_says(
    tmp_path: Path, other: str
) -> None:
    # A MONITOR_SEND whose $gen_call is not the monitoring process's with the monitor's ref:
    # the reply goes to the From it names, and it ends no monitor.
    async with _b_and_raw_x(tmp_path) as (stream, frames):
        server = await _Deferring.start(name="srv")
        caller, ref = wire.Pid(X, 1, 1), wire.Ref(X, 7, 1)
        from_ = (caller, wire.Ref(X, 8, 1)) if other == "tag" else (wire.Pid(X, 2, 1), ref)
        message = (wire.Atom("$gen_call"), from_, "direct")
        await stream.send_all(
            _frame(
                wire.MessageType.MONITOR_SEND,
                {"from": caller, "to": "srv", "ref": ref, "msg": message},
            )
        )
        frame = await _next_frame(frames, wire.MessageType.SEND)
        assert frame.payload["to"] == from_[0]
        assert frame.payload["msg"] == (wire.Atom("$gen_reply"), from_[1], ("answer", "direct"))
        info = otp.process_info(server)
        assert info is not None and info.monitored_by == (otp.Pid._make(X, 1, 1),)


async def test_a_remote_call_whose_request_cannot_be_rebuilt_is_dropped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A registered value this node does not know: the call is dropped (the monitor stays, so
    # the caller hears of the server's end), the connection is not.
    caplog.set_level(logging.WARNING, logger="otp.distribution")
    async with _b_and_raw_x(tmp_path) as (stream, _):
        server = await _Deferring.start(name="srv")
        caller, ref = wire.Pid(X, 1, 1), wire.Ref(X, 7, 1)
        unknown = (wire.Atom("$record"), "tests.NotRegisteredHere", {})
        await stream.send_all(
            _call_frames(caller, ref, unknown, combined=True)
            + _frame(wire.MessageType.REG_SEND, {"from": caller, "to": "inbox", "msg": "done"})
        )
        with trio.fail_after(5):
            assert await otp.receive() == "done"
        info = otp.process_info(server)
        assert info is not None and info.monitored_by == (otp.Pid._make(X, 1, 1),)
        assert info.message_queue_len == 0
        assert otp.nodes() == [X]
    drops = [r.getMessage() for r in caplog.records if "was dropped" in r.getMessage()]
    assert len(drops) == 1 and "tests.NotRegisteredHere" in drops[0]


async def _call_to_srv(frames: wire.FrameStream) -> tuple[Any, Any]:
    """The MONITOR and the request of a call of ``srv`` on the hand-made peer (both in one
    MONITOR_SEND frame, or two frames to a peer that did not list ``monitor_send``)."""
    monitor = None
    with trio.fail_after(5):
        while True:
            frame = await frames.receive_frame()
            assert frame is not None
            if frame.type is wire.MessageType.MONITOR_SEND and frame.payload["to"] == "srv":
                return frame.payload, frame.payload
            if frame.type is wire.MessageType.MONITOR:
                monitor = frame.payload
            elif frame.type is wire.MessageType.REG_SEND and frame.payload["to"] == "srv":
                assert monitor is not None  # the MONITOR goes first
                return monitor, frame.payload


async def _call_and_report(report_to: otp.Pid) -> None:
    try:
        value = await otp.call(("srv", X), "req", timeout=30)
    except otp.CallError as exc:
        value = ("failed", exc.reason)
    otp.send(report_to, ("called", value))
    otp.send(("after", X), "after the call")  # the next frame, which takes a DEMONITOR along


@pytest.mark.parametrize(
    ("reply_atom", "demonitors"), [("$gen_reply_demonitor", False), ("$gen_reply", True)]
)
async def test_a_remote_caller_demonitors_only_when_the_reply_did_not(
    tmp_path: Path, reply_atom: str, demonitors: bool
) -> None:
    async with _b_and_raw_x(tmp_path) as (stream, frames):
        otp.spawn(_call_and_report, otp.self())
        monitor, request = await _call_to_srv(frames)
        _, (caller, tag), _ = request["msg"]
        await stream.send_all(_reply_to(caller, reply_atom, tag, "the reply"))
        with trio.fail_after(5):
            assert await otp.receive() == ("called", "the reply")
            after: list[wire.MessageType] = []
            while True:
                frame = await frames.receive_frame()
                assert frame is not None
                if frame.payload.get("msg") == "after the call":
                    break
                after.append(frame.type)
                if frame.type is wire.MessageType.DEMONITOR:
                    assert frame.payload["ref"] == monitor["ref"]
        assert (wire.MessageType.DEMONITOR in after) is demonitors
        assert otp.process_info(otp.self()) is not None


@pytest.mark.parametrize("reply_atom", ["$gen_reply_demonitor", "$gen_reply"])
async def test_a_reply_after_the_remote_caller_died_is_dropped(
    tmp_path: Path, reply_atom: str
) -> None:
    async with _b_and_raw_x(tmp_path) as (stream, frames):
        caller = otp.spawn(_call_and_report, otp.self())
        ref = otp.monitor(caller)
        _, request = await _call_to_srv(frames)
        _, (wire_caller, tag), _ = request["msg"]
        otp.exit(caller, otp.KILL)
        assert await otp.receive(otp.Down) == otp.Down(ref, caller, otp.KILLED)
        await _next_frame(frames, wire.MessageType.DEMONITOR)  # the dead caller gave up
        await stream.send_all(
            _reply_to(wire_caller, reply_atom, tag, "too late")
            + _frame(
                wire.MessageType.REG_SEND,
                {"from": wire.Pid(X, 1, 1), "to": "inbox", "msg": "marker"},
            )
        )
        with trio.fail_after(5):
            assert await otp.receive() == "marker"
        assert otp.nodes() == [X]


# -- a call's MONITOR and request in one MONITOR_SEND frame ---------------------------------------

_X_SERVER = otp.Pid._make(X, 3, 1)


async def _call_x_and_report(report_to: otp.Pid, server: Any) -> None:
    otp.send(report_to, ("called", await otp.call(server, "req", timeout=30)))


@pytest.mark.parametrize("server", [("srv", X), _X_SERVER], ids=["name", "pid"])
@pytest.mark.parametrize(
    ("features", "combined"),
    [
        (FEATURES, True),
        # A peer of an older release (no monitor_send): the MONITOR, then the request.
        (("reply_demonitor",), False),
        ((), False),
    ],
)
async def test_a_remote_call_is_one_monitor_send_frame_only_to_a_peer_that_takes_it(
    tmp_path: Path, server: Any, features: tuple[str, ...], combined: bool
) -> None:
    to = "srv" if server.__class__ is tuple else wire.Pid(X, 3, 1)
    async with _b_and_raw_x(tmp_path, features) as (stream, frames):
        otp.spawn(_call_x_and_report, otp.self(), server)
        calls: list[tuple[wire.MessageType, Any]] = []
        with trio.fail_after(5):
            while not calls or calls[-1][0] is wire.MessageType.MONITOR:
                frame = await frames.receive_frame()
                assert frame is not None
                if frame.payload is not None and frame.payload.get("to") == to:
                    calls.append((frame.type, frame.payload))
        caller = calls[0][1]["from"]
        ref = calls[0][1]["ref"]
        request = (wire.Atom("$gen_call"), (caller, ref), "req")
        if combined:
            assert calls == [
                (
                    wire.MessageType.MONITOR_SEND,
                    {"from": caller, "to": to, "ref": ref, "msg": request},
                )
            ]
        else:
            send = wire.MessageType.REG_SEND if to == "srv" else wire.MessageType.SEND
            assert [t for t, _ in calls] == [wire.MessageType.MONITOR, send]
            assert calls[0][1] == {"from": caller, "to": to, "ref": ref}
            assert calls[1][1]["msg"] == request
        await stream.send_all(_reply_to(caller, "$gen_reply", ref, "the reply"))
        with trio.fail_after(5):
            assert await otp.receive() == ("called", "the reply")


def _monitor_send(to: Any, ref: wire.Ref, message: Any) -> bytes:
    """A MONITOR_SEND from x's process 1."""
    return _frame(
        wire.MessageType.MONITOR_SEND,
        {"from": wire.Pid(X, 1, 1), "to": to, "ref": ref, "msg": message},
    )


async def _down(frames: wire.FrameStream) -> Any:
    """The payload of the next DOWN the hand-made peer reads."""
    with trio.fail_after(5):
        async for frame in frames:
            if frame.type is wire.MessageType.DOWN:
                return frame.payload
    raise AssertionError("the connection closed before a DOWN came")


async def _exit_on_message(reason: Any) -> None:
    await otp.receive()
    otp.exit_self(reason)


@pytest.mark.parametrize("by", ["name", "pid"])
async def test_a_monitor_send_monitors_before_it_delivers(tmp_path: Path, by: str) -> None:
    # The process exits on the message the frame brings: the monitor was in place by then, so
    # the DOWN carries its exit reason (not noproc), as a MONITOR then a SEND would.
    async with _b_and_raw_x(tmp_path) as (stream, frames):
        target = otp.spawn(_exit_on_message, ("bye", 1))
        otp.register("short", target)
        to = "short" if by == "name" else wire.Pid(B, target.id, target.creation)
        ref = wire.Ref(X, 8, 1)
        await stream.send_all(_monitor_send(to, ref, "go"))
        down = await _down(frames)
        assert down["ref"] == ref and down["to"] == wire.Pid(X, 1, 1)
        assert down["reason"] == wire.ExitReason("term", ("bye", 1))
        assert otp.nodes() == [X]


@pytest.mark.parametrize("by", ["name", "pid"])
async def test_a_monitor_send_to_no_process_is_answered_noproc_and_delivers_nothing(
    tmp_path: Path, by: str
) -> None:
    async with _b_and_raw_x(tmp_path) as (stream, frames):
        gone = otp.spawn(_exit_on_message, otp.NORMAL)
        ref = otp.monitor(gone)
        otp.send(gone, "go")
        assert await otp.receive(otp.Down) == otp.Down(ref, gone, otp.NORMAL)
        to = "nobody" if by == "name" else wire.Pid(B, gone.id, gone.creation)
        wref = wire.Ref(X, 9, 1)
        await stream.send_all(
            _monitor_send(to, wref, "lost")
            + _frame(
                wire.MessageType.REG_SEND,
                {"from": wire.Pid(X, 1, 1), "to": "inbox", "msg": "after"},
            )
        )
        down = await _down(frames)
        assert down["ref"] == wref
        assert down["from"] == (wire.Atom("nobody") if by == "name" else to)
        assert down["reason"] == wire.ExitReason("noproc")
        assert await otp.receive(timeout=5, default=None) == "after"
        assert otp.nodes() == [X]


# -- the caller reads its connection's socket while it waits for the reply ---------------------


def _leader(peer: str) -> Any:
    """The waiter of the call whose caller reads the socket of the connection to ``peer``."""
    dist = otp.current_node().distribution
    assert dist is not None
    return dist.connections[peer].socket_reader.leader


async def _request_to_srv(frames: wire.FrameStream) -> tuple[wire.Pid, wire.Ref]:
    """The caller and tag of the call of ``srv`` that the hand-made peer receives, once its
    caller reads the socket itself."""
    _, request = await _call_to_srv(frames)
    _, (caller, tag), _ = request["msg"]
    assert _leader(X) is not None
    return caller, tag


async def test_a_caller_reading_its_reply_delivers_what_came_with_it_in_order(
    tmp_path: Path,
) -> None:
    async with _b_and_raw_x(tmp_path) as (stream, frames), trio.open_nursery() as nursery:

        async def x_answers() -> None:
            caller, tag = await _request_to_srv(frames)
            await stream.send_all(
                _frame(wire.MessageType.SEND, {"to": caller, "msg": "before"})
                + _reply_to(caller, "$gen_reply_demonitor", tag, "answer")
                + _frame(
                    wire.MessageType.REG_SEND,
                    {"from": wire.Pid(X, 1, 1), "to": "inbox", "msg": "after"},
                )
            )

        nursery.start_soon(x_answers)
        with trio.fail_after(5):
            assert await otp.call(("srv", X), "q", timeout=30) == "answer"
            assert await otp.receive() == "before"
            assert await otp.receive() == "after"
        assert _leader(X) is None


async def _reply_for_x() -> None:
    caller, tag = await otp.receive()
    otp.GenServer.reply(otp.From(caller, tag), "from b")


async def test_a_caller_reading_the_socket_is_woken_by_a_reply_from_its_own_node(
    tmp_path: Path,
) -> None:
    # The server hands the call to a process on the caller's node (a deferred reply): the
    # reply reaches the caller through its alias, not the socket it waits on.
    async with _b_and_raw_x(tmp_path) as (stream, frames), trio.open_nursery() as nursery:
        otp.register("replier", otp.spawn(_reply_for_x))

        async def x_defers() -> None:
            caller, tag = await _request_to_srv(frames)
            await stream.send_all(
                _frame(
                    wire.MessageType.REG_SEND,
                    {"from": wire.Pid(X, 1, 1), "to": "replier", "msg": (caller, tag)},
                )
            )

        nursery.start_soon(x_defers)
        with trio.fail_after(5):
            assert await otp.call(("srv", X), "q", timeout=30) == "from b"


async def test_a_caller_cancelled_while_it_reads_the_socket_leaves_the_rest_to_the_reader(
    tmp_path: Path,
) -> None:
    async with _b_and_raw_x(tmp_path) as (stream, frames):
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:

            async def x_answers_then_waits() -> None:
                caller, tag = await _request_to_srv(frames)
                await stream.send_all(_reply_to(caller, "$gen_reply_demonitor", tag, "first"))
                # The second call's caller reads the socket; the reader waits for it to stop.
                caller, tag = await _request_to_srv(frames)
                scope.cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert _leader(X) is None
                await stream.send_all(
                    _reply_to(caller, "$gen_reply", tag, "late")
                    + _frame(wire.MessageType.SEND, {"to": caller, "msg": "after the call"})
                )

            nursery.start_soon(x_answers_then_waits)
            assert await otp.call(("srv", X), "q", timeout=30) == "first"
            with scope:
                await otp.call(("srv", X), "q", timeout=30)
        assert scope.cancelled_caught
        with trio.fail_after(5):
            assert await otp.receive() == "after the call"  # (the late reply: dropped)


@pytest.mark.parametrize(
    ("ending", "kind"),
    [
        ("close", None),  # (a clean end, as when the reader reads it: no failure)
        ("garbage", "malformed"),
        ("bad payload", "malformed"),
    ],
)
async def test_a_connection_that_ends_while_its_caller_reads_it_ends_as_the_reader_would_end_it(
    tmp_path: Path, ending: str, kind: str | None
) -> None:
    async with _b_and_raw_x(tmp_path) as (stream, frames), trio.open_nursery() as nursery:
        dist = otp.current_node().distribution
        assert dist is not None
        conn = dist.connections[X]

        async def x_ends() -> None:
            await _request_to_srv(frames)
            if ending == "close":
                await stream.aclose()
            elif ending == "garbage":
                await stream.send_all(b"\x00garbage that is not a frame at all")
            else:
                await stream.send_all(_frame(wire.MessageType.SEND, {"msg": "no to"}))

        nursery.start_soon(x_ends)
        with trio.fail_after(5), pytest.raises(otp.CallError) as info:
            await otp.call(("srv", X), "q", timeout=30)
        assert info.value.reason == otp.NOCONNECTION
        assert (conn.failure and conn.failure.kind) == kind
        assert otp.nodes() == []
