"""The dirty pool's errors: Gunicorn 27's ``gunicorn.dirty.errors`` classes, same names and fields.

Each class also subclasses the nearest builtin (``DirtyTimeoutError`` is a ``TimeoutError``), and
``to_dict``/``from_dict`` are the ERROR frame's ``{error_type, message, details}`` form, so an
error the pool raises arrives in the caller as the same class. Whatever an app's action raises,
a DirtyError included (a ``StashError`` from a stash call), arrives as ``DirtyAppError``, as
Gunicorn's worker sends it.
"""

from __future__ import annotations

from typing import Any

import wire

__all__ = [
    "DirtyAppError",
    "DirtyAppNotFoundError",
    "DirtyConfigError",
    "DirtyConnectionError",
    "DirtyError",
    "DirtyNoWorkersAvailableError",
    "DirtyProtocolError",
    "DirtyTimeoutError",
    "DirtyWorkerError",
    "StashError",
    "StashKeyNotFoundError",
    "StashTableNotFoundError",
    "error_from_dict",
]


class DirtyError(Exception):
    """Root of every dirty-pool error (Gunicorn's ``DirtyError``).

    Attributes:
        message: What went wrong.
        details: Structured context (``app_path``, ``action``, ``timeout``, ...).
    """

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        self.message = message
        self.details = dict(details or {})
        super().__init__(message)

    def __str__(self) -> str:
        if self.details:
            shown = {k: v for k, v in self.details.items() if k != "traceback"}
            if shown:
                return f"{self.message}: {shown}"
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """The ERROR frame's ``error`` value: ``{error_type, message, details}``."""
        return {
            "error_type": type(self).__name__,
            "message": self.message,
            "details": self.details,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DirtyError:
        """The error an ERROR frame's ``error`` value describes, as its own class."""
        return error_from_dict(data)


class DirtyTimeoutError(DirtyError, TimeoutError):
    """A call did not finish within its timeout (the caller's or ``dirty_timeout``)."""

    def __init__(self, message: str = "Operation timed out", timeout: float | None = None) -> None:
        super().__init__(message, {"timeout": timeout} if timeout else {})
        self.timeout = timeout


class DirtyConnectionError(DirtyError, ConnectionError):
    """The pool's socket could not be reached or the connection broke."""

    def __init__(self, message: str = "Connection failed", socket_path: str | None = None) -> None:
        super().__init__(message, {"socket_path": socket_path} if socket_path else {})
        self.socket_path = socket_path


class DirtyWorkerError(DirtyError):
    """The worker running a call failed (it died, was killed or shut down mid-call)."""

    def __init__(self, message: str, worker_id: Any = None, traceback: str | None = None) -> None:
        details: dict[str, Any] = {}
        if worker_id is not None:
            details["worker_id"] = worker_id
        if traceback:
            details["traceback"] = traceback
        super().__init__(message, details)
        self.worker_id = worker_id
        self.traceback = traceback


class DirtyAppError(DirtyError):
    """The app's action raised; ``traceback`` is the worker's formatted traceback.

    Whatever the action raised (a DirtyError too) comes as this class: ``message`` is
    ``str()`` of the exception, and the traceback names its class.
    """

    def __init__(
        self,
        message: str,
        app_path: str | None = None,
        action: str | None = None,
        traceback: str | None = None,
    ) -> None:
        details: dict[str, Any] = {}
        if app_path:
            details["app_path"] = app_path
        if action:
            details["action"] = action
        if traceback:
            details["traceback"] = traceback
        super().__init__(message, details)
        self.app_path = app_path
        self.action = action
        self.traceback = traceback


class DirtyNoWorkersAvailableError(DirtyError):
    """No running worker holds the app (all of its workers are down or being replaced)."""

    def __init__(self, app_path: str, message: str | None = None) -> None:
        super().__init__(
            message or f"No workers available for app: {app_path}", {"app_path": app_path}
        )
        self.app_path: str | None = app_path


class DirtyAppNotFoundError(DirtyAppError, DirtyNoWorkersAvailableError, LookupError):
    """No app of that import path is configured in the pool.

    Gunicorn's arbiter answers a call to an unknown app with ``DirtyNoWorkersAvailableError``;
    this class is one too, so code written against Gunicorn (``except
    DirtyNoWorkersAvailableError``) and code catching ``DirtyAppError`` both catch it.
    """

    def __init__(self, app_path: str) -> None:
        # DirtyAppError's fields, built without the cooperative chain: the two bases'
        # constructors take different arguments.
        DirtyError.__init__(self, f"Dirty app not found: {app_path}", {"app_path": app_path})
        self.app_path = app_path
        self.action = None
        self.traceback = None


class DirtyProtocolError(DirtyError):
    """Bytes on a dirty socket broke the GD v1 protocol."""

    def __init__(self, message: str = "Protocol error", raw_data: Any = None) -> None:
        details: dict[str, Any] = {}
        if raw_data is not None:
            if isinstance(raw_data, bytes):
                raw_data = raw_data[:100].hex()
            details["raw_data"] = str(raw_data)[:200]
        super().__init__(message, details)


class DirtyConfigError(DirtyError, ValueError):
    """A dirty setting is invalid; the message names it and says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class StashError(DirtyError):
    """A stash operation failed (Gunicorn's ``gunicorn.dirty.stash.StashError``)."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)


class StashTableNotFoundError(StashError, LookupError):
    """The stash table does not exist."""

    def __init__(self, table_name: str) -> None:
        super().__init__(f"Stash table not found: {table_name}", {"table": table_name})
        self.table_name = table_name


class StashKeyNotFoundError(StashError, KeyError):
    """The key is not in the stash table."""

    def __init__(self, table_name: str, key: Any) -> None:
        details: dict[str, Any] = {"table": table_name}
        try:
            wire.tlv_encode(key, version=1)
            details["key"] = key  # (it crosses the wire with the error: the client's .key)
        except wire.WireError:
            pass
        super().__init__(f"Key not found in {table_name}: {key}", details)
        self.table_name = table_name
        self.key = key

    def __str__(self) -> str:
        return self.message


_CLASSES: dict[str, type[DirtyError]] = {
    c.__name__: c
    for c in (
        DirtyError,
        DirtyTimeoutError,
        DirtyConnectionError,
        DirtyWorkerError,
        DirtyAppError,
        DirtyAppNotFoundError,
        DirtyNoWorkersAvailableError,
        DirtyProtocolError,
        StashError,
        StashTableNotFoundError,
        StashKeyNotFoundError,
    )
}


def error_from_dict(data: dict[str, Any]) -> DirtyError:
    """Rebuild the error an ERROR frame carries, as its own class (unknown names: DirtyError)."""
    cls = _CLASSES.get(str(data.get("error_type", "DirtyError")), DirtyError)
    error = cls.__new__(cls)
    error.message = str(data.get("message", "Unknown error"))
    details = data.get("details") or {}
    error.details = dict(details) if isinstance(details, dict) else {}
    Exception.__init__(error, error.message)
    d = error.details
    if isinstance(error, DirtyTimeoutError):
        error.timeout = d.get("timeout")
    elif isinstance(error, DirtyConnectionError):
        error.socket_path = d.get("socket_path")
    elif isinstance(error, DirtyWorkerError):
        error.worker_id = d.get("worker_id")
        error.traceback = d.get("traceback")
    elif isinstance(error, DirtyAppError):
        error.app_path = d.get("app_path")
        error.action = d.get("action")
        error.traceback = d.get("traceback")
    elif isinstance(error, DirtyNoWorkersAvailableError):
        error.app_path = d.get("app_path", "")
    elif isinstance(error, StashKeyNotFoundError):
        error.table_name = d.get("table", "")
        error.key = d.get("key")
    elif isinstance(error, StashTableNotFoundError):
        error.table_name = d.get("table", "")
    return error
