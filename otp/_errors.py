"""Typed errors of the runtime: one root, :class:`OtpError`, each also a subclass of a builtin.

They mirror the errors Erlang raises or exits with (``badarg``, ``noproc``, ``timeout``,
``calling_self``) and the ``{error, Reason}`` returns of OTP's start functions.
"""

from __future__ import annotations

from typing import Any


class OtpError(Exception):
    """Root of every error the runtime raises."""


class NotAProcess(OtpError, RuntimeError):
    """An operation that needs a current process ran outside one.

    Run the code inside a process (``spawn``), a node's main function (``otp.run``) or an
    ``async with otp.open_node():`` block, which makes the enclosing task a process.
    """


class NoProc(OtpError, LookupError):
    """The target process does not exist (Erlang's ``noproc``), or a name is not registered."""


class BadArg(OtpError, ValueError):
    """An argument was rejected, as Erlang's ``badarg`` (a taken name, a dead process, ...)."""


class ReceiveTimeout(OtpError, TimeoutError):
    """``receive(..., timeout=T)`` saw no matching message within T seconds."""


class ProcessExited(OtpError):
    """The process running this code was terminated by an exit signal while it ran.

    Raised by ``open_node`` and ``run`` when their own process is killed, so the surrounding code
    (often a test) never carries on as if nothing happened.
    """

    def __init__(self, reason: Any) -> None:
        super().__init__(f"the node's main process exited with reason {reason!r}")
        self.reason = reason


class CallError(OtpError):
    """A ``GenServer.call`` failed: OTP's caller exit ``{Reason, {gen_server, call, [...]}}``.

    ``reason`` is the server's exit reason if it died during the call, ``"noproc"`` if it was
    not alive, ``"timeout"`` (see :class:`CallTimeout`) or ``"calling_self"``.
    """

    def __init__(self, reason: Any, server: Any, request: Any) -> None:
        super().__init__(f"call to {server!r} with {request!r} failed: {reason!r}")
        self.reason = reason
        self.server = server
        self.request = request


class CallTimeout(CallError, TimeoutError):
    """A ``GenServer.call`` got no reply within its timeout; a late reply is dropped."""


class StartError(OtpError):
    """Starting a process failed during its init (OTP's ``{error, Reason}``)."""

    def __init__(self, reason: Any) -> None:
        super().__init__(f"process failed to start: {reason!r}")
        self.reason = reason


class StartIgnored(OtpError):
    """The process's ``init`` returned ``Ignore()`` (OTP's ``ignore``); no process runs."""

    def __init__(self) -> None:
        super().__init__("init returned Ignore(): the process was not started")


class StopError(OtpError):
    """``GenServer.stop`` saw the server exit with a reason other than the one asked for."""

    def __init__(self, reason: Any) -> None:
        super().__init__(f"server stopped with unexpected reason {reason!r}")
        self.reason = reason
