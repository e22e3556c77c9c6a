"""The dirty worker program (``python -m apps.dirty._worker_main SPEC_JSON``, run by a port).

One OS process hosting its DirtyApps, talking GD v1 frames with the pool over a socketpair end
it inherits (``pass_fds``). It runs an asyncio loop (Gunicorn's dirty worker does, so ``async
def`` actions written for Gunicorn work unchanged) and runs sync actions in ``dirty_threads``
threads, so many requests are in flight at once, matched by request id.

Worker-side protocol (private to the pool): REQUEST in; RESPONSE/ERROR/CHUNK/END out; an END
*in* abandons that request (a streaming generator is closed); a STATUS frame out (id 0) is a
heartbeat; a RESPONSE out with id 0 says the apps are loaded. The worker exits when its socket
closes or its parent changes (the node died), on SIGTERM after closing its apps, at once on
SIGQUIT; SIGUSR1 reopens log files; SIGINT is ignored (the node handles Ctrl-C).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import logging
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import AsyncGenerator, Generator
from typing import Any

import attrs

import wire

from ._app import DirtyApp, load_dirty_app
from ._errors import DirtyAppError, DirtyAppNotFoundError, DirtyError
from ._frames import END, REQUEST, FrameSplitter, decode_payload, encode

logger = logging.getLogger("apps.dirty.worker")

#: Pending output (bytes) above which a streaming generator waits for the socket to drain.
_HIGH_WATER = 4 << 20
#: How often a worker checks that the node (its parent) is alive, in seconds.
_PARENT_POLL = 0.2
#: How long an orphaned worker gets to close its apps before it exits regardless.
_ORPHAN_GRACE = 2.0


@attrs.frozen
class DirtyWorkerInfo:
    """What hooks are told about a worker.

    Attributes:
        worker_id: The pool's number for it (a replacement keeps its predecessor's apps and id).
        pid: The worker's OS pid (None before it started).
        apps: The import paths of the apps it hosts.
    """

    worker_id: int
    pid: int | None
    apps: tuple[str, ...]


class _Output:
    """Frames waiting to be written, coalesced into one write per loop iteration."""

    def __init__(self, loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter) -> None:
        self.loop = loop
        self.writer = writer
        self.parts: list[bytes] = []
        self.scheduled = False
        self.lock = threading.Lock()
        self.room = threading.Event()
        self.room.set()

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def write_threadsafe(self, data: bytes) -> None:
        with self.lock:
            self.parts.append(data)
            if self.scheduled:
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        with self.lock:
            parts, self.parts = self.parts, []
            self.scheduled = False
        if parts and not self.writer.is_closing():
            self.writer.write(b"".join(parts))
        if self.writer.transport.get_write_buffer_size() < _HIGH_WATER:
            self.room.set()
        else:
            self.room.clear()
            self.loop.call_later(0.005, self.flush)

    def backlog(self) -> int:
        return self.writer.transport.get_write_buffer_size()


def _error_frame(rid: int, error: DirtyError) -> bytes:
    e = error.to_dict()
    return encode(wire.make_error(rid, e["error_type"], e["message"], e["details"]))


class Worker:
    """The serving loop of one worker process."""

    def __init__(self, apps: dict[str, Any], threads: int, heartbeat: float, ppid: int) -> None:
        self.apps = apps
        self.heartbeat = heartbeat
        self.ppid = ppid
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="dirty"
        )
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.abandoned: dict[int, threading.Event] = {}
        self.stop = asyncio.Event()

    async def serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        self.out = _Output(loop, writer)
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        # On the loop rather than in a signal handler, so it never runs inside a log emit.
        loop.add_signal_handler(signal.SIGUSR1, _reopen_logs)
        threading.Thread(
            target=self._watch_parent, args=(loop,), name="dirty-parent-watch", daemon=True
        ).start()
        self.out.write(encode(wire.make_response(0, {"pid": os.getpid()})))
        beat = asyncio.create_task(self._heartbeats())
        read = asyncio.create_task(self._read(reader))
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait({read, stopped, beat}, return_when=asyncio.FIRST_COMPLETED)
        for task in (read, stopped, beat, *self.tasks.values()):
            task.cancel()
        for event in self.abandoned.values():
            event.set()
        self.out.flush()
        try:
            await asyncio.wait_for(writer.drain(), 1.0)
        except (TimeoutError, OSError):
            pass
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _watch_parent(self, loop: asyncio.AbstractEventLoop) -> None:
        """Parent-death detection, in a thread so a busy loop cannot delay it: when the node
        dies the worker stops (its apps are closed), and exits at once if that takes over
        ``_ORPHAN_GRACE`` seconds."""
        while os.getppid() == self.ppid:
            time.sleep(_PARENT_POLL)
        logger.warning("dirty worker %d: the node died; exiting", os.getpid())
        try:
            loop.call_soon_threadsafe(self.stop.set)
        except RuntimeError:
            pass  # the loop is closed: the worker is exiting anyway
        time.sleep(_ORPHAN_GRACE)
        os._exit(1)

    async def _heartbeats(self) -> None:
        status = encode(wire.make_status(0))
        while True:
            await asyncio.sleep(self.heartbeat)
            self.out.write(status)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        splitter = FrameSplitter()
        while True:
            data = await reader.read(262144)
            if not data:
                return
            for mtype, rid, payload in splitter.feed(data):
                if mtype == REQUEST:
                    task = asyncio.create_task(self._handle(rid, decode_payload(payload)))
                    self.tasks[rid] = task
                elif mtype == END:
                    self._abandon(rid)

    def _abandon(self, rid: int) -> None:
        event = self.abandoned.get(rid)
        if event is not None:
            event.set()
        task = self.tasks.get(rid)
        if task is not None:
            task.cancel()

    def _method(self, app: Any, action: str) -> Any:
        """The bound method an unmodified ``DirtyApp.__call__`` would run, if it is async."""
        if type(app).__call__ is not DirtyApp.__call__ or action.startswith("_"):
            return None
        method = getattr(app, action, None)
        if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
            return method
        return None

    async def _handle(self, rid: int, msg: dict[str, Any]) -> None:
        app_path = str(msg.get("app_path"))
        action = str(msg.get("action"))
        try:
            app = self.apps.get(app_path)
            if app is None:
                raise DirtyAppNotFoundError(app_path)
            args = msg.get("args") or []
            kwargs = msg.get("kwargs") or {}
            method = self._method(app, action)
            if method is not None:
                result = method(*args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(
                    self.executor, functools.partial(app, action, *args, **kwargs)
                )
            if inspect.iscoroutine(result):
                result = await result
            if inspect.isgenerator(result):
                await self._stream_sync(rid, result, app_path, action)  # type: ignore[arg-type]
            elif inspect.isasyncgen(result):
                await self._stream_async(rid, result, app_path, action)  # type: ignore[arg-type]
            else:
                self.out.write(encode(wire.make_response(rid, result)))
        except asyncio.CancelledError:
            raise
        except DirtyAppNotFoundError as exc:
            self.out.write(_error_frame(rid, exc))
        except Exception as exc:
            self.out.write(_error_frame(rid, _app_error(exc, app_path, action)))
        finally:
            self.tasks.pop(rid, None)

    async def _stream_async(
        self, rid: int, gen: AsyncGenerator[Any, None], app_path: str, action: str
    ) -> None:
        out = self.out
        try:
            try:
                async for item in gen:
                    out.write(encode(wire.make_chunk(rid, item)))
                    if out.backlog() > _HIGH_WATER:
                        await out.writer.drain()
            finally:
                await gen.aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out.write(_error_frame(rid, _app_error(exc, app_path, action)))
            return
        out.write(encode(wire.make_end(rid)))

    async def _stream_sync(
        self, rid: int, gen: Generator[Any, None, None], app_path: str, action: str
    ) -> None:
        abandoned = threading.Event()
        self.abandoned[rid] = abandoned
        out = self.out
        make_chunk = wire.make_chunk

        def run() -> None:
            try:
                for item in gen:
                    out.write_threadsafe(encode(make_chunk(rid, item)))
                    while not out.room.wait(0.05):
                        if abandoned.is_set():
                            break
                    if abandoned.is_set():
                        return
            except Exception as exc:
                if not abandoned.is_set():
                    out.write_threadsafe(_error_frame(rid, _app_error(exc, app_path, action)))
                return
            finally:
                gen.close()
            out.write_threadsafe(encode(wire.make_end(rid)))

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, run)
        except asyncio.CancelledError:
            abandoned.set()
            raise
        finally:
            self.abandoned.pop(rid, None)


def _app_error(exc: Exception, app_path: str, action: str) -> DirtyError:
    if isinstance(exc, DirtyError):
        return exc
    tb = "".join(traceback.format_exception(exc))
    logger.debug("error executing %s.%s: %s\n%s", app_path, action, exc, tb)
    return DirtyAppError(str(exc), app_path=app_path, action=action, traceback=tb)


def _reopen_logs() -> None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.acquire()
            try:
                handler.close()
            finally:
                handler.release()


def _load_hook(path: str | None) -> Any:
    if not path:
        return None
    import importlib

    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def main(argv: list[str]) -> int:
    """Run a worker from its JSON spec (argv[0]); returns the exit status."""
    spec = json.loads(argv[0])
    logging.basicConfig(
        level=spec.get("log_level", "INFO"),
        format=f"%(asctime)s %(levelname)s dirty-worker[{os.getpid()}] %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, lambda *_: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: _reopen_logs())
    sock = socket.socket(fileno=int(spec["fd"]))
    apps: dict[str, Any] = {}
    info = DirtyWorkerInfo(int(spec["worker_id"]), os.getpid(), tuple(spec["apps"]))
    try:
        for path in spec["apps"]:
            app = load_dirty_app(path)
            app.init()
            apps[path] = app
        hook = _load_hook(spec.get("worker_init"))
        if hook is not None:
            hook(info)
    except Exception:
        logger.exception("dirty worker %d: loading its apps failed", info.worker_id)
        return 3
    worker = Worker(apps, int(spec["threads"]), float(spec["heartbeat"]), int(spec["ppid"]))
    try:
        asyncio.run(worker.serve(sock))
    finally:
        for path, app in apps.items():
            try:
                app.close()
            except Exception:
                logger.exception("dirty app %s: close() failed", path)
    return 0
