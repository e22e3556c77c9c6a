"""The server's connection processes on real sockets: HELLO and tokens per role, bad input,
keepalive and silence, slow readers, streams (register, reject, close) and calls."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trustme

import otp
import supervisors
import wire
from apps.matching import _engine_handoff as handoff
from apps.matching import _matcher
from apps.matching._config import MatchingConfig
from apps.matching._connection import DRAIN_GRACE, ServerContext
from apps.matching._dispatch import Completed, Dispatch, Lost, MatchingLimits, Routed, Task
from apps.matching._listener import CONNECTIONS, Listener, start_listener
from apps.matching._server_frames import encode_reply, encode_task, task_message
from apps.matching._write_batches import batched_writes

from ._peers import MemoryBlobs, Peer

FLOWS = {"greeting": {"steps": ["write"], "rpcs": ["read"]}}


async def _dynamic(name: str) -> otp.Pid:
    return await supervisors.DynamicSupervisor.start_link(name=name, intensity=100, period=5)


async def _tree(ctx: ServerContext) -> otp.Pid:
    """The network half of ``matching_sup``: queues, matcher, connections, listener."""
    flags = supervisors.SupFlags(strategy="rest_for_one", intensity=3, period=5)
    children = [
        supervisors.ChildSpec("queues", (_dynamic, _matcher.QUEUES), type="supervisor"),
        supervisors.ChildSpec("matcher", (_matcher.start_matcher, ctx.config.limits)),
        supervisors.ChildSpec("connections", (_dynamic, CONNECTIONS), type="supervisor"),
        supervisors.ChildSpec("listener", (start_listener, ctx), shutdown=2.0),
    ]
    return await supervisors.Supervisor.start_link(flags, children, name="test_matching_sup")


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "m.sock")


@pytest.fixture
async def serve(sock: str) -> AsyncIterator[Callable[..., Any]]:
    """``await serve(**MatchingConfig fields)`` runs the server's network half in this node."""
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        sups: list[otp.Pid] = []

        async def start(**kw: Any) -> MatchingConfig:
            kw.setdefault("listen", [f"unix:{sock}"])
            kw.setdefault("store", ":memory:")
            config = MatchingConfig(**kw)
            sups.append(await _tree(ServerContext(config, MemoryBlobs())))
            return config

        yield start
        for pid in sups:
            with contextlib.suppress(otp.OtpError):
                await otp.GenServer.stop(pid, otp.SHUTDOWN)


def _limits(**kw: Any) -> MatchingLimits:
    return MatchingLimits(**kw)


# ============================================================================ HELLO and tokens


async def test_a_client_hello_is_welcomed_with_the_chosen_codec_and_the_timers(
    serve: Any, sock: str
) -> None:
    await serve(limits=_limits(ping_interval=7.0, peer_timeout=21.0))
    peer = await Peer.unix(sock)
    welcome = await peer.hello("client", codecs=("cbor", "tlv"))
    assert welcome == wire.MatchWelcome("otp-matching", wire.Codec.CBOR, 7.0, 21.0)
    assert (await peer.call(1, "put_blob", data=b"abc")).value == "k0"
    await peer.aclose()


async def test_the_codec_is_the_first_the_peer_offers(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    assert (await peer.hello(codecs=("tlv", "cbor"))).codec is wire.Codec.TLV
    await peer.aclose()


@pytest.mark.parametrize("role", ["worker", "client"])
async def test_the_right_token_for_the_role_is_accepted(serve: Any, sock: str, role: str) -> None:
    await serve(worker_tokens=["wt"], client_tokens=["ct"])
    peer = await Peer.unix(sock)
    token = "wt" if role == "worker" else "ct"
    assert type(await peer.hello(role, token=token, flows=None)) is wire.MatchWelcome
    await peer.aclose()


@pytest.mark.parametrize(
    ("role", "token", "said"),
    [
        ("worker", "ct", "wrong"),  # the other role's token
        ("worker", "", "missing"),
        ("client", "nope", "wrong"),
        ("client", "", "missing"),
    ],
)
async def test_a_wrong_or_missing_token_is_refused_and_logged(
    serve: Any, sock: str, caplog: pytest.LogCaptureFixture, role: str, token: str, said: str
) -> None:
    await serve(worker_tokens=["wt"], client_tokens=["ct"])
    peer = await Peer.unix(sock)
    with caplog.at_level(logging.WARNING, logger="apps.matching"):
        answer = await peer.hello(role, token=token)
        assert type(answer) is wire.MatchError
        assert answer.code == "unauthenticated" and answer.rid == 0
        assert f"token is {said}" in answer.message
        assert await peer.closed()
    [record] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert f"refused a {role} connection" in record.getMessage()
    assert f"{said} token" in record.getMessage()


async def test_without_tokens_a_unix_socket_needs_none(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    assert type(await peer.hello("worker", token="anything")) is wire.MatchWelcome
    await peer.aclose()


# ============================================================================ bad input


async def test_a_frame_before_hello_gets_an_error_and_hello_still_works(
    serve: Any, sock: str
) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.send(wire.MatchCall("put_blob", {"data": b"x"}, rid=3))
    error = await peer.receive()
    assert type(error) is wire.MatchError and error.code == "bad_frame"
    assert "the first frame must be M_HELLO (got M_CALL)" in error.message
    assert type(await peer.hello()) is wire.MatchWelcome
    await peer.aclose()


async def test_garbage_gets_a_bad_frame_error_and_the_server_serves_others(
    serve: Any, sock: str
) -> None:
    await serve()
    bad, good = await Peer.unix(sock), await Peer.unix(sock)
    await bad.hello()
    await bad.send_bytes(b"XX" + bytes(30))
    error = await bad.receive_not_ping()
    assert type(error) is wire.MatchError and error.code == "bad_frame" and error.rid == 0
    assert "magic" in error.message.lower() or "GD" in error.message
    assert await bad.closed()
    await good.hello()
    assert (await good.call(1, "put_blob", data=b"still")).value == "k0"
    await good.aclose()


async def test_garbage_before_hello_gets_an_error_and_closes(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.send_bytes(b"not a frame at all")
    error = await peer.receive()
    assert type(error) is wire.MatchError and error.code == "bad_frame"
    assert await peer.closed()


async def test_an_oversized_payload_is_refused_by_its_header(serve: Any, sock: str) -> None:
    await serve(max_payload=1024)
    peer = await Peer.unix(sock)
    await peer.hello(codecs=("tlv",))
    await peer.send_bytes(b"GD\x02\x50" + (4096).to_bytes(4, "big") + (1).to_bytes(8, "big"))
    error = await peer.receive_not_ping()
    assert error.code == "bad_frame" and "max_payload=1024" in error.message
    assert await peer.closed()


async def test_an_oversized_hello_is_refused(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.send_bytes(b"GD\x02\x40" + (1 << 20).to_bytes(4, "big") + bytes(8))
    error = await peer.receive()
    assert error.code == "bad_frame" and "max_payload" in error.message
    assert await peer.closed()


async def test_a_malformed_message_gets_an_error_for_its_call_and_the_connection_goes_on(
    serve: Any, sock: str
) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello(codecs=("tlv",))
    frame = wire.Frame(wire.MessageType.M_CALL, 9, {"op": 5, "args": {}}, version=2)
    await peer.frames.send_frame(frame)
    error = await peer.receive_not_ping()
    assert error.rid == 9 and error.code == "bad_frame" and "M_CALL" in error.message
    assert (await peer.call(10, "put_blob", data=b"x")).rid == 10
    await peer.aclose()


async def test_a_message_the_role_may_not_send_gets_an_error(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("client")
    await peer.send(wire.MatchRegister("flow", "greeting", rid=1))
    error = await peer.receive_not_ping()
    assert error.code == "bad_frame" and "a client may not send M_REGISTER" in error.message
    await peer.aclose()


async def test_a_worker_frame_for_an_unknown_stream_gets_an_error(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("worker", flows=FLOWS)
    await peer.send(wire.MatchAccept(7, rid=42))
    error = await peer.receive_not_ping()
    assert error.rid == 42 and error.code == "bad_frame" and "unknown stream id 42" in error.message
    await peer.aclose()


class _HeldEngine(otp.GenServer):
    """Stands in for ``matching_engine``: holds every request until told to answer them all,
    then answers in reverse order (ok for results, an error for the rest)."""

    async def init(self) -> otp.Ok:
        return otp.Ok([])

    def handle_call(self, request: Any, from_: otp.From, state: list[Any]) -> Any:
        if request == "release_none":
            return otp.Reply(list(state), state)
        if request == "release":
            for held_from, held in reversed(state):
                if held[0] == "result":
                    otp.reply(held_from, ("ok", held[1]))
                else:
                    otp.reply(held_from, ("error", "flow_not_found", "no such flow", False, {}))
            return otp.Reply(len(state), [])
        state.append((from_, request))
        return otp.NoReply(state)


async def _held_engine_and_client(serve: Any, sock: str, *, link: bool) -> tuple[Any, Peer]:
    """The server's network half with a ``_HeldEngine`` as its engine, and a client on it."""
    await serve()
    start = _HeldEngine.start_link if link else _HeldEngine.start
    engine = await start(name="matching_engine")
    peer = await Peer.unix(sock)
    await peer.hello("client")
    return engine, peer


async def test_engine_calls_in_flight_are_answered_by_call_id_whatever_the_order(
    serve: Any, sock: str
) -> None:
    engine, peer = await _held_engine_and_client(serve, sock, link=True)
    for rid in range(1, 201):
        await peer.send(wire.MatchCall("result", {"flow_id": f"f{rid}"}, rid=rid))
    await peer.send(wire.MatchCall("describe", {"flow_id": "gone"}, rid=500))
    released = 0
    while released < 201:  # (as the connection passes the calls on)
        released += await otp.call(engine, "release")
    answers = {}
    while len(answers) < 201:
        msg = await peer.receive_not_ping()
        answers[msg.rid] = msg
    assert all(answers[rid] == wire.MatchReply(f"f{rid}", rid=rid) for rid in range(1, 201))
    assert answers[500].code == "flow_not_found" and answers[500].message == "no such flow"
    await peer.aclose()


class _TakingEngine(_HeldEngine):
    """A ``_HeldEngine`` registered with ``_engine_handoff``: it takes the RPC calls of flow
    ``"taken"`` handed over (noting each with the process it was handed over in), and no
    outcome."""

    async def init(self, taken: list[tuple[otp.From, Any, otp.Pid]]) -> otp.Ok:  # type: ignore[override]
        def take(from_: otp.From, request: Any) -> bool:
            if request[1] != "taken":
                return False
            taken.append((from_, request, otp.self()))
            return True

        handoff.register(otp.self(), handoff.Takers(lambda outcome: False, take))
        return otp.Ok([])


async def test_an_rpc_call_the_engine_takes_runs_in_the_readers_task_and_is_answered(
    serve: Any, sock: str
) -> None:
    """An M_CALL ``call_rpc`` is handed to a registered engine (``otp.send_request``'s
    ``hand_over``), in the connection's own task: one it takes is not sent (its answer,
    given later, is the call's M_REPLY); one it refuses is sent as before."""
    await serve()
    taken: list[tuple[otp.From, Any, otp.Pid]] = []
    engine = await _TakingEngine.start_link(taken, name="matching_engine")
    peer = await Peer.unix(sock)
    await peer.hello("client")
    await peer.send(
        wire.MatchCall("call_rpc", {"flow_id": "taken", "name": "r", "args": []}, rid=1)
    )
    await peer.send(wire.MatchCall("call_rpc", {"flow_id": "sent", "name": "r", "args": []}, rid=2))
    while not (held := await otp.call(engine, "release_none")):
        pass  # (until the refused one is held)
    assert [request for _, request in held] == [("call_rpc", "sent", "r", [], None)]
    [(from_, request, handed_in)] = taken
    assert request == ("call_rpc", "taken", "r", [], None)
    assert handed_in == from_.pid != engine  # (the connection's own process)
    otp.reply(from_, ("ok", "from the reader's task"))
    assert await peer.receive_not_ping() == wire.MatchReply("from the reader's task", rid=1)
    await otp.call(engine, "release")
    answer = await peer.receive_not_ping()
    assert answer.rid == 2 and answer.code == "flow_not_found"
    await peer.aclose()


class _AnsweringEngine(_HeldEngine):
    """A ``_HeldEngine`` registered with ``_engine_handoff`` that answers what it takes in
    the handing task, before ``hand_over`` returns: a ``result`` of flow ``"done"`` with
    ``"value"``; a ``result`` of flow ``"bug"`` ends it as a bug in its handling there does
    (``("engine_failed", ...)``)."""

    async def init(self) -> otp.Ok:  # type: ignore[override]
        me = otp.self()

        def take(from_: otp.From, request: Any) -> bool:
            if request[:2] == ("result", "done"):
                otp.reply(from_, ("ok", "value"))
            elif request[:2] == ("result", "bug"):
                otp.exit(me, ("engine_failed", "RuntimeError('a bug')"))
            else:
                return False
            return True

        handoff.register(me, handoff.Takers(lambda outcome: False, take))
        return otp.Ok([])


async def test_a_result_answered_inside_hand_over_is_answered_once(serve: Any, sock: str) -> None:
    """The engine may answer a ``result`` handed over before ``send_request`` returns (its
    flow ended, or its commit ran there): it is the call's M_REPLY, once, and the call id is
    free again at once; one it refuses is sent as before."""
    await serve()
    engine = await _AnsweringEngine.start_link(name="matching_engine")
    peer = await Peer.unix(sock)
    await peer.hello("client")
    for _ in range(2):  # (the same call id again: nothing of the first is left)
        await peer.send(wire.MatchCall("result", {"flow_id": "done"}, rid=1))
        assert await peer.receive_not_ping() == wire.MatchReply("value", rid=1)
    await peer.send(wire.MatchCall("result", {"flow_id": "sent"}, rid=3))
    while not await otp.call(engine, "release_none"):
        pass  # (until the refused one is held)
    await otp.call(engine, "release")
    assert await peer.receive_not_ping() == wire.MatchReply("sent", rid=3)
    await peer.aclose()


async def test_an_engine_failing_on_a_call_handed_over_answers_it_internal_and_the_reader_lives(
    serve: Any, sock: str
) -> None:
    """A bug in the engine's handling of a call handed over ends the engine, not the
    connection whose reader ran it: the call is answered with a retryable ``internal`` error
    naming the engine's exit reason, as a call by message is when the engine dies."""
    await serve()
    engine = await _AnsweringEngine.start(name="matching_engine")
    ref = otp.monitor(engine)
    peer = await Peer.unix(sock)
    await peer.hello("client")
    answer = await peer.call(1, "result", flow_id="bug")
    assert answer.rid == 1 and answer.code == "internal" and answer.retryable
    assert "engine_failed" in answer.message
    await otp.receive(lambda m: isinstance(m, otp.Down) and m.ref == ref)
    assert (await peer.call(2, "result", flow_id="done")).code == "internal"  # (no engine)
    await peer.aclose()


async def test_engine_calls_in_flight_when_the_engine_dies_are_answered_internal_at_once(
    serve: Any, sock: str
) -> None:
    engine, peer = await _held_engine_and_client(serve, sock, link=False)
    await peer.send(wire.MatchCall("result", {"flow_id": "f1"}, rid=1))
    await peer.send(wire.MatchCall("describe", {"flow_id": "f2"}, rid=2))
    while len(await otp.call(engine, "release_none")) < 2:
        pass  # (until both requests are held)
    otp.exit(engine, otp.KILL)
    answers = [await peer.receive_not_ping(), await peer.receive_not_ping()]
    assert sorted(a.rid for a in answers) == [1, 2]
    for answer in answers:
        assert answer.code == "internal" and answer.retryable and "killed" in answer.message
    assert (await peer.call(3, "result", flow_id="f1")).code == "internal"  # (no engine now)
    await peer.aclose()


async def test_an_engine_call_with_no_engine_running_is_a_retryable_internal_error(
    serve: Any, sock: str
) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("client")
    answer = await peer.call(3, "result", flow_id="f1")
    assert answer.rid == 3 and answer.code == "internal" and answer.retryable
    assert "noproc" in answer.message
    bad = await peer.call(4, "result", flow_id=17)
    assert bad.rid == 4 and bad.code == "bad_frame" and "'flow_id' must be a str" in bad.message
    await peer.aclose()


async def test_call_rpc_arguments_of_another_shape_are_bad_frames_naming_the_argument(
    serve: Any, sock: str
) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("client")
    for rid, args, named in [
        (1, {"flow_id": "f", "name": "r", "args": [], "timeout": -1}, "'timeout' must be"),
        (2, {"flow_id": "f", "name": "r", "args": [], "timeout": True}, "'timeout' must be"),
        (3, {"flow_id": "f", "name": "r", "args": {}}, "'args' must be a list"),
        (4, {"flow_id": "f", "name": 7, "args": []}, "'name' must be a str"),
        (5, {"flow_id": "f", "args": []}, "needs the argument 'name'"),
    ]:
        bad = await peer.call(rid, "call_rpc", **args)
        assert bad.rid == rid and bad.code == "bad_frame" and named in bad.message
    # (an int timeout is of the usual shape: the engine is asked, and none runs here)
    answer = await peer.call(6, "call_rpc", flow_id="f", name="r", args=[], timeout=3)
    assert answer.rid == 6 and answer.code == "internal" and "noproc" in answer.message
    await peer.aclose()


async def test_an_unknown_op_is_unsupported(serve: Any, sock: str) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("worker")
    answer = await peer.call(1, "start_flow", flow_type="x", args=[])
    assert (
        answer.code == "unsupported"
        and "a worker may call define_flows, get_blob, put_blob" in answer.message
    )
    await peer.aclose()


async def test_define_flows_refuses_a_bad_definition_naming_the_field(
    serve: Any, sock: str
) -> None:
    await serve(limits=_limits(max_flow_types=2))
    peer = await Peer.unix(sock)
    await peer.hello("worker", flows=FLOWS)
    bad = {"steps": [{"name": "write", "max_attempts": 0}], "rpcs": []}
    answer = await peer.call(1, "define_flows", flows={"greeting": bad})
    assert type(answer) is wire.MatchError and answer.code == "bad_config"
    assert answer.message.startswith("define_flows: flows['greeting']: ")
    assert "max_attempts" in answer.message
    too_many = {f"T{i}": {"steps": [], "rpcs": []} for i in range(3)}
    answer = await peer.call(2, "define_flows", flows=too_many)
    assert answer.code == "limit" and "matching.max_flow_types=2" in answer.message
    answer = await peer.call(3, "define_flows", flows=[])
    assert answer.code == "bad_frame" and "'flows' must be a dict" in answer.message
    client = await Peer.unix(sock)
    await client.hello()
    answer = await client.call(4, "define_flows", flows={})
    assert answer.code == "unsupported"  # a worker's op
    await peer.aclose()
    await client.aclose()


# ============================================================================ time


async def test_an_idle_connection_is_pinged_and_a_silent_peer_is_dropped(
    serve: Any, sock: str, autojump_clock: trio.testing.MockClock
) -> None:
    await serve(limits=_limits(ping_interval=5.0, peer_timeout=15.0))
    peer = await Peer.unix(sock)
    await peer.hello()
    start = trio.current_time()
    pings = []
    while (msg := await peer.receive()) is not None:
        assert type(msg) is wire.MatchPing and msg.rid == 0
        pings.append(trio.current_time() - start)
    assert pings == [5.0, 10.0]
    assert trio.current_time() - start == 15.0


async def test_a_peer_answering_pings_stays(
    serve: Any, sock: str, autojump_clock: trio.testing.MockClock
) -> None:
    await serve(limits=_limits(ping_interval=5.0, peer_timeout=15.0))
    peer = await Peer.unix(sock)
    await peer.hello()
    for _ in range(10):
        assert type(await peer.receive()) is wire.MatchPing
        await peer.send(wire.MatchPong())
    assert trio.current_time() >= 50.0
    # (an answer without a thread: the clock would jump while a thread runs)
    assert (await peer.call(1, "nope")).code == "unsupported"
    await peer.aclose()


async def test_a_peer_that_sends_no_hello_is_dropped_after_peer_timeout(
    serve: Any, sock: str, autojump_clock: trio.testing.MockClock
) -> None:
    await serve(limits=_limits(ping_interval=5.0, peer_timeout=15.0))
    peer = await Peer.unix(sock)
    start = trio.current_time()
    assert await peer.closed()
    assert trio.current_time() - start == 15.0


async def _flood(peer: Peer, calls: int, size: int) -> None:
    """Calls whose answers are big (an M_ERROR naming the unknown op), answered without a
    thread (the mock clock would jump while a thread runs)."""
    with contextlib.suppress(trio.BrokenResourceError):  # (dropped before the last)
        for rid in range(1, calls + 1):
            await peer.send(wire.MatchCall("x" * size, {}, rid=rid))


async def _connection_down() -> None:
    [pid] = [p for _, p, _, _ in await supervisors.which_children(CONNECTIONS)]
    ref = otp.monitor(pid)
    await otp.receive(lambda m: type(m) is otp.Down and m.ref == ref)


async def test_a_peer_that_stops_reading_is_dropped_when_nothing_drains(
    serve: Any, sock: str, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    await serve(limits=_limits(ping_interval=100.0, peer_timeout=30.0))
    peer = await Peer.unix(sock)
    await peer.hello(codecs=("tlv",))
    start = trio.current_time()
    await _flood(peer, 10, 500_000)  # 5 MB of answers, more than the socket buffers
    with caplog.at_level(logging.WARNING, logger="apps.matching"):
        async with trio.open_nursery() as nursery:

            async def pong() -> None:  # not silent, only not reading
                while True:
                    await trio.sleep(10)
                    await peer.send(wire.MatchPong())

            nursery.start_soon(pong)
            await _connection_down()
            nursery.cancel_scope.cancel()
    assert trio.current_time() - start == pytest.approx(30.0)
    assert any("nothing drained for 30.0s" in r.getMessage() for r in caplog.records)
    await peer.aclose()


async def test_a_peer_that_stops_reading_is_dropped_past_max_unsent(
    serve: Any, sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    await serve(max_unsent=2 << 20)
    peer = await Peer.unix(sock)
    await peer.hello(codecs=("tlv",))
    with caplog.at_level(logging.WARNING, logger="apps.matching"):
        await _flood(peer, 10, 500_000)
        await _connection_down()
    assert any("max_unsent=2097152" in r.getMessage() for r in caplog.records)
    await peer.aclose()


async def test_frames_of_one_scheduling_batch_are_flushed_together_before_the_run_waits() -> None:
    """What connections send while the run works through a batch of ready tasks is written
    once per connection, in the order they became due, before the run waits for I/O; a
    holder whose write fails does not stop the others, nor later batches."""
    batches = batched_writes()
    assert batched_writes() is batches  # (one per run)
    flushed: list[tuple[str, list[int]]] = []

    @attrs.define
    class Holder:
        name: str
        frames: list[int] = attrs.Factory(list)

        def flush(self) -> None:
            if self.name == "broken":
                raise OSError("gone")
            flushed.append((self.name, self.frames[:]))
            self.frames.clear()

    a, b = Holder("a"), Holder("b")
    batches.due += [b, Holder("broken"), a]
    b.frames += [1, 2]
    a.frames.append(3)
    assert flushed == []  # (nothing before the batch is over)
    await trio.lowlevel.checkpoint()
    assert flushed == [("b", [1, 2]), ("a", [3])]
    batches.due.append(a)
    a.frames.append(4)
    await trio.lowlevel.checkpoint()
    assert flushed[-1] == ("a", [4])


# ============================================================================ streams


async def test_register_gets_registered_and_the_stream_pings(
    serve: Any, sock: str, autojump_clock: trio.testing.MockClock
) -> None:
    await serve(limits=_limits(ping_interval=5.0, peer_timeout=100.0))
    peer = await Peer.unix(sock)
    await peer.hello("worker", worker_id="w1", flows=FLOWS)
    await peer.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert await peer.receive() == wire.MatchRegistered("flow", "greeting", rid=1)
    await peer.send(wire.MatchRegister("worker", "w1", rid=2))
    assert await peer.receive() == wire.MatchRegistered("worker", "w1", rid=2)
    stats = await _matcher.statistics()
    assert stats.streams == 2
    seen = {(await peer.receive()).rid for _ in range(3)}
    assert seen >= {1, 2}  # each idle stream is pinged
    await peer.aclose()


async def test_an_accept_read_with_its_outcome_reaches_the_engine_in_the_outcome(
    serve: Any, sock: str
) -> None:
    """A worker's ACCEPT followed at once, in one read, by the same call's outcome goes to the
    call's ``reply_to`` as one ``Completed`` carrying the ``Routed`` "delivered"; an ACCEPT
    read alone (the outcome later, or a frame between them) is its own ``Routed``."""
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("worker", worker_id="w1", flows=FLOWS)
    await peer.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert type(await peer.receive_not_ping()) is wire.MatchRegistered

    async def offered(delivery: int) -> None:
        task = Task(delivery, "step", "greeting", "f1", "write", f"f1/{delivery}/write", 1)
        _matcher.submit(Dispatch(task, otp.self()), matcher=_matcher.MATCHER)
        got = await peer.receive_not_ping()
        assert type(got) is wire.MatchTask and got.delivery == delivery

    await offered(7)
    accept, result = wire.MatchAccept(7, rid=1), wire.MatchResult(7, "hi", rid=1)
    await peer.send_bytes(accept.encode(peer.codec) + result.encode(peer.codec))
    done = await otp.receive(lambda m: type(m) is Completed)
    assert done.value == "hi"
    assert done.delivered == Routed(7, "flow:greeting", "delivered", "w1", done.delivered.stream)
    await offered(8)
    await peer.send(wire.MatchAccept(8, rid=1))
    routed = await otp.receive(lambda m: type(m) is Routed and m.reason == "delivered")
    await peer.send(wire.MatchResult(8, "again", rid=1))
    done = await otp.receive(lambda m: type(m) is Completed)
    assert (routed.delivery, done.value, done.delivered) == (8, "again", None)
    await offered(9)
    pong, accept = wire.MatchPong(rid=1), wire.MatchAccept(9, rid=1)
    await peer.send_bytes(
        accept.encode(peer.codec) + pong.encode(peer.codec) + result.encode(peer.codec)
    )  # (the RESULT of another delivery: ignored)
    routed = await otp.receive(lambda m: type(m) is Routed and m.reason == "delivered")
    assert routed.delivery == 9
    assert await otp.receive(lambda m: type(m) is Completed, timeout=0, default=None) is None
    await peer.aclose()


async def test_a_registration_another_session_holds_is_rejected_permanently(
    serve: Any, sock: str
) -> None:
    await serve()
    first, second = await Peer.unix(sock), await Peer.unix(sock)
    await first.hello("worker", worker_id="w1", flows=FLOWS)
    await first.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert type(await first.receive_not_ping()) is wire.MatchRegistered
    await second.send(
        wire.MatchHello("worker", "session-2", worker_id="w1", codecs=("tlv",), flows=FLOWS)
    )
    assert type(await second.receive()) is wire.MatchWelcome
    await second.send(wire.MatchRegister("flow", "greeting", rid=1))
    rejected = await second.receive_not_ping()
    assert type(rejected) is wire.MatchRejected
    assert rejected.code == "already_registered" and rejected.permanent is True
    await first.aclose()
    await second.aclose()


async def test_a_limit_rejects_a_stream_retryably(serve: Any, sock: str) -> None:
    await serve(limits=_limits(max_streams=1))
    peer = await Peer.unix(sock)
    await peer.hello("worker", flows=FLOWS)
    await peer.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert type(await peer.receive_not_ping()) is wire.MatchRegistered
    await peer.send(wire.MatchRegister("worker", "w1", rid=2))
    rejected = await peer.receive_not_ping()
    assert rejected.code == "limit" and rejected.permanent is False
    assert "max_streams" in rejected.message
    await peer.aclose()


async def test_close_ends_the_stream_and_a_lost_connection_ends_them_all(
    serve: Any, sock: str
) -> None:
    await serve()
    peer = await Peer.unix(sock)
    await peer.hello("worker", flows=FLOWS)
    for rid, (queue, name) in enumerate([("flow", "greeting"), ("worker", "w1")], 1):
        await peer.send(wire.MatchRegister(queue, name, rid=rid))
        assert type(await peer.receive_not_ping()) is wire.MatchRegistered
    assert (await _matcher.statistics()).streams == 2
    await peer.send(wire.MatchClose(rid=1))
    await _until(lambda s: s.streams == 1)
    await peer.aclose()
    await _until(lambda s: s.streams == 0)


async def _until(check: Callable[[Any], bool]) -> None:
    with trio.fail_after(10):
        while not check(await _matcher.statistics()):
            await trio.sleep(0.01)


async def test_the_queues_op_lists_each_queue_with_its_streams_and_backlog(
    serve: Any, sock: str
) -> None:
    await serve()
    worker = await Peer.unix(sock)
    await worker.hello("worker", worker_id="w1", flows=FLOWS)
    await worker.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert await worker.receive() == wire.MatchRegistered("flow", "greeting", rid=1)
    client = await Peer.unix(sock)
    await client.hello()
    answer = await client.call(5, "queues")
    assert type(answer) is wire.MatchReply and answer.rid == 5
    assert answer.value == [
        {
            "name": "greeting",
            "kind": "flow",
            "streams": 1,
            "idle": 1,
            "offered": 0,
            "busy": 0,
            "waiting": 0,
            "workers": 1,
            "declines": 0,
        }
    ]
    refused = await worker.call(6, "queues")  # a client op
    assert refused.code == "unsupported"
    await worker.aclose()
    await client.aclose()


# ============================================================================ TLS


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str, ssl.SSLContext]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    for pem in cert.cert_chain_pems[1:]:
        pem.write_to_path(str(certfile), append=True)
    cert.private_key_pem.write_to_path(str(keyfile))
    keyfile.chmod(0o600)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return str(certfile), str(keyfile), client


async def test_tcp_serves_tls_with_tokens(
    serve: Any, tls_files: tuple[str, str, ssl.SSLContext]
) -> None:
    certfile, keyfile, client = tls_files
    await serve(
        listen=["tcp://127.0.0.1:0"],
        tls_certfile=certfile,
        tls_keyfile=keyfile,
        worker_tokens=["wt"],
        client_tokens=["ct"],
    )
    [address] = await Listener.address()
    assert address.startswith("tcp://127.0.0.1:")
    port = int(address.rpartition(":")[2])
    peer = await Peer.tls("127.0.0.1", port, client)
    assert type(await peer.hello("client", token="ct")) is wire.MatchWelcome
    assert (await peer.call(1, "put_blob", data=b"over tls")).value == "k0"
    await peer.aclose()
    wrong = await Peer.tls("127.0.0.1", port, client)
    assert (await wrong.hello("client", token="wt")).code == "unauthenticated"
    await wrong.aclose()


# ============================================================================ the listener


async def test_the_listener_owns_a_private_socket_and_counts_connections(
    serve: Any, sock: str
) -> None:
    await serve()
    assert await Listener.address() == [f"unix:{sock}"]
    assert os.stat(sock).st_mode & 0o777 == 0o600
    peers = [await Peer.unix(sock) for _ in range(3)]
    for peer in peers:
        await peer.hello()
    stats = await Listener.statistics()
    assert stats["connections"] == 3 and stats["accepted"] == 3
    first = next(p for _, p, _, _ in await supervisors.which_children(CONNECTIONS))
    ref = otp.monitor(first)
    otp.exit(first, otp.KILL)
    await otp.receive(lambda m: type(m) is otp.Down and m.ref == ref)
    # (its Down reached the listener before this call)
    assert (await Listener.statistics())["connections"] == 2
    await peers[0].aclose()
    for peer in peers[1:]:
        await peer.aclose()


async def test_a_crashed_acceptor_restarts_the_listener_and_connections_carry_on(
    serve: Any, sock: str
) -> None:
    await serve()
    before = await Peer.unix(sock)
    await before.hello()
    [acceptor] = (await Listener.statistics())["acceptors"]
    old = otp.whereis("matching_listener")
    assert old is not None
    ref = otp.monitor(old)
    otp.exit(acceptor, "crash")
    await otp.receive(lambda m: type(m) is otp.Down and m.ref == ref)
    await supervisors.which_children("test_matching_sup")  # (after its restart)
    assert otp.whereis("matching_listener") not in (None, old)
    assert (await before.call(1, "put_blob", data=b"still here")).value == "k0"
    after = await Peer.unix(sock)
    assert type(await after.hello()) is wire.MatchWelcome
    assert (await Listener.statistics())["connections"] == 2
    await before.aclose()
    await after.aclose()


async def test_stopping_the_listener_removes_the_socket_file(serve: Any, sock: str) -> None:
    await serve()
    assert os.path.exists(sock)
    await supervisors.terminate_child("test_matching_sup", "listener")
    assert not os.path.exists(sock)


# ============================================================================ graceful stop


async def test_a_stop_with_a_call_outliving_the_drain_timeout_still_stops_within_it(
    serve: Any, sock: str, autojump_clock: trio.testing.MockClock
) -> None:
    limits = _limits(ping_interval=1000.0, peer_timeout=3000.0)
    await serve(stop_drain_timeout=3.0, limits=limits)
    peer = await Peer.unix(sock)
    await peer.hello("worker", worker_id="w1", flows=FLOWS)
    await peer.send(wire.MatchRegister("flow", "greeting", rid=1))
    assert type(await peer.receive_not_ping()) is wire.MatchRegistered
    task = Task(7, "step", "greeting", "f1", "write", "f1/0/write", 1)
    _matcher.submit(Dispatch(task, otp.self()), matcher=_matcher.MATCHER)
    offered = await peer.receive_not_ping()
    assert type(offered) is wire.MatchTask and offered.delivery == 7
    await peer.send(wire.MatchAccept(7, rid=1))
    await otp.receive(lambda m: type(m) is Routed and m.reason == "delivered")
    sup = otp.whereis("test_matching_sup")
    assert sup is not None
    received: list[Any] = []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(otp.GenServer.stop, sup, otp.SHUTDOWN)
        while (msg := await peer.receive()) is not None:  # the call never ends
            received.append(msg)
        closed_after = trio.current_time() - start
    stopped_after = trio.current_time() - start
    assert [type(m) for m in received if type(m) is not wire.MatchPing] == [wire.MatchReconnect]
    assert received[0] == wire.MatchReconnect("server stopping")
    # the connection gave the call up at stop_drain_timeout, before its supervisor's kill
    assert 3.0 <= closed_after <= stopped_after < 3.0 + DRAIN_GRACE
    lost = await otp.receive(lambda m: type(m) is Lost)
    assert lost == Lost(7, "w1", False)
    await peer.aclose()


# ===================================================== the frames of every Step (TASK, REPLY)

_TASK_FIELDS: dict[str, Any] = {
    "delivery": 7,
    "kind": "step",
    "flow_type": "Greet",
    "flow_id": "f1",
    "name": "write",
    "execution_id": "f1/0/write",
    "attempt": 1,
    "args": ["x", {"y": [1, 2.5, None]}],
    "state": {"n": 1},
    "timeout": 2.5,
    "step_kind": "wait_for",
    "rid": 3,
}


@pytest.mark.parametrize("codec", [wire.Codec.TLV, wire.Codec.CBOR])
@pytest.mark.parametrize(
    "changes", [{}, {"step_kind": None, "timeout": None}, {"kind": "rpc", "attempt": 0}]
)
def test_a_task_is_made_and_encoded_as_wire_makes_and_encodes_it(
    codec: wire.Codec, changes: dict[str, Any]
) -> None:
    fields = {**_TASK_FIELDS, **changes}
    made = task_message(**fields)
    expected = wire.MatchTask(**fields)
    assert made == expected
    limits = wire.Limits()
    assert encode_task(made, codec, limits) == expected.encode(codec, limits=limits)


@pytest.mark.parametrize(
    "changes",
    [
        {"delivery": -1},
        {"delivery": 2**64},
        {"delivery": True},
        {"kind": "job"},
        {"flow_type": ""},
        {"flow_id": 5},
        {"name": ""},
        {"execution_id": None},
        {"attempt": -1},
        {"args": ("x",)},
        {"state": []},
        {"timeout": -1.0},
        {"timeout": math.inf},
        {"timeout": math.nan},
        {"timeout": True},
        {"step_kind": "execute_later"},
        {"rid": 0},
    ],
)
def test_a_task_wire_refuses_is_refused_with_wires_own_error(changes: dict[str, Any]) -> None:
    fields = {**_TASK_FIELDS, **changes}
    with pytest.raises(wire.WireError) as expected:
        wire.MatchTask(**fields)
    with pytest.raises(type(expected.value)) as made:
        task_message(**fields)
    assert str(made.value) == str(expected.value)


def test_an_int_timeout_is_a_float_as_wire_converts_it() -> None:
    made = task_message(**{**_TASK_FIELDS, "timeout": 3})
    assert made.timeout == 3.0 and type(made.timeout) is float


@pytest.mark.parametrize("codec", [wire.Codec.TLV, wire.Codec.CBOR])
def test_a_reply_is_encoded_as_wire_encodes_it_and_fails_as_it_fails(codec: wire.Codec) -> None:
    limits = wire.Limits(max_depth=4)
    value = {"flow_id": "f1", "result": [1, "two", None]}
    assert encode_reply(value, 9, codec, limits) == wire.MatchReply(value, rid=9).encode(
        codec, limits=limits
    )
    deep = [[[[["too deep"]]]]]
    with pytest.raises(wire.WireError) as expected:
        wire.MatchReply(deep, rid=9).encode(codec, limits=limits)
    with pytest.raises(type(expected.value)) as made:
        encode_reply(deep, 9, codec, limits)
    assert str(made.value) == str(expected.value)
