"""SdkConnection against a scripted server on a real Unix socket: handshake, codec switch,
stream and call demultiplexing, control frames, connection loss, dial failures, TLS."""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
import threading

import pytest
import trio
import trio.testing

import wire
from apps.matching import (
    AuthenticationError,
    CallTimeout,
    ClientClosed,
    ClientOptions,
    FlowNotFound,
    ProtocolError,
    Unavailable,
    WorkerOptions,
)
from apps.matching._sdk_connection import SdkConnection

from .fake_server import FakeServer


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="mc", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def server(sock_dir, nursery):
    fake = FakeServer(f"{sock_dir}/s.sock", policy=lambda conn, message: None)
    await nursery.start(fake.serve)
    return fake


def _record_writes(conn: SdkConnection, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the writes to ``conn``'s socket from now on."""
    writes: list[int] = []
    write = os.write

    def recording(fd: int, data: bytes) -> int:
        if fd == conn._fd:
            writes.append(len(data))
        return write(fd, data)

    monkeypatch.setattr(os, "write", recording)
    return writes


def _worker_options(server: FakeServer, **kw) -> WorkerOptions:
    return WorkerOptions(server_address=server.address, credentials="s3cret", **kw)


async def test_hello_carries_role_token_worker_id_and_flows(server, autojump_clock):
    flows = {"Greeting": {"steps": ["greet"], "rpcs": ["greeting"]}}
    conn = await SdkConnection.open(
        _worker_options(server), "worker", worker_id="w1", session="sess", flows=flows
    )
    hello = server.conn.hello
    assert (hello.role, hello.token, hello.worker_id, hello.session) == (
        "worker",
        "s3cret",
        "w1",
        "sess",
    )
    assert hello.flows == flows
    assert hello.codecs[0] is wire.Codec.CBOR
    assert conn.codec is wire.Codec.CBOR
    await conn.aclose()


async def test_frames_after_welcome_use_the_welcomed_codec(server, autojump_clock):
    conn = await SdkConnection.open(
        ClientOptions(server_address=server.address, codec="tlv"), "client"
    )
    assert conn.codec is wire.Codec.TLV
    await conn.send(wire.MatchPong())
    await server.wait_for(lambda: bool(server.conn.received))
    assert server.conn.received == [wire.MatchPong()]
    await conn.aclose()


async def test_unauthenticated_welcome_error_raises_authentication_error(server, autojump_clock):
    server.welcome_error = wire.MatchError(code="unauthenticated", message="bad token")
    with pytest.raises(AuthenticationError, match="bad token"):
        await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")


async def test_call_returns_the_reply_value(server, autojump_clock, nursery):
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")

    async def answer():
        await server.wait_for(lambda: bool(server.conn.of_type(wire.MatchCall)))
        call = server.conn.of_type(wire.MatchCall)[0]
        assert (call.op, call.args) == ("describe", {"flow_id": "f"})
        await server.conn.send(wire.MatchReply(value={"ok": 1}, rid=call.rid))

    nursery.start_soon(answer)
    assert await conn.call("describe", {"flow_id": "f"}) == {"ok": 1}
    await conn.aclose()


async def test_a_frame_larger_than_the_socket_buffer_arrives_whole_and_in_order(
    server, autojump_clock
):
    # The socket takes part of it at once; the rest is written as the server reads.
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    big = bytes(range(256)) * (4 * 1024 * 8)  # 8 MiB, many times a socket's buffer
    await conn.send(wire.MatchCall(op="put_blob", args={"data": big}, rid=7))
    await conn.send(wire.MatchPong())
    await server.wait_for(lambda: len(server.conn.received) == 2)
    call, pong = server.conn.received
    assert (call.op, call.rid, call.args["data"] == big) == ("put_blob", 7, True)
    assert pong == wire.MatchPong()
    await conn.aclose()


async def test_a_clients_calls_of_one_batch_go_in_one_write(
    server, autojump_clock, nursery, monkeypatch
):
    # Held until the run waits for I/O: the calls tasks make in one scheduling batch go to
    # the socket in one write, and reach the server in one read.
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    writes = _record_writes(conn, monkeypatch)
    answers: dict[str, object] = {}

    async def call(flow_id: str) -> None:
        answers[flow_id] = await conn.call("describe", {"flow_id": flow_id})

    for flow_id in ("f0", "f1", "f2"):
        nursery.start_soon(call, flow_id)
    fake = server.conn
    await server.wait_for(lambda: len(fake.received) == 3)
    calls = fake.of_type(wire.MatchCall)
    assert sorted(c.args["flow_id"] for c in calls) == ["f0", "f1", "f2"]
    assert fake.read_together(*calls)
    assert len(writes) == 1
    for c in calls:
        await fake.send(wire.MatchReply(value=c.args["flow_id"].upper(), rid=c.rid))
    await trio.testing.wait_all_tasks_blocked()
    assert answers == {"f0": "F0", "f1": "F1", "f2": "F2"}
    await conn.aclose()


async def test_frames_read_together_are_delivered_until_one_breaks_the_protocol(
    server, autojump_clock, nursery
):
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    outcomes: dict[str, object] = {}

    async def call(flow_id: str) -> None:
        try:
            outcomes[flow_id] = await conn.call("describe", {"flow_id": flow_id})
        except ClientClosed as exc:
            outcomes[flow_id] = exc

    nursery.start_soon(call, "first")
    nursery.start_soon(call, "second")
    fake = server.conn
    await server.wait_for(lambda: len(fake.of_type(wire.MatchCall)) == 2)
    # (by flow id: trio may start the two callers in either order)
    by_flow = {c.args["flow_id"]: c for c in fake.of_type(wire.MatchCall)}
    first, second = by_flow["first"], by_flow["second"]
    bad = wire.Frame(wire.MessageType.M_REPLY, 0, {"value": 1}, version=2, codec=fake.codec)
    data = b"".join(
        [
            wire.MatchReply(value="one", rid=first.rid).encode(fake.codec),
            wire.encode_frame(bad),  # (a reply needs a call id)
            wire.MatchReply(value="two", rid=second.rid).encode(fake.codec),
        ]
    )
    await fake.frames.stream.send_all(data)  # (one write: one read of the client's)
    await trio.testing.wait_all_tasks_blocked()
    assert outcomes["first"] == "one"
    assert isinstance(outcomes["second"], ClientClosed)
    assert isinstance(conn.error, ProtocolError)
    assert "M_REPLY" in conn.error.message
    await conn.aclose()


async def test_call_error_raises_the_error_of_its_code(server, autojump_clock, nursery):
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")

    async def answer():
        await server.wait_for(lambda: bool(server.conn.of_type(wire.MatchCall)))
        call = server.conn.of_type(wire.MatchCall)[0]
        await server.conn.send(
            wire.MatchError(code="flow_not_found", message="no flow f", rid=call.rid)
        )

    nursery.start_soon(answer)
    with pytest.raises(FlowNotFound, match="no flow f"):
        await conn.call("describe", {"flow_id": "f"})
    await conn.aclose()


async def test_call_timeout_raises_call_timeout(server, autojump_clock):
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    start = trio.current_time()
    with pytest.raises(CallTimeout):
        await conn.call("result", {"flow_id": "f"}, timeout=5)
    assert trio.current_time() - start == pytest.approx(5)
    await conn.aclose()


async def test_calls_in_flight_time_out_each_at_its_own_deadline(server, autojump_clock, nursery):
    # One timer serves every call of the connection: each still fails at its own deadline,
    # an answered call never does, and a late answer is dropped.
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    start = trio.current_time()
    ended: dict[str, float] = {}

    async def call(name: str, timeout: float, delay: float = 0) -> None:
        await trio.sleep(delay)
        try:
            await conn.call("result", {"flow_id": name}, timeout=timeout)
        except CallTimeout as exc:
            assert f"within {timeout} s" in str(exc)
            ended[name] = trio.current_time() - start
        else:
            ended[name] = -1

    async def answer_b() -> None:
        def calls_to(name: str) -> list[wire.MatchCall]:
            return [c for c in server.conn.of_type(wire.MatchCall) if c.args["flow_id"] == name]

        await server.wait_for(lambda: bool(calls_to("b")))
        await trio.sleep(2)
        await server.conn.send(wire.MatchReply(value=1, rid=calls_to("b")[0].rid))
        await trio.sleep(6)  # after a's timeout: its answer is dropped
        await server.conn.send(wire.MatchReply(value=1, rid=calls_to("a")[0].rid))

    async with trio.open_nursery() as calls:
        calls.start_soon(call, "a", 5)
        calls.start_soon(call, "b", 4)
        calls.start_soon(call, "c", 3)
        calls.start_soon(call, "d", 5, 1)
        calls.start_soon(answer_b)
    assert ended == pytest.approx({"a": 5, "b": -1, "c": 3, "d": 6})
    assert waiting_calls(conn) == 0
    await conn.aclose()


async def test_a_cancelled_call_drops_its_late_answer(server, autojump_clock):
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    with trio.move_on_after(1):
        await conn.call("result", {"flow_id": "f"})
    call = server.conn.of_type(wire.MatchCall)[0]
    await server.conn.send(wire.MatchReply(value="late", rid=call.rid))
    assert waiting_calls(conn) == 0

    async def answer() -> None:
        await server.wait_for(lambda: len(server.conn.of_type(wire.MatchCall)) == 2)
        await server.conn.send(
            wire.MatchReply(value="ok", rid=server.conn.of_type(wire.MatchCall)[1].rid)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        assert await conn.call("result", {"flow_id": "g"}) == "ok"
    await conn.aclose()


def waiting_calls(conn: SdkConnection) -> int:
    """The calls still waiting for an answer."""
    return len(conn._calls)


async def test_stream_frames_reach_their_own_stream_channel(server, autojump_clock):
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    a, a_frames = conn.open_stream()
    b, b_frames = conn.open_stream()
    assert a != b and 0 not in (a, b)
    await server.conn.send(wire.MatchPing(rid=b))
    await server.conn.send(wire.MatchRegistered(queue="flow", name="X", rid=a))
    await server.conn.send(wire.MatchClose(rid=9999))  # no such stream: dropped
    assert await a_frames.receive() == wire.MatchRegistered(queue="flow", name="X", rid=a)
    assert await b_frames.receive() == wire.MatchPing(rid=b)
    conn.close_stream(a)
    with pytest.raises(trio.EndOfChannel):
        await a_frames.receive()
    await conn.aclose()


async def test_what_the_frames_of_one_read_are_answered_with_goes_in_one_write_in_order(
    server, autojump_clock, monkeypatch
):
    # The reader corks the writes its deliveries make (on a handler thread too) and writes
    # them once it delivered every frame of the read.
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    writes = _record_writes(conn, monkeypatch)

    def answer(message: wire.MatchMessage) -> None:
        pong = wire.MatchPong(rid=message.rid)
        if message.rid != b:
            conn.send_nowait(pong)
        else:  # (as a worker's handler thread writes a call's outcome)
            thread = threading.Thread(target=conn.send_threadsafe, args=(conn.encode(pong),))
            thread.start()
            thread.join()

    a, b, c = (conn.open_stream_handler(answer) for _ in range(3))
    fake = server.conn
    pings = [wire.MatchPing(rid=rid).encode(fake.codec) for rid in (a, b, c)]
    await fake.frames.stream.send_all(b"".join(pings))  # (one write: one read of the SDK's)
    await server.wait_for(lambda: len(fake.received) == 3)
    expected = [wire.MatchPong(rid=rid) for rid in (a, b, c)]
    assert fake.received == expected
    assert fake.read_together(*expected)
    assert len(writes) == 1
    await conn.aclose()


async def test_what_is_written_corked_goes_at_once_and_the_rest_of_the_read_stays_corked(
    server, autojump_clock, monkeypatch
):
    # A worker's ACCEPT sent at once (accept_delay=0) is on the socket before its handler
    # starts, not at the read's end: a worker killed once the handler runs is known to have
    # taken the call.
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    writes = _record_writes(conn, monkeypatch)
    seen: list[int] = []

    def answer(message: wire.MatchMessage) -> None:
        conn.send_nowait(wire.MatchPong(rid=message.rid))
        if message.rid == a:
            conn.write_corked()
        seen.append(len(writes))

    a, b, c = (conn.open_stream_handler(answer) for _ in range(3))
    fake = server.conn
    pings = [wire.MatchPing(rid=rid).encode(fake.codec) for rid in (a, b, c)]
    await fake.frames.stream.send_all(b"".join(pings))  # (one write: one read of the SDK's)
    await server.wait_for(lambda: len(fake.received) == 3)
    assert fake.received == [wire.MatchPong(rid=rid) for rid in (a, b, c)]
    assert seen == [1, 1, 1]  # a's PONG written at once; b's and c's held to the read's end
    assert len(writes) == 2
    await conn.aclose()


async def test_stream_handler_gets_its_frames_in_the_reader(server, autojump_clock):
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    got: list[wire.MatchMessage] = []
    a = conn.open_stream_handler(got.append)
    _, b_frames = conn.open_stream()
    await server.conn.send(wire.MatchRegistered(queue="flow", name="X", rid=a))
    await server.conn.send(wire.MatchPing(rid=a))
    await server.conn.send(wire.MatchPing(rid=a + 1))
    assert await b_frames.receive() == wire.MatchPing(rid=a + 1)  # (sent after a's frames)
    assert got == [wire.MatchRegistered(queue="flow", name="X", rid=a), wire.MatchPing(rid=a)]
    conn.close_stream(a)
    await server.conn.send(wire.MatchPing(rid=a))  # no longer open: dropped
    await server.conn.send(wire.MatchPing(rid=a + 1))
    assert await b_frames.receive() == wire.MatchPing(rid=a + 1)
    assert len(got) == 2
    await conn.aclose()


async def test_send_nowait_writes_at_once_or_queues_in_order_behind_a_writer(
    server, autojump_clock
):
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    fake = server.conn
    conn.send_nowait(wire.MatchPong(rid=1))  # written before this task yields
    await server.wait_for(lambda: fake.of_type(wire.MatchPong) == [wire.MatchPong(rid=1)])
    # A writer holds the turn: frames sent meanwhile wait, then go in the order sent, before
    # the next send's.
    async with conn._write_lock:
        conn.send_nowait(wire.MatchPong(rid=2))
        conn.send_nowait(wire.MatchPong(rid=3))
        await trio.testing.wait_all_tasks_blocked()
        assert len(fake.of_type(wire.MatchPong)) == 1
    await conn.send(wire.MatchPong(rid=4))
    await server.wait_for(lambda: len(fake.of_type(wire.MatchPong)) == 4)
    assert [m.rid for m in fake.of_type(wire.MatchPong)] == [1, 2, 3, 4]
    await conn.aclose()
    with pytest.raises(ClientClosed):
        conn.send_nowait(wire.MatchPong(rid=5))


async def test_connection_level_frames_go_to_control(server, autojump_clock):
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    await server.conn.send(wire.MatchPing())
    await server.conn.send(wire.MatchReconnect(reason="rebalance"))
    await server.conn.send(wire.MatchError(code="draining", message="bye", retryable=True))
    assert await conn.control.receive() == wire.MatchPing()
    assert await conn.control.receive() == wire.MatchReconnect(reason="rebalance")
    error = await conn.control.receive()
    assert isinstance(error, wire.MatchError) and error.code == "draining"
    await conn.aclose()


async def test_connection_loss_fails_calls_and_ends_streams(server, autojump_clock, nursery):
    conn = await SdkConnection.open(_worker_options(server), "worker", worker_id="w1")
    _, frames = conn.open_stream()

    async def drop():
        await server.wait_for(lambda: bool(server.conn.of_type(wire.MatchCall)))
        await server.conn.drop()

    nursery.start_soon(drop)
    with pytest.raises(ClientClosed) as info:
        await conn.call("get_blob", {"key": "k"})
    assert info.value.retryable
    with pytest.raises(trio.EndOfChannel):
        await frames.receive()
    with pytest.raises(trio.EndOfChannel):
        await conn.control.receive()
    assert conn.closed
    with pytest.raises(ClientClosed):
        await conn.send(wire.MatchPong())
    with pytest.raises(ClientClosed):
        conn.open_stream()
    await conn.aclose()


async def test_aclose_is_idempotent_and_fails_waiting_calls(server, autojump_clock, nursery):
    conn = await SdkConnection.open(ClientOptions(server_address=server.address), "client")
    failed = trio.Event()

    async def call():
        with pytest.raises(ClientClosed):
            await conn.call("result", {"flow_id": "f"})
        failed.set()

    nursery.start_soon(call)
    await trio.testing.wait_all_tasks_blocked()
    await conn.aclose()
    await conn.aclose()
    await failed.wait()
    await server.wait_for(lambda: not server.conn.open)


async def test_dial_failure_raises_retryable_unavailable(sock_dir, autojump_clock):
    options = ClientOptions(server_address=f"unix:{sock_dir}/nothing.sock")
    with pytest.raises(Unavailable, match="cannot connect") as info:
        await SdkConnection.open(options, "client")
    assert info.value.retryable


async def test_silent_server_raises_call_timeout_after_connect_timeout(server, autojump_clock):
    server.silent = True
    options = ClientOptions(server_address=server.address, connect_timeout=3)
    start = trio.current_time()
    with pytest.raises(CallTimeout, match="connect_timeout"):
        await SdkConnection.open(options, "client")
    assert trio.current_time() - start == pytest.approx(3)


async def test_tls_verifies_the_server_certificate(nursery, tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("matching.test")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    listeners = await nursery.start(trio.serve_tcp, lambda s: _tls_welcome(s, server_context), 0)
    port = listeners[0].socket.getsockname()[1]
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    good = ClientOptions(
        server_address=f"tcp://127.0.0.1:{port}",
        tls_ca_file=str(ca_file),
        tls_server_hostname="matching.test",
    )
    with trio.fail_after(10):
        conn = await SdkConnection.open(good, "client")
        assert conn.welcome.server == "tls-fake"
        await conn.aclose()
        wrong = ClientOptions(
            server_address=f"tcp://127.0.0.1:{port}",
            tls_ca_file=str(ca_file),
            tls_server_hostname="other.test",
        )
        with pytest.raises(AuthenticationError, match="verification"):
            await SdkConnection.open(wrong, "client")


async def _tls_welcome(stream: trio.abc.Stream, context: ssl.SSLContext) -> None:
    tls = trio.SSLStream(stream, context, server_side=True)
    try:
        frames = wire.FrameStream(tls, versions=frozenset({2}))
        await frames.receive_frame()
        welcome = wire.MatchWelcome(
            server="tls-fake", codec="cbor", ping_interval=10.0, peer_timeout=30.0
        )
        await frames.send_frame(welcome.to_frame())
        await frames.receive_frame()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(tls)


# -- writes from another thread (a worker's handler threads) ---------------------------------


def _socketpair_connection() -> tuple[SdkConnection, trio.socket.SocketType]:
    """A connection on one end of a socket pair (no reader task: nothing reads its end),
    and the other end, where a test reads what it wrote."""
    ours, theirs = trio.socket.socketpair()
    frames = wire.FrameStream(trio.SocketStream(ours), versions=frozenset({2}))
    welcome = wire.MatchWelcome(
        server="t", codec=wire.Codec.CBOR, ping_interval=10.0, peer_timeout=30.0
    )
    return SdkConnection(frames, welcome, "a socket pair"), theirs


async def _read_frames(sock: trio.socket.SocketType, n: int) -> list[wire.MatchMessage]:
    frames = wire.FrameStream(trio.SocketStream(sock), versions=frozenset({2}))
    return [wire.parse_matching(await frames.receive_frame()) for _ in range(n)]


async def test_threadsafe_writes_never_block_on_a_full_socket_and_keep_frames_in_order(
    autojump_clock,
):
    conn, theirs = _socketpair_connection()
    assert conn.threadsafe_writes
    big = bytes(range(256)) * 4096  # 1 MiB: the socket's buffer fills at once
    data = [
        conn.encode(wire.MatchOutput(delivery=i, value=big, rid=1), wire.MatchPong(rid=i))
        for i in range(3)
    ]
    # From a thread: each call returns at once, though nobody reads (the rest is queued).
    await trio.to_thread.run_sync(lambda: [conn.send_threadsafe(d) for d in data[:2]])
    conn.send_nowait(wire.MatchPing(rid=9))  # (the trio thread's frames queue behind them)
    await trio.to_thread.run_sync(conn.send_threadsafe, data[2])
    got = await _read_frames(theirs, 7)
    assert [(type(m).__name__, m.rid) for m in got] == [
        ("MatchOutput", 1),
        ("MatchPong", 0),
        ("MatchOutput", 1),
        ("MatchPong", 1),
        ("MatchPing", 9),
        ("MatchOutput", 1),
        ("MatchPong", 2),
    ]
    assert all(m.value == big for m in got if isinstance(m, wire.MatchOutput))
    await conn.aclose()


async def test_a_threadsafe_write_to_a_closed_peer_loses_the_connection(autojump_clock):
    conn, theirs = _socketpair_connection()
    theirs.close()
    data = conn.encode(wire.MatchPong(rid=1))
    with pytest.raises(ClientClosed, match="lost while sending"):
        await trio.to_thread.run_sync(conn.send_threadsafe, data)
    await trio.testing.wait_all_tasks_blocked()  # (the trio thread is told to lose it)
    assert conn.closed and conn.error is not None and "a write failed" in conn.error.message
    with pytest.raises(ClientClosed):
        conn.send_threadsafe(data)
    await conn.aclose()
