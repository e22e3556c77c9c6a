"""What a call is checked against before any handler runs: its options (``idempotency_key``,
``timeout``/``timeout_ms``, ``budget``), how deep its arguments nest, and the tool's JSON Schema
(under a step meter, so a schema's patterns cannot hold the event loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema.exceptions  # type: ignore[import-untyped]
import referencing.exceptions

from . import _pattern
from ._breaker import Budget
from ._config import DispatcherConfig
from ._errors import DispatchError, ErrorKind, InvalidOption, fmt_seconds
from ._tool import Tool

_SCHEMA_ERRORS_SHOWN = 10

#: A schema error's message quotes the value (jsonschema's repr): at most this many characters.
_MESSAGE_CHARS = 300


def _clip(text: str) -> str:
    if len(text) <= _MESSAGE_CHARS:
        return text
    # The head quotes the value, the tail usually says what it failed (jsonschema's form).
    half = _MESSAGE_CHARS // 2
    return f"{text[:half]}...[{len(text) - 2 * half:,} characters]...{text[-half:]}"


def deeper_than(args: Mapping[str, Any], limit: int) -> bool:
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


def _invalid_option(name: Any, message: str) -> InvalidOption:
    return InvalidOption(f"dispatch({name!r}): {message}", data={"tool": name, "errors": []})


def check_options(name: Any, key: Any, timeout: Any, budget: Any) -> None:
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


def timeout_of(name: Any, timeout: Any, timeout_ms: Any) -> Any:
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


def validation_timeout(tool: Tool, spent: float) -> DispatchError:
    return DispatchError.make(
        ErrorKind.TIMEOUT,
        f"tool {tool.name!r} was not run: validating its arguments took {fmt_seconds(spent)}, the"
        " call's whole timeout (send smaller arguments, or give the call more time)",
        data={"tool": tool.name, "validation": spent},
    )


def depth_error(tool: Tool, limit: int) -> DispatchError:
    return DispatchError.make(
        ErrorKind.SCHEMA,
        f"tool {tool.name!r}: the arguments nest dicts and lists deeper than the limit"
        f" max_arg_depth={limit} (DispatcherConfig.max_arg_depth); flatten them (say,"
        " pass a deep structure as one JSON string) or raise the limit",
        data={"tool": tool.name, "errors": [], "limit": {"max_arg_depth": limit}},
    )


def schema_error(
    tool: Tool, args: Mapping[str, Any], config: DispatcherConfig
) -> DispatchError | None:
    """The ``schema`` error of ``args`` against the tool's schema, or None if they match."""
    limit = config.max_pattern_steps
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
        return depth_error(tool, config.max_arg_depth)
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
