"""Raw GD v1 frames: split a byte stream into (type, request id, payload bytes) and re-address
frames by rewriting the header's request id.

The pool forwards a payload verbatim from worker to client (and a validated REQUEST from client
to worker) instead of decoding and re-encoding it; only the 16-byte header changes. Payloads
from clients are decoded with ``wire.tlv_decode`` (version 1 limits) before anything trusts them.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import wire

from ._errors import DirtyProtocolError

__all__ = ["HEADER", "FrameSplitter", "decode_payload", "encode", "header", "tune_socket"]

HEADER = struct.Struct(">2sBBIQ")
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


#: Socket buffer size asked for on every pool socket, so a 1 MiB frame moves in one write
#: (Linux caps it at ``net.core.wmem_max``/``rmem_max``; failure is harmless).
SOCKET_BUFFER = 4 << 20


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


def decode_payload(payload: bytes) -> Any:
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
                raise DirtyProtocolError(
                    f"bad frame header at byte {pos}: magic={magic!r} version={version}"
                    f" type=0x{mtype:02x} length={length}; expected a GD v1 frame",
                    raw_data=bytes(buf[pos : pos + 16]),
                )
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
            raise DirtyProtocolError(
                "bad frame header: a frame starts with 47 44 ('GD')", raw_data=bytes(buf[pos:])
            )
        self._buf = buf[pos:] if pos < end else b""
        return out
