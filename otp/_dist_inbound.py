"""What each frame from a peer node does (the receiving half of Erlang's distribution
protocol): messages are delivered, and LINK, UNLINK, EXIT, EXIT2, MONITOR, DEMONITOR and DOWN
(and MONITOR_SEND, a MONITOR and a message in one frame) apply to local processes through the
same code as the local signals (``Process.add_link``, ``Node.link_exit``,
``Node.exit_signal``, ``Node.deliver_down``, ...).

A peer is trusted with what it sends once it proved the cookie, but not with malformed
frames: a bad payload raises, and the connection is dropped (see ``_dist_session``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import wire

from ._dist_kernel import NET_KERNEL_ATOM, peers_told
from ._dist_records import UnknownRemoteValue
from ._dist_values import (
    _SCALARS,
    pid_from_wire,
    reason_from_wire,
    ref_from_wire,
    value_from_wire,
)
from ._gen_server_core import GenCall, GenCast, SystemTerminate
from ._ids import Pid
from ._messages import From
from ._pg import PG_NAME
from ._reasons import NOPROC

if TYPE_CHECKING:
    from ._dist_connection import Connection
    from ._distribution import Distribution
    from ._node import Node
    from ._process import Process

_TERMINATE = wire.Atom("terminate")

# The frame types, read once: a member of an Enum class costs a metaclass lookup (~800
# instructions in 3.11) where a module global costs a dict probe, and dispatch compares a
# MONITOR_SEND's type four times.
_M = wire.MessageType
_SEND, _REG_SEND, _MONITOR_SEND, _MONITOR = _M.SEND, _M.REG_SEND, _M.MONITOR_SEND, _M.MONITOR
_DEMONITOR, _SEND_BATCH, _REG_SEND_BATCH = _M.DEMONITOR, _M.SEND_BATCH, _M.REG_SEND_BATCH
_LINK, _UNLINK, _EXIT, _EXIT2, _DOWN = _M.LINK, _M.UNLINK, _M.EXIT, _M.EXIT2, _M.DOWN
_PING, _PONG = _M.PING, _M.PONG

logger = logging.getLogger("otp.distribution")


def dispatch(dist: Distribution, conn: Connection, frame: wire.Frame) -> None:
    """Act on one frame from ``conn``'s peer (called by its reader, as
    ``Distribution.dispatch``).

    Raises:
        wire.MalformedMessage: a frame no node sends to another, or a LINK or MONITOR whose
            sender is no process of the peer.
        KeyError, TypeError, AttributeError, ValueError: a malformed payload.
    """
    node = dist.node
    t = frame.type
    p = frame.payload
    # The most frequent first: a remote call is a MONITOR_SEND (or a MONITOR and a SEND or
    # REG_SEND) one way, its reply a SEND the other.
    if t is _SEND:
        message = p["msg"]
        proc = _local(p["to"], node)
        if proc is not None:
            _deliver_to(node, proc, message)
    elif t is _MONITOR_SEND or t is _MONITOR:
        sender = p["from"]
        monitoring = _peer_pid(conn, sender, node)
        to = p["to"]
        wire_ref = p["ref"]
        ref = _monitor_ref(wire_ref, node)
        message = p["msg"] if t is _MONITOR_SEND else None  # (read before acting on any)
        # (A call's MONITOR names its server, mostly by a str name: _target's first step.)
        target = node.names.get(to) if to.__class__ is str else _target(to, node)
        if target is None:
            dist.send_down(monitoring, ref, _down_label(to, node), NOPROC)
        else:
            target.add_monitored_by(ref, monitoring)
        if t is _MONITOR_SEND:
            # Then the message, as the SEND (to a pid) or REG_SEND (a name) after the
            # MONITOR would be: to the process just monitored, or nobody if it is gone.
            if to.__class__ is str or isinstance(to, wire.Pid):
                if target is None:
                    pass
                elif _own_call(message, sender, wire_ref):
                    # (its From's pid and tag are the ones just converted)
                    _deliver_call(node, target, monitoring, ref, p["msg"][2])
                else:
                    _deliver_to(node, target, message)
            else:
                _reg_send(dist, conn, to, message)
    elif t is _REG_SEND:
        _reg_send(dist, conn, p["to"], p["msg"])
    elif t is _DEMONITOR:
        target = _target(p["to"], node)
        if target is not None:
            target.remove_monitored_by(_monitor_ref(p["ref"], node))
    elif t is _SEND_BATCH:
        messages = _batch(p)
        proc = node.resolve(pid_from_wire(p["to"], node))
        if proc is not None:
            for message in messages:
                _deliver_to(node, proc, message)
    elif t is _REG_SEND_BATCH:
        name = p["to"]
        for message in _batch(p):
            _reg_send(dist, conn, name, message)
    elif t is _LINK:
        sender = _peer_pid(conn, p["from"], node)
        target = node.resolve(pid_from_wire(p["to"], node))
        if target is None:
            dist.send_link_exit(pid_from_wire(p["to"], node), sender, NOPROC)
        else:
            target.add_link(sender)
    elif t is _UNLINK:
        target = node.resolve(pid_from_wire(p["to"], node))
        if target is not None:
            target.remove_link(pid_from_wire(p["from"], node))
    elif t is _EXIT:
        sender = pid_from_wire(p["from"], node)
        target = node.resolve(pid_from_wire(p["to"], node))
        if target is not None:
            node.link_exit(target, sender, reason_from_wire(p["reason"], node))
    elif t is _EXIT2:
        target = node.resolve(pid_from_wire(p["to"], node))
        if target is not None:
            node.exit_signal(
                target,
                pid_from_wire(p["from"], node),
                reason_from_wire(p["reason"], node),
                False,
            )
    elif t is _DOWN:
        sender = p["from"]
        label = pid_from_wire(sender, node) if isinstance(sender, wire.Pid) else sender
        ref = value_from_wire(p["ref"], node)
        watcher = node.resolve(pid_from_wire(p["to"], node))
        # A DOWN for a monitor the watcher already dropped (demonitor crossed it) is stale.
        if watcher is not None and watcher.monitors is not None and ref in watcher.monitors:
            node.deliver_down(watcher.pid, ref, label, reason_from_wire(p["reason"], node))
    elif t is _PING:
        # Any frame tells the peer we are alive: none is added while some wait (a peer
        # that floods PINGs and reads nothing would grow the queue by a PONG each).
        if not conn.queued:
            conn.enqueue(_PONG, None)
    elif t is _PONG:
        pass
    else:
        raise wire.MalformedMessage(f"{t.name} is not a message nodes send each other")


def _reg_send(dist: Distribution, conn: Connection, name: Any, message: Any) -> None:
    node = dist.node
    if name.__class__ is not str:
        if name == NET_KERNEL_ATOM:
            peers_told(dist, conn, message)
            return
        if name == PG_NAME:
            if node.pg is not None and not conn.hidden:  # hidden nodes (observer-remote)
                node.pg.from_peer(conn.peer, message)
            return
        name = _registered_name(name)
    proc = node.names.get(name)
    if proc is not None:
        _deliver_to(node, proc, message)


def _deliver_to(node: Node, proc: Process, message: Any) -> None:
    try:
        _decode_to(node, proc, message)
    except UnknownRemoteValue as exc:
        # One message a peer's registry and ours disagree on: dropped, not the connection
        # (the rest of a batch, and the peer's other traffic, still arrive).
        dropped(proc.pid, exc)


def dropped(to: Any, exc: UnknownRemoteValue) -> None:
    logger.warning("distribution: a message to %r was dropped: %s", to, exc)


def _decode_to(node: Node, proc: Process, message: Any) -> None:
    if message.__class__ is tuple and message and message[0].__class__ is wire.Atom:
        # Compared by name: a decoded atom is a new object, and its attrs __eq__ a call.
        tag = message[0].name
        if (tag == "$gen_reply" or tag == "$gen_reply_demonitor") and len(message) == 3:
            ref = message[1]
            # (ref_from_wire: the call's own ref, when it is the last this node sent.)
            ref = ref_from_wire(ref) if ref.__class__ is wire.Ref else value_from_wire(ref, node)
            if proc.aliases is not None:
                waiter = proc.aliases.get(ref)
                if waiter is not None:
                    if tag == "$gen_reply_demonitor" and proc.monitors is not None:
                        # The server ended the call's monitor with its reply (see
                        # Distribution.reply): no DEMONITOR goes back for it.
                        proc.monitors.pop(ref, None)
                    value = message[2]
                    if value.__class__ not in _SCALARS:
                        value = value_from_wire(value, node)
                    waiter.resolve(value, False)
            return
        if tag == "$gen_call" and len(message) == 3:
            pid, ref = message[1]
            if ref.__class__ is wire.Ref:
                ref = ref_from_wire(ref)  # (its wire form kept for the reply)
            else:
                ref = value_from_wire(ref, node)
            _deliver_call(node, proc, pid_from_wire(pid, node), ref, message[2])
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


def _monitor_ref(value: Any, node: Node) -> Any:
    """A MONITOR or DEMONITOR's ref (a wire ref, the common case first)."""
    if value.__class__ is wire.Ref:
        return ref_from_wire(value)
    return value_from_wire(value, node)


_new = object.__new__
_set_pid = From.__dict__["pid"].__set__
_set_tag = From.__dict__["tag"].__set__


def _deliver_call(node: Node, proc: Process, pid: Pid, tag: Any, request: Any) -> None:
    """Deliver ``{'$gen_call', From(pid, tag), request}`` to ``proc``: ``pid`` and ``tag``
    converted already, ``request`` as it came. Built without the two ``__init__`` calls
    (attrs' frozen setattr for the From), once a call; a request this node cannot rebuild
    drops the message, as ``_deliver_to`` does."""
    if request.__class__ not in _SCALARS:
        try:
            request = value_from_wire(request, node)
        except UnknownRemoteValue as exc:
            dropped(proc.pid, exc)
            return
    from_ = _new(From)
    _set_pid(from_, pid)
    _set_tag(from_, tag)
    call = _new(GenCall)
    call.from_ = from_
    call.request = request
    proc.deliver(call)


def _own_call(message: Any, sender: Any, ref: Any) -> bool:
    """Whether ``message``, in a MONITOR_SEND from ``sender`` with the monitor ``ref`` (both
    wire values), is the call ``_dist_call`` sends in it: ``($gen_call, (sender, ref),
    request)``, its pid the very object (the decoder shares a repeated pid; a copy takes the
    general path) and its ref of the same fields."""
    if message.__class__ is not tuple or len(message) != 3:
        return False
    envelope = message[1]
    if envelope.__class__ is not tuple or len(envelope) != 2 or envelope[0] is not sender:
        return False
    tag = envelope[1]
    head = message[0]
    return (
        tag.__class__ is wire.Ref
        and ref.__class__ is wire.Ref
        and tag.id == ref.id
        and tag.node == ref.node
        and tag.creation == ref.creation
        and head.__class__ is wire.Atom
        and head.name == "$gen_call"
    )


def _local(value: wire.Pid, node: Node) -> Process | None:
    """The live local process a peer's ``to`` names, or None (``node.resolve`` of
    ``pid_from_wire``, without making the pid)."""
    if value.node == node.name and value.creation == node.creation:
        proc = node.processes.get(value.id)
        if proc is not None and proc.alive:
            return proc
    return None


def _target(to: Any, node: Node) -> Process | None:
    """The process a MONITOR or DEMONITOR names: by pid, or by registered name."""
    if isinstance(to, wire.Pid):
        return node.resolve(pid_from_wire(to, node))
    return node.names.get(_registered_name(to))


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
