"""A connection's I/O: lazy frames wait for the next frame, the writer batches frames in order,
the busy limit, and the socket reader's frames and clean or broken ends."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire

from ..peer import COOKIE


def _connection_on(sock: Any, **config: Any) -> Any:
    """A Connection that is up on ``sock`` (one end of a socketpair), of the current node's
    Distribution; its writer is not started."""
    from otp._distribution import Connection, Distribution

    dist = Distribution(otp.current_node(), otp.DistConfig(cookie=COOKIE, **config))
    conn = Connection(dist, "b@localhost")
    conn.codec = wire.Codec.TLV
    conn.state = "up"
    conn.direct_fd = sock.fileno()
    return conn


def _frames_in(data: bytes) -> list[tuple[wire.MessageType, Any]]:
    return [(f.type, f.payload) for f in wire.FrameDecoder().feed(data)]


def _ping_payload(i: int) -> dict[str, Any]:
    return {"to": wire.Pid("b@localhost", 1, 1), "msg": i}


async def test_a_lazy_frame_waits_for_the_next_frame_and_goes_first_in_its_write() -> None:
    import socket

    SEND, DEMONITOR = wire.MessageType.SEND, wire.MessageType.DEMONITOR
    async with otp.open_node("a@localhost"):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.setblocking(False)
            conn = _connection_on(ours)
            conn.enqueue(DEMONITOR, {"ref": 1}, lazy=True)
            # Nothing written, nobody woken: it waits for the next frame.
            with pytest.raises(BlockingIOError):
                theirs.recv(65536)
            assert not conn.idle
            conn.enqueue(SEND, _ping_payload(1))
            assert conn.idle  # both went out in one direct write, the lazy frame first
            assert _frames_in(theirs.recv(65536)) == [
                (DEMONITOR, {"ref": 1}),
                (SEND, _ping_payload(1)),
            ]


async def test_a_lone_lazy_frame_is_written_by_the_writer_after_lazy_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from otp._dist_connection import LAZY_DELAY

    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.write_loop, trio.SocketStream(ours))
                await trio.testing.wait_all_tasks_blocked()
                start = trio.current_time()
                conn.enqueue(wire.MessageType.DEMONITOR, {"ref": 2}, lazy=True)
                data = await theirs.recv(65536)
                assert trio.current_time() - start >= LAZY_DELAY
                assert _frames_in(data) == [(wire.MessageType.DEMONITOR, {"ref": 2})]
                nursery.cancel_scope.cancel()


async def test_lazy_frames_go_out_at_once_when_a_stopping_node_flushes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from otp._dist_connection import LAZY_DELAY

    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.write_loop, trio.SocketStream(ours))
                await trio.testing.wait_all_tasks_blocked()
                start = trio.current_time()
                conn.enqueue(wire.MessageType.DEMONITOR, {"ref": 4}, lazy=True)
                conn.write_lazy_now()
                data = await theirs.recv(65536)
                assert trio.current_time() - start < LAZY_DELAY
                assert _frames_in(data) == [(wire.MessageType.DEMONITOR, {"ref": 4})]
                nursery.cancel_scope.cancel()


async def test_a_frame_sent_while_the_writer_writes_queues_behind_it_in_order() -> None:
    # The direct write is only for an idle connection: a frame sent while a long one is
    # still being written (the peer reads slowly) must not cut into it.
    SEND = wire.MessageType.SEND
    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours)
            big = {"to": wire.Pid("b@localhost", 1, 1), "msg": b"x" * (4 << 20)}
            received = bytearray()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.write_loop, trio.SocketStream(ours))
                await trio.testing.wait_all_tasks_blocked()
                conn.enqueue(SEND, big)  # the socket takes part of it: the writer has the rest
                await trio.testing.wait_all_tasks_blocked()
                assert not conn.idle
                for i in range(3):
                    conn.enqueue(SEND, _ping_payload(i))
                conn.enqueue(wire.MessageType.DEMONITOR, {"ref": 3}, lazy=True)
                while len(_frames_in(bytes(received))) < 5:
                    received += await theirs.recv(1 << 20)
                nursery.cancel_scope.cancel()
            frames = _frames_in(bytes(received))
            assert [payload["msg"] if t is SEND else payload for t, payload in frames] == [
                big["msg"],
                0,
                1,
                2,
                {"ref": 3},
            ]


async def test_the_busy_limit_still_suspends_a_sender_of_direct_writes() -> None:
    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours, busy_limit=64 * 1024, queue_limit=1 << 30)
            from otp._process import current_process

            me = current_process()
            payload = {"to": wire.Pid("b@localhost", 1, 1), "msg": b"y" * 4096}
            while not conn.busy:  # nobody reads: past what the socket takes, frames queue
                conn.enqueue(wire.MessageType.SEND, payload)
            assert me.suspended is not None  # its next receive waits until half is written


async def test_the_socket_reader_returns_frames_as_they_complete_and_then_the_error() -> None:
    from otp._dist_reading import SocketFrames

    SEND = wire.MessageType.SEND
    frame = wire.encode_message(SEND, _ping_payload(7))
    ours, theirs = trio.socket.socketpair()
    with ours, theirs:
        reader = SocketFrames(ours.fileno(), wire.Limits())
        await theirs.send(frame[:5])
        async with trio.open_nursery() as nursery:
            got: list[Any] = []

            async def read() -> None:
                got.append(await reader.receive_frames())

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # half a header: it waits for the rest
            await theirs.send(frame[5:] + frame)
        assert [(f.type, f.payload) for f in got[0]] == [(SEND, _ping_payload(7))] * 2
        await theirs.send(frame + b"XX" + b"\0" * 14)
        assert [f.payload for f in await reader.receive_frames()] == [_ping_payload(7)]
        with pytest.raises(wire.WireError):
            await reader.receive_frames()  # the bad header behind the good frame


async def test_the_socket_reader_tells_a_clean_end_from_one_inside_a_frame() -> None:
    from otp._dist_reading import SocketFrames

    frame = wire.encode_message(wire.MessageType.PING, None)
    for tail, clean in ((b"", True), (frame[:3], False)):
        ours, theirs = trio.socket.socketpair()
        with ours:
            reader = SocketFrames(ours.fileno(), wire.Limits())
            await theirs.send(frame + tail)
            theirs.close()
            assert [f.type for f in await reader.receive_frames()] == [wire.MessageType.PING]
            if clean:
                assert await reader.receive_frames() == []
            else:
                with pytest.raises(wire.Truncated):
                    await reader.receive_frames()


async def test_a_caller_the_socket_woke_as_its_connection_ended_reads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otp import _dist_reading
    from otp._process import CallWaiter

    ours, theirs = trio.socket.socketpair()
    with ours, theirs:
        reader = _dist_reading.SocketFrames(ours.fileno(), wire.Limits())
        await theirs.send(wire.encode_message(wire.MessageType.PING, None))
        waiter = CallWaiter()

        async def readable_as_the_connection_ends(fd: int) -> None:
            # The socket woke the caller, and the connection ended before it ran again.
            reader.close()
            waiter.resolve(("noconnection",), True)

        monkeypatch.setattr(_dist_reading, "wait_readable", readable_as_the_connection_ends)
        await reader.wait_reply(None, None, waiter)  # type: ignore[arg-type]
        assert reader.reads == 0 and waiter.done


async def test_a_connection_lost_for_its_queue_says_so_in_its_failure(sockets: Any) -> None:
    async with otp.open_node("a@localhost"):
        ours, theirs = trio.socket.socketpair()
        with ours, theirs:
            conn = _connection_on(ours, busy_limit=1024, queue_limit=4096)
            payload = {"to": wire.Pid("b@localhost", 1, 1), "msg": b"z" * 2048}
            while conn.state != "down":  # nobody reads: past what the socket takes, it queues
                assert conn.failure is None
                conn.enqueue(wire.MessageType.SEND, payload)
            assert conn.failure is not None and conn.failure.kind == "queue_limit"
