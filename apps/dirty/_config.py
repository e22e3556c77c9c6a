"""Dirty pool settings, with Gunicorn's names and defaults, and Gunicorn's per-app allocation.

Settings come from node.toml's ``[dirty]`` table and the ``--dirty-*`` flags (flags win):
``dirty_apps``, ``dirty_workers`` (0), ``dirty_timeout`` (300 s, 0 = off), ``dirty_threads`` (1),
``dirty_graceful_timeout`` (30 s), ``dirty_max_requests`` (0 = off) and
``dirty_max_requests_jitter`` (0), plus ours: ``dirty_app_load_timeout`` (``dirty_timeout``),
``dirty_max_workers`` (64), ``dirty_socket``, ``dirty_pidfile`` and the hooks
``on_dirty_starting``, ``dirty_post_fork``, ``dirty_worker_init``, ``dirty_worker_exit`` (each a
``module:attr`` path, or found by name in the ``dirty_config`` module); and the bounds on
clients: ``dirty_max_clients`` (1024), ``dirty_frame_timeout`` (30 s), ``dirty_idle_timeout``
(0 = off) and ``dirty_client_buffer`` (32 MiB).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._app import AppSpec, resolve_app_spec
from ._errors import DirtyConfigError

__all__ = [
    "DirtyConfig",
    "add_arguments",
    "apps_for_new_worker",
    "initial_allocation",
    "minimum_workers",
]

HOOKS = ("on_dirty_starting", "dirty_post_fork", "dirty_worker_init", "dirty_worker_exit")
#: The arguments each hook is called with (Gunicorn's arities; our ``ctx`` is its arbiter).
_HOOK_PARAMS = {
    "on_dirty_starting": ("ctx",),
    "dirty_post_fork": ("ctx", "worker"),
    "dirty_worker_init": ("worker",),
    "dirty_worker_exit": ("ctx", "worker"),
}


def _non_negative_int(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 0:
        raise DirtyConfigError(f"{attr.name} must be an int >= 0 (got {value!r})")


def _positive_int(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise DirtyConfigError(f"{attr.name} must be an int >= 1 (got {value!r})")


def _non_negative_number(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or value < 0
    ):
        raise DirtyConfigError(f"{attr.name} must be a number of seconds >= 0 (got {value!r})")


def _optional_seconds(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _non_negative_number(inst, attr, value)


def _path(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not (isinstance(value, str) or (value is None and attr.name == "dirty_socket")):
        raise DirtyConfigError(f"{attr.name} must be a file path, a str (got {value!r})")


def _flag(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not bool:
        raise DirtyConfigError(f"{attr.name} must be true or false (got {value!r})")


def _to_specs(value: Any) -> tuple[AppSpec, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise DirtyConfigError(
            "dirty_apps must be a list of 'module:Class' or 'module:Class:N' strings"
            f" (got {value!r})"
        )
    specs = []
    for item in value:
        if isinstance(item, AppSpec):
            specs.append(item)
        elif isinstance(item, str):
            specs.append(resolve_app_spec(item))
        else:
            raise DirtyConfigError(f"dirty_apps holds {item!r}, which is not a 'module:Class' str")
    paths = [s.import_path for s in specs]
    if len(set(paths)) != len(paths):
        raise DirtyConfigError(f"dirty_apps names an app twice (got {paths})")
    return tuple(specs)


def _default_pidfile() -> str:
    return os.path.join(tempfile.gettempdir(), f"otp-dirty-{os.geteuid()}.pid")


@attrs.frozen
class DirtyConfig:
    """How the pool runs.

    Attributes:
        dirty_apps: The apps, as :class:`AppSpec` (strings ``module:Class[:N]`` are converted).
        dirty_workers: Worker processes. 0 (Gunicorn's default) disables the pool, so it must
            be 0 when ``dirty_apps`` is empty and at least 1 when it is not (the largest
            per-app N, at least; see :attr:`worker_count`).
        dirty_timeout: Seconds a call may run (from when a worker thread takes it, not
            counting a wait for a free thread), and a worker may stay silent, before the worker
            is killed and replaced (its callers get DirtyTimeoutError); 0 turns it off.
        dirty_threads: Threads per worker for sync actions (real parallelism across calls).
        dirty_graceful_timeout: Seconds in-flight calls get to finish on shutdown, HUP or scaling
            down, before their worker is killed.
        dirty_app_load_timeout: Seconds a worker may take to load its apps (each app's
            ``__init__`` and ``init()``) before it is killed and its start counts as failed;
            None (the default) means ``dirty_timeout``, 0 no limit.
        dirty_max_requests: A worker is replaced, gracefully, after this many calls (its
            replacement starts first, its calls in flight finish); 0 turns it off. Gunicorn's
            ``max_requests``.
        dirty_max_requests_jitter: Each worker's limit is ``dirty_max_requests`` plus a random
            0..jitter, so that workers started together are not all replaced together.
        dirty_max_workers: The most workers the pool runs: MANAGE add and SIGTTIN stop there
            (and ``dirty_workers`` may not exceed it).
        dirty_socket: The Unix socket path clients connect to (``GUNICORN_DIRTY_SOCKET``);
            None picks one in the temporary directory.
        dirty_pidfile: Where the pool records its OS pid and its workers' (orphans of a previous
            life are killed at start); "" turns it off.
        hooks: Hook name -> ``module:attr`` path or callable, taking Gunicorn's arguments;
            ``dirty_worker_init`` runs in the worker, so a callable must be a module-level
            function the worker can import.
        handle_signals: Whether the pool reacts to SIGHUP, SIGUSR1, SIGTTIN, SIGTTOU, SIGQUIT.
        dirty_max_clients: Client connections served at once; one more is answered with an
            ERROR frame and closed.
        dirty_idle_timeout: Seconds a client connection with nothing in flight may stay silent
            before it is closed; 0 (the default: Gunicorn's web workers hold one connection per
            thread for their lifetime) turns it off.
        dirty_frame_timeout: Seconds a client may take to send the rest of a frame it began;
            it then gets an ERROR frame and is closed. 0 turns it off.
        dirty_client_buffer: Bytes of replies the node holds for one client that does not
            read them, before that client's worker waits for it (see README, "Limits").
    """

    dirty_apps: tuple[AppSpec, ...] = attrs.field(default=(), converter=_to_specs)
    dirty_workers: int = attrs.field(default=0, validator=_non_negative_int)
    dirty_timeout: float = attrs.field(default=300.0, validator=_non_negative_number)
    dirty_threads: int = attrs.field(default=1, validator=_positive_int)
    dirty_graceful_timeout: float = attrs.field(default=30.0, validator=_non_negative_number)
    dirty_app_load_timeout: float | None = attrs.field(default=None, validator=_optional_seconds)
    dirty_max_requests: int = attrs.field(default=0, validator=_non_negative_int)
    dirty_max_requests_jitter: int = attrs.field(default=0, validator=_non_negative_int)
    dirty_max_workers: int = attrs.field(default=64, validator=_positive_int)
    dirty_socket: str | None = attrs.field(default=None, validator=_path)
    dirty_pidfile: str = attrs.field(factory=_default_pidfile, validator=_path)
    hooks: Mapping[str, Any] = attrs.field(factory=dict)
    handle_signals: bool = attrs.field(default=True, validator=_flag)
    dirty_max_clients: int = attrs.field(default=1024, validator=_positive_int)
    dirty_idle_timeout: float = attrs.field(default=0.0, validator=_non_negative_number)
    dirty_frame_timeout: float = attrs.field(default=30.0, validator=_non_negative_number)
    dirty_client_buffer: int = attrs.field(default=32 << 20, validator=_positive_int)

    def __attrs_post_init__(self) -> None:
        if self.dirty_apps and not self.dirty_workers:
            raise DirtyConfigError(
                "dirty_workers = 0 disables the dirty pool, but dirty_apps names"
                f" {len(self.dirty_apps)} app(s) ({', '.join(self.apps_paths)}): set"
                " dirty_workers to 1 or more to run them, or empty dirty_apps to disable the pool"
            )
        if self.dirty_workers > self.dirty_max_workers:
            raise DirtyConfigError(
                f"dirty_workers = {self.dirty_workers} is over dirty_max_workers ="
                f" {self.dirty_max_workers}: lower dirty_workers or raise dirty_max_workers"
            )

    @property
    def apps_paths(self) -> list[str]:
        """The apps' import paths."""
        return [s.import_path for s in self.dirty_apps]

    @property
    def enabled(self) -> bool:
        """False when the pool is disabled (``dirty_workers = 0`` and no apps, as Gunicorn)."""
        return bool(self.dirty_apps) or self.dirty_workers > 0

    @property
    def app_load_timeout(self) -> float | None:
        """Seconds a worker may take to load its apps; None: no limit."""
        value = self.dirty_app_load_timeout
        return (self.dirty_timeout if value is None else value) or None

    @hooks.validator
    def _check_hooks(self, _attr: Any, value: Mapping[str, Any]) -> None:
        if not isinstance(value, Mapping):
            raise DirtyConfigError(
                "hooks must be a mapping of hook name to a 'module:attr' path or a callable"
                f" (got {value!r})"
            )
        for name, hook in value.items():
            if name not in HOOKS:
                raise DirtyConfigError(
                    f"unknown dirty hook {name!r}; the hooks are {', '.join(HOOKS)}"
                )
            if hook is None:
                continue
            # Loaded and arity-checked now (as Gunicorn validates its hooks): a typo is a
            # config error, not a worker crash later.
            fn = hook if callable(hook) else _load(str(hook), name)
            if name == "dirty_worker_init" and fn is hook:
                _check_importable(fn, name)
            _check_arity(fn, name, hook)

    @property
    def worker_count(self) -> int:
        """How many workers the pool starts with (``dirty_workers``; none without apps)."""
        return self.dirty_workers if self.dirty_apps else 0

    @property
    def heartbeat_interval(self) -> float:
        """How often a worker proves it is alive (a quarter of dirty_timeout, at most 5 s)."""
        if not self.dirty_timeout:
            return 5.0
        return max(0.02, min(5.0, self.dirty_timeout / 4))

    def hook(self, name: str) -> Callable[..., Any] | None:
        """The hook ``name`` as a callable, or None."""
        value = self.hooks.get(name)
        if value is None or callable(value):
            return value
        return _load(str(value), name)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> DirtyConfig:
        """Build it from a node's settings: the ``[dirty]`` table, then the flags.

        Raises:
            DirtyConfigError: A setting is invalid or unknown.
        """
        raw = settings.get("dirty", {})
        if not isinstance(raw, Mapping):
            raise DirtyConfigError(
                f"[dirty] must be a table of dirty_* settings (got {raw!r}); in node.toml,"
                " write a [dirty] line followed by key = value lines"
            )
        table = dict(raw)
        flags = settings.get("flags", {}) or {}
        for key in ("dirty_apps", "dirty_workers", "dirty_timeout", "dirty_threads"):
            if flags.get(key) is not None:
                table[key] = flags[key]
        for key in (
            "dirty_graceful_timeout",
            "dirty_app_load_timeout",
            "dirty_max_requests",
            "dirty_max_requests_jitter",
            "dirty_max_workers",
            "dirty_socket",
            "dirty_pidfile",
            "dirty_config",
        ):
            if flags.get(key) is not None:
                table[key] = flags[key]
        hooks = {name: table.pop(name) for name in HOOKS if name in table}
        config_module = table.pop("dirty_config", None)
        if config_module is not None and (
            not isinstance(config_module, str) or config_module.startswith(".")
        ):
            raise DirtyConfigError(
                "dirty_config must be the absolute name of a module defining dirty hooks,"
                f" a str like 'myproject.dirty_hooks' (got {config_module!r})"
            )
        if config_module:
            try:
                module = importlib.import_module(config_module)
            except Exception as exc:
                # Whatever the module raises at import (a SyntaxError too) is a bad setting.
                raise DirtyConfigError(
                    f"dirty_config: cannot import module {config_module!r}"
                    f" ({type(exc).__name__}: {exc})"
                ) from exc
            for name in HOOKS:
                if name not in hooks and callable(getattr(module, name, None)):
                    hooks[name] = f"{config_module}:{name}"
        known = {f.name for f in attrs.fields(cls)} - {"hooks"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise DirtyConfigError(
                f"[dirty] has unknown settings {unknown}; known: {sorted(known | set(HOOKS))}"
            )
        for key in ("dirty_timeout", "dirty_graceful_timeout", "dirty_app_load_timeout"):
            if key in table and isinstance(table[key], int) and not isinstance(table[key], bool):
                table[key] = float(table[key])
        return cls(**table, hooks=hooks)


def _load(path: str, what: str) -> Callable[..., Any]:
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise DirtyConfigError(f"{what} must be a 'module:attr' path (got {path!r})")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:
        # An empty or relative module name (ValueError, TypeError) or a module raising at
        # import is as much a bad path as a missing one.
        raise DirtyConfigError(
            f"{what}: cannot load {path!r} ({type(exc).__name__}: {exc})"
        ) from exc
    if not callable(obj):
        raise DirtyConfigError(f"{what}: {path!r} is not callable")
    return obj


def _check_importable(fn: Callable[..., Any], what: str) -> None:
    """Refuse a callable the worker process cannot find again by its ``module:qualname`` (the
    path the pool sends it): a lambda, a local function, a partial, a callable object, or a
    function of ``__main__`` (the worker's ``__main__`` is not the node's)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    path = f"{module}:{qualname}"
    found: Any = None
    if isinstance(module, str) and isinstance(qualname, str) and module != "__main__":
        try:
            found = _load(path, what)
        except DirtyConfigError:
            found = None
    if found is not fn:
        raise DirtyConfigError(
            f"{what} runs in the worker process, which imports it by path: it must be a"
            f" module-level function of an importable module or a 'module:attr' path"
            f" (got {fn!r}, not importable as {path!r})"
        )


def _check_arity(fn: Callable[..., Any], what: str, given: Any) -> None:
    """Refuse a hook that cannot take the arguments it is called with (Gunicorn's
    validate_callable)."""
    params = _HOOK_PARAMS[what]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # (a builtin without a signature: nothing to check against)
    try:
        signature.bind(*[None] * len(params))
    except TypeError as exc:
        raise DirtyConfigError(
            f"{what} is called with ({', '.join(params)}), but {given!r} takes {signature};"
            f" give it {len(params)} positional parameter(s)"
        ) from exc


def minimum_workers(specs: Sequence[AppSpec]) -> int:
    """The largest per-app N (at least 1): the pool never scales below it."""
    return max([1, *(s.workers for s in specs if s.workers is not None)])


def apps_for_new_worker(specs: Sequence[AppSpec], holders: Mapping[str, int]) -> list[str]:
    """The apps a new worker loads (Gunicorn's rule): every unlimited app, and each limited app
    whose holders number fewer than its N."""
    return [
        s.import_path
        for s in specs
        if s.workers is None or holders.get(s.import_path, 0) < s.workers
    ]


def initial_allocation(specs: Sequence[AppSpec], count: int) -> list[list[str]]:
    """The apps of workers 1..count, as Gunicorn assigns them: workers 1..N get an app limited
    to N. A worker that would get no app is not started (Gunicorn skips it too)."""
    holders: dict[str, int] = {}
    out = []
    for _ in range(count):
        apps = apps_for_new_worker(specs, holders)
        if not apps:
            break
        for path in apps:
            holders[path] = holders.get(path, 0) + 1
        out.append(apps)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``--dirty-*`` flags to ``python -m otp.node``."""
    g = parser.add_argument_group("dirty pool (apps.dirty)")
    g.add_argument(
        "--dirty-app",
        dest="dirty_apps",
        action="append",
        default=None,
        metavar="MODULE:CLASS[:N]",
        help="a DirtyApp to host (repeatable); :N limits it to N workers",
    )
    g.add_argument("--dirty-workers", type=int, default=None, metavar="N", help="worker processes")
    g.add_argument(
        "--dirty-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="kill and replace a worker silent or busy on one call this long (default 300, 0 off)",
    )
    g.add_argument(
        "--dirty-threads", type=int, default=None, metavar="N", help="threads per worker"
    )
    g.add_argument(
        "--dirty-graceful-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time in-flight calls get on shutdown/reload (default 30)",
    )
    g.add_argument(
        "--dirty-app-load-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="time a worker may take to load its apps (default: dirty_timeout, 0 no limit)",
    )
    g.add_argument(
        "--dirty-max-requests",
        type=int,
        default=None,
        metavar="N",
        help="replace a worker, gracefully, after N calls (default 0: never)",
    )
    g.add_argument(
        "--dirty-max-requests-jitter",
        type=int,
        default=None,
        metavar="N",
        help="add a random 0..N to each worker's --dirty-max-requests",
    )
    g.add_argument(
        "--dirty-max-workers",
        type=int,
        default=None,
        metavar="N",
        help="the most workers MANAGE add / SIGTTIN may reach (default 64)",
    )
    g.add_argument(
        "--dirty-socket", default=None, metavar="PATH", help="Unix socket clients connect to"
    )
    g.add_argument("--dirty-pidfile", default=None, metavar="PATH", help="PID file ('' for none)")
    g.add_argument(
        "--dirty-config", default=None, metavar="MODULE", help="a module defining dirty hooks"
    )
