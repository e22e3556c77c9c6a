"""Matching-service messages (wire version 2, codes 0x40..0x53): what pull workers and clients
say to the matching server (``apps/matching``).

They follow the task streams of pull-based job servers (Temporal's and Hatchet's workers dial
out, open streams and pull work): HELLO/WELCOME open a connection, REGISTER opens a stream on a
queue, TASK offers work that the worker ACCEPTs or DECLINEs and ends with RESULT or FAILURE; a
client's CALL is answered by REPLY or ERROR. Payload keys are the attribute names; the frame's
request id is the ``rid`` attribute (a stream id or a call id). ``wire/SPEC.md`` §4.3 is the
normative description.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ._errors import InvalidValue, MalformedMessage
from ._frame import Codec, Frame, MessageType, encode_message
from ._limits import Limits
from ._matching_checks import (
    _CODEC_NAMES,
    _bad,
    _bool,
    _call_id,
    _codec,
    _codecs,
    _count,
    _delivery,
    _dict,
    _empty_patch,
    _float,
    _flows,
    _got,
    _list,
    _name,
    _one_of,
    _opt_float,
    _opt_name,
    _opt_seconds,
    _patch,
    _rid,
    _seconds,
    _str,
    _stream_id,
    _to_codec,
    _to_codecs,
)
from ._matching_fast import builders, result_encoder

__all__ = [
    "MatchAccept",
    "MatchCall",
    "MatchCancel",
    "MatchClose",
    "MatchDecline",
    "MatchDraining",
    "MatchError",
    "MatchFailure",
    "MatchHello",
    "MatchMessage",
    "MatchOutput",
    "MatchPing",
    "MatchPong",
    "MatchReconnect",
    "MatchRegister",
    "MatchRegistered",
    "MatchRejected",
    "MatchReply",
    "MatchResult",
    "MatchTask",
    "MatchWelcome",
    "encode_call",
    "encode_result",
    "parse_matching",
]

#: :meth:`_Message.encode`'s limits unless told: the protocol's own.
_NO_LIMITS = Limits()

# -- messages -----------------------------------------------------------------------------


class _Message:
    """Base of the matching messages: each knows its own frame."""

    __slots__ = ()

    def to_frame(self, codec: Codec = Codec.TLV) -> Frame:
        """The version 2 frame carrying this message, its payload encoded with ``codec``
        (M_HELLO and M_WELCOME ignore it: they are always TLV)."""
        return _to_frame(self, codec)

    def encode(self, codec: Codec = Codec.TLV, *, limits: Limits = _NO_LIMITS) -> bytes:
        """The bytes of :meth:`to_frame`'s frame (``encode_frame(self.to_frame(codec),
        codec=codec, limits=limits)``), without building the :class:`Frame`: the hot path of
        the matching connections, which write several frames per Step.

        Raises:
            WireError: as :func:`encode_frame`.
        """
        layout = _BY_CLASS[type(self)]
        if layout.tlv_only:
            codec = Codec.TLV
        rid = self.rid if layout.has_rid else 0  # type: ignore[attr-defined]
        return encode_message(
            layout.type, _payload(self, layout), codec=codec, request_id=rid, limits=limits
        )


@attrs.frozen
class MatchHello(_Message):
    """M_HELLO (client or worker -> server, request id 0): the first frame of a connection.

    Always TLV. A worker names its app worker id and the flows it serves; a client has neither.

    Attributes:
        role: ``"worker"`` or ``"client"``.
        session: Random per process (tells a reconnect from another process with the same id).
        token: The bearer token, ``""`` for none.
        worker_id: The app worker id: required (non-empty) for a worker, None for a client.
        codecs: The codecs the sender can decode, most preferred first (``"tlv"``/``"cbor"``
            convert to :class:`Codec`); on parsing, codec names this version does not know are
            dropped.
        flows: Workers: ``{flow_type: {"steps": [str], "rpcs": [str]}}``; ``{}`` for a client.
    """

    role: str = attrs.field(validator=_one_of("worker", "client"))
    session: str = attrs.field(validator=_name)
    token: str = attrs.field(default="", validator=_str)
    worker_id: str | None = attrs.field(default=None, validator=_opt_name)
    codecs: tuple[Codec, ...] = attrs.field(
        default=(Codec.TLV, Codec.CBOR), converter=_to_codecs, validator=_codecs
    )
    flows: dict[str, dict[str, list[str]]] = attrs.field(factory=dict, validator=_flows)

    def __attrs_post_init__(self) -> None:
        if self.role == "worker" and self.worker_id is None:
            raise _bad(self, "worker_id", "a non-empty str for role 'worker'", "None")
        if self.role == "client" and self.worker_id is not None:
            raise _bad(self, "worker_id", "None for role 'client'", _got(self.worker_id))
        if self.role == "client" and self.flows:
            n = len(self.flows)
            raise _bad(self, "flows", "empty for role 'client'", f"{n} flow type{'s' * (n != 1)}")


@attrs.frozen
class MatchWelcome(_Message):
    """M_WELCOME (server -> client or worker, request id 0): the answer to HELLO.

    Always TLV; every later frame of the connection, both ways, uses ``codec``.

    Attributes:
        server: The server's name.
        codec: The connection's codec (one the HELLO offered; ``"tlv"``/``"cbor"`` convert).
        ping_interval: Seconds between the server's M_PING on an idle stream (> 0).
        peer_timeout: Seconds of silence after which a peer is dropped (> 0).
    """

    server: str = attrs.field(validator=_str)
    codec: Codec = attrs.field(converter=_to_codec, validator=_codec)
    ping_interval: float = attrs.field(converter=_float, validator=_seconds)
    peer_timeout: float = attrs.field(converter=_float, validator=_seconds)


@attrs.frozen
class MatchRegister(_Message):
    """M_REGISTER (worker -> server): open the stream ``rid`` on a queue.

    Attributes:
        queue: ``"flow"`` (the flow-type queue ``name``) or ``"worker"`` (the queue of the app
            worker id ``name``).
        name: The flow type or the app worker id.
        rid: The stream id, chosen by the worker, unique per connection, non-zero.
    """

    queue: str = attrs.field(validator=_one_of("flow", "worker"))
    name: str = attrs.field(validator=_name)
    rid: int = _stream_id()


@attrs.frozen
class MatchRegistered(_Message):
    """M_REGISTERED (server -> worker): the stream ``rid`` is registered on that queue."""

    queue: str = attrs.field(validator=_one_of("flow", "worker"))
    name: str = attrs.field(validator=_name)
    rid: int = _stream_id()


@attrs.frozen
class MatchRejected(_Message):
    """M_REJECTED (server -> worker): the stream ``rid`` was not registered.

    Attributes:
        code: An error code (``wire/SPEC.md`` §4.3), e.g. ``"already_registered"``.
        message: What went wrong, for people.
        permanent: True if registering again cannot succeed (do not retry).
    """

    code: str = attrs.field(validator=_name)
    message: str = attrs.field(validator=_str)
    permanent: bool = attrs.field(validator=_bool)
    rid: int = _stream_id()


@attrs.frozen
class MatchTask(_Message):
    """M_TASK (server -> worker): an offer of one step attempt or RPC call on the stream ``rid``;
    the worker answers M_ACCEPT or M_DECLINE with the same ``delivery``.

    Attributes:
        delivery: The delivery id (unique per server run), 0..2**64-1.
        kind: ``"step"`` or ``"rpc"``.
        flow_type, flow_id, name: The flow and the step or RPC name.
        execution_id: Stable across the attempts of one step execution.
        attempt: The attempt number (steps count from 1).
        args: The arguments (a list).
        state: The flow's state (a dict).
        timeout: Seconds the attempt may take, or None.
        step_kind: A step's kind, ``"execute"`` or ``"wait_for"`` (optional: left out for
            RPCs and by older servers, meaning ``"execute"``).
    """

    delivery: int = attrs.field(validator=_delivery)
    kind: str = attrs.field(validator=_one_of("step", "rpc"))
    flow_type: str = attrs.field(validator=_name)
    flow_id: str = attrs.field(validator=_name)
    name: str = attrs.field(validator=_name)
    execution_id: str = attrs.field(validator=_name)
    attempt: int = attrs.field(validator=_count)
    args: list[Any] = attrs.field(validator=_list)
    state: dict[Any, Any] = attrs.field(validator=_dict)
    timeout: float | None = attrs.field(default=None, converter=_opt_float, validator=_opt_seconds)
    step_kind: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_one_of("execute", "wait_for"))
    )
    rid: int = _stream_id()


@attrs.frozen
class MatchAccept(_Message):
    """M_ACCEPT (worker -> server): the worker runs ``delivery``."""

    delivery: int = attrs.field(validator=_delivery)
    rid: int = _stream_id()


@attrs.frozen
class MatchDecline(_Message):
    """M_DECLINE (worker -> server): the worker will not run ``delivery``.

    Attributes:
        reason: ``"no_capacity"``, ``"unknown_name"`` or ``"draining"``.
        message: Details for people (``""`` for none).
    """

    delivery: int = attrs.field(validator=_delivery)
    reason: str = attrs.field(validator=_one_of("no_capacity", "unknown_name", "draining"))
    message: str = attrs.field(default="", validator=_str)
    rid: int = _stream_id()


@attrs.frozen
class MatchCancel(_Message):
    """M_CANCEL (server -> worker): stop running ``delivery`` (its flow was cancelled); the
    worker cancels the handler if it can and answers with M_FAILURE (``type``
    ``"Cancelled"``), or with the outcome of a handler that could not be stopped."""

    delivery: int = attrs.field(validator=_delivery)
    rid: int = _stream_id()


@attrs.frozen
class MatchOutput(_Message):
    """M_OUTPUT (worker -> server): progress ``value`` of ``delivery``; once one is sent, a
    worker lost with the call is a failed attempt (not a re-dispatch)."""

    delivery: int = attrs.field(validator=_delivery)
    value: Any
    rid: int = _stream_id()


@attrs.frozen
class MatchResult(_Message):
    """M_RESULT (worker -> server): ``delivery`` returned ``value``; ``patch`` is the state
    change, ``{"set": {key: value}, "delete": [key]}``. ``not_yet`` (optional, True or left
    out): a WaitFor Step's check found its condition false (``value`` is None, ``patch``
    empty); the server asks again after the flow's state changes."""

    delivery: int = attrs.field(validator=_delivery)
    value: Any
    patch: dict[str, Any] = attrs.field(factory=_empty_patch, validator=_patch)
    not_yet: bool | None = attrs.field(default=None, validator=attrs.validators.optional(_bool))
    rid: int = _stream_id()


@attrs.frozen
class MatchFailure(_Message):
    """M_FAILURE (worker -> server): ``delivery`` raised; ``type`` and ``message`` describe the
    exception, ``retryable`` says whether another attempt may succeed."""

    delivery: int = attrs.field(validator=_delivery)
    type: str = attrs.field(validator=_name)
    message: str = attrs.field(validator=_str)
    retryable: bool = attrs.field(validator=_bool)
    rid: int = _stream_id()


@attrs.frozen
class MatchPing(_Message):
    """M_PING (server -> worker): a keepalive on the stream ``rid``, or on the connection (0)."""

    rid: int = attrs.field(default=0, kw_only=True, validator=_rid("stream", zero=True))


@attrs.frozen
class MatchPong(_Message):
    """M_PONG (worker -> server): the answer to M_PING, and a running task's keepalive."""

    rid: int = attrs.field(default=0, kw_only=True, validator=_rid("stream", zero=True))


@attrs.frozen
class MatchDraining(_Message):
    """M_DRAINING (worker -> server, request id 0): no new tasks, no sticky routing to this
    worker."""


@attrs.frozen
class MatchReconnect(_Message):
    """M_RECONNECT (server -> worker, request id 0): finish running calls, then reconnect;
    ``reason`` says why, for people."""

    reason: str = attrs.field(default="", validator=_str)


@attrs.frozen
class MatchClose(_Message):
    """M_CLOSE (either way): the stream ``rid`` is closed."""

    rid: int = _stream_id()


@attrs.frozen
class MatchCall(_Message):
    """M_CALL (client or worker -> server): call ``op`` with ``args`` under the call id ``rid``
    (chosen by the caller, non-zero); answered by M_REPLY or M_ERROR with the same id."""

    op: str = attrs.field(validator=_name)
    args: dict[Any, Any] = attrs.field(validator=_dict)
    rid: int = _call_id()


@attrs.frozen
class MatchReply(_Message):
    """M_REPLY (server -> caller): the call ``rid`` returned ``value``."""

    value: Any
    rid: int = _call_id()


@attrs.frozen
class MatchError(_Message):
    """M_ERROR (server -> caller): the call ``rid`` failed, or (``rid`` 0) the connection did.

    Attributes:
        code: An error code (``wire/SPEC.md`` §4.3), e.g. ``"flow_not_found"``.
        message: What went wrong, for people.
        retryable: True if the same call may succeed later.
        details: Further data (a dict).
    """

    code: str = attrs.field(validator=_name)
    message: str = attrs.field(validator=_str)
    retryable: bool = attrs.field(default=False, validator=_bool)
    details: dict[Any, Any] = attrs.field(factory=dict, validator=_dict)
    rid: int = attrs.field(default=0, kw_only=True, validator=_rid("call", zero=True))


MatchMessage = (
    MatchHello
    | MatchWelcome
    | MatchRegister
    | MatchRegistered
    | MatchRejected
    | MatchTask
    | MatchAccept
    | MatchDecline
    | MatchOutput
    | MatchResult
    | MatchFailure
    | MatchPing
    | MatchPong
    | MatchDraining
    | MatchReconnect
    | MatchClose
    | MatchCall
    | MatchReply
    | MatchError
    | MatchCancel
)

# -- the table: message class -> type; payload keys are the attributes other than rid ---------

_TYPES: dict[type, MessageType] = {
    MatchHello: MessageType.M_HELLO,
    MatchWelcome: MessageType.M_WELCOME,
    MatchRegister: MessageType.M_REGISTER,
    MatchRegistered: MessageType.M_REGISTERED,
    MatchRejected: MessageType.M_REJECTED,
    MatchTask: MessageType.M_TASK,
    MatchAccept: MessageType.M_ACCEPT,
    MatchDecline: MessageType.M_DECLINE,
    MatchOutput: MessageType.M_OUTPUT,
    MatchResult: MessageType.M_RESULT,
    MatchFailure: MessageType.M_FAILURE,
    MatchPing: MessageType.M_PING,
    MatchPong: MessageType.M_PONG,
    MatchDraining: MessageType.M_DRAINING,
    MatchReconnect: MessageType.M_RECONNECT,
    MatchClose: MessageType.M_CLOSE,
    MatchCall: MessageType.M_CALL,
    MatchReply: MessageType.M_REPLY,
    MatchError: MessageType.M_ERROR,
    MatchCancel: MessageType.M_CANCEL,
}
#: Payload keys a sender may leave out (the attribute's default applies); omitted when None.
_OPTIONAL: dict[type, frozenset[str]] = {
    MatchHello: frozenset({"worker_id", "flows"}),
    MatchTask: frozenset({"step_kind"}),
    MatchResult: frozenset({"not_yet"}),
}
#: Always TLV, so they can be read before a codec is agreed.
_TLV_ONLY = frozenset({MatchHello, MatchWelcome})
#: attribute -> its payload form, where that is not the attribute's value itself.
_ENCODE: dict[str, Callable[[Any], Any]] = {
    "codec": lambda codec: codec.value,
    "codecs": lambda codecs: [c.value for c in codecs],
}
#: payload key -> what the constructor gets: codec names a later version adds are dropped.
_DECODE: dict[str, Callable[[Any], Any]] = {
    "codecs": lambda names: (
        [c for c in names if type(c) is not str or c in _CODEC_NAMES]
        if type(names) is list
        else names
    ),
}


@attrs.frozen
class _Layout:
    cls: type
    type: MessageType
    keys: tuple[str, ...]
    optional: frozenset[str]
    has_rid: bool
    tlv_only: bool
    #: How :func:`_payload` writes each key: (key, its encoder or None, whether it is left
    #: out when None), worked out once per class rather than looked up per message.
    plan: tuple[tuple[str, Callable[[Any], Any] | None, bool], ...]
    #: How :func:`parse_matching` reads each key: (key, its decoder or None, optional).
    reads: tuple[tuple[str, Callable[[Any], Any] | None, bool], ...]


def _layout(cls: type, mtype: MessageType) -> _Layout:
    names = [a.name for a in attrs.fields(cls)]
    keys = tuple(n for n in names if n != "rid")
    optional = _OPTIONAL.get(cls, frozenset())
    plan = tuple((key, _ENCODE.get(key), key in optional) for key in keys)
    reads = tuple((key, _DECODE.get(key), key in optional) for key in keys)
    return _Layout(cls, mtype, keys, optional, "rid" in names, cls in _TLV_ONLY, plan, reads)


_BY_CLASS = {cls: _layout(cls, mtype) for cls, mtype in _TYPES.items()}
_BY_TYPE = {layout.type: layout for layout in _BY_CLASS.values()}
#: What parse_matching builds the messages read most often with (``_matching_fast.py``).
_FAST = builders(
    task=MatchTask,
    reply=MatchReply,
    accept=MatchAccept,
    result=MatchResult,
    failure=MatchFailure,
    call=MatchCall,
)
#: The same builders by frame type (a frame of one of these types is one of these messages).
_FAST_BY_TYPE = {_BY_CLASS[cls].type: build for cls, build in _FAST.items()}
assert not _TLV_ONLY & _FAST.keys()
#: A worker's M_ACCEPT and M_RESULT bytes without building them (``_matching_fast.py``).
encode_result = result_encoder(MatchAccept, MatchResult)


def _payload(message: Any, layout: _Layout) -> dict[str, Any] | None:
    """``message``'s payload: its attributes other than ``rid`` (None: no payload)."""
    if not layout.plan:
        return None
    payload: dict[str, Any] = {}
    for key, encode, optional in layout.plan:
        value = getattr(message, key)
        if value is None and optional:
            continue
        payload[key] = value if encode is None else encode(value)
    return payload


def encode_call(
    op: str,
    args: dict[Any, Any],
    rid: int,
    codec: Codec = Codec.TLV,
    *,
    limits: Limits = _NO_LIMITS,
) -> bytes:
    """``MatchCall(op=op, args=args, rid=rid).encode(codec, limits=limits)``: the same bytes
    and the same errors, without building the message (a client writes one per call).

    Raises:
        InvalidValue: A field is invalid (as :class:`MatchCall` says).
        WireError: as :func:`encode_frame`.
    """
    if type(op) is str and op and type(args) is dict and type(rid) is int and 0 < rid <= _U64:
        return encode_message(
            MessageType.M_CALL, {"op": op, "args": args}, codec=codec, request_id=rid, limits=limits
        )
    return MatchCall(op=op, args=args, rid=rid).encode(codec, limits=limits)


_U64 = (1 << 64) - 1


def _to_frame(message: Any, codec: Codec) -> Frame:
    layout = _BY_CLASS[type(message)]
    if layout.tlv_only:
        codec = Codec.TLV
    rid = message.rid if layout.has_rid else 0
    return Frame(layout.type, rid, _payload(message, layout), version=2, codec=codec)


def parse_matching(frame: Frame) -> MatchMessage:
    """Check a matching frame's shape and return it as a typed message.

    The frame's request id becomes ``rid``. Extra payload keys are ignored, so later versions
    can add fields; the messages without a payload (M_PING, M_PONG, M_DRAINING, M_CLOSE) accept
    an empty payload or a dict.

    Raises:
        MalformedMessage: The frame is not a matching message; a key is missing or has the
            wrong type or value; a request id is 0 where a stream or call id is required, or
            not 0 on a connection-level message; or M_HELLO/M_WELCOME is not TLV. The message
            names the message type and the key.
    """
    t = frame.type
    payload = frame.payload
    fast = _FAST_BY_TYPE.get(t)  # (none is TLV-only)
    if fast is not None and type(payload) is dict:
        message = fast(payload, frame.request_id)
        if message is not None:
            return message
    layout = _BY_TYPE.get(t)
    if layout is None:
        raise MalformedMessage(f"{t.name} is not a matching message type")
    if layout.cls in _TLV_ONLY and frame.codec is not Codec.TLV:
        raise MalformedMessage(f"{t.name} frames are always TLV (got a {frame.codec.name} payload)")
    if payload is None and not layout.keys:
        payload = {}
    elif type(payload) is not dict:
        got = "an empty payload" if payload is None else type(payload).__name__
        raise MalformedMessage(f"the {t.name} payload must be a dict (got {got})")
    args: dict[str, Any] = {}
    for key, decode, optional in layout.reads:
        if key not in payload:
            if optional:
                continue
            raise MalformedMessage(f"{t.name} payload lacks the key {key!r}")
        args[key] = payload[key] if decode is None else decode(payload[key])
    if layout.has_rid:
        args["rid"] = frame.request_id
    elif frame.request_id != 0:
        raise MalformedMessage(
            f"{t.name} is a connection-level message: its request id must be 0 (got "
            f"{frame.request_id})"
        )
    try:
        message = layout.cls(**args)
    except InvalidValue as exc:
        raise MalformedMessage(f"malformed {t.name} frame: {exc.message}") from exc
    return message
