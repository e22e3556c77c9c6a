"""The command line: ``python -m otp.node [--name N] [--app module:attr ...] ...``."""

from __future__ import annotations

import logging
import sys

import trio

from ._boot import resolve_application, serve
from ._config import DEFAULT_APPS, ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, boot the node, run it until it stops; returns the process exit code."""
    try:
        config = load_config(argv)
        logging.basicConfig(
            level=config.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        applications = [resolve_application(path, config) for path in config.apps or DEFAULT_APPS]
    except ConfigError as exc:
        print(f"python -m otp.node: {exc}", file=sys.stderr)
        return 2
    return trio.run(serve, config, applications)
