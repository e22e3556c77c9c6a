"""How a connection's incoming frames are read and dispatched: the frames of a plain socket
(:class:`SocketFrames`, read by the connection's reader, or by a remote call's caller while it
waits for its reply: leader/follower), and a batch of frames dispatched in order
(:func:`dispatch_batch`, for either). The connection's process and its read loop are in
``_dist_session``; what each frame does is in ``_dist_inbound``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import trio
from trio.lowlevel import Task, current_task, reschedule, wait_readable, wait_task_rescheduled

import wire

from ._dist_inbound import dropped
from ._dist_records import UnknownRemoteValue
from ._process import CURRENT_PROCESS, CallWaiter

if TYPE_CHECKING:
    from ._dist_connection import Connection
    from ._distribution import Distribution

#: The most bytes the reader takes from a plain socket at once.
READ_BYTES = 65536

#: What the leader met that ends the connection without an error: its reader's receive_frames
#: returns [] (the socket's clean end, or a connection declared lost by a frame it dispatched).
_STOP = object()


class SocketFrames:
    """A connection's incoming frames, read straight from its plain socket (the reader of
    ``_dist_session``'s ``_read_loop``; a TLS connection reads through its ``wire.FrameStream``).

    A read that drained the socket (it returned less than was asked) is almost always followed
    by a quiet socket: the next read waits until the socket is readable first, where trio's
    ``receive_some`` tries a read that fails before it waits (a system call and an exception
    on each side of every round trip). After a full read it reads again at once, after a
    checkpoint, so a peer that floods cannot starve the node's other tasks.

    A remote call's caller may read the socket itself while it waits: see :meth:`wait_reply`.
    """

    __slots__ = (
        "_closed",
        "_decoder",
        "_drained",
        "_ended",
        "_fd",
        "_follower",
        "_lead_fd",
        "_parked",
        "leader",
        "reads",
        "received",
    )

    def __init__(self, fd: int, limits: wire.Limits) -> None:
        self._fd = fd
        self._decoder = wire.FrameDecoder(limits=limits, versions=frozenset({2}))
        self._drained = False
        #: Bytes read so far (Connection.received): one addition a read, not a frame.
        self.received = 0
        #: Reads so far (the reader skips its own read when another took the bytes that woke it).
        self.reads = 0
        #: The waiter of the remote call whose caller reads the socket (see wait_reply), if any.
        self.leader: CallWaiter | None = None
        #: A duplicate of the socket's descriptor that the leader waits on (made for the first
        #: leader): trio lets one task wait on a descriptor, and this one wakes the leader alone.
        self._lead_fd: int | None = None
        #: The leader waits for the socket (what wakes it otherwise is ``_wake_leader``).
        self._parked = False
        #: What a leader met that ends the connection: an error to raise, or _STOP.
        self._ended: Any = None
        #: The reader's task while it waits for a leader to stop (see receive_frames).
        self._follower: Task | None = None
        self._closed = False

    async def receive_frames(self) -> list[wire.Frame]:
        """Every frame available (at least one, waiting for it), or ``[]`` at a clean end.

        Raises:
            wire.WireError: the peer sent malformed bytes.
            OSError: the socket failed (say, reset by the peer).
        """
        decoder = self._decoder
        decoder.feed(b"")  # raises an error found after the last frame delivered
        fd = self._fd
        while True:
            if self._ended is not None:
                ended, self._ended = self._ended, _STOP
                if ended is _STOP:
                    return []
                raise ended
            if self.leader is not None:
                # A caller reads the socket (see wait_reply): wait until it stops, off the socket.
                self._follower = current_task()
                await wait_task_rescheduled(self._abort_follower)
                continue
            if self._drained:
                reads = self.reads
                await wait_readable(fd)
                if self.reads != reads or self.leader is not None:
                    continue  # (a caller took what woke this task, or reads the rest)
            else:
                await trio.lowlevel.checkpoint()
                if self.leader is not None:
                    continue
            if self._ended is not None:
                continue
            try:
                frames = self._read()
            except (BlockingIOError, InterruptedError):
                self._drained = True
                continue
            if frames is None:
                return []
            if frames:
                return frames

    def _abort_follower(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self._follower = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _read(self) -> list[wire.Frame] | None:
        """One read of the socket: the frames it completes (maybe none), or None at its clean
        end.

        Raises:
            BlockingIOError: nothing to read.
            wire.WireError: the peer sent malformed bytes (or ended inside a frame).
            OSError: the socket failed.
        """
        data = os.read(self._fd, READ_BYTES)
        self.reads += 1
        size = len(data)
        if not size:
            self._decoder.feed_eof()
            return None
        self.received += size
        self._drained = size < READ_BYTES
        return self._decoder.feed(data)

    async def wait_reply(self, dist: Distribution, conn: Connection, waiter: CallWaiter) -> None:
        """Wait for the remote call of ``waiter`` on this connection to end, reading the socket
        in the caller's task if no other caller does (leader/follower): the reply then costs
        one trio loop pass before the caller goes on, not two (the reader's, then the
        caller's).

        Every frame read is dispatched in order, exactly as the reader dispatches it (as the
        connection's process), until the waiter is resolved: by a frame read here, or from
        elsewhere (its timeout, a deferred reply from a local process, the connection's
        loss), which wakes this wait (``_wake_leader``). The reader meanwhile waits off the
        socket and reads nothing; what ends the connection here (its end, an error, a
        malformed frame) is handed to the reader, which ends it as it would have. Cancelled,
        the caller has read nothing: it is cancelled only while it waits.
        """
        if self.leader is not None or self._closed or self._ended is not None:
            await waiter.wait()
            return
        lead_fd = self._lead_fd
        if lead_fd is None:
            lead_fd = self._lead_fd = os.dup(self._fd)
        self.leader = waiter
        waiter.wake = self._wake_leader
        try:
            while not waiter.done:
                self._parked = True
                try:
                    await wait_readable(lead_fd)
                except trio.ClosedResourceError:
                    self._parked = False
                    if self._closed:
                        break
                    continue  # (woken by _wake_leader)
                self._parked = False
                if self._ended is not None or self._closed:
                    # (closed: the connection ended after the socket woke this task, and its
                    # descriptor may be closed already, its number reused)
                    break
                try:
                    frames = self._read()
                except (BlockingIOError, InterruptedError):
                    self._drained = True
                    continue
                except Exception as exc:  # (an OSError or wire.WireError: the reader's to raise)
                    self._end(exc)
                    break
                if frames is None:
                    self._end(_STOP)
                    break
                if frames:
                    # As the connection's process dispatches them: what a frame does may
                    # depend on it (a sender's pid, a busy queue suspending the sender).
                    token = CURRENT_PROCESS.set(conn.process)  # type: ignore[arg-type]
                    try:
                        if not dispatch_batch(dist, conn, frames):
                            self._end(_STOP)
                            break
                    except Exception as exc:
                        self._end(exc)
                        break
                    finally:
                        CURRENT_PROCESS.reset(token)
        finally:
            self._parked = False
            self.leader = None
            waiter.wake = None
            follower = self._follower
            if follower is not None:
                self._follower = None
                reschedule(follower)
        if not waiter.done:
            # (The connection ended: its loss resolves the waiter.)
            await waiter.wait()

    def _wake_leader(self) -> None:
        """The leader's waiter was resolved from elsewhere: wake it if it waits for the socket
        (the only task that waits on its descriptor)."""
        if self._parked and self._lead_fd is not None:
            trio.lowlevel.notify_closing(self._lead_fd)

    def _end(self, ended: Any) -> None:
        """What the leader met ends the connection: the reader raises ``ended`` (or returns []
        for _STOP). It sees it at once: it waits for the leader to stop, or waited for the
        socket with the leader and was woken with it (by the bytes the leader read)."""
        self._ended = ended

    def close(self) -> None:
        """The connection ended: no caller reads the socket any more (a leader still waiting
        goes back to its waiter)."""
        self._closed = True
        fd = self._lead_fd
        if fd is not None:
            self._lead_fd = None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


def dispatch_batch(dist: Distribution, conn: Connection, batch: list[wire.Frame]) -> bool:
    """Dispatch every frame that arrived together, in order: one scheduler pass per read, not
    per frame (per-pair order is the order of the batch). False once the connection was
    declared lost (disconnect() does so at once): nothing more of it is delivered, or acted
    on (a "peers" list read just before would redial).

    Raises:
        wire.MalformedMessage: a frame's payload is malformed.
    """
    conn.received_since_tick = True
    conn.heard = True
    dispatch = dist.dispatch
    for frame in batch:
        if conn.state == "down":
            return False
        try:
            dispatch(conn, frame)
        except UnknownRemoteValue as exc:
            dropped(frame.type.name, exc)  # (a pg group name, say): not the connection's end
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise wire.MalformedMessage(f"bad {frame.type.name} payload: {exc!r}") from exc
    return True
