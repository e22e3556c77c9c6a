"""The serving loop of one worker process (:class:`Worker`): requests read by a reader thread,
sync actions in ``dirty_threads`` threads (or inline once proved quick), async actions and
streams on the asyncio loop, replies batched per read. See the package's docstring.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import select
import signal
import socket
import threading
import time
import traceback
import types
from collections.abc import AsyncGenerator, Generator
from typing import Any

import wire

from .._app import DirtyApp
from .._errors import DirtyAppError, DirtyAppNotFoundError, DirtyProtocolError
from .._lifecycle import DRAINING
from .._logs import reopen_log_files
from .._protocol import (
    CHUNK,
    END,
    QUEUED,
    REQUEST,
    RESPONSE,
    STARTED,
    decode_payload,
    encode,
    error_bytes,
    notice,
)
from ._output import Output

logger = logging.getLogger("apps.dirty.worker")

#: How often a worker checks that the node (its parent) is alive, in seconds.
PARENT_POLL = 0.2
#: How long an orphaned worker gets to close its apps before it exits regardless.
_ORPHAN_GRACE = 2.0


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
#: ``Worker.kinds``' mark of a sync public method of an app whose ``__call__`` is DirtyApp's.
_METHOD = "method"
_perf_counter = time.perf_counter
_readv = os.readv


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
        #: (app_path, action) -> "async", or a sync call: ``_METHOD`` (a method run directly
        #: inline) or "" (the app's own ``__call__``); for real actions only (see ``_kind``).
        self.kinds: dict[tuple[str, str], str] = {}
        #: (app_path, action) -> fast runs in a row (>= _INLINE_AFTER: run on the loop); for
        #: actions in ``kinds`` only.
        self.fast: dict[tuple[str, str], int] = {}
        self.stop = asyncio.Event()
        #: (Reader thread.) While a read of many frames is taken, the inline replies to send
        #: together once it is (see ``_read``).
        self.replies: list[bytes] | None = None

    async def serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.attach(sock)
        self.out = Output(loop, sock)
        loop.add_signal_handler(signal.SIGTERM, self._sigterm)
        # On the loop rather than in a signal handler, so it never runs inside a log emit.
        loop.add_signal_handler(signal.SIGUSR1, reopen_log_files)
        threading.Thread(
            target=self._watch_parent, args=(loop,), name="dirty-parent-watch", daemon=True
        ).start()
        self.out.write(encode(wire.make_response(0, {"pid": os.getpid()})))
        self.eof = loop.create_future()
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

    def attach(self, sock: socket.socket) -> None:
        """Make ``sock`` the one :meth:`_read` reads: non-blocking (the reader thread waits in
        ``poll``; every send is non-blocking anyway)."""
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.buffer = wire.FrameBuffer(error=DirtyProtocolError)
        #: (Reader thread.) Waits for input: a thread blocked in a read of a Unix socket is
        #: woken, for nothing, each time the node takes our replies off it (the kernel wakes
        #: every waiter of the socket when its write space grows): most reads once. ``poll``
        #: for input wakes only when input comes (a system call a read more, half the thread
        #: switches).
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

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
            time.sleep(PARENT_POLL)
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
        """The reader thread: takes every frame of each read as it comes (a wait in ``poll``,
        then a read: no event-loop round per request). Quick sync actions run right here; the
        replies of one read go out in one send. Async actions and cancellations go to the loop."""
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
            self.poller.poll()
            # (readv: socket.recv_into parses its arguments by keyword, ~1k instructions a read)
            n = _readv(self.fd, [self.buffer.space()])
        except (BlockingIOError, InterruptedError):
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
        if len(frames) == 1:
            # One frame (a lone caller's request, the common case): no batch to gather, so
            # its reply goes out from the write itself (no cork, queue and flush).
            mtype, rid, start, stop = frames[0]
            self._take(mtype, rid, view, start, stop)
            return True
        out = self.out
        out.cork()
        # The inline replies are gathered here, not written one by one (each write takes the
        # Output's lock and queues): they go out in one buffer once the read is taken.
        replies: list[bytes] = []
        self.replies = replies
        try:
            for mtype, rid, start, stop in frames:
                self._take(mtype, rid, view, start, stop)
        finally:
            self.replies = None
            out.uncork()
            if replies:
                out.write(replies[0] if len(replies) == 1 else b"".join(replies))
        return True

    def _take(self, mtype: int, rid: int, view: memoryview, start: int, stop: int) -> None:
        """(Reader thread.) One frame from the node: a REQUEST runs (or is dispatched), an
        END abandons its call."""
        if mtype != REQUEST:
            if mtype == END:
                self._abandon(rid)
            return
        # (Every client's REQUEST in one step; anything else is decoded below, which names it.)
        fields = _request_fields(view, start, stop)
        msg: dict[str, Any] | None
        if fields is None:
            try:
                msg = decode_payload(view[start:stop])
                app_path = msg["app_path"]
                action = msg["action"]
                if type(app_path) is not str or type(action) is not str:
                    raise KeyError
            except DirtyProtocolError as exc:
                self.out.write(error_bytes(rid, exc))
                return
            except (KeyError, TypeError):
                error = DirtyProtocolError("a REQUEST needs str app_path and action")
                self.out.write(error_bytes(rid, error))
                return
            args = msg.get("args") or []
            kwargs = msg.get("kwargs") or {}
        else:
            app_path, action, args, kwargs = fields
            msg = None
        key = (app_path, action)
        # (An action proved quick is a remembered one: its app and kind are known.)
        if self.fast.get(key, 0) >= _INLINE_AFTER and len(self.running) < self.threads:
            self._run_inline(rid, self.apps[app_path], args, kwargs, key)
        else:
            if msg is None:
                msg = {"app_path": app_path, "action": action, "args": args, "kwargs": kwargs}
            self._dispatch(rid, msg, app_path, action)

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
        # A sync action (or no such action: the app's ``__call__`` raises the error). A quick
        # one was run inline by ``_take``; a thread runs this one and writes its reply itself.
        # One that must wait for a thread says so, and again when it starts (dirty_timeout
        # counts from then).
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
        """How ``action`` runs: "async" (an async method, on the loop), ``_METHOD`` (a sync
        method of an app whose ``__call__`` is ``DirtyApp``'s), "" (the app's own ``__call__``
        decides), both sync calls (in a thread, or inline once proved quick), or None: no such
        public method (run as a sync call, whose ``__call__`` raises the error the caller
        gets)."""
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
        return _METHOD

    def _method(self, app: Any, action: str) -> Any:
        """The bound method an unmodified ``DirtyApp.__call__`` would run, if it is async."""
        if type(app).__call__ is not DirtyApp.__call__ or action.startswith("_"):
            return None
        method = getattr(app, action, None)
        if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
            return method
        return None

    def _run_inline(self, rid: int, app: Any, args: Any, kwargs: Any, key: tuple[str, str]) -> None:
        """On the reader thread: run a sync action known to be quick; its reply joins the
        batch. An app whose ``__call__`` is ``DirtyApp``'s (``kinds``: ``_METHOD``) has the
        method it would look up and run run here (looked up on every call, as ``__call__``
        does)."""
        app_path, action = key
        began = _perf_counter()
        try:
            method = getattr(app, action, None) if self.kinds[key] == _METHOD else None
            if method is not None and callable(method):
                result = method(*args, **kwargs)
            else:
                result = app(action, *args, **kwargs)
        except _APP_ERRORS as exc:
            self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
            return
        finally:
            if _perf_counter() - began > _INLINE_MAX:
                self.fast[key] = -_INLINE_PENALTY
        if type(result) not in _LATER:
            try:
                frame = _encode_dirty(RESPONSE, rid, {"result": result}, _SMALL_PAYLOAD)
            except wire.WireError:
                self._respond(rid, result, app_path, action)  # (it names what is wrong)
                return
            replies = self.replies
            if replies is not None:
                replies.append(frame)
            else:
                self.out.write(frame)
        elif inspect.iscoroutine(result) or inspect.isasyncgen(result):
            self.loop.call_soon_threadsafe(self._finish_on_loop, rid, result, app_path, action)
        else:
            self.running.add(rid)
            self.executor.submit(self._iterate, rid, result, app_path, action)

    def _respond(self, rid: int, result: Any, app_path: str, action: str) -> None:
        try:
            frame = _encode_dirty(RESPONSE, rid, {"result": result}, _SMALL_PAYLOAD)
        except wire.WireError:
            # Large (a big bytes goes by reference), or over a limit: the exact encoding says.
            try:
                parts = wire.reply_parts(RESPONSE, rid, result)
            except wire.WireError as exc:
                self.out.write(error_bytes(rid, _app_error(exc, app_path, action)))
                return
            self.out.write_parts(parts)
            return
        self.out.write(frame)

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
        out.write_deferred(wire.encode_header(END, 0, rid))

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
        write(wire.encode_header(END, 0, rid))

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
#: A reply's payload below ``wire.BIG_BYTES``: larger ones go out as ``wire.reply_parts`` (a
#: large bytes by reference).
_SMALL_PAYLOAD = wire.BIG_BYTES - 1
_encode_dirty = wire.encode_dirty
_request_fields = wire.request_fields
#: What an action returns that is not its result yet: a coroutine or async generator (run on
#: the loop) or a generator (a stream); one set lookup for the common case, a plain value (none
#: of these types can be subclassed, so the exact type says).
_LATER = frozenset((types.CoroutineType, types.AsyncGeneratorType, types.GeneratorType))
_tlv_encode = wire.tlv_encode
_encode_header = wire.encode_header


def _chunk(rid: int, item: Any) -> bytes:
    """A CHUNK frame's bytes (``encode(wire.make_chunk(rid, item))``)."""
    body = _CHUNK_HEAD + _tlv_encode(item, version=1, coerce_keys=True)
    if len(body) > wire.MAX_PAYLOAD:
        return b"".join(wire.reply_parts(CHUNK, rid, item))  # raises the LimitExceeded
    return _encode_header(CHUNK, len(body), rid) + body


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
