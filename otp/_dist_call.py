"""``GenServer.call`` and ``GenServer.stop`` of a server on another node (the caller's side of
OTP's ``gen:call`` across nodes): the callee is monitored and the request sent in one write
(one MONITOR_SEND frame, or MONITOR then the request to a peer without ``monitor_send``),
and the reply or the DOWN comes back to the caller's waiter through the monitor's ref, an
alias, as in OTP 24+. A reply from the monitored server ends the monitor on both sides
(``$gen_reply_demonitor``, as OTP's ``{alias, reply_demonitor}`` does on the caller's), so a
call answered by its server costs no DEMONITOR frame. They are ``Distribution.call`` and
``Distribution.stop``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import wire

from ._dist_values import call_ref_to_wire, value_to_wire, wire_id
from ._errors import CallError, CallTimeout
from ._gen_server_core import GenCall, SystemTerminate, wait_reply
from ._ids import Pid, Ref
from ._messages import From
from ._node import NamedMonitor
from ._process import TIMED_OUT, CallWaiter, Process

if TYPE_CHECKING:
    from ._distribution import Distribution

_GEN_CALL = wire.Atom("$gen_call")
_SEND = wire.MessageType.SEND
_REG_SEND = wire.MessageType.REG_SEND
_MONITOR = wire.MessageType.MONITOR
_MONITOR_SEND = wire.MessageType.MONITOR_SEND


def bad_name(dest: Any) -> TypeError:
    return TypeError(
        f"a destination on another node is a Pid or (name, node) with a str name, as"
        f" registered there (got {dest!r})"
    )


async def call(
    dist: Distribution, me: Process, server: Any, request: Any, timeout: float | None
) -> Any:
    """``GenServer.call`` of a server on another node: monitor it and send the request in
    one write (the MONITOR first, in one MONITOR_SEND frame where the peer takes it: its DOWN
    then always carries the reason the server exited with), then wait for the reply or the
    DOWN, which the monitor's ref (an alias) routes to this call's waiter; on a plain socket
    the caller reads it itself while no other caller does (``SocketFrames.wait_reply`` in
    ``_dist_reading``). A reply from the server itself ends the monitor on both sides (see
    Distribution.reply); otherwise (a deferred reply from another process, a timeout, a
    cancelled caller) the DEMONITOR goes lazily, with the next frame.

    Raises:
        BadArg: the request cannot cross to another node (nothing is sent or recorded).
        TypeError: ``server`` is ``(name, node)`` with a name that is not a str.
    """
    if server.__class__ is Pid:
        peer = server.node
    else:
        name, peer = server
        if name.__class__ is not str:
            raise bad_name(server)
    conn = dist.connections.get(peer)
    if conn is None:
        conn = dist.connection(peer)
    if conn is not None and conn.queued > dist.config.busy_limit:  # (conn.busy)
        # As a send to a busy port suspends its sender, before the request is queued.
        await conn.wait_not_busy()
        conn = dist.connection(peer)
    node = dist.node
    ref = node.make_ref()
    if conn is None or conn.codec is None:
        waiter = _watch(me, server, ref)
        if conn is None:
            dist.monitor(me.pid, server, ref)  # (a DOWN with noconnection, at once)
        else:
            with conn.corked():
                dist.monitor(me.pid, server, ref)
                dist.send(server, GenCall(From(me.pid, ref), request))
    else:
        wire_me = wire_id(me.pid)
        wire_ref = call_ref_to_wire(ref)
        message = (_GEN_CALL, (wire_me, wire_ref), value_to_wire(request))
        to = wire_id(server) if server.__class__ is Pid else name
        if conn.monitor_send:
            conn.send_now(
                _MONITOR_SEND, {"from": wire_me, "to": to, "ref": wire_ref, "msg": message}
            )
        else:
            if server.__class__ is Pid:
                sent = {"to": to, "msg": message}
                mtype = _SEND
            else:
                sent = {"from": wire_me, "to": name, "msg": message}
                mtype = _REG_SEND
            conn.send_now(_MONITOR, {"from": wire_me, "to": to, "ref": wire_ref}, mtype, sent)
        waiter = _watch(me, server, ref)
    timer = (
        node.timers.start(timeout, waiter.time_out, private=True) if timeout is not None else None
    )
    try:
        reader = conn.socket_reader if conn is not None else None
        if reader is None:
            await waiter.wait()
        else:
            await reader.wait_reply(dist, conn, waiter)
    finally:
        _unwatch(dist, me, ref)
        if timer is not None:
            node.timers.discard(timer)
    value = waiter.value
    if value is TIMED_OUT:
        raise CallTimeout("timeout", server, request)
    if waiter.is_down:
        raise CallError(value, server, request)
    return value


async def stop(
    dist: Distribution, me: Process, server: Any, reason: Any, timeout: float | None
) -> Any:
    """``GenServer.stop`` of a server on another node: monitor it, send it a system
    terminate (OTP's ``proc_lib:stop``) and return its exit reason (``"noproc"`` if it was
    not alive, ``"noconnection"`` if its node is unreachable), or TIMED_OUT."""
    waiter = await _ask(dist, me, server, lambda _ref: SystemTerminate(reason), timeout)
    return waiter.value


async def _ask(
    dist: Distribution,
    me: Process,
    server: Any,
    message: Callable[[Ref], Any],
    timeout: float | None,
) -> CallWaiter:
    """Monitor the remote ``server`` and send it ``message(ref)`` in one batch, monitor
    first (its DOWN then always carries the reason it exited with); wait for the reply or
    the DOWN, which the monitor's ref (an alias) routes to the returned waiter."""
    peer = server.node if server.__class__ is Pid else server[1]
    conn = dist.connection(peer)
    if conn is not None and conn.busy:
        # As a send to a busy port suspends its sender, before the request is queued.
        await conn.wait_not_busy()
        conn = dist.connection(peer)
    ref = dist.node.make_ref()
    waiter = _watch(me, server, ref)
    if conn is None:
        dist.monitor(me.pid, server, ref)
    else:
        with conn.corked():
            dist.monitor(me.pid, server, ref)
            dist.send(server, message(ref))
    await wait_reply(dist.node, waiter, timeout, lambda: _unwatch(dist, me, ref))
    return waiter


def _watch(me: Process, server: Any, ref: Ref) -> CallWaiter:
    """Record a monitor of the remote ``server`` whose ``ref`` is an alias routing its DOWN
    (and a reply) to the returned waiter; the caller sends the MONITOR."""
    waiter = CallWaiter()
    me.add_alias(ref, waiter)
    if server.__class__ is Pid:
        me.add_monitor(ref, server)
        return waiter
    # One record per server name, shared by its calls (a NamedMonitor is never changed).
    named = _NAMED.get(server)
    if named is None:
        if len(_NAMED) >= 1024:
            _NAMED.clear()
        named = _NAMED[server] = NamedMonitor(Pid._make(server[1], 0, 0), server)
    me.add_monitor(ref, named)
    return waiter


_NAMED: dict[tuple[str, str], NamedMonitor] = {}


def _unwatch(dist: Distribution, me: Process, ref: Ref) -> None:
    assert me.aliases is not None
    me.aliases.pop(ref, None)
    target = me.monitors.pop(ref, None) if me.monitors is not None else None
    if target is not None:
        dist.send_demonitor(me.pid, target, ref)
