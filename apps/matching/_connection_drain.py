"""A connection's graceful stop (its supervisor's ``shutdown`` exit signal): the drain that
``_connection``'s docstring describes, and the deadline after which what still runs is given up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

import otp
import wire

from . import _matcher
from ._call_ops import cancel_calls
from ._connection_streams import close_stream
from ._dispatch import WorkerDraining

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["DRAIN_GRACE", "STOPPING", "drain", "is_shutdown"]

logger = logging.getLogger("apps.matching")

#: After ``stop_drain_timeout`` a draining connection gives its last answers this long to be
#: written, then drops.
DRAIN_GRACE = 1.0
#: Why a draining worker is asked to reconnect (M_RECONNECT's ``reason``).
STOPPING = "server stopping"


def is_shutdown(reason: Any) -> bool:
    return reason == otp.SHUTDOWN or isinstance(reason, otp.Shutdown)


def drain(conn: Connection) -> None:
    """Begin the drain (a second ``shutdown`` changes nothing): see ``_connection``'s docstring."""
    if conn.draining:
        return
    conn.draining = True
    ctx = conn.ctx
    logger.info(
        "matching: draining %s (%d streams with a call, %d calls in flight)",
        conn.label,
        len(conn.tasks),
        len(conn.calls),
    )
    if conn.role == "worker":
        conn.send_message(wire.MatchReconnect(STOPPING))
        _matcher.notify_worker(WorkerDraining(conn.worker_id), matcher=ctx.matcher)
        for rid, handle in list(conn.streams.items()):
            if rid not in conn.tasks:
                close_stream(conn, rid, handle)
    else:
        cancel_calls(conn, ops=("result",))  # (they wait for a flow to end: asked again later)
    assert conn.nursery is not None
    deadline = trio.current_time() + ctx.config.stop_drain_timeout
    conn.nursery.start_soon(_drain_deadline, conn, deadline)
    conn.settle()


async def _drain_deadline(conn: Connection, deadline: float) -> None:
    """At ``deadline`` give up what still runs; drop the connection :data:`DRAIN_GRACE` later
    if its last answers are not written by then."""
    await trio.sleep_until(deadline)
    if conn.tasks or conn.calls:
        logger.warning(
            "matching: %s still has %d calls running after stop_drain_timeout (%s s):"
            " closing it (a worker's are re-dispatched after the restart)",
            conn.label,
            len(conn.tasks) + len(conn.calls),
            conn.ctx.config.stop_drain_timeout,
        )
    conn.drain_over = True
    cancel_calls(conn)
    conn.settle()
    await trio.sleep(DRAIN_GRACE)
    conn.drop(f"{STOPPING}: the drain is over")
