"""Audit of apps/dirty's wire behaviour and stash against Gunicorn 27.0.1's dirty arbiter.

In-process wherever the code allows it: a dirty :class:`~apps.dirty.worker._server.Worker` serving
one end of a socketpair in a thread (its own asyncio loop, no signal handlers, no parent
watch), the stash's connection-side handler on a node with only the stash supervisor, and a
scripted one-connection server for the client. Real pools (``start_pool``) only for what runs
through the node's routing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from apps import dirty
from apps.dirty import _application, _connection, _protocol
from apps.dirty._protocol import CHUNK, END, ERROR, RESPONSE, STATUS
from apps.dirty.worker import _server as worker_server
from apps.dirty.worker._server import Worker

from .conftest import ECHO, LIMITED

HERE = "tests.test_apps.test_dirty.test_audit"

#: How long a reply that never comes is waited for (wall clock: a worker's threads are real).
HANG = 0.5


# ---------------------------------------------------------------------------- the apps


class ProbeApp(dirty.DirtyApp):
    """Actions for the edges probed here."""

    def init(self) -> None:
        self._model: Any = None

    @property
    def model(self) -> Any:
        """A lazily checked attribute, as apps write them: raises until a model is loaded."""
        if self._model is None:
            raise RuntimeError("no model loaded yet")
        return self._model

    def echo(self, value: Any) -> Any:
        return value

    def bad_file(self) -> None:
        # A file name from the OS (os.listdir, sys.argv, environ) that is not UTF-8.
        name = os.fsdecode(b"photo-\xff.png")
        raise ValueError(f"cannot open {name}")

    def cli(self) -> None:
        raise SystemExit(2)  # what argparse does on a bad option

    def missing_table(self) -> Any:
        raise dirty.StashTableNotFoundError("sessions")  # as stash.info() raises it in an app

    def count(self, n: int) -> Iterator[int]:
        yield from range(n)

    def exit_mid_stream(self) -> Iterator[int]:
        yield 1
        raise SystemExit(2)

    async def async_exit(self) -> None:
        raise SystemExit(2)


# ------------------------------------------------------------ an in-process dirty worker


class _QuietLoop(asyncio.SelectorEventLoop):
    """A worker's loop in a test thread: signal handlers belong to the main thread."""

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:  # type: ignore[override]
        pass


class _InProcessWorker(Worker):
    def _watch_parent(self, loop: asyncio.AbstractEventLoop) -> None:
        pass  # the test process is its own parent watch


class WorkerHarness:
    """A dirty worker hosting ``ProbeApp`` (as ``APP``) on one end of a socketpair; the test is
    the pool on the other end."""

    APP = f"{HERE}:ProbeApp"

    def __init__(self, threads: int = 1) -> None:
        app = ProbeApp()
        app.init()
        self.pool, theirs = socket.socketpair()
        self.worker = _InProcessWorker({self.APP: app}, threads, 3600.0, os.getppid())
        self.splitter = wire.FrameSplitter()
        self.held: list[tuple[int, int, bytes]] = []

        def run() -> None:
            with asyncio.Runner(loop_factory=_QuietLoop) as runner:
                runner.run(self.worker.serve(theirs))
            theirs.close()

        self.thread = threading.Thread(target=run, name="audit-worker", daemon=True)
        self.thread.start()
        [(mtype, rid, _)] = self.frames(1)  # "apps loaded"
        assert (mtype, rid) == (RESPONSE, 0)

    def frames(self, count: int, timeout: float = 5.0) -> list[tuple[int, int, bytes]]:
        """The next ``count`` frames, less the worker's STATUS notices (a request waits for a
        thread, or started in one; heartbeats are an hour apart)."""
        self.pool.settimeout(timeout)
        while len(self.held) < count:
            data = self.pool.recv(1 << 20)
            assert data, "the worker closed its socket"
            self.held += [f for f in self.splitter.feed(data) if f[0] != STATUS]
        out, self.held = self.held[:count], self.held[count:]
        return out

    def call(self, rid: int, action: str, *args: Any, timeout: float = 5.0) -> tuple[int, Any]:
        """Send a REQUEST; return the first frame answering it, as (type, decoded payload)."""
        self.pool.sendall(wire.request_parts(rid, self.APP, action, args)[0])
        [(mtype, got, payload)] = self.frames(1, timeout)
        assert got == rid
        return mtype, _protocol.decode_payload(payload)

    def close(self) -> None:
        loop = getattr(self.worker, "loop", None)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.worker.stop.set)
        self.thread.join(5)
        self.pool.close()


@pytest.fixture
def worker() -> Iterator[WorkerHarness]:
    harness = WorkerHarness()
    try:
        yield harness
    finally:
        harness.close()


def _error_class(mtype: int, body: Any) -> str:
    assert mtype == ERROR, (mtype, body)
    return str(body["error"]["error_type"])


# ------------------------------------------------------- worker: dispatch and error frames


def test_worker_error_frames_have_gunicorns_fields(worker: WorkerHarness) -> None:
    """An app error is ``{error: {error_type, message, details: {app_path, action,
    traceback}}}``; a refused private or non-callable action is a DirtyAppError too; kwargs
    reach the action; the id 2**64-1 is echoed (the pool's own ids to a worker start at 1:
    0 is the worker's "loaded" and heartbeat id); a stream is CHUNKs then END."""
    mtype, body = worker.call(7, "echo", "x")
    assert (mtype, body) == (RESPONSE, {"result": "x"})
    for rid in (2**64 - 1, 1):
        worker.pool.sendall(wire.request_parts(rid, worker.APP, "echo", (), {"value": str(rid)})[0])
        [(mtype, got, payload)] = worker.frames(1)
        assert (mtype, got) == (RESPONSE, rid)
        assert _protocol.decode_payload(payload) == {"result": str(rid)}
    for action in ("_model", "__class__", "workers", "stashes", "no_such"):
        mtype, body = worker.call(9, action)
        error = body["error"]
        assert _error_class(mtype, body) == "DirtyAppError"
        assert error["message"] == f"Unknown action: {action}"
        assert error["details"]["app_path"] == worker.APP
        assert error["details"]["action"] == action
        assert "ValueError: Unknown action" in error["details"]["traceback"]
    # a stream, then the worker still answers
    worker.pool.sendall(wire.request_parts(11, worker.APP, "count", (2,))[0])
    streamed = [(t, r) for t, r, _ in worker.frames(3)]
    assert streamed == [(CHUNK, 11), (CHUNK, 11), (END, 11)]


def test_an_action_naming_a_raising_property_is_an_app_error(worker: WorkerHarness) -> None:
    mtype, body = worker.call(1, "model", timeout=HANG)
    assert _error_class(mtype, body) == "DirtyAppError"
    assert worker.call(2, "echo", "still serving", timeout=HANG) == (
        RESPONSE,
        {"result": "still serving"},
    )


def test_an_error_message_with_a_lone_surrogate_still_reaches_the_caller(
    worker: WorkerHarness,
) -> None:
    mtype, body = worker.call(1, "bad_file", timeout=HANG)
    assert _error_class(mtype, body) == "DirtyAppError"
    assert "photo-" in body["error"]["message"]


def test_an_action_raising_system_exit_is_answered(worker: WorkerHarness) -> None:
    mtype, body = worker.call(1, "cli", timeout=HANG)
    assert mtype == ERROR
    assert body["error"]["error_type"] in ("DirtyAppError", "DirtyWorkerError")


def test_system_exit_in_a_stream_or_an_async_action_is_an_app_error(
    worker: WorkerHarness,
) -> None:
    worker.pool.sendall(wire.request_parts(1, worker.APP, "exit_mid_stream", ())[0])
    [(chunk, _, _), (mtype, _, payload)] = worker.frames(2)
    assert chunk == CHUNK
    assert _error_class(mtype, _protocol.decode_payload(payload)) == "DirtyAppError"
    mtype, body = worker.call(2, "async_exit")
    assert _error_class(mtype, body) == "DirtyAppError"
    assert "SystemExit" in body["error"]["details"]["traceback"]
    assert worker.call(3, "echo", "still serving") == (RESPONSE, {"result": "still serving"})


def test_error_frames_escape_what_utf8_cannot_carry() -> None:
    """A lone surrogate in the message or a detail is sent backslash-escaped; a detail that
    cannot be encoded at all is left out; the error still goes out."""
    bad = os.fsdecode(b"\xff.png")
    error = dirty.DirtyAppError(f"cannot open {bad}", app_path="a:B", traceback=f"in {bad}")
    error.details["odd"] = {1, 2}  # no wire form
    [(mtype, rid, payload)] = wire.FrameSplitter().feed(_protocol.error_bytes(4, error))
    assert (mtype, rid) == (ERROR, 4)
    assert _protocol.decode_payload(payload)["error"] == {
        "error_type": "DirtyAppError",
        "message": "cannot open \\udcff.png",
        "details": {"app_path": "a:B", "traceback": "in \\udcff.png"},
    }


def test_unknown_action_names_are_not_remembered(worker: WorkerHarness) -> None:
    for rid in range(1, 201):
        worker.pool.sendall(wire.request_parts(rid, worker.APP, f"typo{rid}", ())[0])
    frames = worker.frames(200)
    assert {t for t, _, _ in frames} == {ERROR}
    assert len(worker.worker.kinds) <= 2


def test_a_dirty_error_raised_by_an_app_reaches_gunicorns_client_as_an_app_error(
    worker: WorkerHarness,
) -> None:
    gerrors: Any = pytest.importorskip("gunicorn.dirty.errors")
    mtype, body = worker.call(1, "missing_table")
    assert mtype == ERROR
    error = gerrors.DirtyError.from_dict(body["error"])
    assert isinstance(error, gerrors.DirtyAppError)
    assert error.app_path == worker.APP and error.action == "missing_table"
    assert "StashTableNotFoundError" in (error.traceback or "")


# ------------------------------------------------------------------- the client


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


# ------------------------------------------------------- through the node: ids, MANAGE


async def _raw(socket_path: str) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(socket_path)
    return sock


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


# ------------------------------------------------------------ stash, in the node only


async def _stash(
    op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
) -> tuple[int, Any]:
    """One STASH as a client sends it (``None`` fields left out); the reply's (type, body)."""
    payload = _protocol.encode(_wire_stash(op, table, key, value, pattern))[16:]
    [(mtype, rid, body)] = wire.FrameSplitter().feed(await _connection._stash(3, payload))
    assert rid == 3
    return mtype, _protocol.decode_payload(body)


def _wire_stash(op: int, table: str, key: Any, value: Any, pattern: str | None) -> Any:
    return wire.make_stash(3, op, table, key, value, pattern)


async def _result(op: int, table: str, **kw: Any) -> Any:
    mtype, body = await _stash(op, table, **kw)
    assert mtype == RESPONSE, body
    return body["result"]


@pytest.fixture
async def stash_node() -> Any:
    """A node running only the pool's stash (its supervisor, tables and manager)."""
    async with otp.open_node():
        await _application._start_stash_sup(("declared",))
        yield


async def test_stash_replies_are_gunicorns_shapes(stash_node: Any) -> None:
    """Every op's RESPONSE is what Gunicorn's arbiter answers (``keys`` in insertion order,
    an overwrite keeping its place, fnmatch globs, case-sensitive); "not found" ERRORs carry
    the table and key, and rebuild as the stash classes with their fields."""
    assert await _result(9, "") == ["declared"]  # TABLES: the declared stash
    for key in ("user:1", "b", "user:2", "User:3"):
        assert await _result(1, "t", key=key, value={"k": key}) is True  # PUT
    assert await _result(1, "t", key="b", value=None) is True  # overwrite: same place
    assert await _result(3, "t", key="user:1") is True  # DELETE
    assert await _result(3, "t", key="user:1") is False
    assert await _result(1, "t", key="user:1", value=1) is True  # back, at the end
    assert await _result(4, "t") == ["b", "user:2", "User:3", "user:1"]  # KEYS
    assert await _result(4, "t", pattern="user:*") == ["user:2", "user:1"]
    assert await _result(4, "t", pattern="[!u]*") == ["b", "User:3"]
    assert await _result(4, "t", pattern="user:[12]") == ["user:2", "user:1"]
    assert await _result(2, "t", key="b") is None  # GET of a stored None
    assert await _result(10, "t") is True  # EXISTS table
    assert await _result(10, "t", key="b") is True
    assert await _result(10, "t", key="zz") is False
    assert await _result(10, "nope") is False
    assert await _result(6, "t") == {"size": 4, "table": "t"}  # INFO
    assert await _result(5, "t") is True  # CLEAR
    assert await _result(5, "nope") is True
    assert await _result(7, "e") is True  # ENSURE
    assert await _result(7, "e") is True
    assert await _result(8, "e") is True  # DELETE_TABLE
    assert await _result(8, "e") is False
    assert await _result(9, "") == ["declared", "t"]

    mtype, body = await _stash(2, "t", key="gone")
    assert mtype == ERROR
    assert body["error"] == {
        "error_type": "StashKeyNotFoundError",
        "message": "Key not found in t: gone",
        "details": {"table": "t", "key": "gone"},
    }
    key_error = dirty.DirtyError.from_dict(body["error"])
    assert isinstance(key_error, dirty.StashKeyNotFoundError) and isinstance(key_error, KeyError)
    assert (key_error.table_name, key_error.key, str(key_error)) == (
        "t",
        "gone",
        "Key not found in t: gone",
    )
    mtype, body = await _stash(6, "nope")
    assert body["error"]["error_type"] == "StashTableNotFoundError"
    assert body["error"]["details"] == {"table": "nope"}
    table_error = dirty.DirtyError.from_dict(body["error"])
    assert isinstance(table_error, dirty.StashTableNotFoundError)
    assert table_error.table_name == "nope"
    mtype, body = await _stash(99, "t")
    assert body["error"]["error_type"] == "StashError"
    assert body["error"]["message"] == "Unknown stash operation: 99"
    assert await _result(4, "nope") == []  # KEYS of a missing table: empty, not created
    assert "nope" not in await _result(9, "")


async def test_stash_ttl_window_survives_counter_updates(
    stash_node: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """A rate-limit window: insert_new with a TTL, then update_counter; the increments keep the
    entry's expiry (the window resets on time), and a bad TTL is a StashError, never stored."""
    insert_new, incr, put_ttl = 12, 11, 14
    assert await _result(insert_new, "rl", key="ip", value={"value": 0, "ttl": 10}) is True
    for expected in (1, 2, 3):
        assert await _result(incr, "rl", key="ip", value={"incr": 1, "default": 0}) == expected
    await trio.sleep(9)
    assert await _result(2, "rl", key="ip") == 3
    await trio.sleep(2)
    assert await _result(10, "rl", key="ip") is False
    assert await _result(incr, "rl", key="ip", value={"incr": 1, "default": 0}) == 1
    for bad in (float("nan"), float("inf"), -1, 0, True, "5"):
        mtype, body = await _stash(put_ttl, "rl", key="bad", value={"value": 1, "ttl": bad})
        assert mtype == ERROR and body["error"]["error_type"] == "StashError", bad
    assert await _result(10, "rl", key="bad") is False


async def test_update_counter_past_int64_fails_without_changing_the_value(
    stash_node: Any,
) -> None:
    top = 2**63 - 1
    assert await _result(1, "c", key="n", value=top) is True
    mtype, body = await _stash(11, "c", key="n", value={"incr": 1, "default": 0})
    assert mtype == ERROR and body["error"]["error_type"] == "StashError"
    assert await _result(2, "c", key="n") == top  # unchanged by the refused increment


async def test_update_counter_refuses_a_bad_default_or_an_underflow_without_writing(
    stash_node: Any,
) -> None:
    for default, incr in (("zero", 1), (-(2**63), -1)):
        mtype, body = await _stash(11, "c", key="n", value={"incr": incr, "default": default})
        assert mtype == ERROR and body["error"]["error_type"] == "StashError", body
        assert "update_counter" in body["error"]["message"]
        assert await _result(10, "c", key="n") is False  # nothing was created


def test_an_exception_whose_str_raises_still_becomes_an_app_error() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    error = worker_server._app_error(Broken(), "m:A", "act")
    assert isinstance(error, dirty.DirtyAppError)
    assert "Broken" in str(error) and error.action == "act"
