"""The blocking client's dialling: a socket to the server, TLS on memory BIOs over it
(``ssl.SSLObject``: the connection reads and writes the socket itself, from several threads,
which an ``SSLSocket`` does not allow), HELLO and WELCOME, all within ``connect_timeout``; the
:class:`~._sync_connection.SyncConnection` on it (``_sdk_dial`` is the trio one).
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any

import wire

from . import _sdk_protocol as protocol
from ._client_frames import LIMITS
from ._errors import MatchingError, ProtocolError, Unavailable
from ._options import ClientOptions
from ._sync_connection import SyncConnection

__all__ = ["Tls", "dial"]

_monotonic = time.monotonic


class Tls:
    """TLS on memory BIOs; every method with the connection's lock held (or before it is
    shared)."""

    def __init__(self, obj: ssl.SSLObject, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO):
        self.obj = obj
        self.incoming = incoming
        self.outgoing = outgoing

    def encrypt(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def decrypt(self, raw: bytes) -> bytes | None:
        """The plaintext ``raw`` completes (None: the server ended the TLS session)."""
        self.incoming.write(raw)
        chunks = []
        while True:
            try:
                chunk = self.obj.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                return None
            chunks.append(chunk)
        return b"".join(chunks)


def dial(options: ClientOptions, role: str = "client") -> SyncConnection:
    """Dial the server of ``options``, say HELLO and wait for WELCOME, all within
    ``connect_timeout`` (as ``SdkConnection.open``, whose errors it raises)."""
    address = options.address
    where = str(address)
    limit = options.connect_timeout
    deadline = None if limit is None else _monotonic() + limit

    def left() -> float | None:
        if deadline is None:
            return None
        rest = deadline - _monotonic()
        if rest <= 0:
            raise TimeoutError
        return rest

    try:
        if address.kind == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(left())
                sock.connect(address.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((address.host, address.port), timeout=left())
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except TimeoutError as exc:
        raise protocol.connect_too_slow(where, options) from exc
    except OSError as exc:
        raise protocol.unreachable(where, exc) from exc
    try:
        tls = _tls_handshake(sock, options, where, left) if options.uses_tls else None
        decoder = wire.FrameDecoder(limits=LIMITS, versions=frozenset({2}))
        data = wire.encode_frame(protocol.hello(options, role).to_frame(), limits=LIMITS)
        sock.settimeout(left())
        sock.sendall(data if tls is None else tls.encrypt(data))
        frames: list[wire.Frame] = []
        while not frames:
            sock.settimeout(left())
            raw = sock.recv(65536)
            plain = raw if tls is None or not raw else tls.decrypt(raw)
            if not plain:
                if plain is None or not raw:
                    break
                continue  # (TLS records with no data yet)
            frames = decoder.feed(plain)
        welcome = protocol.welcome(frames[0] if frames else None, where)
        sock.settimeout(None)
    except MatchingError:  # (first: AuthenticationError is an OSError, CallTimeout a TimeoutError)
        sock.close()
        raise
    except TimeoutError as exc:
        sock.close()
        raise protocol.connect_too_slow(where, options) from exc
    except wire.WireError as exc:
        sock.close()
        raise ProtocolError(f"the matching server at {where} answered HELLO with {exc}") from exc
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise Unavailable(f"the matching server at {where} dropped the handshake: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    conn = SyncConnection(sock, tls, welcome, where)
    conn.decoder = decoder
    if len(frames) > 1:  # (the server spoke first after WELCOME: a ping, say)
        with conn.lock:
            conn._deliver(frames[1:])
    return conn


def _tls_handshake(sock: socket.socket, options: ClientOptions, where: str, left: Any) -> Tls:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = protocol.tls_context(options).wrap_bio(
        incoming, outgoing, server_hostname=options.tls_server_hostname or options.address.host
    )
    try:
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.settimeout(left())
                sock.sendall(outgoing.read())
                raw = sock.recv(65536)
                if not raw:
                    raise protocol.tls_failed(where, ConnectionResetError("the server closed it"))
                incoming.write(raw)
        pending = outgoing.read()
        if pending:
            sock.settimeout(left())
            sock.sendall(pending)
    except ssl.SSLError as exc:
        raise protocol.tls_failed(where, exc) from exc
    return Tls(obj, incoming, outgoing)
