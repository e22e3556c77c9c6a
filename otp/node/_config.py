"""Node configuration: command-line flags and an optional ``node.toml``, flags winning."""

from __future__ import annotations

import argparse
import importlib
import logging
import tomllib
from pathlib import Path
from typing import Any

import attrs

DEFAULT_APP = "otp.node._demo:demo_application"


class ConfigError(ValueError):
    """The node's configuration is invalid; the message says which setting and what to do."""


def _check_level(_inst: Any, _attr: Any, value: str) -> None:
    if value.upper() not in logging.getLevelNamesMapping():
        raise ConfigError(
            f"log_level must be one of debug, info, warning, error, critical (got {value!r})"
        )


@attrs.frozen
class NodeConfig:
    """What a node runs.

    Attributes:
        name: The node's name (Erlang's ``name@host``).
        apps: Applications to start, in order, as ``module:attr`` paths; empty means the
            embedded default.
        log_level: The root logger's level.
        settings: Every other setting, by application (``[app_name]`` tables of node.toml and
            the flags applications add), for the applications to read.
    """

    name: str = "nonode@nohost"
    apps: tuple[str, ...] = ()
    log_level: str = attrs.field(default="info", validator=_check_level)
    settings: dict[str, Any] = attrs.field(factory=dict)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m otp.node",
        description=(
            "Boot an otp-runtime node. With no --app it runs the embedded default. SIGINT or"
            " SIGTERM stops it gracefully (exit code 0); a second SIGINT stops it at once."
        ),
    )
    p.add_argument("--name", help="node name (default: nonode@nohost)")
    p.add_argument(
        "--app",
        action="append",
        default=None,
        metavar="MODULE:ATTR",
        help="an application to start (repeatable; started in order, stopped in reverse)",
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error", "critical"],
        help="logging level (default: info)",
    )
    p.add_argument("--config", type=Path, metavar="PATH", help="a node.toml file")
    return p


def load_config(argv: list[str] | None = None) -> NodeConfig:
    """Build the configuration from ``argv`` (and the node.toml it names); flags win."""
    args = parser().parse_args(argv)
    data: dict[str, Any] = {}
    if args.config is not None:
        try:
            data = tomllib.loads(args.config.read_text())
        except OSError as exc:
            raise ConfigError(f"--config {args.config}: cannot read it ({exc})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config {args.config}: not valid TOML ({exc})") from exc
    node = data.pop("node", {})
    apps = args.app if args.app is not None else node.get("apps", [])
    if not isinstance(apps, list) or not all(isinstance(a, str) for a in apps):
        raise ConfigError(f"node.apps must be a list of 'module:attr' strings (got {apps!r})")
    return NodeConfig(
        name=args.name or node.get("name", "nonode@nohost"),
        apps=tuple(apps),
        log_level=args.log_level or node.get("log_level", "info"),
        settings=data,
    )


def load_object(path: str) -> Any:
    """Import ``module:attr`` (attr may be dotted) and return the object.

    Raises:
        ConfigError: the path is malformed, the module cannot be imported or lacks the attribute.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"an application is named as 'module:attr' (got {path!r})")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj
