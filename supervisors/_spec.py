"""Child specs and supervisor flags: OTP's ``child_spec()`` and ``sup_flags()`` as frozen values.

Mirrors ``supervisor:check_childspec/2`` and ``check_flags/1`` (OTP 25): every field is validated
when the value is built, with OTP's defaults (restart permanent, shutdown 5 s for workers and
infinity for supervisors, type worker, significant false; strategy one_for_one, intensity 1,
period 5 s, auto_shutdown never). A rejected value raises an error that carries OTP's error term
(``reason``) next to a message naming the field, what was expected and what was received.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs


class SupervisorError(Exception):
    """Root of every error the ``supervisors`` package raises.

    ``reason`` is the OTP error term the same failure has in Erlang (for example
    ``("bad_combination", [("restart", "permanent"), ("significant", True)])``).
    """

    def __init__(self, message: str, reason: Any = None) -> None:
        super().__init__(message)
        self.reason = reason


class ChildSpecError(SupervisorError, ValueError):
    """A child spec was rejected (OTP's ``check_childspec`` errors)."""


class SupFlagsError(SupervisorError, ValueError):
    """Supervisor flags were rejected (OTP's ``{supervisor_data, Error}``)."""


class Restart(enum.StrEnum):
    """When a terminated child is restarted (OTP's ``restart()``)."""

    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class ChildType(enum.StrEnum):
    """Whether a child is a worker or a supervisor (OTP's ``worker()``)."""

    WORKER = "worker"
    SUPERVISOR = "supervisor"


class Strategy(enum.StrEnum):
    """A supervisor's restart strategy (OTP's ``strategy()``)."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"
    SIMPLE_ONE_FOR_ONE = "simple_one_for_one"


class AutoShutdown(enum.StrEnum):
    """When significant children make their supervisor shut down (OTP's ``auto_shutdown()``)."""

    NEVER = "never"
    ANY_SIGNIFICANT = "any_significant"
    ALL_SIGNIFICANT = "all_significant"


#: ``shutdown`` value: kill the child untrappably at once.
BRUTAL_KILL = "brutal_kill"
#: ``shutdown`` value: wait for the child however long it takes (default for supervisors).
INFINITY = "infinity"
#: Default ``shutdown`` of a worker, in seconds (OTP's 5000 ms).
DEFAULT_WORKER_SHUTDOWN = 5.0

ShutdownValue = float | str


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _normalise_start(value: Any) -> tuple[Any, ...]:
    """``fn``, ``(fn, *args)`` or a behaviour class (its ``start_link``) -> ``(fn, *args)``."""
    start_link = getattr(value, "start_link", None)
    if isinstance(value, type) and callable(start_link):
        return (start_link,)
    if isinstance(value, tuple) and value and callable(value[0]):
        return value
    if isinstance(value, list) and value and callable(value[0]):
        return tuple(value)
    if callable(value):
        return (value,)
    raise ChildSpecError(
        "ChildSpec.start must be an async start function, a tuple (fn, *args) or a behaviour"
        f" class with start_link (got {value!r})",
        ("invalid_mfa", value),
    )


def _owner_of(fn: Any) -> Any:
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, type) else None


def _default_type(spec: ChildSpec) -> ChildType:
    owner = _owner_of(spec.start[0])
    if owner is not None and getattr(owner, "_supervisor_behaviour", False):
        return ChildType.SUPERVISOR
    return ChildType.WORKER


def _default_shutdown(spec: ChildSpec) -> ShutdownValue:
    return INFINITY if spec.type is ChildType.SUPERVISOR else DEFAULT_WORKER_SHUTDOWN


def _default_modules(spec: ChildSpec) -> tuple[str, ...]:
    fn = spec.start[0]
    owner = _owner_of(fn)
    if owner is not None:
        return (f"{owner.__module__}.{owner.__qualname__}",)
    return (str(getattr(fn, "__module__", None) or "dynamic"),)


def _convert_enum(kind: type[enum.StrEnum], field: str, otp_error: str) -> Callable[[Any], Any]:
    choices = ", ".join(repr(m.value) for m in kind)

    def convert(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise ChildSpecError(
                f"ChildSpec.{field} must be one of {choices} (got {value!r})", (otp_error, value)
            ) from None

    return convert


_restart_converter = _convert_enum(Restart, "restart", "invalid_restart_type")
_type_converter = _convert_enum(ChildType, "type", "invalid_child_type")


def _to_restart(value: Any) -> Restart:
    return _restart_converter(value)


def _to_child_type(value: Any) -> ChildType:
    return _type_converter(value)


def _check_shutdown(_spec: Any, _attr: Any, value: Any) -> None:
    if value in (BRUTAL_KILL, INFINITY):
        return
    if _is_number(value) and value >= 0 and not math.isnan(value) and value != math.inf:
        return
    raise ChildSpecError(
        "ChildSpec.shutdown must be a number of seconds >= 0, "
        f'"brutal_kill" or "infinity" (got {value!r})',
        ("invalid_shutdown", value),
    )


def _check_significant(spec: ChildSpec, _attr: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise ChildSpecError(
            f"ChildSpec.significant must be True or False (got {value!r})",
            ("invalid_significant", value),
        )
    if value and spec.restart is Restart.PERMANENT:
        raise ChildSpecError(
            "ChildSpec.significant=True needs restart 'transient' or 'temporary' (got restart"
            " 'permanent'): a permanent child is always restarted, so it can never make its"
            " supervisor shut down",
            ("bad_combination", [("restart", "permanent"), ("significant", True)]),
        )


def _check_id(_spec: Any, _attr: Any, value: Any) -> None:
    try:
        hash(value)
    except TypeError:
        raise ChildSpecError(
            f"ChildSpec.id must be hashable (got {value!r})", ("invalid_child_spec", value)
        ) from None


def _convert_modules(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable):
        raise ChildSpecError(
            "ChildSpec.modules must be a module name (str), a list of them or None"
            f" (got {value!r})",
            ("invalid_modules", value),
        )
    modules = tuple(value)
    for module in modules:
        if not isinstance(module, str):
            raise ChildSpecError(
                f"ChildSpec.modules must hold module names (str) (got {module!r} in {value!r})",
                ("invalid_module", module),
            )
    return modules


@attrs.frozen
class ChildSpec:
    """How a supervisor starts, restarts and stops one child (OTP's ``child_spec()`` map).

    Args:
        id: Names the child within its supervisor (any hashable value).
        start: ``fn``, ``(fn, *args)`` or a behaviour class. ``await fn(*args)`` runs in the
            supervisor's process and must start the child *linked* to it and return its pid
            once started (``MyServer.start_link`` does exactly that), raise
            :class:`otp.StartError` (or return ``("error", reason)``) on failure and raise
            :class:`otp.StartIgnored` (or return None) to decline. A class stands for its
            ``start_link`` with no arguments.
        restart: ``permanent`` (always restarted), ``transient`` (restarted after an abnormal
            exit) or ``temporary`` (never restarted; its spec is dropped when it ends).
        type: ``worker`` or ``supervisor``. Defaults to ``supervisor`` when ``start`` is a
            :class:`Supervisor` class, else ``worker`` (OTP's default).
        shutdown: Seconds to wait after the ``shutdown`` exit signal before killing the child,
            ``"brutal_kill"`` or ``"infinity"``. Default 5 s for workers, infinity for
            supervisors.
        significant: With ``auto_shutdown``, whether this child's end may stop the supervisor.
            Only for transient or temporary children.
        modules: Informational, shown by ``which_children`` (OTP's ``modules``): a module name,
            a list of them or None.

    Raises:
        ChildSpecError: a field is invalid; ``reason`` is OTP's error term.
    """

    id: Any = attrs.field(validator=_check_id)
    start: tuple[Any, ...] = attrs.field(converter=_normalise_start)
    restart: Restart = attrs.field(
        default=Restart.PERMANENT,
        kw_only=True,
        converter=_to_restart,
    )
    type: ChildType = attrs.field(
        default=attrs.Factory(_default_type, takes_self=True),
        kw_only=True,
        converter=_to_child_type,
    )
    shutdown: ShutdownValue = attrs.field(
        default=attrs.Factory(_default_shutdown, takes_self=True),
        kw_only=True,
        validator=_check_shutdown,
    )
    significant: bool = attrs.field(default=False, kw_only=True, validator=_check_significant)
    modules: tuple[str, ...] = attrs.field(
        default=attrs.Factory(_default_modules, takes_self=True),
        kw_only=True,
        converter=_convert_modules,
    )

    @classmethod
    def from_map(cls, spec: Mapping[str, Any]) -> ChildSpec:
        """Build a spec from OTP's map form: ``{"id": ..., "start": ..., "restart": ...}``.

        Raises:
            ChildSpecError: ``id`` or ``start`` is missing (``missing_id`` /
                ``missing_start``), a key is unknown or a value is invalid.
        """
        if isinstance(spec, ChildSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise ChildSpecError(
                f"a child spec must be a ChildSpec or a mapping (got {spec!r})",
                ("invalid_child_spec", spec),
            )
        if "id" not in spec:
            raise ChildSpecError("child spec is missing its 'id'", "missing_id")
        if "start" not in spec:
            raise ChildSpecError(
                f"child spec {spec['id']!r} is missing its 'start'", "missing_start"
            )
        unknown = set(spec) - {f.name for f in attrs.fields(cls)}
        if unknown:
            raise ChildSpecError(
                f"child spec {spec['id']!r} has unknown keys {sorted(unknown, key=repr)!r}; known"
                " keys are id, start, restart, type, shutdown, significant, modules",
                ("invalid_child_spec", dict(spec)),
            )
        fields = dict(spec)
        return cls(fields.pop("id"), fields.pop("start"), **fields)

    def with_args(self, extra: Iterable[Any], *, prepend: bool = False) -> ChildSpec:
        """A copy whose start arguments have ``extra`` appended (or prepended)."""
        fn, *args = self.start
        extra = list(extra)
        new_args = [*extra, *args] if prepend else [*args, *extra]
        return attrs.evolve(self, start=(fn, *new_args))


def _flags_error(
    field: str, expected: str, value: Any, term: str, owner: str = "SupFlags"
) -> SupFlagsError:
    return SupFlagsError(f"{owner}.{field} must be {expected} (got {value!r})", (term, value))


def _convert_flag_enum(kind: type[enum.StrEnum], field: str, term: str) -> Callable[[Any], Any]:
    choices = ", ".join(repr(m.value) for m in kind)

    def convert(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise _flags_error(field, f"one of {choices}", value, term) from None

    return convert


_strategy_converter = _convert_flag_enum(Strategy, "strategy", "invalid_strategy")
_auto_converter = _convert_flag_enum(AutoShutdown, "auto_shutdown", "invalid_auto_shutdown")


def _to_strategy(value: Any) -> Strategy:
    return _strategy_converter(value)


def _to_auto_shutdown(value: Any) -> AutoShutdown:
    return _auto_converter(value)


# Shared with DynamicSupFlags: the message names the class the value was given to.
def check_intensity(flags: Any, _attr: Any, value: Any) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        owner = type(flags).__name__
        raise _flags_error("intensity", "an int >= 0", value, "invalid_intensity", owner)


def check_period(flags: Any, _attr: Any, value: Any) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        owner = type(flags).__name__
        raise _flags_error("period", "an int > 0 (seconds)", value, "invalid_period", owner)


@attrs.frozen
class SupFlags:
    """A supervisor's flags (OTP's ``sup_flags()`` map).

    Args:
        strategy: one_for_one (default), one_for_all, rest_for_one or simple_one_for_one.
        intensity: How many restarts are allowed within ``period`` (default 1). One more
            makes the supervisor give up: it stops its children and exits ``shutdown``.
        period: The window of the restart count, in whole seconds (default 5).
        auto_shutdown: never (default), any_significant or all_significant.

    Raises:
        SupFlagsError: a field is invalid; ``reason`` is OTP's error term.
    """

    strategy: Strategy = attrs.field(
        default=Strategy.ONE_FOR_ONE,
        converter=_to_strategy,
    )
    intensity: int = attrs.field(default=1, validator=check_intensity)
    period: int = attrs.field(default=5, validator=check_period)
    auto_shutdown: AutoShutdown = attrs.field(
        default=AutoShutdown.NEVER,
        converter=_to_auto_shutdown,
    )

    @classmethod
    def from_term(cls, flags: Any) -> SupFlags:
        """Accept a :class:`SupFlags`, OTP's map form (a dict) or the tuple form
        ``(strategy, intensity, period)``.

        Raises:
            SupFlagsError: the value or one of its fields is invalid.
        """
        if isinstance(flags, SupFlags):
            return flags
        if isinstance(flags, Mapping):
            unknown = set(flags) - {"strategy", "intensity", "period", "auto_shutdown"}
            if unknown:
                raise SupFlagsError(
                    f"SupFlags has unknown keys {sorted(unknown, key=repr)!r}; known keys are"
                    " strategy, intensity, period, auto_shutdown",
                    ("invalid_type", dict(flags)),
                )
            return cls(**flags)
        if isinstance(flags, tuple) and len(flags) == 3:
            return cls(*flags)
        raise SupFlagsError(
            "supervisor flags must be a SupFlags, a mapping or (strategy, intensity, period)"
            f" (got {flags!r})",
            ("invalid_type", flags),
        )


def _check_max_children(_flags: Any, _attr: Any, value: Any) -> None:
    if value is not None and not (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ):
        raise SupFlagsError(
            f"DynamicSupFlags.max_children must be None or an int >= 0 (got {value!r})",
            ("invalid_max_children", value),
        )


def _convert_extra_arguments(value: Any) -> tuple[Any, ...]:
    # Only a sequence: a str would be split into one-letter arguments.
    if not isinstance(value, list | tuple):
        raise SupFlagsError(
            "DynamicSupFlags.extra_arguments must be a list or tuple of arguments"
            f" (got {value!r}): wrap a single argument, as extra_arguments=(config,)",
            ("invalid_extra_arguments", value),
        )
    return tuple(value)


@attrs.frozen
class DynamicSupFlags:
    """The flags of a :class:`DynamicSupervisor` (Elixir's ``DynamicSupervisor.init/1``).

    Args:
        intensity: restarts allowed within ``period`` (Elixir's ``max_restarts``, default 3).
        period: the window in whole seconds (Elixir's ``max_seconds``, default 5).
        max_children: at most this many children (None: no limit); ``start_child`` beyond it
            returns ``("error", "max_children")``.
        extra_arguments: a list or tuple, prepended to the start arguments of every child.

    Raises:
        SupFlagsError: a field is invalid; ``reason`` is the error term.
    """

    intensity: int = attrs.field(default=3, validator=check_intensity)
    period: int = attrs.field(default=5, validator=check_period)
    max_children: int | None = attrs.field(default=None, validator=_check_max_children)
    extra_arguments: tuple[Any, ...] = attrs.field(default=(), converter=_convert_extra_arguments)


def check_startspec(
    specs: Iterable[Any], auto_shutdown: Any = AutoShutdown.NEVER
) -> list[ChildSpec]:
    """Validate a supervisor's child list as OTP's ``check_startspec``; returns the specs.

    Raises:
        ChildSpecError: a spec is invalid, two share an id (``duplicate_child_name``), or a
            significant child sits under ``auto_shutdown`` never (``bad_combination``).
    """
    auto = AutoShutdown(auto_shutdown)
    seen: set[Any] = set()
    result: list[ChildSpec] = []
    for raw in specs:
        spec = ChildSpec.from_map(raw)
        check_significant(spec, auto)
        if spec.id in seen:
            raise ChildSpecError(
                f"two child specs have the id {spec.id!r}: ids must be unique within a supervisor",
                ("duplicate_child_name", spec.id),
            )
        seen.add(spec.id)
        result.append(spec)
    return result


def check_significant(spec: ChildSpec, auto_shutdown: AutoShutdown) -> None:
    """Reject a significant child under a supervisor whose ``auto_shutdown`` is never."""
    if spec.significant and auto_shutdown is AutoShutdown.NEVER:
        raise ChildSpecError(
            f"child {spec.id!r} is significant but the supervisor's auto_shutdown is 'never':"
            " set SupFlags.auto_shutdown to 'any_significant' or 'all_significant', or drop"
            " significant=True",
            ("bad_combination", [("auto_shutdown", "never"), ("significant", True)]),
        )


def check_dynamic_significant(spec: ChildSpec) -> None:
    """A DynamicSupervisor has no auto_shutdown, so no child of it can be significant."""
    if spec.significant:
        raise ChildSpecError(
            f"child {spec.id!r} is significant but a DynamicSupervisor has no auto_shutdown:"
            " drop significant=True, or put the child under a Supervisor whose"
            " SupFlags.auto_shutdown is 'any_significant' or 'all_significant'",
            ("bad_combination", [("auto_shutdown", "never"), ("significant", True)]),
        )


def check_childspecs(specs: Iterable[Any], auto_shutdown: Any = AutoShutdown.NEVER) -> Any:
    """OTP's ``supervisor:check_childspecs/1,2``: ``"ok"`` or ``("error", Reason)``.

    Accepts :class:`ChildSpec` values and OTP's map form (dicts), so configuration can be
    checked before a supervisor is started.
    """
    try:
        check_startspec(specs, auto_shutdown)
    except SupervisorError as exc:
        return ("error", exc.reason)
    return "ok"
