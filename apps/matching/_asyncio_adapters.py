"""The SDK's asyncio flavour (the seed's ``AsyncWorker`` and ``AsyncClient``): the worker's trio
engine runs in a trio thread of its own (``_trio_thread``), each call awaited on the caller's
loop, which is never blocked; the client runs the client's ops on the caller's loop itself
(``_client_asyncio``). Async handlers of an :class:`AsyncWorker` run as tasks of the caller's loop.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, TypeVar

from ._asyncio_handlers import AsyncioHandlerRunner
from ._blobs import BlobCache
from ._client_asyncio import AsyncioClientEngine
from ._client_engine import ClientEngine
from ._client_ops import share_docs
from ._errors import WorkerStopped
from ._model import Flow, FlowDescription, FlowStatus, FlowSummary, QueueSummary, Registry
from ._options import ClientOptions, WorkerOptions
from ._readiness import PullRegistrationState
from ._trio_thread import _call_async, _TrioThread
from ._worker_engine import WorkerEngine, WorkerStatistics

__all__ = ["AsyncClient", "AsyncWorker"]

T = TypeVar("T")


class _WorkerCore:
    """What the asyncio and blocking workers share: the engine and its trio thread."""

    def __init__(
        self,
        registry: Registry,
        cache: BlobCache | None,
        options: WorkerOptions,
        runner: AsyncioHandlerRunner,
        name: str,
    ) -> None:
        self.engine = WorkerEngine(registry, cache, options, runner=runner)
        self.thread = _TrioThread(name, lambda: WorkerStopped("the worker is closed"))
        self.closing = False

    def state(self) -> PullRegistrationState:
        return self.engine.pull_registration_state()


class _WorkerView:
    """What every worker flavour reads without waiting, from any thread."""

    _core: _WorkerCore

    @property
    def app_worker_id(self) -> str:
        return self._core.engine.app_worker_id

    @property
    def pull_reserved_rpc_declines(self) -> int:
        """Step tasks declined for the RPC reservation (never reset; readable after close)."""
        return self._core.engine.pull_reserved_rpc_declines

    def pull_registration_state(self) -> PullRegistrationState:
        """Each queue's registration and ``is_ready`` (non-blocking, any thread)."""
        return self._core.state()

    def is_ready(self) -> bool:
        return self._core.state().is_ready

    def statistics(self) -> WorkerStatistics:
        return self._core.engine.statistics()


class AsyncWorker(_WorkerView):
    """A pull worker for asyncio programs (the seed's ``AsyncWorker``).

    Example (the seed's)::

        worker = AsyncWorker(registry, cache, WorkerOptions(server_address=address))
        worker_task = asyncio.create_task(worker.start())
        await worker.wait_pull_registered(timeout=30)
        ...
        await worker.close()
        await worker_task

    The engine runs in a trio thread of its own. Async handlers (``allow_async_handlers``)
    run as tasks of the loop that called :meth:`start`; plain functions in a thread.
    """

    def __init__(self, registry: Registry, cache: BlobCache | None, options: WorkerOptions) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._core = _WorkerCore(
            registry, cache, options, AsyncioHandlerRunner(lambda: self._loop), "matching-worker"
        )
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            pass

    async def start(self) -> None:
        """Serve until :meth:`close` has drained the running handlers (the seed's Start).

        Raises:
            PullRegistrationError, MatchingError: as the engine's ``run`` (after draining).

        Cancelling the awaiting task stops the worker at once (handlers are cancelled); use
        :meth:`close` to drain.
        """
        self._loop = asyncio.get_running_loop()
        try:
            await _call_async(self._core.thread, self._core.engine.run)
        except WorkerStopped:
            if not self._core.closing:
                raise

    async def wait_pull_registered(self, timeout: float | None = None) -> None:
        """Wait until every queue was acknowledged once (see the engine's method).

        Raises:
            PullRegistrationError, WorkerStopped, CallTimeout, MatchingError.
        """
        await _call_async(
            self._core.thread, functools.partial(self._core.engine.wait_pull_registered, timeout)
        )

    async def close(self) -> None:
        """Drain and stop (the seed's Stop); :meth:`start` returns after it. Idempotent."""
        core = self._core
        core.closing = True
        try:
            if core.thread.started:
                try:
                    await _call_async(core.thread, core.engine.close)
                except WorkerStopped:
                    pass
        finally:
            await asyncio.wrap_future(core.thread.stop())

    async def __aenter__(self) -> AsyncWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncClient:
    """A client for asyncio programs (the seed's ``AsyncClient``): its calls run on the
    caller's loop (``_client_asyncio``), no thread in between. Cancelling a task awaiting a
    call cancels the call (the server may still carry it out)."""

    def __init__(self, registry: Registry, cache: BlobCache | None, options: ClientOptions) -> None:
        self._engine = AsyncioClientEngine(registry, cache, options)
        self._ops = self._engine.ops

    async def open(self) -> None:
        await self._engine.open()

    async def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> str:
        return await self._engine.run(self._ops.start_flow(flow, *args, flow_id=flow_id))

    async def start_known_flow(self, flow_type: str, *args: Any, flow_id: str | None = None) -> str:
        return await self._engine.run(self._ops.start_known_flow(flow_type, *args, flow_id=flow_id))

    async def call_rpc(
        self, flow_id: str, name: str, *args: Any, timeout: float | None = None
    ) -> Any:
        return await self._engine.call_rpc(flow_id, name, args, timeout)

    async def result(self, flow_id: str, timeout: float | None = None) -> Any:
        return await self._engine.run(self._ops.result(flow_id, timeout))

    async def describe_flow(self, flow_id: str) -> FlowDescription:
        return await self._engine.run(self._ops.describe_flow(flow_id))

    async def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> list[FlowSummary]:
        return await self._engine.run(self._ops.list_flows(flow_type, status, limit))

    async def cancel_flow(self, flow_id: str) -> None:
        await self._engine.run(self._ops.cancel_flow(flow_id))

    async def list_queues(self) -> list[QueueSummary]:
        return await self._engine.run(self._ops.list_queues())

    async def close(self) -> None:
        """Close the connection; calls in flight and later calls raise ClientClosed.
        Idempotent."""
        await self._engine.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


share_docs(AsyncClient)
AsyncClient.open.__doc__ = ClientEngine.open.__doc__
