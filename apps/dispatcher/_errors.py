"""The dispatcher's errors: one root, one envelope for every failed call, its JSON-RPC/MCP forms.

Every way a call can fail ends as a :class:`DispatchError` with a ``kind``; the envelope maps
itself to a plain JSON-RPC error object or to MCP's answer (a protocol error or a tool result
with ``isError``), so a server in front of the dispatcher never maps errors by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class DispatcherError(Exception):
    """Root of every error the dispatcher raises."""


class ConfigurationError(DispatcherError, ValueError):
    """A :class:`Tool`, a policy, a budget, the dispatcher's configuration or a registry
    operation was given an invalid value."""


class DispatcherNotRunning(DispatcherError, LookupError):
    """No dispatcher runs under the name (or pid) a client function was given."""


class TransientError(DispatcherError):
    """Raised by a handler (or a backend) for a failure worth retrying: a busy upstream, a
    dropped connection. Any other exception from a handler is an ``internal`` error.

    Args:
        message: What failed, for the caller.
        retry_after: Seconds the handler asks the dispatcher to wait before the next attempt
            (capped by the tool's ``RetryPolicy.max_retry_after``); None for the policy's delay.
        data: JSON-friendly details copied into the envelope's ``data``.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.data = dict(data or {})


class ErrorKind(enum.StrEnum):
    """Why a dispatched call failed."""

    TIMEOUT = "timeout"
    TRANSIENT = "transient"
    SCHEMA = "schema"
    NOT_FOUND = "not_found"
    INTERNAL = "internal"
    BUDGET_EXCEEDED = "budget_exceeded"
    CIRCUIT_OPEN = "circuit_open"
    CONFLICT = "conflict"


#: Plain JSON-RPC 2.0 codes: the spec's own where one fits, ours in -32000..-32019 otherwise.
JSONRPC_CODES: Mapping[ErrorKind, int] = {
    ErrorKind.NOT_FOUND: -32601,
    ErrorKind.SCHEMA: -32602,
    ErrorKind.INTERNAL: -32603,
    ErrorKind.TIMEOUT: -32000,
    ErrorKind.TRANSIENT: -32001,
    ErrorKind.BUDGET_EXCEEDED: -32002,
    ErrorKind.CIRCUIT_OPEN: -32003,
    ErrorKind.CONFLICT: -32004,
}

#: MCP answers an unknown tool with a JSON-RPC error with this code (Invalid params).
MCP_UNKNOWN_TOOL_CODE = -32602


class DispatchError(DispatcherError):
    """The one envelope of a failed call.

    Attributes:
        kind: An :class:`ErrorKind`.
        message: What failed, where, and what to do.
        attempts: How many times the handler ran (0 when the call failed before running it).
        jsonrpc_code: The plain JSON-RPC error code of ``kind`` (see :data:`JSONRPC_CODES`).
        data: JSON-friendly details (``tool``, the schema errors, the timeout, ...).
            ``data["in_doubt"]`` is True when the handler of a non-idempotent tool was
            cancelled halfway (a timeout): whether it took effect is unknown.
            ``data["replayed"]`` is True when the error is the kept outcome of an earlier run
            with the same idempotency key (the handler did not run again).

    Each kind has its subclass (``DispatchTimeout`` is also a ``TimeoutError``, ...);
    :meth:`make` builds the right one. ``__cause__`` is the handler's exception, if any.
    """

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(
        self, message: str, *, attempts: int = 0, data: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts
        self.data: dict[str, Any] = dict(data or {})

    @property
    def jsonrpc_code(self) -> int:
        return JSONRPC_CODES[self.kind]

    @property
    def in_doubt(self) -> bool:
        """Whether the call may have taken effect although it failed: a non-idempotent
        handler was cancelled halfway (``data["in_doubt"]``). Check before doing it again."""
        return self.data.get("in_doubt") is True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, attempts={self.attempts})"

    @staticmethod
    def make(
        kind: ErrorKind | str,
        message: str,
        *,
        attempts: int = 0,
        data: Mapping[str, Any] | None = None,
    ) -> DispatchError:
        """The envelope subclass for ``kind``."""
        return _BY_KIND[ErrorKind(kind)](message, attempts=attempts, data=data)

    def _data(self) -> dict[str, Any]:
        # The envelope's own fields win over a handler's data of the same name.
        return {**self.data, "kind": str(self.kind), "attempts": self.attempts}

    def to_jsonrpc(self) -> dict[str, Any]:
        """The JSON-RPC 2.0 error object (the ``error`` member of a response)."""
        return {"code": self.jsonrpc_code, "message": self.message, "data": self._data()}

    def to_mcp_result(self) -> dict[str, Any]:
        """The error as an MCP ``CallToolResult`` with ``isError: true`` (how MCP reports schema
        failures and every other execution error, so the model can read and correct them)."""
        return {
            "content": [{"type": "text", "text": self.message}],
            "isError": True,
            "structuredContent": {"error": self._data() | {"code": self.jsonrpc_code}},
        }

    def to_mcp(self) -> dict[str, Any]:
        """The member of an MCP ``tools/call`` response: ``{"error": {...}}`` (code -32602) for
        an unknown tool, as MCP specifies, and ``{"result": to_mcp_result()}`` for the rest."""
        if self.kind is ErrorKind.NOT_FOUND:
            return {
                "error": {
                    "code": MCP_UNKNOWN_TOOL_CODE,
                    "message": self.message,
                    "data": self._data(),
                }
            }
        return {"result": self.to_mcp_result()}


class DispatchTimeout(DispatchError, TimeoutError):
    """The handler ran past its timeout and was cancelled (kind ``timeout``)."""

    kind = ErrorKind.TIMEOUT


class TransientFailure(DispatchError):
    """The handler raised :class:`TransientError` on its last attempt (kind ``transient``)."""

    kind = ErrorKind.TRANSIENT


class InvalidArguments(DispatchError, ValueError):
    """The arguments do not match the tool's JSON Schema (kind ``schema``)."""

    kind = ErrorKind.SCHEMA


class InvalidOption(InvalidArguments, ConfigurationError):
    """A call's own options (not the tool's arguments) are malformed: an ``idempotency_key``,
    ``timeout``, ``timeout_ms`` or ``budget`` of the wrong type or range (kind ``schema``,
    raised before anything runs; also a :class:`ConfigurationError`)."""


class ToolNotFound(DispatchError, LookupError):
    """No tool has the name (kind ``not_found``)."""

    kind = ErrorKind.NOT_FOUND


class InternalError(DispatchError):
    """The handler raised an exception other than :class:`TransientError` (kind ``internal``)."""

    kind = ErrorKind.INTERNAL


class BudgetExceeded(DispatchError):
    """The caller's budget (calls or deadline) was spent (kind ``budget_exceeded``)."""

    kind = ErrorKind.BUDGET_EXCEEDED


class CircuitOpen(DispatchError):
    """The tool's circuit breaker is open, or half-open with its probe running
    (kind ``circuit_open``)."""

    kind = ErrorKind.CIRCUIT_OPEN


class IdempotencyConflict(DispatchError, ValueError):
    """An idempotency key was reused with other arguments (kind ``conflict``)."""

    kind = ErrorKind.CONFLICT


_BY_KIND: dict[ErrorKind, type[DispatchError]] = {
    cls.kind: cls
    for cls in (
        DispatchTimeout,
        TransientFailure,
        InvalidArguments,
        ToolNotFound,
        InternalError,
        BudgetExceeded,
        CircuitOpen,
        IdempotencyConflict,
    )
}


def fmt_seconds(seconds: float) -> str:
    """Seconds as error messages write them (``0.25 s``)."""
    return f"{seconds:.3g} s"
