"""The SDK's blocking flavour (``Worker`` and ``Client``): the API of the asyncio flavour without
await. The trio engine runs in a trio thread of its own (``_trio_thread``); each call blocks the
calling thread on a future. Async handlers of a :class:`Worker` run on an asyncio loop the worker
owns, plain functions in a thread.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._asyncio_adapters import _ClientCalls, _WorkerCore, _WorkerView
from ._asyncio_handlers import AsyncioHandlerRunner, _has_async_handlers, _LoopThread
from ._blobs import BlobCache
from ._client_engine import ClientEngine
from ._errors import ClientClosed, WorkerStopped
from ._model import Flow, FlowDescription, FlowStatus, FlowSummary, QueueSummary, Registry
from ._options import WorkerOptions
from ._trio_thread import _call_sync

__all__ = ["Client", "Worker"]

T = TypeVar("T")


class Worker(_WorkerView):
    """A pull worker for blocking programs: the API of :class:`AsyncWorker` without await.

    ``worker.start()`` blocks until :meth:`close` (from another thread) has drained;
    :meth:`start_background` runs it in a thread; ``with Worker(...) as worker:`` starts it in
    the background and closes it on the way out. Async handlers run on an asyncio loop the
    worker owns (in a thread of its own); plain functions in a thread.
    """

    def __init__(self, registry: Registry, cache: BlobCache | None, options: WorkerOptions) -> None:
        self._loops = _LoopThread("matching-worker-asyncio")
        self._core = _WorkerCore(
            registry,
            cache,
            options,
            AsyncioHandlerRunner(self._loops.current),
            "matching-worker",
        )
        self._async_handlers = _has_async_handlers(registry)
        self._background: threading.Thread | None = None
        self._background_error: BaseException | None = None

    def start(self) -> None:
        """Serve until :meth:`close` has drained (blocks; call close from another thread).

        Raises:
            PullRegistrationError, MatchingError: as the engine's ``run``.
        """
        if self._async_handlers:
            self._loops.loop()
        try:
            _call_sync(self._core.thread, self._core.engine.run)
        except WorkerStopped:
            if not self._core.closing:
                raise

    def start_background(self) -> threading.Thread:
        """Run :meth:`start` in a daemon thread; its error is raised by :meth:`close`."""

        def serve() -> None:
            try:
                self.start()
            except BaseException as exc:
                self._background_error = exc

        if self._async_handlers:
            self._loops.loop()
        self._background = threading.Thread(target=serve, name="matching-worker-start", daemon=True)
        self._background.start()
        return self._background

    def wait_pull_registered(self, timeout: float | None = None) -> None:
        """Block until every queue was acknowledged once (as the async flavour's method)."""
        _call_sync(
            self._core.thread, functools.partial(self._core.engine.wait_pull_registered, timeout)
        )

    def close(self) -> None:
        """Drain and stop; :meth:`start` returns after it. Idempotent.

        Raises:
            MatchingError: What a :meth:`start_background` start raised.
        """
        core = self._core
        core.closing = True
        try:
            if core.thread.started:
                try:
                    _call_sync(core.thread, core.engine.close)
                except WorkerStopped:
                    pass
        finally:
            core.thread.stop().result()
            if self._background is not None:
                self._background.join()
            self._loops.stop()
        error, self._background_error = self._background_error, None
        if error is not None:
            raise error

    def __enter__(self) -> Worker:
        self.start_background()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(_ClientCalls):
    """A client for blocking programs: the API of :class:`AsyncClient` without await; safe
    to share between threads (calls are multiplexed on one connection)."""

    def _do(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return _call_sync(self._thread, functools.partial(fn, *args, **kwargs))

    def open(self) -> None:
        self._do(self._engine.open)

    def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> str:
        return self._do(self._engine.start_flow, flow, *args, flow_id=flow_id)

    def start_known_flow(self, flow_type: str, *args: Any, flow_id: str | None = None) -> str:
        return self._do(self._engine.start_known_flow, flow_type, *args, flow_id=flow_id)

    def call_rpc(self, flow_id: str, name: str, *args: Any, timeout: float | None = None) -> Any:
        return self._do(self._engine.call_rpc, flow_id, name, *args, timeout=timeout)

    def result(self, flow_id: str, timeout: float | None = None) -> Any:
        return self._do(self._engine.result, flow_id, timeout)

    def describe_flow(self, flow_id: str) -> FlowDescription:
        return self._do(self._engine.describe_flow, flow_id)

    def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> list[FlowSummary]:
        return self._do(self._engine.list_flows, flow_type, status, limit)

    def cancel_flow(self, flow_id: str) -> None:
        self._do(self._engine.cancel_flow, flow_id)

    def list_queues(self) -> list[QueueSummary]:
        return self._do(self._engine.list_queues)

    def close(self) -> None:
        """Close the connection and the client's thread; later calls raise ClientClosed."""
        try:
            if self._thread.started:
                try:
                    self._do(self._engine.close)
                except ClientClosed:
                    pass
        finally:
            self._thread.stop().result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


for _name in (
    "open",
    "start_flow",
    "start_known_flow",
    "call_rpc",
    "result",
    "describe_flow",
    "list_flows",
    "cancel_flow",
    "list_queues",
):
    getattr(Client, _name).__doc__ = getattr(ClientEngine, _name).__doc__
del _name
