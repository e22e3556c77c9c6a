"""apps.dispatcher: a function-call dispatcher for agent and service loops.

Every promise of a tool's schema is kept in one place: argument validation (JSON Schema),
per-attempt timeouts that cancel the handler, classified retries (``timeout`` and
``transient`` only, a timeout only for idempotent tools) with jittered x4 backoff, a shared
retry budget per tool, idempotency keys (in-flight calls collapse into one run; its outcome is
kept in an ``otp.ets`` table with a TTL: successes, and a non-idempotent tool's failures, so a
late retry never runs it twice; see :func:`dispatch`), caller budgets, bounded fan-out,
per-tool circuit breakers, one error envelope (:class:`DispatchError`, with its JSON-RPC and
MCP forms), and a structured event for every transition (logger ``apps.dispatcher``) with
counters in :func:`statistics`.

The ``Dispatcher`` GenServer owns the state; its runner process runs keyed calls and remote
requests; both are children of the application's root supervisor (``rest_for_one``:
``dispatcher``, ``runner``). :func:`dispatch` runs calls in the caller's own task (no round trip
through a mailbox).

Example::

    import otp, supervisors
    from apps import dispatcher as d

    async def add(a: int, b: int) -> int:
        return a + b

    tools = [d.Tool("add", add, {"type": "object", "required": ["a", "b"],
                                 "properties": {"a": {"type": "integer"},
                                                "b": {"type": "integer"}}},
                    timeout=2.0, idempotent=True)]

    async def main() -> None:
        await supervisors.start_application(d.application(tools=tools))
        assert await d.dispatch("add", {"a": 1, "b": 2}) == 3
        try:
            await d.dispatch("add", {"a": "one", "b": 2})
        except d.DispatchError as error:
            assert error.kind == "schema" and error.jsonrpc_code == -32602
        calls = [("add", {"a": i, "b": i}) for i in range(40)]
        assert await d.gather_bounded(calls, limit=8) == [2 * i for i in range(40)]
        await supervisors.stop_application("dispatcher")

    otp.run(main)

Handlers are ``async def f(**args)``, plain functions (run in a worker thread; a timeout
abandons the thread, which cannot be killed) or a :class:`Backend` such as
:class:`GenServerBackend` (a GenServer on this or another node). A handler raises
:class:`TransientError` (optionally with ``retry_after``) for failures worth retrying; any
other exception is an ``internal`` error.
"""

from ._application import application as application
from ._breaker import BreakerState as BreakerState
from ._breaker import Budget as Budget
from ._config import DEFAULT_NAME as DEFAULT_NAME
from ._config import DispatcherConfig as DispatcherConfig
from ._dispatcher import dispatch as dispatch
from ._dispatcher import register_tool as register_tool
from ._dispatcher import statistics as statistics
from ._dispatcher import tool_registry as tool_registry
from ._dispatcher import unregister_tool as unregister_tool
from ._errors import JSONRPC_CODES as JSONRPC_CODES
from ._errors import MCP_UNKNOWN_TOOL_CODE as MCP_UNKNOWN_TOOL_CODE
from ._errors import BudgetExceeded as BudgetExceeded
from ._errors import CircuitOpen as CircuitOpen
from ._errors import ConfigurationError as ConfigurationError
from ._errors import DispatcherError as DispatcherError
from ._errors import DispatcherNotRunning as DispatcherNotRunning
from ._errors import DispatchError as DispatchError
from ._errors import DispatchTimeout as DispatchTimeout
from ._errors import ErrorKind as ErrorKind
from ._errors import IdempotencyConflict as IdempotencyConflict
from ._errors import InternalError as InternalError
from ._errors import InvalidArguments as InvalidArguments
from ._errors import InvalidOption as InvalidOption
from ._errors import ToolNotFound as ToolNotFound
from ._errors import TransientError as TransientError
from ._errors import TransientFailure as TransientFailure
from ._gather import Call as Call
from ._gather import Outcome as Outcome
from ._gather import gather_bounded as gather_bounded
from ._observer import observer_view as observer_view
from ._server import Dispatcher as Dispatcher
from ._server import dispatcher_supervisor_spec as dispatcher_supervisor_spec
from ._server import start_dispatcher as start_dispatcher
from ._state import DispatcherStatistics as DispatcherStatistics
from ._tool import NO_RETRY as NO_RETRY
from ._tool import Backend as Backend
from ._tool import BreakerPolicy as BreakerPolicy
from ._tool import GenServerBackend as GenServerBackend
from ._tool import RetryBudget as RetryBudget
from ._tool import RetryPolicy as RetryPolicy
from ._tool import Tool as Tool
from ._tool import ToolRegistry as ToolRegistry

__all__ = [
    "DEFAULT_NAME",
    "JSONRPC_CODES",
    "MCP_UNKNOWN_TOOL_CODE",
    "NO_RETRY",
    "Backend",
    "BreakerPolicy",
    "BreakerState",
    "Budget",
    "BudgetExceeded",
    "Call",
    "CircuitOpen",
    "ConfigurationError",
    "DispatchError",
    "DispatchTimeout",
    "Dispatcher",
    "DispatcherConfig",
    "DispatcherError",
    "DispatcherNotRunning",
    "DispatcherStatistics",
    "GenServerBackend",
    "ErrorKind",
    "IdempotencyConflict",
    "InternalError",
    "InvalidArguments",
    "InvalidOption",
    "Outcome",
    "RetryBudget",
    "RetryPolicy",
    "Tool",
    "ToolNotFound",
    "ToolRegistry",
    "TransientError",
    "TransientFailure",
    "application",
    "dispatch",
    "dispatcher_supervisor_spec",
    "gather_bounded",
    "observer_view",
    "register_tool",
    "start_dispatcher",
    "statistics",
    "tool_registry",
    "unregister_tool",
]


def _publish() -> None:
    # Public classes and functions say they come from ``apps.dispatcher``, not a private module.
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_publish()
del _publish
