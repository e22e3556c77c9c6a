"""The client functions of a running dispatcher: :func:`dispatch` (one call, run in the caller's
own task; see :mod:`._state` for why there is no round trip to the server), its statistics and
its tool registry.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

import trio

import otp

from ._attempt import attempt_failed
from ._breaker import BreakerState, Budget
from ._config import DEFAULT_NAME
from ._deadline import TIMED_OUT, under_deadline
from ._latency import BOUNDS
from ._retry import execute
from ._state import FOUND, DispatcherStatistics, _find, found
from ._tool import Tool, ToolRegistry
from ._validation import check_options, deeper_than, timeout_of

logger = logging.getLogger("apps.dispatcher")
_DEBUG = logging.DEBUG
_CLOSED = BreakerState.CLOSED
_INF = math.inf
_current_task = trio.lowlevel.current_task
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_FIRST_BOUND = BOUNDS[0]

# Two answers dispatch needs on every call, read where their public functions read them (each
# function call costs about a handler's worth of a fast call): trio.lowlevel.current_task()
# is ``GLOBAL_RUN_CONTEXT.task``, and Logger.isEnabledFor answers from the logger's ``_cache``
# (which logging clears, never replaces, whenever a level changes) unless it is disabled. Where
# either is missing the public function answers.
_RUN_CONTEXT: Any = getattr(getattr(trio, "_core", None), "_run", None)
_RUN_CONTEXT = getattr(_RUN_CONTEXT, "GLOBAL_RUN_CONTEXT", None)
_LEVELS: dict[int, bool] = getattr(logger, "_cache", {})


async def dispatch(
    name: str,
    args: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    timeout: float | None = None,
    timeout_ms: float | None = None,
    budget: Budget | None = None,
    dispatcher: str | otp.Pid = DEFAULT_NAME,
) -> Any:
    """Call the tool ``name`` with ``args``; return its result or raise a :class:`DispatchError`.

    The arguments are validated against the tool's JSON Schema first. Each attempt runs the
    handler in the caller's task (a sync handler in a worker thread) under a cancel scope of
    ``timeout`` seconds, or ``timeout_ms`` milliseconds (the tool's by default; ``math.inf``
    for none). (On the fast path the scope is entered at the handler's first wait, with the
    deadline checked at each schedule point before it, see ``_deadline``: only
    ``trio.current_effective_deadline()`` read before that wait leaves the timeout out.)
    ``timeout`` and
    ``transient`` failures are retried by the tool's :class:`RetryPolicy` (a timeout only if
    the tool is idempotent), within the tool's shared retry budget and the caller's ``budget``.

    With ``idempotency_key``, calls with the same key in flight share one run (which runs in
    the dispatcher's runner process, not in the caller's task), and the run's outcome is kept
    for ``DispatcherConfig.result_ttl`` seconds; a later call with the key gets it without
    running the handler. The same key with other arguments fails with ``conflict``. What is
    kept, and so replayed:

    - a success, for every tool;
    - for a non-idempotent tool, every failure after its handler ran (``timeout``,
      ``transient``, ``internal``, ...), with ``data["replayed"]``. A timeout there is "outcome
      unknown" (``in_doubt``: the handler was cancelled halfway and may have taken effect), so a
      late retry gets that timeout, never a second run;
    - nothing else: an idempotent tool's failures, and failures before any handler ran
      (``schema``, ``not_found``, ``circuit_open``, a spent budget), let the next call with the
      key run.

    Cancellation: checked on entry. A call without a key is cancelled with the caller (the
    handler is cancelled; a sync handler's thread is abandoned and runs to its end). A keyed
    call's run goes on without the cancelled caller, for the callers that joined it and for
    the cache. The call yields to the scheduler whenever it waits (the handler, a retry delay,
    a shared run) and when it fails or hits the cache without running a handler; a handler that
    never yields gives it no schedule point of its own.

    Raises:
        DispatchError: the call failed (``kind`` says why; a subclass per kind);
            :class:`InvalidOption` (kind ``schema``) when an option itself is malformed.
        DispatcherNotRunning: no dispatcher runs as ``dispatcher``.
    """
    # The entry's cancellation check is trio's checkpoint_if_cancelled, inline when the
    # dispatcher was found in this run before (see _state.FOUND); a cancelled caller (or the
    # main task with a KeyboardInterrupt pending) takes trio's own, which raises.
    try:
        task = _RUN_CONTEXT.task
    except AttributeError:
        task = _current_task()  # (outside a trio run it raises trio's RuntimeError)
    runner, key, state = FOUND[0]
    if (
        key is dispatcher
        and runner is task._runner
        and state.alive
        and not task._cancel_status.effectively_cancelled
        and not (runner.ki_pending and task is runner.main_task)
    ):
        task._cancel_points += 1
    else:
        await _checkpoint_if_cancelled()
        state = found(task, dispatcher)
    if timeout_ms is not None:
        timeout = timeout_of(name, timeout, timeout_ms)
    if args is None:
        args = {}
    # The fast path (see _lane.Lane): the first attempt runs here, in this coroutine, and does
    # exactly what State.dispatch, execute and run_attempt do for it, minus what the tool's
    # lane says it does not need.
    lane = None
    if idempotency_key is None and budget is None and args.__class__ is dict:
        lane = state.lanes.get(name)
        if lane is None or lane.version != state.registry.version:
            lane = state.lane(name)
    if lane is None or not lane.fast or (args and deeper_than(args, state.config.max_arg_depth)):
        return await state.dispatch(name, args, idempotency_key, timeout, budget)
    tool = lane.tool
    breaker = lane.breaker
    if breaker is not None and breaker.state is not _CLOSED:
        return await state.dispatch(name, args, idempotency_key, timeout, budget)
    if timeout is None:
        timeout = tool.timeout
    else:
        check_options(name, None, timeout, None)
    now = state.now
    began = now()
    try:
        deadline = _INF if timeout is None else began + timeout
        lane.started += 1  # (running until lane.ok or lane.ended_otherwise counts it)
        debug = _LEVELS.get(_DEBUG)
        if debug is None or logger.disabled:
            debug = logger.isEnabledFor(_DEBUG)
        if debug:
            state.log(_DEBUG, "dispatch.attempt", name, attempt=1)
        failure: Exception | None = None
        result = None
        try:
            if deadline == _INF:
                # Nothing could cancel a scope without a deadline: the handler needs none.
                result = await tool.handler(**args)
            else:
                # Its cancel scope is entered at the handler's first wait (see _deadline).
                result = await under_deadline(tool.handler(**args), task, deadline, now)
        except Exception as exc:
            failure = exc
        except BaseException:
            lane.ended_otherwise += 1  # cancelled from outside
            raise
        caught = result is TIMED_OUT
        if failure is None and not caught:
            lane.ok += 1
            if debug:
                state.log(_DEBUG, "dispatch.ok", name, attempts=1)
            return result
        lane.ended_otherwise += 1
        failed = attempt_failed(
            state, tool, 1, None if caught else failure, True, timeout, breaker, False
        )
        return await execute(state, tool, args, timeout, None, failed=failed)
    finally:
        # Latency.observe, inline; a call shorter than the first bound (a tool that answers at
        # once, where this costs most in proportion) needs no bisection.
        elapsed = now() - began
        latency = lane.latency
        latency.counts[0 if elapsed <= _FIRST_BOUND else bisect_left(BOUNDS, elapsed)] += 1
        latency.sum += elapsed


def statistics(dispatcher: str | otp.Pid = DEFAULT_NAME) -> DispatcherStatistics:
    """A snapshot of the dispatcher's counters, breakers and caches."""
    return _find(dispatcher).statistics()


def register_tool(
    tool: Tool, *, replace: bool = False, dispatcher: str | otp.Pid = DEFAULT_NAME
) -> None:
    """Add ``tool`` to a running dispatcher's registry (see :meth:`ToolRegistry.register`)."""
    _find(dispatcher).registry.register(tool, replace=replace)


def unregister_tool(name: str, *, dispatcher: str | otp.Pid = DEFAULT_NAME) -> Tool | None:
    """Remove the tool ``name`` from a running dispatcher's registry; returns it or None."""
    return _find(dispatcher).registry.unregister(name)


def tool_registry(dispatcher: str | otp.Pid = DEFAULT_NAME) -> ToolRegistry:
    """The registry of a running dispatcher."""
    return _find(dispatcher).registry
