"""What ``GenServer`` callbacks return: :class:`Ok`, :class:`Reply`, :class:`NoReply`,
:class:`Stop` and :class:`Ignore` (gen_server's ``{ok, State}``, ``{reply, Reply, State}``, ...).

The engine (``_gen_server_core``) dispatches on their exact class; any other return is a
``BadReturnValue`` exit, as in OTP.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._timers import checked_seconds


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def _valid_timeout(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # Refused when built, not later in the server's receive with an unrelated error.
    if value is None or ((value.__class__ is float or value.__class__ is int) and value == value):
        return
    checked_seconds(value, f"{type(inst).__name__}.{attribute.name}", none_ok=True)


@attrs.define(slots=True, frozen=True)
class Ok:
    """``init`` succeeded: ``{ok, State}`` (optionally with a timeout or a continue).

    Raises:
        TypeError: ``timeout`` is not a number of seconds or None.
        ValueError: ``timeout`` is NaN.
    """

    state: Any
    timeout: float | None = attrs.field(default=None, validator=_valid_timeout)
    continue_: Any = UNSET


@attrs.define(slots=True, frozen=True, init=False)
class Reply:
    """``handle_call`` answers now: ``{reply, Value, State}``. ``timeout`` as in :class:`Ok`."""

    value: Any
    state: Any
    timeout: float | None = attrs.field(default=None, validator=_valid_timeout)
    continue_: Any = UNSET

    def __init__(
        self, value: Any, state: Any, timeout: float | None = None, continue_: Any = UNSET
    ) -> None:
        # attrs' __init__, made once a call: its slots set straight (not through the frozen
        # class's setattr), and the timeout checked only when one is given.
        _set_value(self, value)
        _set_state(self, state)
        _set_timeout(self, timeout)
        _set_continue(self, continue_)
        if timeout is not None:
            _valid_timeout(self, _REPLY_TIMEOUT, timeout)


_set_value, _set_state, _set_timeout, _set_continue = (
    Reply.__dict__[name].__set__ for name in ("value", "state", "timeout", "continue_")
)
_REPLY_TIMEOUT = attrs.fields(Reply).timeout


@attrs.define(slots=True, frozen=True)
class NoReply:
    """Carry on with ``state``: ``{noreply, State}`` (the call, if any, is answered later with
    ``GenServer.reply``). ``timeout`` as in :class:`Ok`."""

    state: Any
    timeout: float | None = attrs.field(default=None, validator=_valid_timeout)
    continue_: Any = UNSET


@attrs.define(slots=True, frozen=True)
class Stop:
    """Stop the server with ``reason``: ``{stop, Reason, State}`` or, from ``handle_call`` with
    ``reply`` set, ``{stop, Reason, Reply, State}`` (``terminate`` runs before the reply is sent).
    From ``init`` it makes the start fail with ``reason``."""

    reason: Any
    state: Any = None
    reply: Any = UNSET


@attrs.define(slots=True, frozen=True)
class Ignore:
    """``init`` declines to start: the start returns ``ignore`` and the process exits normally."""
