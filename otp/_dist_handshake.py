"""The distribution handshake (wire version 2): names, versions, codec choice and proof that both
sides know the cookie, by HMAC challenge-response; the cookie itself never crosses.

1. The initiator sends HANDSHAKE {node, versions, codecs, creation, auth: {challenge, listen}}.
2. The acceptor answers HANDSHAKE {node, versions, codecs: [chosen], creation,
   auth: {challenge, digest, listen}}, where digest proves it knows the cookie for the
   initiator's challenge.
3. The initiator checks it and sends HANDSHAKE {node, auth: {digest}} for the acceptor's
   challenge; the acceptor checks that. Then both sides are connected.

Each digest is HMAC-SHA256(cookie, role, the digester's node name, the challenge), so a digest
cannot be reflected back or replayed under another name.

Each side lists in ``auth.features`` what it understands beyond the version's base protocol
(Erlang's distribution flags); a feature is used on a connection only when the peer listed it,
so nodes of different releases of one wire version still understand each other:

- ``reply_demonitor``: it accepts a call's reply as ``$gen_reply_demonitor`` (the server's
  reply ended the call's monitor, so no DEMONITOR follows). A peer without it gets a plain
  ``$gen_reply`` and demonitors itself.
- ``monitor_send``: it accepts MONITOR_SEND frames, a call's MONITOR and request in one frame
  (one frame to encode, read and dispatch a call instead of two). A peer without it gets the
  two frames, MONITOR then the request.

A node may say it is **hidden** (``auth.hidden``, as Erlang's ``-hidden``): a connection either
side of which is hidden joins no mesh and no process groups (see :attr:`Peer.hidden`). Remote
observers attach so, leaving the cluster they look at as it was.
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Sequence
from hashlib import sha256

import attrs
import trio

import wire

CHALLENGE_BYTES = 32
PROTOCOL_VERSION = 2

#: Erlang's node names: ``name@host``, the name of letters, digits, ``_`` and ``-``, the host
#: also of dots; no longer than an atom (255 characters). Nothing else is a peer's name, so a
#: name never carries a newline or a control character into a log line.
NODE_NAME = re.compile(r"[A-Za-z0-9_-]+@[A-Za-z0-9_.-]+")
MAX_NODE_NAME = 255
#: What this release understands beyond version 2's base protocol (the module docstring).
FEATURES: tuple[str, ...] = ("reply_demonitor", "monitor_send")
#: A peer's feature list is read only up to this many names of at most 64 characters each.
MAX_FEATURES = 64


def is_node_name(name: object) -> bool:
    """Whether ``name`` is a node name by the grammar of NODE_NAME."""
    return (
        isinstance(name, str)
        and len(name) <= MAX_NODE_NAME
        and NODE_NAME.fullmatch(name) is not None
    )


def _checked_name(name: str, who: str) -> str:
    if not is_node_name(name):
        raise HandshakeError(
            f"the {who} calls itself {name[:80]!r}{'...' if len(name) > 80 else ''}, which is"
            f" no node name (name@host of letters, digits, '_', '-' and '.', at most"
            f" {MAX_NODE_NAME} characters)"
        )
    return name


class HandshakeError(Exception):
    """The peer failed the handshake; the message says why (logged, the connection dropped)."""


class BadCookie(HandshakeError):
    """The peer does not know our cookie (its digest is wrong)."""


class WrongNode(HandshakeError):
    """Another node than the one dialled answered at the address."""


class HandshakeRefused(HandshakeError):
    """The acceptor closed the connection instead of answering the initiator's hello: it
    refused the initiator (say, for its own dial to it: a simultaneous connect)."""


@attrs.frozen
class Peer:
    """Who is at the other end once the handshake succeeded.

    ``hidden``: either side said it is hidden, so the connection is: it is in no node list
    (``otp.nodes()``), the mesh's peer lists or process groups, and tells no nodeup hook.
    """

    name: str
    creation: int
    codec: wire.Codec
    listen: tuple[str, ...]
    hidden: bool = False
    #: What the peer said it understands (``auth.features``; unknown names kept, unused).
    features: frozenset[str] = frozenset()


def digest(cookie: bytes, role: str, node: str, challenge: bytes) -> bytes:
    message = b"otp-dist-v2\0" + role.encode() + b"\0" + node.encode() + b"\0" + challenge
    return hmac.new(cookie, message, sha256).digest()


async def _receive_handshake(stream: wire.FrameStream, step: str) -> wire.Handshake:
    frame = await stream.receive_frame()
    if frame is None:
        raise HandshakeError(f"the peer closed the connection during the handshake ({step})")
    return _handshake(frame, step)


def _handshake(frame: wire.Frame, step: str) -> wire.Handshake:
    if frame.type is not wire.MessageType.HANDSHAKE:
        raise HandshakeError(f"expected a HANDSHAKE frame ({step}), got {frame.type.name}")
    message = wire.parse_dist(frame)
    assert isinstance(message, wire.Handshake)
    return message


def _bytes(auth: dict[str, object], key: str, step: str) -> bytes:
    value = auth.get(key)
    if not isinstance(value, bytes):
        raise HandshakeError(f"the peer's HANDSHAKE ({step}) lacks auth.{key}")
    return value


def _hello_auth(
    auth: dict[str, object], hidden: bool, features: Sequence[str]
) -> dict[str, object]:
    if hidden:
        auth["hidden"] = True
    auth["features"] = list(features)
    return auth


def _features(auth: dict[str, object]) -> frozenset[str]:
    """The peer's ``auth.features``: none when absent (an older release) or not a list of
    names, and only the first MAX_FEATURES names (a hostile list costs nothing)."""
    value = auth.get("features", [])
    if not isinstance(value, list):
        return frozenset()
    return frozenset(f for f in value[:MAX_FEATURES] if isinstance(f, str) and len(f) <= 64)


def _listen(auth: dict[str, object]) -> tuple[str, ...]:
    value = auth.get("listen", [])
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return tuple(value)
    return ()


async def initiate(
    stream: wire.FrameStream,
    *,
    name: str,
    creation: int,
    cookie: bytes,
    codecs: Sequence[wire.Codec],
    listen: Sequence[str],
    expected: str | None,
    hidden: bool = False,
    features: Sequence[str] = FEATURES,
) -> Peer:
    """Run the initiator's side; returns the peer, or raises :class:`HandshakeError`
    (:class:`BadCookie`, :class:`WrongNode`, ...). ``hidden``: this node is hidden;
    ``features``: what it says it understands (an older release's list in tests)."""
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    await stream.send_frame(
        wire.Handshake(
            name,
            (PROTOCOL_VERSION,),
            tuple(codecs),
            creation,
            _hello_auth({"challenge": challenge, "listen": list(listen)}, hidden, features),
        ).to_frame()
    )
    try:
        frame = await stream.receive_frame()
    except trio.BrokenResourceError as exc:  # a reset: it closed with our hello unread
        raise HandshakeRefused(f"the acceptor refused the connection ({exc})") from exc
    if frame is None:
        raise HandshakeRefused("the acceptor closed the connection instead of answering")
    answer = _handshake(frame, "acceptor's answer")
    _checked_name(answer.node, "acceptor")
    if expected is not None and answer.node != expected:
        raise WrongNode(f"dialled node {expected!r} but {answer.node!r} answered")
    if not answer.codecs or answer.codecs[0] not in codecs:
        raise HandshakeError(f"the acceptor chose a codec we did not offer: {answer.codecs!r}")
    their_digest = _bytes(answer.auth, "digest", "acceptor's answer")
    if not hmac.compare_digest(their_digest, digest(cookie, "acceptor", answer.node, challenge)):
        raise BadCookie(f"node {answer.node!r} does not know our cookie (bad digest)")
    their_challenge = _bytes(answer.auth, "challenge", "acceptor's answer")
    await stream.send_frame(
        wire.Handshake(
            name,
            (PROTOCOL_VERSION,),
            tuple(codecs),
            creation,
            {"digest": digest(cookie, "initiator", name, their_challenge)},
        ).to_frame()
    )
    return Peer(
        answer.node,
        answer.creation,
        answer.codecs[0],
        _listen(answer.auth),
        hidden or answer.auth.get("hidden") is True,
        _features(answer.auth),
    )


async def accept(
    stream: wire.FrameStream,
    *,
    name: str,
    creation: int,
    cookie: bytes,
    codecs: Sequence[wire.Codec],
    listen: Sequence[str],
    admit: object = None,
    hidden: bool = False,
    features: Sequence[str] = FEATURES,
) -> Peer:
    """Run the acceptor's side; returns the peer, or raises :class:`HandshakeError`.
    ``hidden``: this node is hidden; ``features``: what it says it understands.

    ``admit(peer_name)`` (optional) may raise :class:`HandshakeError` to refuse a peer, say one
    that is already connected.
    """
    hello = await _receive_handshake(stream, "initiator's hello")
    _checked_name(hello.node, "initiator")
    if PROTOCOL_VERSION not in hello.versions:
        raise HandshakeError(
            f"node {hello.node!r} speaks versions {list(hello.versions)}, we speak"
            f" {PROTOCOL_VERSION}"
        )
    try:
        codec = wire.choose_codec(hello.codecs, codecs)
    except wire.WireError as exc:
        raise HandshakeError(str(exc)) from None
    their_challenge = _bytes(hello.auth, "challenge", "initiator's hello")
    if callable(admit):
        admit(hello.node)
    challenge = secrets.token_bytes(CHALLENGE_BYTES)
    await stream.send_frame(
        wire.Handshake(
            name,
            (PROTOCOL_VERSION,),
            (codec,),
            creation,
            _hello_auth(
                {
                    "challenge": challenge,
                    "digest": digest(cookie, "acceptor", name, their_challenge),
                    "listen": list(listen),
                },
                hidden,
                features,
            ),
        ).to_frame()
    )
    final = await _receive_handshake(stream, "initiator's proof")
    if final.node != hello.node:
        raise HandshakeError(
            f"the initiator changed its name from {hello.node!r} to {final.node!r}"
        )
    proof = _bytes(final.auth, "digest", "initiator's proof")
    if not hmac.compare_digest(proof, digest(cookie, "initiator", hello.node, challenge)):
        raise BadCookie(f"node {hello.node!r} does not know our cookie (bad digest)")
    await trio.lowlevel.checkpoint()
    return Peer(
        hello.node,
        hello.creation,
        codec,
        _listen(hello.auth),
        hidden or hello.auth.get("hidden") is True,
        _features(hello.auth),
    )
