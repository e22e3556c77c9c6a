"""The dirty pool as an OTP application: ``dirty_sup`` and its configuration.

``dirty_sup`` (rest_for_one) starts, in order: the stash (a supervisor over the table owners'
DynamicSupervisor and the stash manager), the connections' DynamicSupervisor, the pool (a
DynamicSupervisor of worker proxies), the router (a GenServer; it starts the workers), the
signal handler and the listener (a GenServer owning the socket, with a linked acceptor starting
connection processes under the connections' supervisor). Stopping runs in reverse: the
listener stops accepting, the router stops routing, the workers drain their in-flight calls
(concurrently, up to ``dirty_graceful_timeout``) while their connections are still there to
deliver the replies.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from typing import Any

import attrs

import supervisors
from otp import node

from ._app import app_stashes
from ._config import DirtyConfig
from ._context import ROUTER, PoolContext
from ._errors import DirtyAppError, DirtyConfigError
from ._listener import CONNECTIONS, start_listener
from ._observer import observer_view, ready
from ._pidfile import kill_orphans
from ._router import POOL, Router
from ._signals import start_signals
from ._stash import MANAGER, TABLES, StashManager
from .examples import EXAMPLE_APP

logger = logging.getLogger("apps.dirty")

__all__ = ["application", "default_application", "dirty_supervisor_spec"]


def _default_socket() -> str:
    return os.path.join(tempfile.gettempdir(), f"otp-dirty-{os.getpid()}.sock")


def dirty_supervisor_spec(ctx: PoolContext) -> tuple[supervisors.SupFlags, list[Any]]:
    """``(flags, children)`` of ``dirty_sup``."""
    config = ctx.config
    stashes: list[str] = []
    for spec in config.dirty_apps:
        for name in app_stashes(spec.import_path):
            if name not in stashes:
                stashes.append(name)
    workers = max(1, config.worker_count)
    children: list[Any] = [
        supervisors.ChildSpec(
            "stash",
            (_start_stash_sup, tuple(stashes)),
            type="supervisor",
        ),
        supervisors.ChildSpec(
            "connections",
            (_start_named_dynamic, CONNECTIONS, 100, 5),
            type="supervisor",
        ),
        supervisors.ChildSpec(
            "pool",
            (_start_named_dynamic, POOL, 10 * workers + 10, 10),
            type="supervisor",
        ),
        supervisors.ChildSpec("router", (_start_router, ctx), shutdown=5.0),
    ]
    if config.handle_signals:
        children.append(
            supervisors.ChildSpec("signals", (start_signals, ctx), shutdown="brutal_kill")
        )
    children.append(supervisors.ChildSpec("listener", (start_listener, ctx), shutdown=2.0))
    return supervisors.SupFlags(strategy="rest_for_one", intensity=3, period=5), children


async def _start_stash_sup(stashes: tuple[str, ...]) -> Any:
    flags = supervisors.SupFlags(strategy="rest_for_one", intensity=3, period=5)
    children = [
        supervisors.ChildSpec("tables", (_start_named_dynamic, TABLES, 100, 5), type="supervisor"),
        supervisors.ChildSpec("manager", (_start_stash_manager, stashes)),
    ]
    return await supervisors.Supervisor.start_link(flags, children, name="dirty_stash_sup")


async def _start_stash_manager(stashes: tuple[str, ...]) -> Any:
    return await StashManager.start_link(stashes, name=MANAGER)


async def _start_named_dynamic(name: str, intensity: int, period: int) -> Any:
    return await supervisors.DynamicSupervisor.start_link(
        name=name, intensity=intensity, period=period
    )


async def _start_router(ctx: PoolContext) -> Any:
    hook = ctx.config.hook("on_dirty_starting")
    if hook is not None:
        try:
            hook(ctx)
        except Exception:
            logger.exception("dirty hook on_dirty_starting failed")
    if ctx.config.dirty_pidfile and not kill_orphans(ctx.config.dirty_pidfile):
        ctx = attrs.evolve(ctx, config=attrs.evolve(ctx.config, dirty_pidfile=""))
    return await Router.start_link(ctx, name=ROUTER)


async def start_dirty_sup(ctx: PoolContext) -> Any:
    """Start ``dirty_sup`` linked to the caller (with no children if the pool is disabled)."""
    if not ctx.config.enabled:
        logger.info("dirty pool disabled: dirty_workers = 0 and no dirty_apps")
        flags = supervisors.SupFlags(strategy="one_for_one")
        return await supervisors.Supervisor.start_link(flags, [], name="dirty_sup")
    flags, children = dirty_supervisor_spec(ctx)
    return await supervisors.Supervisor.start_link(flags, children, name="dirty_sup")


def application(
    config: node.NodeConfig | None = None, *, dirty_config: DirtyConfig | None = None
) -> supervisors.Application:
    """The dirty pool application, for ``python -m otp.node --app apps.dirty`` or
    ``supervisors.start_application``.

    Settings come from ``dirty_config`` if given, else from the node's ``[dirty]`` table and
    ``--dirty-*`` flags (see :class:`DirtyConfig`).

    Raises:
        DirtyConfigError: A setting is invalid (a malformed app spec, or an app class that
            cannot be imported, too).
    """
    if dirty_config is None:
        dirty_config = _from_settings(config.settings if config is not None else {})
    level = config.log_level.upper() if config is not None else "INFO"
    ctx = PoolContext(dirty_config, dirty_config.dirty_socket or _default_socket(), level)
    return supervisors.Application(
        "dirty",
        (start_dirty_sup, ctx),
        env={"socket": ctx.socket_path},
        description=(
            (
                f"dirty worker pool, {dirty_config.worker_count} worker(s) hosting"
                f" {', '.join(dirty_config.apps_paths) or 'no apps'};"
                f" clients: export GUNICORN_DIRTY_SOCKET={ctx.socket_path}"
            )
            if dirty_config.enabled
            else "dirty worker pool, disabled (dirty_workers = 0, no dirty_apps)"
        ),
        version="0.1.0",
        observer_view=functools.partial(observer_view, ctx),
        ready=functools.partial(ready, ctx),
    )


def default_application(config: node.NodeConfig | None = None) -> supervisors.Application:
    """The pool as ``python -m otp.node`` runs it with no ``--app``: the node's ``[dirty]``
    settings, hosting the bundled :mod:`apps.dirty.examples` app unless they name apps.

    The banner prints the socket clients use (``GUNICORN_DIRTY_SOCKET=...``).
    """
    settings = dict(config.settings) if config is not None else {}
    table = settings.get("dirty", {})
    if not isinstance(table, dict):
        return application(config)  # (from_settings refuses it, naming [dirty])
    table = dict(table)
    flags = settings.get("flags", {}) or {}
    workers = flags.get("dirty_workers")
    if workers is None:
        workers = table.get("dirty_workers")
    # The embedded default: the bundled app unless the settings name apps, on one worker
    # unless they give a count (dirty_workers = 0 and no apps disables the pool, as anywhere).
    if not table.get("dirty_apps") and not flags.get("dirty_apps") and workers != 0:
        table["dirty_apps"] = [EXAMPLE_APP]
    if workers is None:
        table["dirty_workers"] = 1
    settings["dirty"] = table
    return application(config, dirty_config=_from_settings(settings))


def _from_settings(settings: Any) -> DirtyConfig:
    try:
        return DirtyConfig.from_settings(settings)
    except DirtyAppError as exc:  # (a bad --dirty-app: a setting like any other)
        raise DirtyConfigError(f"dirty_apps: {exc}") from exc
