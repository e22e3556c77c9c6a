"""Message delivery across nodes: sends and name sends, per-pair order in bursts, values too big
or too deep for a batch, every value type, sends queued while a connection is set up. Peer nodes
run in threads (tests/test_otp/peer.py), so everything crosses real sockets and the wire codec."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import COOKIE, PeerNode
from .helpers import (
    A,
    B,
    X,
    _ask_factory,
    _connected,
    _distributed,
    _frame,
    _listening,
    _log,
    _raw_peer,
    _sink_pid,
    _up,
    _with_factory,
    _with_sink,
)


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


async def test_messages_to_an_unreachable_node_are_dropped(sockets: Any) -> None:
    async with otp.open_node("a@localhost"):
        await _distributed("a", sockets("a"))
        assert await otp.connect("ghost@localhost", sockets("ghost")) is False
        otp.send(("echo", "ghost@localhost"), "dropped")
        with pytest.raises(otp.CallError) as info:
            await otp.call(("echo", "ghost@localhost"), "x")
        assert info.value.reason == otp.NOCONNECTION


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


# -- how frames are written and read: direct writes, lazy frames, the socket reader ----------


async def test_send_to_an_unregistered_remote_name_is_dropped_silently(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _connected(sockets)
        otp.send(("nobody", B), "lost")
        otp.cast(("nobody", B), "lost")
        assert await otp.call(("echo", B), "ok") == "ok"
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
    # A peer naming a list (or any non-str) in REG_SEND, MONITOR, MONITOR_SEND or DEMONITOR:
    # dropped, or answered noproc, as for an unregistered name; the connection stays.
    async with otp.open_node(B):
        otp.register("inbox", otp.self())
        await _listening(tmp_path / "b.sock")
        async with _raw_peer(tmp_path / "b.sock") as (stream, frames):
            with trio.fail_after(5):
                assert await frames.receive_frame() is not None
            sender = wire.Pid(X, 1, 1)
            ref, ref2 = wire.Ref(X, 9, 1), wire.Ref(X, 10, 1)
            await stream.send_all(
                _frame(wire.MessageType.REG_SEND, {"from": sender, "to": ["inbox"], "msg": 1})
                + _frame(wire.MessageType.MONITOR, {"from": sender, "to": ["inbox"], "ref": ref})
                + _frame(
                    wire.MessageType.MONITOR_SEND,
                    {"from": sender, "to": ["inbox"], "ref": ref2, "msg": 3},
                )
                + _frame(wire.MessageType.DEMONITOR, {"from": sender, "to": {"x": 1}, "ref": ref})
                + _frame(wire.MessageType.REG_SEND, {"from": sender, "to": "inbox", "msg": 2})
            )
            assert await otp.receive(timeout=5, default=None) == 2
            downs = []
            with trio.fail_after(5):
                async for frame in frames:
                    if frame.type is wire.MessageType.DOWN:
                        downs.append(frame.payload)
                        if len(downs) == 2:
                            break
            assert [down["ref"] for down in downs] == [ref, ref2]
            for down in downs:
                assert down["from"] == ["inbox"]
                assert down["reason"] == wire.ExitReason("noproc")
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


def _nested(depth: int) -> list[Any]:
    """A list whose containers nest ``depth`` deep (``[]`` has depth 1)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def test_name_sends_and_pid_sends_from_one_process_keep_their_order(sockets: Any) -> None:
    # Sends to ("sink", B) and to the sink's pid are signals from one sender to one receiver.
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        expected = []
        for i in range(3000):
            dest: Any = sink if (i // 7) % 2 else ("sink", B)
            otp.send(dest, i)
            expected.append(i)
            if i % 997 == 0:
                await trio.sleep(0)  # let the writer take a partial batch now and then
        assert await _log() == expected


async def test_a_message_too_big_for_a_batch_keeps_its_place_in_a_burst(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        big = b"x" * 300_000
        for i in range(1000):
            otp.send(sink, i)
        otp.send(sink, big)
        otp.send(("sink", B), "by name")
        otp.send(sink, big)
        for i in range(1000, 2000):
            otp.send(sink, i)
        log = await _log()
        assert log == [*range(1000), big, "by name", big, *range(1000, 2000)]


async def test_an_unencodable_message_fails_in_its_sender_and_spares_the_burst(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        huge = 1 << (8 * 2000)  # over max_bigint_bytes
        for i in range(500):
            otp.send(sink, i)
        with pytest.raises(otp.BadArg):
            otp.send(sink, huge)
        with pytest.raises(otp.BadArg):
            otp.send(("sink", B), [1, huge])
        with pytest.raises(otp.BadArg):
            otp.send(sink, object())
        for i in range(500, 1000):
            otp.send(sink, i)
        assert await _log() == list(range(1000))
        assert otp.nodes() == [B]


async def test_a_message_over_max_payload_fails_in_its_sender_mid_burst(sockets: Any) -> None:
    limits = wire.Limits(max_payload=100_000)
    async with (
        PeerNode(B, sockets("b"), setup=_with_sink, limits=limits),
        otp.open_node(A),
    ):
        await _up(sockets, limits=limits)
        sink = await _sink_pid()
        for i in range(100):
            otp.send(sink, i)
        with pytest.raises(otp.BadArg):
            otp.send(sink, b"x" * 200_000)
        otp.send(sink, b"y" * 90_000)  # too big for a batch, fits a frame of its own
        otp.send(sink, "after")
        assert await _log() == [*range(100), b"y" * 90_000, "after"]
        assert otp.nodes() == [B]


def _lone_send_accepts(value: Any) -> bool:
    """Whether a lone SEND frame of ``value`` passes the default limits (what the sender checks
    when it writes a message straight to an idle socket)."""
    try:
        wire.encode_message(
            wire.MessageType.SEND, {"to": wire.Pid(B, 1, 1), "msg": value}, codec=wire.Codec.TLV
        )
    except wire.WireError:
        return False
    return True


@pytest.mark.parametrize("depth", [255, 256])
async def test_a_deep_message_in_a_burst_is_delivered_or_refused_in_its_sender(
    sockets: Any, depth: int
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        deep = _nested(depth)
        sent: list[Any] = []
        for i in range(50):
            otp.send(sink, i)
            sent.append(i)
        try:
            otp.send(sink, deep)
            sent.append(("depth", depth))
        except otp.BadArg:
            assert not _lone_send_accepts(deep), "a value a lone send takes was refused"
        otp.send(sink, "after")
        sent.append("after")
        assert await _log(2.0) == sent
        assert otp.nodes() == [B]


async def test_a_deep_message_sent_alone_is_delivered_or_refused_in_its_sender(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await _up(sockets)
        sink = await _sink_pid()
        await _log()
        ok = _nested(255)
        assert _lone_send_accepts(ok)
        otp.send(sink, ok)  # a lone message after a quiet spell: a plain SEND frame
        await trio.sleep(0.01)
        with pytest.raises(otp.BadArg):
            otp.send(sink, _nested(300))
        assert await _log() == [("depth", 255)]


def _same(a: Any, b: Any) -> bool:
    """Equal, type for type (a tuple is not a list, True is not 1, -0.0 is not 0.0, nan is nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        for key, value in a.items():
            match = [k for k in b if _same(k, key)]
            if len(match) != 1 or not _same(value, b[match[0]]):
                return False
        return True
    return bool(a == b)


def _values(me: otp.Pid, ref: otp.Ref) -> list[Any]:
    return [
        (),
        [],
        (1,),
        [1],
        [(1, 2), [3, (4,)]],
        b"",
        b"\x00\xff" * 10,
        "hé\x00",
        2**63 - 1,
        -(2**63),
        2**63,
        -(2**63) - 1,
        2**64,
        -(2**64) - 1,
        2**1000,
        -(2**1000),
        0.0,
        -0.0,
        1.5,
        1.1,
        5e-324,
        1e308,
        65504.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        True,
        False,
        None,
        wire.Atom("ok"),
        me,
        ref,
        [me, (ref, [me, {"r": ref}])],
        {
            1: "int",
            "s": "str",
            b"b": "bytes",
            (1, "x"): "tuple",
            (): "empty tuple",
            ((1, 2), (3,)): "nested tuple",
            None: "none",
            2.5: "float",
            -0.0: "negative zero",
            2**70: "bigint",
            wire.Atom("a"): "atom",
            me: "pid",
            ref: "ref",
        },
        {"k": {"n": [(), {}]}},
        {True: "true", False: "false", 0.5: "float"},
        otp.Shutdown("restart"),
        otp.ExitStatus(3),
    ]


@pytest.mark.parametrize("codec", [wire.Codec.CBOR, wire.Codec.TLV])
async def test_every_value_type_crosses_unchanged_in_calls_and_bursts(
    sockets: Any, codec: wire.Codec
) -> None:
    async with (
        PeerNode(B, sockets("b"), setup=_with_sink, codecs=(codec,)),
        otp.open_node(A),
    ):
        await _up(sockets, codecs=(codec,))
        me = otp.self()
        values = _values(me, otp.make_ref())
        for value in values:
            with trio.fail_after(4):
                got = await otp.call(("echo", B), [value])
            assert _same(got, [value]), (value, got)
        # A burst: the values travel as batch items through the echo's handle_info.
        for value in values:
            otp.send(("echo", B), (me, value))
        for value in values:
            with trio.fail_after(4):
                _, got = await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "echo")
            assert _same(got, value), (value, got)


async def _dial(report_to: otp.Pid, address: str) -> None:
    otp.send(report_to, "dialling")
    otp.send(report_to, ("dialled", await otp.connect(B, address)))


async def test_sends_queued_while_connecting_arrive_in_order_before_later_ones(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(sockets("a"),)))
        otp.spawn(_dial, otp.self(), sockets("b"))
        with trio.fail_after(4):
            await otp.receive(lambda m: m == "dialling")
        # The dialler is inside connect(): the connection exists and is being set up.
        for i in range(2000):
            otp.send(("sink", B), i)
        with trio.fail_after(4):
            assert await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "dialled") == (
                "dialled",
                True,
            )
        for i in range(2000, 4000):
            otp.send(("sink", B), i)
        assert await _log() == list(range(4000))


async def test_an_unencodable_send_while_connecting_fails_in_its_sender(sockets: Any) -> None:
    async with PeerNode(B, sockets("b"), setup=_with_sink), otp.open_node(A):
        await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(sockets("a"),)))
        otp.spawn(_dial, otp.self(), sockets("b"))
        with trio.fail_after(4):
            await otp.receive(lambda m: m == "dialling")
        otp.send(("sink", B), "before")
        with pytest.raises(otp.BadArg):
            otp.send(("sink", B), 1 << (8 * 2000))
        otp.send(("sink", B), "after")
        with trio.fail_after(4):
            await otp.receive(lambda m: isinstance(m, tuple) and m[0] == "dialled")
        assert await _log() == ["before", "after"]


async def test_frames_read_before_a_disconnect_are_not_acted_on_after_it() -> None:
    # disconnect() declares the connection lost at once; frames its reader already holds
    # (say a "peers" list, which would redial) must not be dispatched after that.
    from otp._dist_session import _read_loop

    dispatched: list[Any] = []

    class Conn:
        state = "up"
        received_since_tick = False

    class Dist:
        def dispatch(self, conn: Any, frame: Any) -> None:
            dispatched.append(frame)
            conn.state = "down"  # (what disconnect() does while the reader runs)

    class Frames:
        def __init__(self) -> None:
            self.batches = [["first", "second", "third"]]

        async def receive_frames(self) -> list[Any]:
            await trio.lowlevel.checkpoint()
            return self.batches.pop() if self.batches else []

    await _read_loop(Dist(), Conn(), Frames())  # type: ignore[arg-type]
    assert dispatched == ["first"]
