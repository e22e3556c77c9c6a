"""A worker connection's streams on the server: M_REGISTER opens one (the matcher picks the
queue, a stream process linked to the connection serves it; frames that arrive for it meanwhile
follow once it runs), and a draining connection closes its idle ones."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import otp
import wire

from . import _matcher, _stream
from ._dispatch import StreamRejection

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["close_stream", "register_stream"]

logger = logging.getLogger("apps.matching")


def register_stream(conn: Connection, msg: wire.MatchRegister) -> None:
    rid = msg.rid
    if conn.draining:
        conn.send_message(
            wire.MatchRejected(
                "draining", "the server is stopping: reconnect (with backoff)", False, rid=rid
            )
        )
        return
    if rid in conn.streams or rid in conn.registering:
        conn.send_message(
            wire.MatchRejected(
                "bad_frame", f"stream id {rid} is in use on this connection", True, rid=rid
            )
        )
        return
    conn.registering[rid] = []
    assert conn.nursery is not None
    conn.nursery.start_soon(_open_stream, conn, msg)


async def _open_stream(conn: Connection, msg: wire.MatchRegister) -> None:
    """Register with the matcher, start the stream process (linked to this process), then
    answer; the frames that came for the stream meanwhile follow."""
    rid = msg.rid
    ctx = conn.ctx
    try:
        try:
            result = await _matcher.register_stream(
                conn.session, conn.worker_id, msg.queue, msg.name, conn.caps, matcher=ctx.matcher
            )
        except (otp.CallError, otp.CallTimeout) as exc:
            result = StreamRejection("unavailable", f"the matcher did not answer: {exc}", False)
        if isinstance(result, StreamRejection):
            logger.info(
                "matching: refused stream %d (%s:%s) of %s: %s %s",
                rid,
                msg.queue,
                msg.name,
                conn.label,
                result.code,
                result.message,
            )
            conn.send_message(
                wire.MatchRejected(result.code, result.message, result.permanent, rid=rid)
            )
            return
        # No checkpoint from here on: REGISTERED is queued before the stream's first TASK.
        handle = _stream.open_stream(
            conn,
            rid,
            conn.worker_id,
            conn.caps,
            result,
            limits=ctx.config.limits,
            matcher=ctx.matcher,
            notices=conn.notices,
        )
        conn.streams[rid] = handle
        conn.send_message(wire.MatchRegistered(msg.queue, msg.name, rid=rid))
        for held in conn.registering.get(rid, ()):
            handle.deliver(held)
        if conn.draining:
            close_stream(conn, rid, handle)
    finally:
        conn.registering.pop(rid, None)
        conn.settle()


def close_stream(conn: Connection, rid: int, handle: _stream.StreamHandle) -> None:
    """Close an idle stream of a draining worker: M_CLOSE to the worker, and to the stream
    process as if the worker had sent it (it tells its queue it is gone, and ends)."""
    if rid in conn.closing:
        return
    conn.closing.add(rid)
    conn.send_message(wire.MatchClose(rid=rid))
    handle.deliver(wire.MatchClose(rid=rid))
