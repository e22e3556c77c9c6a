"""The ``Dispatcher``: a GenServer that owns the state of tool calls, and ``dispatch``, which runs
the calls in the callers' own tasks.

The GenServer owns the lifecycle and the state: the tool registry, the breakers, the retry
buckets, the counters, the in-flight idempotency map and the result cache (an ``otp.ets``
table with a time to live). ``dispatch`` does no round trip to it: all processes of a node share
one trio thread, so ``dispatch`` reads and updates that state in synchronous sections (as the
``ets`` functions do) and runs the handler in the caller's task under a cancel scope, sleeping
between retries on trio's clock. Calls with an idempotency key run in a task of the
dispatcher's *runner* process instead, so that a caller's cancellation never strands the callers
that joined its run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, overload

import attrs
import jsonschema.exceptions  # type: ignore[import-untyped]
import referencing.exceptions
import trio

import otp
from otp import ets

from . import _pattern
from ._breaker import BreakerState, Budget, CircuitBreaker, TokenBucket
from ._errors import (
    ConfigurationError,
    DispatcherNotRunning,
    DispatchError,
    ErrorKind,
    InvalidOption,
    TransientError,
)
from ._tool import ASYNC, SYNC, RetryPolicy, Tool, ToolRegistry, _RemoteTimeout

logger = logging.getLogger("apps.dispatcher")

#: The name the dispatcher registers under unless configured otherwise.
DEFAULT_NAME = "dispatcher"

_COUNTED = frozenset((ErrorKind.TIMEOUT, ErrorKind.TRANSIENT, ErrorKind.INTERNAL))
_DEBUG, _INFO, _WARNING = logging.DEBUG, logging.INFO, logging.WARNING
_SCHEMA_ERRORS_SHOWN = 10


def _check_ttl(_cfg: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not value > 0
        or value == math.inf
    ):
        raise ConfigurationError(
            f"DispatcherConfig.{attr.name} must be a number of seconds > 0 (got {value!r})"
        )


def _check_limit(_cfg: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (value.__class__ is not int or value < 1):
        raise ConfigurationError(
            f"DispatcherConfig.{attr.name} must be an int >= 1 or None (got {value!r})"
        )


#: ``DispatcherConfig.max_arg_depth`` unless configured: far deeper than tool arguments go
#: (serde_json stops at 128), and shallow enough that jsonschema's recursion (3 to 4 frames a
#: level, more under combinators) stays far from Python's limit of 1,000 frames.
DEFAULT_MAX_ARG_DEPTH = 64
_DEPTH_CEILING = 200


def _check_depth(_cfg: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value.__class__ is not int or not 1 <= value <= _DEPTH_CEILING:
        raise ConfigurationError(
            f"DispatcherConfig.{attr.name} must be an int from 1 to {_DEPTH_CEILING} (deeper"
            f" arguments would exhaust Python's stack in validation), got {value!r}"
        )


#: A schema error's message quotes the value (jsonschema's repr): at most this many characters.
_MESSAGE_CHARS = 300


def _clip(text: str) -> str:
    if len(text) <= _MESSAGE_CHARS:
        return text
    # The head quotes the value, the tail usually says what it failed (jsonschema's form).
    half = _MESSAGE_CHARS // 2
    return f"{text[:half]}...[{len(text) - 2 * half:,} characters]...{text[-half:]}"


def _check_steps(_cfg: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value.__class__ is not int or value < 1:
        raise ConfigurationError(
            f"DispatcherConfig.{attr.name} must be an int >= 1 (got {value!r})"
        )


def _deeper_than(args: Mapping[str, Any], limit: int) -> bool:
    """Whether ``args`` nests dicts, lists or tuples more than ``limit`` deep. Level by level
    and without recursion, so it measures any depth (a cycle too) safely, and it stops at the
    first level past the limit."""
    level: list[Any] = [args]
    depth = 1
    while level:
        if depth > limit:
            return True
        below = []
        for node in level:
            for value in node.values() if isinstance(node, Mapping) else node:
                if isinstance(value, Mapping | list | tuple):
                    below.append(value)
        level = below
        depth += 1
    return False


def _check_name(_cfg: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"DispatcherConfig.name must be a non-empty str (got {value!r})")


@attrs.frozen
class DispatcherConfig:
    """How a dispatcher runs.

    Args:
        name: The name it registers under (what ``dispatch(..., dispatcher=)`` names).
        result_ttl: Seconds a completed result stays in the idempotency cache.
        max_concurrency: At most this many handler attempts run at once across every tool and
            caller (None: no dispatcher-wide limit). Callers past it wait their turn.
        seed: Seeds the jitter of retry delays (None: from the OS), for reproducible runs.
        max_arg_depth: Arguments that nest dicts and lists deeper than this (the arguments
            object itself is depth 1) are refused with a ``schema`` error before anything
            reads them, so that validation and key digests never exhaust Python's stack.
        max_pattern_steps: The steps one call's schema patterns may take in all (they match
            in linear time: at most the string's length times the pattern's states); past it
            the call is refused with a ``schema`` error. Bounds how long a call's validation
            can hold the event loop.
    """

    name: str = attrs.field(default=DEFAULT_NAME, validator=_check_name)
    result_ttl: float = attrs.field(default=60.0, validator=_check_ttl)
    max_concurrency: int | None = attrs.field(default=None, validator=_check_limit)
    seed: int | None = None
    max_arg_depth: int = attrs.field(default=DEFAULT_MAX_ARG_DEPTH, validator=_check_depth)
    max_pattern_steps: int = attrs.field(default=_pattern.DEFAULT_MAX_STEPS, validator=_check_steps)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> DispatcherConfig:
        """Build from a node.toml ``[dispatcher]`` table; unknown keys are an error.

        Raises:
            ConfigurationError: a key is unknown or a value invalid.
        """
        known = {field.name for field in attrs.fields(cls)}
        unknown = sorted(set(settings) - known - {"tools"})
        if unknown:
            raise ConfigurationError(
                f"[dispatcher] settings: unknown keys {unknown} (known: {sorted(known)} and"
                " 'tools')"
            )
        return cls(**{key: value for key, value in settings.items() if key in known})


@attrs.frozen
class Call:
    """One call for :func:`gather_bounded` (a ``(name, args)`` tuple works too); ``timeout``
    in seconds or ``timeout_ms`` (as the seed's registry records it), as for :func:`dispatch`."""

    name: str
    args: Mapping[str, Any] = attrs.field(factory=dict)
    idempotency_key: str | None = None
    timeout: float | None = None
    timeout_ms: float | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Outcome:
    """The end of one call of :func:`gather_bounded`: a ``value`` or a :class:`DispatchError`."""

    value: Any = None
    error: DispatchError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """The value, or the error raised."""
        if self.error is not None:
            raise self.error
        return self.value


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
class _Run:
    """One run shared by every caller of an idempotency key while it is in flight."""

    fingerprint: str
    done: trio.Event = attrs.Factory(trio.Event)
    value: Any = None
    error: DispatchError | None = None
    #: Whether a handler attempt has begun (a run cut short after that may have taken effect).
    started: bool = False


def _fingerprint(tool: str, args: Mapping[str, Any]) -> str | None:
    """A digest of the call, or None when its arguments are not JSON (say, a dict with keys
    of mixed types, which ``sort_keys`` cannot order)."""
    try:
        text = json.dumps([tool, args], sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        return None
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _retry_delay(retry_after: Any, policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """The wait before ``attempt``: the handler's ``retry_after`` clamped to
    ``[0, max_retry_after]`` (a negative one, say a Retry-After date already past, means at
    once), or the policy's delay when the handler gave none or not a number (NaN)."""
    if (
        retry_after is None
        or not isinstance(retry_after, int | float)
        or isinstance(retry_after, bool)
        or math.isnan(retry_after)
    ):
        return policy.delay(attempt, rng)
    return min(max(0.0, float(retry_after)), policy.max_retry_after)


def _invalid_option(name: Any, message: str) -> InvalidOption:
    return InvalidOption(f"dispatch({name!r}): {message}", data={"tool": name, "errors": []})


def _check_options(name: Any, key: Any, timeout: Any, budget: Any) -> None:
    """Refuse a call's malformed options before anything runs.

    Raises:
        InvalidOption: ``key``, ``timeout`` or ``budget`` is malformed.
    """
    if key is not None and (not isinstance(key, str) or not key):
        raise _invalid_option(
            name, f"idempotency_key must be a non-empty str or None (got {key!r})"
        )
    if timeout is not None and (
        not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0
    ):
        raise _invalid_option(
            name,
            "timeout must be a number of seconds > 0 (math.inf for no limit, None for the"
            f" tool's own), got {timeout!r}",
        )
    if budget is not None and not isinstance(budget, Budget):
        raise _invalid_option(
            name,
            "budget must be an apps.dispatcher.Budget (say Budget(calls=5) for five tool"
            f" calls, or Budget.within(seconds)) or None, got {budget!r}",
        )


def _timeout_of(name: Any, timeout: Any, timeout_ms: Any) -> Any:
    """The call's timeout in seconds, from ``timeout`` (seconds) or ``timeout_ms`` (the seed's
    milliseconds), not both.

    Raises:
        InvalidOption: both are given, or ``timeout_ms`` is not a number > 0.
    """
    if timeout_ms is None:
        return timeout
    if timeout is not None:
        raise _invalid_option(
            name,
            f"give timeout (seconds) or timeout_ms, not both (got {timeout!r} and {timeout_ms!r})",
        )
    if (
        not isinstance(timeout_ms, int | float)
        or isinstance(timeout_ms, bool)
        or not timeout_ms > 0
    ):
        raise _invalid_option(
            name,
            f"timeout_ms must be a number of milliseconds > 0 (math.inf for no limit), got"
            f" {timeout_ms!r}",
        )
    return timeout_ms / 1000.0


def _kept(tool: Tool, error: DispatchError) -> bool:
    """Whether a keyed run's failure is kept and replayed to later calls with its key: a
    non-idempotent tool's, once its handler ran (it may have taken effect; running it again
    could do it twice). An idempotent tool's failures, and failures before any attempt
    (an open breaker, a spent budget), are not kept: the next call with the key runs."""
    return not tool.idempotent and error.attempts > 0


def _replayed(error: DispatchError, key: str) -> DispatchError:
    """The kept failure ``error`` as a later call with its key gets it."""
    copy = DispatchError.make(
        error.kind,
        f"{error.message} [replayed: the call with idempotency key {key!r} already ran and"
        " ended so; its handler was not run again (a new call needs a new key)]",
        attempts=error.attempts,
        data={**error.data, "idempotency_key": key, "replayed": True},
    )
    copy.__cause__ = error.__cause__
    return copy


def _copy(error: DispatchError) -> DispatchError:
    """A fresh envelope equal to ``error`` (an exception object is raised in one task only)."""
    copy = DispatchError.make(error.kind, error.message, attempts=error.attempts, data=error.data)
    copy.__cause__ = error.__cause__
    return copy


def _in_doubt(tool: Tool) -> dict[str, bool]:
    """The envelope's ``in_doubt`` flag for a handler cancelled halfway: only a non-idempotent
    tool's outcome matters (an idempotent one can simply run again)."""
    return {} if tool.idempotent else {"in_doubt": True}


def _doubt(tool: Tool) -> str:
    if tool.idempotent:
        return ""
    return "; its outcome is unknown (the tool is not idempotent and may have taken effect)"


async def _acquire(semaphore: trio.Semaphore) -> None:
    try:
        semaphore.acquire_nowait()
    except trio.WouldBlock:
        await semaphore.acquire()


def _fmt(seconds: float) -> str:
    return f"{seconds:.3g} s"


class _Spending(Protocol):
    """What a run spends: a caller's :class:`Budget`, or :class:`_CallsOf` one."""

    @property
    def calls(self) -> int | None: ...

    @property
    def deadline(self) -> float | None: ...

    def exhausted(self, now: float) -> bool: ...

    def spend(self) -> None: ...

    def limit(self) -> float: ...


@attrs.frozen
class _CallsOf:
    """A caller's budget as a keyed run spends it: its calls, not its deadline (the run serves
    every caller of the key, and each of them waits by its own deadline)."""

    owner: Budget

    @property
    def calls(self) -> int | None:
        return self.owner.calls

    @property
    def deadline(self) -> float | None:
        return None

    def exhausted(self, now: float) -> bool:
        calls = self.owner.calls
        return calls is not None and calls <= 0

    def spend(self) -> None:
        self.owner.spend()

    def limit(self) -> float:
        return math.inf


@attrs.define(eq=False)
class _Slots:
    """The concurrency slots one attempt holds.

    A sync handler's thread cannot be killed: when a timeout abandons it, it keeps running and
    so keeps its slots, released from the thread when it ends. A thread that had not started
    when its attempt ended does not run the handler at all.
    """

    held: list[trio.Semaphore] = attrs.Factory(list)
    lock: threading.Lock = attrs.Factory(threading.Lock)
    token: trio.lowlevel.TrioToken | None = None
    running: bool = False
    ended: bool = False

    def release(self) -> None:
        for semaphore in self.held:
            semaphore.release()
        self.held.clear()

    def in_thread(self, handler: Callable[[], Any]) -> Callable[[], Any]:
        self.token = trio.lowlevel.current_trio_token()

        def run() -> Any:
            with self.lock:
                if self.ended:
                    return None  # the attempt ended before the thread started
                self.running = True
            try:
                return handler()
            finally:
                with self.lock:
                    self.running = False
                    release = self.ended
                if release:
                    try:
                        self.token.run_sync_soon(self.release)
                    except trio.RunFinishedError:
                        pass

        return run

    def let_go(self) -> None:
        """The attempt ends: release the slots, unless its thread still runs."""
        with self.lock:
            self.ended = True
            if self.running:
                return
        self.release()


@attrs.frozen
class Job:
    """Work for the dispatcher's runner: ``run`` in its nursery, or ``abandon`` (synchronous)
    if no runner will take it, so that whoever waits for it is answered."""

    run: Callable[[], Awaitable[None]]
    abandon: Callable[[], None]


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
    alive: bool = True
    running: int = 0
    counters: Counter[str] = attrs.Factory(Counter)
    #: The same events per registered tool, for observers (see ``count_for``).
    by_tool: dict[str, Counter[str]] = attrs.Factory(dict)
    keyed: dict[str, _Run] = attrs.Factory(dict)
    breakers: dict[str, CircuitBreaker] = attrs.Factory(dict)
    buckets: dict[str, TokenBucket] = attrs.Factory(dict)
    tool_limiters: dict[str, tuple[int, trio.Semaphore]] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        self.jobs, self.backlog = trio.open_memory_channel[Job](math.inf)

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

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the runner; with no runner to take it (it is being restarted, the
        dispatcher stopped, or no supervisor started one: a ``Dispatcher`` started on its own)
        the job is abandoned at once, so no one waits for nothing."""
        if self.owner is None:
            job.abandon()
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
        self.event(f"dispatch.error.{error.kind}", _INFO, tool, message=error.message)
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
        _check_options(name, key, timeout, budget)
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
        if budget is not None and budget.exhausted(trio.current_time()):
            return await self.reject(self.budget_error(tool, budget, 0), name)
        if args is None:
            args = {}
        elif not isinstance(args, Mapping):
            return await self.reject(
                DispatchError.make(
                    ErrorKind.SCHEMA,
                    f"tool {name!r}: the arguments must be a JSON object (a dict), got"
                    f" {type(args).__name__}; pass them as a dict",
                    data={"tool": name, "errors": []},
                ),
                name,
            )
        if args and _deeper_than(args, self.config.max_arg_depth):
            return await self.reject(self.depth_error(tool), name)
        spent = 0.0
        if not tool.accepts_any:
            began = trio.current_time()
            error = self.schema_error(tool, args)
            if error is not None:
                return await self.reject(error, name)
            # Validation is part of the call: it counts against the first attempt's timeout.
            spent = trio.current_time() - began
            allowed = tool.timeout if timeout is None else timeout
            if spent and allowed is not None and spent >= allowed:
                return await self.reject(self.validation_timeout(tool, spent), name)
        if key is None:
            return await self.execute(tool, args, timeout, budget, spent=spent)
        return await self.keyed_call(tool, args, key, timeout, budget, spent)

    def validation_timeout(self, tool: Tool, spent: float) -> DispatchError:
        return DispatchError.make(
            ErrorKind.TIMEOUT,
            f"tool {tool.name!r} was not run: validating its arguments took {_fmt(spent)}, the"
            " call's whole timeout (send smaller arguments, or give the call more time)",
            data={"tool": tool.name, "validation": spent},
        )

    def depth_error(self, tool: Tool) -> DispatchError:
        limit = self.config.max_arg_depth
        return DispatchError.make(
            ErrorKind.SCHEMA,
            f"tool {tool.name!r}: the arguments nest dicts and lists deeper than the limit"
            f" max_arg_depth={limit} (DispatcherConfig.max_arg_depth); flatten them (say,"
            " pass a deep structure as one JSON string) or raise the limit",
            data={"tool": tool.name, "errors": [], "limit": {"max_arg_depth": limit}},
        )

    def schema_error(self, tool: Tool, args: Mapping[str, Any]) -> DispatchError | None:
        limit = self.config.max_pattern_steps
        meter = _pattern.METER.set(_pattern.Meter(limit))
        try:
            errors = list(tool.validator.iter_errors(args))
        except _pattern.PatternWorkExceeded:
            return DispatchError.make(
                ErrorKind.SCHEMA,
                f"tool {tool.name!r}: checking the arguments against the schema's patterns took"
                f" more than the limit max_pattern_steps={limit}"
                " (DispatcherConfig.max_pattern_steps); send shorter strings, or raise the limit",
                data={"tool": tool.name, "errors": [], "limit": {"max_pattern_steps": limit}},
            )
        except _pattern.PatternError as exc:
            return DispatchError.make(
                ErrorKind.INTERNAL,
                f"tool {tool.name!r}: its schema reaches a pattern that cannot be matched: {exc}",
                data={"tool": tool.name},
            )
        except RecursionError:
            # Within max_arg_depth, but the schema recurses more per level than it allows for.
            return self.depth_error(tool)
        except referencing.exceptions.Unresolvable as exc:
            return DispatchError.make(
                ErrorKind.INTERNAL,
                f"tool {tool.name!r}: its schema has a $ref that does not resolve ({exc}); fix"
                " the tool's schema",
                data={"tool": tool.name},
            )
        finally:
            _pattern.METER.reset(meter)
        if not errors:
            return None
        best = jsonschema.exceptions.best_match(errors)
        where = "/" + "/".join(map(str, best.absolute_path))
        return DispatchError.make(
            ErrorKind.SCHEMA,
            f"tool {tool.name!r}: the arguments do not match its schema: {_clip(best.message)} (at"
            f" {where}); fix the arguments and call again (schema errors are never retried)",
            data={
                "tool": tool.name,
                "errors": [
                    {
                        "path": "/" + "/".join(map(str, e.absolute_path)),
                        "message": _clip(e.message),
                        "keyword": str(e.validator),
                    }
                    for e in errors[:_SCHEMA_ERRORS_SHOWN]
                ],
            },
        )

    def budget_error(self, tool: Tool, budget: _Spending, attempts: int) -> DispatchError:
        if budget.calls is not None and budget.calls <= 0:
            why = "it has no tool calls left"
        else:
            why = f"its deadline ({budget.deadline}) has passed"
        return DispatchError.make(
            ErrorKind.BUDGET_EXCEEDED,
            f"tool {tool.name!r} was not called: the caller's budget is spent ({why}); give"
            " the caller a larger budget or stop calling",
            attempts=attempts,
            data={"tool": tool.name, "calls": budget.calls, "deadline": budget.deadline},
        )

    # -- attempts and retries --------------------------------------------------------------

    async def execute(
        self,
        tool: Tool,
        args: Mapping[str, Any],
        timeout: float | None,
        budget: _Spending | None,
        run: _Run | None = None,
        spent: float = 0.0,
    ) -> Any:
        """Run ``tool`` with retries in the current task; return its result or raise the
        envelope of its last failure. ``run`` (a keyed call's) learns when an attempt begins."""
        name = tool.name
        policy = tool.retry
        if timeout is None:
            timeout = tool.timeout
        limit = budget.limit() if budget is not None else math.inf
        breaker = self.breaker(tool)
        attempt = 0
        last: DispatchError | None = None
        while True:
            attempt += 1
            now = trio.current_time()
            probe = False
            if breaker is not None and breaker.state is not BreakerState.CLOSED:
                was = breaker.state
                admitted, probe = breaker.admit(now)
                if was is BreakerState.OPEN and breaker.state is BreakerState.HALF_OPEN:
                    self.event("breaker.half_open", _INFO, name)
                if not admitted:
                    self.event("breaker.reject", _DEBUG, name)
                    return await self.reject(self.circuit_error(tool, breaker, now, attempt), name)
            if budget is not None:
                if budget.exhausted(now):
                    if breaker is not None:
                        breaker.release(probe)
                    return await self.reject(
                        last or self.budget_error(tool, budget, attempt - 1), name
                    )
                budget.spend()
            if run is not None:
                run.started = True
            result, error, retry_after = await self.attempt(
                tool, args, attempt, now, timeout, limit, breaker, probe, spent
            )
            spent = 0.0
            if error is None:
                return result
            last = error
            verdict = self.retry_verdict(tool, error, attempt, budget)
            if verdict is None:
                now = trio.current_time()
                delay = _retry_delay(retry_after, policy, attempt + 1, self.rng)
                if now + delay >= limit:
                    verdict = "the caller's deadline would pass before the next attempt"
                elif not self.take_retry_token(tool, now):
                    verdict = "the tool's shared retry budget is spent (too many retries lately)"
                    self.event("dispatch.retry_denied", _WARNING, name, attempts=attempt)
                else:
                    self.event(
                        "dispatch.retry",
                        _INFO,
                        name,
                        attempt=attempt + 1,
                        delay=delay,
                        kind=str(error.kind),
                    )
                    await trio.sleep(delay)
                    continue
            error.message = f"{error.message}; not retried: {verdict}"
            error.args = (error.message,)
            self.event(f"dispatch.error.{error.kind}", _INFO, name, attempts=attempt)
            raise error

    def retry_verdict(
        self, tool: Tool, error: DispatchError, attempt: int, budget: _Spending | None
    ) -> str | None:
        """Why ``error`` is final, or None if the call may be retried."""
        kind = error.kind
        if kind is ErrorKind.TIMEOUT and not tool.idempotent:
            return "the tool is not idempotent and the attempt may have committed"
        if not tool.retry.retryable(kind, tool.idempotent):
            return f"{kind} errors are not retried"
        if attempt >= tool.retry.max_attempts:
            return f"gave up after {attempt} attempt{'s' if attempt > 1 else ''}"
        if budget is not None and budget.calls is not None and budget.calls <= 0:
            return "the caller's budget has no tool calls left"
        return None

    def circuit_error(
        self, tool: Tool, breaker: CircuitBreaker, now: float, attempt: int
    ) -> DispatchError:
        policy = breaker.policy
        if breaker.state is BreakerState.OPEN:
            wait = breaker.opened_at + policy.cooldown - now
            why = (
                f"its circuit breaker opened after {policy.failures} failures within"
                f" {_fmt(policy.window)}; it lets a probe call through in {_fmt(wait)}"
            )
        else:
            why = "its circuit breaker is half-open and its one probe call is running"
        return DispatchError.make(
            ErrorKind.CIRCUIT_OPEN,
            f"tool {tool.name!r} is failing fast: {why}; call again later",
            attempts=attempt - 1,
            data={"tool": tool.name, "breaker": str(breaker.state)},
        )

    async def attempt(
        self,
        tool: Tool,
        args: Mapping[str, Any],
        attempt: int,
        now: float,
        timeout: float | None,
        limit: float,
        breaker: CircuitBreaker | None,
        probe: bool,
        spent: float = 0.0,
    ) -> tuple[Any, DispatchError | None, float | None]:
        """One run of the handler under the concurrency limits and a cancel scope:
        ``(result, error, retry_after)``. Records the verdict on the breaker."""
        name = tool.name
        counters = self.counters
        result: Any = None
        error: DispatchError | None = None
        retry_after: float | None = None
        finished = False
        tool_limiter = None if tool.max_concurrency is None else self.tool_limiter(tool)
        limiter = self.limiter
        limited = tool_limiter is not None or limiter is not None
        slots = _Slots() if limited or tool.mode is SYNC else None
        try:
            if slots is not None and limited:
                # The tool's own slot first: a call queued behind its tool must not hold one of
                # the dispatcher's slots, which other tools need. The caller's deadline bounds
                # the wait.
                with trio.move_on_at(limit):
                    for semaphore in (tool_limiter, limiter):
                        if semaphore is not None:
                            await _acquire(semaphore)
                            slots.held.append(semaphore)
                if len(slots.held) < (tool_limiter is not None) + (limiter is not None):
                    if breaker is not None:
                        breaker.release(probe)
                    finished = True
                    return None, self.slot_deadline_error(tool, attempt), None
                now = trio.current_time()
            deadline = now + timeout - spent if timeout is not None else math.inf
            scope = trio.CancelScope(deadline=deadline if deadline < limit else limit)
            self.running += 1
            counters["dispatch.attempt"] += 1
            self.count_for(name, "dispatch.attempt")
            if logger.isEnabledFor(_DEBUG):
                self.log(_DEBUG, "dispatch.attempt", name, attempt=attempt)
            try:
                with scope:
                    mode = tool.mode
                    if mode is ASYNC:
                        result = await tool.handler(**args)
                    elif slots is not None and mode is SYNC:
                        result = await trio.to_thread.run_sync(
                            slots.in_thread(functools.partial(tool.handler, **args)),
                            abandon_on_cancel=True,
                        )
                    else:
                        result = await tool.handler.invoke(tool, args)
            except TransientError as exc:
                error = DispatchError.make(
                    ErrorKind.TRANSIENT,
                    f"tool {name!r} failed transiently on attempt {attempt}: {exc}",
                    attempts=attempt,
                    data={"tool": name, **exc.data},
                )
                error.__cause__ = exc
                retry_after = exc.retry_after
            except _RemoteTimeout as exc:
                error = self.timeout_error(tool, attempt, timeout, remote=str(exc))
                error.__cause__ = exc
            except Exception as exc:
                error = DispatchError.make(
                    ErrorKind.INTERNAL,
                    f"tool {name!r} raised {type(exc).__name__}: {exc} (a bug in the handler"
                    " or an unexpected failure; the cause is chained; a handler raises"
                    " apps.dispatcher.TransientError for failures worth retrying)",
                    attempts=attempt,
                    data={"tool": name, "exception": type(exc).__name__},
                )
                error.__cause__ = exc
            finally:
                self.running -= 1
            if scope.cancelled_caught:
                if deadline <= limit:
                    self.event("dispatch.timeout", _WARNING, name, attempt=attempt, timeout=timeout)
                    error = self.timeout_error(tool, attempt, timeout)
                else:
                    error = self.deadline_error(tool, attempt)
            finished = True
        finally:
            if slots is not None:
                slots.let_go()
            if not finished and breaker is not None:
                breaker.release(probe)  # cancelled from outside: no verdict on the tool
        if error is None:
            counters["dispatch.ok"] += 1
            self.count_for(name, "dispatch.ok")
            if logger.isEnabledFor(_DEBUG):
                self.log(_DEBUG, "dispatch.ok", name, attempts=attempt)
            if breaker is not None and probe and breaker.success(probe):
                self.event("breaker.close", _INFO, name)
            return result, None, None
        if breaker is not None:
            if error.kind in _COUNTED:
                if breaker.failure(trio.current_time(), probe):
                    self.event("breaker.open", _WARNING, name, cooldown=breaker.policy.cooldown)
            else:
                breaker.release(probe)
        return None, error, retry_after

    def timeout_error(
        self, tool: Tool, attempt: int, timeout: float | None, remote: str | None = None
    ) -> DispatchError:
        where = f" where it ran ({remote})" if remote else f" within {_fmt(timeout or 0.0)}"
        return DispatchError.make(
            ErrorKind.TIMEOUT,
            f"tool {tool.name!r} did not answer{where} on attempt {attempt} and was cancelled"
            f"{_doubt(tool)} (raise Tool.timeout or pass dispatch(timeout=...) if it is just"
            " slow)",
            attempts=attempt,
            data={"tool": tool.name, "timeout": timeout, **_in_doubt(tool)},
        )

    def slot_deadline_error(self, tool: Tool, attempt: int) -> DispatchError:
        return DispatchError.make(
            ErrorKind.BUDGET_EXCEEDED,
            f"tool {tool.name!r} was not run (attempt {attempt}): the caller's budget deadline"
            " passed while the call waited for a concurrency slot (the dispatcher's or the"
            " tool's max_concurrency); give the caller more time or allow more concurrency",
            attempts=attempt - 1,
            data={"tool": tool.name},
        )

    def deadline_error(self, tool: Tool, attempt: int) -> DispatchError:
        return DispatchError.make(
            ErrorKind.BUDGET_EXCEEDED,
            f"tool {tool.name!r} was cancelled on attempt {attempt}: the caller's budget"
            f" deadline passed while it ran{_doubt(tool)}; give the caller more time",
            attempts=attempt,
            data={"tool": tool.name, **_in_doubt(tool)},
        )

    # -- idempotency -----------------------------------------------------------------------

    async def keyed_call(
        self,
        tool: Tool,
        args: Mapping[str, Any],
        key: str,
        timeout: float | None,
        budget: Budget | None,
        spent: float = 0.0,
    ) -> Any:
        fingerprint = _fingerprint(tool.name, args)
        if fingerprint is None:
            return await self.reject(
                DispatchError.make(
                    ErrorKind.SCHEMA,
                    f"tool {tool.name!r}: a call with an idempotency key needs JSON arguments"
                    " (their digest tells a repeat from a conflict); these cannot be serialised"
                    " (mixed-type dict keys?)",
                    data={"tool": tool.name, "errors": []},
                ),
                tool.name,
            )
        try:
            cached = ets.lookup(self.table, key)
        except ets.EtsError:
            cached = []  # the dispatcher stopped: its table is gone
        if cached:
            _key, stored, value, failure = cached[0]
            if stored != fingerprint:
                return await self.reject(self.conflict_error(tool, key), tool.name)
            self.event("dispatch.dedup_hit", _DEBUG, tool.name, key=key, source="cache")
            if failure is not None:
                return await self.reject(_replayed(failure, key), tool.name)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return value
        run = self.keyed.get(key)
        if run is not None:
            if run.fingerprint != fingerprint:
                return await self.reject(self.conflict_error(tool, key), tool.name)
            self.event("dispatch.dedup_hit", _DEBUG, tool.name, key=key, source="in_flight")
        else:
            if not self.alive:
                raise DispatcherNotRunning(
                    f"dispatcher {self.name!r} stopped; start it again to dispatch calls"
                )
            run = self.keyed[key] = _Run(fingerprint)
            # The run serves every caller of the key: it spends the first caller's calls, but
            # its deadline is no one's (each caller waits by its own, below).
            shared = None if budget is None or budget.calls is None else _CallsOf(budget)
            self.submit(
                Job(
                    functools.partial(self.run_keyed, run, tool, args, key, timeout, shared, spent),
                    functools.partial(self.abandon_run, run, tool, key),
                )
            )
        return await self.wait_run(run, tool, key, budget, timeout)

    def abandon_run(self, run: _Run, tool: Tool, key: str) -> None:
        """Fail a keyed run that never started (no runner took it): its waiters get an
        ``internal`` error, the next call with the key runs."""
        if self.owner is None:
            why = (
                f"dispatcher {self.name!r} has no runner (its Dispatcher was started on its own):"
                f" the call with idempotency key {key!r} was not run; start the dispatcher with"
                " start_dispatcher or the dispatcher application"
            )
        else:
            why = (
                f"the runner of dispatcher {self.name!r} stopped before the call with"
                f" idempotency key {key!r} started (it was not run); call again"
            )
        run.error = DispatchError.make(
            ErrorKind.INTERNAL,
            f"tool {tool.name!r}: {why}",
            data={"tool": tool.name, "idempotency_key": key},
        )
        if self.keyed.get(key) is run:
            del self.keyed[key]
        run.done.set()

    def conflict_error(self, tool: Tool, key: str) -> DispatchError:
        return DispatchError.make(
            ErrorKind.CONFLICT,
            f"idempotency key {key!r} was already used for a call of {tool.name!r} with other"
            " arguments (or of another tool); a new call needs a new key",
            data={"tool": tool.name, "idempotency_key": key},
        )

    async def run_keyed(
        self,
        run: _Run,
        tool: Tool,
        args: Mapping[str, Any],
        key: str,
        timeout: float | None,
        budget: _Spending | None,
        spent: float = 0.0,
    ) -> None:
        """Run a keyed call in the runner process; keep its outcome (:func:`_kept`); wake
        every waiter.

        If the runner is cancelled (the dispatcher or the runner stopped), the waiters get an
        ``internal`` error rather than waiting forever; one that cut a non-idempotent handler
        short is in doubt, and kept."""
        finished = False
        try:
            run.value = await self.execute(tool, args, timeout, budget, run, spent)
            finished = True
            self.keep(key, run)
        except DispatchError as error:
            run.error = error
            finished = True
            if _kept(tool, error):
                self.keep(key, run)
        except Exception as exc:  # a bug of ours: never strand the waiters
            run.error = DispatchError.make(
                ErrorKind.INTERNAL,
                f"tool {tool.name!r}: the dispatcher failed while running it: {exc!r}",
                data={"tool": tool.name},
            )
            run.error.__cause__ = exc
            finished = True
        finally:
            if not finished:
                doubt = run.started and not tool.idempotent
                run.error = DispatchError.make(
                    ErrorKind.INTERNAL,
                    f"tool {tool.name!r}: dispatcher {self.name!r} (or its runner) stopped while"
                    f" the call with idempotency key {key!r} ran"
                    + (_doubt(tool) if doubt else "; call again once it is restarted"),
                    attempts=1 if doubt else 0,
                    data={"tool": tool.name, "idempotency_key": key, **_in_doubt(tool)}
                    if doubt
                    else {"tool": tool.name, "idempotency_key": key},
                )
                if doubt:
                    self.keep(key, run)
            if self.keyed.get(key) is run:
                del self.keyed[key]
            run.done.set()

    def keep(self, key: str, run: _Run) -> None:
        """Keep the run's outcome for the key, for ``result_ttl`` seconds."""
        try:
            ets.insert(self.table, (key, run.fingerprint, run.value, run.error))
        except ets.EtsError:
            pass  # the dispatcher is stopping: its table is gone

    async def wait_run(
        self, run: _Run, tool: Tool, key: str, budget: Budget | None, timeout: float | None
    ) -> Any:
        """Wait for the key's run, until this caller's own budget deadline or ``timeout`` (if
        it gave one); the run goes on without a caller that stops waiting."""
        limit = budget.limit() if budget is not None else math.inf
        until = limit if timeout is None else min(limit, trio.current_time() + timeout)
        with trio.move_on_at(until):
            await run.done.wait()
        if not run.done.is_set():
            goes_on = (
                f" for the call with idempotency key {key!r} (the call goes on; its result is"
                " cached for a later call with the key)"
            )
            if until < limit:
                self.event("dispatch.timeout", _WARNING, tool.name, attempt=0, timeout=timeout)
                error = DispatchError.make(
                    ErrorKind.TIMEOUT,
                    f"tool {tool.name!r}: the caller's timeout ({_fmt(timeout or 0.0)}) passed"
                    f" while it waited{goes_on}",
                    data={"tool": tool.name, "idempotency_key": key, "timeout": timeout},
                )
            else:
                error = DispatchError.make(
                    ErrorKind.BUDGET_EXCEEDED,
                    f"tool {tool.name!r}: the caller's budget deadline passed while it"
                    f" waited{goes_on}",
                    data={"tool": tool.name, "idempotency_key": key},
                )
            return await self.reject(error, tool.name)
        if run.error is not None:
            raise _copy(run.error)
        return run.value

    # -- lifecycle -------------------------------------------------------------------------

    def statistics(self) -> DispatcherStatistics:
        now = trio.current_time()
        info = ets.info(self.table) if self.alive else None
        return DispatcherStatistics(
            counters=dict(self.counters),
            running=self.running,
            in_flight_keys=len(self.keyed),
            cached_results=info.size if info is not None else 0,
            breakers={name: str(b.current(now)) for name, b in sorted(self.breakers.items())},
            tools=tuple(self.registry.names()),
        )

    def close(self) -> None:
        """The server died: the dispatcher is gone (its cache table went with the server)."""
        self.alive = False
        states = _states()
        for key in (self.pid, self.name, self.owner):
            if key is not None and states.get(key) is self:
                del states[key]
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


# -- client functions -----------------------------------------------------------------------


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
        timeout = _timeout_of(name, timeout, timeout_ms)
    return await _find(dispatcher).dispatch(name, args, idempotency_key, timeout, budget)


def _as_call(call: Any) -> Call:
    """``call`` as a :class:`Call`, checked before any call of the batch runs.

    Raises:
        ConfigurationError: ``call`` is malformed (:class:`InvalidOption` for its options).
    """
    if isinstance(call, tuple) and len(call) in (1, 2) and isinstance(call[0], str):
        call = Call(*call)
    if not isinstance(call, Call) or not isinstance(call.name, str):
        raise ConfigurationError(
            "gather_bounded: each call is a Call(name, args, ...) or a (name, args) tuple"
            f" (got {call!r})"
        )
    if call.timeout_ms is not None:
        seconds = _timeout_of(call.name, call.timeout, call.timeout_ms)
        call = attrs.evolve(call, timeout=seconds, timeout_ms=None)
    _check_options(call.name, call.idempotency_key, call.timeout, None)
    return call


@overload
async def gather_bounded(
    calls: Iterable[Call | tuple[str, Mapping[str, Any]]],
    limit: int = ...,
    *,
    return_outcomes: Literal[False] = ...,
    budget: Budget | None = ...,
    dispatcher: str | otp.Pid = ...,
) -> list[Any]: ...


@overload
async def gather_bounded(
    calls: Iterable[Call | tuple[str, Mapping[str, Any]]],
    limit: int = ...,
    *,
    return_outcomes: Literal[True],
    budget: Budget | None = ...,
    dispatcher: str | otp.Pid = ...,
) -> list[Outcome]: ...


async def gather_bounded(
    calls: Iterable[Call | tuple[str, Mapping[str, Any]]],
    limit: int = 8,
    *,
    return_outcomes: bool = False,
    budget: Budget | None = None,
    dispatcher: str | otp.Pid = DEFAULT_NAME,
) -> list[Any] | list[Outcome]:
    """Dispatch ``calls`` with at most ``limit`` of them running at once, in the shape of
    ``gather``: their results in call order, or the first error raised.

    Every call runs to its end whatever the others do (as the seed's ``asyncio.gather`` of
    bounded calls lets them run): none is cancelled halfway because another failed, which would
    leave a non-idempotent call's outcome unknown. Then, if any failed, the
    :class:`DispatchError` of the first to fail is raised, with a note naming the others.
    ``return_outcomes=True`` returns every call's :class:`Outcome` (a result or an error) in call
    order instead, and raises nothing for a failed call.

    ``budget`` (shared by every call) and the dispatcher's and tools' own concurrency limits
    apply on top of ``limit``. Cancellation cancels every call still running (keyed calls'
    shared runs go on, as with :func:`dispatch`).

    Raises:
        DispatchError: a call failed (unless ``return_outcomes``).
        ConfigurationError: ``limit`` is not an int >= 1, or a call is malformed
            (:class:`InvalidOption` for a malformed option or ``budget``).
        DispatcherNotRunning: no dispatcher runs as ``dispatcher``.
    """
    if limit.__class__ is not int or limit < 1:
        raise ConfigurationError(f"gather_bounded: limit must be an int >= 1 (got {limit!r})")
    if not isinstance(return_outcomes, bool):
        raise ConfigurationError(
            f"gather_bounded: return_outcomes must be True or False (got {return_outcomes!r})"
        )
    todo = [_as_call(call) for call in calls]
    _check_options("gather_bounded", None, None, budget)
    state = _find(dispatcher)
    outcomes: list[Outcome | None] = [None] * len(todo)
    failed: list[int] = []  # indices, in the order the calls failed
    queue = iter(enumerate(todo))

    async def worker() -> None:
        for index, call in queue:
            try:
                value = await state.dispatch(
                    call.name, call.args, call.idempotency_key, call.timeout, budget
                )
            except DispatchError as error:
                outcomes[index] = Outcome(error=error)
                failed.append(index)
            else:
                outcomes[index] = Outcome(value=value)

    await trio.lowlevel.checkpoint_if_cancelled()
    async with trio.open_nursery() as nursery:
        for _ in range(min(limit, len(todo))):
            nursery.start_soon(worker)
    done = [outcome for outcome in outcomes if outcome is not None]
    if return_outcomes:
        return done
    if failed:
        first = outcomes[failed[0]].error  # type: ignore[union-attr]
        assert first is not None
        if len(failed) > 1:
            others = ", ".join(map(str, sorted(failed[1:])))
            first.add_note(
                f"gather_bounded: call {failed[0]} of {len(todo)} failed first; other failed"
                f" calls: {others} (pass return_outcomes=True for every outcome)"
            )
        raise first
    return [outcome.value for outcome in done]


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
