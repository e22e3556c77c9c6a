"""Erlang term text for the conformance trace: how OTP 25 prints (``~w``) the values a
supervisor returns and the exit reasons it sees, with every pid written ``<pid>``.

Strings are atoms (quoted when Erlang would quote them), None is ``undefined``, tuples are
``{...}``, lists ``[...]``, :class:`otp.Shutdown` is ``{shutdown,X}`` and a child spec (OTP 25's
internal child record) is shown as ``{child,Id}``.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import otp

from .._spec import ChildSpec

_UNQUOTED = re.compile(r"[a-z][a-zA-Z0-9_@]*\Z")
_RESERVED = frozenset(
    "after and andalso band begin bnot bor bsl bsr bxor case catch cond div end fun if let"
    " maybe not of or orelse receive rem try when xor".split()
)


def format_atom(name: str) -> str:
    """An atom as Erlang prints it: bare if it can be, else in single quotes."""
    if _UNQUOTED.match(name) and name not in _RESERVED:
        return name
    escaped = name.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def format_term(value: Any) -> str:
    """``value`` as Erlang term text (see the module docstring)."""
    if value is None:
        return "undefined"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, enum.Enum):
        return format_atom(str(value.value))
    if isinstance(value, str):
        return format_atom(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, otp.Pid):
        return "<pid>"
    if isinstance(value, otp.Ref):
        return "#Ref<>"
    if isinstance(value, otp.Shutdown):
        return "{shutdown," + format_term(value.detail) + "}"
    if isinstance(value, otp.BadReturnValue):
        return "{bad_return_value," + format_term(value.value) + "}"
    if isinstance(value, otp.Crash):
        exc = value.exception
        return "{" + format_atom(type(exc).__name__) + "," + format_term(str(exc)) + "}"
    if isinstance(value, ChildSpec):
        return "{child," + format_term(value.id) + "}"
    if isinstance(value, tuple):
        return "{" + ",".join(format_term(v) for v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(format_term(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ",".join(f"{format_term(k)} => {format_term(v)}" for k, v in value.items())
        return "#{" + items + "}"
    return format_atom(repr(value))


def parse_reason(value: Any) -> Any:
    """A reason from a scenario file: a string is an atom, ``{"shutdown": X}`` is
    ``{shutdown,X}``, another one-key object ``{"k": v}`` is the tuple ``{k,v}``, a list is a
    list; numbers and booleans are themselves."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key == "shutdown":
                return otp.Shutdown(parse_reason(inner))
            return (key, parse_reason(inner))
        return {k: parse_reason(v) for k, v in value.items()}
    if isinstance(value, list):
        return [parse_reason(v) for v in value]
    return value
