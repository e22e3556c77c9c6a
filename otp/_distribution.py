"""Distribution: nodes that talk across OS processes and hosts (Erlang's ``net_kernel`` and
``dist_util``).

A node that starts distribution listens on Unix sockets and/or TCP (TLS by default) and keeps
one connection per peer node, made on first use or by :func:`connect`. Each connection is a
process with a reader, a writer that batches every queued frame into one write, and a pinger;
per-pair ordering holds because each pair of nodes shares one ordered stream. Every connection
process is linked to the node's net_kernel process (registered as ``otp.net_kernel``), which
serves the listeners and reaps the connections: it ends with the node, and whatever ends it
ends every connection with it (see ``_dist_kernel``). What waits to be written to a peer is
bounded (DistConfig.busy_limit suspends its senders, queue_limit drops the connection), and a
peer that reads nothing for the liveness timeout is lost. When a connection is lost every link
and monitor across it fires with ``noconnection``; ``monitor_node`` subscribers get NodeDown.
Peers tell each other the nodes they know, so a cluster becomes a full mesh, as Erlang's does;
that suits tens of nodes (n nodes hold n(n-1)/2 connections).

This module holds a node's distribution state (:class:`Distribution`: its connections, the
signals the core sends to remote pids) and the public API. The rest is in modules of one job:
``_dist_config`` (settings, cookie, addresses), ``_dist_connection`` (outgoing frames:
batching, direct writes, backpressure), ``_dist_session`` (a connection's process: dial,
handshakes, reader, ticker), ``_dist_reading`` (incoming frames read and dispatched, by the
reader or by a remote caller waiting for its reply), ``_dist_inbound`` (what each incoming
frame does), ``_dist_kernel`` (listeners, mesh), ``_dist_call`` (remote calls),
``_dist_handshake`` and ``_dist_values`` (the wire forms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

import wire

from . import _dist_call, _dist_inbound
from ._dist_config import DistConfig, DistributionError, parse_address
from ._dist_connection import Connection
from ._dist_handshake import HandshakeError, Peer, is_node_name
from ._dist_kernel import NET_KERNEL, NET_KERNEL_ATOM, close_listeners, net_kernel, open_listeners
from ._dist_session import run_connection
from ._dist_values import _SCALARS, reason_to_wire, value_to_wire, wire_id
from ._errors import BadArg
from ._gen_server_core import GenCall, GenCast, SystemTerminate
from ._ids import Pid, Ref
from ._messages import From
from ._node import NamedMonitor, Node, current_node
from ._pg import GroupState
from ._process import Process, current_process, current_process_or_none
from ._reasons import KILL, NOCONNECTION

logger = logging.getLogger("otp.dist")

_GEN_CALL = wire.Atom("$gen_call")
_GEN_CAST = wire.Atom("$gen_cast")
_GEN_REPLY = wire.Atom("$gen_reply")
_GEN_REPLY_DEMONITOR = wire.Atom("$gen_reply_demonitor")
_SYSTEM = wire.Atom("system")
_SEND = wire.MessageType.SEND
_TERMINATE = wire.Atom("terminate")


@attrs.frozen
class NodeDown:
    """``{nodedown, Node}``: the connection to ``node`` is gone (see :func:`monitor_node`)."""

    node: str


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
        self.listeners: list[trio.abc.Listener[Any]] = []
        #: The socket files this node made, each with its inode (removed on stop if still ours).
        self.socket_files: list[tuple[Path, int]] = []
        #: The net_kernel process (see _dist_kernel): it owns the listeners and every connection.
        self.kernel: Process | None = None
        #: The connection processes linked to the kernel (what it reaps when it stops).
        self.children: set[Pid] = set()
        #: Nodes learnt from peers' lists, waiting for the kernel's dialer (see _dist_kernel).
        self.to_dial: dict[str, None] = {}
        self.dial_lot = trio.lowlevel.ParkingLot()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the listeners, then start the net_kernel process that serves them."""
        holder = self.node.names.get(NET_KERNEL)
        if holder is not None:
            raise DistributionError(
                f"cannot start distribution: {holder.pid!r} is registered as {NET_KERNEL!r},"
                " the name of the process that owns the node's connections; unregister it"
            )
        await open_listeners(self)
        kernel = self.node.spawn(net_kernel, (self,), None, trap_exit=True)
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
        close_listeners(self)
        if self.node.distribution is self:
            self.node.distribution = None

    async def flush(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until every connection has written what is queued:
        a node that stops gracefully delivers what it sent last."""
        with trio.move_on_after(timeout):
            for conn in list(self.connections.values()):
                if conn.state == "up" and not conn.idle:
                    conn.drained = trio.Event()
                    conn.write_lazy_now()
                    await conn.drained.wait()

    # -- connections -------------------------------------------------------------------------

    def spawn_connection(
        self, conn: Connection | None, stream: trio.abc.Stream | None, address: str | None
    ) -> None:
        """Start the process of a connection: our dial of ``conn`` at ``address``, or a peer's
        dial accepted as ``stream`` (``address`` says where it came from)."""
        assert self.kernel is not None
        # Linked to the net_kernel, which reaps it (see _dist_kernel.net_kernel).
        proc = self.node.spawn(
            run_connection, (self, conn, stream, address), self.kernel, link=True
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
        self.spawn_connection(conn, None, address)
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
                conn.take_over(existing)
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
                {
                    "from": _wire_pid(self.node, None),
                    "to": NET_KERNEL_ATOM,
                    "msg": ("peers", known),
                },
            )
        for hook in () if peer.hidden else self.nodeup_hooks:  # hidden nodes (observer-remote)
            hook(peer.name)
        return conn

    def connection_lost(self, conn: Connection) -> None:
        was_up = conn.state == "up"
        conn.lost()
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
                    node.link_exit(proc, other, NOCONNECTION)
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

    def send(self, dest: Any, message: Any) -> None:
        if dest.__class__ is Pid:
            conn = self.connection(dest.node)
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
            raise _dist_call.bad_name(dest)
        conn = self.connection(peer)
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
        conn = self.connection(remote.node)
        if conn is None:
            self._unreachable_link(me, remote)
            return
        conn.enqueue(
            wire.MessageType.LINK, {"from": value_to_wire(me), "to": value_to_wire(remote)}
        )

    def _unreachable_link(self, me: Pid, remote: Pid) -> None:
        proc = self.node.resolve(me)
        if proc is not None:
            self.node.link_exit(proc, remote, NOCONNECTION)

    def unlink(self, me: Pid, remote: Pid) -> None:
        conn = self.connection(remote.node)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.UNLINK, {"from": value_to_wire(me), "to": value_to_wire(remote)}
            )

    def exit(self, sender: Pid, remote: Pid, reason: Any) -> None:
        conn = self.connection(remote.node)
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
                raise _dist_call.bad_name(target)
        conn = self.connection(peer)
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
            peer, to = target.node, wire_id(target)
        conn = self.connections.get(peer)
        if conn is not None:
            conn.enqueue(
                wire.MessageType.DEMONITOR,
                {"from": wire_id(me), "to": to, "ref": wire_id(ref)},
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

    def reply(self, from_: From, value: Any, me: Process | None) -> None:
        """Send a remote caller its reply from ``me`` (None: outside any process). The reply
        of the server the call monitors, to a peer that listed ``reply_demonitor``, ends that
        monitor here and says so (``$gen_reply_demonitor``); any other leaves it to the caller."""
        pid = from_.pid
        conn = self.connections.get(pid.node)
        if conn is None:
            return
        tag = from_.tag
        kind = _GEN_REPLY
        if tag.__class__ is Ref:
            wire_tag = wire_id(tag)
            monitored_by = me.monitored_by if me is not None and conn.reply_demonitor else None
            if monitored_by is not None:
                watcher = monitored_by.pop(tag, None)
                if watcher is not None:
                    if watcher is pid or watcher == pid:
                        kind = _GEN_REPLY_DEMONITOR
                    else:  # (another process's monitor that happens to use the tag)
                        monitored_by[tag] = watcher
        else:
            wire_tag = value_to_wire(tag)
        wire_value = value if value.__class__ in _SCALARS else value_to_wire(value)
        conn.enqueue(_SEND, {"to": wire_id(pid), "msg": (kind, wire_tag, wire_value)})

    # GenServer.call and GenServer.stop of a remote server (see _dist_call).
    call = _dist_call.call
    stop = _dist_call.stop

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

    #: Act on one frame from a connection's peer (called by its reader; see _dist_inbound).
    dispatch = _dist_inbound.dispatch


def _wire_pid(node: Node, pid: Pid | None) -> wire.Pid:
    """The wire form of a sender's pid; outside any process, the node's own pseudo-pid 0."""
    if pid is None:
        return wire.Pid(node.name, 0, node.creation)
    made: wire.Pid = wire_id(pid)
    return made


def _sender() -> Pid | None:
    proc = current_process_or_none()
    return proc.pid if proc is not None else None


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
    conn = await dial(peer, address)
    return conn is not None and conn.state == "up"


async def dial(peer: str, address: str | None = None) -> Connection | None:
    """:func:`connect`, answering with the connection once it settled: up, or down with its
    ``failure`` saying why (None if it failed before it was made); None if no address of
    ``peer`` is known, or it is this node.

    Raises:
        DistributionError: this node is not distributed, or ``address`` is malformed.
    """
    dist = _dist()
    if address is not None:
        parse_address(address)
        dist.addresses[peer] = address
    conn = dist.connection(peer)
    if conn is None:
        await trio.lowlevel.checkpoint()
        return None
    while True:
        await conn.settled.wait()
        if conn.state == "up":
            return conn
        # The peer's own dial may have replaced ours (simultaneous connect, connection_up).
        newer = dist.connections.get(peer)
        if newer is None or newer is conn:
            return conn
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
