"""The pull worker's fast path for blocking (plain-function) handlers: the call goes straight to
a handler thread with no trio task of its own, and that thread writes the call's outcome (with
its held M_ACCEPT) to the socket itself, so a quick handler's outcome leaves the process with
no wake-up of the trio loop (a Step cost the worker two wake-ups before: the TASK's and the
outcome's hand-back).

The slot's bookkeeping (freeing it, the stream idle again) stays the trio thread's: the thread
queues the finished call in ``_completions``, which the trio side takes before it looks at any
slot or stream (every frame of a stream, the timer loop, the stream plan, a drain). When
nothing else wakes the loop it is woken anyway: a call whose ACCEPT was held keeps the link's
timer due at the ACCEPT's time (``accept_delay``, 5 ms by default), any other call, a drain
and a reconnect wake it at once. A call the thread cannot finish (outputs to write first,
blobs to store, a ``BaseException``, a call cancelled meanwhile, a TLS connection, which only
the trio thread may write, a lost connection) is handed back to the trio thread as before.

A handler that proved quick (``_worker_quick.py``) skips the threads altogether: its call runs
on the trio thread where its TASK is read (:meth:`BlockingCalls._run_inline`).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import outcome
import trio

import wire

from ._blobs import NEEDS_IO, BlobCache
from ._errors import ClientClosed
from ._model import NOT_YET, RpcDefinition, StepDefinition, state_patch
from ._worker_calls import (
    CallOutputs,
    Returned,
    deadline_of,
    failure_of,
    new_context,
    result_of,
    timeout_failure,
)
from ._worker_quick import QuickHandlers
from ._worker_streams import Link, Stream
from ._worker_threads import HandlerThreads

__all__ = ["BlockingCall", "BlockingCalls"]

log = logging.getLogger("apps.matching.worker")


@attrs.define(eq=False)
class BlockingCall:
    """A blocking handler's call submitted to the handler threads with no task of its own:
    what its outcome needs once the function returned."""

    stream: Stream
    task: wire.MatchTask
    handler: StepDefinition | RpcDefinition
    outputs: CallOutputs
    ctx: Any
    deadline: float
    cancelled: bool = False

    def cancel(self) -> None:
        """The drain timeout passed, or the server cancelled it (M_CANCEL): the thread cannot
        be interrupted, so this is noted only (the outcome then goes through the trio
        thread)."""
        self.cancelled = True


class BlockingCalls:
    """The fast path, mixed into the engine (through ``WorkerTasks``), which holds the state
    and provides the slot methods."""

    _cache: Any
    #: The runner's handler threads, or None (then every call runs in a task of its own).
    _threads: HandlerThreads | None
    _busy: int
    _active: int
    _token: trio.lowlevel.TrioToken | None
    _clock: trio.abc.Clock | None
    _draining: bool
    _calls_nursery: trio.Nursery
    _call_scopes: set[Any]
    #: Calls whose outcome a handler thread wrote, for the trio thread to free their slots.
    _completions: deque[BlockingCall]
    #: A wake-up of the trio thread to take ``_completions`` is on its way.
    _completions_wake: bool
    #: The handlers that run on the trio thread (``_worker_quick.py``).
    _quick: QuickHandlers
    _now: Callable[[], float]

    # (provided by WorkerTasks)
    def _free_slot(self, s: Stream, now: float | None = None) -> None:
        raise NotImplementedError

    def _call_over(self, s: Stream) -> None:
        raise NotImplementedError

    def _send_outcome_nowait(
        self, s: Stream, task: wire.MatchTask, message: wire.MatchMessage
    ) -> None:
        raise NotImplementedError

    def _output(self, s: Stream, task: wire.MatchTask, value: Any) -> Any:
        raise NotImplementedError

    def _run_call(self, *args: Any) -> Any:
        raise NotImplementedError

    def _unhold(self, s: Stream) -> None:
        raise NotImplementedError

    @staticmethod
    def _unsendable(s: Stream, task: wire.MatchTask, exc: wire.WireError) -> wire.MatchFailure:
        raise NotImplementedError

    def _send_nowait(self, link: Link, *messages: wire.MatchMessage) -> bool:
        raise NotImplementedError

    def _timer_due(self, link: Link) -> float:
        raise NotImplementedError

    async def _wait_kick(self, deadline: float = math.inf) -> None:
        raise NotImplementedError

    def _call_args(self, task: wire.MatchTask) -> Any:
        """The arguments of ``task``'s call with no task of its own, or :data:`NEEDS_IO` when
        it needs one (a blob to read or fetch, a cache that is no ``BlobCache``)."""
        cache = self._cache
        args = task.args
        if cache is None:
            return args
        if type(cache) is not BlobCache:
            return NEEDS_IO
        return cache.unpack_now(args) if args else args

    def _outputs_of(self, s: Stream, task: wire.MatchTask) -> CallOutputs:
        return CallOutputs(self._calls_nursery, functools.partial(self._output, s, task))

    def _blocking_call(
        self,
        s: Stream,
        task: wire.MatchTask,
        handler: StepDefinition | RpcDefinition,
        now: float,
    ) -> tuple[BlockingCall, Any] | None:
        """The call of a plain-function handler that needs no task (taken at ``now``), and
        its arguments; None when it needs one (a blob to fetch, a context that cannot be
        built)."""
        args = self._call_args(task)
        if args is NEEDS_IO:
            return None
        token = self._token
        assert token is not None
        outputs = self._outputs_of(s, task)
        try:
            ctx = new_context(task, self._cache, outputs.emitter(token))
        except Exception:  # (a task a call in a task turns into a failure)
            return None
        return BlockingCall(s, task, handler, outputs, ctx, deadline_of(task, now)), args

    def _submit_blocking(
        self,
        s: Stream,
        task: wire.MatchTask,
        handler: StepDefinition | RpcDefinition,
        now: float,
    ) -> bool:
        """Hand a plain-function handler's call straight to the handler threads when nothing
        before it has to wait (no blob to read or fetch); its outcome is written by its
        thread (:meth:`_finish_in_thread`) or sent from :meth:`_blocking_done`. Returns False
        (nothing done) when the call needs a task."""
        threads = self._threads
        if threads is None or handler.is_async:
            return False
        ready = self._blocking_call(s, task, handler, now)
        if ready is None:
            return False
        call, args = ready
        ctx = call.ctx
        s.cancel = call
        self._call_scopes.add(call)
        quick = self._quick
        threads.submit(
            functools.partial(_timed, quick, handler, ctx, args)
            if quick.enabled
            else functools.partial(handler.handler, ctx, *args),
            functools.partial(self._blocking_done, call),
            functools.partial(self._finish_in_thread, call)
            if s.link.conn.threadsafe_writes
            else None,
        )
        return True

    def _run_inline(
        self,
        s: Stream,
        task: wire.MatchTask,
        handler: StepDefinition | RpcDefinition,
        now: float,
    ) -> bool | tuple[BlockingCall, outcome.Outcome[Any]]:
        """Run a quick plain-function handler's call (``_worker_quick.py``), taken at ``now``,
        here, on the trio thread, with nothing held nor handed over, and send its ACCEPT and
        outcome in one write. Returns True when the call is over (its slot free again), False
        when it is not for this path (nothing done), or the call and its outcome when its
        outputs or blobs must be written first (its ACCEPT is not sent yet:
        ``_blocking_done`` finishes it).

        Nothing is built for the call beyond its context unless it goes the general way (an
        unusual outcome): an RPC's context takes no outputs, so it gets no ``CallOutputs``
        until then, and no ``BlockingCall`` either."""
        quick = self._quick
        if self._threads is None or handler.is_async or not quick.is_quick(handler):
            return False
        args = self._call_args(task)
        if args is NEEDS_IO:
            return False
        outputs = None if task.kind == "rpc" else self._outputs_of(s, task)
        token = self._token
        assert token is not None
        try:
            ctx = new_context(
                task, self._cache, None if outputs is None else outputs.emitter(token)
            )
        except Exception:  # (a task a call in a task turns into a failure)
            return False
        clock = quick.clock
        began = clock()
        try:
            value = contextvars.copy_context().run(handler.handler, ctx, *args)
        except BaseException as exc:  # (as outcome.capture: the threaded path's outcome)
            returned: outcome.Outcome[Any] | None = outcome.Error(exc)
        else:
            returned = None
        quick.ran_inline(handler, clock() - began)
        deadline = deadline_of(task, now)
        if outputs is not None and (outputs.pending or outputs.forwarding):
            call = BlockingCall(s, task, handler, outputs, ctx, deadline)
            return call, outcome.Value(value) if returned is None else returned
        end = self._now()
        link = s.link
        conn = link.conn
        data = None
        if returned is None and end < deadline:
            # The usual outcome, a value: its ACCEPT and RESULT encoded with no message built
            # (anything unusual takes the general way below, which names it).
            data = self._result_bytes(task, ctx, value, s.id, conn)
        message = None
        if data is None:
            if returned is None:
                returned = outcome.Value(value)
            if outputs is None:
                outputs = self._outputs_of(s, task)
            call = BlockingCall(s, task, handler, outputs, ctx, deadline)
            message = self._message_of(call, returned, end)
            if message is None:
                return call, returned
        if outputs is not None:
            outputs.closed = True
        self._free_slot(s, end)
        accept = None
        try:
            if data is not None:
                conn.send_encoded_nowait(data)
            else:
                accept = wire.MatchAccept(delivery=task.delivery, rid=s.id)
                conn.send_nowait(accept, message)  # type: ignore[arg-type]
        except wire.WireError as exc:
            if accept is None:
                accept = wire.MatchAccept(delivery=task.delivery, rid=s.id)
            self._send_nowait(link, accept, self._unsendable(s, task, exc))
        except ClientClosed:
            log.warning(
                "the connection was lost: the outcome of delivery %d is dropped", task.delivery
            )
        # (_call_over's bookkeeping; the stream is idle again as before the call: its queue's
        # plan is unchanged)
        self._active -= 1
        link.calls -= 1
        return True

    def _result_bytes(
        self, task: wire.MatchTask, ctx: Any, value: Any, rid: int, conn: Any
    ) -> bytes | None:
        """The ACCEPT and RESULT of an inline call that returned ``value`` in time, encoded
        (``wire.encode_result``: no message built); None when they are not the usual ones (a
        WaitFor's NOT_YET, blobs to store, a state or value that is no wire value), which
        :meth:`_message_of` then builds or names."""
        if value is NOT_YET:
            return None
        cache = self._cache
        if cache is not None and value is not None:  # (None is sent as it is)
            value = cache.pack_now(value)
            if value is NEEDS_IO:
                return None
        before, after = task.state, ctx.state
        try:
            return wire.encode_result(
                task.delivery,
                value,
                # (no state before nor after: state_patch's answer, without its work)
                state_patch(before, after) if before or after else {"set": {}, "delete": []},
                rid,
                conn.codec,
                limits=conn.limits,
                accept=True,
            )
        except Exception:
            return None

    def _finish_in_thread(self, call: BlockingCall, returned: outcome.Outcome[Any]) -> bool:
        """(In the call's handler thread, once its function returned.) Write the call's
        outcome, after its ACCEPT if that is still held, and queue the call for the trio
        thread's bookkeeping. Returns False (nothing written) when the trio thread must finish
        the call (see the module doc)."""
        s, task = call.stream, call.task
        link = s.link
        conn = link.conn
        outputs = call.outputs
        outputs.closed = True
        if call.cancelled or outputs.forwarding or outputs.pending:
            return False  # (its outputs go first: a task waits for them)
        clock = self._clock
        assert clock is not None
        message = self._message_of(call, returned, clock.current_time())
        if message is None:
            return False
        try:
            data = conn.encode(message)
        except wire.WireError:
            return False  # (the trio thread sends the failure saying why)
        held = False
        # Under the connection's write lock: the timer loop sends a held ACCEPT alone under
        # it too, so exactly one of the two writes it, and always before the outcome.
        with conn.write_lock:
            if s.state == "closed":
                return False
            if not s.accept_written:
                s.accept_written = held = True
                data = conn.encode(wire.MatchAccept(delivery=task.delivery, rid=s.id)) + data
            # Queued before the write: the server's next TASK on this stream, an answer to
            # the outcome, always finds it (the trio thread takes it first); the trio thread
            # writes nothing before this outcome meanwhile (it waits for the write lock).
            self._completions.append(call)
            try:
                conn.send_threadsafe(data)
            except ClientClosed:
                lost = True  # (the link's timer loop may be gone)
                log.warning(
                    "the connection was lost: the outcome of delivery %d is dropped",
                    task.delivery,
                )
            else:
                lost = False
        if lost or not held or self._draining or link.reconnecting:
            # No timer of the link is due soon for it, or someone waits for the slots.
            self._wake_for_completions()
        return True

    def _busy_now(self) -> int:
        """Busy slots, from any thread: the trio thread takes the completions first; another
        thread counts them out."""
        try:
            here = trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:
            here = False
        if here:
            self._take_completions()
            return self._busy
        return self._busy - len(self._completions)

    def _calls_active(self) -> bool:
        """(In the trio thread.) Whether calls still run (their outcome not sent), once
        those whose threads sent it are counted out."""
        self._take_completions()
        return self._active > 0

    def _message_of(
        self, call: BlockingCall, returned: outcome.Outcome[Any], now: float
    ) -> wire.MatchMessage | None:
        """The outcome frame of a fast-path call whose function ``returned`` (at ``now``), or
        None when a task must finish it (a result with blobs to store, a BaseException)."""
        s, task = call.stream, call.task
        if now >= call.deadline:
            return timeout_failure(task, s.id)
        if type(returned) is outcome.Value:
            value = returned.value
            cache = self._cache
            if cache is not None:
                value = cache.pack_now(value)
                if value is NEEDS_IO:
                    return None
            try:
                return result_of(task, value, call.ctx, s.id)
            except Exception as exc:  # (a state the handler left that is no wire value)
                return failure_of(task, exc, s.id)
        error = returned.error  # type: ignore[attr-defined]
        return failure_of(task, error, s.id) if isinstance(error, Exception) else None

    def _wake_for_completions(self) -> None:
        """(In a handler thread.) Have the trio thread take the completions soon: one wake-up
        for all those queued meanwhile (the flag is cleared there before they are taken)."""
        if self._completions_wake:
            return
        self._completions_wake = True
        token = self._token
        assert token is not None
        try:
            token.run_sync_soon(self._completions_woken)
        except trio.RunFinishedError:  # pragma: no cover - the engine waits for its calls
            pass

    def _completions_woken(self) -> None:
        self._completions_wake = False
        self._take_completions()

    def _take_completions(self) -> None:
        """(In the trio thread.) Free the slots of the calls whose threads wrote their
        outcome: each exactly once, as if the trio thread had sent it."""
        done = self._completions
        while done:
            call = done.popleft()
            s = call.stream
            self._call_scopes.discard(call)
            if s.accept is not None:  # (its ACCEPT went with the outcome)
                accept_at = s.accept_at
                self._unhold(s)
                timer = s.link.timer
                if accept_at <= timer.deadline:
                    timer.deadline = self._timer_due(s.link)
            try:
                self._free_slot(s)
            finally:
                self._call_over(s)

    def _blocking_done(self, call: BlockingCall, returned: outcome.Outcome[Any]) -> None:
        """(In the trio thread, between tasks.) A fast-path call's function returned and its
        thread did not finish it: send its outcome now, or, when its outputs or blobs must be
        written first (or it raised a BaseException), finish it in a task as ``_run_call``
        does."""
        s, task = call.stream, call.task
        message: wire.MatchMessage | None = None
        if not (call.outputs.pending or call.outputs.forwarding):  # (else: outputs go first)
            message = self._message_of(call, returned, trio.current_time())
        self._call_scopes.discard(call)
        if message is None:
            scope = trio.CancelScope()
            if call.cancelled:
                scope.cancel()
            if s.cancel is call:
                s.cancel = scope
            finish = Returned(returned, call.ctx, call.deadline)
            try:
                self._calls_nursery.start_soon(
                    self._run_call, s, task, call.handler, scope, finish, call.outputs
                )
            except RuntimeError:  # run() was cancelled: nothing is sent any more
                log.warning(
                    "the outcome of delivery %d is dropped: the worker stopped", task.delivery
                )
            else:
                self._call_scopes.add(scope)
                return
        call.outputs.closed = True
        try:
            self._free_slot(s)
            if message is not None:
                self._send_outcome_nowait(s, task, message)
        finally:
            self._call_over(s)

    async def _wait_blocking_calls(self) -> None:
        """Wait (shielded) until the functions of fast-path calls have returned, as a task
        waiting for its thread would: ``run`` never returns under a running handler."""
        with trio.CancelScope(shield=True):
            while True:
                self._take_completions()
                if not any(type(c) is BlockingCall for c in self._call_scopes):
                    return
                await self._wait_kick()


def _timed(
    quick: QuickHandlers, handler: StepDefinition | RpcDefinition, ctx: Any, args: Any
) -> Any:
    """(In a handler thread.) ``handler(ctx, *args)``, its time told to ``quick``."""
    clock = quick.clock
    began = clock()
    try:
        return handler.handler(ctx, *args)
    finally:
        quick.ran_in_thread(handler, clock() - began)
