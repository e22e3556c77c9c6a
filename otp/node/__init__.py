"""otp.node: boot a node (``python -m otp.node``): configuration, distribution, applications
in order, and an orderly stop on signals."""

from ._boot import banner as banner
from ._boot import resolve_application as resolve_application
from ._boot import serve as serve
from ._config import DEFAULT_APPS as DEFAULT_APPS
from ._config import ConfigError as ConfigError
from ._config import DistSettings as DistSettings
from ._config import NodeConfig as NodeConfig
from ._config import ObserverSettings as ObserverSettings
from ._config import load_config as load_config
from ._config import load_object as load_object
from ._config import parse_observer as parse_observer
from ._logs import configure_logging as configure_logging
from ._logs import configure_node_logging as configure_node_logging
from ._main import main as main
from ._observer import observer_address as observer_address
from ._observer import observer_application as observer_application
from ._observer_agent import AGENT_NAME as AGENT_NAME
from ._observer_agent import ObserverAgent as ObserverAgent
from ._observer_agent import observer_agent_application as observer_agent_application
from ._remote_observer import serve_remote_observer as serve_remote_observer
from ._source import InvalidPid as InvalidPid
from ._source import LocalSource as LocalSource
from ._source import ObserverSource as ObserverSource
from ._source import UnknownPid as UnknownPid
from ._web import ObserverWeb as ObserverWeb

__all__ = [
    "AGENT_NAME",
    "DEFAULT_APPS",
    "ConfigError",
    "DistSettings",
    "NodeConfig",
    "InvalidPid",
    "LocalSource",
    "ObserverAgent",
    "ObserverSettings",
    "ObserverSource",
    "ObserverWeb",
    "UnknownPid",
    "banner",
    "configure_logging",
    "configure_node_logging",
    "load_config",
    "load_object",
    "main",
    "observer_address",
    "observer_agent_application",
    "observer_application",
    "parse_observer",
    "resolve_application",
    "serve",
    "serve_remote_observer",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
