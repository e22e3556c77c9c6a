"""Running one call on the pull worker: the handler runner, the handler's context, its outputs,
and the outcome message (M_RESULT with the state patch, or M_FAILURE).

It mirrors what a Temporal/Hatchet SDK does per task once it is accepted: unpack the arguments
(fetching blobs through the server), run the Step or RPC handler, diff the state, pack the
value. Slots, streams and the wire are the engine's (``_worker_engine.py``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import outcome
import trio

import wire

from ._errors import ClientClosed, ConfigurationError, MatchingError
from ._model import (
    NOT_YET,
    Registry,
    RpcContext,
    RpcDefinition,
    StepContext,
    StepDefinition,
    state_patch,
)
from ._sdk_connection import SdkConnection
from ._state_patches import copy_state
from ._worker_threads import HandlerThreads

__all__ = [
    "CallOutputs",
    "HandlerRunner",
    "Returned",
    "TrioHandlerRunner",
    "cancelled_failure",
    "deadline_of",
    "execute",
    "failure_of",
    "handler_of",
    "new_context",
    "result_of",
    "send_output",
    "timeout_failure",
]

log = logging.getLogger("apps.matching.worker")


class HandlerRunner(Protocol):
    """Runs one Step or RPC handler: ``await runner(handler, ctx, args)`` returns what
    ``handler(ctx, *args)`` returns (or raises what it raises).

    The engine cancels the runner's task when the drain timeout passes; the runner must then
    make the handler stop (or wait for it) before returning.

    Attributes:
        threads: Where the runner runs plain (blocking) functions, or None. When set, the
            engine submits a blocking handler's call there itself, with no trio task per call
            (:meth:`HandlerThreads.submit`), whenever nothing around the handler has to wait.
    """

    threads: HandlerThreads | None

    async def __call__(
        self, handler: Callable[..., Any], ctx: StepContext | RpcContext, args: list[Any]
    ) -> Any: ...


class TrioHandlerRunner:
    """The default runner: ``async def`` handlers run as trio coroutines, plain functions in a
    handler thread (:class:`HandlerThreads`). A thread cannot be interrupted: on
    cancellation the runner waits for the function to return."""

    def __init__(self) -> None:
        self.threads: HandlerThreads | None = HandlerThreads()

    async def __call__(
        self, handler: Callable[..., Any], ctx: StepContext | RpcContext, args: list[Any]
    ) -> Any:
        if inspect.iscoroutinefunction(handler):
            return await handler(ctx, *args)
        assert self.threads is not None
        return await self.threads.run(functools.partial(handler, ctx, *args))


def handler_of(
    registry: Registry, worker_id: str, task: wire.MatchTask
) -> StepDefinition | RpcDefinition | str:
    """The task's handler, or why there is none (a decline message)."""
    if task.flow_type not in registry:
        return f"worker {worker_id} does not serve flow type {task.flow_type!r}"
    flow = registry.get(task.flow_type)
    handler: StepDefinition | RpcDefinition | None
    if task.kind == "step":
        handler = flow.step(task.name)
    else:
        handler = flow.rpcs.get(task.name)
    if handler is None or (isinstance(handler, StepDefinition) and handler.kind == "subflow"):
        # (a SubFlow runs on the server)
        return (
            f"worker {worker_id} has no {task.kind} {task.name!r} in flow type {task.flow_type!r}"
        )
    return handler


@attrs.define(eq=False)
class CallOutputs:
    """The outputs of one running call (``ctx.output``), in order, before its outcome.

    Nothing is spawned for a call that emits nothing: the first output starts one forwarding
    task in ``nursery`` (the engine's calls nursery: handlers outlive connections);
    :meth:`finish` closes the outputs and waits until the forwarded ones are written. ``send``
    writes one M_OUTPUT (or drops it, the stream being gone).
    """

    nursery: trio.Nursery
    send: Callable[[Any], Awaitable[None]]
    pending: deque[Any] = attrs.field(factory=deque)
    forwarding: bool = False
    closed: bool = False
    done: trio.Event | None = None

    def put(self, value: Any) -> None:
        """Queue one output (in the trio thread)."""
        if self.closed:
            log.debug("an output after its call ended was dropped")
            return
        self.pending.append(value)
        self.forward()

    def forward(self) -> None:
        """Start forwarding the queued outputs, unless it runs (in the trio thread)."""
        if self.pending and not self.forwarding:
            try:
                self.nursery.start_soon(self._forward)
            except RuntimeError:  # the worker is stopping: nothing is sent any more
                self.pending.clear()
                log.debug("an output after the worker stopped was dropped")
                return
            self.forwarding = True

    async def _forward(self) -> None:
        try:
            while self.pending:
                await self.send(self.pending.popleft())
        finally:
            self.pending.clear()
            self.forwarding = False
            if self.done is not None:
                self.done.set()

    async def finish(self) -> None:
        """No more outputs; wait for the queued ones to be written (or dropped, the connection
        being lost). On cancellation the forwarding task goes on alone."""
        self.closed = True
        self.forward()  # (outputs another thread queued whose wake-up has not run yet)
        if self.forwarding:
            self.done = trio.Event()
            await self.done.wait()

    def emitter(self, token: trio.lowlevel.TrioToken) -> Callable[[Any], None]:
        """``ctx.output``: callable from the trio thread, a worker thread or another event
        loop's thread; outputs keep their order and come before the call's outcome.

        From another thread the value is queued at once (so it is queued before the handler's
        outcome is handed back) and the trio thread is asked to forward it."""
        put = self.put
        pending = self.pending

        def emit(value: Any) -> None:
            try:
                here = trio.lowlevel.current_trio_token()
            except RuntimeError:
                here = None
            if here is token:
                put(value)
                return
            if self.closed:
                log.debug("an output after its call ended was dropped")
                return
            pending.append(value)  # (a deque: appends are atomic)
            try:
                token.run_sync_soon(self.forward)
            except trio.RunFinishedError:
                log.debug("an output after the worker stopped was dropped")

        return emit


def new_context(
    task: wire.MatchTask, cache: Any, emit: Callable[[Any], None] | None
) -> StepContext | RpcContext:
    """The context ``task``'s handler gets (a deep copy of the flow's state; a new dict for
    an empty one, without the cost of ``deepcopy``); ``emit`` is a Step's ``ctx.output``
    (an RPC's context has none)."""
    if task.kind == "step":
        return StepContext(
            flow_id=task.flow_id,
            flow_type=task.flow_type,
            step=task.name,
            execution_id=task.execution_id,
            attempt=task.attempt,
            state=copy_state(task.state) if task.state else {},
            deadline_in=task.timeout,
            blobs=cache,
            emit=emit,
        )
    return RpcContext(
        flow_id=task.flow_id,
        flow_type=task.flow_type,
        rpc=task.name,
        state=copy_state(task.state) if task.state else {},
        blobs=cache,
    )


def deadline_of(task: wire.MatchTask, now: float | None = None) -> float:
    """When ``task``'s handler is given up on (its timeout from ``now``, by default trio's
    current time)."""
    timeout = task.timeout
    if timeout is None:
        return math.inf
    return (trio.current_time() if now is None else now) + timeout


def result_of(
    task: wire.MatchTask, value: Any, ctx: StepContext | RpcContext, rid: int
) -> wire.MatchResult:
    """M_RESULT of ``task`` (``value`` already packed), with the handler's state patch; for
    :data:`NOT_YET` (a WaitFor's condition is false) ``not_yet`` and no patch."""
    if value is NOT_YET:
        if task.kind != "step":
            raise ConfigurationError(
                f"RPC {task.name!r} returned NOT_YET: only a @wait_for Step may; an RPC answers"
                " its caller at once"
            )
        return wire.MatchResult(delivery=task.delivery, value=None, not_yet=True, rid=rid)
    patch = state_patch(task.state, ctx.state)
    return wire.MatchResult(delivery=task.delivery, value=value, patch=patch, rid=rid)


def failure_of(task: wire.MatchTask, exc: Exception, rid: int) -> wire.MatchFailure:
    """M_FAILURE of ``task`` whose handler raised ``exc`` (logged): retryable unless ``exc``
    is a non-retryable :class:`MatchingError`."""
    retryable = not (isinstance(exc, MatchingError) and not exc.retryable)
    log.info(
        "%s %s of flow %s (attempt %d) raised %s: %s",
        task.kind,
        task.name,
        task.flow_id,
        task.attempt,
        type(exc).__name__,
        exc,
    )
    return wire.MatchFailure(
        delivery=task.delivery,
        type=type(exc).__name__,
        message=str(exc),
        retryable=retryable,
        rid=rid,
    )


def timeout_failure(task: wire.MatchTask, rid: int) -> wire.MatchFailure:
    """M_FAILURE of ``task`` whose handler outlived its timeout (logged; retryable)."""
    log.info(
        "%s %s of flow %s (attempt %d) was cancelled at its timeout of %ss",
        task.kind,
        task.name,
        task.flow_id,
        task.attempt,
        task.timeout,
    )
    return wire.MatchFailure(
        delivery=task.delivery,
        type="TimeoutError",
        message=(
            f"{task.kind} {task.name!r} of flow {task.flow_id!r} did not finish within its"
            f" timeout of {task.timeout}s and was cancelled; raise the {task.kind}'s timeout"
            " if it needs longer"
        ),
        retryable=True,
        rid=rid,
    )


def cancelled_failure(task: wire.MatchTask, rid: int) -> wire.MatchFailure:
    """M_FAILURE of ``task`` whose handler the server cancelled (M_CANCEL; not retryable:
    nobody waits for it)."""
    return wire.MatchFailure(
        delivery=task.delivery,
        type="Cancelled",
        message=f"{task.kind} {task.name!r} of flow {task.flow_id!r} was cancelled by the server",
        retryable=False,
        rid=rid,
    )


@attrs.frozen
class Returned:
    """A handler that already ran (in a handler thread, submitted by the engine) for
    :func:`execute` to finish: its outcome, the context it ran with, its deadline."""

    outcome: outcome.Outcome[Any]
    ctx: StepContext | RpcContext
    deadline: float


async def execute(
    task: wire.MatchTask,
    handler: StepDefinition | RpcDefinition,
    *,
    rid: int,
    conn: SdkConnection,
    cache: Any,
    runner: HandlerRunner,
    emit: Callable[[Any], None],
    returned: Returned | None = None,
) -> wire.MatchMessage:
    """Run ``task``'s handler (or take what it ``returned``); return its outcome for stream
    ``rid``: M_RESULT (value packed through ``cache``, state patch) or M_FAILURE (a handler's
    exception; a non-retryable :class:`MatchingError` stays non-retryable; a retryable
    ``TimeoutError`` when the task's timeout passed, the handler cancelled). Cancellation
    propagates."""
    try:
        if returned is None:
            args: Any = task.args
            if cache is not None:
                args = await cache.unpack_async(args, functools.partial(_fetch, conn))
            ctx = new_context(task, cache, emit)
            deadline = deadline_of(task)
        else:
            ctx, deadline = returned.ctx, returned.deadline
        # The server gives up on the attempt at its deadline; cancelling here frees the slot
        # instead of running on for an outcome nobody will read. (A blocking handler in a
        # thread cannot be interrupted: its runner waits for it to return.)
        with trio.move_on_at(deadline):
            if returned is None:
                value = await runner(handler.handler, ctx, list(args))
            else:
                value = returned.outcome.unwrap()
            if cache is not None:
                value = await cache.pack_async(value, functools.partial(_upload, conn))
            return result_of(task, value, ctx, rid)
        return timeout_failure(task, rid)
    except Exception as exc:
        return failure_of(task, exc, rid)


async def send_output(conn: SdkConnection, delivery: int, rid: int, value: Any) -> None:
    """Write one M_OUTPUT, ignoring a lost connection (its loss is handled elsewhere)."""
    try:
        await conn.send(wire.MatchOutput(delivery=delivery, value=value, rid=rid))
    except ClientClosed:
        pass
    except wire.WireError as exc:
        log.warning("an output of delivery %d cannot be sent: %s", delivery, exc)


async def _fetch(conn: SdkConnection, key: str) -> bytes:
    data = await conn.call("get_blob", {"key": key})
    return bytes(data)


async def _upload(conn: SdkConnection, data: bytes) -> str:
    key = await conn.call("put_blob", {"data": data})
    return str(key)
