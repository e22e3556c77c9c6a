"""Streaming actions: chunks in order to a slow reader, clients that read nothing or close
mid-stream, timeouts mid-stream, abandoned streams, execute of a streaming action."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import wire
from apps import dirty
from apps.dirty import _connection, _protocol
from apps.dirty._io import Outbox
from apps.dirty._protocol import CHUNK, END, RESPONSE
from apps.dirty._proxy import WorkerProxy
from apps.dirty.worker._output import Output
from apps.dirty.worker._server import Worker

from .conftest import APPS, AUDIT, ECHO
from .helpers import _raw


class ScriptedPool:
    """One-connection GD v1 server: answers a REQUEST for ``count`` with CHUNK 0, CHUNK 1,
    END (what a pool sends for a streaming action) and any other with a RESPONSE echoing its
    first argument; records every frame it gets."""

    def __init__(self, path: str) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.got: list[tuple[int, int]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        splitter = wire.FrameSplitter()
        with conn:
            while data := conn.recv(65536):
                for mtype, rid, payload in splitter.feed(data):
                    self.got.append((mtype, rid))
                    if mtype != _protocol.REQUEST:
                        continue
                    body = _protocol.decode_payload(payload)
                    if body["action"] == "count":
                        out = wire.encode_dirty(CHUNK, rid, {"data": 0})
                        out += wire.encode_dirty(CHUNK, rid, {"data": 1})
                        out += wire.encode_header(END, 0, rid)
                    else:
                        out = wire.encode_dirty(RESPONSE, rid, {"result": body["args"][0]})
                    conn.sendall(out)

    def close(self) -> None:
        self.server.close()


def test_execute_of_a_streaming_action_is_an_error_not_its_first_chunk(tmp_path: Path) -> None:
    pool = ScriptedPool(str(tmp_path / "s.sock"))
    client = dirty.DirtyClient(str(tmp_path / "s.sock"), timeout=5)
    try:
        try:
            got = client.execute(ECHO, "count", 2)
        except dirty.DirtyError:
            got = "raised"
        assert client.execute(ECHO, "echo", "next") == "next"  # the connection is in step
        assert got == "raised", f"execute() of a stream returned {got!r}"
    finally:
        client.close()
        pool.close()


async def test_execute_async_of_a_streaming_action_is_an_error_and_abandons_it(
    tmp_path: Path,
) -> None:
    pool = ScriptedPool(str(tmp_path / "s.sock"))
    client = dirty.DirtyClient(str(tmp_path / "s.sock"), timeout=5)
    try:
        with pytest.raises(dirty.DirtyError, match="streaming action") as raised:
            await client.execute_async(ECHO, "count", 2)
        assert not isinstance(raised.value, dirty.DirtyAppError)
        assert await client.execute_async(ECHO, "echo", "next") == "next"
        [(_, stream_id), *_] = pool.got
        assert (END, stream_id) in pool.got  # the worker is told to stop the generator
    finally:
        await client.close_async()
        pool.close()


BIG = f"{APPS}:BigStreamApp"
MIB = 1 << 20


def _node_queued_for_clients() -> int:
    """Bytes the node holds, unsent, for its client connections."""
    total = 0
    for obj in gc.get_objects():
        if type(obj) is _connection.ClientConnection:
            total += sum(len(part) for part in obj.outbox.buf)
    return total


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


async def test_a_frame_the_clients_socket_takes_in_part_reaches_it_whole_and_in_order() -> None:
    # The node writes a lone frame from the receive buffer it was read into; what the socket
    # does not take is copied (the buffer is read into again) and sent before what follows.
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        outbox = Outbox(ours.fileno())
        received = bytearray(b"a" * (8 << 20))
        second = b"b" * 100
        async with trio.open_nursery() as nursery:
            nursery.start_soon(outbox.run)
            outbox.writev([memoryview(received)])
            assert outbox.size, "the socket took all of it: the test needs a larger frame"
            received[:] = b"z" * len(received)  # (the next read into the buffer)
            outbox.writev([second])
            got = bytearray()

            def read() -> None:
                while len(got) < (8 << 20) + len(second):
                    got.extend(theirs.recv(1 << 20))

            await trio.to_thread.run_sync(read)
            await outbox.flush()
            nursery.cancel_scope.cancel()
        assert got == b"a" * (8 << 20) + second
        assert not outbox.size
    finally:
        ours.close()
        theirs.close()


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
        worker.attach(ours)  # (non-blocking: the reader waits in poll, then reads)
        assert not ours.getblocking()
        worker.out = Output(loop, ours)
        worker.running.add(9)
        theirs.sendall(wire.encode_header(_protocol.END, 0, 9))
        assert worker._read()
        assert worker.abandoned == {9}
    finally:
        worker.executor.shutdown()
        ours.close()
        theirs.close()


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


async def test_client_timeout_mid_stream_is_a_dirty_timeout_error(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[AUDIT], dirty_workers=1, dirty_threads=4)
    client = dirty.DirtyClient(socket_path, timeout=0.3)
    got: list[Any] = []
    with pytest.raises(dirty.DirtyTimeoutError) as info:
        async for x in client.stream_async(AUDIT, "stall_stream", 1.5):
            got.append(x)
    assert got == [1] and info.value.timeout == 0.3
    sync_got: list[Any] = []

    def sync() -> None:
        with pytest.raises(dirty.DirtyTimeoutError):
            for x in client.stream(AUDIT, "stall_stream", 1.5):
                sync_got.append(x)

    await trio.to_thread.run_sync(sync)
    assert sync_got == [1]
    assert await client.execute_async(AUDIT, "echo", "a") == "a"
    assert await trio.to_thread.run_sync(client.execute, AUDIT, "echo", "s") == "s"
    await client.close_async()
    client.close()


async def test_dirty_timeout_mid_stream_is_a_dirty_timeout_error(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[AUDIT], dirty_workers=1, dirty_timeout=0.5)
    client = dirty.DirtyClient(socket_path, timeout=10)
    got: list[Any] = []
    with trio.fail_after(5):
        with pytest.raises(dirty.DirtyTimeoutError) as info:
            async for x in client.stream_async(AUDIT, "stall_stream", 10):
                got.append(x)
    assert got == [1] and info.value.timeout == 0.5
    await client.close_async()


async def test_abandoned_streams_then_the_same_stream_again(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=1)
    client = dirty.DirtyClient(socket_path, timeout=10)
    for round_ in range(3):
        it = client.stream_async(ECHO, "endless", f"a{round_}")
        assert await it.__anext__() == 0
        await it.aclose()  # type: ignore[attr-defined]
        assert [x async for x in client.stream_async(ECHO, "count", 5)] == list(range(5))

    def sync() -> list[Any]:
        it = client.stream(ECHO, "endless", "s")
        first = next(it)
        it.close()  # type: ignore[attr-defined]
        return [first, list(client.stream(ECHO, "count", 4))]

    assert await trio.to_thread.run_sync(sync) == [0, [0, 1, 2, 3]]
    with trio.fail_after(5):  # every abandoned generator was stopped in the worker
        for tag in ("a0", "a1", "a2", "s"):
            while not await client.execute_async(ECHO, "was_stopped", tag):
                await trio.sleep(0.01)
    await client.close_async()
    client.close()
