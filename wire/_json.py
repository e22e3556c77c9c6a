"""The JSON mapping of wire values and frames, used by ``python -m wire`` and the test vectors.

Plain JSON covers null, booleans, int64 integers, strings, arrays and objects whose keys are
strings not starting with ``$``; every other value is an object with a single ``$``-key, so the
mapping is exact both ways (``from_json(to_json(v)) == v``) and readable in any language.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from ._errors import InvalidValue, UnknownValueType
from ._frame import Codec, Frame, MessageType
from ._values import Atom, ErrorValue, ExitReason, Pid, Ref

__all__ = ["frame_from_json", "frame_to_json", "from_json", "to_json"]

_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def _float_to_json(value: float) -> Any:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def to_json(value: Any) -> Any:
    """Map a wire value to JSON-compatible data (see ``wire/SPEC.md``, "JSON mapping")."""
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:
        return value if _I64_MIN <= value <= _I64_MAX else {"$bigint": str(value)}
    if t is float:
        return {"$float": _float_to_json(value)}
    if t is bytes:
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if t is list:
        return [to_json(v) for v in value]
    if t is tuple:
        return {"$tuple": [to_json(v) for v in value]}
    if t is dict:
        if all(type(k) is str and not k.startswith("$") for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"$dict": [[to_json(k), to_json(v)] for k, v in value.items()]}
    if t is Atom:
        return {"$atom": value.name}
    if t is Pid or t is Ref:
        key = "$pid" if t is Pid else "$ref"
        return {key: {"node": value.node, "id": value.id, "creation": value.creation}}
    if t is ExitReason:
        return {"$exit": {"kind": value.kind, "detail": to_json(value.detail)}}
    if t is ErrorValue:
        return {
            "$error": {
                "type": value.type,
                "message": value.message,
                "details": to_json(value.details),
                "traceback": value.traceback,
            }
        }
    raise UnknownValueType(f"no JSON mapping for a value of type {t.__name__}")


def _need(obj: Any, kind: type, what: str) -> Any:
    if type(obj) is not kind:
        raise InvalidValue(f"JSON {what} must be a {kind.__name__} (got {type(obj).__name__})")
    return obj


def from_json(obj: Any) -> Any:
    """Map JSON data (as parsed by :func:`json.loads`) back to a wire value."""
    t = type(obj)
    if obj is None or t is bool or t is str:
        return obj
    if t is int:
        if not _I64_MIN <= obj <= _I64_MAX:
            raise InvalidValue(f'JSON integer {obj} is outside int64; write {{"$bigint": "{obj}"}}')
        return obj
    if t is float:
        raise InvalidValue(
            f'JSON number {obj!r} is not an int; write floats as {{"$float": {obj!r}}}'
        )
    if t is list:
        return [from_json(v) for v in obj]
    if t is not dict:
        raise InvalidValue(f"no wire value for JSON {t.__name__}")
    tagged = [k for k in obj if k.startswith("$")]
    if not tagged:
        return {k: from_json(v) for k, v in obj.items()}
    if len(obj) != 1:
        raise InvalidValue(
            f"a JSON object with a $-key must have exactly one key (got {list(obj)})"
        )
    tag = tagged[0]
    body = obj[tag]
    if tag == "$float":
        if type(body) is str:
            named = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
            if body not in named:
                raise InvalidValue(
                    f"$float string must be NaN, Infinity or -Infinity (got {body!r})"
                )
            return named[body]
        if type(body) not in (int, float):
            raise InvalidValue(f"$float must be a number (got {type(body).__name__})")
        return float(body)
    if tag == "$bigint":
        try:
            return int(_need(body, str, "$bigint"))
        except ValueError:
            raise InvalidValue(f"$bigint must be a decimal integer string (got {body!r})") from None
    if tag == "$bytes":
        try:
            return base64.b64decode(_need(body, str, "$bytes"), validate=True)
        except binascii.Error as exc:
            raise InvalidValue(f"$bytes must be base64 ({exc})") from None
    if tag == "$tuple":
        return tuple(from_json(v) for v in _need(body, list, "$tuple"))
    if tag == "$dict":
        out = {}
        for pair in _need(body, list, "$dict"):
            if type(pair) is not list or len(pair) != 2:
                raise InvalidValue("$dict must be a list of [key, value] pairs")
            out[from_json(pair[0])] = from_json(pair[1])
        return out
    if tag == "$atom":
        return Atom(_need(body, str, "$atom"))
    if tag in ("$pid", "$ref"):
        fields = _need(body, dict, tag)
        cls = Pid if tag == "$pid" else Ref
        return cls(fields.get("node"), fields.get("id"), fields.get("creation", 0))
    if tag == "$exit":
        fields = _need(body, dict, tag)
        return ExitReason(fields.get("kind"), from_json(fields.get("detail")))
    if tag == "$error":
        fields = _need(body, dict, tag)
        return ErrorValue(
            fields.get("type"),
            fields.get("message"),
            from_json(fields.get("details", {})),
            fields.get("traceback", ""),
        )
    raise UnknownValueType(f"unknown JSON tag {tag!r}")


def frame_to_json(frame: Frame) -> dict[str, Any]:
    """A frame as a JSON object: version, type name, request id, codec and payload."""
    return {
        "version": frame.version,
        "type": frame.type.name,
        "request_id": frame.request_id,
        "codec": frame.codec.value,
        "payload": to_json(frame.payload),
    }


def frame_from_json(obj: Any) -> Frame:
    """The frame a :func:`frame_to_json` object describes (``codec`` and ``version`` optional)."""
    if type(obj) is not dict:
        raise InvalidValue(f"a JSON frame must be an object (got {type(obj).__name__})")
    name = obj.get("type")
    try:
        mtype = MessageType[name] if type(name) is str else MessageType(int(name))  # type: ignore[arg-type]
    except (KeyError, ValueError, TypeError):
        names = ", ".join(m.name for m in MessageType)
        raise InvalidValue(f"JSON frame type must be one of {names} (got {name!r})") from None
    try:
        codec = Codec(obj.get("codec", "tlv"))
    except ValueError:
        raise InvalidValue(
            f'JSON frame codec must be "tlv" or "cbor" (got {obj.get("codec")!r})'
        ) from None
    version = obj.get("version", 1 if mtype < 0x20 and codec is Codec.TLV else 2)
    return Frame(
        mtype,
        obj.get("request_id", 0),
        from_json(obj.get("payload")),
        version=version,
        codec=codec,
    )
