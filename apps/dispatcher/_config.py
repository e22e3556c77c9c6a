"""How a dispatcher runs: :class:`DispatcherConfig` (a node.toml ``[dispatcher]`` table), each
field checked when the value is built, and the name a dispatcher registers under by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from . import _pattern
from ._errors import ConfigurationError

#: The name the dispatcher registers under unless configured otherwise.
DEFAULT_NAME = "dispatcher"


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


def _check_steps(_cfg: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value.__class__ is not int or value < 1:
        raise ConfigurationError(
            f"DispatcherConfig.{attr.name} must be an int >= 1 (got {value!r})"
        )


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
