"""The command line: ``python -m otp.node [--name N] [--app module:attr ...] ...``."""

from __future__ import annotations

import gc
import sys

import trio

from ._boot import resolve_application, serve
from ._config import DEFAULT_APPS, ConfigError, load_config
from ._logs import configure_node_logging

#: Exit code when the configuration is invalid (argparse's own usage errors exit 2 as well).
EXIT_CONFIG_ERROR = 2

#: The node's collector thresholds (CPython's defaults: 700, 10, 10). A node's messages,
#: frames and records are young objects that die young: a youngest generation of 700 was
#: collected hundreds of times a second under load (~5% of a busy server's CPU, issue 15),
#: each collection finding next to nothing. 10,000 allocations (less deallocations) between
#: collections make them rare; a cycle still goes within a young collection or two.
GC_THRESHOLDS = (10_000, 20, 100)


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """Parse ``argv``, boot the node, run it until it stops; returns the process exit code.

    ``own_process`` (``python -m otp.node``): the process is the node's alone, so its garbage
    collector is tuned for it (:func:`tune_gc`) once the applications are loaded."""
    try:
        config = load_config(argv)
        configure_node_logging(config)
        applications = [resolve_application(path, config) for path in config.apps or DEFAULT_APPS]
        if own_process:
            tune_gc()
        return trio.run(serve, config, applications)
    except* ConfigError as group:
        # One found while booting (a --listen that cannot be bound) comes wrapped in the
        # node's nurseries' exception groups.
        errors = _leaves(group)
    for exc in errors:
        print(f"python -m otp.node: {exc}", file=sys.stderr)
    return EXIT_CONFIG_ERROR


def tune_gc() -> None:
    """Set the node process's collector thresholds (``GC_THRESHOLDS``) and freeze what
    booting allocated (modules, classes, configuration: alive for the node's life), so an old
    generation's collection does not walk them again and again (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _leaves(group: BaseExceptionGroup[ConfigError]) -> list[ConfigError]:
    leaves: list[ConfigError] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves
