"""What the dirty pool's client transports share: reading replies out of GD v1 frames, the
errors a call raises, the fork-aware pid, and the async connection every event loop's
transport (asyncio, trio) builds on. Gunicorn's ``gunicorn.dirty.client`` has one of each.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import trio

import wire

from ._errors import (
    DirtyConnectionError,
    DirtyError,
    DirtyProtocolError,
    DirtyTimeoutError,
    error_from_dict,
)
from ._protocol import CHUNK, ERROR, REQUEST, RESPONSE, decode_payload, encode

_pid = os.getpid()


def _getpid() -> int:
    """This process's pid, without a system call per call (updated in a forked child)."""
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
#: A send's errors that say the pool closed the connection before any byte went out.
_PEER_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})


def _error_of(payload: bytes) -> DirtyError:
    try:
        body = decode_payload(payload) or {}
        error = body.get("error")
        return error_from_dict(error if isinstance(error, dict) else {})
    except DirtyProtocolError as exc:
        return exc


_CHUNK_HEAD = b"\x21\x00\x00\x00\x01" + wire.tlv_encode("data", version=1)
_CHUNK_HEAD_LEN = len(_CHUNK_HEAD)
#: The value sits one level inside the payload's dict (its key and value count as two items).
_V1_LIMITS = wire.Limits(
    max_depth=wire.Limits().max_depth - 1, max_total_items=wire.Limits().max_total_items - 2
)


def _decode_value(payload: bytes) -> Any:
    """The value of a ``{data: value}`` CHUNK payload (decoded after its fixed head).

    Raises:
        DirtyProtocolError: The value is not valid TLV.
    """
    try:
        return wire.tlv_decode(payload[_CHUNK_HEAD_LEN:], version=1, limits=_V1_LIMITS)
    except wire.WireError as exc:
        raise DirtyProtocolError(f"malformed payload: {exc}") from exc


class _Value:
    """A reply's value, taken out of its payload already (see ``wire.big_bytes``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _result(mtype: int, payload: Any) -> Any:
    """The value a final frame carries, or raise the error it carries."""
    if mtype == RESPONSE and type(payload) is bytes:
        # The common case in one step (decode_payload's checks, for a valid RESPONSE).
        try:
            body = _tlv_decode(payload, version=1)
        except wire.WireError:
            body = None
        if type(body) is dict:
            return body.get("result")
    if type(payload) is _Value:
        return payload.value
    if mtype == ERROR:
        raise _error_of(payload)
    body = decode_payload(payload)
    if mtype == RESPONSE:
        return (body or {}).get("result")
    if mtype == CHUNK:
        return (body or {}).get("data")
    raise DirtyProtocolError(f"unexpected message type 0x{mtype:02x} in a reply")


def _request(rid: int, app_path: str, action: str, args: Any, kwargs: Any) -> list[Any]:
    """A REQUEST frame as buffers (``wire.request_parts``' bytes). Without a large ``bytes``
    argument (the common case) it is one buffer, encoded in one step: the scan for one is
    all ``request_parts`` would add.

    Raises:
        DirtyProtocolError: The request cannot be encoded (nothing was sent).
    """
    try:
        for value in args:
            if type(value) is bytes and len(value) >= _BIG:
                return wire.request_parts(rid, app_path, action, args, kwargs)
        if kwargs:
            for value in kwargs.values():
                if type(value) is bytes and len(value) >= _BIG:
                    return wire.request_parts(rid, app_path, action, args, kwargs)
        payload = {"app_path": app_path, "action": action, "args": list(args), "kwargs": kwargs}
        return [_encode_dirty(REQUEST, rid, payload)]
    except wire.WireError as exc:
        raise _unsendable(exc) from exc


_BIG = wire.BIG_BYTES
_encode_dirty = wire.encode_dirty
_tlv_decode = wire.tlv_decode


def _frame_bytes(frame: wire.Frame) -> bytes:
    try:
        return encode(frame)
    except wire.WireError as exc:
        raise _unsendable(exc) from exc


def _streamed(rid: int) -> DirtyError:
    """The error of an execute() whose action streams (Gunicorn's client raises DirtyError)."""
    return DirtyError(
        f"request {rid} was answered with a stream: the action is a streaming action (it"
        " returns a generator); call stream() or stream_async() for it, not execute()"
    )


def _unsendable(exc: wire.WireError) -> DirtyProtocolError:
    """A request the protocol cannot carry (a set, an object, an int past 64 bits, too deep,
    too large): the caller's own error, as Gunicorn's client says; nothing was sent."""
    return DirtyProtocolError(f"the request cannot be sent to the dirty pool: {exc}")


def _peer_gone(exc: BaseException | None) -> bool:
    """Whether a send failed because the pool had closed the connection (nothing went out)."""
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or exc.__context__
    return exc is not None and exc.errno in _PEER_GONE


def _interrupted() -> DirtyConnectionError:
    return DirtyConnectionError(
        "a send to the dirty pool was interrupted mid-frame; the connection was dropped (the"
        " next call opens a new one)"
    )


def _connect_error(socket_path: str, exc: OSError) -> DirtyConnectionError:
    return DirtyConnectionError(
        f"cannot connect to the dirty pool at {socket_path}: {exc}; is the node"
        " running, and is GUNICORN_DIRTY_SOCKET right?",
        socket_path=socket_path,
    )


def _current_loop() -> Any:
    """The running asyncio loop, or the current trio run's token; None outside both."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    return trio.lowlevel.current_trio_token() if trio.lowlevel.in_trio_run() else None


class _Slot:
    """One async call's frames; ``waiter`` is set while its task sleeps (an asyncio future or a
    trio event)."""

    __slots__ = ("frames", "waiter")

    def __init__(self) -> None:
        self.frames: deque[tuple[int, Any]] = deque()
        self.waiter: Any = None


#: An asyncio connection stops reading while more than this many bytes of stream chunks wait
#: for their consumers (and no call waits for a frame), and reads again under ``_STREAM_LOW``.
_STREAM_HIGH = 1 << 20
_STREAM_LOW = 256 << 10


class _AsyncConn:
    """An async connection: its frame splitter and the calls waiting on it. Each event loop's
    transport (``_AsyncioConn``, ``_TrioConn``) is a subclass: how it connects, sends, waits
    for a frame, wakes a waiting call and closes are its own; the client's async calls only
    use these methods, never ask which loop they are on.

    ``loop`` is the event loop the connection belongs to (an asyncio loop, or a trio run's
    token); ``lost`` makes the error of a lost connection from its cause."""

    def __init__(self, loop: Any, lost: Any) -> None:
        self.loop = loop
        self.lost = lost
        self.splitter = wire.FrameSplitter(error=DirtyProtocolError)
        self.slots: dict[int, _Slot] = {}
        self.broken: DirtyError | None = None
        #: Bytes of CHUNK frames read but not yet taken by their streams (flow control: a
        #: slow consumer leaves its stream in the socket, holding the pool back).
        self.queued = 0
        #: asyncio: whether reading is paused for them.
        self.held = False
        #: The process that connected (a forked child must not use the parent's socket).
        self.pid = _getpid()

    @staticmethod
    def current_loop() -> Any:
        """The current event loop of this transport (the key of its connection)."""
        raise NotImplementedError

    @classmethod
    async def open(cls, loop: Any, socket_path: str, lost: Any) -> _AsyncConn:
        """A new connection on the current event loop.

        Raises:
            DirtyConnectionError: The socket cannot be reached.
        """
        raise NotImplementedError

    async def send(self, parts: list[Any], timeout: float | None) -> bool:
        """Send a request; True if the pool took none of it within ``timeout`` (the
        connection is then failed: part of the frame may be out).

        Raises:
            OSError, trio.BrokenResourceError, trio.ClosedResourceError: Sending failed.
        """
        raise NotImplementedError

    async def wait(self, slot: _Slot, remaining: float | None) -> None:
        """Wait, at most ``remaining`` seconds, for a frame of ``slot`` (or the connection's
        failure); it may return early, the caller checks again."""
        raise NotImplementedError

    async def send_end(self, data: bytes, timeout: float | None) -> None:
        """Send an END (``data``) on a working connection; safe in cleanup after a
        cancellation, never longer than ``timeout``, and silent if the send fails."""
        raise NotImplementedError

    def wake(self, slot: _Slot) -> None:
        """Wake ``slot``'s call if it sleeps (from this connection's own loop)."""
        raise NotImplementedError

    def close_transport(self) -> None:
        """Close the socket on the connection's own event loop."""
        raise NotImplementedError

    def discard(self) -> None:
        """Close the socket now, without the event loop (it may have ended)."""
        raise NotImplementedError

    def loop_ended(self) -> bool:
        """Whether the connection's event loop (asyncio) or run (trio) is over."""
        raise NotImplementedError

    def run_soon(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on the connection's loop, from any thread.

        Raises:
            RuntimeError, trio.RunFinishedError: The loop is over.
        """
        raise NotImplementedError

    def dispatch(self, data: bytes) -> None:
        try:
            frames = self.splitter.feed(data)
        except DirtyProtocolError as exc:
            self.fail(exc)
            return
        slots = self.slots
        for mtype, rid, payload in frames:
            slot = slots.get(rid)
            if slot is not None:
                slot.frames.append((mtype, payload))
                if mtype == CHUNK:
                    self.queued += len(payload)
                self.wake(slot)
            elif rid == 0 and mtype == ERROR:
                self.fail(_error_of(payload))

    def fail(self, error: DirtyError) -> None:
        if self.broken is None:
            self.broken = error
        self.wake_all()

    def wake_all(self) -> None:
        for slot in self.slots.values():
            self.wake(slot)

    def took(self, payload: bytes) -> None:
        """A stream took a chunk of ``payload`` bytes (or dropped it with the stream)."""
        self.queued -= len(payload)
        if self.held and self.queued < _STREAM_LOW:
            self.release()

    def release(self) -> None:
        """Read again (only a transport that holds reading back has anything to do)."""
        self.held = False

    def drop(self, slot: _Slot) -> None:
        """Let go of the chunks an ended call leaves unread (for flow control)."""
        for mtype, payload in slot.frames:
            if mtype == CHUNK:
                self.took(payload)
        slot.frames.clear()

    def shut(self, error: DirtyError) -> None:
        """Close on the connection's own event loop; its calls in flight fail with ``error``."""
        self.fail(error)
        self.close_transport()

    def close(self, error: DirtyError) -> None:
        """Close from any thread or event loop: on its own loop if that still runs (futures
        and trio events are woken only from their own loop), at once if it has ended. One
        inherited across a fork is the parent's: it is left alone."""
        if self.pid != _getpid():
            return
        if _current_loop() is self.loop:
            self.shut(error)
            return
        try:
            self.run_soon(self.shut, error)
            return
        except (RuntimeError, trio.RunFinishedError):  # (asyncio: "Event loop is closed")
            pass
        if self.broken is None:
            self.broken = error  # (no call waits: its loop is over)
        self.discard()


class _ClientBase:
    """What the sync and async calls of a :class:`DirtyClient` share: its socket, timeout,
    request ids and connect lock, and the errors of a lost connection and of a timeout."""

    socket_path: str
    timeout: float | None
    _ids: Iterator[int]
    _connect_lock: threading.Lock

    def _lost(self, exc: Any) -> DirtyConnectionError:
        return DirtyConnectionError(
            f"lost the connection to the dirty pool at {self.socket_path}: {exc}",
            socket_path=self.socket_path,
        )

    def _timed_out(self) -> DirtyTimeoutError:
        return DirtyTimeoutError(
            f"the dirty call did not finish within the client's timeout={self.timeout}s",
            timeout=self.timeout,
        )

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _time_left(self, deadline: float | None) -> float | None:
        """Seconds a call has left before ``deadline`` (None: no deadline).

        Raises:
            DirtyTimeoutError: The deadline has passed.
        """
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise self._timed_out()
        return remaining
