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

__all__ = ["AppSpec", "DirtyApp", "load_dirty_app", "parse_dirty_app_spec"]


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
    except ImportError as exc:
        raise DirtyAppError(
            f"cannot import module {module_name!r} of dirty app {import_path}: {exc}",
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


def resolve_app_spec(spec: str) -> AppSpec:
    """Parse ``spec`` and, without ``:N``, take the limit from the class's ``workers``."""
    import_path, count = parse_dirty_app_spec(spec)
    if count is None:
        cls = _import_class(import_path)
        limit = getattr(cls, "workers", None)
        if limit is not None and (type(limit) is not int or limit < 1):
            raise DirtyConfigError(
                f"{import_path}.workers must be an int >= 1 or None (got {limit!r})"
            )
        count = limit
    return AppSpec(import_path, count)


def app_stashes(import_path: str) -> list[str]:
    """The stash tables the app's class declares (``stashes = [...]``)."""
    cls = _import_class(import_path)
    names = getattr(cls, "stashes", ()) or ()
    if isinstance(names, str):
        names = [names]
    return [str(n) for n in names]


def load_dirty_app(import_path: str) -> Any:
    """Import ``module:Class`` and instantiate it (``init()`` is not called).

    Raises:
        DirtyAppError: The module or class cannot be loaded, or it is not a callable app.
    """
    cls = _import_class(import_path)
    app = cls() if isinstance(cls, type) else cls
    if not callable(app):
        raise DirtyAppError(
            f"dirty app {import_path} is a {type(app).__name__}, not a DirtyApp",
            app_path=import_path,
        )
    return app
