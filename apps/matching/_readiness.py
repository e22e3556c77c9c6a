"""Pull-registration readiness (the seed's 就绪检查): which queues have a registered stream,
which were rejected permanently, and waiting until every queue was acknowledged once.

Mirrors the Go SDK's ``WaitPullRegistered`` / ``PullRegistrationState``: readiness is reached
once, when every flow-type queue and the app worker id queue got a registration
acknowledgement, and afterwards is lost only by a queue that has no registered stream *and*
a permanent error; reconnects, ownership moves, transient disconnects and backoff keep it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType

import attrs
import trio

from ._errors import CallTimeout, MatchingError, PullRegistrationError, WorkerStopped

__all__ = [
    "PullRegistrationState",
    "QueueRegistrationState",
    "RegistrationTracker",
    "flow_queue_name",
    "worker_queue_name",
]


def flow_queue_name(flow_type: str) -> str:
    """The readiness name of a flow type's queue: ``flow:<type>``."""
    return f"flow:{flow_type}"


def worker_queue_name(app_worker_id: str) -> str:
    """The readiness name of an app worker id's queue: ``worker:<id>``."""
    return f"worker:{app_worker_id}"


@attrs.frozen
class QueueRegistrationState:
    """One queue's registration, as :meth:`pull_registration_state` reports it.

    Attributes:
        queue: ``flow:<type>`` or ``worker:<app worker id>``.
        has_registered_stream: Some stream of this worker is registered on the queue now.
        last_permanent_error: The last permanent rejection since the queue's last successful
            registration, or None.
    """

    queue: str
    has_registered_stream: bool
    last_permanent_error: MatchingError | None


@attrs.frozen
class PullRegistrationState:
    """A snapshot of a pull worker's registration.

    Attributes:
        queues: Every queue the worker serves, by name.
        is_ready: Every queue was acknowledged at least once, and no queue is both without a
            registered stream and permanently rejected. Stopping the worker does not clear it:
            take the worker out of service separately.
    """

    queues: Mapping[str, QueueRegistrationState]
    is_ready: bool


@attrs.define
class _Queue:
    registered: set[Hashable] = attrs.field(factory=set)
    ever_registered: bool = False
    permanent_error: MatchingError | None = None


class RegistrationTracker:
    """The mutable state behind :class:`PullRegistrationState` and the readiness waits.

    The worker engine reports stream events (:meth:`stream_registered`, :meth:`stream_gone`,
    :meth:`permanent_rejection`), its start error (:meth:`fail`) and its stop
    (:meth:`stopped`); any number of tasks :meth:`wait_ready`. Updates and waits happen on the
    engine's trio loop; :meth:`state` may be read from any thread.

    Args:
        queues: The names of every queue the worker serves (known before it starts, so waits
            may begin before it does).
    """

    def __init__(self, queues: Iterable[str]) -> None:
        self._queues = {name: _Queue() for name in queues}
        self._lock = threading.Lock()
        self._ever_ready = not self._queues
        self._start_error: BaseException | None = None
        self._stopped = False
        self._changed = trio.Event()

    # -- events ---------------------------------------------------------------------------

    def stream_registered(self, queue: str, stream: Hashable) -> None:
        """``stream`` was acknowledged on ``queue``: clears the queue's permanent error."""
        with self._lock:
            q = self._queues[queue]
            q.registered.add(stream)
            q.ever_registered = True
            q.permanent_error = None
            if not self._ever_ready and all(x.ever_registered for x in self._queues.values()):
                self._ever_ready = True
        self._notify()

    def stream_gone(self, queue: str, stream: Hashable) -> None:
        """``stream`` is no longer registered (closed, rejected, or its connection lost)."""
        with self._lock:
            self._queues[queue].registered.discard(stream)
        self._notify()

    def permanent_rejection(self, queue: str, error: MatchingError) -> bool:
        """``queue`` rejected a stream permanently.

        Returns:
            True if the queue has no other registered stream (the rejection counts: readiness
            may fail), False if another stream still holds the queue (only log and retry).
        """
        with self._lock:
            q = self._queues[queue]
            if q.registered:
                return False
            q.permanent_error = error
        self._notify()
        return True

    def fail(self, error: BaseException) -> None:
        """The worker's start failed with ``error``: waiters not yet ready get it."""
        with self._lock:
            if self._start_error is None:
                self._start_error = error
        self._notify()

    def stopped(self) -> None:
        """The worker was stopped: waiters not yet ready get :class:`WorkerStopped`.
        Readiness itself is unchanged."""
        with self._lock:
            self._stopped = True
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    # -- queries --------------------------------------------------------------------------

    def has_registered_stream(self, queue: str) -> bool:
        with self._lock:
            return bool(self._queues[queue].registered)

    @property
    def ever_ready(self) -> bool:
        """Every queue was acknowledged at least once."""
        return self._ever_ready

    def state(self) -> PullRegistrationState:
        """A snapshot (safe from any thread)."""
        with self._lock:
            queues = {
                name: QueueRegistrationState(name, bool(q.registered), q.permanent_error)
                for name, q in self._queues.items()
            }
            broken = any(
                not q.has_registered_stream and q.last_permanent_error is not None
                for q in queues.values()
            )
            return PullRegistrationState(MappingProxyType(queues), self._ever_ready and not broken)

    def is_ready(self) -> bool:
        return self.state().is_ready

    def _failure(self) -> BaseException | None:
        """Why a wait cannot succeed (when not ready yet), or None to keep waiting."""
        with self._lock:
            for name, q in self._queues.items():
                if not q.registered and q.permanent_error is not None:
                    return PullRegistrationError(name, q.permanent_error)
            if self._start_error is not None:
                return self._start_error
            if self._stopped:
                return WorkerStopped(
                    "the pull worker was stopped before every queue was registered (waiting"
                    f" for: {', '.join(self._pending()) or 'none'})"
                )
        return None

    def _pending(self) -> list[str]:
        return [name for name, q in self._queues.items() if not q.ever_registered]

    # -- waiting --------------------------------------------------------------------------

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every queue was acknowledged once (at once if it ever was).

        Any number of tasks may wait, before the worker starts too.

        Raises:
            PullRegistrationError: Before readiness, a queue with no registered stream was
                rejected permanently (names the queue and carries the server's error).
            WorkerStopped: The worker stopped before readiness.
            MatchingError: The worker's start failed (its error, as :meth:`fail` got it).
            CallTimeout: ``timeout`` seconds passed first (names the queues still waiting).

        Cancellation raises ``trio.Cancelled`` and leaves nothing behind.
        """
        await trio.lowlevel.checkpoint()
        deadline = trio.current_time() + (math.inf if timeout is None else timeout)
        while True:
            if self._ever_ready:
                return
            failure = self._failure()
            if isinstance(failure, PullRegistrationError):
                raise PullRegistrationError(failure.queue, failure.cause)
            if failure is not None:
                raise failure
            changed = self._changed
            with trio.move_on_at(deadline):
                await changed.wait()
                continue
            raise CallTimeout(
                f"pull registration did not complete within {timeout} s; queues without a"
                f" registration acknowledgement: {', '.join(self._pending())}"
            )
