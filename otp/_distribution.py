"""Distribution: nodes that talk across OS processes and hosts (Erlang's ``net_kernel`` and
``dist_util``).

A node that starts distribution listens on Unix sockets and/or TCP (TLS by default) and keeps
one connection per peer node, made on first use or by :func:`connect`. Each connection is a
process with a reader, a writer that batches every queued frame into one write, and a pinger;
per-pair ordering holds because each pair of nodes shares one ordered stream. Every connection
process is linked to the node's net_kernel process (registered as ``otp.net_kernel``), which
serves the listeners and reaps the connections: it ends with the node, and whatever ends it
ends every connection with it (see :func:`_net_kernel`). What waits to be written to a peer is
bounded (DistConfig.busy_limit suspends its senders, queue_limit drops the connection), and a
peer that reads nothing for the liveness timeout is lost. When a connection
is lost every link and monitor across it fires with ``noconnection`` and ``monitor_node``
subscribers get :class:`NodeDown`. Peers tell each other the nodes they know, so a cluster
becomes a full mesh, as Erlang's does; that suits tens of nodes (each node holds a connection
to every other, so n nodes hold n(n-1)/2 connections).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket as _socket
import ssl
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio
from trio.lowlevel import wait_readable

import wire

from ._dist_handshake import (
    HandshakeError,
    HandshakeRefused,
    Peer,
    accept,
    initiate,
    is_node_name,
)
from ._dist_values import (
    pid_from_wire,
    reason_from_wire,
    reason_to_wire,
    ref_from_wire,
    value_from_wire,
    value_to_wire,
    wire_id,
)
from ._errors import BadArg, CallError, CallTimeout, OtpError
from ._gen_server_core import GenCall, GenCast, SystemTerminate, wait_reply
from ._ids import Pid, Ref
from ._messages import Exit, From
from ._node import NamedMonitor, Node, current_node
from ._pg import PG_NAME, GroupState
from ._process import (
    TIMED_OUT,
    CallWaiter,
    Process,
    ProcessExit,
    current_process,
    current_process_or_none,
)
from ._reasons import KILL, NOCONNECTION, NOPROC
from ._unix_socket import SocketPathTaken, claim_socket_path

logger = logging.getLogger("otp.dist")

_GEN_CALL = wire.Atom("$gen_call")
_GEN_CAST = wire.Atom("$gen_cast")
_GEN_REPLY = wire.Atom("$gen_reply")
_SYSTEM = wire.Atom("system")
_SEND = wire.MessageType.SEND
_REG_SEND = wire.MessageType.REG_SEND
_MONITOR = wire.MessageType.MONITOR
_TERMINATE = wire.Atom("terminate")
#: The mesh's peer lists travel to this name (see PG_NAME: an atom no user send names).
_NET_KERNEL = wire.Atom("$net_kernel")
#: The registered name of the process that owns the listeners and connections (_net_kernel);
#: not Erlang's ``net_kernel``, which stays free for a user's process (a remote send to it
#: reaches that process).
NET_KERNEL = "otp.net_kernel"

#: A frame is written straight to an idle socket if a frame came from the peer since the last
#: direct write (it answers: a reply), or that write is at least this old (seconds); closer
#: frames are a burst, queued and written together by the writer.
DIRECT_WRITE_GAP = 0.0001

#: The longest a lazy frame (bookkeeping such as DEMONITOR) waits for another frame to go out
#: with (seconds): then the writer writes it.
LAZY_DELAY = 0.005


class DistributionError(OtpError, RuntimeError):
    """Distribution cannot start or a node cannot be reached; the message says what to do."""


@attrs.frozen
class NodeDown:
    """``{nodedown, Node}``: the connection to ``node`` is gone (see :func:`monitor_node`)."""

    node: str


def _check_keyfile(_inst: Any, _attr: Any, value: str) -> None:
    _owner_only(Path(value), "TLS key file")


@attrs.frozen
class TlsConfig:
    """Certificates for distribution over TCP; both sides verify each other (mutual TLS).

    Attributes:
        certfile: This node's certificate chain (PEM).
        keyfile: Its private key (PEM), readable by its owner only (mode 0600 or 0400), as
            the cookie file.
        cafile: The CA that signs every node's certificate.
        server_hostname: The name peers' certificates are checked against (default: the host
            part of the address dialled).
    """

    certfile: str
    keyfile: str = attrs.field(validator=_check_keyfile)
    cafile: str
    server_hostname: str | None = None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.cafile)
        context.load_cert_chain(self.certfile, self.keyfile)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cafile)
        context.load_cert_chain(self.certfile, self.keyfile)
        return context


def _check_cookie(_inst: Any, _attr: Any, value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) < 8:
        raise DistributionError(
            "DistConfig.cookie must be at least 8 bytes: every node of a cluster shares it"
        )


@attrs.frozen
class DistConfig:
    """How a node takes part in distribution.

    Attributes:
        cookie: The shared secret (never sent; proven by HMAC).
        listen: Addresses to listen on: ``"unix:/path"`` or ``"tcp:host:port"``.
        tls: Certificates for TCP; required for TCP unless ``insecure_tcp``.
        insecure_tcp: Allow plain TCP (logged as a warning: the cookie alone is no security).
        liveness_timeout: Seconds without any frame from a peer before its connection counts as
            lost (noticed within 1.25 times this, as Erlang's ``net_ticktime``); pings every
            quarter of it keep an idle connection alive.
        handshake_timeout: Seconds a peer has to finish the handshake.
        codecs: Payload codecs this node speaks, most preferred first.
        mesh: Connect to the nodes peers know about (a full mesh, as Erlang's ``global``).
        limits: Decoding limits for frames from peers.
        busy_limit: Bytes waiting to be written to one peer past which the connection is busy
            (Erlang's ``dist_buf_busy_limit``, ``+zdbbl``): a process that sends to it then is
            suspended at its next receive or remote call until half of that is written.
        queue_limit: Bytes waiting for one peer past which its connection counts as lost
            (``noconnection``), for senders that never wait in a receive.
        mesh_max_nodes: Most nodes this node learns of from its peers' lists (the rest of
            a longer list is ignored, with a warning).
        mesh_dial_rate: Most dials a second to nodes learnt from peers' lists.
        hidden: This node is hidden (Erlang's ``-hidden``; a remote observer): its connections
            are in no node list, peer list or process group on either side (hidden nodes).
    """

    cookie: bytes = attrs.field(validator=_check_cookie, repr=False)
    listen: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    tls: TlsConfig | None = None
    insecure_tcp: bool = False
    liveness_timeout: float = 60.0
    handshake_timeout: float = 5.0
    codecs: tuple[wire.Codec, ...] = (wire.Codec.TLV, wire.Codec.CBOR)
    mesh: bool = True
    limits: wire.Limits = attrs.field(factory=lambda: wire.Limits(max_payload=64 * 1024 * 1024))
    busy_limit: int = 1024 * 1024
    queue_limit: int = 64 * 1024 * 1024
    mesh_max_nodes: int = 256
    mesh_dial_rate: float = 10.0
    hidden: bool = False  # hidden nodes (observer-remote)

    def __attrs_post_init__(self) -> None:
        # Checked now, so a bad setting fails where it is made (the CLI's flags, a config),
        # not later inside the running node.
        for name in ("liveness_timeout", "handshake_timeout", "mesh_dial_rate"):
            seconds = getattr(self, name)
            if not seconds > 0:
                raise DistributionError(f"DistConfig.{name} must be above 0 (got {seconds!r})")
        for name in ("busy_limit", "queue_limit", "mesh_max_nodes"):
            size = getattr(self, name)
            if type(size) is not int or size < 1:
                raise DistributionError(f"DistConfig.{name} is a number of bytes (got {size!r})")
        if self.queue_limit < self.busy_limit:
            raise DistributionError(
                f"DistConfig.queue_limit ({self.queue_limit}) must be at least busy_limit"
                f" ({self.busy_limit}): senders are suspended at busy_limit, before the queue"
                " is dropped at queue_limit"
            )
        for address in self.listen:
            kind, _ = parse_address(address)
            if kind == "tcp" and self.tls is None and not self.insecure_tcp:
                raise DistributionError(
                    f"listening on {address} needs TLS certificates (DistConfig.tls, --tls-cert"
                    " --tls-key --tls-ca); plain TCP only with insecure_tcp=True (--insecure-tcp)"
                )


def read_cookie_file(path: str | os.PathLike[str]) -> bytes:
    """The cookie in ``path``, which must be readable by its owner only (mode 0600 or 0400).

    Raises:
        DistributionError: the file is missing, empty, or readable by group or others.
    """
    p = Path(path)
    _owner_only(p, "cookie file")
    try:
        cookie = p.read_bytes().strip()
    except OSError as exc:
        raise DistributionError(f"cookie file {p}: cannot read it ({exc})") from exc
    if not cookie:
        raise DistributionError(f"cookie file {p} is empty: write a long random secret into it")
    return cookie


def _owner_only(p: Path, what: str) -> None:
    """Refuse a secret's file that group or others may read (or that cannot be read)."""
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise DistributionError(f"{what} {p}: cannot read it ({exc})") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DistributionError(
            f"{what} {p} has mode {stat.S_IMODE(mode):04o}: it must be readable by its owner"
            f" only; run: chmod 600 {p}"
        )


def parse_address(address: str) -> tuple[str, Any]:
    """``"unix:/path"`` -> ("unix", path); ``"tcp:host:port"`` -> ("tcp", (host, port))."""
    kind, sep, rest = address.partition(":")
    if kind == "unix" and sep and rest:
        return "unix", rest
    if kind == "tcp" and sep:
        host, sep2, port = rest.rpartition(":")
        if sep2 and host and port.isdigit():
            return "tcp", (host.strip("[]"), int(port))
    raise DistributionError(
        f"an address is 'unix:/path/to/socket' or 'tcp:host:port' (got {address!r})"
    )


#: Limits until a peer has proved the cookie: handshake frames are small (Erlang's handshake
#: messages have a 16-bit length), so a stranger cannot make the node buffer a large one.
_HANDSHAKE_LIMITS = wire.Limits(max_payload=65535)

#: The longest address taken from a peer's list of nodes.
MAX_ADDRESS = 1024

#: About the most bytes the writer hands the socket in one write.
WRITE_BYTES = 256 * 1024

#: Most messages, and about the most bytes, in one SEND_BATCH / REG_SEND_BATCH frame.
BATCH_MESSAGES = 1024
BATCH_BYTES = 65536


class _Run:
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
        self._run: _Run | None = None
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
        #: Set by the reader: frames came from the peer since the last direct write.
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
        self.hidden = False  # hidden nodes (observer-remote)
        #: Set (and dropped) once the queue is below half DistConfig.busy_limit again: what
        #: the senders it suspended wait for (see _busy).
        self._resume: trio.Event | None = None

    def __repr__(self) -> str:
        return f"<Connection {self.peer} {self.state}>"

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
        if self._run is not None:
            self._close_run()
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
        if not outbox and self._run is None:
            self._lazy_only = True
            self._lazy_at = trio.current_time()
            scope = self._park_scope
            if scope is not None and scope.deadline == math.inf:
                scope.deadline = self._lazy_at + LAZY_DELAY
        elif self._run is not None:
            self._close_run()
        outbox.append(data)
        self._queue_grew(len(data))

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
            self._run is None and (self._corked or self._may_write_directly(peek=True))
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
        run = self._run
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
            self._close_run()
        room = self._rooms.get(route)
        if room is None:
            if len(self._rooms) >= 1024:
                self._rooms.clear()
            room = self._rooms[route] = _batch_room(mtype, route, codec, limits)
        run = self._run = _Run(mtype, route, room)
        if len(item) > run.room:
            # Too big for a batch frame: a frame of its own, checked against the frame
            # limit now, so an oversized message fails in its sender, not in the writer.
            self._run = None
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

    def _close_run(self) -> None:
        """Turn the open batch into a frame at the end of the outbox (it fits: see _Run.room)."""
        run = self._run
        assert run is not None and self.codec is not None
        self._run = None
        frame = run.frame(self.codec, self.dist.config.limits)
        self.queued += len(frame) - run.size  # the batch's header and routing fields
        self._outbox.append(frame)

    def _take_outbox(self) -> list[bytes]:
        if self._run is not None:
            self._close_run()
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
            or self._run is not None
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
        self, first: wire.MessageType, payload: Any, second: wire.MessageType, then: Any
    ) -> None:
        """Queue two frames that go out together and at once (a remote call's MONITOR and
        request, whose sender waits for the answer): written straight to the socket, whatever
        the burst gap, unless something is being written or waits (then they queue behind it);
        encoded first, so a bad value raises and sends nothing.

        Raises:
            BadArg: a payload cannot be encoded.
        """
        codec = self.codec
        assert codec is not None
        limits = self.dist.config.limits
        try:
            data = wire.encode_message(first, payload, codec=codec, limits=limits)
            data += wire.encode_message(second, then, codec=codec, limits=limits)
        except wire.WireError as exc:
            raise BadArg(f"cannot send to node {self.peer!r}: {exc}") from exc
        if self.state == "down":
            return
        direct = (
            self.direct_fd is not None
            and self._run is None
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
        if (self._outbox or self._run) and not self._writing and self.direct_fd is not None:
            rest = self._write_directly(b"".join(self._take_outbox()))
            self._last_direct = time.perf_counter()
            self.heard = False
            self.queued = len(rest)  # nothing else waits: the whole outbox was joined
            if rest:
                self._outbox.insert(0, rest)
            self._not_busy()
        if self._outbox and self._writer_lot:
            self._writer_lot.unpark()

    def went_up(self, peer: Peer) -> None:
        self.codec = peer.codec
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
        return not self._outbox and self._run is None and not self._writing

    async def write_loop(self, stream: trio.abc.Stream) -> None:
        lot = self._writer_lot
        while True:
            while self._run is None and (not self._outbox or self._lazy_only):
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


class Distribution:
    """The distribution state of one node (``node.distribution``)."""

    def __init__(self, node: Node, config: DistConfig) -> None:
        self.node = node
        self.config = config
        limits = config.limits
        #: The limits a message in a batch frame is encoded under (see enqueue_send).
        self.batch_item_limits = attrs.evolve(limits, max_depth=max(1, limits.max_depth - 2))
        self.connections: dict[str, Connection] = {}
        self.addresses: dict[str, str] = {}
        self.listening: list[str] = []
        self.node_watchers: dict[str, list[Pid]] = {}
        self.nodeup_hooks: list[Callable[[str], None]] = []
        self.nodedown_hooks: list[Callable[[str], None]] = []
        self._listeners: list[trio.abc.Listener[Any]] = []
        #: The socket files this node made, each with its inode (removed on stop if still ours).
        self._socket_files: list[tuple[Path, int]] = []
        #: The net_kernel process (see _net_kernel): it owns the listeners and every connection.
        self.kernel: Process | None = None
        #: The connection processes linked to the kernel (what it reaps when it stops).
        self.children: set[Pid] = set()
        #: Nodes learnt from peers' lists, waiting for the kernel's dialer (_dial_learnt).
        self._to_dial: dict[str, None] = {}
        self._dial_lot = trio.lowlevel.ParkingLot()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the listeners, then start the net_kernel process that serves them."""
        holder = self.node.names.get(NET_KERNEL)
        if holder is not None:
            raise DistributionError(
                f"cannot start distribution: {holder.pid!r} is registered as {NET_KERNEL!r},"
                " the name of the process that owns the node's connections; unregister it"
            )
        try:
            for address in self.config.listen:
                kind, where = parse_address(address)
                if kind == "tcp" and self.config.tls is None and not self.config.insecure_tcp:
                    raise DistributionError(
                        f"listening on {address} needs TLS certificates (DistConfig.tls); plain"
                        " TCP only with insecure_tcp=True (--insecure-tcp)"
                    )
                listener = await _open_listener(kind, where)
                self._listeners.append(listener)
                if kind == "unix":
                    self._socket_files.append((Path(where), os.stat(where).st_ino))
                self.listening.append(_bound_address(kind, where, listener))
        except BaseException:
            self._close_listeners()
            raise
        kernel = self.node.spawn(_net_kernel, (self,), None, trap_exit=True)
        kernel.behaviour = "net_kernel"
        kernel.name = NET_KERNEL
        self.node.names[NET_KERNEL] = kernel
        self.kernel = kernel
        if self.config.insecure_tcp:
            logger.warning(
                "distribution over plain TCP (--insecure-tcp): anyone who can reach the port and"
                " guess the cookie controls this node; use TLS outside a trusted network"
            )

    def stopped(self) -> None:
        """The net_kernel is gone: every connection with it (noconnection for what crosses
        them), the listeners closed, this node's socket files removed; the node is no longer
        distributed (``start_distribution`` may start it again)."""
        self.kernel = None
        for pid in list(self.children):
            proc = self.node.resolve(pid)
            if proc is not None:
                proc.die(KILL)
        self.children.clear()
        for conn in list(self.connections.values()):
            self.connection_lost(conn)
        self._close_listeners()
        if self.node.distribution is self:
            self.node.distribution = None

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            sock = getattr(listener, "socket", None)
            if sock is not None:
                sock.close()  # their tasks, if any, were cancelled with the kernel
        self._listeners.clear()
        for path, inode in self._socket_files:
            _remove_own_socket(path, inode)
        self._socket_files.clear()

    async def flush(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until every connection has written what is queued:
        a node that stops gracefully delivers what it sent last."""
        with trio.move_on_after(timeout):
            for conn in list(self.connections.values()):
                if conn.state == "up" and not conn.idle:
                    conn.drained = trio.Event()
                    await conn.drained.wait()

    async def _serve(self, listener: trio.abc.Listener[Any], address: str) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    logger.warning("distribution listener: accept failed: %s", exc)
                    await trio.sleep(0.1)
                    continue
                self._spawn_connection(None, stream, _peer_address(stream, address))

    # -- connections -------------------------------------------------------------------------

    def _spawn_connection(
        self, conn: Connection | None, stream: trio.abc.Stream | None, address: str | None
    ) -> None:
        assert self.kernel is not None
        # Linked to the net_kernel, which reaps it (see _net_kernel).
        proc = self.node.spawn(
            _run_connection, (self, conn, stream, address), self.kernel, link=True
        )
        self.children.add(proc.pid)
        proc.behaviour = f"dist_connection {conn.peer if conn else '(accepting)'}"
        if conn is not None:
            conn.process = proc

    def connection(self, peer: str, *, connect: bool = True) -> Connection | None:
        """The connection to ``peer``, dialling it first if ``connect`` and its address is known."""
        conn = self.connections.get(peer)
        if conn is not None or not connect:
            return conn
        address = self.addresses.get(peer)
        if address is None or peer == self.node.name or self.kernel is None:
            return None
        conn = Connection(self, peer)
        self.connections[peer] = conn
        self._spawn_connection(conn, None, address)
        return conn

    def admit(self, peer: str) -> Connection | None:
        """Let the peer's dial in, or raise :class:`HandshakeError`; returns our own pending dial
        to ``peer`` that the peer's replaces, if any (see :meth:`rival_failed`)."""
        if peer == self.node.name:
            raise HandshakeError(f"the peer claims this node's own name {peer!r}")
        existing = self.connections.get(peer)
        if existing is None or existing.state == "up":
            # Up: the peer dials again, so it no longer has the connection we still count (it
            # restarted, or dropped it before we noticed). As OTP's handshake answers "alive"
            # and the initiator "true", the new connection replaces the old one, once it has
            # proved the cookie (see connection_up).
            return None
        # Both sides dialled at once: the node with the smaller name keeps its own dial.
        if self.node.name < peer:
            raise HandshakeError(f"simultaneous connect with {peer!r}: keeping our own dial")
        # The peer refuses our dial; that is no lost connection while this one may still
        # take it over, with what is queued (connection_up; see _await_rival).
        existing.rivals += 1
        existing.rival_came = True
        return existing

    def rival_failed(self, dial: Connection) -> None:
        """An accepted handshake that was to replace our pending ``dial`` failed."""
        dial.rivals -= 1
        dial.rival_lot.unpark_all()

    def connection_up(self, conn: Connection, peer: Peer) -> Connection:
        existing = self.connections.get(peer.name)
        if existing is not None and existing is not conn:
            if existing.state == "up":
                # The peer reconnected (see admit): the old connection is lost, with
                # noconnection for every link and monitor across it and a NodeDown.
                self.connection_lost(existing)
                if existing.process is not None:
                    existing.process.die(KILL)
            else:
                # An accepted connection replaces our own pending dial to the same node.
                existing.state = "down"
                existing._not_busy()  # its suspended senders resume: the queue moves over
                if existing.process is not None:
                    existing.process.die(KILL)
                existing.settled.set()
                conn._pending = existing._pending + conn._pending
                conn.queued += existing.queued
        conn.peer = peer.name
        self.connections[peer.name] = conn
        conn.hidden = peer.hidden  # hidden nodes (observer-remote)
        for address in peer.listen[: 0 if peer.hidden else 1]:  # hidden nodes (observer-remote)
            self.addresses.setdefault(peer.name, address)
        conn.went_up(peer)
        logger.info("connected to node %s (%s)", peer.name, conn.codec.value if conn.codec else "")
        if self.config.mesh and not peer.hidden:  # hidden nodes (observer-remote)
            known = {name: addr for name, addr in self.addresses.items() if name != peer.name}
            if self.listening:
                known[self.node.name] = self.listening[0]
            conn.enqueue(
                wire.MessageType.REG_SEND,
                {"from": _wire_pid(self.node, None), "to": _NET_KERNEL, "msg": ("peers", known)},
            )
        for hook in () if peer.hidden else self.nodeup_hooks:  # hidden nodes (observer-remote)
            hook(peer.name)
        return conn

    def connection_lost(self, conn: Connection) -> None:
        was_up = conn.state == "up"
        conn.state = "down"
        conn.settled.set()
        conn._not_busy()  # its suspended senders resume (what they sent is lost with it)
        conn._pending, conn._outbox, conn._run, conn.queued = [], [], None, 0
        conn._lazy_only = False
        if conn.drained is not None:
            conn.drained.set()
        if self.connections.get(conn.peer) is conn:
            del self.connections[conn.peer]
        else:
            return
        peer = conn.peer
        node = self.node
        for proc in list(node.processes.values()):
            if not proc.alive:
                continue
            if proc.links:
                for other in [p for p in proc.links if p.node == peer]:
                    proc.links.discard(other)
                    node.exit_signal(proc, other, NOCONNECTION, True)
            if proc.monitors:
                for ref, target in list(proc.monitors.items()):
                    target_pid = target.pid if isinstance(target, NamedMonitor) else target
                    if target_pid.node == peer:
                        node.deliver_down(proc.pid, ref, target_pid, NOCONNECTION)
            if proc.monitored_by:
                for ref in [r for r, w in proc.monitored_by.items() if w.node == peer]:
                    del proc.monitored_by[ref]
        for watcher in self.node_watchers.pop(peer, []):
            target = node.resolve(watcher)
            if target is not None:
                target.deliver(NodeDown(peer))
        if was_up:
            logger.info("lost the connection to node %s", peer)
            for hook in () if conn.hidden else self.nodedown_hooks:  # hidden (observer-remote)
                hook(peer)

    # -- the hooks the core calls for remote pids --------------------------------------------

    def _conn_for(self, peer: str) -> Connection | None:
        return self.connection(peer)

    def send(self, dest: Any, message: Any) -> None:
        if dest.__class__ is Pid:
            conn = self._conn_for(dest.node)
            if conn is None:
                return
            conn.enqueue_send(
                wire.MessageType.SEND,
                (_wire_pid(self.node, dest), None),
                self._message_to_wire(message),
            )
            return
        name, peer = dest
        if name.__class__ is not str:
            raise _bad_name(dest)
        conn = self._conn_for(peer)
        if conn is None:
            return
        conn.enqueue_send(
            wire.MessageType.REG_SEND,
            (_wire_pid(self.node, _sender()), name),
            self._message_to_wire(message),
        )

    def _message_to_wire(self, message: Any) -> Any:
        cls = message.__class__
        if cls is GenCall:
            return (
                _GEN_CALL,
                (value_to_wire(message.from_.pid), value_to_wire(message.from_.tag)),
                value_to_wire(message.request),
            )
        if cls is GenCast:
            return (_GEN_CAST, value_to_wire(message.request))
        if cls is SystemTerminate:
            return (_SYSTEM, _TERMINATE, reason_to_wire(message.reason))
        return value_to_wire(message)

    def link(self, me: Pid, remote: Pid) -> None:
        conn = self._conn_for(remote.node)
        if conn is None:
            self._unreachable_link(me, remote)
            return
        conn.enqueue(
            wire.MessageType.LINK, {"from": value_to_wire(me), "to": value_to_wire(remote)}
        )

    def _unreachable_link(self, me: Pid, remote: Pid) -> None:
        proc = self.node.resolve(me)
        if proc is not None:
            if proc.links is not None:
                proc.links.discard(remote)
            self.node.exit_signal(proc, remote, NOCONNECTION, True)

    def unlink(self, me: Pid, remote: Pid) -> None:
        conn = self._conn_for(remote.node)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.UNLINK, {"from": value_to_wire(me), "to": value_to_wire(remote)}
            )

    def exit(self, sender: Pid, remote: Pid, reason: Any) -> None:
        conn = self._conn_for(remote.node)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.EXIT2,
                {
                    "from": value_to_wire(sender),
                    "to": value_to_wire(remote),
                    "reason": reason_to_wire(reason),
                },
            )

    def send_link_exit(self, pid: Pid, remote: Pid, reason: Any) -> None:
        conn = self.connections.get(remote.node)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.EXIT,
                {
                    "from": value_to_wire(pid),
                    "to": value_to_wire(remote),
                    "reason": reason_to_wire(reason),
                },
            )

    def monitor(self, me: Pid, target: Any, ref: Ref) -> None:
        """Monitor a remote pid or ``(name, node)``; the caller recorded the monitor already.

        Raises:
            TypeError: the name is not a str (the monitor is dropped again).
        """
        if target.__class__ is Pid:
            peer = target.node
        else:
            name, peer = target
            if name.__class__ is not str:
                proc = self.node.resolve(me)
                if proc is not None and proc.monitors is not None:
                    proc.monitors.pop(ref, None)
                raise _bad_name(target)
        conn = self._conn_for(peer)
        if conn is None:
            self.node.deliver_down(me, ref, target, NOCONNECTION)
            return
        to = value_to_wire(target) if target.__class__ is Pid else target[0]
        conn.enqueue(
            wire.MessageType.MONITOR,
            {"from": value_to_wire(me), "to": to, "ref": value_to_wire(ref)},
        )

    def send_demonitor(self, me: Pid, target: Pid | NamedMonitor, ref: Ref) -> None:
        """Drop the monitor ``ref`` on a remote target (a pid, or a name recorded as
        :class:`NamedMonitor`)."""
        if isinstance(target, NamedMonitor):
            peer, to = target.pid.node, target.label[0]
        else:
            peer, to = target.node, value_to_wire(target)
        conn = self.connections.get(peer)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.DEMONITOR,
                {"from": value_to_wire(me), "to": to, "ref": value_to_wire(ref)},
                lazy=True,
            )

    def send_down(self, watcher: Pid, ref: Ref, pid: Any, reason: Any) -> None:
        conn = self.connections.get(watcher.node)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.DOWN,
                {
                    "from": value_to_wire(pid),
                    "to": value_to_wire(watcher),
                    "ref": value_to_wire(ref),
                    "reason": reason_to_wire(reason),
                },
            )

    def reply(self, from_: From, value: Any) -> None:
        pid = from_.pid
        conn = self.connections.get(pid.node)
        if conn is not None:
            conn.enqueue(
                _SEND,
                {
                    "to": wire_id(pid),
                    "msg": (_GEN_REPLY, value_to_wire(from_.tag), value_to_wire(value)),
                },
            )

    async def call(self, me: Process, server: Any, request: Any, timeout: float | None) -> Any:
        """``GenServer.call`` of a server on another node: monitor it and send the request in
        one write (the MONITOR first: its DOWN then always carries the reason the server exited
        with), then wait for the reply or the DOWN, which the monitor's ref (an alias) routes
        to this call's waiter; the DEMONITOR goes lazily, with the next frame.

        Raises:
            BadArg: the request cannot cross to another node (nothing is sent or recorded).
            TypeError: ``server`` is ``(name, node)`` with a name that is not a str.
        """
        if server.__class__ is Pid:
            peer = server.node
        else:
            name, peer = server
            if name.__class__ is not str:
                raise _bad_name(server)
        conn = self.connections.get(peer)
        if conn is None:
            conn = self.connection(peer)
        if conn is not None and conn.busy:
            # As a send to a busy port suspends its sender, before the request is queued.
            await conn.wait_not_busy()
            conn = self._conn_for(peer)
        node = self.node
        ref = node.make_ref()
        if conn is None or conn.codec is None:
            waiter = self._watch(me, server, ref)
            if conn is None:
                self.monitor(me.pid, server, ref)  # (a DOWN with noconnection, at once)
            else:
                with conn.corked():
                    self.monitor(me.pid, server, ref)
                    self.send(server, GenCall(From(me.pid, ref), request))
        else:
            wire_me = wire_id(me.pid)
            wire_ref = wire_id(ref)
            message = (_GEN_CALL, (wire_me, wire_ref), value_to_wire(request))
            if server.__class__ is Pid:
                to = wire_id(server)
                sent = {"to": to, "msg": message}
                mtype = _SEND
            else:
                to = name
                sent = {"from": wire_me, "to": name, "msg": message}
                mtype = _REG_SEND
            conn.send_now(_MONITOR, {"from": wire_me, "to": to, "ref": wire_ref}, mtype, sent)
            waiter = self._watch(me, server, ref)
        timer = node.timers.start(timeout, waiter.time_out) if timeout is not None else None
        try:
            await waiter.wait()
        finally:
            self._unwatch(me, ref)
            if timer is not None:
                node.timers.cancel(timer)
        value = waiter.value
        if value is TIMED_OUT:
            raise CallTimeout("timeout", server, request)
        if waiter.is_down:
            raise CallError(value, server, request)
        return value

    async def stop(self, me: Process, server: Any, reason: Any, timeout: float | None) -> Any:
        """``GenServer.stop`` of a server on another node: monitor it, send it a system
        terminate (OTP's ``proc_lib:stop``) and return its exit reason (``"noproc"`` if it was
        not alive, ``"noconnection"`` if its node is unreachable), or TIMED_OUT."""
        waiter = await self._ask(me, server, lambda _ref: SystemTerminate(reason), timeout)
        return waiter.value

    async def _ask(
        self, me: Process, server: Any, message: Callable[[Ref], Any], timeout: float | None
    ) -> CallWaiter:
        """Monitor the remote ``server`` and send it ``message(ref)`` in one batch, monitor
        first (its DOWN then always carries the reason it exited with); wait for the reply or
        the DOWN, which the monitor's ref (an alias) routes to the returned waiter."""
        peer = server.node if server.__class__ is Pid else server[1]
        conn = self._conn_for(peer)
        if conn is not None and conn.busy:
            # As a send to a busy port suspends its sender, before the request is queued.
            await conn.wait_not_busy()
            conn = self._conn_for(peer)
        ref = self.node.make_ref()
        waiter = self._watch(me, server, ref)
        if conn is None:
            self.monitor(me.pid, server, ref)
        else:
            with conn.corked():
                self.monitor(me.pid, server, ref)
                self.send(server, message(ref))
        await wait_reply(self.node, waiter, timeout, lambda: self._unwatch(me, ref))
        return waiter

    def _watch(self, me: Process, server: Any, ref: Ref) -> CallWaiter:
        """Record a monitor of the remote ``server`` whose ``ref`` is an alias routing its DOWN
        (and a reply) to the returned waiter; the caller sends the MONITOR."""
        waiter = CallWaiter()
        if me.aliases is None:
            me.aliases = {}
        me.aliases[ref] = waiter
        if me.monitors is None:
            me.monitors = {}
        if server.__class__ is Pid:
            me.monitors[ref] = server
        else:
            me.monitors[ref] = NamedMonitor(Pid._make(server[1], 0, 0), server)
        return waiter

    def _unwatch(self, me: Process, ref: Ref) -> None:
        assert me.aliases is not None
        me.aliases.pop(ref, None)
        target = me.monitors.pop(ref, None) if me.monitors is not None else None
        if target is not None:
            self.send_demonitor(me.pid, target, ref)

    def monitor_node(self, watcher: Pid, peer: str, enable: bool) -> None:
        if not enable:
            watchers = self.node_watchers.get(peer)
            if watchers and watcher in watchers:
                watchers.remove(watcher)
                if not watchers:
                    del self.node_watchers[peer]
            return
        if peer == self.node.name:
            return  # this node cannot go down under its own processes: no NodeDown, ever
        proc = self.node.resolve(watcher)
        if proc is None:
            return
        conn = self.connection(peer)
        if conn is None:
            proc.deliver(NodeDown(peer))
            return
        self.node_watchers.setdefault(peer, []).append(watcher)
        # As Erlang's, a process's node monitors go with it.
        hooks = proc.exit_hooks
        if hooks is None:
            proc.exit_hooks = [self._node_watcher_exited]
        elif self._node_watcher_exited not in hooks:
            hooks.append(self._node_watcher_exited)

    def _node_watcher_exited(self, proc: Process, _reason: Any) -> None:
        pid = proc.pid
        for peer, watchers in list(self.node_watchers.items()):
            if pid in watchers:
                watchers[:] = [w for w in watchers if w != pid]
                if not watchers:
                    del self.node_watchers[peer]

    # -- incoming ----------------------------------------------------------------------------

    def dispatch(self, conn: Connection, frame: wire.Frame) -> None:
        """Act on one frame from ``conn``'s peer (called by its reader)."""
        node = self.node
        t = frame.type
        p = frame.payload
        M = wire.MessageType
        # The most frequent first: a remote call is a MONITOR, a SEND or REG_SEND and a
        # DEMONITOR each way.
        if t is M.SEND:
            message = p["msg"]
            proc = _local(p["to"], node)
            if proc is not None:
                self._deliver_to(proc, message)
        elif t is M.REG_SEND:
            self._reg_send(conn, p["to"], p["msg"])
        elif t is M.MONITOR:
            self._on_monitor(
                _peer_pid(conn, p["from"], node), p["to"], value_from_wire(p["ref"], node)
            )
        elif t is M.DEMONITOR:
            to = p["to"]
            if isinstance(to, wire.Pid):
                target = node.resolve(pid_from_wire(to, node))
            else:
                target = node.names.get(_registered_name(to))
            if target is not None and target.monitored_by is not None:
                target.monitored_by.pop(value_from_wire(p["ref"], node), None)
        elif t is M.SEND_BATCH:
            messages = _batch(p)
            proc = node.resolve(pid_from_wire(p["to"], node))
            if proc is not None:
                for message in messages:
                    self._deliver_to(proc, message)
        elif t is M.REG_SEND_BATCH:
            name = p["to"]
            for message in _batch(p):
                self._reg_send(conn, name, message)
        elif t is M.LINK:
            sender, target = (
                _peer_pid(conn, p["from"], node),
                node.resolve(pid_from_wire(p["to"], node)),
            )
            if target is None:
                self.send_link_exit(pid_from_wire(p["to"], node), sender, NOPROC)
            elif target.links is None:
                target.links = {sender}
            else:
                target.links.add(sender)
        elif t is M.UNLINK:
            target = node.resolve(pid_from_wire(p["to"], node))
            if target is not None and target.links is not None:
                target.links.discard(pid_from_wire(p["from"], node))
        elif t is M.EXIT:
            sender = pid_from_wire(p["from"], node)
            target = node.resolve(pid_from_wire(p["to"], node))
            if target is not None and target.links is not None and sender in target.links:
                target.links.discard(sender)
                node.exit_signal(target, sender, reason_from_wire(p["reason"], node), True)
        elif t is M.EXIT2:
            target = node.resolve(pid_from_wire(p["to"], node))
            if target is not None:
                node.exit_signal(
                    target,
                    pid_from_wire(p["from"], node),
                    reason_from_wire(p["reason"], node),
                    False,
                )
        elif t is M.DOWN:
            sender = p["from"]
            label = pid_from_wire(sender, node) if isinstance(sender, wire.Pid) else sender
            ref = value_from_wire(p["ref"], node)
            watcher = node.resolve(pid_from_wire(p["to"], node))
            # A DOWN for a monitor the watcher already dropped (demonitor crossed it) is stale.
            if watcher is not None and watcher.monitors is not None and ref in watcher.monitors:
                node.deliver_down(watcher.pid, ref, label, reason_from_wire(p["reason"], node))
        elif t is M.PING:
            # Any frame tells the peer we are alive: none is added while some wait (a peer
            # that floods PINGs and reads nothing would grow the queue by a PONG each).
            if not conn.queued:
                conn.enqueue(M.PONG, None)
        elif t is M.PONG:
            pass
        else:
            raise wire.MalformedMessage(f"{t.name} is not a message nodes send each other")

    def _reg_send(self, conn: Connection, name: Any, message: Any) -> None:
        node = self.node
        if name.__class__ is not str:
            if name == _NET_KERNEL:
                self._net_kernel(conn, message)
                return
            if name == PG_NAME:
                if node.pg is not None and not conn.hidden:  # hidden nodes (observer-remote)
                    node.pg.from_peer(conn.peer, message)
                return
            name = _registered_name(name)
        proc = node.names.get(name)
        if proc is not None:
            self._deliver_to(proc, message)

    def _on_monitor(self, watcher: Pid, to: Any, ref: Ref) -> None:
        node = self.node
        if isinstance(to, wire.Pid):
            target = node.resolve(pid_from_wire(to, node))
        else:
            target = node.names.get(_registered_name(to))
        if target is None:
            self.send_down(watcher, ref, _down_label(to, node), NOPROC)
            return
        if target.monitored_by is None:
            target.monitored_by = {ref: watcher}
        else:
            target.monitored_by[ref] = watcher

    def _deliver_to(self, proc: Process, message: Any) -> None:
        node = self.node
        if message.__class__ is tuple and message and message[0].__class__ is wire.Atom:
            # Compared by name: a decoded atom is a new object, and its attrs __eq__ a call.
            tag = message[0].name
            if tag == "$gen_reply" and len(message) == 3:
                ref = value_from_wire(message[1], node)
                if proc.aliases is not None:
                    waiter = proc.aliases.get(ref)
                    if waiter is not None:
                        waiter.resolve(value_from_wire(message[2], node), False)
                return
            if tag == "$gen_call" and len(message) == 3:
                pid, ref = message[1]
                if ref.__class__ is wire.Ref:
                    ref = ref_from_wire(ref)  # (its wire form kept for the reply)
                else:
                    ref = value_from_wire(ref, node)
                from_ = From(pid_from_wire(pid, node), ref)
                proc.deliver(GenCall(from_, value_from_wire(message[2], node)))
                return
            if tag == "$gen_cast" and len(message) == 2:
                proc.deliver(GenCast(value_from_wire(message[1], node)))
                return
            if (
                tag == "system"
                and len(message) == 3
                and message[1] == _TERMINATE
                and message[2].__class__ is wire.ExitReason
            ):
                proc.deliver(SystemTerminate(reason_from_wire(message[2], node)))
                return
        proc.deliver(value_from_wire(message, node))

    def _net_kernel(self, conn: Connection, message: Any) -> None:
        if (
            self.config.mesh
            and not conn.hidden  # hidden nodes (observer-remote)
            and isinstance(message, tuple)
            and len(message) == 2
            and message[0] == "peers"
            and isinstance(message[1], dict)
        ):
            room = self.config.mesh_max_nodes
            for name, address in message[1].items():
                if not (is_node_name(name) and isinstance(address, str)):
                    continue
                if name == self.node.name or name in self.connections:
                    continue
                if name not in self.addresses and len(self.addresses) >= room:
                    logger.warning(
                        "node %s told of more nodes than mesh_max_nodes=%d: the rest ignored",
                        conn.peer,
                        room,
                    )
                    break
                if len(address) > MAX_ADDRESS or not address.isprintable():
                    continue  # it would be logged: no control characters, no novel
                try:
                    parse_address(address)
                except DistributionError:
                    continue
                self.addresses.setdefault(name, address)
                self._to_dial[name] = None
            if self._to_dial:
                self._dial_lot.unpark()

    async def dial_learnt(self) -> None:
        """Dial the nodes learnt from peers' lists, at most mesh_dial_rate a second (a task of
        the net_kernel): a long list is no burst of connections."""
        while True:
            while not self._to_dial:
                await self._dial_lot.park()
            name = next(iter(self._to_dial))
            del self._to_dial[name]
            if name in self.connections:
                continue
            self.connection(name)
            await trio.sleep(1 / self.config.mesh_dial_rate)


def _wire_pid(node: Node, pid: Pid | None) -> wire.Pid:
    """The wire form of a sender's pid; outside any process, the node's own pseudo-pid 0."""
    if pid is None:
        return wire.Pid(node.name, 0, node.creation)
    made: wire.Pid = wire_id(pid)
    return made


def _local(value: wire.Pid, node: Node) -> Process | None:
    """The live local process a peer's ``to`` names, or None (``node.resolve`` of
    ``pid_from_wire``, without making the pid)."""
    if value.node == node.name and value.creation == node.creation:
        proc = node.processes.get(value.id)
        if proc is not None and proc.alive:
            return proc
    return None


def _peer_pid(conn: Connection, value: Any, node: Node) -> Pid:
    """The ``from`` of a LINK or MONITOR, which must be a process of the peer itself.

    What a peer plants here is dropped when its connection closes (see connection_lost), which
    finds it by the watcher's node; a link or monitor for a third node's process would outlive
    the connection that planted it, so it is refused, as ERTS kills a connection whose
    LINK/MONITOR_P names another node's pid (``invalid_message``).

    Raises:
        wire.MalformedMessage: ``value`` is not a pid of the peer's node.
    """
    if value.__class__ is not wire.Pid or value.node != conn.peer:
        raise wire.MalformedMessage(
            f"a LINK or MONITOR from {conn.peer!r} names {value!r} as its sender, which is no"
            " process of that node"
        )
    return pid_from_wire(value, node)


def _registered_name(name: Any) -> str:
    """The registered name a peer's ``to`` field (a str or an atom) means; any other value
    names no process (a name is a str), so it reaches nobody, as an unregistered one."""
    if name.__class__ is wire.Atom:
        name = name.name
    return name if name.__class__ is str else ""


def _bad_name(dest: Any) -> TypeError:
    return TypeError(
        f"a destination on another node is a Pid or (name, node) with a str name, as"
        f" registered there (got {dest!r})"
    )


def _down_label(to: Any, node: Node) -> Any:
    """What a DOWN for a monitor of ``to`` (a peer's MONITOR field) says went down."""
    if isinstance(to, wire.Pid):
        return pid_from_wire(to, node)
    if to.__class__ is str:
        with contextlib.suppress(wire.WireError):  # a name no atom can hold goes as it came
            return wire.Atom(to)
    return to


def _batch(payload: Any) -> list[Any]:
    messages = payload["msgs"]
    if messages.__class__ is not list:
        raise TypeError(f"msgs must be a list (got {type(messages).__name__})")
    return messages


def _sender() -> Pid | None:
    proc = current_process_or_none()
    return proc.pid if proc is not None else None


def _remove_stale_socket(path: Path) -> None:
    """Remove the socket file a dead node left at ``path``; one a live process answers on is
    never taken over.

    Raises:
        DistributionError: Something is listening on ``path``, or it is not a socket.
    """
    try:
        claim_socket_path(path)
    except SocketPathTaken as exc:
        raise DistributionError(
            f"cannot listen on unix:{path}: {exc.reason}; stop it or choose another path"
        ) from None


def _remove_own_socket(path: Path, inode: int) -> None:
    """Remove the socket file this node bound at ``path``, unless another took its place."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
            path.unlink()


async def _net_kernel(dist: Distribution) -> None:
    """The net_kernel process (registered as NET_KERNEL): it serves the
    listeners and is linked to every connection process, dialled or accepted, trapping their
    exits. It owns them: when it ends (killed, or an exit signal from a process that is not
    one of its connections), every connection process is killed with it, the listeners close
    and the node's socket files go (Distribution.stopped), so nothing of the distribution is
    left behind. The node is its owner: it is stopped with the node."""
    me = current_process()
    try:
        async with trio.open_nursery() as nursery:
            for listener, address in zip(dist._listeners, dist.listening, strict=True):
                nursery.start_soon(dist._serve, listener, address)
            nursery.start_soon(dist.dial_learnt)
            while True:
                message = await me.receive()
                if message.__class__ is Exit:
                    if message.pid in dist.children:
                        dist.children.discard(message.pid)  # a connection ended: reaped
                    else:
                        raise ProcessExit(message.reason)
    finally:
        dist.stopped()


async def _open_listener(kind: str, where: Any) -> trio.abc.Listener[Any]:
    if kind == "unix":
        path = Path(where)
        await trio.to_thread.run_sync(_remove_stale_socket, path)
        sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(128)
        return trio.SocketListener(sock)
    host, port = where
    listeners = await trio.open_tcp_listeners(port, host=host)
    return listeners[0]


def _bound_address(kind: str, where: Any, listener: Any) -> str:
    if kind == "unix":
        return f"unix:{where}"
    port = listener.socket.getsockname()[1]
    return f"tcp:{where[0]}:{port}"


async def _dial(dist: Distribution, address: str) -> tuple[trio.abc.Stream, str | None]:
    kind, where = parse_address(address)
    if kind == "unix":
        return await trio.open_unix_socket(where), None
    host, port = where
    tls = dist.config.tls
    if tls is None:
        if not dist.config.insecure_tcp:
            raise DistributionError(
                f"dialling {address} needs TLS certificates; plain TCP only with insecure_tcp"
            )
        return await trio.open_tcp_stream(host, port), None
    tcp = await trio.open_tcp_stream(host, port)
    stream = trio.SSLStream(
        tcp,
        tls.client_context(),
        server_hostname=tls.server_hostname or host,
        https_compatible=False,
    )
    try:
        await _tls_handshake(stream)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream, host


async def _tls_handshake(stream: trio.SSLStream[Any]) -> None:
    """Run the TLS handshake now, so a refusal is told as one (with its alert or reason), not
    as a connection closed at the first read.

    Raises:
        HandshakeError: the handshake failed.
    """
    try:
        await stream.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            reason = f"certificate refused: {cause.verify_message}"
        elif isinstance(cause, ssl.SSLError):
            reason = cause.reason or str(cause)
            if "ALERT" in reason:
                reason = f"the peer sent the alert {reason}"
        else:
            reason = f"the peer closed the connection ({cause or exc!r})"
        raise HandshakeError(f"TLS handshake failed: {reason}") from exc


def _peer_address(stream: trio.abc.Stream, listening: str) -> str:
    """Where an accepted peer is, for the log: its TCP address, or for a Unix socket the
    socket and the peer's OS pid."""
    sock = getattr(stream, "socket", None)
    try:
        if sock is not None and sock.family in (_socket.AF_INET, _socket.AF_INET6):
            host, port = sock.getpeername()[:2]
            return f"tcp:{host}:{port}"
        if sock is not None and hasattr(_socket, "SO_PEERCRED"):
            creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
            return f"{listening} (OS pid {int.from_bytes(creds[:4], sys.byteorder)})"
    except OSError:
        pass
    return listening


async def _run_connection(
    dist: Distribution,
    conn: Connection | None,
    stream: trio.abc.Stream | None,
    address: str | None,
) -> None:
    """A connection's process: dial or accept, handshake, then read, write and ping until the
    link breaks. ``address`` is where to dial, or where an accepted peer is (for the log)."""
    node = dist.node
    me = current_process()
    config = dist.config
    what = f"to {conn.peer} at {address}" if conn is not None else f"from {address}"
    # Our own pending dial to the peer, which this accepted connection is to replace.
    rival: Connection | None = None
    refused = False  # our dial, refused by the peer before its answer

    def admit(peer: str) -> None:
        nonlocal rival
        rival = dist.admit(peer)

    try:
        try:
            with trio.fail_after(config.handshake_timeout):
                if stream is None:
                    assert address is not None
                    stream, _ = await _dial(dist, address)
                elif config.tls is not None and _is_tcp(stream):
                    stream = trio.SSLStream(stream, config.tls.server_context(), server_side=True)
                    await _tls_handshake(stream)
                # Read frame by frame: what follows the last handshake frame is read under
                # the connection's limits (an initiator may write right behind its proof).
                frames = wire.FrameStream(
                    stream, limits=_HANDSHAKE_LIMITS, versions=frozenset({2}), exact=True
                )
                if conn is not None:
                    peer = await initiate(
                        frames,
                        name=node.name,
                        creation=node.creation,
                        cookie=config.cookie,
                        codecs=config.codecs,
                        listen=dist.listening,
                        hidden=config.hidden,  # hidden nodes (observer-remote)
                        expected=conn.peer,
                    )
                else:
                    peer = await accept(
                        frames,
                        name=node.name,
                        creation=node.creation,
                        cookie=config.cookie,
                        codecs=config.codecs,
                        listen=dist.listening,
                        hidden=config.hidden,  # hidden nodes (observer-remote)
                        admit=admit,
                    )
                    conn = Connection(dist, peer.name)
                    conn.process = me
            frames.limits = config.limits
            frames.exact = False
            me.behaviour = f"dist_connection {peer.name}"
            reader: wire.FrameStream | _SocketFrames = frames
            if isinstance(stream, trio.SocketStream):
                conn.direct_fd = stream.socket.fileno()
                # The handshake's stream read no byte past its last frame (exact): the
                # socket holds the rest.
                reader = _SocketFrames(conn.direct_fd, config.limits)
            dist.connection_up(conn, peer)
            rival = None
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(conn.write_loop, stream)
                    nursery.start_soon(_ticker, conn, config.liveness_timeout)
                    await _read_loop(dist, conn, reader)
                    nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The reader, writer or ticker failed: let the handlers below name the cause.
                raise _sole(group) from None
        except trio.TooSlowError:
            logger.warning("distribution connection %s: handshake timed out", what)
        except HandshakeRefused as exc:
            refused = True
            logger.info("distribution connection %s refused: %s", what, exc)
        except HandshakeError as exc:
            logger.warning("distribution connection %s refused: %s", what, exc)
        except wire.WireError as exc:
            logger.warning("distribution connection %s dropped: malformed input: %s", what, exc)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
            logger.info("distribution connection %s closed: %s", what, exc)
        except _LivenessTimeout as exc:
            logger.warning(
                "node %s %s nothing for %s s: connection counted as lost",
                conn.peer if conn else "?",
                "read" if exc.args == ("read",) else "sent",
                config.liveness_timeout,
            )
        except DistributionError as exc:
            logger.warning("distribution connection %s: %s", what, exc)
        if conn is not None and conn.state == "connecting":
            await _await_rival(dist, conn, refused)
    finally:
        if rival is not None:
            dist.rival_failed(rival)
        if conn is not None:
            conn.direct_fd = None
            dist.connection_lost(conn)
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


async def _await_rival(dist: Distribution, conn: Connection, refused: bool) -> None:
    """Our dial ``conn`` failed, but the peer's own dial may replace it (see Distribution.admit):
    wait while one is in its handshake, for it to take over (connection_up ends this process)
    or fail. A peer that refused ours (``refused``) dials us itself if it has the smaller
    name (a simultaneous connect), its hello sent before its refusal: if it has not come yet,
    it may still within a handshake's time."""
    grace = dist.config.handshake_timeout if refused and dist.node.name > conn.peer else 0.0
    deadline = trio.current_time() + grace
    while conn.state == "connecting" and (
        conn.rivals or (not conn.rival_came and trio.current_time() < deadline)
    ):
        with trio.move_on_at(math.inf if conn.rivals else deadline):
            await conn.rival_lot.park()


def _is_tcp(stream: trio.abc.Stream) -> bool:
    sock = getattr(stream, "socket", None)
    return sock is not None and sock.family in (_socket.AF_INET, _socket.AF_INET6)


class _LivenessTimeout(Exception):
    pass


#: What ends a connection in the ordinary way (each is logged, never a crash).
_CONNECTION_ENDINGS = (
    trio.TooSlowError,
    HandshakeError,
    wire.WireError,
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    ssl.SSLError,
    _LivenessTimeout,
    DistributionError,
)


def _sole(exc: BaseException) -> BaseException:
    """What ended the connection: the one exception inside nested single-member exception
    groups; when several tasks failed at once (a reset seen by the reader and the writer), the
    first of them if every one is an ordinary ending; else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        leaves = _leaves(exc)
        if all(isinstance(leaf, _CONNECTION_ENDINGS) for leaf in leaves):
            return leaves[0]
    return exc


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


#: The most bytes the reader takes from a plain socket at once.
READ_BYTES = 65536


class _SocketFrames:
    """A connection's incoming frames, read straight from its plain socket (the reader of
    :func:`_read_loop`; a TLS connection reads through its ``wire.FrameStream``).

    A read that drained the socket (it returned less than was asked) is almost always followed
    by a quiet socket: the next read waits until the socket is readable first, where trio's
    ``receive_some`` tries a read that fails before it waits (a system call and an exception
    on each side of every round trip). After a full read it reads again at once, after a
    checkpoint, so a peer that floods cannot starve the node's other tasks.
    """

    __slots__ = ("_decoder", "_drained", "_fd")

    def __init__(self, fd: int, limits: wire.Limits) -> None:
        self._fd = fd
        self._decoder = wire.FrameDecoder(limits=limits, versions=frozenset({2}))
        self._drained = False

    async def receive_frames(self) -> list[wire.Frame]:
        """Every frame available (at least one, waiting for it), or ``[]`` at a clean end.

        Raises:
            wire.WireError: the peer sent malformed bytes.
            OSError: the socket failed (say, reset by the peer).
        """
        decoder = self._decoder
        feed = decoder.feed
        feed(b"")  # raises an error found after the last frame delivered
        fd = self._fd
        while True:
            if self._drained:
                await wait_readable(fd)
            else:
                await trio.lowlevel.checkpoint()
            try:
                data = os.read(fd, READ_BYTES)
            except (BlockingIOError, InterruptedError):
                self._drained = True
                continue
            if not data:
                decoder.feed_eof()
                return []
            self._drained = len(data) < READ_BYTES
            frames = feed(data)
            if frames:
                return frames


async def _read_loop(
    dist: Distribution, conn: Connection, frames: wire.FrameStream | _SocketFrames
) -> None:
    dispatch = dist.dispatch
    receive_frames = frames.receive_frames
    while batch := await receive_frames():
        conn.received_since_tick = True
        conn.heard = True
        # Every frame that arrived together is dispatched in one go: one scheduler pass per
        # read, not per frame (per-pair order is the order of the batch).
        for frame in batch:
            if conn.state == "down":
                # Declared lost (disconnect() does so at once): nothing more of it is
                # delivered, or acted on (a "peers" list read just before would redial).
                return
            try:
                dispatch(conn, frame)
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise wire.MalformedMessage(f"bad {frame.type.name} payload: {exc!r}") from exc


async def _ticker(conn: Connection, liveness: float) -> None:
    """Erlang's net tick: every quarter of ``liveness``, ping a peer we have sent nothing to,
    and count the connection lost once nothing has come from the peer for ``liveness``, or
    the peer has read nothing of what waits for it for that long (a peer that sends but never
    reads would hold its queue, and the senders it suspends, for ever).

    Liveness is checked here, not by a deadline on every read: the reader only sets a flag.
    """
    heard = read = trio.current_time()
    written = conn.written
    while True:
        await trio.sleep(liveness / 4)
        now = trio.current_time()
        if conn.received_since_tick:
            conn.received_since_tick = False
            heard = now
        elif now - heard >= liveness:
            raise _LivenessTimeout()
        if conn.written != written or not conn.queued:
            written, read = conn.written, now
        elif now - read >= liveness:
            raise _LivenessTimeout("read")
        if not conn.sent_since_tick and not conn.queued:
            conn.enqueue(wire.MessageType.PING, None)
        conn.sent_since_tick = False


# -- the public API -------------------------------------------------------------------------------


def _dist() -> Distribution:
    dist = current_node().distribution
    if dist is None:
        raise DistributionError(
            "this node is not distributed: call otp.start_distribution(...) first"
        )
    assert isinstance(dist, Distribution)
    return dist


async def start_distribution(config: DistConfig) -> list[str]:
    """Make this node distributed: listen where ``config.listen`` says; return the addresses
    it listens on (with the real port for ``tcp:host:0``).

    The node's name (``open_node(name)``) must be ``name@host`` and unique in the cluster.
    """
    node = current_node()
    if not is_node_name(node.name) or node.name == "nonode@nohost":
        raise DistributionError(
            f"a distributed node needs a name like 'a@host' (letters, digits, '_', '-', and"
            f" dots in the host; got {node.name!r}): open the node with that name"
            " (python -m otp.node --name a@host)"
        )
    if node.distribution is not None:
        raise DistributionError("distribution is already started on this node")
    dist = Distribution(node, config)
    node.distribution = dist
    if node.pg is None:
        node.pg = GroupState(node)
    else:
        node.pg.attach(dist)
    await dist.start()
    return list(dist.listening)


async def connect(peer: str, address: str | None = None) -> bool:
    """Connect to node ``peer`` (at ``address``, or where it was last seen); True once connected,
    False if it cannot be reached (Erlang's ``net_kernel:connect_node``)."""
    dist = _dist()
    if peer == dist.node.name:
        await trio.lowlevel.checkpoint()
        return True  # (as net_kernel:connect_node(node()))
    if address is not None:
        parse_address(address)
        dist.addresses[peer] = address
    conn = dist.connection(peer)
    if conn is None:
        await trio.lowlevel.checkpoint()
        return False
    while True:
        await conn.settled.wait()
        if conn.state == "up":
            return True
        # The peer's own dial may have replaced ours (simultaneous connect, connection_up).
        newer = dist.connections.get(peer)
        if newer is None or newer is conn:
            return False
        conn = newer


def disconnect(peer: str) -> bool:
    """Drop the connection to ``peer``: links and monitors across it fire ``noconnection``."""
    dist = _dist()
    conn = dist.connections.get(peer)
    if conn is None:
        return False
    # Gone when this returns (as net_kernel waits for the connection's controller to exit):
    # noconnection, NodeDown and nodes() are settled now; the process just closes the socket.
    dist.connection_lost(conn)
    if conn.process is not None:
        conn.process.die(KILL)
    return True


def nodes(which: str = "visible") -> list[str]:
    """The names of the nodes this node is connected to, sorted: ``"visible"`` ones (the
    default), ``"hidden"`` ones or all of them (``"connected"``), as Erlang's ``nodes/1``."""
    # which= and its check: hidden nodes (observer-remote)
    if which not in ("visible", "hidden", "connected"):
        raise BadArg(f"nodes(which): 'visible', 'hidden' or 'connected' (got {which!r})")
    dist = current_node().distribution
    if dist is None:
        return []
    return sorted(
        name
        for name, conn in dist.connections.items()
        if conn.state == "up" and (which == "connected" or conn.hidden == (which == "hidden"))
    )


def node_name() -> str:
    """This node's name (Erlang's ``node()``; ``otp.node`` is the boot package)."""
    return current_node().name


def monitor_node(peer: str, enable: bool = True) -> None:
    """Ask for a :class:`NodeDown` message when the connection to ``peer`` goes (or now, if
    there is none and it cannot be made); ``enable=False`` cancels one such request."""
    me = current_process()
    _dist().monitor_node(me.pid, peer, enable)
