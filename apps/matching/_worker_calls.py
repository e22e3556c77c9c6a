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
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

import wire

from ._errors import ClientClosed, MatchingError
from ._model import (
    Registry,
    RpcContext,
    RpcDefinition,
    StepContext,
    StepDefinition,
    copy_state,
    state_patch,
)
from ._sdk_connection import SdkConnection
from ._worker_threads import HandlerThreads

__all__ = [
    "CallOutputs",
    "HandlerRunner",
    "TrioHandlerRunner",
    "execute",
    "handler_of",
    "send_output",
]

log = logging.getLogger("apps.matching.worker")


class HandlerRunner(Protocol):
    """Runs one Step or RPC handler: ``await runner(handler, ctx, args)`` returns what
    ``handler(ctx, *args)`` returns (or raises what it raises).

    The engine cancels the runner's task when the drain timeout passes; the runner must then
    make the handler stop (or wait for it) before returning.
    """

    async def __call__(
        self, handler: Callable[..., Any], ctx: StepContext | RpcContext, args: list[Any]
    ) -> Any: ...


class TrioHandlerRunner:
    """The default runner: ``async def`` handlers run as trio coroutines, plain functions in a
    handler thread (:class:`HandlerThreads`). A thread cannot be interrupted: on
    cancellation the runner waits for the function to return."""

    def __init__(self) -> None:
        self._threads = HandlerThreads()

    async def __call__(
        self, handler: Callable[..., Any], ctx: StepContext | RpcContext, args: list[Any]
    ) -> Any:
        if inspect.iscoroutinefunction(handler):
            return await handler(ctx, *args)
        return await self._threads.run(functools.partial(handler, ctx, *args))


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
    if handler is None:
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
        if not self.forwarding:
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
        if self.forwarding:
            self.done = trio.Event()
            await self.done.wait()

    def emitter(self, token: trio.lowlevel.TrioToken) -> Callable[[Any], None]:
        """``ctx.output``: callable from the trio thread, a worker thread or another event
        loop's thread; outputs keep their order and come before the call's outcome."""
        put = self.put

        def emit(value: Any) -> None:
            try:
                here = trio.lowlevel.current_trio_token()
            except RuntimeError:
                here = None
            if here is token:
                put(value)
            else:
                try:
                    token.run_sync_soon(put, value)
                except trio.RunFinishedError:
                    log.debug("an output after the worker stopped was dropped")

        return emit


async def execute(
    task: wire.MatchTask,
    handler: StepDefinition | RpcDefinition,
    *,
    rid: int,
    conn: SdkConnection,
    cache: Any,
    runner: HandlerRunner,
    emit: Callable[[Any], None],
) -> wire.MatchMessage:
    """Run ``task``'s handler; return its outcome for stream ``rid``: M_RESULT (value packed
    through ``cache``, state patch) or M_FAILURE (a handler's exception; a non-retryable
    :class:`MatchingError` stays non-retryable; a retryable ``TimeoutError`` when the task's
    timeout passed, the handler cancelled). Cancellation propagates."""
    try:
        args: Any = task.args
        if cache is not None:
            args = await cache.unpack_async(args, functools.partial(_fetch, conn))
        state = task.state
        ctx: StepContext | RpcContext
        if task.kind == "step":
            ctx = StepContext(
                flow_id=task.flow_id,
                flow_type=task.flow_type,
                step=task.name,
                execution_id=task.execution_id,
                attempt=task.attempt,
                state=copy_state(state),
                deadline_in=task.timeout,
                blobs=cache,
                emit=emit,
            )
        else:
            ctx = RpcContext(
                flow_id=task.flow_id,
                flow_type=task.flow_type,
                rpc=task.name,
                state=copy_state(state),
                blobs=cache,
            )
        # The server gives up on the attempt at its deadline; cancelling here frees the slot
        # instead of running on for an outcome nobody will read. (A blocking handler in a
        # thread cannot be interrupted: its runner waits for it to return.)
        with trio.move_on_after(task.timeout if task.timeout is not None else float("inf")):
            value = await runner(handler.handler, ctx, list(args))
            if cache is not None:
                value = await cache.pack_async(value, functools.partial(_upload, conn))
            patch = state_patch(state, ctx.state)
            return wire.MatchResult(delivery=task.delivery, value=value, patch=patch, rid=rid)
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
    except Exception as exc:
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
