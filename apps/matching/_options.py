"""Options of the pull worker and the client (the seed's ``WorkerOptions``,
``PullWorkerOptions``, ``ClientOptions``), validated when built, and server addresses.

Addresses: ``unix:/path`` (or a bare absolute path) for a Unix socket; ``tcp://host:port`` (or
``host:port``) for TCP, which uses TLS unless ``tls=False`` is given explicitly.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import attrs

from ._errors import ConfigurationError

__all__ = [
    "ClientOptions",
    "PullWorkerOptions",
    "ServerAddress",
    "WorkerOptions",
    "parse_server_address",
]

#: The seed's cap on concurrent tasks per app worker id (``matching.maxConcurrentTasksCap``).
MAX_CONCURRENT_TASKS_CAP = 256


@attrs.frozen
class ServerAddress:
    """Where a matching server listens: ``kind`` is ``"unix"`` (``path``) or ``"tcp"``
    (``host``, ``port``)."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp://{self.host}:{self.port}"


def parse_server_address(address: Any, *, where: str = "server_address") -> ServerAddress:
    """Parse ``unix:/path``, ``/path``, ``tcp://host:port`` or ``host:port``.

    Raises:
        ConfigurationError: The address has none of these forms; the message names ``where``.
    """
    if type(address) is not str or not address:
        raise ConfigurationError(
            f"{where} must be a str such as 'unix:/run/matching.sock' or 'tcp://host:7233'"
            f" (got {address!r})"
        )
    if address.startswith("unix:"):
        path = address[5:]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ConfigurationError(f"{where}: a unix address needs a path (got {address!r})")
        return ServerAddress("unix", path=path)
    if address.startswith("/"):
        return ServerAddress("unix", path=address)
    rest = address[6:] if address.startswith("tcp://") else address
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(
            f"{where} must be 'unix:/path' or 'tcp://host:port' with a port 1..65535"
            f" (got {address!r})"
        )
    return ServerAddress("tcp", host=host, port=int(port))


def _address(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    parse_server_address(value, where=f"{type(inst).__name__}.{attribute.name}")


def _opt_positive_int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be an int >= 1 or None (got {value!r})"
        )


def _positive_int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be an int >= 1 (got {value!r})"
        )


def _seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not value > 0 or value == float("inf"):
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be a finite number of seconds > 0"
            f" (got {value!r})"
        )


#: The longest ``PullWorkerOptions.accept_delay``: an ACCEPT is prompt, a handler's outcome may
#: take any time.
MAX_ACCEPT_DELAY = 1.0


def _accept_delay(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not 0 <= value <= MAX_ACCEPT_DELAY:
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be a number of seconds from 0 to"
            f" {MAX_ACCEPT_DELAY} (got {value!r}); 0 accepts each task at once"
        )


def _opt_seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _seconds(inst, attribute, value)


def _opt_str(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not str or not value):
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be a non-empty str or None"
            f" (got {value!r})"
        )


def _opt_bool(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not bool:
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be True, False or None (got {value!r})"
        )


def _opt_context(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, ssl.SSLContext):
        raise ConfigurationError(
            f"{type(inst).__name__}.{attribute.name} must be an ssl.SSLContext or None"
            f" (got {value!r})"
        )


@attrs.frozen
class PullWorkerOptions:
    """Task capacity, registration and shutdown of a pull worker (the seed's table).

    Attributes:
        max_concurrent_tasks: Calls running at once (Steps and RPCs together); None for the
            CPU count. At most 256 (the server's per-worker cap).
        reserved_rpc_tasks: Slots only RPCs may use, so flows stay responsive while Steps run
            long. None: 1 when the cap is at least 2, else 0 (with a one-time warning at
            start). Must be >= 0 and < the cap.
        idle_streams_per_queue: Registered idle streams kept per queue.
        stop_drain_timeout: Seconds ``close()`` waits for running handlers before
            cancelling them.
        stop_on_permanent_stream_rejection: End ``start()`` with the
            :class:`PullRegistrationError` when a permanent rejection leaves a queue with no
            registered stream (default: log and keep retrying).
        keepalive_interval: Seconds between PONG frames a stream sends while its task runs.
        idle_stream_linger: Seconds an idle stream beyond a queue's idle target stays open
            (for the next task) before it is closed: a loaded worker reuses its streams
            instead of registering one per call. After load falls the worker holds at most
            ``max_concurrent_tasks + (F + 1) * idle_streams_per_queue`` streams again.
        reconnect_initial_backoff / reconnect_max_backoff: Reconnect backoff (doubling).
        accept_delay: Seconds the worker holds its M_ACCEPT of a task: a handler that
            finishes by then sends it in the same write as its outcome (the server reads
            both at once: one wake-up of its connection and stream instead of two); a slower
            one's is sent when the delay passes. 0 sends it at once. At most 1 s, and never
            more than a tenth of the server's ``peer_timeout`` (how long it waits for it).
        inline_quick_handlers: Run a plain-function handler on the worker's own event loop
            thread, with no hand-off to a handler thread, once it has returned within 1 ms
            16 times in a row in a thread; one run there slower than 1 ms sends it back to
            the threads, to prove itself twice as long (``_worker_quick.py``). Set False
            when a handler that is quick for a long time may then block: until it returns
            the worker reads nothing, starts nothing and answers no ping (a handler that
            calls an RPC through a blocking ``Client`` may wait for this very worker, which
            then serves it only once the server's sticky wait sends it elsewhere).

    Raises:
        ConfigurationError: A value is invalid (``reserved_rpc_tasks`` not in 0..cap-1).
    """

    max_concurrent_tasks: int | None = attrs.field(default=None, validator=_opt_positive_int)
    reserved_rpc_tasks: int | None = None
    idle_streams_per_queue: int = attrs.field(default=1, validator=_positive_int)
    stop_drain_timeout: float = attrs.field(default=30.0, validator=_seconds)
    stop_on_permanent_stream_rejection: bool = attrs.field(
        default=False, validator=attrs.validators.instance_of(bool)
    )
    keepalive_interval: float = attrs.field(default=20.0, validator=_seconds)
    idle_stream_linger: float = attrs.field(default=5.0, validator=_seconds)
    reconnect_initial_backoff: float = attrs.field(default=0.1, validator=_seconds)
    reconnect_max_backoff: float = attrs.field(default=10.0, validator=_seconds)
    accept_delay: float = attrs.field(default=0.005, validator=_accept_delay)
    inline_quick_handlers: bool = attrs.field(
        default=True, validator=attrs.validators.instance_of(bool)
    )

    def __attrs_post_init__(self) -> None:
        cap = self.resolved_max_concurrent_tasks
        if cap > MAX_CONCURRENT_TASKS_CAP:
            raise ConfigurationError(
                f"PullWorkerOptions.max_concurrent_tasks must be at most"
                f" {MAX_CONCURRENT_TASKS_CAP}, the server's per-worker cap (got {cap})"
            )
        reserved = self.reserved_rpc_tasks
        if reserved is not None and (type(reserved) is not int or not 0 <= reserved < cap):
            raise ConfigurationError(
                f"PullWorkerOptions.reserved_rpc_tasks must be an int >= 0 and below"
                f" max_concurrent_tasks ({cap}) (got {reserved!r}); Steps need at least one slot"
            )

    @property
    def resolved_max_concurrent_tasks(self) -> int:
        """The cap, with the CPU-count default applied."""
        if self.max_concurrent_tasks is not None:
            return self.max_concurrent_tasks
        return max(1, os.cpu_count() or 1)

    @property
    def resolved_reserved_rpc_tasks(self) -> int:
        """The reserved slots, with the default applied (1 if the cap >= 2, else 0)."""
        if self.reserved_rpc_tasks is not None:
            return self.reserved_rpc_tasks
        return 1 if self.resolved_max_concurrent_tasks >= 2 else 0

    @property
    def warns_unreserved(self) -> bool:
        """True where the seed asks for the one-time warning: a cap of one, reservation unset."""
        return self.reserved_rpc_tasks is None and self.resolved_max_concurrent_tasks < 2


@attrs.frozen
class _Connection:
    """What workers and clients share: the address, credentials and TLS."""

    server_address: str = attrs.field(validator=_address)
    #: The bearer credential sent at HELLO; None reads ``OTP_MATCHING_TOKEN``, else none.
    credentials: str | None = attrs.field(default=None, validator=_opt_str)
    #: TLS on TCP; None means on (plain TCP only when given False explicitly).
    tls: bool | None = attrs.field(default=None, validator=_opt_bool)
    #: CA file to verify the server's certificate (default: the system's).
    tls_ca_file: str | None = attrs.field(default=None, validator=_opt_str)
    #: The name to check in the server's certificate (default: the address's host).
    tls_server_hostname: str | None = attrs.field(default=None, validator=_opt_str)
    #: A ready TLS context (overrides ``tls_ca_file``).
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, validator=_opt_context, eq=False)
    connect_timeout: float = attrs.field(default=10.0, validator=_seconds)
    #: Payload codec to ask for: "cbor" or "tlv".
    codec: str = attrs.field(default="cbor", validator=attrs.validators.in_(("cbor", "tlv")))

    @property
    def address(self) -> ServerAddress:
        return parse_server_address(self.server_address)

    @property
    def token(self) -> str:
        if self.credentials is not None:
            return self.credentials
        return os.environ.get("OTP_MATCHING_TOKEN", "")

    @property
    def uses_tls(self) -> bool:
        return self.address.kind == "tcp" and self.tls is not False


def _pull(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, PullWorkerOptions):
        raise ConfigurationError(f"WorkerOptions.pull must be a PullWorkerOptions (got {value!r})")


@attrs.frozen
class WorkerOptions(_Connection):
    """A pull worker's options.

    Attributes:
        pull: Capacity, registration and shutdown (:class:`PullWorkerOptions`).
        app_worker_id: This worker process's id, unique per process and new on restart;
            None generates one (``<host>-<pid>-<random>``).
    """

    pull: PullWorkerOptions = attrs.field(factory=PullWorkerOptions, validator=_pull)
    app_worker_id: str | None = attrs.field(default=None, validator=_opt_str)


@attrs.frozen
class ClientOptions(_Connection):
    """A client's options.

    Attributes:
        call_timeout: Default seconds a call waits for its answer (None: no limit, the
            server's own waits still apply).
    """

    call_timeout: float | None = attrs.field(default=60.0, validator=_opt_seconds)
