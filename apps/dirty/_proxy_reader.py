"""A worker proxy's reader: the worker's frames back to the client connections that asked,
every frame of one read re-addressed (only the header's request id changes) and written with
one ``writev`` per connection; the worker's STATUS notices (a call queued for a thread, started,
the worker draining after a SIGTERM) update the calls' state instead. A client that does not
read its replies makes the proxy stop reading its worker for a while (:func:`_hold_for`).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

import trio

import otp
import wire

from ._calls import LATENCY_BOUNDS
from ._context import CallerConnection, Drain, Drained
from ._io import BIG, RID, SocketReader, send_timeout
from ._lifecycle import DRAINING
from ._protocol import CHUNK, ERROR, QUEUED, STATUS, decode_payload
from ._routes import relevel

if TYPE_CHECKING:
    from ._proxy import WorkerProxy

logger = logging.getLogger("apps.dirty")
#: (A small frame into a batch in one C call: ``Batch.frame`` written out, for the common case.)
_append = wire.append_readdressed


async def read_worker(proxy: WorkerProxy) -> None:
    """Forward the worker's frames to their connections: every frame of one read, re-addressed,
    in one write per connection."""
    assert proxy.stream is not None
    reader = SocketReader(proxy.stream.socket.fileno(), wire.FrameBuffer())
    buffer = reader.buffer
    inflight = proxy.inflight
    held = proxy.held
    # (trio.current_time() without its two wrappers: the run's clock itself)
    current_time = trio.lowlevel.current_clock().current_time
    while True:
        try:
            if (wait := reader.pace()) is not None:
                await wait
            n = reader.read()
        except (OSError, trio.ClosedResourceError):
            return
        if n < 0:
            continue
        if not n:
            proxy.read_all.set()
            return
        now = current_time()
        proxy.last_seen = now
        frames = buffer.frames(n)
        if not frames:
            continue  # (a large frame's first part: read on at once)
        view = buffer.view
        if len(frames) == 1:
            # One frame (a lone caller's reply, the common case): re-addressed in the receive
            # buffer and written from there, with no batch.
            mtype, wid, start, stop = frames[0]
            entry = inflight.get(wid)
            if entry is not None and mtype != STATUS and mtype != CHUNK:
                conn = entry[0]
                rid = entry[1]
                _ended(proxy, wid, entry, now)
                if mtype == ERROR:
                    proxy.ctx.calls.error(_error_kind(view[start:stop]))
                if proxy.lanes:
                    relevel(proxy)
                RID.pack_into(buffer.buf, start - 8, rid)
                slow = conn.deliver([view[start - 16 : stop]], [rid])
                if proxy.draining and not inflight and proxy.me is not None:
                    otp.send(proxy.me, Drained())
                if slow:
                    await _hold_for(proxy, conn)
                continue
        # The request ids each connection's frames end; the frames go into the connection's
        # own batch (``replies``), taken below before the next read.
        groups: dict[CallerConnection, list[int]] = {}
        last: Any = None
        i = 0
        count = len(frames)
        while i < count:
            mtype, wid, start, stop = frames[i]
            entry = inflight.get(wid)
            if entry is None:
                if not wid and mtype == STATUS and view[start:stop] == DRAINING and proxy.me:
                    otp.send(proxy.me, Drain(sigterm=True))
                i += 1
                continue  # heartbeat, or a request abandoned or failed already
            if mtype == STATUS:  # the worker queued or started it: its run time counts from then
                if view[start:stop] == QUEUED:
                    entry[2] = None
                else:
                    entry[2] = now
                    if held:
                        held.pop(wid, None)
                i += 1
                continue
            conn = entry[0]
            rid = entry[1]
            if conn is not last:  # (a read's frames mostly go to one connection)
                last = conn
                batch = conn.replies
                done = groups.setdefault(conn, [])
            if mtype == CHUNK:
                entry[2] = now
                # A run of this stream's small chunks: one copy, then each header's id.
                j = i + 1
                while (
                    j < count
                    and frames[j][1] == wid
                    and frames[j][0] == CHUNK
                    and frames[j][3] - frames[j][2] < BIG
                ):
                    j += 1
                if j - i > 1 and stop - start < BIG:
                    batch.run(view, frames, i, j, rid)
                    i = j
                    continue
                batch.frame(view, start, stop, rid)
            else:
                if stop - start >= BIG or not _append(batch.small, view, start, stop, rid):
                    batch.frame(view, start, stop, rid)
                done.append(rid)
                _ended(proxy, wid, entry, now)
                if mtype == ERROR:
                    proxy.ctx.calls.error(_error_kind(view[start:stop]))
            i += 1
        if proxy.lanes and len(inflight) != proxy.load:
            relevel(proxy)
        slow = None
        for conn, done in groups.items():
            if conn.deliver(conn.replies.take(), done):
                slow = conn
        if proxy.draining and not inflight and proxy.me is not None:
            otp.send(proxy.me, Drained())
        if slow is not None:
            await _hold_for(proxy, slow)


def _ended(proxy: WorkerProxy, wid: int, entry: list[Any], now: float) -> None:
    """The call ``wid`` (``entry``: its ``inflight`` entry) ended (a RESPONSE, an ERROR, or a
    stream's END): forget it, and count it (an ERROR's kind is counted by the caller, which
    alone slices its payload)."""
    del proxy.inflight[wid]
    del proxy.keys[(entry[0], entry[1])]
    if proxy.held:
        proxy.held.pop(wid, None)
    calls = proxy.ctx.calls
    latency = now - entry[3]
    calls.total += 1
    calls.seconds += latency
    calls.counts[bisect_left(LATENCY_BOUNDS, latency)] += 1


def _error_kind(payload: memoryview) -> str:
    """The ``error_type`` of an ERROR frame's payload (``"DirtyError"`` if it has none)."""
    try:
        kind = decode_payload(payload)["error"]["error_type"]
    except Exception:  # (a worker's malformed ERROR: the caller gets it as it is)
        return "DirtyError"
    return kind if type(kind) is str and len(kind) <= 100 else "DirtyError"


async def _hold_for(proxy: WorkerProxy, conn: CallerConnection) -> None:
    """Read nothing more from the worker while a client connection is over its budget
    (``dirty_client_buffer``), so that the kernel pushes back on the worker (its streams wait
    for room) instead of the node queueing without bound. The worker's other callers wait too
    (their replies share its socket), so a client that has not come down to ``LOW_WATER``
    within :func:`send_timeout` is dropped (``conn.drop_stalled``: its requests are abandoned,
    each with an ERROR frame) and the worker serves on. The time held does not count as the
    worker's silence or its calls' run time.
    """
    outbox = conn.outbox
    limit = send_timeout(proxy.ctx.config)
    held = proxy.held_since = trio.current_time()
    try:
        with trio.move_on_after(limit) as scope:
            await outbox.wait_room()
        if scope.cancelled_caught:
            logger.warning(
                "dirty pool: dropping a client that took nothing of its %d KiB of replies in"
                " %gs; dirty worker %d was held up for it",
                outbox.size >> 10,
                limit,
                proxy.worker_id,
            )
            conn.drop_stalled(limit)
    finally:
        proxy.held_since = None
        # (Rare: a pause.) The worker and its calls were not silent, the node was not reading.
        paused = trio.current_time() - held
        proxy.last_seen += paused
        for entry in proxy.inflight.values():
            if entry[2] is not None:
                entry[2] += paused
