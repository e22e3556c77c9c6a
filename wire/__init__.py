"""wire: frames and values between processes, byte-compatible with Gunicorn's dirty protocol.

Version 1 is Gunicorn 27's dirty protocol ("GD" header, TLV payloads) byte for byte; version 2
adds the values actors send (pids, refs, atoms, tuples, big ints, exit reasons, errors), CBOR
payloads and distribution messages. The normative description is ``wire/SPEC.md``.

The codecs are pure Python, with optional C fast paths (``wire/_speedups.c``, built by
``pip install`` where a C compiler is present) for the common values: they give the same bytes
and values, and hand anything unusual, and every error, back to the Python code. Setting
``WIRE_NO_SPEEDUPS=1`` turns them off. The same extension holds ``IdTriple``, the base of otp's
``Pid`` and ``Ref`` (equal and hashed by node, id and creation), whose hash it makes a field read.
"""

from __future__ import annotations

from ._cbor import CborTag as CborTag
from ._cbor import cbor_decode as cbor_decode
from ._cbor import cbor_encode as cbor_encode
from ._dirty import Chunk as Chunk
from ._dirty import End as End
from ._dirty import ErrorReply as ErrorReply
from ._dirty import Manage as Manage
from ._dirty import ManageOp as ManageOp
from ._dirty import Request as Request
from ._dirty import Response as Response
from ._dirty import Stash as Stash
from ._dirty import StashOp as StashOp
from ._dirty import Status as Status
from ._dirty import check_reply as check_reply
from ._dirty import make_chunk as make_chunk
from ._dirty import make_end as make_end
from ._dirty import make_error as make_error
from ._dirty import make_manage as make_manage
from ._dirty import make_request as make_request
from ._dirty import make_response as make_response
from ._dirty import make_stash as make_stash
from ._dirty import make_status as make_status
from ._dirty import parse_dirty as parse_dirty
from ._dirty import request_id_from_str as request_id_from_str
from ._dirty_bytes import BIG_BYTES as BIG_BYTES
from ._dirty_bytes import big_bytes as big_bytes
from ._dirty_bytes import encode_dirty as encode_dirty
from ._dirty_bytes import encode_header as encode_header
from ._dirty_bytes import fast_opens_with as fast_opens_with
from ._dirty_bytes import opens_with as opens_with
from ._dirty_bytes import peek_route as peek_route
from ._dirty_bytes import reply_parts as reply_parts
from ._dirty_bytes import request_fields as request_fields
from ._dirty_bytes import request_parts as request_parts
from ._dirty_bytes import route_length as route_length
from ._dist import Demonitor as Demonitor
from ._dist import Down as Down
from ._dist import Exit as Exit
from ._dist import Exit2 as Exit2
from ._dist import Handshake as Handshake
from ._dist import Link as Link
from ._dist import Monitor as Monitor
from ._dist import MonitorSend as MonitorSend
from ._dist import Ping as Ping
from ._dist import Pong as Pong
from ._dist import RegSend as RegSend
from ._dist import RegSendBatch as RegSendBatch
from ._dist import Send as Send
from ._dist import SendBatch as SendBatch
from ._dist import Unlink as Unlink
from ._dist import choose_codec as choose_codec
from ._dist import encode_batch as encode_batch
from ._dist import encode_value as encode_value
from ._dist import parse_dist as parse_dist
from ._errors import BadFrameHeader as BadFrameHeader
from ._errors import BadMagic as BadMagic
from ._errors import InvalidUtf8 as InvalidUtf8
from ._errors import InvalidValue as InvalidValue
from ._errors import LimitExceeded as LimitExceeded
from ._errors import MalformedMessage as MalformedMessage
from ._errors import RequestIdMismatch as RequestIdMismatch
from ._errors import TrailingBytes as TrailingBytes
from ._errors import Truncated as Truncated
from ._errors import UnknownMessageType as UnknownMessageType
from ._errors import UnknownValueType as UnknownValueType
from ._errors import UnsupportedVersion as UnsupportedVersion
from ._errors import ValueOutOfRange as ValueOutOfRange
from ._errors import WireError as WireError
from ._frame import CBOR_FLAG as CBOR_FLAG
from ._frame import HEADER as HEADER
from ._frame import HEADER_SIZE as HEADER_SIZE
from ._frame import MAGIC as MAGIC
from ._frame import Codec as Codec
from ._frame import Frame as Frame
from ._frame import FrameDecoder as FrameDecoder
from ._frame import MessageType as MessageType
from ._frame import encode_frame as encode_frame
from ._frame import encode_message as encode_message
from ._id_triple import IdTriple as IdTriple
from ._json import frame_from_json as frame_from_json
from ._json import frame_to_json as frame_to_json
from ._json import from_json as from_json
from ._json import to_json as to_json
from ._limits import MAX_PAYLOAD as MAX_PAYLOAD
from ._limits import Limits as Limits
from ._matching import MatchAccept as MatchAccept
from ._matching import MatchCall as MatchCall
from ._matching import MatchCancel as MatchCancel
from ._matching import MatchClose as MatchClose
from ._matching import MatchDecline as MatchDecline
from ._matching import MatchDraining as MatchDraining
from ._matching import MatchError as MatchError
from ._matching import MatchFailure as MatchFailure
from ._matching import MatchHello as MatchHello
from ._matching import MatchMessage as MatchMessage
from ._matching import MatchOutput as MatchOutput
from ._matching import MatchPing as MatchPing
from ._matching import MatchPong as MatchPong
from ._matching import MatchReconnect as MatchReconnect
from ._matching import MatchRegister as MatchRegister
from ._matching import MatchRegistered as MatchRegistered
from ._matching import MatchRejected as MatchRejected
from ._matching import MatchReply as MatchReply
from ._matching import MatchResult as MatchResult
from ._matching import MatchTask as MatchTask
from ._matching import MatchWelcome as MatchWelcome
from ._matching import encode_call as encode_call
from ._matching import encode_result as encode_result
from ._matching import parse_matching as parse_matching
from ._raw_frames import FrameBuffer as FrameBuffer
from ._raw_frames import FrameSplitter as FrameSplitter
from ._raw_frames import append_readdressed as append_readdressed
from ._raw_frames import readdress_into as readdress_into
from ._stream import FrameStream as FrameStream
from ._tlv import tlv_decode as tlv_decode
from ._tlv_encode import TlvType as TlvType
from ._tlv_encode import tlv_encode as tlv_encode
from ._values import MAX_NAME_BYTES as MAX_NAME_BYTES
from ._values import Atom as Atom
from ._values import ErrorValue as ErrorValue
from ._values import ExitReason as ExitReason
from ._values import Pid as Pid
from ._values import Ref as Ref

__all__ = [
    "BIG_BYTES",
    "CBOR_FLAG",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_NAME_BYTES",
    "MAX_PAYLOAD",
    "Atom",
    "BadFrameHeader",
    "BadMagic",
    "CborTag",
    "Chunk",
    "Codec",
    "Demonitor",
    "Down",
    "End",
    "ErrorReply",
    "ErrorValue",
    "Exit",
    "Exit2",
    "ExitReason",
    "Frame",
    "FrameBuffer",
    "FrameDecoder",
    "FrameSplitter",
    "FrameStream",
    "Handshake",
    "IdTriple",
    "InvalidUtf8",
    "InvalidValue",
    "LimitExceeded",
    "Limits",
    "Link",
    "MalformedMessage",
    "Manage",
    "ManageOp",
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
    "MessageType",
    "Monitor",
    "MonitorSend",
    "Pid",
    "Ping",
    "Pong",
    "Ref",
    "RegSend",
    "RegSendBatch",
    "Request",
    "RequestIdMismatch",
    "Response",
    "Send",
    "SendBatch",
    "Stash",
    "StashOp",
    "Status",
    "TlvType",
    "TrailingBytes",
    "Truncated",
    "UnknownMessageType",
    "UnknownValueType",
    "Unlink",
    "UnsupportedVersion",
    "ValueOutOfRange",
    "WireError",
    "append_readdressed",
    "big_bytes",
    "cbor_decode",
    "cbor_encode",
    "check_reply",
    "choose_codec",
    "encode_batch",
    "encode_dirty",
    "encode_frame",
    "encode_header",
    "encode_call",
    "encode_result",
    "encode_message",
    "encode_value",
    "fast_opens_with",
    "frame_from_json",
    "frame_to_json",
    "from_json",
    "make_chunk",
    "make_end",
    "make_error",
    "make_manage",
    "make_request",
    "make_response",
    "make_stash",
    "make_status",
    "opens_with",
    "parse_dirty",
    "parse_dist",
    "parse_matching",
    "peek_route",
    "reply_parts",
    "request_id_from_str",
    "readdress_into",
    "request_fields",
    "request_parts",
    "route_length",
    "tlv_decode",
    "tlv_encode",
    "to_json",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = "wire"
        except (AttributeError, TypeError):  # pragma: no cover - builtins cannot be renamed
            pass
del _name, _obj
