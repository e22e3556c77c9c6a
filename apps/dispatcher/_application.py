"""The dispatcher application: a root supervisor (``rest_for_one``) over the ``Dispatcher``
server and its runner, configured from the node's settings (the ``[dispatcher]`` table of
node.toml). OTP's application resource file, as a function of the node's configuration."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import supervisors
from otp import node

from ._config import DispatcherConfig
from ._errors import ConfigurationError
from ._observer import observer_view
from ._server import dispatcher_supervisor_spec
from ._tool import Tool, ToolRegistry


def _load_tools(paths: Any) -> ToolRegistry:
    if isinstance(paths, str) or not isinstance(paths, Iterable):
        raise ConfigurationError(
            "[dispatcher] tools must be a list of 'module:attr' paths, each naming a Tool, a"
            f" list of Tools or a ToolRegistry (got {paths!r})"
        )
    registry = ToolRegistry()
    for path in paths:
        found = node.load_object(path)
        tools = [found] if isinstance(found, Tool) else list(found)
        for tool in tools:
            if not isinstance(tool, Tool):
                raise ConfigurationError(
                    f"[dispatcher] tools: {path} holds {tool!r}, which is not a Tool"
                )
            registry.register(tool)
    return registry


def application(
    config: node.NodeConfig | None = None,
    *,
    tools: ToolRegistry | Iterable[Tool] | None = None,
) -> supervisors.Application:
    """The dispatcher application, for ``python -m otp.node --app apps.dispatcher`` or
    ``supervisors.start_application``.

    Settings come from ``config.settings["dispatcher"]``: the :class:`DispatcherConfig`
    fields (``name``, ``result_ttl``, ``max_concurrency``, ``seed``, ``max_arg_depth``,
    ``max_pattern_steps``) and ``tools``, a list of ``module:attr`` paths naming Tools (or
    lists of them, or a ToolRegistry). ``tools=`` gives the tools directly. More tools can be
    registered while it runs (:func:`register_tool`); they survive a restart of the
    dispatcher, which keeps its registry.

    Raises:
        ConfigurationError: a setting is invalid.
        otp.node.ConfigError: a tool path cannot be imported.
    """
    settings = dict(config.settings.get("dispatcher", {})) if config is not None else {}
    dispatcher_config = DispatcherConfig.from_settings(settings)
    if tools is None:
        registry = _load_tools(settings.get("tools", []))
    elif isinstance(tools, ToolRegistry):
        registry = tools
    else:
        registry = ToolRegistry(list(tools))
    return supervisors.Application(
        "dispatcher",
        dispatcher_supervisor_spec(registry, dispatcher_config),
        env={key: value for key, value in settings.items() if key != "tools"},
        description="function-call dispatcher",
        version="0.1.0",
        observer_view=functools.partial(observer_view, dispatcher_config.name),
    )
