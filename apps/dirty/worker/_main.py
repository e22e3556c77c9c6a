"""A worker process's boot: wait for the node's go-ahead (its ``dirty_post_fork`` has run),
load the apps in Gunicorn's order while telling the node which is loading, run
``dirty_worker_init``, then serve (:class:`~._server.Worker`) and close the apps at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import traceback
from typing import Any

import wire

from .._app import DirtyWorkerInfo, load_dirty_app
from .._errors import DirtyAppError
from .._lifecycle import loading_notice
from .._logs import reopen_log_files
from .._protocol import error_bytes
from ._server import PARENT_POLL, Worker

logger = logging.getLogger("apps.dirty.worker")


def _load_hook(path: str | None) -> Any:
    if not path:
        return None
    import importlib

    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _exit_if_orphaned_while(done: threading.Event, ppid: int) -> None:
    """Until ``done`` is set: exit at once if the node (``ppid``) dies."""
    while not done.wait(PARENT_POLL):
        if os.getppid() != ppid:
            logger.warning("dirty worker %d: the node died while it loaded its apps", os.getpid())
            os._exit(1)


def _await_go(sock: socket.socket) -> bool:
    """Wait for the node's go-ahead (it has run ``dirty_post_fork``); False if it closed."""
    got = b""
    while len(got) < wire.HEADER_SIZE:
        try:
            part = sock.recv(wire.HEADER_SIZE - len(got))
        except InterruptedError:
            continue
        if not part:
            return False
        got += part
    return True


def _load_apps(sock: socket.socket, paths: list[str]) -> dict[str, Any]:
    """Gunicorn's order: every app's ``__init__``, then every app's ``init()``; the node is told
    which app is loading (its progress log) and, on failure, the app's traceback.

    Raises:
        Exception: What the app raised (reported to the node first).
    """
    apps: dict[str, Any] = {}
    current = ""
    try:
        for current in paths:
            sock.sendall(loading_notice(current))
            apps[current] = load_dirty_app(current)
        for current, app in apps.items():
            sock.sendall(loading_notice(current))
            app.init()
    except Exception as exc:
        tb = "".join(traceback.format_exception(exc))
        error = DirtyAppError(
            f"{current} failed to load: {type(exc).__name__}: {exc}",
            app_path=current,
            traceback=tb,
        )
        try:
            sock.sendall(error_bytes(0, error))
        except OSError:
            pass  # the node is gone
        raise
    return apps


def main(argv: list[str]) -> int:
    """Run a worker from its JSON spec (argv[0]); returns the exit status."""
    spec = json.loads(argv[0])
    logging.basicConfig(
        level=spec.get("log_level", "INFO"),
        format=f"%(asctime)s %(levelname)s dirty-worker[{os.getpid()}] %(name)s: %(message)s",
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, lambda *_: os._exit(0))
    signal.signal(signal.SIGUSR1, lambda *_: reopen_log_files())
    sock = socket.socket(fileno=int(spec["fd"]))
    sock.setblocking(True)
    # Parent-death detection from the start: a worker still loading its apps (a model, say)
    # when the node dies must not be left behind.
    loading = threading.Event()
    threading.Thread(
        target=_exit_if_orphaned_while,
        args=(loading, int(spec["ppid"])),
        name="dirty-parent-watch-load",
        daemon=True,
    ).start()
    info = DirtyWorkerInfo(int(spec["worker_id"]), os.getpid(), tuple(spec["apps"]))
    if not _await_go(sock):
        return 0  # the node stopped before the worker was let go
    try:
        apps = _load_apps(sock, list(spec["apps"]))
        hook = _load_hook(spec.get("worker_init"))
        if hook is not None:
            hook(info)
    except Exception:
        logger.exception("dirty worker %d: loading its apps failed", info.worker_id)
        return 3
    loading.set()  # (the Worker watches its parent from here on)
    worker = Worker(
        apps,
        int(spec["threads"]),
        float(spec["heartbeat"]),
        int(spec["ppid"]),
        float(spec.get("graceful", 30.0)),
    )
    try:
        asyncio.run(worker.serve(sock))
    finally:
        for path, app in apps.items():
            try:
                app.close()
            except Exception:
                logger.exception("dirty app %s: close() failed", path)
    return 0
