"""Dialling the matching server for the SDKs: the socket (Unix, TCP, TLS with the server's
certificate verified) and the HELLO/WELCOME handshake, for :class:`SdkConnection.open`."""

from __future__ import annotations

import ssl

import trio

import wire

from ._errors import AuthenticationError, ProtocolError, Unavailable, error_from_code
from ._options import ClientOptions, WorkerOptions

__all__ = ["codecs", "dial", "handshake"]


def codecs(preferred: str) -> tuple[wire.Codec, ...]:
    first = wire.Codec(preferred)
    return (first, *[c for c in (wire.Codec.CBOR, wire.Codec.TLV) if c is not first])


def _tls_context(options: WorkerOptions | ClientOptions) -> ssl.SSLContext:
    if options.ssl_context is not None:
        return options.ssl_context
    return ssl.create_default_context(cafile=options.tls_ca_file)


async def dial(options: WorkerOptions | ClientOptions, where: str) -> trio.abc.Stream:
    address = options.address
    try:
        if address.kind == "unix":
            return await trio.open_unix_socket(address.path)
        tcp = await trio.open_tcp_stream(address.host, address.port)
    except OSError as exc:
        raise Unavailable(
            f"cannot connect to the matching server at {where}: {exc.strerror or exc}"
        ) from exc
    if not options.uses_tls:
        return tcp
    tls = trio.SSLStream(
        tcp,
        _tls_context(options),
        server_hostname=options.tls_server_hostname or address.host,
    )
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError as exc:
        await trio.aclose_forcefully(tcp)
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise AuthenticationError(
                f"the TLS certificate of the matching server at {where} failed verification:"
                f" {cause.verify_message}; check tls_ca_file, ssl_context and"
                " tls_server_hostname"
            ) from exc
        raise Unavailable(f"the TLS handshake with {where} failed: {cause or exc}") from exc
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
    if frame is None:
        raise Unavailable(f"the matching server at {where} closed the connection at HELLO")
    try:
        answer = wire.parse_matching(frame)
    except wire.WireError as exc:
        raise ProtocolError(f"the matching server at {where} answered HELLO with {exc}") from exc
    if isinstance(answer, wire.MatchError):
        raise error_from_code(
            answer.code, answer.message, retryable=answer.retryable, details=answer.details
        )
    if not isinstance(answer, wire.MatchWelcome):
        raise ProtocolError(
            f"the matching server at {where} answered HELLO with {type(answer).__name__},"
            " not MatchWelcome"
        )
    return answer
