"""The matching service's errors: one root, one class per way a call or a registration fails.

Each error carries the wire protocol's ``code`` (``M_ERROR.code``), so the SDKs turn a server's
answer back into the same class (:func:`error_from_code`), and each message says what failed,
where, and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class MatchingError(Exception):
    """Root of every error of the matching service and its SDKs.

    Attributes:
        code: The wire protocol's error code for this kind of failure.
        retryable: Whether trying the same thing again may succeed.
        details: Extra facts (JSON-friendly) from the server.
    """

    code: ClassVar[str] = "internal"
    retryable_default: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = self.retryable_default if retryable is None else retryable
        self.details = dict(details or {})


class ConfigurationError(MatchingError, ValueError):
    """An option, a flow definition or the server's configuration is invalid."""

    code = "bad_config"


class ProtocolError(MatchingError):
    """A peer broke the protocol: a malformed or unexpected frame."""

    code = "bad_frame"


class AuthenticationError(MatchingError, PermissionError):
    """The credentials were missing or wrong."""

    code = "unauthenticated"


class LimitError(MatchingError):
    """A configured limit was reached; the message names the limit and its value."""

    code = "limit"
    retryable_default = True


class UnknownFlowType(MatchingError, LookupError):
    """No flow type of that name is known (to the registry, or to the server)."""

    code = "unknown_flow_type"


class FlowNotFound(MatchingError, LookupError):
    """No flow has that id."""

    code = "flow_not_found"


class FlowExists(MatchingError):
    """A flow with that id exists already."""

    code = "flow_exists"


class FlowFailed(MatchingError):
    """The flow failed: a step ran out of attempts, or the flow was cancelled.

    Attributes:
        flow_id: The flow.
        error_type: The type name of the step's last error.
    """

    code = "flow_failed"


class Unavailable(MatchingError):
    """No worker able to run the call was connected for the whole dispatch wait."""

    code = "unavailable"
    retryable_default = True


class NoWorkerAvailable(MatchingError):
    """Workers were connected but all declined for capacity for the whole dispatch wait
    (``NO_WORKER_AVAILABLE``)."""

    code = "no_worker_available"
    retryable_default = True


class UnknownName(MatchingError, LookupError):
    """No worker registered for the flow type has the step or RPC of that name."""

    code = "unknown_name"


class HandlerError(MatchingError):
    """A Step or RPC handler raised; ``details`` has the exception's ``type``.

    Attributes:
        error_type: The type name of the handler's exception.
    """

    code = "handler_error"

    @property
    def error_type(self) -> str:
        return str(self.details.get("type", ""))


class AlreadyRegistered(MatchingError):
    """The app worker id is held by another worker process (ids must be unique per process)."""

    code = "already_registered"


class CallTimeout(MatchingError, TimeoutError):
    """A call did not end within its timeout."""

    code = "timeout"
    retryable_default = True


class Cancelled(MatchingError):
    """The flow or call was cancelled."""

    code = "cancelled"


class Draining(MatchingError):
    """The worker or server is stopping and takes no new work."""

    code = "draining"
    retryable_default = True


class PullRegistrationError(MatchingError):
    """A pull worker's queue was rejected permanently with no other registered stream.

    Attributes:
        queue: The queue's name (``"flow:<type>"`` or ``"worker:<app worker id>"``).
        cause: The server's rejection.
    """

    code = "registration"

    def __init__(self, queue: str, cause: MatchingError) -> None:
        super().__init__(
            f"pull registration of queue {queue} was rejected permanently: {cause.message}"
            f" ({cause.code}); fix the cause and restart the worker",
            retryable=False,
            details={"queue": queue, "code": cause.code},
        )
        self.queue = queue
        self.cause = cause


class BlobNotFound(MatchingError, KeyError):
    """No blob of that key is held (locally, or by the server): put it first."""

    code = "blob_not_found"

    def __str__(self) -> str:  # not KeyError's quoted form
        return self.message


class InvalidBlobKey(MatchingError, ValueError):
    """A blob key is not ``"sha256:"`` followed by 64 lowercase hex digits."""

    code = "bad_blob_key"


class BlobCorrupted(MatchingError, ValueError):
    """A blob's bytes do not hash to its key (a corrupt file, or a peer sent other bytes)."""

    code = "blob_corrupted"


class WorkerStopped(MatchingError):
    """The worker stopped before the awaited condition held."""

    code = "stopped"


class ClientClosed(MatchingError):
    """The client (or its connection) was closed."""

    code = "closed"


_BY_CODE: dict[str, type[MatchingError]] = {
    cls.code: cls
    for cls in (
        ConfigurationError,
        ProtocolError,
        AuthenticationError,
        LimitError,
        UnknownFlowType,
        FlowNotFound,
        FlowExists,
        FlowFailed,
        Unavailable,
        NoWorkerAvailable,
        UnknownName,
        HandlerError,
        AlreadyRegistered,
        CallTimeout,
        Cancelled,
        Draining,
        BlobNotFound,
        InvalidBlobKey,
        BlobCorrupted,
    )
}


def error_from_code(
    code: str,
    message: str,
    *,
    retryable: bool | None = None,
    details: Mapping[str, Any] | None = None,
) -> MatchingError:
    """The error class a wire ``code`` names (``MatchingError`` itself for an unknown code),
    built with the server's message."""
    cls = _BY_CODE.get(code, MatchingError)
    return cls(message, retryable=retryable, details=details)
