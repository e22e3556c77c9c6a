"""The trio thread bridge of the asyncio and blocking SDK flavours: a ``trio.run`` in a daemon
thread of its own (one per adapter object) where the adapter's engine lives, and the two ways to
call into it: from an asyncio task (:func:`_call_async`) and from a blocking thread
(:func:`_call_sync`). The caller only waits on a future the trio side completes; cancelling the
caller cancels the call on the trio side and waits for it to end there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio

from ._errors import Cancelled, MatchingError

__all__ = ["_TrioThread", "_call_async", "_call_sync"]

T = TypeVar("T")


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


class _Waiter:
    """An asyncio caller's side of one call: the future it awaits now, and whether the call's
    outcome has reached the loop (both the loop's)."""

    __slots__ = ("future", "settled")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future
        self.settled = False


async def _call_async(thread: _TrioThread, fn: Callable[[], Awaitable[T]]) -> T:
    """Await ``fn()`` run in ``thread`` from an asyncio task; cancelling the task cancels the
    call in trio and waits for it to end there."""
    loop = asyncio.get_running_loop()
    waiter = _Waiter(loop.create_future())

    def settle(result: outcome.Outcome[T]) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, waiter, result)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    call = thread.submit(fn, settle)
    try:
        value: T = await waiter.future
        return value
    except asyncio.CancelledError:
        if not waiter.settled:
            # The task was cancelled (its future with it): wait for the call to end in trio.
            waiter.future = loop.create_future()
            thread.cancel(call)
            try:
                await waiter.future
            except BaseException:
                pass
        raise


def _resolve(waiter: _Waiter, result: outcome.Outcome[Any]) -> None:
    waiter.settled = True
    future = waiter.future
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
    # A lock held until the outcome is in: lighter than a Future (no Condition, no waiter).
    done = threading.Lock()
    done.acquire()
    box: list[outcome.Outcome[T]] = []

    def settle(result: outcome.Outcome[T]) -> None:
        box.append(result)
        done.release()

    call = thread.submit(fn, settle)
    try:
        done.acquire()
    except BaseException:
        if not box:
            thread.cancel(call)
            done.acquire()
        raise
    return box[0].unwrap()
