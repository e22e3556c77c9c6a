"""Distribution messages (wire version 2): what nodes say to each other about processes.

They follow the control messages of Erlang's distribution protocol (SEND, REG_SEND, LINK,
UNLINK, EXIT, MONITOR_P, DEMONITOR_P, MONITOR_P_EXIT), with payloads as dicts of wire values
so that each field has a name in ``wire/SPEC.md``; MONITOR_SEND is a MONITOR and the message
that follows it in one frame (a call's two control messages).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import attrs

from ._cbor import cbor_encode
from ._errors import InvalidValue, LimitExceeded, MalformedMessage
from ._frame import CBOR_FLAG, HEADER, MAGIC, Codec, Frame, MessageType
from ._limits import Limits
from ._tlv_encode import tlv_encode
from ._values import Atom, ExitReason, Pid, Ref

__all__ = [
    "Demonitor",
    "Down",
    "Exit",
    "Exit2",
    "Handshake",
    "Link",
    "Monitor",
    "MonitorSend",
    "Ping",
    "Pong",
    "RegSend",
    "RegSendBatch",
    "Send",
    "SendBatch",
    "Unlink",
    "choose_codec",
    "encode_batch",
    "encode_value",
    "parse_dist",
]


def _pid(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not Pid:
        raise InvalidValue(
            f"{type(inst).__name__}.{attribute.name} must be a Pid (got {type(value).__name__})"
        )


def _opt_pid(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _pid(inst, attribute, value)


def _ref(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not Ref:
        raise InvalidValue(
            f"{type(inst).__name__}.{attribute.name} must be a Ref (got {type(value).__name__})"
        )


def _reason(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not ExitReason:
        raise InvalidValue(
            f"{type(inst).__name__}.{attribute.name} must be an ExitReason (got "
            f"{type(value).__name__})"
        )


def _name(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) not in (Atom, str):
        raise InvalidValue(
            f"{type(inst).__name__}.{attribute.name} must be an Atom or a str (got "
            f"{type(value).__name__})"
        )


def _target(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) not in (Pid, Atom, str):
        raise InvalidValue(
            f"{type(inst).__name__}.{attribute.name} must be a Pid or a registered name (Atom "
            f"or str) (got {type(value).__name__})"
        )


class _Message:
    """Base of the distribution messages: each knows its own frame."""

    __slots__ = ()

    def to_frame(self, codec: Codec = Codec.TLV) -> Frame:
        """The version 2 frame carrying this message, its payload encoded with ``codec``."""
        return _to_frame(self, codec)


def _codecs(value: Sequence[Codec | str]) -> tuple[Codec, ...]:
    return tuple(Codec(c) for c in value)


@attrs.frozen
class Handshake:
    """One handshake frame: who we are, what we speak, and the authentication fields.

    HANDSHAKE frames are always TLV-encoded, so both sides can read them before a codec is
    chosen. The first frame each side sends carries ``node``, ``versions`` and ``codecs``;
    authentication (challenge, digest, token) travels in ``auth`` and is defined by the
    distribution layer, not here.

    Attributes:
        node: The sender's node name.
        versions: Protocol versions the sender speaks.
        codecs: Payload codecs the sender can decode, most preferred first.
        creation: The sender's incarnation number (as in its pids).
        auth: Further fields (str keys), e.g. ``{"challenge": b"..."}``.
    """

    node: str
    versions: tuple[int, ...] = (2,)
    codecs: tuple[Codec, ...] = attrs.field(default=(Codec.TLV, Codec.CBOR), converter=_codecs)
    creation: int = 0
    auth: dict[str, Any] = attrs.field(factory=dict)

    def to_frame(self, request_id: int = 0) -> Frame:
        payload = {
            "node": self.node,
            "versions": list(self.versions),
            "codecs": [c.value for c in self.codecs],
            "creation": self.creation,
            "auth": self.auth,
        }
        return Frame(MessageType.HANDSHAKE, request_id, payload, version=2)


def choose_codec(offered: Sequence[Codec], supported: Sequence[Codec]) -> Codec:
    """The codec a connection uses: the first of the initiator's ``offered`` codecs the acceptor
    also ``supported``.

    Raises:
        InvalidValue: The two lists have nothing in common.
    """
    for codec in offered:
        if codec in supported:
            return codec
    raise InvalidValue(
        f"no common codec: offered {[c.value for c in offered]}, supported "
        f"{[c.value for c in supported]}"
    )


@attrs.frozen
class Send(_Message):
    """SEND: deliver ``message`` to the process ``to``; ``sender`` is optional, as in Erlang."""

    to: Pid = attrs.field(validator=_pid)
    message: Any
    sender: Pid | None = attrs.field(default=None, validator=_opt_pid)


@attrs.frozen
class RegSend(_Message):
    """REG_SEND: deliver ``message`` to the process registered as ``to`` on the peer node."""

    sender: Pid = attrs.field(validator=_pid)
    to: Atom | str = attrs.field(validator=_name)
    message: Any


def _messages(value: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(value)


@attrs.frozen
class SendBatch(_Message):
    """SEND_BATCH: deliver each of ``messages``, in order, to the process ``to``: what that
    many SENDs would do, with the routing fields written once."""

    to: Pid = attrs.field(validator=_pid)
    messages: tuple[Any, ...] = attrs.field(converter=_messages)
    sender: Pid | None = attrs.field(default=None, validator=_opt_pid)


@attrs.frozen
class RegSendBatch(_Message):
    """REG_SEND_BATCH: deliver each of ``messages``, in order, to the process registered as
    ``to``: what that many REG_SENDs would do."""

    sender: Pid = attrs.field(validator=_pid)
    to: Atom | str = attrs.field(validator=_name)
    messages: tuple[Any, ...] = attrs.field(converter=_messages)


@attrs.frozen
class Link(_Message):
    """LINK: ``sender`` links to ``to``."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid = attrs.field(validator=_pid)


@attrs.frozen
class Unlink(_Message):
    """UNLINK: ``sender`` removes its link to ``to``."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid = attrs.field(validator=_pid)


@attrs.frozen
class Exit(_Message):
    """EXIT: an exit signal from ``sender`` to ``to`` (a broken link, or ``exit(pid, reason)``)."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid = attrs.field(validator=_pid)
    reason: ExitReason = attrs.field(validator=_reason)


@attrs.frozen
class Exit2(_Message):
    """EXIT2: ``exit(to, reason)`` called by ``sender`` (not a broken link): a ``kill`` sent
    this way becomes ``killed``, as Erlang's ``exit/2``."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid = attrs.field(validator=_pid)
    reason: ExitReason = attrs.field(validator=_reason)


@attrs.frozen
class Monitor(_Message):
    """MONITOR: ``sender`` monitors ``to`` (a pid or a registered name) under ``ref``."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid | Atom | str = attrs.field(validator=_target)
    ref: Ref = attrs.field(validator=_ref)


@attrs.frozen
class MonitorSend(_Message):
    """MONITOR_SEND: ``sender`` monitors ``to`` (a pid or a registered name) under ``ref``,
    then ``message`` is delivered to ``to``: exactly a MONITOR followed by a SEND (``to`` a
    pid) or a REG_SEND (a name), in one frame. Sent only to a peer whose handshake lists the
    ``monitor_send`` feature (see SPEC.md)."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid | Atom | str = attrs.field(validator=_target)
    ref: Ref = attrs.field(validator=_ref)
    message: Any


@attrs.frozen
class Demonitor(_Message):
    """DEMONITOR: ``sender`` drops its monitor ``ref`` on ``to``."""

    sender: Pid = attrs.field(validator=_pid)
    to: Pid | Atom | str = attrs.field(validator=_target)
    ref: Ref = attrs.field(validator=_ref)


@attrs.frozen
class Down(_Message):
    """DOWN: the process ``sender`` monitored by ``to`` under ``ref`` exited with ``reason``."""

    sender: Pid | Atom | str = attrs.field(validator=_target)
    to: Pid = attrs.field(validator=_pid)
    ref: Ref = attrs.field(validator=_ref)
    reason: ExitReason = attrs.field(validator=_reason)


@attrs.frozen
class Ping(_Message):
    """PING: a liveness probe; the frame's request id is the sequence number PONG echoes."""

    seq: int = 0


@attrs.frozen
class Pong(_Message):
    """PONG: the answer to the PING with the same sequence number."""

    seq: int = 0


DistMessage = (
    Handshake
    | Send
    | RegSend
    | SendBatch
    | RegSendBatch
    | Link
    | Unlink
    | Exit
    | Exit2
    | Monitor
    | MonitorSend
    | Demonitor
    | Down
    | Ping
    | Pong
)

# message class -> (type, [(attribute, payload key)])
_LAYOUT: dict[type, tuple[MessageType, tuple[tuple[str, str], ...]]] = {
    Send: (MessageType.SEND, (("to", "to"), ("message", "msg"), ("sender", "from"))),
    RegSend: (MessageType.REG_SEND, (("sender", "from"), ("to", "to"), ("message", "msg"))),
    SendBatch: (
        MessageType.SEND_BATCH,
        (("to", "to"), ("sender", "from"), ("messages", "msgs")),
    ),
    RegSendBatch: (
        MessageType.REG_SEND_BATCH,
        (("sender", "from"), ("to", "to"), ("messages", "msgs")),
    ),
    Link: (MessageType.LINK, (("sender", "from"), ("to", "to"))),
    Unlink: (MessageType.UNLINK, (("sender", "from"), ("to", "to"))),
    Exit: (MessageType.EXIT, (("sender", "from"), ("to", "to"), ("reason", "reason"))),
    Exit2: (MessageType.EXIT2, (("sender", "from"), ("to", "to"), ("reason", "reason"))),
    Monitor: (MessageType.MONITOR, (("sender", "from"), ("to", "to"), ("ref", "ref"))),
    MonitorSend: (
        MessageType.MONITOR_SEND,
        (("sender", "from"), ("to", "to"), ("ref", "ref"), ("message", "msg")),
    ),
    Demonitor: (MessageType.DEMONITOR, (("sender", "from"), ("to", "to"), ("ref", "ref"))),
    Down: (
        MessageType.DOWN,
        (("sender", "from"), ("to", "to"), ("ref", "ref"), ("reason", "reason")),
    ),
}
_BY_TYPE = {mtype: (cls, fields) for cls, (mtype, fields) in _LAYOUT.items()}
_OPTIONAL = {(Send, "from"), (SendBatch, "from")}


def _to_frame(self: Any, codec: Codec = Codec.TLV) -> Frame:
    if type(self) is Ping or type(self) is Pong:
        mtype = MessageType.PING if type(self) is Ping else MessageType.PONG
        return Frame(mtype, self.seq, None, version=2, codec=codec)
    mtype, fields = _LAYOUT[type(self)]
    payload = {}
    for attribute, key in fields:
        value = getattr(self, attribute)
        if value is None and (type(self), key) in _OPTIONAL:
            continue
        payload[key] = list(value) if key == "msgs" else value
    return Frame(mtype, 0, payload, version=2, codec=codec)


def parse_dist(frame: Frame) -> DistMessage:
    """Check a distribution frame's payload shape and return it as a typed message.

    Extra payload keys are ignored, so later versions can add fields.

    Raises:
        MalformedMessage: A key is missing or has the wrong type, or the frame is not a
            distribution message.
    """
    t = frame.type
    payload = frame.payload
    if t is MessageType.PING or t is MessageType.PONG:
        if payload is not None:
            raise MalformedMessage(f"{t.name} carries no payload (got {type(payload).__name__})")
        return Ping(frame.request_id) if t is MessageType.PING else Pong(frame.request_id)
    if type(payload) is not dict:
        raise MalformedMessage(f"a {t.name} payload must be a dict (got {type(payload).__name__})")
    if t is MessageType.HANDSHAKE:
        try:
            node = payload["node"]
            versions = payload.get("versions", [2])
            codecs = payload.get("codecs", ["tlv"])
            creation = payload.get("creation", 0)
            auth = payload.get("auth", {})
            if type(node) is not str or type(versions) is not list or type(codecs) is not list:
                raise TypeError("node must be a str, versions and codecs lists")
            if type(creation) is not int or type(auth) is not dict:
                raise TypeError("creation must be an int and auth a dict")
            known = [c for c in codecs if c in ("tlv", "cbor")]
            return Handshake(node, tuple(versions), tuple(known), creation, auth)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedMessage(f"malformed HANDSHAKE payload: {exc}") from exc
    entry = _BY_TYPE.get(t)
    if entry is None:
        raise MalformedMessage(f"{t.name} is not a distribution message type")
    cls, fields = entry
    args = {}
    for attribute, key in fields:
        if key not in payload:
            if (cls, key) in _OPTIONAL:
                continue
            raise MalformedMessage(f"{t.name} payload lacks the key {key!r}")
        args[attribute] = payload[key]
    if "messages" in args and type(args["messages"]) is not list:
        raise MalformedMessage(
            f"a {t.name} payload's msgs must be a list (got {type(args['messages']).__name__})"
        )
    try:
        return cls(**args)
    except InvalidValue as exc:
        raise MalformedMessage(f"malformed {t.name} payload: {exc.message}") from exc


_DEFAULT_LIMITS = Limits()


def encode_value(value: Any, codec: Codec, *, limits: Limits = _DEFAULT_LIMITS) -> bytes:
    """One version 2 value alone, as it appears inside a payload encoded with ``codec``: the
    items :func:`encode_batch` takes (so a sender learns of a bad value when it sends it).

    Raises:
        WireError: as :func:`tlv_encode` / :func:`cbor_encode`.
    """
    if codec is Codec.TLV:
        return tlv_encode(value, version=2, limits=limits)
    return cbor_encode(value, limits=limits)


_TLV_EMPTY_LIST = b"\x20\x00\x00\x00\x00"
_TLV_COUNT = struct.Struct(">I")
_CBOR_EMPTY_ARRAY = b"\x80"


def _cbor_array_head(n: int) -> bytes:
    if n < 24:
        return bytes((0x80 + n,))
    if n < 0x100:
        return bytes((0x98, n))
    if n < 0x10000:
        return b"\x99" + n.to_bytes(2, "big")
    return b"\x9a" + n.to_bytes(4, "big")


def encode_batch(
    mtype: MessageType,
    fields: dict[str, Any],
    items: Sequence[bytes],
    codec: Codec,
    *,
    limits: Limits = _DEFAULT_LIMITS,
) -> bytes:
    """A whole SEND_BATCH or REG_SEND_BATCH frame from its routing ``fields`` (``to``, ``from``)
    and messages already encoded by :func:`encode_value`: the bytes equal encoding the payload
    ``{**fields, "msgs": [...]}`` in one go, without encoding any message twice.

    Raises:
        MalformedMessage: ``mtype`` is not a batch type, or ``fields`` has a ``msgs`` key.
        LimitExceeded: More messages than ``limits.max_items``, or a payload over
            ``limits.max_payload``.
    """
    if mtype is not MessageType.SEND_BATCH and mtype is not MessageType.REG_SEND_BATCH:
        raise MalformedMessage(f"{mtype.name} is not a batch message type")
    if "msgs" in fields:
        raise MalformedMessage("batch fields must not hold msgs: pass the messages as items")
    n = len(items)
    if n > limits.max_items:
        raise LimitExceeded(f"a batch of {n} messages exceeds max_items={limits.max_items}")
    # "msgs" is the payload's last key in both codecs: TLV keeps insertion order, and in CBOR's
    # deterministic order it sorts after "to" and "from". So the payload is the encoding of the
    # fields with an empty msgs list, that list's head rewritten for n items, then the items.
    if codec is Codec.TLV:
        head = tlv_encode({**fields, "msgs": []}, version=2, limits=limits)
        if not head.endswith(_TLV_EMPTY_LIST):
            raise MalformedMessage("msgs must be the last key of a batch payload")
        parts = [head[:-4], _TLV_COUNT.pack(n), *items]
        code = int(mtype)
    else:
        head = cbor_encode({**fields, "msgs": []}, limits=limits)
        if not head.endswith(_CBOR_EMPTY_ARRAY):
            raise MalformedMessage("msgs must be the last key of a batch payload")
        parts = [head[:-1], _cbor_array_head(n), *items]
        code = int(mtype) | CBOR_FLAG
    length = sum(map(len, parts))
    if length > limits.max_payload:
        raise LimitExceeded(
            f"{mtype.name} payload of {length} bytes exceeds max_payload={limits.max_payload}; "
            "send fewer messages per batch"
        )
    return b"".join([HEADER.pack(MAGIC, 2, code, length, 0), *parts])
