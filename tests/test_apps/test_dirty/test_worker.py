"""The dirty worker program serving one end of a socketpair in a thread (its own asyncio loop):
error frames with Gunicorn's fields, actions that raise, SystemExit, unknown action names."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import wire
from apps import dirty
from apps.dirty import _protocol
from apps.dirty._protocol import CHUNK, END, ERROR, RESPONSE, STATUS
from apps.dirty.worker import _server as worker_server
from apps.dirty.worker._output import Output
from apps.dirty.worker._server import Worker

from .conftest import APPS
from .dirty_apps import ProbeApp

#: How long a reply that never comes is waited for (wall clock: a worker's threads are real).
HANG = 0.5


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

    APP = f"{APPS}:ProbeApp"

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


def test_a_result_goes_out_as_wires_own_response_bytes_up_to_the_depth_limit(
    worker: WorkerHarness,
) -> None:
    """The worker writes a RESPONSE's bytes itself (no frame built): byte for byte what
    ``wire.reply_parts`` makes, for the first calls of an action (in a thread) and the later
    ones (inline), a large ``bytes`` or str included; a result that nests too deep for the
    payload's limit is a DirtyAppError, as wire refuses it."""
    limit = wire.Limits().max_depth
    cases: list[tuple[str, Any]] = [
        ("echo", "x"),
        ("echo", {"a": [1, 2.5, None, True, b"\x00"]}),
        ("echo", b"y" * (wire.BIG_BYTES + 1)),
        ("echo", "z" * (wire.BIG_BYTES + 1)),
        *(("nested", depth) for depth in range(limit - 3, limit + 2)),
    ]
    rid = 100
    for action, arg in cases:
        try:
            expected: bytes | None = b"".join(
                bytes(p) for p in wire.reply_parts(RESPONSE, 0, getattr(ProbeApp(), action)(arg))
            )[16:]
        except wire.WireError:
            expected = None
        for _ in range(5):  # (an action runs inline once it has been quick 3 times)
            rid += 1
            request = wire.request_parts(rid, worker.APP, action, (arg,))
            worker.pool.sendall(b"".join(bytes(p) for p in request))
            [(mtype, got, payload)] = worker.frames(1)
            assert got == rid
            if expected is None:
                assert _error_class(mtype, _protocol.decode_payload(payload)) == "DirtyAppError"
            else:
                assert (mtype, payload) == (RESPONSE, expected)
    assert worker.worker.fast, "the later calls ran inline"


def test_an_inline_action_is_looked_up_on_every_call_as_dirty_apps_call_does(
    worker: WorkerHarness,
) -> None:
    """Once quick, a method runs inline, called directly rather than through
    ``DirtyApp.__call__``: it is still looked up on every call, so an instance attribute that
    replaces it is what runs, and one that is not callable is an unknown action."""
    for rid in range(1, 6):
        assert worker.call(rid, "step") == (RESPONSE, {"result": "method"})
    assert worker.worker.fast[(worker.APP, "step")] >= 3, "step runs inline now"
    assert worker.call(6, "rebind", True) == (RESPONSE, {"result": None})
    assert worker.call(7, "step") == (RESPONSE, {"result": "rebound"})
    assert worker.call(8, "rebind", False) == (RESPONSE, {"result": None})
    mtype, body = worker.call(9, "step")
    assert _error_class(mtype, body) == "DirtyAppError"
    assert body["error"]["message"] == "Unknown action: step"


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


def test_an_exception_whose_str_raises_still_becomes_an_app_error() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    error = worker_server._app_error(Broken(), "m:A", "act")
    assert isinstance(error, dirty.DirtyAppError)
    assert "Broken" in str(error) and error.action == "act"


def test_a_reply_the_socket_takes_in_part_goes_out_whole_before_the_next() -> None:
    # Output.write sends a lone frame at once; what the socket does not take is queued first,
    # and the loop sends it (then what was written behind it) as the socket takes it. The
    # Output makes its socket non-blocking (it writes the descriptor itself).
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    try:
        out = Output(loop, ours)
        assert not ours.getblocking()
        first, second = b"a" * (8 << 20), b"b" * 100
        out.write(first)
        assert out.queue, "the socket took all of it: the test needs a larger frame"
        out.write(second)
        got = bytearray()

        def read() -> None:
            while len(got) < len(first) + len(second):
                got.extend(theirs.recv(1 << 20))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        loop.run_until_complete(out.wait_drained(10.0))
        reader.join(10)
        assert bytes(got) == first + second
        assert not out.queue and not out.size
    finally:
        loop.close()
        ours.close()
        theirs.close()
