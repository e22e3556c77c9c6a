"""Connection processes: one per client connection, children of the ``dirty_connections``
DynamicSupervisor (the listener's acceptor starts them).

A connection reads GD v1 frames; many requests may be in flight on it at once, matched by
request id. A REQUEST goes to the least-loaded worker holding its app (see the router's
``Routes``); only the payload's leading ``app_path`` is read, the bytes are forwarded as they
are (all of one read's requests for a worker in one write), and replies come back as bytes
ready to write. STASH runs here, on ETS; STATUS and MANAGE ask the router. An END *from* a
client abandons that request (the worker stops its generator). A client that breaks the
protocol gets an ERROR (DirtyProtocolError) and is disconnected; a client that disconnects
abandons its requests. A client that only shuts down its sending side (``shutdown(SHUT_WR)``)
still gets the replies to every request it sent, as Gunicorn answers each request read before
the end of input; the connection closes once they are all written.

Clients are not trusted with the node's memory or time: a frame's buffer grows only as its
bytes arrive, a frame begun must be finished within ``dirty_frame_timeout``, a connection with
nothing in flight may be closed after ``dirty_idle_timeout``, and a client that does not read
its replies has them queued against its own budget (``dirty_client_buffer``) while its
requests are no longer read, so it slows only itself; one that takes nothing within the send
timeout is dropped with an ERROR frame for each of its calls
(:meth:`ClientConnection.drop_stalled`).
"""

from __future__ import annotations

import logging
import math
import select
from typing import Any

import attrs
import trio

import otp
import wire
from otp import ets

from ._config import DirtyConfig
from ._context import ROUTER
from ._errors import (
    DirtyAppNotFoundError,
    DirtyError,
    DirtyNoWorkersAvailableError,
    DirtyProtocolError,
    DirtyTimeoutError,
    DirtyWorkerError,
    StashError,
)
from ._io import HIGH_WATER, LOW_WATER, Batch, Outbox, SocketReader, send_timeout
from ._protocol import END, MANAGE, REQUEST, STASH, STATUS, decode_payload, encode, error_bytes
from ._proxy import WorkerProxy
from ._routes import Expire, Parking, Requeue, Routes, Unpark
from ._stash import stash_operation

logger = logging.getLogger("apps.dirty")
_opens_with = wire.fast_opens_with


@attrs.frozen
class _ReaderDone:
    reason: Any


@attrs.frozen
class _Settled:
    """A half-closed connection's last request in flight is answered."""


#: The reader's end when the client shut down only its sending side: replies are still wanted.
_HALF_CLOSED = "half_closed"
#: The connection's end when the client took nothing of its replies for ``SEND_TIMEOUT``.
_STALLED = "stalled"


#: A client connection's receive buffer to start with; it grows for larger frames as their
#: bytes arrive (see ``FrameBuffer``), so an idle client costs little.
CLIENT_BUFFER = 65536
#: How long a connection that is ending waits for the client to take any of what is queued for
#: it (the replies, an ERROR saying why) before the socket is closed anyway.
CLOSE_GRACE = 5.0


async def start_connection(
    stream: trio.SocketStream, routes: Routes, config: DirtyConfig
) -> otp.Pid:
    """Start a connection process serving ``stream``, linked to the caller (the
    ``dirty_connections`` supervisor)."""
    return otp.spawn_link(_connection, stream, routes, config)


@attrs.define(eq=False)
class ClientConnection:
    """One client connection's state, shared by its reader task, its mailbox loop and the
    worker proxies that deliver its replies (it is their ``CallerConnection``)."""

    me: otp.Pid
    stream: trio.SocketStream
    outbox: Outbox
    routes: Routes
    config: DirtyConfig
    #: Requests in flight: client request id -> the worker proxy running it (or the parking,
    #: for a call waiting for a worker to start).
    pending: dict[int, WorkerProxy | Parking] = attrs.Factory(dict)
    monitors: dict[WorkerProxy, otp.Ref] = attrs.Factory(dict)
    by_ref: dict[otp.Ref, WorkerProxy] = attrs.Factory(dict)
    #: STATUS and MANAGE requests in flight (each a task asking the router).
    controls: int = 0
    #: The client sends no more; the connection ends once ``pending`` and ``controls`` are done.
    half_closed: bool = False
    #: Requests waiting for a worker of their app (one is starting).
    parking: Parking = attrs.Factory(Parking)
    #: The client took nothing for too long: the connection is ending (``drop_stalled``).
    dropped: bool = False
    #: Unsent bytes over which the client's requests are no longer read (and its backlog is
    #: watched: ``_watch_backlog`` runs while ``watched``).
    paused_at: int = 0
    watched: bool = False
    nursery: trio.Nursery | None = None
    #: The reader's wait for the client (its deadline is the idle or frame timeout), and
    #: whether the reader is in it with no frame begun while ``dirty_idle_timeout`` is on:
    #: then the last reply to go out arms the idle deadline (``arm_idle``).
    waiting: trio.CancelScope = attrs.Factory(trio.CancelScope)
    idle_wait: bool = False
    #: The payload bytes that held the route of the last REQUEST read (its dict head,
    #: ``app_path`` and ``action``), and its app: a request opening with the same bytes goes
    #: the same way without its route being read again (a client mostly calls one action).
    route_head: bytes = b""
    route_app: str = ""
    #: The reply frames of one read of a worker proxy's reader (``CallerConnection.replies``).
    replies: Batch = attrs.Factory(Batch)

    def __attrs_post_init__(self) -> None:
        self.paused_at = min(HIGH_WATER, self.config.dirty_client_buffer)

    def deliver(self, parts: list[Any], done: list[int]) -> bool:
        """Frames from a worker proxy (run in its task): written to the client at once, or
        queued for it against its own budget (``dirty_client_buffer``). True once a client
        that does not read has used it up: the worker proxy then waits for it (see
        ``_proxy_reader._hold_for``); until then the worker's other callers are not held up."""
        pending = self.pending
        for rid in done:
            pending.pop(rid, None)
        outbox = self.outbox
        outbox.writev(parts)
        if self.idle_wait:
            self.arm_idle()
        if self.half_closed and not pending:
            otp.send(self.me, _Settled())
        if outbox.size > self.paused_at and not self.watched and self.nursery is not None:
            self.watched = True
            self.nursery.start_soon(_watch_backlog, self)
        return outbox.size > self.config.dirty_client_buffer

    def arm_idle(self) -> None:
        """Once nothing is in flight while the reader waits for the client, the idle timeout
        runs from now (the reader armed none when it began waiting with calls in flight)."""
        if self.idle_wait and not self.pending and not self.controls:
            self.idle_wait = False
            self.waiting.deadline = trio.current_time() + self.config.dirty_idle_timeout

    def drop_stalled(self, timeout: float) -> None:
        """End the connection of a client that took nothing of what is queued for it in
        ``timeout`` seconds: its requests are abandoned, and each gets an ERROR frame saying
        so, queued after the
        whole frames already queued (one with id 0 if none was in flight), so a client that
        reads again sees why it is dropped rather than a socket closed mid-frame. The socket
        closes once the client took them, or after ``CLOSE_GRACE``."""
        if self.dropped:
            return
        self.dropped = True
        outbox = self.outbox
        error = _stalled(outbox.size, timeout)
        for rid, worker in self.pending.items():
            worker.cancel(self, rid)
            outbox.write(error_bytes(rid, error))
        if not self.pending:
            outbox.write(error_bytes(0, error))
        self.pending.clear()
        otp.send(self.me, _ReaderDone(_STALLED))


async def _connection(stream: trio.SocketStream, routes: Routes, config: DirtyConfig) -> None:
    me = otp.self()
    outbox = Outbox(stream.socket.fileno(), lambda: otp.send(me, _ReaderDone("broken")))
    conn = ClientConnection(me, stream, outbox, routes, config)
    try:
        async with trio.open_nursery() as nursery:
            conn.nursery = nursery
            nursery.start_soon(_reader, conn, nursery)
            nursery.start_soon(outbox.run)
            await _mailbox_loop(conn)
            nursery.cancel_scope.cancel()
    finally:
        outbox.close()
        for rid, holder in conn.pending.items():
            holder.cancel(conn, rid)
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _mailbox_loop(conn: ClientConnection) -> None:
    """The connection's mailbox: a worker's death fails its calls; the reader's end ends it,
    or, if the client only half-closed, the last reply to its requests in flight does."""
    pending = conn.pending
    outbox = conn.outbox
    while True:
        msg = await otp.receive()
        kind = type(msg)
        if kind is otp.Down:
            worker = conn.by_ref.pop(msg.ref, None)
            if worker is not None:
                conn.monitors.pop(worker, None)
                lost = [rid for rid, w in pending.items() if w is worker]
                for rid in lost:
                    del pending[rid]
                    outbox.write(error_bytes(rid, _worker_gone(msg.reason)))
        elif kind is bytes:
            outbox.write(msg)
        elif kind is Unpark or kind is Requeue or kind is Expire:
            _reroute(conn, msg)
        elif kind is _ReaderDone:
            if msg.reason != _HALF_CLOSED:
                break
            conn.half_closed = True
        if conn.idle_wait:
            conn.arm_idle()
        if conn.half_closed and not pending and not conn.controls:
            break
    await _flush_while_taken(outbox)


async def _flush_while_taken(outbox: Outbox) -> None:
    """Wait until what is queued is sent, while the client takes some of it at least every
    ``CLOSE_GRACE`` seconds (a client that reads nothing is not waited for)."""
    while outbox.buf and not outbox.closed:
        left = outbox.size
        with trio.move_on_after(CLOSE_GRACE):
            await outbox.flush()
        if outbox.size >= left:
            return


async def _watch_backlog(conn: ClientConnection) -> None:
    """Drop the client (``drop_stalled``) if what is queued for it does not come down to
    ``LOW_WATER`` within the send timeout (``SEND_TIMEOUT``, or ``dirty_timeout`` if
    shorter)."""
    outbox = conn.outbox
    timeout = send_timeout(conn.config)
    with trio.move_on_after(timeout):
        await outbox.wait_room()
    conn.watched = False
    if outbox.size > LOW_WATER and not outbox.closed:
        conn.drop_stalled(timeout)


def _stalled(queued: int, timeout: float) -> DirtyError:
    return DirtyError(
        f"dropped: this client took nothing of its {queued >> 10} KiB of replies in"
        f" {timeout:g}s; read replies as they come (or open another connection)"
    )


def _worker_gone(reason: Any) -> DirtyError:
    return DirtyWorkerError(
        f"the dirty worker running the call is gone ({otp.format_reason(reason)})"
    )


async def _reader(conn: ClientConnection, nursery: trio.Nursery) -> None:
    """Read the client's frames (:func:`_read_frames`) until it is done, broke the protocol,
    or kept the reader waiting too long: a frame begun and not finished within
    ``dirty_frame_timeout`` (it gets an ERROR frame), or nothing in flight and nothing sent
    for ``dirty_idle_timeout``."""
    fd = conn.stream.socket.fileno()
    buffer = wire.FrameBuffer(CLIENT_BUFFER, fd=fd, error=DirtyProtocolError)
    # Its deadline is set only while the reader waits for the client; elsewhere it is inf.
    waiting = conn.waiting
    end: Any = otp.NORMAL
    try:
        with waiting:
            end = await _read_frames(conn, nursery, SocketReader(fd, buffer), waiting)
        if waiting.cancelled_caught:
            if buffer.buffered:
                missing = buffer.missing()
                what = f"the rest of a frame ({missing} bytes)" if missing else "a frame header"
                exc = DirtyProtocolError(
                    f"{what} did not arrive within dirty_frame_timeout="
                    f"{conn.config.dirty_frame_timeout:g}s of its first byte"
                )
                conn.outbox.write(error_bytes(0, exc))
                logger.warning("dirty pool: dropping a client: %s", exc)
            else:
                logger.debug("dirty pool: closing a client idle for dirty_idle_timeout")
    finally:
        otp.send(conn.me, _ReaderDone(end))


async def _read_frames(
    conn: ClientConnection, nursery: trio.Nursery, reader: SocketReader, waiting: trio.CancelScope
) -> Any:
    """Take every frame of each read: requests go to their workers with one write per worker
    per read; the payload bytes are forwarded, not decoded (only the route is read). Returns
    how the client's input ended."""
    write = conn.outbox.write
    fd = reader.fd
    buffer = reader.buffer
    # (trio.current_time() without its two wrappers: the run's clock itself)
    current_time = trio.lowlevel.current_clock().current_time
    frame_timeout = conn.config.dirty_frame_timeout or math.inf
    idle_timeout = conn.config.dirty_idle_timeout or math.inf
    #: When the frame at the front of the buffer began to arrive (None: no frame is partial).
    began: float | None = None
    outbox = conn.outbox
    while True:
        if outbox.size > conn.paused_at:
            # A client not reading its replies: take no more of its requests until it does, so
            # it slows only itself (``_watch_backlog`` drops one that takes nothing).
            await outbox.wait_room()
        if reader.drained:  # the last read did not fill the buffer: wait for more
            # Only a deadline that changes is set: each set of a cancel scope's deadline costs
            # trio a deadline-heap update, and with a call in flight (or no idle timeout)
            # there is none to set at all.
            deadline = math.inf
            if began is not None:
                deadline = began + frame_timeout
            elif idle_timeout != math.inf:
                if not conn.pending and not conn.controls:
                    deadline = current_time() + idle_timeout
                else:
                    conn.idle_wait = True  # the last reply arms it (``arm_idle``)
            if deadline != math.inf:
                waiting.deadline = deadline
            await reader.readable()
            conn.idle_wait = False
            # (Only this wait or ``arm_idle``, with an idle timeout, set a deadline.)
            if (deadline != math.inf or idle_timeout != math.inf) and (
                waiting.deadline != math.inf
            ):
                waiting.deadline = math.inf
        elif (wait := reader.pace()) is not None:
            await wait  # (after BUSY_READS reads in a row, lets the other tasks run)
        try:
            n = reader.read()
            if n < 0:
                continue
            if not n:
                return otp.NORMAL if _hung_up(fd) else _HALF_CLOSED
            frames = buffer.frames(n)
        except (OSError, trio.ClosedResourceError):
            return otp.NORMAL
        except DirtyProtocolError as exc:
            write(error_bytes(0, exc))
            logger.warning("dirty pool: dropping a client that sent garbage: %s", exc)
            return otp.NORMAL
        if not frames:
            if began is None:
                began = current_time()
            continue  # (a large frame's first part: read on at once)
        now = current_time()
        began = now if buffer.end != buffer.start else None  # (a frame's first part is held)
        view = buffer.view
        if len(frames) == 1 and frames[0][0] == REQUEST:
            # One request (a lone caller's, the common case): re-addressed in the receive
            # buffer and written to its worker from there, with no batch.
            _, rid, start, stop = frames[0]
            error = _route(conn, rid, view, start, stop, now, None)
            if error is not None:
                write(error_bytes(rid, error))
            continue
        touched: dict[WorkerProxy, None] = {}
        for mtype, rid, start, stop in frames:
            if mtype == REQUEST:
                error = _route(conn, rid, view, start, stop, now, touched)
                if error is not None:
                    write(error_bytes(rid, error))
            elif mtype == END:
                worker = conn.pending.pop(rid, None)
                if worker is not None:
                    worker.cancel(conn, rid)
            elif mtype == STASH:
                _flush(touched)
                write(await _stash(rid, bytes(view[start:stop])))
            elif mtype in (STATUS, MANAGE):
                conn.controls += 1
                nursery.start_soon(_control, conn, mtype, rid, bytes(view[start:stop]))
            else:
                write(
                    error_bytes(
                        rid,
                        DirtyProtocolError(
                            f"a client may send REQUEST, STASH, STATUS or MANAGE, not"
                            f" message type 0x{mtype:02x}"
                        ),
                    ),
                )
        for worker in touched:  # (``_flush`` written out: once per read)
            worker.flush()


def _hung_up(fd: int) -> bool:
    """At the end of a client's input: did it close (or shut down both ways), rather than only
    shut down its sending side? (A Unix socket then polls as hung up.)"""
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poll.poll(0))


def _flush(touched: dict[WorkerProxy, None]) -> None:
    for proxy in touched:
        proxy.flush()
    touched.clear()


def _route(
    conn: ClientConnection,
    rid: int,
    view: memoryview,
    start: int,
    stop: int,
    now: float,
    touched: dict[WorkerProxy, None] | None,
    parked: Any = None,
) -> DirtyError | None:
    """Send a REQUEST (payload ``view[start:stop]``, ``view`` a whole buffer's) to a worker of
    its app, with the rest of the read's requests (``touched`` gathers the workers to flush), or
    at once from the receive buffer (``touched`` None: the read's only frame); or park it while
    a worker for its app starts. Returns the error to answer it with instead."""
    head = conn.route_head
    # (``view`` views a whole bytes or bytearray, compared with one memcmp: a memoryview's
    # ``==`` unpacks and compares byte by byte, ~40 instructions a byte. A None from the fast
    # path, for any other buffer, is a no: the route is then read.)
    if head and _opens_with(view.obj, start, stop, head):
        # Opens with the bytes of the last route read: the same app.
        app_path = conn.route_app
    elif (route := wire.peek_route(view, start, stop)) is not None:
        app_path = route[0]
        conn.route_head = bytes(view[start : start + wire.route_length(*route)])
        conn.route_app = app_path
    else:
        try:
            msg = decode_payload(view[start:stop])
        except DirtyProtocolError as exc:
            return exc
        path = msg.get("app_path") if msg else None
        if not isinstance(path, str) or not isinstance(msg.get("action"), str):
            return DirtyProtocolError("a REQUEST needs str app_path and action")
        app_path = path
    if rid in conn.pending:
        return DirtyProtocolError(f"request id {rid} is already in flight on this connection")
    routes = conn.routes
    lane = routes.table.get(app_path)
    if lane is None:
        if not routes.open:
            return DirtyNoWorkersAvailableError(app_path, "The dirty pool is shutting down")
        return DirtyAppNotFoundError(app_path)
    worker = lane.only
    if worker is None:
        worker = lane.pick()
        if worker is None:
            if app_path not in routes.starting:
                return DirtyNoWorkersAvailableError(app_path)
            # A worker for it is starting: the call waits (at most dirty_timeout) for it.
            frame = bytes(view[start - 16 : stop])
            conn.parking.park(conn.me, routes, rid, app_path, frame, parked)
            conn.pending[rid] = conn.parking
            return None
    if worker not in conn.monitors:
        # A dead worker proxy's Down (noproc) fails the call, as does one dying later.
        ref = otp.monitor(worker.me)
        conn.monitors[worker] = ref
        conn.by_ref[ref] = worker
    conn.pending[rid] = worker
    worker.submit(conn, rid, view, start, stop, now, touched is None)
    if touched is not None:
        touched[worker] = None
    return None


def _reroute(conn: ClientConnection, msg: Unpark | Requeue | Expire) -> None:
    """Route again: the calls parked for an app (``Unpark``: a worker is up, or none is starting
    any more), a call a killed worker had not started (``Requeue``); or fail a parked call
    whose wait is over (``Expire``)."""
    pending = conn.pending
    parking = conn.parking
    if isinstance(msg, Expire):
        call = parking.calls.get(msg.rid)
        if call is not None and call[2] == msg.token:
            del parking.calls[msg.rid]
            pending.pop(msg.rid, None)
            limit = conn.routes.wait_limit
            expired = DirtyTimeoutError(
                f"no worker for app {call[0]} came up within dirty_timeout={limit:g}s (the"
                " call waited for one that was starting)",
                timeout=limit,
            )
            conn.outbox.write(error_bytes(msg.rid, expired))
        return
    if isinstance(msg, Requeue):
        if pending.get(msg.rid) is not msg.worker:
            return  # abandoned meanwhile
        del pending[msg.rid]
        calls: list[tuple[int, bytes, Any]] = [(msg.rid, msg.frame, None)]
    else:
        calls = parking.take(msg.app)
        for rid, _, _ in calls:
            del pending[rid]
    touched: dict[WorkerProxy, None] = {}
    now = trio.current_time()
    for rid, frame, token in calls:
        error = _route(conn, rid, memoryview(frame), 16, len(frame), now, touched, token)
        if error is not None:
            conn.outbox.write(error_bytes(rid, error))
    _flush(touched)


async def _stash(rid: int, payload: bytes) -> bytes:
    try:
        msg = decode_payload(payload) or {}
        op = msg.get("op")
        table = msg.get("table", "")
        if type(op) is not int or not isinstance(table, str):
            raise DirtyProtocolError("a STASH needs an int op and a str table")
        pattern = msg.get("pattern")
        result = await stash_operation(op, table, msg.get("key"), msg.get("value"), pattern)
        return encode(wire.make_response(rid, result))
    except DirtyError as exc:
        return error_bytes(rid, exc)
    except (otp.CallError, otp.CallTimeout, ets.EtsError, TypeError, ValueError) as exc:
        return error_bytes(rid, StashError(f"stash operation failed: {exc}"))
    except wire.WireError as exc:
        return error_bytes(rid, StashError(f"stash result cannot be encoded: {exc}"))


async def _control(conn: ClientConnection, mtype: int, rid: int, payload: bytes) -> None:
    me = conn.me
    try:
        if mtype == STATUS:
            result = await otp.call(ROUTER, "status")
        else:
            msg = decode_payload(payload) or {}
            op, count = msg.get("op"), msg.get("count", 1)
            if op not in (1, 2) or type(count) is not int:
                raise DirtyProtocolError("a MANAGE needs op 1 (add) or 2 (remove) and an int count")
            result = await otp.call(ROUTER, ("add" if op == 1 else "remove", count), timeout=None)
        otp.send(me, encode(wire.make_response(rid, result)))
    except DirtyError as exc:
        otp.send(me, error_bytes(rid, exc))
    except (otp.CallError, otp.CallTimeout) as exc:
        otp.send(me, error_bytes(rid, DirtyError(f"the dirty router did not answer: {exc}")))
    finally:
        # Before the writer takes the reply just sent: it may then end a half-closed connection.
        conn.controls -= 1
