"""Raw GD v1 frames: split a byte stream into ``(type, request id, payload)`` without decoding
the payloads, for a process that forwards frames (the dirty pool) or decodes them lazily (its
clients and workers).

:class:`FrameBuffer` receives into one reusable buffer (``recv_into``/``readv``), so one read
takes many frames and a 1 MiB frame costs no allocation; :class:`FrameSplitter` is the same for a
caller that reads ``bytes``. Both check every header (magic, version 1, a version 1 message type,
the payload length) and raise ``error(message, raw_header_bytes)`` (by default
:class:`BadFrameHeader`) on a bad one; after that the stream cannot be resynchronised. Payloads
are decoded with :func:`tlv_decode` (version 1 limits) by whoever trusts them.
"""

from __future__ import annotations

import fcntl
import struct
import termios
from collections.abc import Callable
from typing import Any

from ._accel import C
from ._errors import BadFrameHeader
from ._frame import HEADER, MessageType
from ._limits import MAX_PAYLOAD

__all__ = ["FrameBuffer", "FrameSplitter", "append_readdressed", "readdress_into"]

_U32 = struct.Struct(">I")
_RID = struct.Struct(">Q")
#: The message types of version 1 (Gunicorn's).
_TYPES = frozenset(int(t) for t in MessageType if t < 0x20)

#: The C scan of :meth:`FrameBuffer.frames` (None where wire's C fast paths are off).
_scan = None if C is None else C.gd1_scan


def readdress_into(dst: bytearray, src: Any, start: int, stop: int, request_id: int) -> bool:
    """Append the frame whose payload is ``src[start:stop]`` (its header the 16 bytes before) to
    ``dst``, re-addressed: its header's request id becomes ``request_id`` (a forwarder's batch).

    Raises:
        ValueError: The frame is not within ``src``, or ``request_id`` is not a u64.
    """
    if start < 16 or stop < start or stop > len(src):
        raise ValueError(f"no frame at [{start - 16}:{stop}] of a buffer of {len(src)} bytes")
    if not 0 <= request_id < 1 << 64:
        raise ValueError(f"request id {request_id} is not a u64")
    dst += memoryview(src)[start - 16 : stop]
    _RID.pack_into(dst, len(dst) - (stop - start) - 8, request_id)
    return True


#: :func:`readdress_into` in one C call where wire's fast paths are built; there it returns None
#: (``dst`` unchanged) where :func:`readdress_into` would raise or the arguments are not a
#: bytearray and a buffer: the caller then calls that, which names what is wrong.
append_readdressed: Callable[[bytearray, Any, int, int, int], bool | None] = (
    readdress_into if C is None else C.gd1_readdress
)

#: What a bad header raises: ``error(message, raw_bytes)``.
ErrorFactory = Callable[[str, bytes], Exception]


def _bad_header(error: ErrorFactory, buf: Any, pos: int) -> Exception:
    magic, version, mtype, length, _ = HEADER.unpack_from(buf, pos)
    return error(
        f"bad frame header at byte {pos}: magic={magic!r} version={version}"
        f" type=0x{mtype:02x} length={length}; expected a GD v1 frame",
        bytes(buf[pos : pos + 16]),
    )


def _bad_start(error: ErrorFactory, buf: Any, pos: int, end: int) -> Exception:
    return error("bad frame header: a frame starts with 47 44 ('GD')", bytes(buf[pos:end]))


def _arrived(fd: int) -> int:
    """Bytes waiting in socket ``fd`` (0 if it cannot tell)."""
    try:
        return _INT.unpack(fcntl.ioctl(fd, termios.FIONREAD, _INT_ZERO))[0]
    except OSError:
        return 0


_INT = struct.Struct("i")
_INT_ZERO = _INT.pack(0)


class FrameBuffer:
    """A socket's receive buffer: ``recv_into(buffer.space())``, then ``buffer.frames(n)``.

    ``frames`` returns ``[(type, request_id, start, stop), ...]``: the complete frames'
    payloads are ``buffer.view[start:stop]`` (the header is the 16 bytes before ``start``).
    They stay valid until the next :meth:`space` call, which may move unread bytes. A frame
    larger than the buffer grows it (kept for later frames up to ``keep`` bytes), so a large
    payload arrives in place, in as few reads as the socket allows, with no joining copy.
    Headers are checked (magic, version 1, known type, payload at most ``max_payload``); after
    an error the stream cannot be resynchronised.

    Given the socket's ``fd`` (a peer that is not trusted: a client), the buffer grows only for
    bytes that have arrived (what the socket holds, ``FIONREAD``, and at least double what is
    held, so a frame trickling in is copied O(1) times per byte), never to a header's declared
    size up front: a header claiming 64 MiB costs nothing until the bytes come. Without it (a
    worker) a large frame's buffer is allocated whole as soon as its header is in. A bad
    header raises ``error(message, raw_bytes)`` (:class:`BadFrameHeader` unless the caller
    names its own protocol error).
    """

    __slots__ = ("_error", "_fd", "_keep", "_max", "_size", "buf", "end", "start", "view")

    def __init__(
        self,
        size: int = 262144,
        max_payload: int = MAX_PAYLOAD,
        keep: int = 8 << 20,
        fd: int = -1,
        error: ErrorFactory = BadFrameHeader,
    ) -> None:
        self._error = error
        self._size = size
        self._max = max_payload
        self._keep = keep
        self._fd = fd
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return self.end - self.start

    def missing(self) -> int:
        """Bytes still to receive to complete the frame at the front (0 if its header is not
        in yet)."""
        held = self.end - self.start
        if held < 16:
            return 0
        return 16 + _U32.unpack_from(self.buf, self.start + 4)[0] - held

    def space(self) -> memoryview:
        """The free part of the buffer to receive into (never empty).

        Raises:
            Exception: ``error(...)``: the frame waiting at the front has a bad header.
        """
        start, end = self.start, self.end
        cap = len(self.buf)
        if start == end:
            self.start = self.end = 0
            if cap > self._keep:
                self._resize(self._size, 0, 0)
            return self.view
        need = 16
        if end - start >= 16:
            magic, version, mtype, length, _ = HEADER.unpack_from(self.buf, start)
            if magic != b"GD" or version != 1 or mtype not in _TYPES or length > self._max:
                raise _bad_header(self._error, self.buf, start)
            need += length
        if need > cap:
            held = end - start
            if self._fd < 0:
                self._resize(max(need, self._size), start, end)
                return self.view[self.end :]
            want = held + max(_arrived(self._fd), 1)
            if want > cap:
                self._resize(min(need, max(want, 2 * held)), start, end)
                return self.view[self.end :]
            need = cap  # room enough for what has come: grow when more does
        if start + need > cap or (start and cap - end < 65536):
            held = end - start
            self.buf[:held] = bytes(self.view[start:end])
            self.start, self.end = 0, held
        return self.view[self.end :]

    def _resize(self, size: int, start: int, end: int) -> None:
        held = end - start
        buf = bytearray(size)
        buf[:held] = self.view[start:end]
        self.view.release()
        self.buf = buf
        self.view = memoryview(buf)
        self.start, self.end = 0, held

    def frames(self, n: int) -> list[tuple[int, int, int, int]]:
        """Account for ``n`` bytes received into :meth:`space`; return the complete frames.

        Raises:
            Exception: ``error(...)``: the bytes are not GD v1 frames.
        """
        end = self.end = self.end + n
        pos = self.start
        buf = self.buf
        if _scan is not None:
            found = _scan(buf, pos, end, self._max)
            if found is not None:
                out, self.start = found
                return out
            # (a bad header: the loop below names it)
        unpack = HEADER.unpack_from
        out = []
        limit = self._max
        types = _TYPES
        while end - pos >= 16:
            magic, version, mtype, length, rid = unpack(buf, pos)
            if magic != b"GD" or version != 1 or mtype not in types or length > limit:
                self.start = pos
                raise _bad_header(self._error, buf, pos)
            stop = pos + 16 + length
            if stop > end:
                break
            out.append((mtype, rid, pos + 16, stop))
            pos = stop
        if pos < end and end - pos < 16:
            have = min(2, end - pos)
            if buf[pos : pos + have] != b"GD"[:have]:
                raise _bad_start(self._error, buf, pos, end)
        self.start = pos
        return out


class FrameSplitter:
    """Incremental splitter: ``feed(bytes)`` returns ``[(type, request_id, payload), ...]``.

    Headers are checked (magic, version 1, known type, payload at most 64 MiB); payloads are
    not decoded; a bad header raises ``error(message, raw_bytes)``. After an error the stream
    cannot be resynchronised.
    """

    __slots__ = ("_buf", "_error", "_have", "_head", "_max", "_need", "_parts")

    def __init__(
        self, max_payload: int = MAX_PAYLOAD, error: ErrorFactory = BadFrameHeader
    ) -> None:
        self._error = error
        self._buf = b""
        self._max = max_payload
        # A large frame arriving in many reads is collected in ``_parts`` (``_have`` bytes of
        # the ``_need`` it takes) and joined once, instead of re-copying the buffer per read.
        self._parts: list[bytes] = []
        self._have = 0
        self._need = 0
        self._head: tuple[int, int] = (0, 0)

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf) + self._have

    def read_size(self, default: int = 262144) -> int:
        """How many bytes to ask the socket for next: the rest of a large frame, or ``default``."""
        return max(default, self._need - self._have)

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """Add bytes; return the frames they complete.

        Raises:
            Exception: ``error(...)``: the bytes are not GD v1 frames.
        """
        out: list[tuple[int, int, bytes]] = []
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            over = self._have - self._need
            if over:
                self._parts[-1] = data[: len(data) - over]
            payload = b"".join(self._parts)
            out.append((*self._head, payload))
            self._parts = []
            self._have = self._need = 0
            if not over:
                return out
            buf = data[len(data) - over :]
        else:
            buf = self._buf + data if self._buf else data
        pos = 0
        end = len(buf)
        unpack = HEADER.unpack_from
        while end - pos >= 16:
            magic, version, mtype, length, rid = unpack(buf, pos)
            if magic != b"GD" or version != 1 or mtype not in _TYPES or length > self._max:
                self._buf = b""
                raise _bad_header(self._error, buf, pos)
            stop = pos + 16 + length
            if stop > end:
                if length >= 65536:
                    # Collect the payload's pieces; one join when it is complete.
                    self._head = (mtype, rid)
                    self._parts = [buf[pos + 16 :]]
                    self._have = end - pos - 16
                    self._need = length
                    self._buf = b""
                    return out
                break
            out.append((mtype, rid, buf[pos + 16 : stop]))
            pos = stop
        if pos < end and end - pos < 16 and buf[pos : pos + 2] != b"GD"[: min(2, end - pos)]:
            raise _bad_start(self._error, buf, pos, end)
        self._buf = buf[pos:] if pos < end else b""
        return out
