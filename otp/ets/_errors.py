"""Typed errors of ``otp.ets``: every one is Erlang's ``badarg``, so all derive from ``otp.BadArg``.

The root is :class:`EtsError`; each subclass also derives from the nearest builtin
(``LookupError``, ``PermissionError``) and its message names the table, the operation and the
rule that was broken.
"""

from __future__ import annotations

import reprlib
from typing import Any

from .._errors import BadArg


class EtsError(BadArg):
    """Root of the errors ``otp.ets`` raises (Erlang's ``badarg`` from an ``ets`` function).

    Attributes:
        table: the table (handle or name) the operation was given, or None.
        operation: the name of the ``ets`` function that failed, e.g. ``"insert"``.
    """

    def __init__(self, message: str, *, table: Any = None, operation: str | None = None) -> None:
        super().__init__(message)
        self.table = table
        self.operation = operation


class NoSuchTable(EtsError, LookupError):
    """The table does not exist: it was deleted, its owner died without an heir, or no table
    has that name (Erlang's ``badarg`` with cause ``id``)."""


class AccessDenied(EtsError, PermissionError):
    """The caller may not do this to the table: a write to a ``protected`` or ``private`` table
    by a process other than the owner, a read of a ``private`` one, or an owner-only operation
    (``give_away``, ``setopts``) by another process (Erlang's ``badarg`` with cause ``access``)."""


class NameTaken(EtsError):
    """``new(..., named=True)`` or ``rename`` with a name another table already has (Erlang's
    ``badarg`` with cause ``already_exists``)."""


class KeyNotFound(EtsError, LookupError):
    """The operation needs the key to be in the table (``update_counter`` without a default,
    ``lookup_element`` without a default, ``next`` of an unordered table)."""


class _Brief(reprlib.Repr):
    """``reprlib`` with room for a useful message, and safe on any value: a huge int has no
    ``repr`` (Python refuses more than 4,300 digits) and a deep term would exhaust the stack."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxtuple = self.maxlist = 8
        self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 4
        self.maxstring = self.maxother = 60
        self.maxlong = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4096:
            return f"<int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_BRIEF = _Brief()
#: The longest ``brief`` text, whatever the value.
BRIEF_MAX = 200


def brief(value: Any) -> str:
    """A bounded ``repr`` of a user value for an error message (at most ``BRIEF_MAX``
    characters, elided with ``...``), that never raises."""
    try:
        text = _BRIEF.repr(value)
    except Exception:
        text = f"<{type(value).__qualname__} object>"
    if len(text) > BRIEF_MAX:
        text = text[: BRIEF_MAX - 3] + "..."
    return text
