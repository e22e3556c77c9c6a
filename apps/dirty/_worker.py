"""The dirty worker program (``python -m apps.dirty._worker_main SPEC_JSON``, run by a port).

One OS process hosting its DirtyApps, talking GD v1 frames with the pool over a socketpair end
it inherits (``pass_fds``). It runs an asyncio loop (Gunicorn's dirty worker does, so ``async
def`` actions written for Gunicorn work unchanged) and runs sync actions in ``dirty_threads``
threads, so many requests are in flight at once, matched by request id. A reader thread takes
the frames (a blocking read: no event-loop round per request); a sync action that has proved
quick (under 1 ms, three times in a row) runs right there, with no thread hand-off, while fewer
than ``dirty_threads`` sync actions run (one slow inline run sends it back to the threads), and
the replies of one read go out in one send. Heartbeats come from the loop, so a loop blocked by
an async action (or a worker stuck holding the GIL) stops them.

Worker-side protocol (private to the pool): REQUEST in; RESPONSE/ERROR/CHUNK/END out; an END
*in* abandons that request (a streaming generator is closed); a STATUS frame out (id 0) is a
heartbeat, and one with a request's id a notice that the request waits for a thread or has
started in one; a RESPONSE out with id 0 says the apps are loaded. Before it loads its apps the
worker waits for one frame from the node (the node's ``dirty_post_fork`` has run), and while it
loads it says which app (``_loading``). The worker exits when its socket closes or its parent
changes (the node died), after closing its apps; SIGTERM first lets its running calls finish
(a STATUS notice with id 0 tells the node, which routes no more calls to it and closes the
socket once they are answered); it exits at once on SIGQUIT; SIGUSR1 reopens log files; SIGINT
is ignored (the node handles Ctrl-C).
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
from ._errors import DirtyAppError, DirtyAppNotFoundError, DirtyProtocolError
from ._frames import (
    CHUNK,
    END,
    HEADER,
    QUEUED,
    REQUEST,
    RESPONSE,
    STARTED,
    FrameBuffer,
    decode_payload,
    encode,
    error_bytes,
    header,
    notice,
    reply_parts,
)
from ._lifecycle import DRAINING, loading_notice
from ._logs import reopen_log_files

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

    A frame is sent at once (one ``sendmsg`` from the calling thread) when nothing is queued,
    nobody else is sending and the loop is not gathering a batch (``cork``); otherwise, and for
    stream chunks (``write_deferred``), it is queued and the loop sends the queue (one
    ``sendmsg`` of many frames) when the batch ends or the socket has room. Order is kept:
    nothing overtakes a queued frame or a send in progress. The lock guards the queue and the
    flags only; no thread holds it while sending.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.lock = threading.Lock()
        self.queue: list[Any] = []
        self.size = 0
        self.corked = False
        self.sending = False
        #: Notified whenever a send ends while ``write_through`` callers (``through``) wait.
        self.sent = threading.Condition(self.lock)
        self.through = 0
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
        self.write_parts([data])

    def write_parts(self, parts: list[Any]) -> None:
        """Send the buffers (one frame or more) now if nothing is queued (any thread)."""
        with self.lock:
            if self.closed:
                return
            if self.queue or self.corked or self.sending:
                self._enqueue(parts)
                return
            self.sending = True
        try:
            n = self.sock.sendmsg(parts, (), _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            n = -1
        with self.lock:
            self.sending = False
            if self.through:
                self.sent.notify_all()
            if n < 0:
                self._close()
                return
            rest = _rest(parts, n)
            if rest:
                self.queue[:0] = rest
                for part in rest:
                    self.size += len(part)
            if self.queue:
                self._schedule()

    def write_through(self, data: bytes) -> None:
        """Send ``data`` (a thread's, never the loop's) and return once all of it is in the
        socket, or the socket failed: what the pool must know before the thread goes on."""
        self.write(data)
        with self.lock:
            self.through += 1
            while not self.closed and (self.sending or _holds(self.queue, data)):
                self.sent.wait(0.05)
            self.through -= 1

    def write_deferred(self, data: bytes) -> None:
        """Queue ``data``; the loop writes the queue soon, coalescing frames (any thread)."""
        with self.lock:
            if self.closed:
                return
            self.queue.append(data)
            self.size += len(data)
            if self.size >= _HIGH_WATER:
                self.room.clear()
            if self.scheduled or self.watching or self.corked or self.sending:
                return
            self.scheduled = True
        if threading.get_ident() == self.loop_thread:
            self.loop.call_soon(self.flush)
        else:
            self.loop.call_soon_threadsafe(self.flush)

    def cork(self) -> None:
        """Reader side: gather what is written until :meth:`uncork` (one send for a batch)."""
        self.corked = True

    def uncork(self) -> None:
        """Reader side: send what was gathered since :meth:`cork`."""
        with self.lock:
            self.corked = False
            go = bool(self.queue) and not self.watching and not self.sending
        if go:
            self.flush()

    def _enqueue(self, parts: Any) -> None:
        # Called with the lock held.
        self.queue.extend(parts)
        for part in parts:
            self.size += len(part)
        if self.size >= _HIGH_WATER:
            self.room.clear()
        if not self.corked and not self.sending:
            self._schedule()

    def _schedule(self) -> None:
        # Called with the lock held: the loop will flush the queue.
        if self.scheduled or self.watching:
            return
        self.scheduled = True
        if threading.get_ident() == self.loop_thread:
            self.loop.call_soon(self.flush)
        else:
            self.loop.call_soon_threadsafe(self.flush)

    def _close(self) -> None:
        # Called with the lock held: the socket failed.
        self.closed = True
        self.queue = []
        self.size = 0
        self._roomy(True)
        self._unwatch()

    def flush(self) -> None:
        """Write what is queued (the loop, or the reader thread ending a batch); if the socket
        is full, the loop waits for room and writes the rest."""
        with self.lock:
            self.scheduled = False
            if self.sending:
                return  # the sending thread schedules a flush when it is done
            if self.closed or not self.queue:
                self._unwatch()
                self._roomy(True)
                return
            queue, self.queue = self.queue, []
            self.sending = True
        failed = False
        sent = 0
        while queue:
            batch = queue[:_IOV_MAX]
            try:
                n = self.sock.sendmsg(batch, (), _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                failed = True
                break
            sent += n
            rest = _rest(batch, n)
            del queue[: len(batch)]
            if rest:
                queue[:0] = rest
                break
        with self.lock:
            self.sending = False
            if self.through:
                self.sent.notify_all()
            if failed:
                self._close()
                return
            self.size -= sent
            if queue:
                self.queue[:0] = queue
            if not self.queue:
                self.size = 0
                self._unwatch()
            elif not queue:
                self._schedule()  # written meanwhile by threads: the socket has room
            elif not self.watching:
                if threading.get_ident() == self.loop_thread:
                    self.watching = True
                    self.loop.add_writer(self.fd, self.flush)
                else:
                    self._schedule()  # the loop's flush waits for room
            if self.size < _HIGH_WATER:
                self._roomy(not self.size)

    def _roomy(self, drained: bool) -> None:
        # Called with the lock held: below the high-water mark (and ``drained``: all sent).
        # The events are set only when cleared: setting a threading.Event takes its lock.
        if not self.room.is_set():
            self.room.set()
        if not self.has_room.is_set():
            self.has_room.set()
        if drained and not self.drained.is_set():
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
            if threading.get_ident() == self.loop_thread:
                self.loop.remove_writer(self.fd)
            else:
                self.loop.call_soon_threadsafe(self.loop.remove_writer, self.fd)

    def backlog(self) -> int:
        return self.size


_IOV_MAX = 1024
_DONTWAIT = socket.MSG_DONTWAIT


def _holds(queue: list[Any], data: bytes) -> bool:
    """Whether ``data`` (or what is left of it to send) is in ``queue``."""
    return any(part is data or (type(part) is memoryview and part.obj is data) for part in queue)


def _rest(parts: Any, n: int) -> list[Any]:
    """The part of ``parts`` not in the first ``n`` bytes sent."""
    for i, part in enumerate(parts):
        size = len(part)
        if n < size:
            return [memoryview(part)[n:] if n else part, *parts[i + 1 :]]
        n -= size
    return []


#: What an action may raise that the worker answers as a DirtyAppError. SystemExit (argparse on
#: a bad option) and KeyboardInterrupt are the app's own (the worker ignores SIGINT and never
#: stops by raising them); asyncio.CancelledError and GeneratorExit are not caught.
_APP_ERRORS = (Exception, SystemExit, KeyboardInterrupt)
#: At most this many (app, action) pairs are remembered (``Worker.kinds``): the names are the
#: clients', and an app with its own ``__call__`` may accept any of them.
_REMEMBERED = 4096

#: A sync action runs on the loop (no thread hand-off) once it has finished this fast
#: ``_INLINE_AFTER`` times in a row; one inline run slower than this sends it back to the
#: threads for ``_INLINE_PENALTY`` more fast runs. Never when ``dirty_threads`` sync actions
#: would then run at once.
_INLINE_MAX = 0.001

_INLINE_AFTER = 3
_INLINE_PENALTY = 50


class Worker:
    """The serving loop of one worker process."""

    def __init__(
        self,
        apps: dict[str, Any],
        threads: int,
        heartbeat: float,
        ppid: int,
        graceful: float = 30.0,
    ) -> None:
        self.apps = apps
        self.graceful = graceful
        self.terminating = False
        self.threads = threads
        self.heartbeat = heartbeat
        self.ppid = ppid
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="dirty"
        )
        self.tasks: dict[int, asyncio.Task[None]] = {}
        #: Sync requests running (or queued) in the threads, and those of them abandoned.
        self.running: set[int] = set()
        self.abandoned: set[int] = set()
        #: Sync requests waiting for a free thread (the node was told: see ``notice``).
        self.queued: set[int] = set()
        #: (app_path, action) -> "async" or "" (a sync call), for real actions only.
        self.kinds: dict[tuple[str, str], str] = {}
        #: (app_path, action) -> fast runs in a row (>= _INLINE_AFTER: run on the loop); for
        #: actions in ``kinds`` only.
        self.fast: dict[tuple[str, str], int] = {}
        self.stop = asyncio.Event()

    async def serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        # Blocking for the reader thread; every send is non-blocking (MSG_DONTWAIT).
        sock.setblocking(True)
        self.out = _Output(loop, sock)
        loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        # On the loop rather than in a signal handler, so it never runs inside a log emit.
        loop.add_signal_handler(signal.SIGUSR1, reopen_log_files)
        threading.Thread(
            target=self._watch_parent, args=(loop,), name="dirty-parent-watch", daemon=True
        ).start()
        self.out.write(encode(wire.make_response(0, {"pid": os.getpid()})))
        self.eof = loop.create_future()
        self.buffer = FrameBuffer()
        self.sock = sock
        threading.Thread(target=self._reader, name="dirty-reader", daemon=True).start()
        beat = asyncio.create_task(self._heartbeats())
        stopped = asyncio.create_task(self.stop.wait())
        await asyncio.wait({self.eof, stopped, beat}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopped, beat, *self.tasks.values()):
            task.cancel()
        self.abandoned.update(self.running)
        self.out.flush()
        await self.out.wait_drained(1.0)
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _sigterm(self) -> None:
        """Gunicorn's graceful stop: the calls running finish. The node is told (it routes no
        more calls here, and closes the socket once its calls are answered: the worker then
        stops); an idle worker, or a second SIGTERM, stops at once; ``dirty_graceful_timeout``
        bounds the wait."""
        if self.terminating or not (self.running or self.tasks or self.queued):
            self.stop.set()
            return
        self.terminating = True
        logger.info(
            "dirty worker %d: SIGTERM, finishing %d call(s) first",
            os.getpid(),
            len(self.running) + len(self.tasks),
        )
        self.out.write(notice(DRAINING, 0))
        self.loop.call_later(self.graceful + 1.0, self.stop.set)

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

    def _reader(self) -> None:
        """The reader thread: takes every frame of each read as it comes (a blocking read, no
        event-loop round per request). Quick sync actions run right here; the replies of one
        read go out in one send. Async actions and cancellations go to the loop."""
        while self._read():
            pass
        try:
            self.loop.call_soon_threadsafe(self._eof)
        except RuntimeError:
            pass  # the loop is closed: the worker is exiting

    def _eof(self) -> None:
        if not self.eof.done():
            self.eof.set_result(None)

    def _read(self) -> bool:
        """One read (reader thread); False at the end of the stream."""
        try:
            n = self.sock.recv_into(self.buffer.space())
        except InterruptedError:
            return True
        except (OSError, DirtyProtocolError):
            return False
        if not n:
            return False
        try:
            frames = self.buffer.frames(n)
        except DirtyProtocolError:
            logger.exception("dirty worker %d: the pool sent garbage", os.getpid())
            return False
        view = self.buffer.view
        out = self.out
        out.cork()
        try:
            for mtype, rid, start, stop in frames:
                if mtype == REQUEST:
                    try:
                        msg = decode_payload(view[start:stop])
                        app_path = msg["app_path"]
                        action = msg["action"]
                        if type(app_path) is not str or type(action) is not str:
                            raise KeyError
                    except DirtyProtocolError as exc:
                        out.write(error_bytes(rid, exc))
                        continue
                    except (KeyError, TypeError):
                        error = DirtyProtocolError("a REQUEST needs str app_path and action")
                        out.write(error_bytes(rid, error))
                        continue
                    self._dispatch(rid, msg, app_path, action)
                elif mtype == END:
                    self._abandon(rid)
        finally:
            out.uncork()
        return True

    def _dispatch(self, rid: int, msg: dict[str, Any], app_path: str, action: str) -> None:
        app = self.apps.get(app_path)
        key = (app_path, action)
        kind = self.kinds.get(key)
        if kind is None and app is not None:
            kind = self._kind(app, action)
            if kind is not None and len(self.kinds) < _REMEMBERED:
                self.kinds[key] = kind
        if kind == "async" or app is None:
            self.loop.call_soon_threadsafe(self._start, rid, msg)
            return
        # A sync action (or no such action: the app's ``__call__`` raises the error).
        if self.fast.get(key, 0) >= _INLINE_AFTER and len(self.running) < self.threads:
            self._run_inline(rid, app, msg, key)
        else:
            # A thread runs it and writes its reply itself. One that must wait for a thread
            # says so, and again when it starts (dirty_timeout counts from then).
            if len(self.running) >= self.threads:
                self.queued.add(rid)
                self.out.write(notice(QUEUED, rid))
            self.running.add(rid)
            self.executor.submit(self._run_sync, rid, app, msg, key)

    def _start(self, rid: int, msg: dict[str, Any]) -> None:
        self.tasks[rid] = asyncio.create_task(self._handle(rid, msg))

    def _abandon(self, rid: int) -> None:
        """(Reader thread.) A sync call's thread sees ``abandoned``; a task is cancelled."""
        if rid in self.running:
            self.abandoned.add(rid)
        try:
            self.loop.call_soon_threadsafe(self._cancel, rid)
        except RuntimeError:
            pass  # the loop is closed: the worker is exiting, its tasks are gone

    def _cancel(self, rid: int) -> None:
        task = self.tasks.get(rid)
        if task is not None:
            task.cancel()

    def _kind(self, app: Any, action: str) -> str | None:
        """How ``action`` runs: "async" (an async method, on the loop), "" (a sync method, or
        the app's own ``__call__`` decides, in a thread), or None: no such public method (run
        as a sync call, whose ``__call__`` raises the error the caller gets)."""
        if type(app).__call__ is not DirtyApp.__call__:
            return ""
        if action.startswith("_"):
            return None
        try:
            method = getattr(app, action, None)
        except Exception:
            return None  # a property that raises: it raises again in the call, as its reply
        if not callable(method):
            return None
        if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
            return "async"
        return ""

    def _method(self, app: Any, action: str) -> Any:
        """The bound method an unmodified ``DirtyApp.__call__`` would run, if it is async."""
        if type(app).__call__ is not DirtyApp.__call__ or action.startswith("_"):
            return None
        method = getattr(app, action, None)
        if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
            return method
        return None

    def _run_inline(self, rid: int, app: Any, msg: dict[str, Any], key: tuple[str, str]) -> None:
        """On the reader thread: run a sync action known to be quick; its reply joins the
        batch."""
        app_path, action = key
        args = msg.get("args") or []
        kwargs = msg.get("kwargs") or {}
        began = time.perf_counter()
        try:
            result = app(action, *args, **kwargs)
        except _APP_ERRORS as exc:
            self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
            return
        finally:
            if time.perf_counter() - began > _INLINE_MAX:
                self.fast[key] = -_INLINE_PENALTY
        if inspect.iscoroutine(result) or inspect.isasyncgen(result):
            self.loop.call_soon_threadsafe(self._finish_on_loop, rid, result, app_path, action)
        elif inspect.isgenerator(result):
            self.running.add(rid)
            self.executor.submit(self._iterate, rid, result, app_path, action)  # type: ignore[arg-type]
        else:
            self._respond(rid, result, app_path, action)

    def _respond(self, rid: int, result: Any, app_path: str, action: str) -> None:
        try:
            parts = reply_parts(RESPONSE, rid, result)
        except wire.WireError as exc:
            self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
            return
        self.out.write_parts(parts)

    def _run_sync(self, rid: int, app: Any, msg: dict[str, Any], key: tuple[str, str]) -> None:
        """In a thread: run a sync action and write its reply (or stream its chunks)."""
        app_path, action = key
        handed_over = False
        try:
            if rid in self.abandoned:
                return
            if rid in self.queued:
                self.queued.discard(rid)
                # In the socket before the action runs: if this worker is killed, the pool
                # hands the calls it has no STARTED for to another worker (they never ran).
                self.out.write_through(notice(STARTED, rid))
            args = msg.get("args") or []
            kwargs = msg.get("kwargs") or {}
            began = time.perf_counter()
            result = app(action, *args, **kwargs)
            if key in self.kinds:  # (only remembered actions run inline: ``fast`` is bounded)
                runs = self.fast.get(key, 0)
                quick = time.perf_counter() - began <= _INLINE_MAX
                self.fast[key] = runs + 1 if quick else min(0, runs)
            if inspect.iscoroutine(result) or inspect.isasyncgen(result):
                handed_over = True
                self.running.discard(rid)
                self.abandoned.discard(rid)
                self.loop.call_soon_threadsafe(self._finish_on_loop, rid, result, app_path, action)
                return
            if inspect.isgenerator(result):
                self._stream_in_thread(rid, result, app_path, action)  # type: ignore[arg-type]
            elif rid not in self.abandoned:
                self._respond(rid, result, app_path, action)
        except _APP_ERRORS as exc:
            if rid not in self.abandoned:
                self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
        finally:
            self.queued.discard(rid)
            if not handed_over:
                self.running.discard(rid)
                self.abandoned.discard(rid)

    def _iterate(
        self, rid: int, gen: Generator[Any, None, None], app_path: str, action: str
    ) -> None:
        """In a thread: stream a generator an inline call returned."""
        try:
            if rid not in self.abandoned:
                self._stream_in_thread(rid, gen, app_path, action)
            else:
                gen.close()
        finally:
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
        except _APP_ERRORS as exc:
            self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
        finally:
            self.tasks.pop(rid, None)

    async def _reply(self, rid: int, result: Any, app_path: str, action: str) -> None:
        if inspect.isgenerator(result):
            await self._stream_sync(rid, result, app_path, action)  # type: ignore[arg-type]
        elif inspect.isasyncgen(result):
            await self._stream_async(rid, result, app_path, action)  # type: ignore[arg-type]
        else:
            self._respond(rid, result, app_path, action)

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
            self.out.write(error_bytes(rid, exc))
        except _APP_ERRORS as exc:
            self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
        finally:
            self.tasks.pop(rid, None)

    async def _stream_async(
        self, rid: int, gen: AsyncGenerator[Any, None], app_path: str, action: str
    ) -> None:
        out = self.out
        try:
            try:
                async for item in gen:
                    out.write_deferred(_chunk(rid, item))
                    await out.wait_room()
            finally:
                await gen.aclose()
        except asyncio.CancelledError:
            raise
        except _APP_ERRORS as exc:
            out.write_deferred(error_bytes(rid, _app_error(exc, app_path, action)))
            return
        out.write_deferred(header(END, 0, rid))

    def _stream_in_thread(
        self, rid: int, gen: Generator[Any, None, None], app_path: str, action: str
    ) -> None:
        """In a thread: stream a sync generator's items as CHUNK frames, then END."""
        out = self.out
        abandoned = self.abandoned
        room = out.room
        write = out.write_deferred
        try:
            for item in gen:
                write(_chunk(rid, item))
                if not room.is_set():
                    while not room.wait(0.05):
                        if rid in abandoned:
                            break
                if rid in abandoned:
                    return
        except _APP_ERRORS as exc:
            if rid not in abandoned:
                write(error_bytes(rid, _app_error(exc, app_path, action)))
            return
        finally:
            gen.close()
        write(header(END, 0, rid))

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


_CHUNK_HEAD = b"\x21\x00\x00\x00\x01" + wire.tlv_encode("data", version=1)
_tlv_encode = wire.tlv_encode
_pack_header = HEADER.pack


def _chunk(rid: int, item: Any) -> bytes:
    """A CHUNK frame's bytes (``encode(wire.make_chunk(rid, item))``)."""
    body = _CHUNK_HEAD + _tlv_encode(item, version=1, coerce_keys=True)
    if len(body) > wire.MAX_PAYLOAD:
        return b"".join(reply_parts(CHUNK, rid, item))  # raises the LimitExceeded
    return _pack_header(b"GD", 1, CHUNK, len(body), rid) + body


def _app_error(exc: BaseException, app_path: str, action: str) -> DirtyAppError:
    """What an action raised, as Gunicorn's worker sends it: a DirtyAppError with ``str(exc)``
    and the traceback (which names the original class), a DirtyError from the app included
    (a StashError, say), so both clients can catch every app failure as DirtyAppError."""
    tb = "".join(traceback.format_exception(exc))
    try:
        message = str(exc)
    except Exception:  # (its own __str__ is broken: the caller must still get an answer)
        message = f"<{type(exc).__name__}: str() failed>"
    logger.debug("error executing %s.%s: %s\n%s", app_path, action, message, tb)
    return DirtyAppError(message, app_path=app_path, action=action, traceback=tb)


def _load_hook(path: str | None) -> Any:
    if not path:
        return None
    import importlib

    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _exit_if_orphaned_while(done: threading.Event, ppid: int) -> None:
    """Until ``done`` is set: exit at once if the node (``ppid``) dies."""
    while not done.wait(_PARENT_POLL):
        if os.getppid() != ppid:
            logger.warning("dirty worker %d: the node died while it loaded its apps", os.getpid())
            os._exit(1)


def _await_go(sock: socket.socket) -> bool:
    """Wait for the node's go-ahead (it has run ``dirty_post_fork``); False if it closed."""
    got = b""
    while len(got) < HEADER.size:
        try:
            part = sock.recv(HEADER.size - len(got))
        except InterruptedError:
            continue
        if not part:
            return False
        got += part
    return True


def _load_apps(sock: socket.socket, paths: list[str]) -> dict[str, Any]:
    """Gunicorn's order: every app's ``__init__``, then every app's ``init()``; the node is told
    which app is loading (its progress log) and, on failure, the app's traceback.

    Raises:
        Exception: What the app raised (reported to the node first).
    """
    apps: dict[str, Any] = {}
    current = ""
    try:
        for current in paths:
            sock.sendall(loading_notice(current))
            apps[current] = load_dirty_app(current)
        for current, app in apps.items():
            sock.sendall(loading_notice(current))
            app.init()
    except Exception as exc:
        tb = "".join(traceback.format_exception(exc))
        error = DirtyAppError(
            f"{current} failed to load: {type(exc).__name__}: {exc}",
            app_path=current,
            traceback=tb,
        )
        try:
            sock.sendall(error_bytes(0, error))
        except OSError:
            pass  # the node is gone
        raise
    return apps


def main(argv: list[str]) -> int:
    """Run a worker from its JSON spec (argv[0]); returns the exit status."""
    spec = json.loads(argv[0])
    logging.basicConfig(
        level=spec.get("log_level", "INFO"),
        format=f"%(asctime)s %(levelname)s dirty-worker[{os.getpid()}] %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, lambda *_: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: reopen_log_files())
    sock = socket.socket(fileno=int(spec["fd"]))
    sock.setblocking(True)
    # Parent-death detection from the start: a worker still loading its apps (a model, say)
    # when the node dies must not be left behind.
    loading = threading.Event()
    threading.Thread(
        target=_exit_if_orphaned_while,
        args=(loading, int(spec["ppid"])),
        name="dirty-parent-watch-load",
        daemon=True,
    ).start()
    info = DirtyWorkerInfo(int(spec["worker_id"]), os.getpid(), tuple(spec["apps"]))
    if not _await_go(sock):
        return 0  # the node stopped before the worker was let go
    try:
        apps = _load_apps(sock, list(spec["apps"]))
        hook = _load_hook(spec.get("worker_init"))
        if hook is not None:
            hook(info)
    except Exception:
        logger.exception("dirty worker %d: loading its apps failed", info.worker_id)
        return 3
    loading.set()  # (the Worker watches its parent from here on)
    worker = Worker(
        apps,
        int(spec["threads"]),
        float(spec["heartbeat"]),
        int(spec["ppid"]),
        float(spec.get("graceful", 30.0)),
    )
    try:
        asyncio.run(worker.serve(sock))
    finally:
        for path, app in apps.items():
            try:
                app.close()
            except Exception:
                logger.exception("dirty app %s: close() failed", path)
    return 0
