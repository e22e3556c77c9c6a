"""The SDK connection's protocol without I/O (sans-io): HELLO, what WELCOME may be, where each
of the server's frames goes, and the errors a connection raises. The trio connection
(``_sdk_connection.py``) and the blocking client's (``_client_sync.py``) both use these, so
the two transports differ only in how they move bytes.
"""

from __future__ import annotations

import secrets
import ssl
from collections.abc import Mapping
from typing import Any

import wire

from ._errors import (
    AuthenticationError,
    CallTimeout,
    MatchingError,
    ProtocolError,
    Unavailable,
    error_from_code,
)
from ._options import ClientOptions, WorkerOptions

__all__ = [
    "ANSWER",
    "CONTROL",
    "STREAM",
    "STREAM_TYPES",
    "answer_error",
    "call_timed_out",
    "connect_too_slow",
    "hello",
    "outcome",
    "parse",
    "route",
    "tls_context",
    "tls_failed",
    "unreachable",
    "welcome",
]

#: Where a frame from the server goes (:func:`route`): to a stream, to the call it answers,
#: or to the connection's owner.
STREAM, ANSWER, CONTROL = 0, 1, 2

#: Frames that belong to a stream (their request id is the stream id).
_STREAM_MESSAGES = (
    wire.MatchRegistered,
    wire.MatchRejected,
    wire.MatchTask,
    wire.MatchClose,
    wire.MatchCancel,
)
#: The same, as a set of exact types: :func:`route` says :data:`STREAM` for each of them.
STREAM_TYPES = frozenset(_STREAM_MESSAGES)


def hello(
    options: WorkerOptions | ClientOptions,
    role: str,
    *,
    worker_id: str | None = None,
    session: str | None = None,
    flows: Mapping[str, Mapping[str, list[str]]] | None = None,
) -> wire.MatchHello:
    """The HELLO a connection opens with (see ``SdkConnection.open`` for the arguments)."""
    return wire.MatchHello(
        role=role,
        session=session or secrets.token_hex(8),
        token=options.token,
        worker_id=worker_id,
        codecs=_codecs(options.codec),
        flows={
            k: {"steps": list(v["steps"]), "rpcs": list(v["rpcs"])}
            for k, v in (flows or {}).items()
        },
    )


def _codecs(preferred: str) -> tuple[wire.Codec, ...]:
    first = wire.Codec(preferred)
    return (first, *[c for c in (wire.Codec.CBOR, wire.Codec.TLV) if c is not first])


def welcome(frame: wire.Frame | None, where: str) -> wire.MatchWelcome:
    """The server's answer to HELLO, ``frame`` (None: it closed the connection), if a WELCOME.

    Raises:
        Unavailable: The server closed the connection.
        MatchingError: The server answered M_ERROR (the class its code names; wrong
            credentials are :class:`AuthenticationError`).
        ProtocolError: The answer is malformed or not a WELCOME.
    """
    if frame is None:
        raise Unavailable(f"the matching server at {where} closed the connection at HELLO")
    try:
        answer = wire.parse_matching(frame)
    except wire.WireError as exc:
        raise ProtocolError(f"the matching server at {where} answered HELLO with {exc}") from exc
    if isinstance(answer, wire.MatchError):
        raise answer_error(answer)
    if not isinstance(answer, wire.MatchWelcome):
        raise ProtocolError(
            f"the matching server at {where} answered HELLO with {type(answer).__name__},"
            " not MatchWelcome"
        )
    return answer


def parse(frame: wire.Frame, where: str) -> tuple[int, Any]:
    """The message ``frame`` carries and where it goes (:func:`route`).

    Raises:
        ProtocolError: The frame is not a matching message, or not one a server sends.
    """
    try:
        message = wire.parse_matching(frame)
    except wire.WireError as exc:
        raise ProtocolError(f"{where} sent a bad frame: {exc}") from exc
    return route(message, where), message


def route(message: wire.MatchMessage, where: str) -> int:
    """Where ``message`` from the server goes: :data:`STREAM` (its ``rid`` is a stream id),
    :data:`ANSWER` (M_REPLY / M_ERROR for the call ``rid``) or :data:`CONTROL` (M_RECONNECT,
    M_ERROR and M_PING of the connection, request id 0).

    Raises:
        ProtocolError: Only a client or worker sends such a message.
    """
    if isinstance(message, _STREAM_MESSAGES) or (
        isinstance(message, wire.MatchPing) and message.rid != 0
    ):
        return STREAM
    if isinstance(message, wire.MatchReply) or (
        isinstance(message, wire.MatchError) and message.rid != 0
    ):
        return ANSWER
    if isinstance(message, wire.MatchReconnect | wire.MatchError | wire.MatchPing):
        return CONTROL
    raise ProtocolError(
        f"{where} sent {type(message).__name__}, which only a client or worker sends"
    )


def outcome(message: wire.MatchReply | wire.MatchError) -> tuple[Any, MatchingError | None]:
    """What an answer (:data:`ANSWER`) says: the call's value, or the error to raise."""
    if type(message) is wire.MatchReply:
        return message.value, None
    return None, answer_error(message)  # type: ignore[arg-type]


def answer_error(message: wire.MatchError) -> MatchingError:
    """The typed error the server's M_ERROR names."""
    return error_from_code(
        message.code, message.message, retryable=message.retryable, details=message.details
    )


def call_timed_out(op: str, where: str, timeout: float | None) -> CallTimeout:
    return CallTimeout(f"call {op!r} to {where} got no answer within {timeout} s")


def connect_too_slow(where: str, options: WorkerOptions | ClientOptions) -> CallTimeout:
    return CallTimeout(
        f"connecting to the matching server at {where} took longer than"
        f" connect_timeout ({options.connect_timeout} s)",
        retryable=True,
    )


def unreachable(where: str, exc: OSError) -> Unavailable:
    return Unavailable(f"cannot connect to the matching server at {where}: {exc.strerror or exc}")


def tls_context(options: WorkerOptions | ClientOptions) -> ssl.SSLContext:
    """The TLS context that verifies the server (``ssl_context``, else the system's CAs or
    ``tls_ca_file``)."""
    if options.ssl_context is not None:
        return options.ssl_context
    return ssl.create_default_context(cafile=options.tls_ca_file)


def tls_failed(where: str, cause: BaseException | None) -> MatchingError:
    """The error of a failed TLS handshake (``cause``: what ``ssl`` raised)."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        return AuthenticationError(
            f"the TLS certificate of the matching server at {where} failed verification:"
            f" {cause.verify_message}; check tls_ca_file, ssl_context and"
            " tls_server_hostname"
        )
    return Unavailable(f"the TLS handshake with {where} failed: {cause}")
