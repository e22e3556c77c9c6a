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
    """The worker's end of its socket, written from the loop and from action threads.

    A frame is sent at once (one ``send`` from the calling thread, under a lock) when nothing is
    queued; otherwise, and for stream chunks (``write_deferred``), it is queued and the loop
    writes the queue, coalesced, when the socket has room. Order is kept: nothing overtakes a
    queued frame.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.lock = threading.Lock()
        self.queue: list[Any] = []
        self.size = 0
        self.scheduled = False
        self.watching = False
        self.closed = False
        self.room = threading.Event()
        self.room.set()
        #: Loop-side waits (set by ``flush`` only): room below the high-water mark; all sent.
        self.has_room = asyncio.Event()
        self.drained = asyncio.Event()
        self.loop_thread = threading.get_ident()

    def write(self, data: bytes) -> None:
        """Send ``data`` now if nothing is queued (any thread)."""
        with self.lock:
            if self.closed:
                return
            if self.queue:
                self._enqueue(data)
                return
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self.closed = True
                return
            if n < len(data):
                self._enqueue(memoryview(data)[n:] if n else data)

    def write_deferred(self, data: bytes) -> None:
        """Queue ``data``; the loop writes the queue soon, coalescing frames (any thread)."""
        with self.lock:
            if not self.closed:
                self._enqueue(data)

    def _enqueue(self, data: Any) -> None:
        # Called with the lock held.
        self.queue.append(data)
        self.size += len(data)
        if self.size >= _HIGH_WATER:
            self.room.clear()
        if not self.scheduled and not self.watching:
            self.scheduled = True
            if threading.get_ident() == self.loop_thread:
                self.loop.call_soon(self.flush)
            else:
                self.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        """Write what is queued (loop thread); wait for the socket to drain if it is full."""
        with self.lock:
            self.scheduled = False
            if self.closed or not self.queue:
                self._unwatch()
                self.room.set()
                self.has_room.set()
                self.drained.set()
                return
            data = b"".join(self.queue) if len(self.queue) > 1 else self.queue[0]
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self.closed = True
                self.queue = []
                self.size = 0
                self.room.set()
                self.has_room.set()
                self.drained.set()
                self._unwatch()
                return
            if n >= len(data):
                self.queue = []
                self.size = 0
                self._unwatch()
            else:
                rest = memoryview(data)[n:]
                self.queue = [rest]
                self.size = len(rest)
                if not self.watching:
                    self.watching = True
                    self.loop.add_writer(self.fd, self.flush)
            if self.size < _HIGH_WATER:
                self.room.set()
                self.has_room.set()
            if not self.size:
                self.drained.set()

    async def wait_room(self) -> None:
        """Loop side: wait until the queue is below the high-water mark."""
        if self.size > _HIGH_WATER and not self.closed:
            self.has_room.clear()
            await self.has_room.wait()

    async def wait_drained(self, timeout: float) -> None:
        """Loop side: wait (at most ``timeout`` seconds) until everything queued is sent."""
        if self.size and not self.closed:
            self.drained.clear()
            try:
                await asyncio.wait_for(self.drained.wait(), timeout)
            except TimeoutError:
                pass

    def _unwatch(self) -> None:
        if self.watching:
            self.watching = False
            self.loop.remove_writer(self.fd)

    def backlog(self) -> int:
        return self.size


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
        #: Sync requests running (or queued) in the threads, and those of them abandoned.
        self.running: set[int] = set()
        self.abandoned: set[int] = set()
        self.stop = asyncio.Event()

    async def serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        sock.setblocking(False)
        self.out = _Output(loop, sock)
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        # On the loop rather than in a signal handler, so it never runs inside a log emit.
        loop.add_signal_handler(signal.SIGUSR1, _reopen_logs)
        threading.Thread(
            target=self._watch_parent, args=(loop,), name="dirty-parent-watch", daemon=True
        ).start()
        self.out.write(encode(wire.make_response(0, {"pid": os.getpid()})))
        self.eof = loop.create_future()
        self.splitter = FrameSplitter()
        self.sock = sock
        loop.add_reader(sock.fileno(), self._readable)
        beat = asyncio.create_task(self._heartbeats())
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait({self.eof, stopped, beat}, return_when=asyncio.FIRST_COMPLETED)
        loop.remove_reader(sock.fileno())
        for task in (stopped, beat, *self.tasks.values()):
            task.cancel()
        self.abandoned.update(self.running)
        self.out.flush()
        await self.out.wait_drained(1.0)
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

    def _readable(self) -> None:
        try:
            data = self.sock.recv(self.splitter.read_size())
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(self.sock.fileno())
            if not self.eof.done():
                self.eof.set_result(None)
            return
        for mtype, rid, payload in self.splitter.feed(data):
            if mtype == REQUEST:
                self._dispatch(rid, decode_payload(payload))
            elif mtype == END:
                self._abandon(rid)

    def _dispatch(self, rid: int, msg: dict[str, Any]) -> None:
        app_path = str(msg.get("app_path"))
        action = str(msg.get("action"))
        app = self.apps.get(app_path)
        if app is not None and self._method(app, action) is None:
            # A sync action: a thread runs it and writes its reply itself.
            self.running.add(rid)
            self.executor.submit(self._run_sync, rid, app, msg, app_path, action)
            return
        self.tasks[rid] = asyncio.create_task(self._handle(rid, msg))

    def _abandon(self, rid: int) -> None:
        if rid in self.running:
            self.abandoned.add(rid)
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

    def _run_sync(
        self, rid: int, app: Any, msg: dict[str, Any], app_path: str, action: str
    ) -> None:
        """In a thread: run a sync action and write its reply (or stream its chunks)."""
        handed_over = False
        try:
            if rid in self.abandoned:
                return
            args = msg.get("args") or []
            kwargs = msg.get("kwargs") or {}
            result = app(action, *args, **kwargs)
            if inspect.iscoroutine(result) or inspect.isasyncgen(result):
                handed_over = True
                self.running.discard(rid)
                self.abandoned.discard(rid)
                self.loop.call_soon_threadsafe(self._finish_on_loop, rid, result, app_path, action)
                return
            if inspect.isgenerator(result):
                self._stream_in_thread(rid, result, app_path, action)  # type: ignore[arg-type]
            elif rid not in self.abandoned:
                self.out.write(encode(wire.make_response(rid, result)))
        except Exception as exc:
            if rid not in self.abandoned:
                self.out.write(_error_frame(rid, _app_error(exc, app_path, action)))
        finally:
            if not handed_over:
                self.running.discard(rid)
                self.abandoned.discard(rid)

    def _finish_on_loop(self, rid: int, result: Any, app_path: str, action: str) -> None:
        self.tasks[rid] = asyncio.create_task(self._finish(rid, result, app_path, action))

    async def _finish(self, rid: int, result: Any, app_path: str, action: str) -> None:
        try:
            if inspect.iscoroutine(result):
                result = await result
            await self._reply(rid, result, app_path, action)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.out.write(_error_frame(rid, _app_error(exc, app_path, action)))
        finally:
            self.tasks.pop(rid, None)

    async def _reply(self, rid: int, result: Any, app_path: str, action: str) -> None:
        if inspect.isgenerator(result):
            await self._stream_sync(rid, result, app_path, action)  # type: ignore[arg-type]
        elif inspect.isasyncgen(result):
            await self._stream_async(rid, result, app_path, action)  # type: ignore[arg-type]
        else:
            self.out.write(encode(wire.make_response(rid, result)))

    async def _handle(self, rid: int, msg: dict[str, Any]) -> None:
        app_path = str(msg.get("app_path"))
        action = str(msg.get("action"))
        try:
            app = self.apps.get(app_path)
            if app is None:
                raise DirtyAppNotFoundError(app_path)
            args = msg.get("args") or []
            kwargs = msg.get("kwargs") or {}
            result = self._method(app, action)(*args, **kwargs)
            if inspect.iscoroutine(result):
                result = await result
            await self._reply(rid, result, app_path, action)
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
                    out.write_deferred(encode(wire.make_chunk(rid, item)))
                    await out.wait_room()
            finally:
                await gen.aclose()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out.write_deferred(_error_frame(rid, _app_error(exc, app_path, action)))
            return
        out.write_deferred(encode(wire.make_end(rid)))

    def _stream_in_thread(
        self, rid: int, gen: Generator[Any, None, None], app_path: str, action: str
    ) -> None:
        """In a thread: stream a sync generator's items as CHUNK frames, then END."""
        out = self.out
        make_chunk = wire.make_chunk
        abandoned = self.abandoned
        try:
            for item in gen:
                out.write_deferred(encode(make_chunk(rid, item)))
                while not out.room.wait(0.05):
                    if rid in abandoned:
                        break
                if rid in abandoned:
                    return
        except Exception as exc:
            if rid not in abandoned:
                out.write_deferred(_error_frame(rid, _app_error(exc, app_path, action)))
            return
        finally:
            gen.close()
        out.write_deferred(encode(wire.make_end(rid)))

    async def _stream_sync(
        self, rid: int, gen: Generator[Any, None, None], app_path: str, action: str
    ) -> None:
        self.running.add(rid)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self.executor, self._stream_in_thread, rid, gen, app_path, action
            )
        except asyncio.CancelledError:
            self.abandoned.add(rid)
            raise
        finally:
            self.running.discard(rid)
            if not self.tasks.get(rid):
                self.abandoned.discard(rid)


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
