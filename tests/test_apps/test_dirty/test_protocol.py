"""The pool's wire protocol as a raw client sees it: request ids, bad frames, many requests in
flight on one connection, half-closed clients, disconnects mid-call, STATUS and MANAGE."""

from __future__ import annotations

import importlib
import logging
import socket
import struct
from typing import Any

import pytest
import trio
import trio.testing

import wire
from apps import dirty
from apps.dirty import _protocol
from apps.dirty._protocol import ERROR, RESPONSE

from .conftest import ECHO, LIMITED
from .helpers import _raw


async def _read_frames(sock: Any, count: int) -> list[tuple[int, int, Any]]:
    splitter = wire.FrameSplitter()
    frames: list[tuple[int, int, Any]] = []
    with trio.fail_after(5):
        while len(frames) < count:
            data = await sock.recv(65536)
            assert data, "the pool closed the connection"
            frames += [(t, r, _protocol.decode_payload(p)) for t, r, p in splitter.feed(data)]
    return frames


async def test_request_ids_zero_max_and_reused_in_flight_through_the_node(
    start_pool: Any, socket_path: str
) -> None:
    """Ids 0 and 2**64-1 are a client's like any other (the pool re-addresses them to its
    workers); an id reused while its call is in flight is refused on that id alone, the first
    call still gets its answer, and the id is free again once answered. STATUS has Gunicorn's
    keys."""
    await start_pool(dirty_workers=1, dirty_threads=2)
    sock = await _raw(socket_path)
    top = 2**64 - 1
    data = wire.request_parts(0, ECHO, "echo", ("zero",))[0]
    data += wire.request_parts(top, ECHO, "sleep", (0.2,))[0]
    data += wire.request_parts(top, ECHO, "echo", ("again",))[0]  # in flight: refused
    data += wire.encode_header(0x11, 0, 5)
    await sock.send(data)
    frames = await _read_frames(sock, 4)
    by_id: dict[int, list[tuple[int, Any]]] = {}
    for mtype, rid, body in frames:
        by_id.setdefault(rid, []).append((mtype, body))
    assert by_id[0] == [(RESPONSE, {"result": "zero"})]
    [(refused, error), (answered, result)] = by_id[top]
    assert refused == ERROR and error["error"]["error_type"] == "DirtyProtocolError"
    assert "already in flight" in error["error"]["message"]
    assert (answered, result) == (RESPONSE, {"result": 0.2})
    [(mtype, status)] = by_id[5]
    assert {"arbiter_pid", "workers", "worker_count", "apps"} <= set(status["result"])
    assert status["result"]["apps"] == [ECHO]
    await sock.send(wire.request_parts(top, ECHO, "echo", ("free",))[0])
    assert await _read_frames(sock, 1) == [(RESPONSE, top, {"result": "free"})]
    sock.close()


async def test_manage_count_zero_answers_gunicorns_requested(
    start_pool: Any, socket_path: str
) -> None:
    # One worker holding a workers=1 app: neither op starts or stops a worker.
    await start_pool(dirty_apps=[LIMITED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    try:
        for op, did in (("remove", "removed"), ("add", "spawned")):
            result = await trio.to_thread.run_sync(client.manage, op, 0)
            assert result[did] == 0 and result["success"] is True
            assert result["requested"] == 1, result
    finally:
        client.close()


async def _read_until_closed(sock: Any) -> list[tuple[int, int, bytes]]:
    splitter = wire.FrameSplitter()
    frames: list[tuple[int, int, bytes]] = []
    with trio.fail_after(5):
        while chunk := await sock.recv(65536):
            frames += splitter.feed(chunk)
    return frames


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


async def _read_raw_frames(sock: Any, count: int) -> list[tuple[int, int, bytes]]:
    """Read until ``count`` frames came (or the pool closed the socket)."""
    splitter = wire.FrameSplitter()
    frames: list[tuple[int, int, bytes]] = []
    with trio.fail_after(5):
        while len(frames) < count:
            data = await sock.recv(65536)
            if not data:
                break
            frames += splitter.feed(data)
    return frames


async def _read_bytes_until_closed(sock: Any) -> bytes:
    data = b""
    with trio.fail_after(5):
        while chunk := await sock.recv(65536):
            data += chunk
    return data


def _error_of(payload: bytes) -> dict[str, Any]:
    body = _protocol.decode_payload(payload)
    assert isinstance(body, dict)
    error = body["error"]
    assert isinstance(error, dict)
    return error


async def test_gunicorn_protocol_status_and_manage_messages(
    start_pool: Any, socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``gunicornc``'s handlers send: dict messages, a str id for STATUS."""
    pytest.importorskip("gunicorn.dirty")
    protocol: Any = importlib.import_module("gunicorn.dirty.protocol")
    MANAGE_OP_ADD, MANAGE_OP_REMOVE = protocol.MANAGE_OP_ADD, protocol.MANAGE_OP_REMOVE
    DirtyProtocol = protocol.DirtyProtocol

    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:2"], dirty_workers=2)

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(socket_path)
        try:
            DirtyProtocol.write_message(sock, request)
            response: dict[str, Any] = DirtyProtocol.read_message(sock)
            return response
        finally:
            sock.close()

    status = await trio.to_thread.run_sync(
        ask, {"type": DirtyProtocol.MSG_TYPE_STATUS, "id": "ctl-status-1"}
    )
    assert status["type"] == DirtyProtocol.MSG_TYPE_RESPONSE
    workers = status["result"]["workers"]
    assert len(workers) == 2
    for w in workers:
        assert {"pid", "age", "apps", "booted", "last_heartbeat"} <= set(w)
    with caplog.at_level(logging.WARNING, logger="apps.dirty"):
        removed = await trio.to_thread.run_sync(
            ask,
            {"type": DirtyProtocol.MSG_TYPE_MANAGE, "id": 1, "op": MANAGE_OP_REMOVE, "count": 1},
        )
    assert removed["type"] == DirtyProtocol.MSG_TYPE_RESPONSE
    assert removed["result"]["removed"] == 0 and removed["result"]["total_workers"] == 2
    assert any("never shrinks below 2" in r.getMessage() for r in caplog.records)
    added = await trio.to_thread.run_sync(
        ask, {"type": DirtyProtocol.MSG_TYPE_MANAGE, "id": 2, "op": MANAGE_OP_ADD, "count": 1}
    )
    assert added["result"]["spawned"] == 1 and added["result"]["total_workers"] == 3
    bad = await trio.to_thread.run_sync(
        ask, {"type": DirtyProtocol.MSG_TYPE_MANAGE, "id": 3, "op": 7, "count": 1}
    )
    assert bad["type"] == DirtyProtocol.MSG_TYPE_ERROR


async def test_manage_edges(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[LIMITED], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    added = await trio.to_thread.run_sync(client.manage, "add", 1)
    assert added["spawned"] == 0 and added["success"] is True
    assert added["reason"] == "All apps have reached their worker limits"
    removed = await trio.to_thread.run_sync(client.manage, "remove", 5)
    assert removed["removed"] == 0 and removed["total_workers"] == 1
    status = await client.status_async()
    assert status["worker_count"] == 1
    client.close()
    await client.close_async()


async def test_manage_remove_never_drops_a_limited_app_below_n(
    start_pool: Any, socket_path: str
) -> None:
    # Workers 1..2 hold LIMITED:2; add two more (ECHO only), then remove three: the two extra
    # go, and the pool stops at 2 with LIMITED on both remaining workers.
    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:2"], dirty_workers=2)
    client = dirty.DirtyClient(socket_path)
    added = await trio.to_thread.run_sync(client.manage, "add", 2)
    assert added["spawned"] == 2
    removed = await trio.to_thread.run_sync(client.manage, "remove", 3)
    assert removed["removed"] == 2 and removed["total_workers"] == 2
    status = await client.status_async()
    live = [w for w in status["workers"] if not w["draining"]]
    assert all(LIMITED in w["apps"] for w in live) and len(live) == 2
    assert status["app_workers"][LIMITED] == 2
    client.close()
    await client.close_async()


async def test_bad_frames_from_a_client(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    # A known type a client may not send: an ERROR for that id; the connection carries on.
    sock = await _raw(socket_path)
    good = wire.request_parts(8, ECHO, "echo", ("x",))[0]
    await sock.send(wire.encode_header(0x02, 0, 7) + good)
    frames = await _read_raw_frames(sock, 2)
    by_id = {rid: (mtype, payload) for mtype, rid, payload in frames}
    assert by_id[7][0] == 0x03
    assert _error_of(by_id[7][1])["error_type"] == "DirtyProtocolError"
    assert by_id[8][0] == 0x02
    # A STASH whose payload is not a dict, and one with no int op: errors, then still served.
    not_dict = b"\x11\x00\x00\x00\x01x"
    data = wire.encode_header(0x10, len(not_dict), 20) + not_dict
    data += wire.encode_dirty(0x10, 21, {"table": "t"})  # no op
    data += wire.encode_dirty(0x12, 22, {"op": 9, "count": 1})  # no such MANAGE op
    await sock.send(data + wire.request_parts(30, ECHO, "echo", ("y",))[0])
    frames = await _read_raw_frames(sock, 4)
    by_id = {rid: (mtype, payload) for mtype, rid, payload in frames}
    assert [by_id[r][0] for r in (20, 21, 22)] == [0x03] * 3
    assert by_id[30][0] == 0x02
    sock.close()
    # An unknown message type or an oversized length: an ERROR (id 0), then the close.
    for head in (
        struct.pack(">2sBBIQ", b"GD", 1, 0x06, 0, 1),
        struct.pack(">2sBBIQ", b"GD", 1, 0x01, (64 << 20) + 1, 1),
        struct.pack(">2sBBIQ", b"GD", 2, 0x01, 0, 1),
    ):
        sock = await _raw(socket_path)
        await sock.send(head)
        data = await _read_bytes_until_closed(sock)
        [(mtype, rid, payload)] = wire.FrameSplitter().feed(data)
        assert mtype == 0x03 and rid == 0
        assert _error_of(payload)["error_type"] == "DirtyProtocolError"
        sock.close()
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(ECHO, "echo", "fine") == "fine"
    await client.close_async()


async def test_many_requests_in_flight_on_one_raw_connection(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=2, dirty_threads=2)
    sock = await _raw(socket_path)
    data = b"".join(
        wire.request_parts(rid, ECHO, "sleep" if rid % 2 else "echo", (0.2 if rid % 2 else rid,))[0]
        for rid in range(1, 11)
    )
    # and a stash and a status on the same connection, mixed in
    stash = wire.encode_dirty(0x10, 50, {"op": 9, "table": ""})
    await sock.send(data + stash + wire.encode_header(0x11, 0, 60))
    frames = await _read_raw_frames(sock, 12)
    by_id = {rid: (mtype, _protocol.decode_payload(p)) for mtype, rid, p in frames}
    assert set(by_id) == set(range(1, 11)) | {50, 60}
    for rid in range(1, 11):
        assert by_id[rid] == (0x02, {"result": 0.2 if rid % 2 else rid})
    assert by_id[60][1]["result"]["worker_count"] == 2
    sock.close()


async def test_client_disconnecting_mid_call_and_mid_stash(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1, dirty_threads=1)
    sock = await _raw(socket_path)
    await sock.send(wire.request_parts(1, ECHO, "sleep", (0.3,))[0])
    await trio.testing.wait_all_tasks_blocked()
    sock.close()  # gone before its reply
    client = dirty.DirtyClient(socket_path, timeout=10)
    with trio.fail_after(5):
        assert await client.execute_async(ECHO, "echo", "after") == "after"
        status = await client.status_async()
    assert status["worker_count"] == 1
    await client.close_async()
