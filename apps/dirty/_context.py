"""What the parts of one dirty pool share (:class:`PoolContext`: the config, the routes and the
registry of worker proxies), and the messages between them.

A call's path, by name: a client's REQUEST is read by its :class:`~._connection.ClientConnection`
(``_connection``), which picks a :class:`~._proxy.WorkerProxy` from the routes (``_routes``) and
writes the frame into that proxy's worker socket (``WorkerProxy.submit``); the worker program
(``apps.dirty.worker``) runs it; the proxy's reader (``_proxy_reader``) hands the reply frames to
the connection (``CallerConnection.deliver``), which writes them to the client. The router
(``_router``) publishes the routes and owns the pool's size; no message is on a call's path.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any, Protocol

import attrs

import otp

from ._calls import CallStats
from ._config import DirtyConfig
from ._io import Batch, Outbox
from ._routes import Routes

if TYPE_CHECKING:
    from ._proxy import WorkerProxy

#: The router's registered name.
ROUTER = "dirty_router"


@attrs.frozen
class PoolContext:
    """What every part of one pool shares."""

    config: DirtyConfig
    socket_path: str
    log_level: str = "INFO"
    routes: Routes = attrs.field(factory=Routes, eq=False, repr=False)
    #: Worker proxies whose worker is still loading its apps: the router stops them when the
    #: pool stops, so a long app load (a model) never holds up the node's shutdown.
    starting: set[otp.Pid] = attrs.field(factory=set, eq=False, repr=False)
    #: The worker proxies serving calls, by pid: the router routes to them, the observer reads
    #: them (a proxy adds itself once its worker has loaded its apps, and leaves as it stops).
    proxies: dict[otp.Pid, WorkerProxy] = attrs.field(factory=dict, eq=False, repr=False)
    #: Calls that ended, errors by kind, latency (counted by the proxies, read by observers).
    calls: CallStats = attrs.field(factory=CallStats, eq=False, repr=False)


class CallerConnection(Protocol):
    """What a worker proxy knows of the client connection a call came from
    (``_connection.ClientConnection``): where the call's reply frames go."""

    me: otp.Pid
    outbox: Outbox
    #: Where a worker proxy's reader gathers the reply frames of one read for this connection
    #: (taken for :meth:`deliver` before that reader reads again; the node has one thread).
    replies: Batch

    def deliver(self, parts: list[Any], done: list[int]) -> bool:
        """Write reply frames (``done``: the request ids they end); True once the client is
        over its buffer budget (the proxy then holds its worker for it)."""
        ...

    def drop_stalled(self, timeout: float) -> None:
        """End the connection of a client that took nothing for ``timeout`` seconds."""
        ...


# -- proxy <-> router ---------------------------------------------------------------------------


@attrs.frozen
class WorkerUp:
    """A worker proxy tells the router it serves ``apps``."""

    pid: otp.Pid
    worker_id: int
    apps: tuple[str, ...]
    os_pid: int
    started: float


@attrs.frozen
class WorkerDraining:
    """A worker proxy tells the router to stop routing to it."""

    pid: otp.Pid


@attrs.frozen
class Recycle:
    """A worker proxy asks the router to replace its worker (``dirty_max_requests``): a
    replacement first, then this one drained."""

    pid: otp.Pid


@attrs.frozen
class Reregister:
    """A (restarted) router asks the worker proxies to announce themselves again."""


@attrs.frozen
class ForwardSignal:
    """(Signals to router.) Send ``signum`` to every worker OS process (SIGUSR1: reopen logs)."""

    signum: int = signal.SIGUSR1


# -- a worker proxy's own mailbox ---------------------------------------------------------------


@attrs.frozen
class Tick:
    """The proxy's timer: check its worker's liveness (``dirty_timeout``) and its drain."""


@attrs.frozen
class Drain:
    """Stop routing calls to this proxy's worker, finish those in flight, then stop it;
    ``sigterm``: the worker got a SIGTERM from elsewhere and said so."""

    sigterm: bool = False


@attrs.frozen
class Drained:
    """A draining proxy's last call in flight is answered (or abandoned): it may stop now."""
