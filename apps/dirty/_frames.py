"""Raw GD v1 frames: split a byte stream into (type, request id, payload) and re-address frames
by rewriting the header's request id; encode the protocol's hot frames straight to bytes.

The pool forwards payloads verbatim between clients and workers; only the 16-byte header
changes. :class:`FrameBuffer` receives into one reusable buffer (``recv_into``), so a
connection takes many frames per read and a 1 MiB frame costs no allocation in the node.
Payloads are decoded with ``wire.tlv_decode`` (version 1 limits) before anything trusts them.
A large ``bytes`` value is sent by reference (:func:`request_parts`, :func:`reply_parts`: the
frame as a list of buffers for ``sendmsg``), never copied into the encoded frame.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
from collections.abc import Iterable, Mapping
from typing import Any

import wire

from ._errors import DirtyError, DirtyProtocolError

__all__ = [
    "HEADER",
    "FrameBuffer",
    "big_value",
    "FrameSplitter",
    "decode_payload",
    "encode",
    "error_bytes",
    "frame_bytes",
    "header",
    "notice",
    "peek_route",
    "reply_parts",
    "request_parts",
    "send_parts",
    "tune_socket",
]

HEADER = struct.Struct(">2sBBIQ")
#: The request id's place in a header (bytes 8..16).
RID = struct.Struct(">Q")
_TYPES = frozenset(int(t) for t in wire.MessageType if t < 0x20)
REQUEST = 0x01
RESPONSE = 0x02
ERROR = 0x03
CHUNK = 0x04
END = 0x05
STASH = 0x10
STATUS = 0x11
MANAGE = 0x12
_LIMITS = wire.Limits()
_MAX_PAYLOAD = wire.MAX_PAYLOAD

#: Socket buffer size asked for on every pool socket, so a 1 MiB frame moves in one write
#: (Linux caps it at ``net.core.wmem_max``/``rmem_max``; failure is harmless).
SOCKET_BUFFER = 4 << 20
#: A ``bytes`` value at least this long is sent by reference, not copied into its frame.
BIG = 65536


def tune_socket(sock: Any) -> None:
    """Ask for large send/receive buffers on a (stdlib or trio) Unix socket."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


def header(mtype: int, length: int, request_id: int) -> bytes:
    """A GD v1 header."""
    return HEADER.pack(b"GD", 1, mtype, length, request_id)


def encode(frame: wire.Frame) -> bytes:
    """A frame's bytes (Gunicorn's encoding; non-str dict keys are ``str()``-ed as it does)."""
    return wire.encode_frame(frame, coerce_keys=True)


def error_bytes(rid: int, error: DirtyError) -> bytes:
    """An ERROR frame for ``rid``; the caller gets it whatever the error's text holds.

    Text that is not valid UTF-8 (a lone surrogate: an OS file name or path decoded with
    ``surrogateescape``) goes backslash-escaped, and a detail that still cannot be encoded is
    left out.
    """
    e = error.to_dict()
    try:
        return encode(wire.make_error(rid, e["error_type"], e["message"], e["details"]))
    except wire.WireError:
        pass
    details: dict[str, Any] = {}
    for key, value in e["details"].items():
        value = _escaped(value) if isinstance(value, str) else value
        try:
            _body(value)
        except wire.WireError:
            continue
        details[_escaped(str(key))] = value
    return encode(wire.make_error(rid, e["error_type"], _escaped(e["message"]), details))


def _escaped(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates) as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_tlv_encode = wire.tlv_encode
_pack = HEADER.pack


def _body(value: Any) -> bytes:
    return _tlv_encode(value, version=1, coerce_keys=True)


def _too_big(mtype: int, length: int) -> wire.LimitExceeded:
    name = wire.MessageType(mtype).name
    return wire.LimitExceeded(
        f"{name} payload of {length} bytes exceeds max_payload={_MAX_PAYLOAD}; split it into"
        " CHUNK frames"
    )


def frame_bytes(mtype: int, request_id: int, payload: dict[str, Any]) -> bytes:
    """``encode(Frame(mtype, request_id, payload))`` without building the Frame.

    Raises:
        wire.WireError: The payload cannot be encoded or exceeds 64 MiB.
    """
    body = _body(payload)
    if len(body) > _MAX_PAYLOAD:
        raise _too_big(mtype, len(body))
    return _pack(b"GD", 1, mtype, len(body), request_id) + body


#: Worker -> node notices (private to the pool): a STATUS frame carrying a request's id says
#: the request waits for a free thread (``QUEUED``) or has started in one (``STARTED``), so
#: ``dirty_timeout`` charges a call only for the time it runs.
QUEUED = _body("queued")
STARTED = _body("started")


def notice(body: bytes, request_id: int) -> bytes:
    """The STATUS notice ``body`` (``QUEUED`` or ``STARTED``) for ``request_id``."""
    return _pack(b"GD", 1, STATUS, len(body), request_id) + body


_SCALARS = (str, int, float, bool, type(None))
_DICT4 = b"\x21\x00\x00\x00\x04"
_DICT1 = b"\x21\x00\x00\x00\x01"
_K_APP = _body("app_path")
_K_ACTION = _body("action")
_K_ARGS = _body("args")
_K_KWARGS = _body("kwargs")


def _big_ok(value: Any) -> bool:
    return type(value) is bytes and BIG <= len(value) <= _LIMITS.max_str


def _leaf(value: Any, parts: list[Any], pending: bytearray) -> bytearray:
    """Add one scalar (or a big bytes, by reference) to ``parts``/``pending``."""
    if type(value) is bytes and len(value) >= BIG:
        pending += struct.pack(">BI", 0x10, len(value))
        parts.append(bytes(pending))
        parts.append(value)
        return bytearray()
    pending += _body(value)
    return pending


def _scatter(mtype: int, request_id: int, prefix: bytes, values: Iterable[Any]) -> list[Any]:
    parts: list[Any] = [b""]
    pending = bytearray(prefix)
    pending = _fill(values, parts, pending)
    if pending:
        parts.append(bytes(pending))
    length = sum(len(p) for p in parts)
    if length > _MAX_PAYLOAD:
        raise _too_big(mtype, length)
    parts[0] = _pack(b"GD", 1, mtype, length, request_id)
    return parts


def _fill(values: Iterable[Any], parts: list[Any], pending: bytearray) -> bytearray:
    for item in values:
        if type(item) is bytearray:  # a pre-encoded run (keys, container heads)
            pending += item
        else:
            pending = _leaf(item, parts, pending)
    return pending


def request_parts(
    request_id: int,
    app_path: str,
    action: str,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> list[Any]:
    """A REQUEST frame (``wire.make_request``'s payload) as buffers whose concatenation is its
    encoding; one buffer unless an argument is a large ``bytes`` (sent by reference).

    Raises:
        wire.WireError: An argument cannot be encoded, or the payload exceeds 64 MiB.
    """
    args = list(args)
    kwargs = dict(kwargs) if kwargs else {}
    big = False
    for a in args:
        if type(a) is bytes and len(a) >= BIG:
            big = True
            break
    else:
        for a in kwargs.values():
            if type(a) is bytes and len(a) >= BIG:
                big = True
                break
    if (
        not big
        or not (any(_big_ok(a) for a in args) or any(_big_ok(v) for v in kwargs.values()))
        or type(app_path) is not str
        or type(action) is not str
        or len(args) > _LIMITS.max_items
        or len(kwargs) > _LIMITS.max_items
        or not all(type(a) in _SCALARS or type(a) is bytes for a in args)
        or not all(type(k) is str for k in kwargs)
        or not all(type(v) in _SCALARS or type(v) is bytes for v in kwargs.values())
    ):
        payload = {"app_path": app_path, "action": action, "args": args, "kwargs": kwargs}
        return [frame_bytes(REQUEST, request_id, payload)]
    values: list[Any] = [bytearray(_K_APP + _body(app_path) + _K_ACTION + _body(action) + _K_ARGS)]
    values.append(bytearray(struct.pack(">BI", 0x20, len(args))))
    values.extend(args)
    values.append(bytearray(_K_KWARGS + struct.pack(">BI", 0x21, len(kwargs))))
    for key, value in kwargs.items():
        values.append(bytearray(_body(key)))
        values.append(value)
    return _scatter(REQUEST, request_id, _DICT4, values)


_KEYS = {RESPONSE: _body("result"), CHUNK: _body("data")}
_NAMES = {RESPONSE: "result", CHUNK: "data"}


def reply_parts(mtype: int, request_id: int, value: Any) -> list[Any]:
    """A RESPONSE (``{result: value}``) or CHUNK (``{data: value}``) frame as buffers; a large
    ``bytes`` value is sent by reference.

    Raises:
        wire.WireError: The value cannot be encoded, or the payload exceeds 64 MiB.
    """
    if _big_ok(value):
        return _scatter(mtype, request_id, _DICT1 + _KEYS[mtype], (value,))
    return [frame_bytes(mtype, request_id, {_NAMES[mtype]: value})]


_U32 = struct.Struct(">I")
_BYTES_HEADS = {t: _DICT1 + _KEYS[t] + b"\x10" for t in (RESPONSE, CHUNK)}


def big_value(mtype: int, view: memoryview, start: int, stop: int) -> bytes | None:
    """The value of a RESPONSE/CHUNK payload ``view[start:stop]`` that is exactly one large
    ``bytes`` (``{result: b"..."}``, as :func:`reply_parts` sends it), copied straight out of
    the buffer (one copy instead of two); None for any other payload."""
    head = _BYTES_HEADS.get(mtype)
    if head is None or stop - start < BIG:
        return None
    body = start + len(head) + 4
    if view[start : body - 4] != head or _U32.unpack_from(view, body - 4)[0] != stop - body:
        return None
    return bytes(view[body:stop])


def peek_route(view: memoryview, start: int, stop: int) -> tuple[str, str] | None:
    """``(app_path, action)`` of a REQUEST payload that opens with them as str values (as
    Gunicorn's client and ours encode it), read without decoding the rest; None otherwise
    (the caller decodes the payload). The rest is checked where it is decoded (the worker)."""
    try:
        if view[start] != 0x21 or _U32.unpack_from(view, start + 1)[0] < 2:
            return None
        pos = start + 5
        found = []
        for key in (_K_APP, _K_ACTION):
            end = pos + len(key)
            if view[pos:end] != key or view[end] != 0x11:
                return None
            n = _U32.unpack_from(view, end + 1)[0]
            pos = end + 5 + n
            if pos > stop or n > _LIMITS.max_str:
                return None
            found.append(str(view[end + 5 : pos], "utf-8"))
    except (IndexError, UnicodeDecodeError, struct.error):
        return None
    return found[0], found[1]


def send_parts(sock: socket.socket, parts: list[Any]) -> None:
    """``sendall`` of the buffers' concatenation with ``sendmsg`` (no joining copy).

    Raises:
        OSError: The socket failed (or timed out).
    """
    if len(parts) == 1:
        sock.sendall(parts[0])
        return
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent_from(views, sock.sendmsg(views[:512]))


def sent_from(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes (just sent) from ``views``, in place."""
    while n:
        first = views[0]
        if n >= len(first):
            n -= len(first)
            views.pop(0)
        else:
            views[0] = first[n:]
            n = 0


def decode_payload(payload: bytes | bytearray | memoryview) -> Any:
    """Decode a v1 payload (empty -> None).

    Raises:
        DirtyProtocolError: The payload is not one valid TLV dict.
    """
    if not payload:
        return None
    try:
        value = wire.tlv_decode(payload, version=1, limits=_LIMITS)
    except wire.WireError as exc:
        raise DirtyProtocolError(f"malformed payload: {exc}") from exc
    if type(value) is not dict:
        raise DirtyProtocolError(f"a payload must be a dict (got {type(value).__name__})")
    return value


def _bad_header(buf: Any, pos: int) -> DirtyProtocolError:
    magic, version, mtype, length, _ = HEADER.unpack_from(buf, pos)
    return DirtyProtocolError(
        f"bad frame header at byte {pos}: magic={magic!r} version={version}"
        f" type=0x{mtype:02x} length={length}; expected a GD v1 frame",
        raw_data=bytes(buf[pos : pos + 16]),
    )


def _bad_start(buf: Any, pos: int, end: int) -> DirtyProtocolError:
    return DirtyProtocolError(
        "bad frame header: a frame starts with 47 44 ('GD')", raw_data=bytes(buf[pos:end])
    )


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
    worker) a large frame's buffer is allocated whole as soon as its header is in.
    """

    __slots__ = ("_fd", "_keep", "_max", "_size", "buf", "end", "start", "view")

    def __init__(
        self,
        size: int = 262144,
        max_payload: int = _MAX_PAYLOAD,
        keep: int = 8 << 20,
        fd: int = -1,
    ) -> None:
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
            DirtyProtocolError: The frame waiting at the front has a bad header.
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
                raise _bad_header(self.buf, start)
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
            DirtyProtocolError: The bytes are not GD v1 frames.
        """
        end = self.end = self.end + n
        pos = self.start
        buf = self.buf
        unpack = HEADER.unpack_from
        out = []
        limit = self._max
        types = _TYPES
        while end - pos >= 16:
            magic, version, mtype, length, rid = unpack(buf, pos)
            if magic != b"GD" or version != 1 or mtype not in types or length > limit:
                self.start = pos
                raise _bad_header(buf, pos)
            stop = pos + 16 + length
            if stop > end:
                break
            out.append((mtype, rid, pos + 16, stop))
            pos = stop
        if pos < end and end - pos < 16:
            have = min(2, end - pos)
            if buf[pos : pos + have] != b"GD"[:have]:
                raise _bad_start(buf, pos, end)
        self.start = pos
        return out


class FrameSplitter:
    """Incremental splitter: ``feed(bytes)`` returns ``[(type, request_id, payload), ...]``.

    Headers are checked (magic, version 1, known type, payload at most 64 MiB); payloads are
    not decoded. After an error the stream cannot be resynchronised.
    """

    __slots__ = ("_buf", "_have", "_head", "_max", "_need", "_parts")

    def __init__(self, max_payload: int = wire.MAX_PAYLOAD) -> None:
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
            DirtyProtocolError: The bytes are not GD v1 frames.
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
                raise _bad_header(buf, pos)
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
            raise _bad_start(buf, pos, end)
        self._buf = buf[pos:] if pos < end else b""
        return out
