"""DirtyApp, the base class of what dirty workers host, and ``module:Class[:N]`` specs.

Mirrors ``gunicorn.dirty.app``: ``__init__`` is cheap, ``init()`` runs once in the worker
process (load models there), ``__call__(action, *args, **kwargs)`` dispatches to a public method,
``close()`` runs at shutdown. ``workers = N`` limits how many workers load the app (a config spec
``module:Class:N`` wins over it); ``stashes = [...]`` names stash tables created at start.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from ._errors import DirtyAppError, DirtyConfigError

__all__ = ["AppSpec", "DirtyApp", "DirtyWorkerInfo", "load_dirty_app", "parse_dirty_app_spec"]


class DirtyApp:
    """Base class for dirty applications (Gunicorn's ``DirtyApp``).

    Instance state persists across requests for the life of the worker. With
    ``dirty_threads > 1`` several requests run at once in one worker, so the app must be
    thread-safe. An action may return a value (TLV-encodable: None, bool, int, float, bytes, str,
    list, dict), or a sync or async generator, which is streamed to the caller chunk by chunk;
    ``async def`` actions run on the worker's asyncio loop.
    """

    #: How many workers load this app; None means every worker.
    workers: ClassVar[int | None] = None
    #: Stash tables the pool creates when it starts.
    stashes: ClassVar[Sequence[str]] = ()

    def init(self) -> None:
        """Load resources; called once in the worker process, before any request."""

    def __call__(self, action: str, *args: Any, **kwargs: Any) -> Any:
        """Run the public method named ``action``.

        Raises:
            ValueError: No such action, or it names a private (``_``) attribute.
        """
        method = getattr(self, action, None)
        if method is None or action.startswith("_") or not callable(method):
            raise ValueError(f"Unknown action: {action}")
        return method(*args, **kwargs)

    def close(self) -> None:
        """Release resources; called when the worker shuts down."""


def _positive(_inst: Any, _attr: Any, value: int | None) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise DirtyConfigError(f"AppSpec.workers must be an int >= 1 or None (got {value!r})")


@attrs.frozen
class AppSpec:
    """One configured app: its import path and how many workers load it (None: all)."""

    import_path: str
    workers: int | None = attrs.field(default=None, validator=_positive)


def parse_dirty_app_spec(spec: str) -> tuple[str, int | None]:
    """``"module:Class"`` -> ``("module:Class", None)``; ``"module:Class:N"`` -> ``(..., N)``.

    Raises:
        DirtyAppError: The spec is not ``module:Class`` or ``module:Class:N`` with N >= 1
            (Gunicorn raises the same class).
    """
    parts = spec.split(":")
    if len(parts) == 2 and all(parts):
        return spec, None
    if len(parts) == 3 and parts[0] and parts[1]:
        try:
            count = int(parts[2])
        except ValueError:
            raise DirtyAppError(
                f"Invalid worker count in spec: {spec}. Expected integer, got '{parts[2]}'",
                app_path=spec,
            ) from None
        if count < 1:
            raise DirtyAppError(
                f"Invalid worker count in spec: {spec}. Worker count must be >= 1",
                app_path=spec,
            )
        return f"{parts[0]}:{parts[1]}", count
    raise DirtyAppError(
        f"Invalid import path format: {spec}. Expected 'module.path:ClassName' or"
        " 'module.path:ClassName:N'",
        app_path=spec,
    )


def _import_class(import_path: str) -> Any:
    module_name, _, attr = import_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        # Not only ImportError: a relative name (TypeError), a SyntaxError or whatever the
        # module raises at import is as much a bad setting, and must be reported as one.
        raise DirtyAppError(
            f"cannot import module {module_name!r} of dirty app {import_path}"
            f" ({type(exc).__name__}: {exc})",
            app_path=import_path,
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise DirtyAppError(
                f"module {module_name!r} has no attribute {attr!r} (dirty app {import_path})",
                app_path=import_path,
            ) from None
    return obj


#: What the worker calls on an app (Gunicorn's load_dirty_app requires the same three).
_REQUIRED_METHODS = ("init", "__call__", "close")


def _missing_method(obj: Any) -> str | None:
    """The first required method that ``obj`` lacks; for a class, that its instances lack."""
    for name in _REQUIRED_METHODS:
        if isinstance(obj, type) and name == "__call__":
            # Every class has a __call__ (its metaclass's, which builds an instance); its
            # instances are callable only if the class or a base defines one.
            method = next((vars(k)[name] for k in obj.__mro__ if name in vars(k)), None)
        else:
            method = getattr(obj, name, None)
        if not callable(method):
            return name
    return None


def _stash_names(cls: Any, import_path: str) -> list[str]:
    names = getattr(cls, "stashes", None) or ()
    if isinstance(names, str):
        return [names]
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise DirtyConfigError(
            f"{import_path}.stashes must be a str or a list of str, the names of the stash"
            f" tables to create (got {names!r})"
        )
    return list(names)


def resolve_app_spec(spec: str) -> AppSpec:
    """Parse ``spec``, check that it names a dirty app, and, without ``:N``, take the limit
    from the class's ``workers``.

    Raises:
        DirtyAppError: The spec is malformed, or its module or class cannot be loaded.
        DirtyConfigError: It is not a dirty app (no ``init``, ``__call__`` or ``close``), or
            its ``workers`` (without ``:N``) or ``stashes`` is invalid.
    """
    import_path, count = parse_dirty_app_spec(spec)
    cls = _import_class(import_path)
    missing = _missing_method(cls)
    if missing is not None:
        raise DirtyConfigError(
            f"dirty_apps: {import_path} is not a dirty app: it has no {missing}() method"
            " (subclass apps.dirty.DirtyApp, which has init, __call__ and close)"
        )
    _stash_names(cls, import_path)
    if count is None:
        limit = getattr(cls, "workers", None)
        if limit is not None and (type(limit) is not int or limit < 1):
            raise DirtyConfigError(
                f"{import_path}.workers must be an int >= 1 or None (got {limit!r})"
            )
        count = limit
    return AppSpec(import_path, count)


def app_stashes(import_path: str) -> list[str]:
    """The stash tables the app's class declares (``stashes = [...]``).

    Raises:
        DirtyConfigError: ``stashes`` is not a str or a list of str.
    """
    return _stash_names(_import_class(import_path), import_path)


def load_dirty_app(import_path: str) -> Any:
    """Import ``module:Class`` and instantiate it (``init()`` is not called).

    Raises:
        DirtyAppError: The module or class cannot be loaded, its constructor raised, or the
            app lacks ``init``, ``__call__`` or ``close`` (Gunicorn's messages).
    """
    cls = _import_class(import_path)
    if isinstance(cls, type):
        try:
            app = cls()
        except Exception as exc:
            raise DirtyAppError(
                f"Failed to instantiate {import_path}: {exc}", app_path=import_path
            ) from exc
    else:
        app = cls
    missing = _missing_method(app)
    if missing is not None:
        raise DirtyAppError(
            f"{import_path} is missing required method: {missing}", app_path=import_path
        )
    return app


@attrs.frozen
class DirtyWorkerInfo:
    """What hooks are told about a worker.

    Attributes:
        worker_id: The pool's number for it (a replacement keeps its predecessor's apps and id).
        pid: The worker's OS pid (None before it started).
        apps: The import paths of the apps it hosts.
    """

    worker_id: int
    pid: int | None
    apps: tuple[str, ...]
