"""The SDK's flavours: one trio engine per side, thin adapters around it (the seed's
``AsyncWorker``/``AsyncClient`` for asyncio, ``Worker``/``Client`` for blocking programs,
``TrioWorker``/``TrioClient`` for trio), and a readiness probe helper.

The asyncio and blocking flavours run their engine in a ``trio.run`` of a thread of their own
(one per adapter object) and bridge each call: the caller's loop (or thread) only waits on a
future the trio side completes, so an asyncio loop is never blocked. Cancelling the asyncio
task awaiting a call cancels the call on the trio side, and waits for it to end there. Async
handlers of an :class:`AsyncWorker` run as tasks of the caller's asyncio loop; those of a
blocking :class:`Worker` on an asyncio loop the worker owns; plain functions in a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import outcome
import trio

from ._blobs import BlobCache
from ._client_engine import ClientEngine
from ._errors import Cancelled, ClientClosed, MatchingError, WorkerStopped
from ._model import (
    Flow,
    FlowDescription,
    FlowStatus,
    FlowSummary,
    Registry,
    RpcContext,
    StepContext,
)
from ._options import ClientOptions, WorkerOptions
from ._readiness import PullRegistrationState
from ._worker_engine import WorkerEngine, WorkerStatistics

__all__ = [
    "AsyncClient",
    "AsyncWorker",
    "AsyncioHandlerRunner",
    "Client",
    "TrioClient",
    "TrioWorker",
    "Worker",
    "readiness_handler",
    "serve_readyz",
]

T = TypeVar("T")


# -- the trio thread --------------------------------------------------------------------------


class _Call:
    """One call submitted to a :class:`_TrioThread` (its fields are the trio thread's)."""

    __slots__ = ("cancelled", "scope")

    def __init__(self) -> None:
        self.scope: trio.CancelScope | None = None
        self.cancelled = False


class _TrioThread:
    """A ``trio.run`` in a daemon thread of its own, started on first use, where an adapter's
    engine lives; other threads submit calls to it.

    ``closed`` builds the error calls get once the thread is stopping or stopped."""

    def __init__(self, name: str, closed: Callable[[], MatchingError]) -> None:
        self._name = name
        self._closed = closed
        self._lock = threading.Lock()
        #: "new", "running" (started or starting), "stopping", "done".
        self._state = "new"
        self._token: trio.lowlevel.TrioToken | None = None
        self._early: list[Callable[[], None]] = []
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.finished.set_running_or_notify_cancel()  # so waiting on it never cancels it

    @property
    def started(self) -> bool:
        return self._state != "new"

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _schedule(self, fn: Callable[[], None], *, stopping_ok: bool = False) -> None:
        with self._lock:
            if self._state == "done" or (self._state == "stopping" and not stopping_ok):
                raise self._closed()
            if self._state == "new":
                self._state = "running"
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            token = self._token
            if token is None:
                self._early.append(fn)
                return
        try:
            token.run_sync_soon(fn)
        except trio.RunFinishedError:
            raise self._closed() from None

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # pragma: no cover - _main catches what calls raise
            self.finished.set_exception(exc)
        else:
            self.finished.set_result(None)
        finally:
            with self._lock:
                self._state = "done"

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with self._lock:
                self._token = trio.lowlevel.current_trio_token()
                early, self._early = self._early, []
            for fn in early:
                fn()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def submit(
        self, fn: Callable[[], Awaitable[T]], settle: Callable[[outcome.Outcome[T]], None]
    ) -> _Call:
        """Run ``fn()`` in the trio thread; ``settle`` gets its outcome there (an error built
        by ``closed`` if the thread stops first).

        Raises:
            MatchingError: The thread is stopping or stopped (``closed``'s error).
        """
        call = _Call()

        def spawn() -> None:
            nursery = self._nursery
            try:
                assert nursery is not None
                nursery.start_soon(self._run_call, call, fn, settle)
            except RuntimeError:  # the nursery is closed: the thread is stopping
                settle(outcome.Error(self._closed()))

        self._schedule(spawn)
        return call

    async def _run_call(
        self,
        call: _Call,
        fn: Callable[[], Awaitable[T]],
        settle: Callable[[outcome.Outcome[T]], None],
    ) -> None:
        result: outcome.Outcome[T] | None = None
        try:
            with trio.CancelScope() as scope:
                call.scope = scope
                if call.cancelled:
                    scope.cancel()
                try:
                    result = outcome.Value(await fn())
                except trio.Cancelled:
                    raise
                except BaseException as exc:
                    result = outcome.Error(exc)
        finally:
            if result is None:
                error: MatchingError = (
                    Cancelled("the call was cancelled by its caller")
                    if call.cancelled
                    else self._closed()
                )
                result = outcome.Error(error)
            settle(result)

    def cancel(self, call: _Call) -> None:
        """Cancel ``call`` on the trio side (from any thread; nothing if it is over)."""

        def do() -> None:
            call.cancelled = True
            if call.scope is not None:
                call.scope.cancel()

        try:
            self._schedule(do, stopping_ok=True)
        except MatchingError:
            pass

    def stop(self) -> concurrent.futures.Future[None]:
        """Stop the thread: calls still running are cancelled (their callers get
        ``closed``'s error). Returns :attr:`finished`."""
        with self._lock:
            state = self._state
            if state == "new":
                self._state = "done"
                self.finished.set_result(None)
                return self.finished
            if state == "running":
                self._state = "stopping"
        if state == "running":
            self._schedule(self._set_stop, stopping_ok=True)
        return self.finished

    def _set_stop(self) -> None:
        assert self._stop is not None
        self._stop.set()


async def _call_async(thread: _TrioThread, fn: Callable[[], Awaitable[T]]) -> T:
    """Await ``fn()`` run in ``thread`` from an asyncio task; cancelling the task cancels the
    call in trio and waits for it to end there."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: outcome.Outcome[T]) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, future, result)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    call = thread.submit(fn, settle)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if not future.done():
            thread.cancel(call)
            try:
                await future
            except BaseException:
                pass
        raise


def _resolve(future: asyncio.Future[T], result: outcome.Outcome[T]) -> None:
    if future.done():
        return
    if isinstance(result, outcome.Value):
        future.set_result(result.value)
    elif isinstance(result, outcome.Error):
        future.set_exception(result.error)


def _call_sync(thread: _TrioThread, fn: Callable[[], Awaitable[T]]) -> T:
    """Block on ``fn()`` run in ``thread``; an exception while waiting (KeyboardInterrupt)
    cancels the call in trio, waits for it to end, and propagates."""
    if thread.in_thread():
        raise RuntimeError("a blocking SDK call from its own trio thread would deadlock")
    future: concurrent.futures.Future[T] = concurrent.futures.Future()
    future.set_running_or_notify_cancel()

    def settle(result: outcome.Outcome[T]) -> None:
        if isinstance(result, outcome.Value):
            future.set_result(result.value)
        elif isinstance(result, outcome.Error):
            future.set_exception(result.error)

    call = thread.submit(fn, settle)
    try:
        return future.result()
    except BaseException:
        if not future.done():
            thread.cancel(call)
            concurrent.futures.wait([future])
        raise


# -- handlers on an asyncio loop --------------------------------------------------------------


async def run_on_asyncio(
    loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, T]]
) -> T:
    """Run the coroutine ``make()`` as a task of ``loop`` (another thread's) and return its
    result in trio. Cancelled in trio, it cancels the asyncio task and waits for it to end
    before raising ``trio.Cancelled``.

    Raises:
        WorkerStopped: ``loop`` is closed.
        Cancelled: The asyncio task was cancelled by someone else.
    """
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[outcome.Outcome[T]] = []
    tasks: list[asyncio.Task[T]] = []

    def report(result: outcome.Outcome[T]) -> None:
        def wake() -> None:
            box.append(result)
            done.set()

        try:
            token.run_sync_soon(wake)
        except trio.RunFinishedError:  # pragma: no cover - the engine waits for handlers
            pass

    def finished(task: asyncio.Task[T]) -> None:
        if task.cancelled():
            report(outcome.Error(Cancelled("the handler's asyncio task was cancelled")))
        elif task.exception() is not None:
            report(outcome.Error(task.exception()))  # type: ignore[arg-type]
        else:
            report(outcome.Value(task.result()))

    def start() -> None:
        try:
            task = loop.create_task(make())
        except BaseException as exc:
            report(outcome.Error(exc))
            return
        tasks.append(task)
        task.add_done_callback(finished)

    def cancel() -> None:
        for task in tasks:
            task.cancel()

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError as exc:
        raise WorkerStopped(f"the asyncio loop that runs async handlers is closed ({exc})") from exc
    try:
        await done.wait()
    except trio.Cancelled:
        try:
            loop.call_soon_threadsafe(cancel)
        except RuntimeError:
            raise  # the loop is gone, and its tasks with it
        with trio.CancelScope(shield=True):
            await done.wait()
        raise
    return box[0].unwrap()


class AsyncioHandlerRunner:
    """A ``HandlerRunner``: ``async def`` handlers run as tasks of an asyncio loop (the one
    ``loop()`` returns when the call starts), plain functions in a worker thread.

    Cancelled by the engine (the drain timeout), it cancels the asyncio task and waits for it;
    a thread cannot be interrupted, so it waits for a plain function to return.
    """

    def __init__(self, loop: Callable[[], asyncio.AbstractEventLoop | None]) -> None:
        self._loop = loop

    async def __call__(
        self, handler: Callable[..., Any], ctx: StepContext | RpcContext, args: list[Any]
    ) -> Any:
        if not inspect.iscoroutinefunction(handler):
            return await trio.to_thread.run_sync(
                functools.partial(handler, ctx, *args), abandon_on_cancel=False
            )
        loop = self._loop()
        if loop is None:
            raise WorkerStopped("no asyncio loop is running to run async handlers on")
        return await run_on_asyncio(loop, functools.partial(handler, ctx, *args))


class _LoopThread:
    """An asyncio loop in a daemon thread, for the async handlers of a blocking worker."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name=self._name, daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    def current(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def stop(self) -> None:
        """Cancel the loop's tasks, stop it and close it."""
        with self._lock:
            loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_asyncgens()
            loop.stop()

        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), loop)
            thread.join()
        loop.close()


def _has_async_handlers(registry: Registry) -> bool:
    for name in registry.flow_types:
        definition = registry.get(name)
        if any(s.is_async for s in definition.steps) or any(
            r.is_async for r in definition.rpcs.values()
        ):
            return True
    return False


# -- trio -------------------------------------------------------------------------------------


class TrioWorker(WorkerEngine):
    """The pull worker for trio programs: the engine itself, with the seed's ``start()``.

    ``await worker.start()`` serves until ``await worker.close()`` has drained (run it in a
    nursery); ``async with TrioWorker(...)`` closes it on the way out.
    """

    async def start(self) -> None:
        """Serve until :meth:`close` (the same as :meth:`run`)."""
        await self.run()

    async def __aenter__(self) -> TrioWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class TrioClient(ClientEngine):
    """The client for trio programs: the engine itself (``async with`` closes it)."""

    async def __aenter__(self) -> TrioClient:
        return self


# -- asyncio ----------------------------------------------------------------------------------


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


class AsyncWorker:
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


class _ClientCalls:
    """The client ops, each run by ``_do`` (awaited or blocking)."""

    def __init__(self, registry: Registry, cache: BlobCache | None, options: ClientOptions) -> None:
        self._engine = ClientEngine(registry, cache, options)
        self._thread = _TrioThread("matching-client", lambda: ClientClosed("the client is closed"))


class AsyncClient(_ClientCalls):
    """A client for asyncio programs (the seed's ``AsyncClient``); its engine runs in a trio
    thread of its own. Cancelling a task awaiting a call cancels the call (the server may still
    carry it out)."""

    async def _do(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return await _call_async(self._thread, functools.partial(fn, *args, **kwargs))

    async def open(self) -> None:
        await self._do(self._engine.open)

    async def start_flow(
        self, flow: Flow | type[Flow] | str, *args: Any, flow_id: str | None = None
    ) -> str:
        return await self._do(self._engine.start_flow, flow, *args, flow_id=flow_id)

    async def call_rpc(
        self, flow_id: str, name: str, *args: Any, timeout: float | None = None
    ) -> Any:
        return await self._do(self._engine.call_rpc, flow_id, name, *args, timeout=timeout)

    async def result(self, flow_id: str, timeout: float | None = None) -> Any:
        return await self._do(self._engine.result, flow_id, timeout)

    async def describe_flow(self, flow_id: str) -> FlowDescription:
        return await self._do(self._engine.describe_flow, flow_id)

    async def list_flows(
        self,
        flow_type: Flow | type[Flow] | str | None = None,
        status: FlowStatus | str | None = None,
        limit: int = 100,
    ) -> list[FlowSummary]:
        return await self._do(self._engine.list_flows, flow_type, status, limit)

    async def cancel_flow(self, flow_id: str) -> None:
        await self._do(self._engine.cancel_flow, flow_id)

    async def close(self) -> None:
        """Close the connection and the client's thread; later calls raise ClientClosed."""
        try:
            if self._thread.started:
                try:
                    await self._do(self._engine.close)
                except ClientClosed:
                    pass
        finally:
            await asyncio.wrap_future(self._thread.stop())

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


AsyncClient.open.__doc__ = ClientEngine.open.__doc__
AsyncClient.start_flow.__doc__ = ClientEngine.start_flow.__doc__
AsyncClient.call_rpc.__doc__ = ClientEngine.call_rpc.__doc__
AsyncClient.result.__doc__ = ClientEngine.result.__doc__
AsyncClient.describe_flow.__doc__ = ClientEngine.describe_flow.__doc__
AsyncClient.list_flows.__doc__ = ClientEngine.list_flows.__doc__
AsyncClient.cancel_flow.__doc__ = ClientEngine.cancel_flow.__doc__


# -- blocking ---------------------------------------------------------------------------------


class Worker:
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

    @property
    def app_worker_id(self) -> str:
        return self._core.engine.app_worker_id

    @property
    def pull_reserved_rpc_declines(self) -> int:
        return self._core.engine.pull_reserved_rpc_declines

    def pull_registration_state(self) -> PullRegistrationState:
        return self._core.state()

    def is_ready(self) -> bool:
        return self._core.state().is_ready

    def statistics(self) -> WorkerStatistics:
        return self._core.engine.statistics()

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
    "call_rpc",
    "result",
    "describe_flow",
    "list_flows",
    "cancel_flow",
):
    getattr(Client, _name).__doc__ = getattr(ClientEngine, _name).__doc__
del _name


# -- readiness probes -------------------------------------------------------------------------

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def readiness_handler(worker: Any) -> tuple[int, bytes]:
    """What a readiness probe answers for ``worker`` (any flavour): ``(200, b"ready\\n")`` when
    ``worker.pull_registration_state().is_ready``, else ``(503, b"not ready\\n")``."""
    if worker.pull_registration_state().is_ready:
        return 200, b"ready\n"
    return 503, b"not ready\n"


async def serve_readyz(
    worker: Any,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    path: str = "/readyz",
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``GET path`` (and ``HEAD``) with :func:`readiness_handler` over HTTP/1.1 on a trio
    TCP socket, one request per connection, until cancelled. ``task_status.started`` gets the
    listeners (``port=0`` picks a free port). Other paths get 404, other methods 405.
    """

    async def answer(stream: trio.SocketStream) -> None:
        with trio.move_on_after(10):
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 8192:
                data = await stream.receive_some(4096)
                if not data:
                    return
                request += data
            line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, target = [*line, "", ""][:2]
            if target.split("?", 1)[0] != path:
                status, body = 404, b"not found\n"
            elif method not in ("GET", "HEAD"):
                status, body = 405, b"method not allowed\n"
            else:
                status, body = readiness_handler(worker)
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode("latin-1")
            try:
                await stream.send_all(head + (b"" if method == "HEAD" else body))
            except trio.BrokenResourceError:
                pass
        await trio.aclose_forcefully(stream)

    await trio.serve_tcp(answer, port, host=host, task_status=task_status)
