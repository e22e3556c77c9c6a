"""The command line: ``python -m otp.node [--name N] [--app module:attr ...] ...``."""

from __future__ import annotations

import sys

import trio

from ._boot import resolve_application, serve
from ._config import DEFAULT_APPS, ConfigError, load_config
from ._logs import configure_logging

#: Exit code when the configuration is invalid (argparse's own usage errors exit 2 as well).
EXIT_CONFIG_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, boot the node, run it until it stops; returns the process exit code."""
    try:
        config = load_config(argv)
        configure_logging(config.log_level, config.log_format, config.name)
        applications = [resolve_application(path, config) for path in config.apps or DEFAULT_APPS]
        return trio.run(serve, config, applications)
    except* ConfigError as group:
        # One found while booting (a --listen that cannot be bound) comes wrapped in the
        # node's nurseries' exception groups.
        errors = _leaves(group)
    for exc in errors:
        print(f"python -m otp.node: {exc}", file=sys.stderr)
    return EXIT_CONFIG_ERROR


def _leaves(group: BaseExceptionGroup[ConfigError]) -> list[ConfigError]:
    leaves: list[ConfigError] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves
