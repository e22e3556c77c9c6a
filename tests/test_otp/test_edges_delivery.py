"""Edges of message delivery across nodes against OTP 25 semantics: per-pair ordering of sends,
name sends and exit/link/monitor signals inside and across batch frames, values too big or too
deep for a batch, the CBOR codec, sends queued while a connection is set up, and gen_server calls
across nodes. Peer nodes run in threads and talk over real sockets."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import trio

import otp
import wire

from .peer import COOKIE, PeerNode

A = "a@localhost"
B = "b@localhost"


@pytest.fixture
def sockets(tmp_path: Path) -> Any:
    return lambda name: f"unix:{tmp_path / name}.sock"


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


def _nested(depth: int) -> list[Any]:
    """A list whose containers nest ``depth`` deep (``[]`` has depth 1)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


# -- per-pair ordering inside and across batches --------------------------------------------------


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


# -- values that cannot be sent ---------------------------------------------------------------


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


# -- the CBOR codec ---------------------------------------------------------------------------


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


# -- sends while the connection is set up -----------------------------------------------------


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


# -- gen_server calls across nodes ------------------------------------------------------------


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
