"""The pull worker's engine (trio): it dials the matching server, keeps idle task streams
registered on every queue it serves, accepts or declines the tasks offered on them, runs the
handlers, and drains on stop.

This is the seed's pull-mode worker (拉取模式, 容量和关闭, 为 RPC 预留容量, 就绪检查): one queue per
flow type (``flow:<type>``) and one for the app worker id (``worker:<id>``); capacity
``max_concurrent_tasks`` shared by Steps and RPCs, with ``reserved_rpc_tasks`` slots only RPCs
may take; a graceful stop that drains within ``stop_drain_timeout`` and then cancels. The
asyncio and blocking adapters run this engine in a trio thread of their own. The engine owns
the lifecycle and the connections; the streams and their frames are ``_worker_stream_loop.py``
(over the plan of ``_worker_streams.py``), tasks and slots ``_worker_tasks.py``, running one
call ``_worker_calls.py``.

Disconnects: handlers of a lost connection keep running (they hold their slots); their results
are dropped with a warning, since the server re-dispatches a call lost before any output and
fails the attempt of one lost after (delivery is at least once).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections import deque
from collections.abc import Mapping
from typing import Any

import attrs
import trio

import wire

from ._errors import MatchingError
from ._model import Registry
from ._options import WorkerOptions
from ._readiness import (
    PullRegistrationState,
    RegistrationTracker,
    flow_queue_name,
    worker_queue_name,
)
from ._sdk_connection import SdkConnection
from ._worker_calls import HandlerRunner as HandlerRunner
from ._worker_calls import TrioHandlerRunner as TrioHandlerRunner
from ._worker_quick import QuickHandlers
from ._worker_stream_loop import WorkerStreams
from ._worker_streams import Link, QueueState
from ._worker_tasks import ACCEPT_DELAY_SHARE
from ._worker_tasks import (
    RESERVED_DECLINE_EXTRA_IDLE_SECONDS as RESERVED_DECLINE_EXTRA_IDLE_SECONDS,
)

__all__ = [
    "RESERVED_DECLINE_EXTRA_IDLE_SECONDS",
    "HandlerRunner",
    "TrioHandlerRunner",
    "WorkerEngine",
    "WorkerStatistics",
    "generate_app_worker_id",
]

log = logging.getLogger("apps.matching.worker")


def generate_app_worker_id() -> str:
    """A fresh app worker id, ``<host>-<pid>-<random hex>``: unique per worker process and new
    when it restarts."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


@attrs.frozen
class WorkerStatistics:
    """A snapshot of a worker engine.

    Attributes:
        connected: A connection to the server is open.
        busy: Handlers running (Steps and RPCs; those of lost connections too).
        streams: Streams open on the current connection (registering, idle or busy).
        idle_streams: Registered idle streams on the current connection, by queue name.
        reserved_rpc_declines: As :attr:`WorkerEngine.pull_reserved_rpc_declines`.
    """

    connected: bool
    busy: int
    streams: int
    idle_streams: Mapping[str, int]
    reserved_rpc_declines: int


class WorkerEngine(WorkerStreams):
    """A pull worker: the flows of ``registry``, served from the server in ``options``.

    Args:
        registry: The flow types served (one ``flow:<type>`` queue each).
        cache: A ``BlobCache`` (arguments are unpacked and results packed through it), or None.
        options: Address, credentials, TLS and :class:`PullWorkerOptions`.
        runner: How handlers run (default :class:`TrioHandlerRunner`); the asyncio adapter
            passes one that runs them on its event loop.

    Use it as ``run()`` in a task, ``wait_pull_registered()`` to know it is serving, and
    ``close()`` to stop it.
    """

    def __init__(
        self,
        registry: Registry,
        cache: Any,
        options: WorkerOptions,
        *,
        runner: HandlerRunner | None = None,
    ) -> None:
        self._registry = registry
        self._handlers = {}
        self._cache = cache
        self._options = options
        self._pull = options.pull
        self._runner: HandlerRunner = runner if runner is not None else TrioHandlerRunner()
        self._threads = self._runner.threads
        self._quick = QuickHandlers(self._pull.inline_quick_handlers)
        self._app_worker_id = options.app_worker_id or generate_app_worker_id()
        self._session = secrets.token_hex(8)
        self._cap = self._pull.resolved_max_concurrent_tasks
        self._reserved = self._pull.resolved_reserved_rpc_tasks
        initial = self._pull.reconnect_initial_backoff
        self._queues = [
            QueueState(flow_queue_name(t), "flow", t, initial) for t in registry.flow_types
        ] + [
            QueueState(
                worker_queue_name(self._app_worker_id), "worker", self._app_worker_id, initial
            )
        ]
        self._tracker = RegistrationTracker(q.name for q in self._queues)
        self._reserved_declines = 0
        self._busy = 0
        self._active = 0
        self._call_scopes: set[Any] = set()
        self._link: Link | None = None
        self._run_called = False
        self._draining = False
        self._stop_requested = trio.Event()
        self._done = trio.Event()
        self._kicked = trio.Event()
        self._fatal: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._clock: trio.abc.Clock | None = None
        self._now = trio.current_time
        self._completions: deque[Any] = deque()
        self._completions_wake = False

    # -- public API -----------------------------------------------------------------------

    @property
    def app_worker_id(self) -> str:
        """This worker's app worker id (``options.app_worker_id`` or a generated one)."""
        return self._app_worker_id

    @property
    def pull_reserved_rpc_declines(self) -> int:
        """Step tasks declined because of the slots reserved for RPCs, since construction.
        Never reset; readable after close. Full-capacity and unknown-name declines do not
        count; one Step re-offered and declined again counts again."""
        return self._reserved_declines

    def pull_registration_state(self) -> PullRegistrationState:
        """Each queue's registration and the readiness flag (safe from any thread)."""
        return self._tracker.state()

    def is_ready(self) -> bool:
        """``pull_registration_state().is_ready``: for readiness probes (200 if True)."""
        return self._tracker.is_ready()

    async def wait_pull_registered(self, timeout: float | None = None) -> None:
        """Wait until every flow-type queue and the app worker id queue was acknowledged once.

        May be called by many tasks, before :meth:`run` too; returns at once ever after.

        Raises:
            PullRegistrationError: A queue was rejected permanently, before readiness, with no
                other registered stream.
            WorkerStopped: The worker was stopped before readiness.
            MatchingError: :meth:`run` failed to start (its error).
            CallTimeout: ``timeout`` seconds passed first.

        Cancellation raises ``trio.Cancelled``.
        """
        await self._tracker.wait_ready(timeout)

    def statistics(self) -> WorkerStatistics:
        """A snapshot (safe from any thread)."""
        busy = self._busy_now()
        link = self._link
        idle: dict[str, int] = {q.name: 0 for q in self._queues}
        streams = 0
        if link is not None and not link.conn.closed:
            streams = len(link.streams)
            for s in link.streams.values():
                if s.state == "idle":
                    idle[s.queue.name] += 1
        return WorkerStatistics(
            connected=link is not None and not link.conn.closed,
            busy=busy,
            streams=streams,
            idle_streams=idle,
            reserved_rpc_declines=self._reserved_declines,
        )

    async def run(self) -> None:
        """Serve until :meth:`close` (the seed's Start).

        Connects, registers ``idle_streams_per_queue`` streams on every queue, serves tasks,
        and reconnects with backoff (``reconnect_initial_backoff`` doubling up to
        ``reconnect_max_backoff``) whenever the connection is lost. Returns once :meth:`close`
        has drained the running handlers. At once if :meth:`close` came first.

        Raises:
            PullRegistrationError: With ``stop_on_permanent_stream_rejection``, the first
                permanent rejection that left its queue with no registered stream (raised
                after the running handlers were drained, even if the worker was ready).
            MatchingError: A connection failed in a way that retrying cannot fix (bad
                credentials, say); raised after draining. Readiness waiters get it too.
            RuntimeError: ``run`` was called before.

        Cancelling ``run`` cancels the running handlers at once (use :meth:`close` to drain).
        """
        if self._run_called:
            raise RuntimeError("WorkerEngine.run() may be called only once")
        self._run_called = True
        self._token = trio.lowlevel.current_trio_token()
        self._clock = trio.lowlevel.current_clock()
        self._now = self._clock.current_time
        try:
            if self._stop_requested.is_set():
                await trio.lowlevel.checkpoint()
                return
            if self._pull.warns_unreserved:
                log.warning(
                    "max_concurrent_tasks is 1 and reserved_rpc_tasks is not set: RPCs may wait"
                    " behind a long-running Step; set max_concurrent_tasks to at least 2 or set"
                    " reserved_rpc_tasks explicitly"
                )
            async with trio.open_nursery() as calls:
                self._calls_nursery = calls
                async with trio.open_nursery() as links:
                    links.start_soon(self._connect_loop)
                    await self._stop_requested.wait()
                    await self._send_draining()
                    await self._drain()
                    links.cancel_scope.cancel()
        finally:
            self._draining = True
            self._tracker.stopped()
            await self._wait_blocking_calls()  # (only if run was cancelled: else drained)
            self._done.set()
        if self._fatal is not None:
            raise self._fatal

    async def close(self) -> None:
        """Stop (the seed's Stop): send M_DRAINING, decline new tasks (``draining``), wait up
        to ``stop_drain_timeout`` for running handlers, then cancel them and wait for them to
        return; :meth:`run` then returns.

        Safe to call again, concurrently, before :meth:`run` (which then returns at once) and
        after it ended. Readiness is left as it was (take the worker out of service
        separately); waiters not yet ready get :class:`WorkerStopped`.

        Cancelling ``close`` stops the waiting only: the drain goes on in :meth:`run`.
        """
        self._draining = True
        self._stop_requested.set()
        self._tracker.stopped()
        self._kick()
        if not self._run_called:
            await trio.lowlevel.checkpoint()
            return
        await self._done.wait()

    # -- internals: wake-ups ----------------------------------------------------------------

    def _kick(self) -> None:
        """Something changed: every loop waiting in :meth:`_wait_kick` re-checks."""
        kicked, self._kicked = self._kicked, trio.Event()
        kicked.set()

    async def _wait_kick(self, deadline: float = math.inf) -> None:
        kicked = self._kicked
        with trio.move_on_at(deadline):
            await kicked.wait()

    def _fail(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        self._tracker.fail(error)
        self._draining = True
        self._stop_requested.set()
        self._kick()

    # -- connections ----------------------------------------------------------------------

    async def _connect_loop(self) -> None:
        initial = self._pull.reconnect_initial_backoff
        backoff = initial
        where = self._options.server_address
        while not self._draining:
            registered = False
            try:
                registered = await self._serve_link()
            except MatchingError as exc:
                if not exc.retryable:
                    log.error("pull worker %s cannot connect: %s", self._app_worker_id, exc)
                    self._fail(exc)
                    return
                log.warning("cannot reach the matching server at %s: %s", where, exc.message)
            if self._draining:
                return
            if registered:
                backoff = initial
            log.info("reconnecting to %s in %.3g s", where, backoff)
            with trio.move_on_after(backoff):
                await self._stop_requested.wait()
            backoff = min(backoff * 2, self._pull.reconnect_max_backoff)

    async def _serve_link(self) -> bool:
        """One connection, from dial to loss (or a reconnect the server asked for).
        Returns whether any stream got registered on it.

        Raises:
            MatchingError: The connection could not be opened.
        """
        failed: MatchingError | None = None
        link: Link | None = None
        async with trio.open_nursery() as nursery:
            try:
                conn = await SdkConnection.open(
                    self._options,
                    "worker",
                    worker_id=self._app_worker_id,
                    session=self._session,
                    flows=self._registry.capabilities(),
                    nursery=nursery,
                )
            except MatchingError as exc:  # raised below, not wrapped in the nursery's group
                failed = exc
            else:
                link = Link(conn, nursery)
                # (the server waits peer_timeout for the answer to a TASK: far longer)
                link.accept_delay = min(
                    self._pull.accept_delay, conn.welcome.peer_timeout / ACCEPT_DELAY_SHARE
                )
                await self._serve(link)
        if failed is not None:
            raise failed
        return link is not None and link.registered_any

    async def _serve(self, link: Link) -> None:
        conn = link.conn
        self._link = link
        try:
            link.nursery.start_soon(self._control_loop, link)
            await self._define_flows(link)
            link.nursery.start_soon(self._manage_loop, link)
            link.nursery.start_soon(self._timer_loop, link)
            # Woken only by what can end the link (not by every kick: that was two wake-ups
            # of this task per Step).
            while True:
                self._take_completions()
                if conn.closed or (link.reconnecting and link.calls == 0):
                    break
                await link.ending.wait()
                link.ending = trio.Event()
            if not conn.closed:
                log.info("reconnecting: the server asked, and the running calls are done")
            else:
                log.warning(
                    "lost the connection to %s: %s",
                    self._options.server_address,
                    conn.error.message if conn.error is not None else "closed",
                )
        finally:
            if self._link is link:
                self._link = None
            for s in list(link.streams.values()):
                self._forget_stream(s)
            link.nursery.cancel_scope.cancel()
            await conn.aclose()
            # (a handler thread writes on this connection only before it is closed)
            self._take_completions()
            self._kick()

    async def _define_flows(self, link: Link) -> None:
        """Tell the server the flow types' definitions (``define_flows``) before any stream
        registers, so a client without them can start flows of them (``start_known``) once
        this worker is ready. A server that does not know the op, or a failed call, costs
        only that: the worker serves as before."""
        definitions = self._registry.definitions()
        if not definitions:
            return
        try:
            await link.conn.call(
                "define_flows", {"flows": definitions}, timeout=self._options.connect_timeout
            )
        except MatchingError as exc:
            log.info("the server did not take this worker's flow definitions: %s", exc.message)

    async def _control_loop(self, link: Link) -> None:
        async for message in link.conn.control:
            if isinstance(message, wire.MatchPing):
                await self._send_quietly(link, wire.MatchPong())
            elif isinstance(message, wire.MatchReconnect):
                log.info("the server asks to reconnect: %s", message.reason or "no reason given")
                link.reconnecting = True
                link.ending.set()
            elif isinstance(message, wire.MatchError):
                log.warning(
                    "the matching server reported a connection error: %s (%s)",
                    message.message,
                    message.code,
                )
            self._kick()
        link.ending.set()
        self._kick()  # the connection ended

    async def _send_draining(self) -> None:
        link = self._link
        if link is not None and not link.conn.closed:
            await self._send_quietly(link, wire.MatchDraining())

    async def _drain(self) -> None:
        with trio.move_on_after(self._pull.stop_drain_timeout):
            while self._calls_active():
                await self._wait_kick()
        if self._active:
            log.warning(
                "%d handler(s) still running after stop_drain_timeout (%s s): cancelling them",
                self._busy,
                self._pull.stop_drain_timeout,
            )
            for scope in list(self._call_scopes):
                scope.cancel()
            while self._calls_active():
                await self._wait_kick()
