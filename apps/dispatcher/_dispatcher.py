"""The client functions of a running dispatcher: :func:`dispatch` (one call, run in the caller's
own task; see :mod:`._state` for why there is no round trip to the server), its statistics and
its tool registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

import otp

from ._breaker import Budget
from ._config import DEFAULT_NAME
from ._state import DispatcherStatistics, _find
from ._tool import Tool, ToolRegistry
from ._validation import timeout_of


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
    for none). ``timeout`` and
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
    await trio.lowlevel.checkpoint_if_cancelled()
    if timeout_ms is not None:
        timeout = timeout_of(name, timeout, timeout_ms)
    return await _find(dispatcher).dispatch(name, args, idempotency_key, timeout, budget)


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
