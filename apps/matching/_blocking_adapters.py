"""The SDK's blocking flavour (``Worker`` and ``Client``): the API of the asyncio flavour without
await. The worker's trio engine runs in a trio thread of its own (``_trio_thread``); each call
blocks the calling thread on a future. The client runs the same ops (``_client_ops``) on a
blocking socket in the calling thread (``_client_sync``). Async handlers of a :class:`Worker`
run on an asyncio loop the worker owns, plain functions in a thread.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, TypeVar

from ._asyncio_adapters import _WorkerCore, _WorkerView
from ._asyncio_handlers import AsyncioHandlerRunner, _has_async_handlers, _LoopThread
from ._blobs import BlobCache
from ._client_engine import ClientEngine
from ._client_ops import share_docs
from ._client_sync import SyncClientEngine
from ._errors import WorkerStopped
from ._model import Flow, FlowDescription, FlowStatus, FlowSummary, QueueSummary, Registry
from ._options import ClientOptions, WorkerOptions
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


class Client:
    """A client for blocking programs: the API of :class:`AsyncClient` without await; safe
    to share between threads (calls are multiplexed on one connection). No event loop runs
    under it: each calling thread does its own I/O (``_client_sync``), so a lone caller reads
    its answer itself, with no thread switch."""

    def __init__(self, registry: Registry, cache: BlobCache | None, options: ClientOptions) -> None:
        self._engine = SyncClientEngine(registry, cache, options)
        self._ops = self._engine.ops

    def open(self) -> None:
        self._engine.open()

    def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> str:
        return self._engine.run(self._ops.start_flow(flow, *args, flow_id=flow_id))

    def start_known_flow(self, flow_type: str, *args: Any, flow_id: str | None = None) -> str:
        return self._engine.run(self._ops.start_known_flow(flow_type, *args, flow_id=flow_id))

    def call_rpc(self, flow_id: str, name: str, *args: Any, timeout: float | None = None) -> Any:
        return self._engine.call_rpc(flow_id, name, args, timeout)

    def result(self, flow_id: str, timeout: float | None = None) -> Any:
        return self._engine.run(self._ops.result(flow_id, timeout))

    def describe_flow(self, flow_id: str) -> FlowDescription:
        return self._engine.run(self._ops.describe_flow(flow_id))

    def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> list[FlowSummary]:
        return self._engine.run(self._ops.list_flows(flow_type, status, limit))

    def cancel_flow(self, flow_id: str) -> None:
        self._engine.run(self._ops.cancel_flow(flow_id))

    def list_queues(self) -> list[QueueSummary]:
        return self._engine.run(self._ops.list_queues())

    def close(self) -> None:
        """Close the connection; calls in flight and later calls raise ClientClosed.
        Idempotent."""
        self._engine.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


share_docs(Client)
Client.open.__doc__ = ClientEngine.open.__doc__
