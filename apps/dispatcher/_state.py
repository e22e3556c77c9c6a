"""A running dispatcher's state (:class:`_State`), shared by its GenServer, its runner and the
callers, and the table that finds it by pid, registered name or supervisor.

The GenServer owns the lifecycle and the state: the tool registry, the breakers, the retry
buckets, the counters, the in-flight idempotency map and the result cache (an ``otp.ets``
table with a time to live). ``dispatch`` does no round trip to it: all processes of a node share
one trio thread, so ``dispatch`` reads and updates that state in synchronous sections (as the
``ets`` functions do) and runs the handler in the caller's task under a cancel scope, sleeping
between retries on trio's clock (:mod:`._retry`, :mod:`._attempt`). What a call needs of its
tool is resolved once per registered tool (its :class:`~._lane.Lane`), and the dispatcher a call
names is remembered for the next call of the same trio run (:data:`FOUND`); a call that needs no
validation, slot, key or budget runs its first attempt inline in ``dispatch``. Calls with an
idempotency key run in a task of the dispatcher's *runner* process instead
(:mod:`._idempotency`), so that a caller's cancellation never strands the callers that joined
its run.
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

import otp
from otp import ets

from ._breaker import Budget, CircuitBreaker, TokenBucket
from ._config import DispatcherConfig
from ._errors import DispatcherNotRunning, DispatchError, ErrorKind
from ._idempotency import KeyedRun, keyed_call
from ._lane import Lane
from ._latency import Latency
from ._retry import budget_error, execute
from ._runner import Intake, Job
from ._tool import Tool, ToolRegistry
from ._validation import check_options, deeper_than, depth_error, schema_error, validation_timeout

logger = logging.getLogger("apps.dispatcher")


@attrs.frozen
class DispatcherStatistics:
    """A snapshot of a dispatcher (see :func:`statistics`).

    Attributes:
        counters: How many times each event happened (``dispatch.attempt``, ``dispatch.ok``,
            ``dispatch.retry``, ``dispatch.timeout``, ``dispatch.dedup_hit``, ``breaker.open``,
            ``dispatch.error.<kind>``, ...).
        running: Handler attempts running now.
        in_flight_keys: Idempotency keys whose run has not finished.
        cached_results: Results in the idempotency cache.
        breakers: Each tool's breaker state (``closed``, ``open``, ``half_open``) that has one.
        tools: The registered tools' names.
    """

    counters: Mapping[str, int]
    running: int
    in_flight_keys: int
    cached_results: int
    breakers: Mapping[str, str]
    tools: tuple[str, ...]


@attrs.define(eq=False)
class _State:
    """A running dispatcher's state, shared by its GenServer, its runner and the callers."""

    pid: otp.Pid
    name: str
    registry: ToolRegistry
    config: DispatcherConfig
    table: Any
    rng: random.Random
    limiter: trio.Semaphore | None
    #: The supervisor that started the dispatcher's server and runner (None if none did).
    owner: otp.Pid | None = None
    jobs: trio.MemorySendChannel[Job] = attrs.field(init=False)
    #: The receive side of ``jobs`` until a runner takes it.
    backlog: trio.MemoryReceiveChannel[Job] | None = attrs.field(init=False)
    #: Where a serving runner takes jobs directly (see ``serve``); else they go to ``jobs``.
    intake: Intake | None = None
    alive: bool = True
    #: Handler attempts running now on the general path (the fast path's: ``Lane.running``).
    running: int = 0
    counters: Counter[str] = attrs.Factory(Counter)
    #: The same events per registered tool, for observers (see ``count_for``).
    by_tool: dict[str, Counter[str]] = attrs.Factory(dict)
    keyed: dict[str, KeyedRun] = attrs.Factory(dict)
    breakers: dict[str, CircuitBreaker] = attrs.Factory(dict)
    buckets: dict[str, TokenBucket] = attrs.Factory(dict)
    tool_limiters: dict[str, tuple[int, trio.Semaphore]] = attrs.Factory(dict)
    #: How long each registered tool's calls took (from ``dispatch`` to result or error).
    latency: dict[str, Latency] = attrs.Factory(dict)
    lanes: dict[str, Lane] = attrs.Factory(dict)
    #: ``trio.current_time`` without its two calls in between: the run's clock's own method.
    now: Callable[[], float] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.jobs, self.backlog = trio.open_memory_channel[Job](math.inf)
        self.now = trio.lowlevel.current_clock().current_time

    # -- the runner ------------------------------------------------------------------------

    def take_jobs(self) -> trio.MemoryReceiveChannel[Job]:
        """The channel a (re)started runner serves: the first one takes the jobs queued since
        the server started; a restarted one gets a fresh channel (its predecessor closed its
        own)."""
        backlog, self.backlog = self.backlog, None
        if backlog is not None:
            return backlog
        self.jobs, receive = trio.open_memory_channel[Job](math.inf)
        return receive

    def serve(self, intake: Intake, serving: bool) -> None:
        """A runner takes jobs through ``intake`` from now on, or (not ``serving``) no
        longer does."""
        if serving:
            self.intake = intake if self.alive else None
        elif self.intake is intake:
            self.intake = None

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the runner; with no runner to take it (it is being restarted, the
        dispatcher stopped, or no supervisor started one: a ``Dispatcher`` started on its own)
        the job is abandoned at once, so no one waits for nothing."""
        if self.owner is None:
            job.abandon()
            return
        intake = self.intake
        if intake is not None:
            intake.start(job)
            return
        try:
            self.jobs.send_nowait(job)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            job.abandon()

    # -- events ----------------------------------------------------------------------------

    def event(self, name: str, level: int, tool: str, **fields: Any) -> None:
        """Count ``name`` and log it on ``apps.dispatcher`` with the fields in ``extra``."""
        self.counters[name] += 1
        self.count_for(tool, name)
        if logger.isEnabledFor(level):
            self.log(level, name, tool, **fields)

    def count_for(self, tool: str, name: str) -> None:
        """Count ``name`` for ``tool`` too, if it is registered: names callers make up must not
        grow the table."""
        counts = self.by_tool.get(tool)
        if counts is None:
            if self.registry.get(tool) is None:
                return
            counts = self.by_tool[tool] = Counter()
        counts[name] += 1

    def log(self, level: int, name: str, tool: str, **fields: Any) -> None:
        record = {"event": name, "dispatcher": self.name, "tool": tool, **fields}
        logger.log(level, "%s %s", name, record, extra={"dispatch_event": record})

    async def reject(self, error: DispatchError, tool: str) -> Any:
        """Fail a call before any handler ran: count it, yield once, raise ``error``."""
        self.event(f"dispatch.error.{error.kind}", logging.INFO, tool, message=error.message)
        await trio.lowlevel.cancel_shielded_checkpoint()
        raise error

    # -- per-tool state --------------------------------------------------------------------

    def breaker(self, tool: Tool) -> CircuitBreaker | None:
        policy = tool.breaker
        if policy is None:
            return None
        breaker = self.breakers.get(tool.name)
        if breaker is None or breaker.policy is not policy:
            breaker = self.breakers[tool.name] = CircuitBreaker(policy)
        return breaker

    def lane(self, name: str) -> Lane | None:
        """The lane of the tool registered as ``name`` (None if none is), resolved again
        when the registry has changed since. A name keeps its lane (and so the counts of its
        calls in flight) when its tool is replaced or removed."""
        registry = self.registry
        lane = self.lanes.get(name)
        if lane is not None and lane.version == registry.version:
            return lane
        tool = registry.get(name)
        if tool is None:
            return None
        if lane is None:
            latency = self.latency.get(name)
            if latency is None:
                latency = self.latency[name] = Latency()
            counts = self.by_tool.get(name)
            if counts is None:
                counts = self.by_tool[name] = Counter()
            lane = self.lanes[name] = Lane(tool, registry.version, latency, counts)
        lane.resolve(tool, registry.version, self.breaker(tool), self.limiter is not None)
        return lane

    def settle(self) -> None:
        """Bring the counters up to date with the fast path's (see :meth:`Lane.settle`)."""
        for lane in self.lanes.values():
            lane.settle(self.counters)

    def take_retry_token(self, tool: Tool, now: float) -> bool:
        policy = tool.retry.budget
        if policy is None:
            return True
        bucket = self.buckets.get(tool.name)
        if bucket is None or bucket.policy is not policy:
            bucket = self.buckets[tool.name] = TokenBucket.full(policy, now)
        return bucket.take(now)

    def tool_limiter(self, tool: Tool) -> trio.Semaphore | None:
        limit = tool.max_concurrency
        if limit is None:
            return None
        entry = self.tool_limiters.get(tool.name)
        if entry is None or entry[0] != limit:
            entry = self.tool_limiters[tool.name] = (limit, trio.Semaphore(limit))
        return entry[1]

    # -- the entry -------------------------------------------------------------------------

    async def dispatch(
        self,
        name: str,
        args: Mapping[str, Any] | None,
        key: str | None,
        timeout: float | None,
        budget: Budget | None,
    ) -> Any:
        if key is not None or timeout is not None or budget is not None:
            check_options(name, key, timeout, budget)
        tool = self.registry.get(name)
        if tool is None:
            known = ", ".join(map(repr, self.registry.names())) or "none"
            return await self.reject(
                DispatchError.make(
                    ErrorKind.NOT_FOUND,
                    f"no tool named {name!r} is registered with dispatcher {self.name!r} (known:"
                    f" {known}); register it with apps.dispatcher.register_tool(Tool(...))",
                    data={"tool": name},
                ),
                name,
            )
        began = self.now()
        try:
            if budget is not None and budget.exhausted(began):
                return await self.reject(budget_error(tool, budget, 0), name)
            if args is None:
                args = {}
            elif args.__class__ is not dict and not isinstance(args, Mapping):
                return await self.reject(
                    DispatchError.make(
                        ErrorKind.SCHEMA,
                        f"tool {name!r}: the arguments must be a JSON object (a dict), got"
                        f" {type(args).__name__}; pass them as a dict",
                        data={"tool": name, "errors": []},
                    ),
                    name,
                )
            if args and deeper_than(args, self.config.max_arg_depth):
                return await self.reject(depth_error(tool, self.config.max_arg_depth), name)
            spent = 0.0
            if not tool.accepts_any:
                error = schema_error(tool, args, self.config)
                if error is not None:
                    return await self.reject(error, name)
                # Validation is part of the call: it counts against the first attempt's timeout.
                spent = self.now() - began
                allowed = tool.timeout if timeout is None else timeout
                if spent and allowed is not None and spent >= allowed:
                    return await self.reject(validation_timeout(tool, spent), name)
            if key is None:
                first = began if not spent else None  # no time passed: spare a clock read
                return await execute(self, tool, args, timeout, budget, spent=spent, now=first)
            return await keyed_call(self, tool, args, key, timeout, budget, spent)
        finally:
            # Every call of a registered tool, whatever its end (an error, a cancellation).
            latency = self.latency.get(name)
            if latency is None:
                latency = self.latency[name] = Latency()
            latency.observe(self.now() - began)

    # -- lifecycle -------------------------------------------------------------------------

    def statistics(self) -> DispatcherStatistics:
        self.settle()
        now = trio.current_time()
        info = ets.info(self.table) if self.alive else None
        return DispatcherStatistics(
            counters=dict(self.counters),
            running=self.running + sum(lane.running() for lane in self.lanes.values()),
            in_flight_keys=len(self.keyed),
            cached_results=info.size if info is not None else 0,
            breakers={name: str(b.current(now)) for name, b in sorted(self.breakers.items())},
            tools=tuple(self.registry.names()),
        )

    def close(self) -> None:
        """The server died: the dispatcher is gone (its cache table went with the server)."""
        self.alive = False
        self.intake = None  # (a job submitted from now on is abandoned, as its channel is closed)
        states = _states()
        for key in (self.pid, self.name, self.owner):
            if key is not None and states.get(key) is self:
                del states[key]
        if FOUND[0][2] is self:
            FOUND[0] = _NOT_FOUND  # (nothing keeps the run's runner and this state alive)
        self.jobs.close()


# -- finding a dispatcher -------------------------------------------------------------------

_STATES: trio.lowlevel.RunVar[dict[otp.Pid | str, _State]] = trio.lowlevel.RunVar("apps_dispatcher")


def _states() -> dict[otp.Pid | str, _State]:
    try:
        return _STATES.get()
    except LookupError:
        states: dict[otp.Pid | str, _State] = {}
        _STATES.set(states)
        return states


#: Whether trio's tasks have the private fields its ``checkpoint_if_cancelled`` reads, which
#: :func:`dispatch` reads too, to check for cancellation without that coroutine's call (a trio
#: without them takes the general path).
TASK_FIELDS = all(
    hasattr(trio.lowlevel.Task, field) for field in ("_runner", "_cancel_status", "_cancel_points")
)

_NOT_FOUND: tuple[Any, Any, Any] = (None, object(), None)

#: The dispatcher :func:`dispatch` found last: ``(the trio run's runner, key, state)``. A call
#: in the same run with the same key object takes ``state`` from here instead of the
#: ``RunVar`` while ``state.alive`` (a live state keeps its keys: no other takes them). One
#: tuple, replaced whole, so that a run in another thread never reads half of another's entry.
FOUND: list[tuple[Any, Any, Any]] = [_NOT_FOUND]


def found(task: Any, dispatcher: str | otp.Pid) -> _State:
    """The dispatcher ``dispatcher`` (see :func:`_find`), remembered in :data:`FOUND` for the
    next call from ``task``'s run."""
    state = _find(dispatcher)
    if TASK_FIELDS:
        FOUND[0] = (task._runner, dispatcher, state)
    return state


def _find(dispatcher: str | otp.Pid) -> _State:
    # The table maps each running dispatcher's pid, registered name and supervisor to its state.
    try:
        state = _STATES.get().get(dispatcher)
    except LookupError:
        state = None
    if state is None or not state.alive:
        raise DispatcherNotRunning(
            f"no dispatcher runs as {dispatcher!r} on node {otp.current_node().name}: start the"
            " dispatcher application (apps.dispatcher:application) or a Dispatcher under a"
            " supervisor (apps.dispatcher.start_dispatcher)"
        )
    return state
