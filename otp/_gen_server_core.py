"""The gen_server engine, shared inside ``otp``: the messages a server understands, the
monitor-routed wait a caller parks on, and the server loop that runs the callbacks.

``GenServer`` (``_gen_server``) is its public face; ports, the distribution, ``send_request``
and the ETS table actor use these pieces directly (OTP's ``gen`` and ``gen_server`` internals:
``gen:do_call``'s monitor-and-alias, ``{'$gen_call', From, Request}``, ``gen_server:loop``).
Nothing outside ``otp`` imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from trio.lowlevel import cancel_shielded_checkpoint, current_task

from ._api import register, unlink
from ._errors import BadArg, StartError, StartIgnored
from ._gen_server_returns import UNSET, Ignore, NoReply, Ok, Reply, Stop
from ._ids import Pid, Ref
from ._messages import Exit, From
from ._node import Node, current_node, log_crash
from ._process import (
    CURRENT_PROCESS,
    FAIRNESS_BUDGET,
    TIMED_OUT,
    CallWaiter,
    KilledBySignal,
    Process,
    ProcessExit,
    current_process,
)
from ._reasons import KILL, NORMAL, BadReturnValue, Crash, is_abnormal
from ._timers import checked_seconds

if TYPE_CHECKING:
    from ._gen_server import GenServer


class GenCall:
    __slots__ = ("from_", "request")

    def __init__(self, from_: From, request: Any) -> None:
        self.from_ = from_
        self.request = request

    def __repr__(self) -> str:
        return f"{{'$gen_call', {self.from_!r}, {self.request!r}}}"


class GenCast:
    __slots__ = ("request",)

    def __init__(self, request: Any) -> None:
        self.request = request

    def __repr__(self) -> str:
        return f"{{'$gen_cast', {self.request!r}}}"


class SystemTerminate:
    __slots__ = ("reason",)

    def __init__(self, reason: Any) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"{{system, terminate, {self.reason!r}}}"


def checked_timeout(timeout: Any, what: str) -> float | None:
    """``timeout`` (seconds or None), or a TypeError/ValueError naming ``what``: the slow path
    behind the inline test of the client functions, so a bad timeout is refused before anything
    is sent or spawned."""
    return None if timeout is None else checked_seconds(timeout, what, none_ok=True)


def is_remote(node: Node, server: Any) -> bool:
    if server.__class__ is Pid:
        return bool(server.node != node.name)
    return isinstance(server, tuple) and len(server) == 2 and server[1] != node.name


def resolve_server(node: Node, server: Any) -> Process | None:
    if server.__class__ is Pid:
        return node.resolve(server)
    if isinstance(server, str):
        return node.names.get(server)
    if isinstance(server, tuple) and len(server) == 2 and isinstance(server[0], str):
        return node.names.get(server[0]) if server[1] == node.name else None
    raise TypeError(f"a server is a Pid, a registered name or (name, node) (got {server!r})")


async def wait_reply(
    node: Node, waiter: CallWaiter, timeout: float | None, cleanup: Callable[[], None]
) -> None:
    """Wait for ``waiter`` or ``timeout`` seconds (on the node's timer heap, which is cheaper
    than a cancel scope per call); ``cleanup`` runs whatever happens, cancellation included."""
    timer = None
    try:
        if timeout is not None:
            timer = node.timers.start(timeout, waiter.time_out, private=True)
        await waiter.wait()
    finally:
        cleanup()
        if timer is not None:
            node.timers.discard(timer)


def watch(me: Process, target: Process, ref: Ref, waiter: CallWaiter) -> None:
    """Monitor ``target`` with ``ref`` routed to ``waiter`` instead of the mailbox."""
    me.add_alias(ref, waiter)
    target.add_monitored_by(ref, me.pid)
    me.add_monitor(ref, target.pid)


def unwatch(me: Process, target: Process, ref: Ref) -> None:
    if me.aliases is not None:
        me.aliases.pop(ref, None)
    if me.monitors is not None:
        me.monitors.pop(ref, None)
    if target.monitored_by is not None:
        target.monitored_by.pop(ref, None)


async def start_server(
    cls: type[GenServer], args: tuple[Any, ...], name: str | None, timeout: float | None, link: bool
) -> Pid:
    if timeout is not None:
        verb = "start_link" if link else "start"
        timeout = checked_timeout(timeout, f"{cls.__qualname__}.{verb}(timeout=...)")
    me = current_process()
    node = me.node
    if name is not None:
        if not isinstance(name, str) or not name:
            await trio.lowlevel.checkpoint()
            raise BadArg(
                f"{cls.__qualname__}.start(name={name!r}): a name is a non-empty str, or None"
                " for no name"
            )
        holder = node.names.get(name)
        if holder is not None:
            await trio.lowlevel.checkpoint()
            raise StartError(("already_started", holder.pid))
    ref = node.make_ref()
    waiter = CallWaiter()
    child = node.spawn(serve, (cls, args, name, From(me.pid, ref), link), me, link=link)
    watch(me, child, ref, waiter)
    try:
        await wait_reply(node, waiter, timeout, lambda: unwatch(me, child, ref))
    except trio.Cancelled:
        # A cancel scope of the caller gave up: nobody will ever get the pid. A caller that is
        # itself exiting leaves the child to OTP's rules instead: a start_link child gets the
        # caller's exit signal through the link (a trapping one, say a supervisor, shuts down
        # cleanly once init returns); a start child lives on.
        if not me.exiting:
            kill_flush(me, child, link)
        raise
    if waiter.value is TIMED_OUT:
        kill_flush(me, child, link)
        raise StartError("timeout")
    result = waiter.value
    if waiter.is_down:
        raise StartError(result)
    if result is Ignore:
        raise StartIgnored()
    if isinstance(result, StartFailed):
        raise StartError(result.reason)
    return child.pid


def kill_flush(me: Process, child: Process, link: bool) -> None:
    """Kill a child whose start timed out or was cancelled, without its death reaching the
    caller (OTP's ``kill_flush``): unlink, kill, and drop an ``Exit`` the link may have queued
    already."""
    if link:
        unlink(child.pid)
    me.node.exit_signal(child, me.pid, KILL, False)
    if link:
        me.remove_messages(lambda m: m.__class__ is Exit and m.pid == child.pid)


class StartFailed:
    __slots__ = ("reason",)

    def __init__(self, reason: Any) -> None:
        self.reason = reason


def _ack(starter: From, value: Any) -> None:
    send_reply(starter, value)


def send_reply(from_: From, value: Any) -> None:
    """Answer the call ``from_`` (``GenServer.reply``): straight into the caller's waiting
    slot, or over the distribution to a remote caller; dropped if the caller gave up."""
    me = CURRENT_PROCESS.get(None)
    reply_from(me.node if me is not None else current_node(), me, from_, value)


def reply_from(node: Node, me: Process | None, from_: From, value: Any) -> None:
    """``send_reply`` from the process ``me`` (None: from outside any) of ``node``: what a
    server's loop calls, which knows both already."""
    pid = from_.pid
    caller = pid._proc
    if caller is None:
        # No process of ours at hand: a remote caller (most such), or a pid of ours from
        # another node's message (node.resolve looks it up).
        if pid.node != node.name:
            if node.distribution is not None:
                node.distribution.reply(from_, value, me)
            return
        caller = node.resolve(pid)
        if caller is None:
            return
    elif not caller.alive:
        return
    aliases = caller.aliases
    if aliases is not None:
        waiter = aliases.get(from_.tag)
        if waiter is not None:
            waiter.resolve(value, False)


async def serve(
    cls: type[GenServer], args: tuple[Any, ...], name: str | None, starter: From, link: bool
) -> None:
    me = current_process()
    me.behaviour = f"GenServer {cls.__module__}.{cls.__qualname__}"
    result: Any
    reason: Any
    if name is not None:
        try:
            register(name, me.pid)
        except BadArg:
            holder = me.node.names.get(name)
            reason = ("already_started", holder.pid if holder is not None else None)
            _ack(starter, StartFailed(reason))
            raise ProcessExit(NORMAL) from None
    server = cls()
    try:
        result = server.init(*args)
        if cls._async_init:
            result = await result
    except Exception as exc:
        reason = Crash(exc)
        log_crash(me, reason)
        _ack(starter, StartFailed(reason))
        raise ProcessExit(reason) from None
    rc = result.__class__
    if rc is Ok:
        pass
    elif rc is Ignore:
        _ack(starter, Ignore)
        raise ProcessExit(NORMAL)
    elif rc is Stop:
        _ack(starter, StartFailed(result.reason))
        raise ProcessExit(result.reason)
    else:
        reason = BadReturnValue(result)
        _ack(starter, StartFailed(reason))
        raise ProcessExit(reason)
    _ack(starter, me.pid)
    parent = starter.pid if link else me.pid
    await _loop(server, me, parent, result.state, result.timeout, result.continue_)


async def _loop(
    server: GenServer, me: Process, parent: Pid, state: Any, timeout: float | None, cont: Any
) -> None:
    cls = type(server)
    node = me.node
    receive, receive_any = me.receive, me.receive_any_now
    handle_call = server.handle_call
    async_call = cls._async_call
    message: Any = None
    ret: Any
    # A message already queued is taken here, without the three coroutine calls of
    # ``receive_any_now`` (most messages of a busy server are: it is woken once for many). It is
    # the same checkpoint: a cancelled task (an exit signal, its node stopping) takes the slow
    # path, which raises; every ``FAIRNESS_BUDGET`` messages it yields once.
    task = current_task()
    # (trio's own check, on its private fields; a trio without them takes the slow path. The
    # main task also checks for KeyboardInterrupt.)
    runner = getattr(task, "_runner", None)
    fast = hasattr(task, "_cancel_status") and runner is not None and task is not runner.main_task
    try:
        while True:
            if cont is not UNSET:
                message = cont
                ret = server.handle_continue(cont, state)
                if cls._async_continue:
                    ret = await ret
                rc = ret.__class__
                if rc is NoReply:
                    state, timeout, cont = ret.state, ret.timeout, ret.continue_
                    continue
                if rc is Stop:
                    await _terminate(server, me, ret.reason, ret.state, message)
                raise _Bad(ret)
            if timeout is None:
                mailbox = me._mailbox
                if (
                    mailbox
                    and fast
                    and me.suspended is None
                    and not task._cancel_status.effectively_cancelled
                ):
                    message = mailbox.popleft()
                    me.handled += 1
                    me._fast += 1
                    if me._fast >= FAIRNESS_BUDGET:
                        me._fast = 0
                        await cancel_shielded_checkpoint()
                else:
                    message = await receive_any()
            else:
                message = await receive(None, timeout, "timeout")
            me.last_message = message
            mc = message.__class__
            if mc is GenCall:
                from_ = message.from_
                ret = handle_call(message.request, from_, state)
                if async_call:
                    ret = await ret
                rc = ret.__class__
                if rc is Reply:
                    reply_from(node, me, from_, ret.value)
                    state, timeout, cont = ret.state, ret.timeout, ret.continue_
                elif rc is NoReply:
                    state, timeout, cont = ret.state, ret.timeout, ret.continue_
                elif rc is Stop:
                    await _terminate(
                        server, me, ret.reason, ret.state, message, reply_to=from_, reply=ret.reply
                    )
                else:
                    raise _Bad(ret)
                continue
            if mc is GenCast:
                ret = server.handle_cast(message.request, state)
                if cls._async_cast:
                    ret = await ret
            elif mc is Exit and message.pid == parent and me.trap_exit:
                await _terminate(server, me, message.reason, state, message)
            elif mc is SystemTerminate:
                await _terminate(server, me, message.reason, state, message)
            else:
                ret = server.handle_info(message, state)
                if cls._async_info:
                    ret = await ret
            rc = ret.__class__
            if rc is NoReply:
                state, timeout, cont = ret.state, ret.timeout, ret.continue_
            elif rc is Stop:
                await _terminate(server, me, ret.reason, ret.state, message)
            else:
                raise _Bad(ret)
    except _Bad as bad:
        await _terminate(server, me, BadReturnValue(bad.value), state, message)
    except (_Terminated, KilledBySignal):
        raise
    except ProcessExit as exc:
        # otp.exit_self(reason) in a callback: OTP's try_dispatch catches class exit too.
        await _terminate(server, me, exc.reason, state, message)
    except Exception as exc:
        await _terminate(server, me, Crash(exc), state, message)


class _Terminated(ProcessExit):
    """The exit that ends the server once ``terminate`` has run (so it does not run again)."""


class _Bad(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


async def _terminate(
    server: GenServer,
    me: Process,
    reason: Any,
    state: Any,
    last_message: Any,
    *,
    reply_to: From | None = None,
    reply: Any = UNSET,
) -> None:
    """Run ``terminate``, log an abnormal exit once, send a pending stop-reply, then exit."""
    try:
        ret = server.terminate(reason, state)
        if type(server)._async_terminate:
            await ret
    except KilledBySignal:
        raise
    except ProcessExit as exc:
        reason = exc.reason  # as OTP's try_terminate, which catches class exit too
    except Exception as exc:
        reason = Crash(exc)
    if is_abnormal(reason):
        log_crash(me, reason, last_message=last_message, state=state)
    if reply_to is not None and reply is not UNSET:
        send_reply(reply_to, reply)
    raise _Terminated(reason)
