"""A worker's lifecycle as the node sees it: the load (Gunicorn's worker boot) and the drain.

The worker says which app it is loading (a STATUS notice, id 0, ``{"loading": path}``), that
it is done (RESPONSE id 0, ``{"pid": ...}``) or that an app failed (ERROR id 0, a DirtyAppError
carrying the app's traceback). Meanwhile the node logs progress ("dirty worker 2 loading
myapp:MLApp, 30 s"), and gives up at ``dirty_app_load_timeout``. A worker sent SIGTERM
(by anyone but the node) says so with the STATUS notice ``DRAINING`` (id 0): the node routes no
more calls to it and closes its socket once its calls are answered.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

import wire

from ._errors import (
    DirtyAppError,
    DirtyError,
    DirtyProtocolError,
    DirtyWorkerError,
    error_from_dict,
)
from ._protocol import ERROR, RESPONSE, STATUS, decode_payload

logger = logging.getLogger("apps.dirty")

#: The body of the worker's STATUS notice (id 0) that it got SIGTERM and drains.
DRAINING = wire.tlv_encode("draining", version=1)
#: How long a new worker process may take to come up (the interpreter and its imports) and
#: start loading its apps; ``dirty_app_load_timeout`` counts from then (Gunicorn forks: its
#: workers have no such phase).
BOOT_TIMEOUT = 60.0
#: How often a load in progress is logged (a quarter of the load timeout, if that is less).
PROGRESS_EVERY = 30.0


def loading_notice(path: str) -> bytes:
    """The worker's notice that it now loads the app ``path``."""
    return wire.encode_dirty(STATUS, 0, {"loading": path})


def _progress_every(timeout: float | None) -> float:
    if timeout is None:
        return PROGRESS_EVERY
    return max(0.05, min(PROGRESS_EVERY, timeout / 4))


async def await_loaded(
    stream: trio.SocketStream, worker_id: int, apps: tuple[str, ...], timeout: float | None
) -> None:
    """Return once the worker on ``stream`` has loaded ``apps``.

    Raises:
        DirtyAppError: An app failed to load (its message and ``traceback`` are the app's).
        DirtyWorkerError: The worker exited while loading, did not start loading within
            ``BOOT_TIMEOUT``, or loaded for longer than ``timeout`` seconds (None: no limit).
    """
    splitter = wire.FrameSplitter(error=DirtyProtocolError)
    current = apps[0] if apps else "its apps"
    began = trio.current_time()
    every = _progress_every(timeout)
    deadline = began + BOOT_TIMEOUT
    booting = True
    while True:
        now = trio.current_time()
        if now >= deadline:
            if booting:
                raise DirtyWorkerError(
                    f"dirty worker {worker_id} did not start within {BOOT_TIMEOUT:g}s",
                    worker_id=worker_id,
                )
            raise DirtyWorkerError(
                f"dirty worker {worker_id} did not load {current} within"
                f" dirty_app_load_timeout={timeout:g}s; it was killed",
                worker_id=worker_id,
            )
        data = None
        with trio.move_on_at(min(deadline, now + every)):
            data = await stream.receive_some(65536)
        if data is None:
            if trio.current_time() < deadline and not booting:
                logger.info(
                    "dirty worker %d loading %s, %.0f s",
                    worker_id,
                    current,
                    trio.current_time() - began,
                )
            continue
        if not data:
            raise DirtyWorkerError(
                f"dirty worker {worker_id} exited while loading {current};"
                " see its log for the traceback",
                worker_id=worker_id,
            )
        for mtype, rid, payload in splitter.feed(data):
            if rid != 0:
                continue
            if mtype == RESPONSE:
                return
            if mtype == STATUS and payload:
                current = str(decode_payload(payload).get("loading", current))
                if booting:  # the apps' load begins: dirty_app_load_timeout counts from now
                    booting = False
                    began = trio.current_time()
                    deadline = began + timeout if timeout is not None else float("inf")
            elif mtype == ERROR:
                raise _load_error(payload, current)


def _load_error(payload: bytes, current: str) -> DirtyError:
    try:
        error: Any = decode_payload(payload)["error"]
        exc = error_from_dict(error)
    except Exception:  # (a garbled report: the failure is still the app's)
        exc = DirtyAppError(f"{current} failed to load", app_path=current)
    return exc
