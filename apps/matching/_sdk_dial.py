"""Dialling the matching server for the trio SDK connection: the socket (Unix, TCP, TLS with
the server's certificate verified) and the HELLO/WELCOME handshake, for
:class:`SdkConnection.open` (the protocol's side of both is ``_sdk_protocol``'s)."""

from __future__ import annotations

import trio

import wire

from . import _sdk_protocol as protocol
from ._errors import ProtocolError, Unavailable
from ._options import ClientOptions, WorkerOptions

__all__ = ["dial", "handshake"]


async def dial(options: WorkerOptions | ClientOptions, where: str) -> trio.abc.Stream:
    address = options.address
    try:
        if address.kind == "unix":
            return await trio.open_unix_socket(address.path)
        tcp = await trio.open_tcp_stream(address.host, address.port)
    except OSError as exc:
        raise protocol.unreachable(where, exc) from exc
    if not options.uses_tls:
        return tcp
    tls = trio.SSLStream(
        tcp,
        protocol.tls_context(options),
        server_hostname=options.tls_server_hostname or address.host,
    )
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        raise protocol.tls_failed(where, exc.__cause__ or exc) from exc
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return tls


async def handshake(
    frames: wire.FrameStream, hello: wire.MatchHello, where: str
) -> wire.MatchWelcome:
    try:
        await frames.send_frame(hello.to_frame())
        frame = await frames.receive_frame()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        raise Unavailable(f"the matching server at {where} dropped the handshake: {exc}") from exc
    except wire.WireError as exc:
        raise ProtocolError(f"the matching server at {where} answered HELLO with {exc}") from exc
    return protocol.welcome(frame, where)
