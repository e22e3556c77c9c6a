"""Async handlers of the asyncio and blocking workers run on an asyncio loop: a trio-side call
that runs one coroutine as a task of a loop in another thread (:func:`run_on_asyncio`), the
``HandlerRunner`` built on it, and the loop thread a blocking worker owns for them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import outcome
import trio

from ._errors import Cancelled, WorkerStopped
from ._model import Registry, RpcContext, StepContext
from ._worker_threads import HandlerThreads

__all__ = ["AsyncioHandlerRunner", "_LoopThread", "_has_async_handlers", "run_on_asyncio"]

T = TypeVar("T")


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
        self.threads: HandlerThreads | None = HandlerThreads()

    async def __call__(
        self, handler: Callable[..., Any], ctx: StepContext | RpcContext, args: list[Any]
    ) -> Any:
        if not inspect.iscoroutinefunction(handler):
            assert self.threads is not None
            return await self.threads.run(functools.partial(handler, ctx, *args))
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
