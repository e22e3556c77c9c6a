"""The blocking ``Client``'s own transport (``_client_sync``, ``_sync_connection``): calling
threads do the socket I/O themselves. Against the in-test server over a real Unix socket (TLS
and credentials: ``test_credentials.py``)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
from typing import Any

import pytest

import wire
from apps.matching import (
    CallTimeout,
    Client,
    ClientClosed,
    FlowNotFound,
)
from apps.matching import _client_frames as frames
from apps.matching._sync_connection import SyncConnection

from .fake_matching_server import FakeServer
from .sdk_clients import Greeting, client_args, stuck


def _client(server: FakeServer, fake_dir: str, **options: Any) -> Client:
    return Client(*client_args(server, fake_dir, **options))


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_every_op_on_one_connection_and_large_values_through_the_blob_cache(fake_server, fake_dir):
    with _client(fake_server, fake_dir) as client:
        big = b"x" * 100
        flow_id = client.start_flow(Greeting, big, flow_id="f")
        assert fake_server.calls[-1][0] == "start_flow"
        assert {op for op, _ in fake_server.calls} == {"put_blob", "start_flow"}
        assert client.describe_flow(flow_id).flow_id == "f"
        assert [s.flow_id for s in client.list_flows(Greeting)] == ["f"]
        client.cancel_flow(flow_id)
        with pytest.raises(FlowNotFound):
            client.describe_flow("nope")
    assert fake_server.connections == 1 and fake_server.hellos[0].role == "client"


def test_an_rpcs_large_arguments_are_uploaded_and_its_large_answer_fetched(fake_server, fake_dir):
    ref = {"$blob": fake_server.blobs.put(b"R" * 200), "size": 200}

    async def answer(args: dict[str, Any]) -> Any:
        return {"got": args["args"], "out": ref}

    fake_server.ops["call_rpc"] = answer
    with _client(fake_server, fake_dir) as client:
        got = client.call_rpc("f", "greeting", b"A" * 100, 1)
    assert [op for op, _ in fake_server.calls] == ["put_blob", "call_rpc", "get_blob"]
    assert got == {"got": [b"A" * 100, 1], "out": b"R" * 200}


def test_concurrent_calls_from_many_threads_share_one_connection(fake_server, fake_dir):
    with _client(fake_server, fake_dir) as client:
        threads = [
            _in_thread(
                lambda i=i: [client.start_flow(Greeting, flow_id=f"{i}-{j}") for j in range(20)]
            )
            for i in range(12)
        ]
        for thread, errors in threads:
            thread.join()
            assert errors == []
    assert len(fake_server.flows) == 12 * 20 and fake_server.connections == 1


def test_a_ping_while_a_call_waits_is_answered_by_the_reading_thread(
    threaded_fake, fake_server, fake_dir
):

    async def describe_after_a_pong(args: dict[str, Any]) -> Any:
        ponged = fake_server.ponged
        await fake_server.ping_clients()
        await ponged.wait()  # (the call would hang if the reading thread left it unanswered)
        raise FlowNotFound("no such flow")

    fake_server.ops["describe"] = describe_after_a_pong
    with _client(fake_server, fake_dir) as client, pytest.raises(FlowNotFound):
        client.describe_flow("x")
    assert fake_server.pongs == 1


def test_pings_an_idle_client_got_are_answered_before_its_next_call(
    threaded_fake, fake_server, fake_dir
):
    with _client(fake_server, fake_dir) as client:
        client.open()
        threaded_fake.run(fake_server.ping_clients)
        threaded_fake.run(fake_server.ping_clients)
        client.start_flow(Greeting, flow_id="after")
        assert fake_server.pongs == 2 and fake_server.connections == 1


def test_an_idle_connection_the_server_dropped_is_dialled_again_before_sending(
    threaded_fake, fake_server, fake_dir
):
    # (as after the server's peer_timeout: nobody reads an idle connection, see the module
    # docs of _sync_connection). start_flow is not retried on a loss, yet it goes through once.
    with _client(fake_server, fake_dir) as client:
        client.start_flow(Greeting, flow_id="a")
        threaded_fake.run(fake_server.drop_connections)
        client.start_flow(Greeting, flow_id="b")
    assert [args["flow_id"] for op, args in fake_server.calls if op == "start_flow"] == ["a", "b"]
    assert fake_server.connections == 2


def test_a_lost_connection_fails_the_calls_in_flight_and_the_next_call_dials(
    threaded_fake, fake_server, fake_dir
):
    started = threading.Event()
    fake_server.ops["call_rpc"] = stuck(started)
    with _client(fake_server, fake_dir) as client:
        client.start_flow(Greeting, flow_id="a")
        thread, errors = _in_thread(client.call_rpc, "a", "greeting")
        assert started.wait(10)
        threaded_fake.run(fake_server.drop_connections)
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], ClientClosed)
        assert errors[0].retryable and "was closed" in str(errors[0])
        assert client.describe_flow("a").flow_id == "a"
    assert fake_server.connections == 2


def test_a_timed_out_call_leaves_the_connection_usable(fake_server, fake_dir):
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)
    with _client(fake_server, fake_dir, call_timeout=0.2) as client:
        with pytest.raises(CallTimeout, match=r"'describe' .* within 0\.2 s"):
            client.describe_flow("x")
        assert client.start_flow(Greeting, flow_id="after") == "after"
    assert fake_server.connections == 1


def test_where_there_is_no_poll_reads_block_and_time_out_on_the_sockets_timeout(
    fake_server, fake_dir
):
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)
    with _client(fake_server, fake_dir, call_timeout=0.2) as client:
        client.open()
        conn = client._engine._conn
        assert conn is not None
        conn.poller = None  # (as on a platform without select.poll)
        assert client.start_flow(Greeting, flow_id="a") == "a"
        with pytest.raises(CallTimeout):
            client.describe_flow("x")
        assert conn.rcvtimeo is not None
        assert client.start_flow(Greeting, flow_id="b") == "b"
    assert fake_server.connections == 1


def test_the_read_timeout_is_set_again_only_when_it_would_end_a_read_late_or_twice_early():
    ours, theirs = socket.socketpair()
    welcome = wire.MatchWelcome(server="s", codec="cbor", ping_interval=5.0, peer_timeout=15.0)
    conn = SyncConnection(ours, None, welcome, "test")

    def kernel() -> float:
        sec, usec = struct.unpack("ll", ours.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
        return sec + usec / 1e6

    try:
        conn._bound_reads(59.0)
        assert kernel() == pytest.approx(59.0, abs=0.01)
        conn._bound_reads(34.0)  # (59 s would end the read late)
        assert kernel() == pytest.approx(34.0, abs=0.01)
        conn._bound_reads(59.0)  # (34 s ends it at most once early: kept)
        assert kernel() == pytest.approx(34.0, abs=0.01)
        conn._bound_reads(34.001)  # (late by less than the slack)
        assert kernel() == pytest.approx(34.0, abs=0.01)
        conn._bound_reads(100.0)
        assert kernel() == pytest.approx(100.0, abs=0.01)
        conn._bound_reads(None)  # a call with no timeout reads with none
        assert kernel() == 0.0
        conn._bound_reads(None)
        assert kernel() == 0.0
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("codec", [wire.Codec.CBOR, wire.Codec.TLV])
def test_a_calls_frame_is_the_bytes_wire_makes_of_it_with_its_errors(codec):
    args = {"flow_id": "f", "name": "ping", "args": [1, "x", b"y", None], "timeout": 2.5}
    made = frames.encode_call("call_rpc", args, 2**40, codec)
    assert made == wire.encode_call("call_rpc", args, 2**40, codec, limits=frames.LIMITS)
    with pytest.raises(wire.UnknownValueType):
        frames.encode_call("call_rpc", {"args": [{1, 2}]}, 1, codec)


def _reply_bytes(value: Any, rid: int = 7, codec: wire.Codec = wire.Codec.CBOR) -> bytes:
    return wire.MatchReply(value, rid=rid).encode(codec, limits=frames.LIMITS)


def test_a_lone_callers_reply_is_read_straight_from_its_bytes():
    data = _reply_bytes({"a": [1, b"x"]})
    buffer = bytearray(data + b"stale bytes of an earlier read")
    assert frames.lone_reply(buffer, len(data)) == (7, {"a": [1, b"x"]})


@pytest.mark.parametrize(
    "data",
    [
        _reply_bytes(None)[:-1],  # part of a frame
        _reply_bytes(None) + _reply_bytes(None, rid=8),  # two frames
        _reply_bytes(None, codec=wire.Codec.TLV),
        wire.MatchError("not_found", "no such flow", rid=7).encode(wire.Codec.CBOR),
        _reply_bytes(None)[:3] + b"\x01" + _reply_bytes(None)[4:],  # version 1
        b"GD\x02\xd1\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\xff",  # bad CBOR
        b"GD\x02\xd1\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\xf6",  # no dict
    ],
)
def test_any_other_read_is_left_to_wires_decoder(data):
    assert frames.lone_reply(bytearray(data), len(data)) is None


def test_a_malformed_frame_after_replies_read_straight_names_its_offset_in_the_stream():
    ours, theirs = socket.socketpair()
    welcome = wire.MatchWelcome(server="s", codec="cbor", ping_interval=5.0, peer_timeout=15.0)
    conn = SyncConnection(ours, None, welcome, "test")
    answered = 0

    def server() -> None:
        nonlocal answered
        decoder = wire.FrameDecoder()
        for send_back in ("reply", "reply", "garbage"):
            frames_in: list[wire.Frame] = []
            while not frames_in:
                frames_in = decoder.feed(theirs.recv(65536))
            if send_back == "reply":
                theirs.sendall(_reply_bytes("ok", rid=frames_in[0].request_id))
                answered += 1
            else:
                theirs.sendall(b"XX" + bytes(14))

    thread, errors = _in_thread(server)
    try:
        assert conn.call("describe_flow", {}, 5.0) == "ok"
        assert conn.call("describe_flow", {}, 5.0) == "ok"
        with pytest.raises(ClientClosed, match=rf"at byte {2 * len(_reply_bytes('ok'))}\)"):
            conn.call("describe_flow", {}, 5.0)
    finally:
        thread.join()
        ours.close()
        theirs.close()
    assert answered == 2 and not errors


def test_a_sleeping_caller_times_out_while_another_thread_reads(fake_server, fake_dir):
    started = threading.Event()
    fake_server.ops["call_rpc"] = stuck(started)
    with _client(fake_server, fake_dir) as client:
        reader, errors = _in_thread(client.call_rpc, "a", "greeting")
        assert started.wait(10)
        started.clear()
        with pytest.raises(CallTimeout):
            client.call_rpc("a", "greeting", timeout=0.1)  # (locally 0.1 s + the grace)
        assert reader.is_alive()
        client.close()
        reader.join()
    assert len(errors) == 1 and isinstance(errors[0], ClientClosed)


def test_close_fails_calls_in_flight_with_client_closed_and_is_idempotent(fake_server, fake_dir):
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)
    client = _client(fake_server, fake_dir)
    thread, errors = _in_thread(client.describe_flow, "x")
    assert started.wait(10)
    client.close()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], ClientClosed)
    assert "closed during the call" in str(errors[0])
    client.close()
    with pytest.raises(ClientClosed, match="the client is closed"):
        client.describe_flow("x")


def _interrupt(started: threading.Event, ready: threading.Event | None = None) -> threading.Thread:
    """A thread that interrupts this one (SIGINT) once the server ``started`` a call (and
    ``ready`` is set, if given)."""
    main = threading.get_ident()

    def interrupt() -> None:
        assert started.wait(10)
        assert ready is None or ready.wait(10)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    return thread


def test_a_keyboard_interrupt_mid_read_leaves_the_connection_usable(fake_server, fake_dir):
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)
    with _client(fake_server, fake_dir) as client:
        client.open()
        conn = client._engine._conn
        assert conn is not None
        # The interrupt waits until the caller is past its send and reading (an interrupt
        # during the send may close the connection instead, see the next test).
        reading = threading.Event()
        read = conn._read

        def read_after_telling(remaining: Any, waiter: Any) -> None:
            if waiter is not None:  # (a call's read, after its send; not the idle check's)
                reading.set()
            read(remaining, waiter)

        conn._read = read_after_telling  # type: ignore[method-assign]
        thread = _interrupt(started, reading)
        with pytest.raises(KeyboardInterrupt):
            client.describe_flow("x")
        thread.join()
        assert conn.broken is None and not conn.reader and not conn.waiters
        assert client.start_flow(Greeting, flow_id="after") == "after"
    assert fake_server.connections == 1


def test_a_keyboard_interrupt_anywhere_in_a_call_leaves_the_client_usable(fake_server, fake_dir):
    # Interrupts land at every point of a call in turn (a send may have gone out partly:
    # the connection is then closed, its calls fail, the next call dials again).
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)
    with _client(fake_server, fake_dir) as client:
        for i in range(20):
            started.clear()
            thread = _interrupt(started)
            with pytest.raises(KeyboardInterrupt):
                client.describe_flow("x")
            thread.join()
            assert client.start_flow(Greeting, flow_id=f"after-{i}") == f"after-{i}"


def _in_child(fn: Any) -> int:
    """Run ``fn`` in a forked child (bounded by an alarm: a hang fails it); its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child's coverage is not collected)
        code = 1
        try:
            signal.alarm(10)
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_dials_its_own_connection_and_leaves_the_parents_alone(
    fake_server, fake_dir
):
    # A pre-fork server's master made the client: each child calls on a connection of its own,
    # and the parent's (never read nor shut down by a child) goes on as it was.
    with _client(fake_server, fake_dir) as client:
        client.start_flow(Greeting, flow_id="parent-1")
        parents = client._engine._conn

        def child() -> None:
            client.start_flow(Greeting, flow_id="child")
            assert client._engine._conn is not parents
            client.close()

        assert _in_child(child) == 0
        client.start_flow(Greeting, flow_id="parent-2")
        assert client._engine._conn is parents and parents.broken is None
    assert {"parent-1", "child", "parent-2"} <= set(fake_server.flows)
    assert fake_server.connections == 2


def test_a_fork_while_another_thread_dials_leaves_the_child_a_client_that_works(
    fake_server, fake_dir
):
    # The parent's dial lock, held by a thread at the fork, is a new lock in the child.
    with _client(fake_server, fake_dir) as client:
        with client._engine._dial_lock:
            code = _in_child(lambda: client.start_flow(Greeting, flow_id="child"))
        assert code == 0
    assert "child" in fake_server.flows
