"""Tools and their promises: ``Tool`` (handler, JSON Schema, timeout, idempotency, retry and breaker
policies), the ``ToolRegistry``, and the ``Backend`` seam for handlers that live elsewhere.

A tool is a frozen value, validated when built (its schema is checked against its metaschema
and compiled once). Mirrors an MCP tool definition plus the operational promises MCP leaves to
the server.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs
import jsonschema  # type: ignore[import-untyped]
import jsonschema.exceptions  # type: ignore[import-untyped]
import jsonschema.validators  # type: ignore[import-untyped]
import referencing.exceptions

import otp

from . import _pattern
from ._errors import ConfigurationError, ErrorKind, TransientError
from ._pattern import LinearPattern

# -- policies ---------------------------------------------------------------------------------


def _positive(cls: str, *, allow_zero: bool = False, allow_none: bool = False) -> Any:
    def check(_obj: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is None and allow_none:
            return
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value >= 0 if allow_zero else value > 0)
        )
        if not ok:
            bound = ">= 0" if allow_zero else "> 0"
            extra = " or None" if allow_none else ""
            raise ConfigurationError(
                f"{cls}.{attr.name} must be a finite number {bound}{extra} (got {value!r})"
            )

    return check


def _count(cls: str) -> Any:
    def check(_obj: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value.__class__ is not int or value < 1:
            raise ConfigurationError(f"{cls}.{attr.name} must be an int >= 1 (got {value!r})")

    return check


def _optional_count(cls: str) -> Any:
    counted = _count(cls)

    def check(obj: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            counted(obj, attr, value)

    return check


def _whole_token(_obj: Any, _attr: Any, capacity: float) -> None:
    if capacity < 1:
        raise ConfigurationError(
            f"RetryBudget.capacity must be >= 1 (got {capacity!r}): a retry takes a whole"
            " token, so a smaller bucket would never allow one; use RetryPolicy(budget=None)"
            " for no shared budget, or max_attempts=1 for no retries"
        )


@attrs.frozen
class RetryBudget:
    """A token bucket shared by every call of one tool, so that a failing tool cannot cause a
    retry storm: each retry takes a token; tokens refill at ``refill_per_second`` up to
    ``capacity``. With the bucket empty a retryable failure is returned at once
    (event ``dispatch.retry_denied``)."""

    capacity: float = attrs.field(default=10.0, validator=[_positive("RetryBudget"), _whole_token])
    refill_per_second: float = attrs.field(
        default=1.0, validator=_positive("RetryBudget", allow_zero=True)
    )


@attrs.frozen
class RetryPolicy:
    """When and how often a tool is retried.

    Attempt 1 runs at once; attempt ``n >= 2`` waits ``first_delay * multiplier ** (n - 2)``
    (capped at ``max_delay``) times ``1 + uniform(0, jitter)``. The defaults give the issue's
    schedule: at most 3 attempts, delays 0, 0.1 s and 0.4 s, each times 1 to 1.5. Only
    ``timeout`` and ``transient`` failures are retried, and a ``timeout`` only if the tool is
    idempotent. A handler's ``TransientError(retry_after=s)`` replaces the delay with ``s``,
    capped at ``max_retry_after``.
    """

    max_attempts: int = attrs.field(default=3, validator=_count("RetryPolicy"))
    first_delay: float = attrs.field(
        default=0.1, validator=_positive("RetryPolicy", allow_zero=True)
    )
    multiplier: float = attrs.field(default=4.0, validator=_positive("RetryPolicy"))
    jitter: float = attrs.field(default=0.5, validator=_positive("RetryPolicy", allow_zero=True))
    max_delay: float = attrs.field(
        default=30.0, validator=_positive("RetryPolicy", allow_zero=True)
    )
    max_retry_after: float = attrs.field(
        default=30.0, validator=_positive("RetryPolicy", allow_zero=True)
    )
    budget: RetryBudget | None = attrs.field(factory=RetryBudget)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before ``attempt`` (1-based); ``rng`` draws the jitter."""
        if attempt <= 1:
            return 0.0
        base = min(self.first_delay * self.multiplier ** (attempt - 2), self.max_delay)
        if self.jitter and rng is not None:
            base *= 1.0 + rng.uniform(0.0, self.jitter)
        return base

    def retryable(self, kind: ErrorKind, idempotent: bool) -> bool:
        """Whether a failure of ``kind`` may be retried at all."""
        if kind is ErrorKind.TRANSIENT:
            return True
        return kind is ErrorKind.TIMEOUT and idempotent


#: A policy that never retries.
NO_RETRY = RetryPolicy(max_attempts=1, budget=None)


@attrs.frozen
class BreakerPolicy:
    """A tool's circuit breaker: it opens after ``failures`` failed attempts within ``window``
    seconds, fails calls fast for ``cooldown`` seconds, then lets exactly one probe through
    (half-open): the probe's success closes it, its failure opens it again. ``timeout``,
    ``transient`` and ``internal`` failures count; ``schema`` and ``not_found`` never do."""

    failures: int = attrs.field(default=5, validator=_count("BreakerPolicy"))
    window: float = attrs.field(default=30.0, validator=_positive("BreakerPolicy"))
    cooldown: float = attrs.field(default=10.0, validator=_positive("BreakerPolicy"))


# -- the backend seam -------------------------------------------------------------------------


@runtime_checkable
class Backend(Protocol):
    """Where a tool's handler runs when it is not a local function: a GenServer on this or
    another node (:class:`GenServerBackend`), and later the dirty pool or pull workers.

    ``invoke`` runs in the caller's task under the attempt's cancel scope (a timeout cancels
    it). It returns the result, raises :class:`TransientError` for a retryable failure, and
    anything else for an ``internal`` one.
    """

    async def invoke(self, tool: Tool, args: Mapping[str, Any]) -> Any: ...


@attrs.frozen
class GenServerBackend:
    """A backend that calls a GenServer: ``otp.call(server, ("dispatch", tool_name, args))``.

    ``server`` is a pid, a registered name or ``(name, node)`` on another node. The server
    replies ``("ok", result)`` or ``("error", kind, message)`` where ``kind`` ``"transient"``
    and ``"timeout"`` keep their meaning and any other is ``internal``. A ``Dispatcher`` is
    such a server, so a tool can forward to another node's dispatcher. A server that is not
    running (``noproc``, ``noconnection``) is a transient failure (a supervisor may be
    restarting it); a server that dies during the call is ``internal`` (it may have committed).
    The call has no timeout of its own: the attempt's cancel scope bounds it.
    """

    server: Any

    async def invoke(self, tool: Tool, args: Mapping[str, Any]) -> Any:
        try:
            reply = await otp.call(self.server, ("dispatch", tool.name, dict(args)), timeout=None)
        except otp.CallError as exc:
            if exc.reason in (otp.NOPROC, otp.NOCONNECTION):
                raise TransientError(
                    f"tool {tool.name!r}: its server {self.server!r} is not running"
                    f" ({exc.reason}); retrying",
                    data={"server": repr(self.server)},
                ) from exc
            raise RuntimeError(
                f"tool {tool.name!r}: its server {self.server!r} exited during the call:"
                f" {otp.format_reason(exc.reason)}"
            ) from exc
        return unwrap_reply(tool.name, self.server, reply)


def unwrap_reply(tool: str, server: Any, reply: Any) -> Any:
    """The result in a backend server's reply, or the error it reports, raised."""
    if isinstance(reply, tuple) and len(reply) == 2 and reply[0] == "ok":
        return reply[1]
    if isinstance(reply, tuple) and len(reply) >= 3 and reply[0] == "error":
        kind, message = reply[1], str(reply[2])
        if kind == ErrorKind.TRANSIENT:
            raise TransientError(message)
        if kind == ErrorKind.TIMEOUT:
            raise _RemoteTimeout(message)
        raise RuntimeError(f"tool {tool!r} failed on {server!r} ({kind}): {message}")
    raise RuntimeError(
        f"tool {tool!r}: {server!r} replied {reply!r}; a backend server replies ('ok', result)"
        " or ('error', kind, message)"
    )


class _RemoteTimeout(TimeoutError):
    """A backend reported that the tool timed out where it ran."""


# -- tools ------------------------------------------------------------------------------------

#: How a handler runs (``Tool.mode``).
ASYNC, SYNC, BACKEND = "async", "sync", "backend"


def _mode(handler: Any) -> str:
    if isinstance(handler, Backend):
        return BACKEND
    target = handler
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 -- an object with an async __call__
    ):
        return ASYNC
    if callable(handler):
        return SYNC
    raise ConfigurationError(
        "Tool.handler must be an async function, a sync function (run in a thread) or a"
        f" Backend (an object with async invoke(tool, args)) (got {handler!r})"
    )


def _check_name(_tool: Any, _attr: Any, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"Tool.name must be a non-empty str (got {value!r})")


def _freeze_schema(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {"type": "object"}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"Tool.schema must be a JSON Schema object (a dict) or None (got {value!r})"
        )
    schema = dict(value)
    # MCP lists a tool's inputSchema as an object schema, and arguments are always an object.
    schema.setdefault("type", "object")
    return schema


def _compile(tool: Tool) -> Any:
    cls = jsonschema.validators.validator_for(tool.schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(tool.schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise ConfigurationError(
            f"Tool {tool.name!r}: its schema is not a valid JSON Schema ({cls.__name__}):"
            f" {exc.message} at {'/'.join(map(str, exc.path)) or 'the root'}"
        ) from exc
    kind = tool.schema["type"]
    if kind != "object":
        raise ConfigurationError(
            f"Tool {tool.name!r}: its schema must describe an object (the arguments are a JSON"
            f" object, and MCP's inputSchema has type 'object'); got type {kind!r}"
        )
    compiled: dict[str, LinearPattern] = {}
    for pattern in _pattern.schema_patterns(tool.schema):
        if pattern not in compiled:
            try:
                compiled[pattern] = _pattern.compile_pattern(pattern)
            except _pattern.PatternError as exc:
                raise ConfigurationError(f"Tool {tool.name!r}: {exc}") from exc
    if compiled:
        if _uses(tool.schema, "unevaluatedProperties"):
            raise ConfigurationError(
                f"Tool {tool.name!r}: its schema combines patternProperties with"
                " unevaluatedProperties, which jsonschema matches with Python's backtracking"
                " re (exponential on hostile keys); use additionalProperties instead"
            )
        # Patterns match in linear time (apps.dispatcher._pattern), never with re.search.
        cls = jsonschema.validators.extend(
            cls, _pattern.keywords(compiled, _pattern.DEFAULT_MAX_STEPS)
        )
    validator = cls(tool.schema)
    _check_refs(tool, validator)
    return validator


def _uses(node: Any, keyword: str) -> bool:
    if isinstance(node, Mapping):
        return keyword in node or any(_uses(value, keyword) for value in node.values())
    if isinstance(node, list):
        return any(_uses(value, keyword) for value in node)
    return False


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _nested_ids(node: Any, root: bool = True) -> bool:
    if isinstance(node, Mapping):
        if not root and isinstance(node.get("$id"), str):
            return True
        return any(_nested_ids(value, False) for value in node.values())
    if isinstance(node, list):
        return any(_nested_ids(value, False) for value in node)
    return False


def _check_refs(tool: Tool, validator: Any) -> None:
    """Resolve every ``$ref`` now, so that a dangling one fails the tool's definition rather
    than a call that reaches it. (A schema with nested ``$id`` s moves the base of its refs:
    those are left to the validator, which reports them when a call reaches them.)"""
    # The validator's own resolver (jsonschema >= 4.18 keeps it private): it knows the
    # metaschemas and the schema's dialect exactly as validation will.
    resolver = getattr(validator, "_resolver", None)
    if resolver is None or _nested_ids(tool.schema):
        return
    for ref in _refs(tool.schema):
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable as exc:
            raise ConfigurationError(
                f"Tool {tool.name!r}: its schema's $ref {ref!r} does not resolve ({exc}); define"
                " it (say under $defs) or remove the reference"
            ) from exc


def _accepts_any_object(schema: Mapping[str, Any]) -> bool:
    return not schema or dict(schema) == {"type": "object"}


#: A tool's timeout when it gives none, in seconds.
DEFAULT_TIMEOUT = 30.0
_UNSET: Any = object()
_timeout_seconds = _positive("Tool", allow_none=True)


def _timeout_ms_check(_tool: Any, _attr: Any, value: Any) -> None:
    if value is not None and not (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
    ):
        raise ConfigurationError(
            f"Tool.timeout_ms must be a finite number of milliseconds > 0 or None (got {value!r})"
        )


def _timeout_check(tool: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not _UNSET:
        _timeout_seconds(tool, attr, value)


@attrs.frozen
class Tool:
    """A function the dispatcher can call, and every promise its schema makes.

    Args:
        name: Unique in its registry.
        handler: ``async def f(**args)``, ``def f(**args)`` (run in a worker thread; a timeout
            abandons the thread, which cannot be killed and runs to its end), or a
            :class:`Backend`, which gets ``(tool, args)``.
        schema: The JSON Schema of the arguments (an object); None accepts any object. Checked
            against its metaschema here and compiled once (the ``jsonschema`` library).
        timeout: Seconds one attempt may run before it is cancelled (None: no limit; 30 s
            unless given); ``dispatch(timeout=...)`` overrides it per call.
        timeout_ms: The same in milliseconds, as the seed's registry records it (give one of
            the two); the tool keeps it as ``timeout`` seconds.
        idempotent: Whether running the handler twice is harmless. A non-idempotent tool is
            never retried after a timeout (the attempt may have committed). Defaults to the
            MCP annotation ``idempotentHint``, else False.
        retry: The :class:`RetryPolicy`.
        breaker: The :class:`BreakerPolicy`, or None for no breaker.
        max_concurrency: At most this many attempts of the tool run at once across all
            callers (None: no limit of its own).
        annotations: MCP tool annotations (``readOnlyHint``, ``idempotentHint``, ...).
        description: Shown in :meth:`to_mcp`.
    """

    name: str = attrs.field(validator=_check_name)
    handler: Any = attrs.field()
    schema: Mapping[str, Any] = attrs.field(default=None, converter=_freeze_schema)
    timeout: float | None = attrs.field(default=_UNSET, kw_only=True, validator=_timeout_check)
    # Folded into ``timeout`` when the tool is built (so ``attrs.evolve`` sees seconds only).
    _timeout_ms: float | None = attrs.field(
        default=None, kw_only=True, repr=False, eq=False, validator=_timeout_ms_check
    )
    annotations: Mapping[str, Any] = attrs.field(factory=dict, kw_only=True, converter=dict)
    idempotent: bool = attrs.field(kw_only=True)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy, kw_only=True)
    breaker: BreakerPolicy | None = attrs.field(factory=BreakerPolicy, kw_only=True)
    max_concurrency: int | None = attrs.field(
        default=None, kw_only=True, validator=_optional_count("Tool")
    )
    description: str = attrs.field(default="", kw_only=True)
    mode: str = attrs.field(init=False)
    validator: Any = attrs.field(init=False, repr=False, eq=False)
    #: Whether the schema accepts every object, so validation can be skipped.
    accepts_any: bool = attrs.field(init=False, repr=False, eq=False)

    @idempotent.default
    def _idempotent_default(self) -> bool:
        return bool(self.annotations.get("idempotentHint", False))

    @idempotent.validator
    def _check_idempotent(self, _attr: Any, value: Any) -> None:
        if not isinstance(value, bool):
            raise ConfigurationError(
                f"Tool {self.name!r}: idempotent must be True or False (got {value!r})"
            )

    def __attrs_post_init__(self) -> None:
        timeout: Any = self.timeout
        if self._timeout_ms is not None:
            if timeout is not _UNSET:
                raise ConfigurationError(
                    f"Tool {self.name!r}: give timeout (seconds) or timeout_ms, not both (got"
                    f" {timeout!r} and {self._timeout_ms!r})"
                )
            timeout = self._timeout_ms / 1000.0
        elif timeout is _UNSET:
            timeout = DEFAULT_TIMEOUT
        object.__setattr__(self, "timeout", timeout)
        object.__setattr__(self, "_timeout_ms", None)
        object.__setattr__(self, "mode", _mode(self.handler))
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError(
                f"Tool {self.name!r}: retry must be a RetryPolicy (got {self.retry!r})"
            )
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise ConfigurationError(
                f"Tool {self.name!r}: breaker must be a BreakerPolicy or None"
                f" (got {self.breaker!r})"
            )
        object.__setattr__(self, "validator", _compile(self))
        object.__setattr__(self, "accepts_any", _accepts_any_object(self.schema))

    def to_mcp(self) -> dict[str, Any]:
        """The tool as MCP's ``tools/list`` describes it."""
        entry: dict[str, Any] = {"name": self.name, "inputSchema": dict(self.schema)}
        if self.description:
            entry["description"] = self.description
        if self.annotations:
            entry["annotations"] = dict(self.annotations)
        return entry


class ToolRegistry:
    """The tools a dispatcher serves, by name.

    A registry is a mutable object handed to the dispatcher when it starts; tools registered
    later (``register``, or ``apps.dispatcher.register_tool``) are seen by the running
    dispatcher at once, and a restarted dispatcher that was given the same registry keeps them.
    """

    def __init__(self, tools: Iterator[Tool] | list[Tool] | tuple[Tool, ...] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        #: Changes whenever a tool is registered or removed, so that what a dispatcher
        #: resolved from the tools it holds is known to be current by one comparison.
        self.version = 0
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool, *, replace: bool = False) -> None:
        """Add ``tool``.

        Raises:
            ConfigurationError: ``tool`` is not a Tool, or its name is taken and not
                ``replace``.
        """
        if not isinstance(tool, Tool):
            raise ConfigurationError(f"ToolRegistry.register takes a Tool (got {tool!r})")
        if tool.name in self._tools and not replace:
            raise ConfigurationError(
                f"ToolRegistry.register: a tool named {tool.name!r} is already registered"
                " (pass replace=True to replace it, or unregister it first)"
            )
        self._tools[tool.name] = tool
        self.version += 1

    def unregister(self, name: str) -> Tool | None:
        """Remove the tool named ``name``; returns it, or None if there was none."""
        self.version += 1
        return self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def to_mcp(self) -> list[dict[str, Any]]:
        """Every tool as MCP's ``tools/list`` lists them, by name."""
        return [self._tools[name].to_mcp() for name in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"
