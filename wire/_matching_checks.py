"""The field checks of the matching-service messages (``wire._matching``): each error names the
field, what it must be, and what it got. Shared only with ``_matching``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from ._errors import InvalidValue
from ._frame import Codec

_U64_MAX = (1 << 64) - 1
_CODEC_NAMES = ("tlv", "cbor")

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


# -- validators: each error names the field, what it must be, and what it got ---------------


def _got(value: object) -> str:
    if value is None or type(value) in (bool, int, float, str):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return type(value).__name__


def _bad(inst: Any, field: str, expected: str, got: str) -> InvalidValue:
    return InvalidValue(f"{type(inst).__name__}.{field} must be {expected} (got {got})")


def _fail(inst: Any, attribute: attrs.Attribute[Any], expected: str, value: object) -> InvalidValue:
    return _bad(inst, attribute.name, expected, _got(value))


def _str(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not str:
        raise _fail(inst, attribute, "a str", value)


def _name(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not str or not value:
        raise _fail(inst, attribute, "a non-empty str", value)


def _opt_name(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) is not str or not value):
        raise _fail(inst, attribute, "None or a non-empty str", value)


def _one_of(*allowed: str) -> _Validator:
    quoted = [repr(a) for a in allowed]
    expected = ", ".join(quoted[:-1]) + " or " + quoted[-1]

    def check(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not str or value not in allowed:
            raise _fail(inst, attribute, expected, value)

    return check


def _bool(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not bool:
        raise _fail(inst, attribute, "a bool", value)


def _delivery(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or not 0 <= value <= _U64_MAX:
        raise _fail(inst, attribute, "a delivery id, an int 0..2**64-1", value)


def _count(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value < 0:
        raise _fail(inst, attribute, "an int >= 0", value)


def _float(value: Any) -> Any:
    """Converter: an int number of seconds becomes a float (anything else is left to check)."""
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            return value
    return value


def _opt_float(value: Any) -> Any:
    return None if value is None else _float(value)


def _seconds(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not float or not math.isfinite(value) or value <= 0:
        raise _fail(inst, attribute, "a number of seconds > 0", value)


def _opt_seconds(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) is not float or not math.isfinite(value) or value < 0):
        raise _fail(inst, attribute, "None or a number of seconds >= 0", value)


def _list(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not list:
        raise _fail(inst, attribute, "a list", value)


def _dict(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not dict:
        raise _fail(inst, attribute, "a dict", value)


def _rid(what: str, *, zero: bool) -> _Validator:
    expected = f"a {what} id (the frame's request id), an int 1..2**64-1"
    if zero:
        expected += ", or 0 for the connection"
    low = 0 if zero else 1

    def check(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not int or not low <= value <= _U64_MAX:
            raise _fail(inst, attribute, expected, value)

    return check


def _to_codec(value: Any) -> Any:
    return Codec(value) if type(value) is str and value in _CODEC_NAMES else value


def _codec(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not Codec:
        raise _fail(inst, attribute, "a Codec (or 'tlv' or 'cbor')", value)


def _to_codecs(value: Any) -> Any:
    if type(value) is list or type(value) is tuple:
        return tuple(_to_codec(c) for c in value)
    return value


def _codecs(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    expected = "a list of Codec (or 'tlv'/'cbor')"
    if type(value) is not tuple:
        raise _fail(inst, attribute, expected, value)
    for c in value:
        if type(c) is not Codec:
            raise _bad(inst, attribute.name, expected, f"{_got(c)} in the list")


def _str_list(value: object) -> bool:
    return type(value) is list and all(type(s) is str for s in value)


def _flows(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not dict:
        raise _fail(inst, attribute, 'a dict {flow_type: {"steps": [str], "rpcs": [str]}}', value)
    for flow_type, names in value.items():
        if type(flow_type) is not str or not flow_type:
            raise _bad(inst, "flows", "keyed by non-empty str flow types", _got(flow_type))
        field = f"flows[{flow_type!r}]"
        if type(names) is not dict:
            raise _bad(inst, field, 'a dict {"steps": [str], "rpcs": [str]}', _got(names))
        for key in ("steps", "rpcs"):
            if key not in names:
                raise _bad(inst, f"{field}[{key!r}]", "a list of str", f"no {key!r} key")
            if not _str_list(names[key]):
                raise _bad(inst, f"{field}[{key!r}]", "a list of str", _got(names[key]))


def _patch(inst: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not dict:
        raise _fail(inst, attribute, 'a dict {"set": dict, "delete": list}', value)
    for key, kind in (("set", dict), ("delete", list)):
        if key not in value:
            raise _bad(inst, f"patch[{key!r}]", f"a {kind.__name__}", f"no {key!r} key")
        if type(value[key]) is not kind:
            raise _bad(inst, f"patch[{key!r}]", f"a {kind.__name__}", _got(value[key]))


def _empty_patch() -> dict[str, Any]:
    return {"set": {}, "delete": []}


def _stream_id() -> Any:
    return attrs.field(kw_only=True, validator=_rid("stream", zero=False))


def _call_id() -> Any:
    return attrs.field(kw_only=True, validator=_rid("call", zero=False))
