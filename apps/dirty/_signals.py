"""The pool's signal handler process: HUP reloads every worker, USR1 reopens log files (the
node's and the workers'), TTIN/TTOU add/remove a worker, QUIT stops at once. (SIGTERM and
SIGINT belong to the node, which stops its applications gracefully: the pool drains.)"""

from __future__ import annotations

import logging
import os
import signal

import trio

import otp

from ._context import ROUTER, ForwardSignal, PoolContext
from ._logs import reopen_log_files
from ._pidfile import remove_pidfile

logger = logging.getLogger("apps.dirty")

SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGTTIN, signal.SIGTTOU, signal.SIGQUIT)


async def start_signals(ctx: PoolContext) -> otp.Pid:
    """Start the signal handler process linked to the caller."""
    return otp.spawn_link(_signal_loop, ctx)


async def _signal_loop(ctx: PoolContext) -> None:
    # Each signal is handled in a task of its own: a QUIT is not held up behind a HUP whose
    # reload is still starting workers (the router queues HUP/TTIN/TTOU in arrival order).
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(*SIGNALS) as signals:
            async for signum in signals:
                nursery.start_soon(_handle_logged, ctx, signum)


async def _handle_logged(ctx: PoolContext, signum: int) -> None:
    name = signal.Signals(signum).name
    logger.info("dirty pool: %s", name)
    try:
        await _handle(ctx, signum)
    except (otp.CallError, otp.CallTimeout) as exc:
        logger.error("dirty pool: %s not handled: %s", name, exc)


async def _handle(ctx: PoolContext, signum: int) -> None:
    if signum == signal.SIGHUP:
        await otp.call(ROUTER, "reload", timeout=None)
    elif signum == signal.SIGUSR1:
        reopen_log_files()
        otp.cast(ROUTER, ForwardSignal(signal.SIGUSR1))
    elif signum == signal.SIGTTIN:
        await otp.call(ROUTER, ("add", 1), timeout=None)
    elif signum == signal.SIGTTOU:
        await otp.call(ROUTER, ("remove", 1), timeout=None)
    elif signum == signal.SIGQUIT:
        workers = await otp.call(ROUTER, "workers")
        for info in workers.values():
            if info.os_pid:
                try:
                    os.kill(info.os_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # Immediate, but tidy (as Gunicorn's QUIT): no PID file or socket is left behind.
        remove_pidfile(ctx.config.dirty_pidfile)
        try:
            os.unlink(ctx.socket_path)
        except OSError:
            pass
        logging.shutdown()
        os._exit(0)
