"""The server side of a matching connection's handshake: read M_HELLO under tight limits
(answering anything else with an M_ERROR), check the role's bearer token in constant time, and
answer M_WELCOME with the codec both sides use from then on."""

from __future__ import annotations

import hmac
import logging
from typing import TYPE_CHECKING, Any

import trio

import wire

from ._dispatch import Capabilities

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["MAX_FRAMES_BEFORE_HELLO", "handshake"]

logger = logging.getLogger("apps.matching")

#: Frames a peer may send before a good HELLO (each answered by an M_ERROR) before it is dropped.
MAX_FRAMES_BEFORE_HELLO = 8

_CODECS = (wire.Codec.TLV, wire.Codec.CBOR)


async def handshake(conn: Connection, frames: wire.FrameStream) -> bool:
    """Read HELLO (answering anything else with an M_ERROR), authenticate, send WELCOME.
    False if the connection is to close."""
    config = conn.ctx.config
    with trio.move_on_after(config.peer_timeout) as timer:
        hello = await _read_hello(conn, frames)
        if hello is None:
            return False
        conn.role = hello.role
        tokens = config.tokens(hello.role)
        if tokens and not _token_ok(hello.token, tokens):
            logger.warning(
                "matching: refused a %s connection from %s: %s token",
                hello.role,
                conn.peer,
                "wrong" if hello.token else "missing",
            )
            await _send_now(
                frames,
                wire.MatchError(
                    "unauthenticated",
                    f"the {hello.role} token is {'wrong' if hello.token else 'missing'}; pass"
                    f" the {hello.role} credentials the server is configured with",
                ),
            )
            return False
        codec = next((c for c in hello.codecs if c in _CODECS), None)
        if codec is None:
            await _send_now(
                frames,
                wire.MatchError(
                    "unsupported", "HELLO offers no codec the server speaks (tlv, cbor)"
                ),
            )
            return False
        if hello.role == "worker":
            assert hello.worker_id is not None
            conn.worker_id = hello.worker_id
            conn.caps = Capabilities.from_wire(hello.flows)
        conn.session = hello.session
        conn.codec = codec
        await _send_now(
            frames,
            wire.MatchWelcome(
                config.server_name, codec, float(config.ping_interval), float(config.peer_timeout)
            ),
        )
        logger.debug("matching: %s connected (codec %s)", conn.label, codec.value)
        return True
    if timer.cancelled_caught:
        logger.info("matching: %s sent no HELLO within %ss", conn.peer, config.peer_timeout)
    return False


async def _read_hello(conn: Connection, frames: wire.FrameStream) -> wire.MatchHello | None:
    for _ in range(MAX_FRAMES_BEFORE_HELLO):
        try:
            frame = await frames.receive_frame()
        except wire.WireError as exc:
            logger.warning("matching: undecodable input from %s before HELLO: %s", conn.peer, exc)
            await _send_now(frames, wire.MatchError("bad_frame", exc.message))
            return None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            logger.info("matching: %s went away before HELLO (%s)", conn.peer, exc)
            return None
        if frame is None:
            return None
        problem: str
        if frame.type is not wire.MessageType.M_HELLO:
            problem = f"the first frame must be M_HELLO (got {frame.type.name})"
        else:
            try:
                hello = wire.parse_matching(frame)
            except wire.WireError as exc:
                problem = exc.message
            else:
                assert isinstance(hello, wire.MatchHello)
                return hello
        logger.warning("matching: bad frame from %s before HELLO: %s", conn.peer, problem)
        await _send_now(frames, wire.MatchError("bad_frame", problem))
    logger.warning("matching: %s sent %d frames but no HELLO", conn.peer, MAX_FRAMES_BEFORE_HELLO)
    return None


def _token_ok(given: str, tokens: tuple[str, ...]) -> bool:
    """Constant-time: every configured token is compared, whichever matches."""
    data = given.encode()
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(data, token.encode())
    return ok


async def _send_now(frames: wire.FrameStream, msg: Any) -> None:
    try:
        await frames.send_frame(msg.to_frame(wire.Codec.TLV))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
