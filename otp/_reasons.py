"""Exit reasons as data, with OTP's taxonomy.

An exit reason is any value, as an Erlang term is: the strings below play the part of Erlang's
atoms (``"normal"``, ``"shutdown"``, ``"kill"``, ``"killed"``, ``"noproc"``, ``"noconnection"``),
:class:`Shutdown` is ``{shutdown, Detail}`` and :class:`Crash` carries the exception a process
died of. One function, :func:`is_abnormal`, decides what restarts, logging and link propagation
treat as normal.
"""

from __future__ import annotations

import traceback as _traceback
from typing import Any

import attrs

NORMAL = "normal"
SHUTDOWN = "shutdown"
KILL = "kill"
KILLED = "killed"
NOPROC = "noproc"
NOCONNECTION = "noconnection"


@attrs.frozen
class ExitStatus:
    """Exit reason of a port whose program exited with a non-zero status (``{exit_status, N}``)."""

    status: int


@attrs.frozen
class Signaled:
    """Exit reason of a port whose program was killed by a signal (``{signal, "SIGKILL"}``)."""

    signal: str


@attrs.frozen
class Shutdown:
    """OTP's ``{shutdown, Detail}``: a deliberate stop that is not logged and not restarted
    by a transient child spec."""

    detail: Any


@attrs.frozen(eq=False)
class Crash:
    """A process died of an uncaught exception (Erlang's ``{Reason, Stacktrace}``).

    Equality is identity of the exception, so the same crash seen by two links compares equal.
    """

    exception: BaseException

    @property
    def traceback(self) -> str:
        """The formatted traceback of the exception."""
        return "".join(_traceback.format_exception(self.exception))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Crash) and other.exception is self.exception

    def __hash__(self) -> int:
        return id(self.exception)

    def __repr__(self) -> str:
        return f"Crash({self.exception!r})"


@attrs.frozen
class BadReturnValue:
    """OTP's ``{bad_return_value, Value}``: a behaviour callback returned something it may not."""

    value: Any


def is_abnormal(reason: Any) -> bool:
    """Whether ``reason`` is an abnormal exit: anything but normal, shutdown or Shutdown(_).

    Abnormal exits are logged, restart transient children, and kill non-trapping linked processes.
    """
    return not (reason == NORMAL or reason == SHUTDOWN or isinstance(reason, Shutdown))


def format_reason(reason: Any) -> str:
    """Erlang-style text for a reason: ``normal``, ``{shutdown,x}``, ``{bad_return_value,...}``."""
    if isinstance(reason, str):
        return reason
    if isinstance(reason, Shutdown):
        return "{shutdown," + format_reason(reason.detail) + "}"
    if isinstance(reason, BadReturnValue):
        return "{bad_return_value," + repr(reason.value) + "}"
    if isinstance(reason, Crash):
        exc = reason.exception
        return "{" + type(exc).__name__ + "," + repr(str(exc)) + "}"
    if isinstance(reason, tuple):
        return "{" + ",".join(format_reason(r) for r in reason) + "}"
    return repr(reason)
