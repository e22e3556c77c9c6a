"""Audit of the dirty pool's node side (connections, routing, control plane) against Gunicorn 27's
dirty arbiter and what a production client expects.

Real worker processes (the ``start_pool`` fixture); the app below is loaded by the workers from
this module.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
from collections.abc import Iterator
from typing import Any

import trio

import wire
from apps import dirty
from apps.dirty import _connection, _protocol
from apps.dirty._proxy import WorkerProxy
from apps.dirty.worker._output import Output
from apps.dirty.worker._server import Worker

from .conftest import ECHO

HERE = "tests.test_apps.test_dirty.test_audit_node"
BIG = f"{HERE}:BigStreamApp"
MIB = 1 << 20


class BigStreamApp(dirty.DirtyApp):
    """A stream of large chunks, and how far it got."""

    def init(self) -> None:
        self.made = 0

    def big(self, n: int, size: int) -> Iterator[bytes]:
        for _ in range(n):
            self.made += 1
            yield b"x" * size

    def numbered(self, n: int, size: int) -> Iterator[bytes]:
        for i in range(n):
            self.made += 1
            yield i.to_bytes(4, "big") * (size // 4)

    def produced(self) -> int:
        return self.made

    def blob(self, size: int) -> bytes:
        return b"b" * size

    def echo(self, value: Any) -> Any:
        return value


async def _raw(socket_path: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(socket_path)
    return sock


async def _read_until_closed(sock: Any) -> list[tuple[int, int, bytes]]:
    splitter = wire.FrameSplitter()
    frames: list[tuple[int, int, bytes]] = []
    with trio.fail_after(5):
        while chunk := await sock.recv(65536):
            frames += splitter.feed(chunk)
    return frames


def _node_queued_for_clients() -> int:
    """Bytes the node holds, unsent, for its client connections."""
    total = 0
    for obj in gc.get_objects():
        if type(obj) is _connection.ClientConnection:
            total += sum(len(part) for part in obj.outbox.buf)
    return total


# ------------------------------------------------------------------ a client that half-closes


async def test_requests_sent_before_a_half_close_are_still_answered(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=2)
    sock = await _raw(socket_path)
    data = wire.request_parts(1, ECHO, "sleep", (0.05,))[0]
    data += wire.request_parts(2, ECHO, "echo", ("two",))[0]
    await sock.send(data)
    sock.shutdown(socket.SHUT_WR)  # nothing more to send; the replies are still wanted
    frames = await _read_until_closed(sock)
    sock.close()
    replies = {rid: (mtype, _protocol.decode_payload(p)) for mtype, rid, p in frames}
    assert replies == {1: (0x02, {"result": 0.05}), 2: (0x02, {"result": "two"})}


async def test_a_control_request_sent_before_a_half_close_is_still_answered(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    sock = await _raw(socket_path)
    await sock.send(wire.encode_header(_protocol.STATUS, 0, 3))
    sock.shutdown(socket.SHUT_WR)
    frames = await _read_until_closed(sock)
    sock.close()
    assert [(mtype, rid) for mtype, rid, _ in frames] == [(0x02, 3)]
    assert _protocol.decode_payload(frames[0][2])["result"]["worker_count"] == 1


async def test_a_half_closed_client_is_closed_once_its_last_reply_is_written(
    start_pool: Any, socket_path: str
) -> None:
    # Nothing in flight: the node closes at once (the replies already went out).
    await start_pool(dirty_workers=1)
    sock = await _raw(socket_path)
    await sock.send(wire.request_parts(1, ECHO, "echo", ("one",))[0])
    splitter = wire.FrameSplitter()
    with trio.fail_after(5):
        got = splitter.feed(await sock.recv(65536))
    sock.shutdown(socket.SHUT_WR)
    assert await _read_until_closed(sock) == []
    sock.close()
    assert [(mtype, rid) for mtype, rid, _ in got] == [(0x02, 1)]


# ------------------------------------------------------------------ a client that reads nothing


def _held() -> bool:
    """Is a worker actor holding its worker for a slow client?"""
    return any(type(o) is WorkerProxy and o.held_since is not None for o in gc.get_objects())


async def _read_stream(sock: Any, rid: int) -> list[bytes]:
    splitter = wire.FrameSplitter()
    chunks: list[bytes] = []
    with trio.fail_after(10):
        while True:
            chunk = await sock.recv(1 << 20)
            assert chunk, "the node closed the connection mid-stream"
            for mtype, got, payload in splitter.feed(chunk):
                assert got == rid
                if mtype == 0x05:
                    return chunks
                assert mtype == 0x04, _protocol.decode_payload(payload)
                chunks.append(_protocol.decode_payload(payload)["data"])


async def test_a_slow_reader_gets_the_whole_stream_in_order_when_it_reads_again(
    start_pool: Any, socket_path: str
) -> None:
    chunks = 40
    await start_pool(
        dirty_apps=[BIG], dirty_workers=1, dirty_threads=2, dirty_client_buffer=8 * MIB
    )
    sock = await _raw(socket_path)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    await sock.send(wire.request_parts(1, BIG, "numbered", (chunks, MIB))[0])
    try:
        with trio.fail_after(10):
            while not _held():  # the node stopped taking the stream: over its high-water mark
                await trio.sleep(0.01)
        assert _node_queued_for_clients() <= 16 * MIB
        got = await _read_stream(sock, 1)
    finally:
        sock.close()
    assert [chunk[:4] for chunk in got] == [i.to_bytes(4, "big") for i in range(chunks)]
    assert all(len(chunk) == MIB for chunk in got)


async def test_a_client_reading_nothing_is_dropped_and_the_held_worker_serves_on(
    start_pool: Any, socket_path: str
) -> None:
    # dirty_timeout (1 s) bounds the hold: the slow client is then dropped, its stream ended in
    # the worker; the worker was not silent, only held, so it is not killed for it. The client
    # reading again then gets whole frames, and an ERROR saying why, before the socket closes.
    await start_pool(
        dirty_apps=[BIG],
        dirty_workers=1,
        dirty_threads=2,
        dirty_timeout=1.0,
        dirty_client_buffer=8 * MIB,
    )
    client = dirty.DirtyClient(socket_path, timeout=10)
    sock = await _raw(socket_path)
    try:
        before = [w["pid"] for w in (await client.status_async())["workers"]]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        await sock.send(wire.request_parts(1, BIG, "big", (1000, MIB))[0])
        with trio.fail_after(10):
            while not _held():
                await trio.sleep(0.01)
            while _held():
                await trio.sleep(0.05)
            made = await client.execute_async(BIG, "produced")
            assert made < 1000  # the generator was ended
            while (await client.execute_async(BIG, "produced")) != made:
                made = await client.execute_async(BIG, "produced")
        assert [w["pid"] for w in (await client.status_async())["workers"]] == before
        splitter = wire.FrameSplitter()
        got: list[tuple[int, int, bytes]] = []
        with trio.fail_after(10):  # what the node had queued, then why, then the end
            while chunk := await sock.recv(1 << 20):
                got += splitter.feed(chunk)
        assert splitter.buffered == 0  # not closed mid-frame
        assert {(mtype, rid) for mtype, rid, _ in got[:-1]} == {(_protocol.CHUNK, 1)}
        mtype, rid, payload = got[-1]
        assert (mtype, rid) == (_protocol.ERROR, 1)
        assert "took nothing of its" in _protocol.decode_payload(payload)["error"]["message"]
        assert _node_queued_for_clients() == 0
    finally:
        sock.close()
        await client.close_async()


async def test_a_client_that_reads_nothing_slows_only_itself(
    start_pool: Any, socket_path: str
) -> None:
    # One client pipelines 24 calls for 1 MiB each and reads nothing. The worker they share with
    # a second client was held for it (until dirty_timeout=20 s dropped it); now its replies
    # queue against its own budget and the second client's calls are answered meanwhile.
    await start_pool(dirty_apps=[BIG], dirty_workers=1, dirty_threads=2, dirty_timeout=20)
    slow = await _raw(socket_path)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    other = dirty.DirtyClient(socket_path, timeout=30)
    calls = 200
    try:
        await slow.send(
            b"".join(wire.request_parts(i, BIG, "blob", (MIB,))[0] for i in range(1, 25))
        )
        with trio.fail_after(20):
            while _node_queued_for_clients() < 16 * MIB:  # the worker made most of them
                await trio.sleep(0.01)
        took = []
        with trio.fail_after(10):  # (each call takes well under a millisecond)
            for i in range(calls):
                began = trio.current_time()
                assert await other.execute_async(BIG, "echo", i) == i
                took.append(trio.current_time() - began)
        took.sort()
        print(f"p50 {took[calls // 2] * 1e3:.2f} ms, p99 {took[calls * 99 // 100] * 1e3:.2f} ms")
        assert not _held()
        splitter = wire.FrameSplitter()  # the slow client reads at last: all its replies
        replies: dict[int, int] = {}
        with trio.fail_after(20):
            while len(replies) < 24:
                for mtype, rid, payload in splitter.feed(await slow.recv(1 << 20)):
                    assert mtype == _protocol.RESPONSE
                    replies[rid] = len(_protocol.decode_payload(payload)["result"])
        assert replies == {i: MIB for i in range(1, 25)}
    finally:
        slow.close()
        await other.close_async()


def _dropped() -> bool:
    return any(type(o) is _connection.ClientConnection and o.dropped for o in gc.get_objects())


async def test_a_client_taking_nothing_within_its_budget_is_dropped_with_an_error_frame(
    start_pool: Any, socket_path: str
) -> None:
    # 24 MiB of replies: within the client's budget (the worker is never held), over the mark
    # where its connection stops taking its requests; after dirty_timeout (1 s) it is dropped.
    await start_pool(dirty_apps=[BIG], dirty_workers=1, dirty_threads=2, dirty_timeout=1.0)
    slow = await _raw(socket_path)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        frames = [wire.request_parts(i, BIG, "blob", (MIB,))[0] for i in range(1, 25)]
        frames.append(wire.request_parts(25, BIG, "echo", ("late",))[0])
        await slow.send(b"".join(frames))
        with trio.fail_after(20):
            while not _dropped():
                await trio.sleep(0.02)
        assert not _held()
        splitter = wire.FrameSplitter()
        got: list[tuple[int, int, bytes]] = []
        with trio.fail_after(10):
            while chunk := await slow.recv(1 << 20):
                got += splitter.feed(chunk)
        assert splitter.buffered == 0  # whole frames, then the end
        answered = {rid for mtype, rid, _ in got if mtype == _protocol.RESPONSE}
        failed = {rid for mtype, rid, _ in got if mtype == _protocol.ERROR}
        # Each call answered, or failed by the drop (id 0 if none was left in flight).
        assert answered | (failed - {0}) == set(range(1, 26)) and not answered & failed
        assert got[-1][0] == _protocol.ERROR
        assert "took nothing of its" in _protocol.decode_payload(got[-1][2])["error"]["message"]
    finally:
        slow.close()


def test_an_end_read_after_the_workers_loop_closed_is_dropped_quietly() -> None:
    # The reader thread may read a client's END while the worker exits (its loop closed).
    loop = asyncio.new_event_loop()
    loop.close()
    ours, theirs = socket.socketpair()
    worker = Worker({}, 1, 1.0, os.getppid())
    try:
        worker.loop = loop
        worker.sock = ours
        worker.buffer = wire.FrameBuffer()
        worker.out = Output(loop, ours)
        worker.running.add(9)
        theirs.sendall(wire.encode_header(_protocol.END, 0, 9))
        assert worker._read()
        assert worker.abandoned == {9}
    finally:
        worker.executor.shutdown()
        ours.close()
        theirs.close()


# ------------------------------------------------------------------ a client that reads nothing


async def test_the_node_does_not_buffer_a_whole_stream_for_a_client_that_reads_nothing(
    start_pool: Any, socket_path: str
) -> None:
    chunks = 48
    await start_pool(
        dirty_apps=[BIG], dirty_workers=1, dirty_threads=2, dirty_client_buffer=8 * MIB
    )
    sock = await _raw(socket_path)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    await sock.send(wire.request_parts(1, BIG, "big", (chunks, MIB))[0])
    client = dirty.DirtyClient(socket_path, timeout=10)
    most = 0
    try:
        # Until the worker made every chunk (then a moment for the node to take them), or the
        # node is seen holding far more than any socket buffer for this client.
        with trio.move_on_after(3):
            settle: float | None = None
            while settle is None or trio.current_time() < settle:
                most = max(most, _node_queued_for_clients())
                if most > 16 * MIB:
                    break
                if settle is None and await client.execute_async(BIG, "produced") == chunks:
                    settle = trio.current_time() + 0.3
                await trio.sleep(0.02)
    finally:
        sock.close()
        await client.close_async()
    assert most <= 16 * MIB, f"the node held {most / MIB:.0f} MiB for a client reading nothing"


# ------------------------------------------------------------------ checked and right


async def test_a_raw_client_closing_mid_stream_ends_the_generator_in_the_worker(
    start_pool: Any, socket_path: str
) -> None:
    # No END from the client: only its socket closing. The node must end the call in the worker
    # (its generator closed), and the worker serves on.
    await start_pool(dirty_workers=1, dirty_threads=2)
    sock = await _raw(socket_path)
    await sock.send(wire.request_parts(7, ECHO, "endless", ("raw-close",))[0])
    splitter = wire.FrameSplitter()
    got: list[tuple[int, int, bytes]] = []
    with trio.fail_after(5):
        while len(got) < 3:
            got += splitter.feed(await sock.recv(65536))
    assert {(mtype, rid) for mtype, rid, _ in got} == {(0x04, 7)}
    sock.close()
    client = dirty.DirtyClient(socket_path, timeout=10)
    try:
        with trio.fail_after(5):
            while not await client.execute_async(ECHO, "was_stopped", "raw-close"):
                await trio.sleep(0.01)
            assert await client.execute_async(ECHO, "echo", "after") == "after"
    finally:
        await client.close_async()
