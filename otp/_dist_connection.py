"""A distribution connection's state and its outgoing frames (Erlang's distribution port and
its output buffer): frames are encoded when sent, written straight to an idle socket, or queued
and written together by the connection's writer, consecutive sends on one route joined into one
batch frame. What waits is bounded: past DistConfig.busy_limit its senders are suspended (as
``busy_dist_port`` suspends them), past queue_limit the connection counts as lost.

The process that dials or accepts, handshakes and runs the reader, writer and ticker is in
``_dist_session``; what each incoming frame does is in ``_dist_inbound``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
import trio

import wire

from ._errors import BadArg
from ._process import Process, current_process_or_none
from ._reasons import KILL

if TYPE_CHECKING:
    from ._dist_handshake import Peer
    from ._distribution import Distribution

logger = logging.getLogger("otp.dist")

#: A frame is written straight to an idle socket if a frame came from the peer since the last
#: direct write (it answers: a reply), or that write is at least this old (seconds); closer
#: frames are a burst, queued and written together by the writer.
DIRECT_WRITE_GAP = 0.0001

#: The longest a lazy frame (bookkeeping such as DEMONITOR) waits for another frame to go out
#: with (seconds): then the writer writes it. Long enough that a stream of calls slower than
#: a loaded machine's round trip still takes its DEMONITORs along instead of waking the writer;
#: a stopping node's flush does not wait for it (see write_lazy_now).
LAZY_DELAY = 0.05

#: About the most bytes the writer hands the socket in one write.
WRITE_BYTES = 256 * 1024

#: Most messages, and about the most bytes, in one SEND_BATCH / REG_SEND_BATCH frame.
BATCH_MESSAGES = 1024
BATCH_BYTES = 65536


class _OpenBatch:
    """Consecutive sends on one route, encoded one by one, waiting to become a batch frame."""

    __slots__ = ("items", "mtype", "room", "route", "size")

    def __init__(self, mtype: wire.MessageType, route: tuple[Any, Any], room: int) -> None:
        self.mtype = mtype
        self.route = route
        self.room = room
        self.items: list[bytes] = []
        self.size = 0

    def frame(self, codec: wire.Codec, limits: wire.Limits) -> bytes:
        batch_type, fields = _batch_fields(self.mtype, self.route)
        return wire.encode_batch(batch_type, fields, self.items, codec, limits=limits)


def _batch_fields(
    mtype: wire.MessageType, route: tuple[Any, Any]
) -> tuple[wire.MessageType, dict[str, Any]]:
    if mtype is wire.MessageType.SEND:
        return wire.MessageType.SEND_BATCH, {"to": route[0]}
    return wire.MessageType.REG_SEND_BATCH, {"from": route[0], "to": route[1]}


def _batch_room(
    mtype: wire.MessageType, route: tuple[Any, Any], codec: wire.Codec, limits: wire.Limits
) -> int:
    """How many bytes of messages a batch on ``route`` may hold: the frame must fit the payload
    limit (the list head grows by at most 4 bytes over the empty one's), and a batch stays
    about BATCH_BYTES."""
    batch_type, fields = _batch_fields(mtype, route)
    empty = len(wire.encode_batch(batch_type, fields, [], codec, limits=limits))
    return min(BATCH_BYTES, limits.max_payload - (empty - wire.HEADER_SIZE) - 4)


def _send_payload(mtype: wire.MessageType, route: tuple[Any, Any], message: Any) -> Any:
    """The payload of a lone SEND or REG_SEND: the batch's routing fields plus ``msg``."""
    return {**_batch_fields(mtype, route)[1], "msg": message}


#: Why a connection failed or ended (ConnectionFailure.kind): the address answered nothing
#: (or refused the socket), the peer does not know our cookie, another node answered, the peer
#: refused the handshake (or failed it), the handshake took too long, the peer sent malformed
#: frames, the socket closed, the peer went quiet (liveness_timeout) or read nothing for that
#: long, too much waited for it (queue_limit), or the settings cannot reach it.
UNREACHABLE = "unreachable"
BAD_COOKIE = "bad_cookie"
WRONG_NODE = "wrong_node"
REFUSED = "refused"
HANDSHAKE_TIMEOUT = "handshake_timeout"
MALFORMED = "malformed"
CLOSED = "closed"
NOT_HEARD = "not_heard"
NOT_READ = "not_read"
QUEUE_LIMIT = "queue_limit"
MISCONFIGURED = "misconfigured"


@attrs.frozen
class ConnectionFailure:
    """Why a connection failed or ended (``Connection.failure``): one of the kinds above and
    what was logged of it (the error's message)."""

    kind: str
    reason: str


class Connection:
    """One peer node: its state, the frames waiting to be written, and its process."""

    def __init__(self, dist: Distribution, peer: str) -> None:
        self.dist = dist
        self.peer = peer
        self.state = "connecting"
        self.codec: wire.Codec | None = None
        self.creation = 0
        self._pending: list[tuple[wire.MessageType, Any]] = []
        self._outbox: list[bytes] = []
        #: Sends queued after the outbox, still joining into one batch frame.
        self._open_batch: _OpenBatch | None = None
        self._rooms: dict[tuple[Any, Any], int] = {}
        self._writer_lot = trio.lowlevel.ParkingLot()
        self.settled = trio.Event()
        self.process: Process | None = None
        self.sent_since_tick = False
        self.received_since_tick = False
        self._writing = False
        #: The socket's descriptor when frames may be written to it directly (plain sockets).
        self.direct_fd: int | None = None
        self._last_direct = 0.0
        #: Set as frames are read: frames came from the peer since the last direct write.
        self.heard = False
        self._corked = False
        #: The outbox holds lazy frames only, queued since ``_lazy_at``: nobody woke the
        #: writer for them (the next frame takes them along, or the writer after LAZY_DELAY).
        self._lazy_only = False
        self._lazy_at = 0.0
        #: The writer's park while it waits (its deadline is when lazy frames are due).
        self._park_scope: trio.CancelScope | None = None
        #: Set by the writer once everything queued is written (see Distribution.flush).
        self.drained: trio.Event | None = None
        #: Accepted handshakes from the peer under way that are to replace this dial of ours
        #: (simultaneous connect, see Distribution.admit), whether one ever came, and where
        #: the dial waits for them (see _await_rival).
        self.rivals = 0
        self.rival_came = False
        self.rival_lot = trio.lowlevel.ParkingLot()
        #: Bytes waiting to be written: pending, queued, batching and being written.
        self.queued = 0
        self._busy_limit = dist.config.busy_limit
        #: Bytes written so far (the ticker tells a peer that reads nothing by it).
        self.written = 0
        #: What reads the peer's frames (its ``received`` counts the bytes read so far).
        self.reader: Any = None
        #: The reader of a plain socket (``_dist_reading.SocketFrames``), through which a
        #: remote call's caller waits for its reply (its ``wait_reply``); None otherwise.
        self.socket_reader: Any = None
        #: Why it failed or ended, once it did (set where it is logged, before ``settled``).
        self.failure: ConnectionFailure | None = None
        self.hidden = False  # hidden nodes (observer-remote)
        #: The peer accepts ``$gen_reply_demonitor`` (its handshake's ``reply_demonitor``).
        self.reply_demonitor = False
        #: The peer accepts MONITOR_SEND frames (its handshake's ``monitor_send``).
        self.monitor_send = False
        #: Set (and dropped) once the queue is below half DistConfig.busy_limit again: what
        #: the senders it suspended wait for (see _busy).
        self._resume: trio.Event | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.peer} {self.state}>"

    @property
    def received(self) -> int:
        """Bytes read from the peer so far (after the handshake)."""
        return self.reader.received if self.reader is not None else 0

    @property
    def busy(self) -> bool:
        """More than DistConfig.busy_limit bytes wait to be written (Erlang's busy_dist_port)."""
        return self.queued > self.dist.config.busy_limit

    def _busy(self, added: int) -> None:
        """The queue passed busy_limit with the frame of ``added`` bytes just queued.

        The sending process is suspended, as Erlang's busy_dist_port suspends it in the send:
        a Python ``send`` cannot block, so it is suspended at its next receive (or remote
        call) until the queue is below half the limit, or the connection is gone. A queue
        that still grows past queue_limit (its senders never wait in a receive) counts as a
        lost connection, so what waits for a peer stays bounded whatever the senders do.
        """
        config = self.dist.config
        if self.queued > config.queue_limit and self.queued > added:
            logger.warning(
                "node %s: more than %d bytes wait to be written to it (queue_limit): connection"
                " counted as lost",
                self.peer,
                config.queue_limit,
            )
            self.failure = ConnectionFailure(
                QUEUE_LIMIT, f"more than {config.queue_limit} bytes waited to be written"
            )
            self.dist.connection_lost(self)
            if self.process is not None:
                self.process.die(KILL)
            return
        proc = current_process_or_none()
        if proc is not None and proc is not self.process:
            if self._resume is None:
                self._resume = trio.Event()
            proc.suspended = self._resume

    def _not_busy(self) -> None:
        resume = self._resume
        if resume is not None and (
            self.queued <= self.dist.config.busy_limit // 2 or self.state == "down"
        ):
            self._resume = None
            resume.set()

    async def wait_not_busy(self) -> None:
        """Wait while this connection is busy (a remote call's sender, before it sends)."""
        while self.busy and self.state != "down":
            if self._resume is None:
                self._resume = trio.Event()
            await self._resume.wait()

    def enqueue(self, mtype: wire.MessageType, payload: Any, *, lazy: bool = False) -> None:
        """Queue one distribution frame; encodes it now so the sender hears of a bad value.

        ``lazy`` frames (bookkeeping such as DEMONITOR) never take the direct-write path: they
        wait for the writer, or for the next frame, off the latency path.
        """
        if self.state == "down":
            return
        codec = self.codec
        if codec is None:
            # Not agreed yet: the value must go with whichever of ours the peer picks, so the
            # sender hears of a bad one now, as it does once the connection is up.
            size = 0
            for candidate in self.dist.config.codecs:
                try:
                    size = len(
                        wire.encode_message(
                            mtype, payload, codec=candidate, limits=self.dist.config.limits
                        )
                    )
                except wire.WireError as exc:
                    raise BadArg(f"cannot send to node {self.peer!r}: {exc}") from exc
            self._pending.append((mtype, payload))
            self._queue_grew(size)
            return
        try:
            data = wire.encode_message(mtype, payload, codec=codec, limits=self.dist.config.limits)
        except wire.WireError as exc:
            raise BadArg(f"cannot send to node {self.peer!r}: {exc}") from exc
        if lazy:
            self._enqueue_lazy(data)
            return
        self._write_or_queue(data, direct=self._may_write_directly())

    def _write_or_queue(self, data: bytes, *, direct: bool, marks_direct: bool = False) -> None:
        """Write ``data`` straight to the socket if ``direct`` (the lazy frames waiting go
        first, in the same write; ``marks_direct`` starts a new burst gap), and queue for the
        writer what the socket did not take; otherwise queue it all."""
        if direct:
            if self._outbox:  # lazy frames only: they go first, in the same write
                data = b"".join([*self._outbox, data])
                self._outbox = []
                self._lazy_only = False
                self.queued = 0  # they were all that waited
            if marks_direct:
                self._last_direct = time.perf_counter()
                self.heard = False
            data = self._write_directly(data)
            if not data:
                return
        if self._open_batch is not None:
            self._close_batch()
        self._lazy_only = False
        self._outbox.append(data)
        self._queue_grew(len(data))
        if self._writer_lot and not self._corked:
            self._writer_lot.unpark()

    def _enqueue_lazy(self, data: bytes) -> None:
        """Queue a lazy frame without waking the writer if nothing else waits: the next frame
        takes it along (a call's DEMONITOR goes with the next call), or the writer writes it
        once it has waited LAZY_DELAY."""
        outbox = self._outbox
        if not outbox and self._open_batch is None:
            self._lazy_only = True
            scope = self._park_scope
            if scope is None:
                self._lazy_at = trio.current_time()
            elif scope.deadline == math.inf:
                self._lazy_at = trio.current_time()
                scope.deadline = self._lazy_at + LAZY_DELAY
            # (Else the writer wakes at the deadline an earlier lazy frame set, and writes
            # this one then: sooner than LAZY_DELAY, without a clock read and a new deadline
            # for each of a stream of calls' DEMONITORs.)
        elif self._open_batch is not None:
            self._close_batch()
        outbox.append(data)
        self._queue_grew(len(data))

    def write_lazy_now(self) -> None:
        """Lazy frames waiting go out now, not LAZY_DELAY after they were queued (a stopping
        node's flush)."""
        if self._lazy_only:
            self._lazy_at = -math.inf
            scope = self._park_scope
            if scope is not None:
                scope.deadline = -math.inf

    def _queue_grew(self, added: int) -> None:
        self.queued += added
        if self.queued > self._busy_limit:
            self._busy(added)

    def enqueue_send(self, mtype: wire.MessageType, route: tuple[Any, Any], message: Any) -> None:
        """Queue a SEND (``route`` is ``(to, None)``) or REG_SEND (``(from, name)``) of the wire
        value ``message``.

        When frames are queued already, consecutive messages on one route join an open batch
        (SEND_BATCH / REG_SEND_BATCH, see wire/SPEC.md): each message is encoded alone, now, and
        the routing fields once per batch, so a burst of sends costs a value encoding each on
        this side and a value decoding each on the other. A lone message after a quiet spell
        still goes out at once as a plain frame.
        """
        if self.state == "down":
            return
        codec = self.codec
        if codec is None or (
            self._open_batch is None and (self._corked or self._may_write_directly(peek=True))
        ):
            # Nothing to join (a corked call's request, or the first frame after a quiet spell).
            self.enqueue(mtype, _send_payload(mtype, route, message))
            return
        limits = self.dist.config.limits
        try:
            # A batch's payload holds each message two levels down (its dict, its msgs list),
            # one deeper than a plain SEND's: checked against that, so the peer never refuses
            # the frame; a message only a plain frame can carry goes as one.
            item = wire.encode_value(message, codec, limits=self.dist.batch_item_limits)
        except wire.LimitExceeded:
            self.enqueue(mtype, _send_payload(mtype, route, message))
            return
        except wire.WireError as exc:
            raise BadArg(f"cannot send to node {self.peer!r}: {exc}") from exc
        run = self._open_batch
        if (
            run is not None
            and run.mtype is mtype
            and run.route == route
            and run.size + len(item) <= run.room
            and len(run.items) < BATCH_MESSAGES
        ):
            # The common case of a burst: the writer was woken when the batch began.
            run.items.append(item)
            size = len(item)
            run.size += size
            self.queued += size
            if self.queued > self._busy_limit:
                self._busy(size)
            return
        if run is not None:
            self._close_batch()
        room = self._rooms.get(route)
        if room is None:
            if len(self._rooms) >= 1024:
                self._rooms.clear()
            room = self._rooms[route] = _batch_room(mtype, route, codec, limits)
        run = self._open_batch = _OpenBatch(mtype, route, room)
        if len(item) > run.room:
            # Too big for a batch frame: a frame of its own, checked against the frame
            # limit now, so an oversized message fails in its sender, not in the writer.
            self._open_batch = None
            run.items.append(item)
            try:
                data = run.frame(codec, limits)
            except wire.WireError as exc:
                raise BadArg(f"cannot send to node {self.peer!r}: {exc}") from exc
            self._outbox.append(data)
            added = len(data)
        else:
            run.items.append(item)
            added = run.size = len(item)
        self._lazy_only = False
        if self._writer_lot and not self._corked:
            self._writer_lot.unpark()
        self._queue_grew(added)

    def _close_batch(self) -> None:
        """Turn the open batch into a frame at the end of the outbox (it fits: see
        _OpenBatch.room)."""
        run = self._open_batch
        assert run is not None and self.codec is not None
        self._open_batch = None
        frame = run.frame(self.codec, self.dist.config.limits)
        self.queued += len(frame) - run.size  # the batch's header and routing fields
        self._outbox.append(frame)

    def _take_outbox(self) -> list[bytes]:
        if self._open_batch is not None:
            self._close_batch()
        self._lazy_only = False
        batch, self._outbox = self._outbox, []
        return batch

    def _may_write_directly(self, *, peek: bool = False) -> bool:
        """Whether a frame may go straight to the socket now: an idle connection after a quiet
        spell (as BEAM writes to an idle distribution port: no writer task hop on the latency
        path). Frames that follow closely queue and go out together."""
        if (
            self.direct_fd is None
            or self._corked
            or (self._outbox and not self._lazy_only)
            or self._open_batch is not None
            or self._writing
        ):
            return False
        now = time.perf_counter()
        if not self.heard and now - self._last_direct <= DIRECT_WRITE_GAP:
            return False
        if not peek:
            self._last_direct = now
            self.heard = False
        return True

    def _write_directly(self, data: bytes) -> bytes:
        """Write what the socket takes now; returns the rest (empty when all went out)."""
        assert self.direct_fd is not None
        try:
            written = os.write(self.direct_fd, data)
        except (BlockingIOError, InterruptedError):
            written = 0
        except OSError:
            written = 0  # the writer meets the error too, and the connection closes
        self.written += written
        self.sent_since_tick = True
        return data[written:] if written < len(data) else b""

    def send_now(
        self,
        first: wire.MessageType,
        payload: Any,
        second: wire.MessageType | None = None,
        then: Any = None,
    ) -> None:
        """Queue a frame, or two that go out together (``second`` with the payload ``then``),
        at once: a remote call's MONITOR_SEND (or MONITOR and request), whose sender waits for
        the answer. Written straight to the socket, whatever the burst gap, unless something
        is being written or waits (then they queue behind it); encoded first, so a bad value
        raises and sends nothing.

        Raises:
            BadArg: a payload cannot be encoded.
        """
        codec = self.codec
        assert codec is not None
        limits = self.dist.config.limits
        try:
            data = wire.encode_message(first, payload, codec=codec, limits=limits)
            if second is not None:
                data += wire.encode_message(second, then, codec=codec, limits=limits)
        except wire.WireError as exc:
            raise BadArg(f"cannot send to node {self.peer!r}: {exc}") from exc
        if self.state == "down":
            return
        direct = (
            self.direct_fd is not None
            and self._open_batch is None
            and not self._writing
            and not self._corked
            and (not self._outbox or self._lazy_only)
        )
        self._write_or_queue(data, direct=direct, marks_direct=True)

    @contextlib.contextmanager
    def corked(self) -> Iterator[None]:
        """Frames queued inside go out together, in one write (as TCP_CORK does)."""
        self._corked = True
        try:
            yield
        finally:
            self._corked = False
        if (self._outbox or self._open_batch) and not self._writing and self.direct_fd is not None:
            rest = self._write_directly(b"".join(self._take_outbox()))
            self._last_direct = time.perf_counter()
            self.heard = False
            self.queued = len(rest)  # nothing else waits: the whole outbox was joined
            if rest:
                self._outbox.insert(0, rest)
            self._not_busy()
        if self._outbox and self._writer_lot:
            self._writer_lot.unpark()

    def take_over(self, dial: Connection) -> None:
        """This accepted connection replaces our own pending ``dial`` to the same node: the dial
        ends, and what was queued for it goes out here (its suspended senders resume)."""
        dial.state = "down"
        dial._not_busy()
        if dial.process is not None:
            dial.process.die(KILL)
        dial.settled.set()
        self._pending = dial._pending + self._pending
        self.queued += dial.queued

    def lost(self) -> None:
        """Down for good: what waits for the peer is dropped, its suspended senders resume
        (what they sent is lost with it), and whoever waits for it to settle or drain goes on."""
        self.state = "down"
        self.settled.set()
        self._not_busy()
        self._pending, self._outbox, self._open_batch, self.queued = [], [], None, 0
        self._lazy_only = False
        if self.drained is not None:
            self.drained.set()

    def went_up(self, peer: Peer) -> None:
        self.codec = peer.codec
        self.reply_demonitor = "reply_demonitor" in peer.features
        self.monitor_send = "monitor_send" in peer.features
        self.creation = peer.creation
        self.state = "up"
        pending, self._pending = self._pending, []
        for mtype, payload in pending:
            try:
                self._outbox.append(
                    wire.encode_message(
                        mtype, payload, codec=peer.codec, limits=self.dist.config.limits
                    )
                )
            except wire.WireError as exc:
                logger.error("dropped a frame queued for %s: %s", self.peer, exc)
        self.queued = sum(map(len, self._outbox))  # pending sizes were the first codec's
        self.settled.set()

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being written."""
        return not self._outbox and self._open_batch is None and not self._writing

    async def write_loop(self, stream: trio.abc.Stream) -> None:
        lot = self._writer_lot
        while True:
            while self._open_batch is None and (not self._outbox or self._lazy_only):
                due = math.inf
                if self._lazy_only:
                    due = self._lazy_at + LAZY_DELAY
                    if trio.current_time() >= due:
                        break
                with trio.CancelScope(deadline=due) as self._park_scope:
                    await lot.park()
                self._park_scope = None
            batch = self._take_outbox()
            self.sent_since_tick = True
            self._writing = True
            if len(batch) == 1:
                await self._write(stream, batch[0])
            else:
                # In slices of about WRITE_BYTES: no copy of a whole long queue at once, and
                # the ticker sees a slow reader's progress between them.
                start = size = 0
                for end, frame in enumerate(batch, 1):
                    size += len(frame)
                    if size >= WRITE_BYTES or end == len(batch):
                        await self._write(stream, b"".join(batch[start:end]))
                        start, size = end, 0
            self._writing = False
            if self.drained is not None and self.idle:
                self.drained.set()

    async def _write(self, stream: trio.abc.Stream, data: bytes) -> None:
        await stream.send_all(data)
        size = len(data)
        self.written += size
        self.queued = max(0, self.queued - size)  # 0 once lost (connection_lost)
        if self._resume is not None:
            self._not_busy()
