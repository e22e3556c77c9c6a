"""Hooks the tests configure (by path, or found by name in this ``dirty_config`` module).

The node-side hooks record into CALLS (the pool runs in the test's process); the worker-side one
leaves a mark in the worker's environment, which LogApp.env reports. A USR1 test also needs a log
file in the worker: ``dirty_worker_init`` opens one when DIRTY_TEST_WORKER_LOG is set.
"""

from __future__ import annotations

import logging
import os
from typing import Any

CALLS: list[tuple[str, Any]] = []


def on_dirty_starting(ctx: Any) -> None:
    CALLS.append(("on_dirty_starting", ctx.socket_path))


def dirty_post_fork(ctx: Any, info: Any) -> None:
    CALLS.append(("dirty_post_fork", info))


def dirty_worker_init(info: Any) -> None:
    os.environ["DIRTY_TEST_INIT"] = f"{info.worker_id}:{info.pid}:{','.join(info.apps)}"
    path = os.environ.get("DIRTY_TEST_WORKER_LOG")
    if path:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger().addHandler(handler)


def dirty_worker_exit(ctx: Any, info: Any) -> None:
    CALLS.append(("dirty_worker_exit", info))


def note_post_fork(ctx: Any, info: Any) -> None:
    """``dirty_post_fork`` that records (in the node) when it ran for which worker."""
    with open(os.environ["DIRTY_TEST_ORDER"], "a") as log:
        log.write(f"dirty_post_fork {info.pid}\n")


def note_worker_init(info: Any) -> None:
    """``dirty_worker_init`` that records (in the worker) when it ran."""
    with open(os.environ["DIRTY_TEST_ORDER"], "a") as log:
        log.write(f"dirty_worker_init {os.getpid()}\n")
