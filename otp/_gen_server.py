"""``GenServer``: OTP's gen_server behaviour, a generic server loop around typed callbacks.

Subclass it and implement the callbacks (sync or async); start it with ``start_link``/``start``;
talk to it with ``call``/``cast``; stop it with ``stop``. Callbacks return typed values
(:class:`Ok`, :class:`Reply`, :class:`NoReply`, :class:`Stop`, :class:`Ignore`); anything else is
a ``BadReturnValue`` exit, as in OTP. ``terminate`` runs exactly where OTP runs it: on a ``Stop``
return, a callback exception, a bad return, ``stop()``, and a parent's exit signal while
trapping exits; never on ``kill`` nor on an exit signal the server does not trap.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import trio

from ._api import register, unlink
from ._errors import BadArg, CallError, CallTimeout, NoProc, StartError, StartIgnored, StopError
from ._ids import Pid, Ref
from ._messages import Exit, From
from ._node import Node, current_node, log_crash
from ._process import (
    TIMED_OUT,
    CallWaiter,
    KilledBySignal,
    Process,
    ProcessExit,
    current_process,
)
from ._reasons import KILL, NOPROC, NORMAL, BadReturnValue, Crash, is_abnormal
from ._timers import checked_seconds

logger = logging.getLogger("otp.gen_server")

DEFAULT_CALL_TIMEOUT = 5.0


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


def _checked_timeout(timeout: Any, what: str) -> float | None:
    """``timeout`` (seconds or None), or a TypeError/ValueError naming ``what``: the slow path
    behind the inline test of the client functions, so a bad timeout is refused before anything
    is sent or spawned."""
    return None if timeout is None else checked_seconds(timeout, what, none_ok=True)


# -- callback return values ---------------------------------------------------------------------


def _valid_timeout(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # Refused when built, not later in the server's receive with an unrelated error.
    if value is None or ((value.__class__ is float or value.__class__ is int) and value == value):
        return
    checked_seconds(value, f"{type(inst).__name__}.{attribute.name}", none_ok=True)


@attrs.define(slots=True, frozen=True)
class Ok:
    """``init`` succeeded: ``{ok, State}`` (optionally with a timeout or a continue).

    Raises:
        TypeError: ``timeout`` is not a number of seconds or None.
        ValueError: ``timeout`` is NaN.
    """

    state: Any
    timeout: float | None = attrs.field(default=None, validator=_valid_timeout)
    continue_: Any = UNSET


@attrs.define(slots=True, frozen=True)
class Reply:
    """``handle_call`` answers now: ``{reply, Value, State}``. ``timeout`` as in :class:`Ok`."""

    value: Any
    state: Any
    timeout: float | None = attrs.field(default=None, validator=_valid_timeout)
    continue_: Any = UNSET


@attrs.define(slots=True, frozen=True)
class NoReply:
    """Carry on with ``state``: ``{noreply, State}`` (the call, if any, is answered later with
    ``GenServer.reply``). ``timeout`` as in :class:`Ok`."""

    state: Any
    timeout: float | None = attrs.field(default=None, validator=_valid_timeout)
    continue_: Any = UNSET


@attrs.define(slots=True, frozen=True)
class Stop:
    """Stop the server with ``reason``: ``{stop, Reason, State}`` or, from ``handle_call`` with
    ``reply`` set, ``{stop, Reason, Reply, State}`` (``terminate`` runs before the reply is sent).
    From ``init`` it makes the start fail with ``reason``."""

    reason: Any
    state: Any = None
    reply: Any = UNSET


@attrs.define(slots=True, frozen=True)
class Ignore:
    """``init`` declines to start: the start returns ``ignore`` and the process exits normally."""


# -- messages the engine understands ------------------------------------------------------------


class _Call:
    __slots__ = ("from_", "request")

    def __init__(self, from_: From, request: Any) -> None:
        self.from_ = from_
        self.request = request

    def __repr__(self) -> str:
        return f"{{'$gen_call', {self.from_!r}, {self.request!r}}}"


class _Cast:
    __slots__ = ("request",)

    def __init__(self, request: Any) -> None:
        self.request = request

    def __repr__(self) -> str:
        return f"{{'$gen_cast', {self.request!r}}}"


class _SystemTerminate:
    __slots__ = ("reason",)

    def __init__(self, reason: Any) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"{{system, terminate, {self.reason!r}}}"


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn)


class GenServer:
    """The gen_server behaviour. Subclass it; the engine owns the loop.

    Client functions (``start_link``, ``call``, ``cast``, ``reply``, ``stop``) come first below,
    then the callbacks a subclass overrides. Callbacks may be plain or ``async`` methods.
    """

    _async_init: ClassVar[bool] = False
    _async_call: ClassVar[bool] = False
    _async_cast: ClassVar[bool] = False
    _async_info: ClassVar[bool] = False
    _async_continue: ClassVar[bool] = False
    _async_terminate: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._async_init = _is_async(cls.init)
        cls._async_call = _is_async(cls.handle_call)
        cls._async_cast = _is_async(cls.handle_cast)
        cls._async_info = _is_async(cls.handle_info)
        cls._async_continue = _is_async(cls.handle_continue)
        cls._async_terminate = _is_async(cls.terminate)

    # ======================================== client side ====================================

    @classmethod
    async def start_link(
        cls, *args: Any, name: str | None = None, timeout: float | None = None
    ) -> Pid:
        """Start a server linked to the caller; return its pid once ``init`` has returned.

        Raises:
            StartError: ``init`` returned ``Stop(reason)``, raised (reason ``Crash``), returned
                something else (``BadReturnValue``), the name is taken
                (``("already_started", pid)``) or ``timeout`` passed (``"timeout"``; the
                half-started process is unlinked and killed, and leaves the caller no ``Exit``).
                When ``init`` fails, a trapping caller also gets the ``Exit``.
            BadArg: ``name`` is not a non-empty str (nothing is started).
            StartIgnored: ``init`` returned ``Ignore()``.
            TypeError, ValueError: ``timeout`` is not a number of seconds or None, or is NaN
                (nothing is started).

        Cancellation by a cancel scope of the caller while ``init`` runs unlinks and kills the
        half-started process, as a timeout does (nobody could ever get its pid). If the caller's
        process is killed instead, the link carries its exit signal to the child, as in OTP.
        """
        return await _start(cls, args, name, timeout, link=True)

    @classmethod
    async def start(cls, *args: Any, name: str | None = None, timeout: float | None = None) -> Pid:
        """Start a server not linked to the caller; otherwise as :meth:`start_link`."""
        return await _start(cls, args, name, timeout, link=False)

    @staticmethod
    async def call(server: Any, request: Any, timeout: float | None = DEFAULT_CALL_TIMEOUT) -> Any:
        """Send ``request`` to ``server`` (pid, name or ``(name, node)``) and wait for its reply.

        The caller monitors the server for the duration of the call. ``timeout`` is in seconds
        (None waits forever, OTP's ``infinity``). A reply that arrives after the caller gave up
        is dropped.

        Raises:
            CallTimeout: no reply within ``timeout`` (reason ``"timeout"``).
            CallError: the server was not alive (``"noproc"``), died during the call (its exit
                reason), or is the caller itself (``"calling_self"``).
            TypeError, ValueError: ``timeout`` is not a number of seconds or None, or is NaN
                (nothing is sent).
        """
        if not (
            timeout is None
            or ((timeout.__class__ is float or timeout.__class__ is int) and timeout == timeout)
        ):
            timeout = _checked_timeout(timeout, "GenServer.call(timeout=...)")
        me = current_process()
        node = me.node
        try:
            target = _resolve_server(node, server)
        except BadArg:
            target = None
        if target is None:
            dist = node.distribution
            if dist is not None and _is_remote(node, server):
                return await dist.call(me, server, request, timeout)
            await trio.lowlevel.checkpoint()
            raise CallError(NOPROC, server, request)
        if target is me:
            raise CallError("calling_self", server, request)
        ref = node.make_ref()
        waiter = CallWaiter()
        _watch(me, target, ref, waiter)
        target.deliver(_Call(From(me.pid, ref), request))
        await _wait(node, waiter, timeout, lambda: _unwatch(me, target, ref))
        value = waiter.value
        if value is TIMED_OUT:
            raise CallTimeout("timeout", server, request)
        if waiter.is_down:
            raise CallError(value, server, request)
        return waiter.value

    @staticmethod
    def cast(server: Any, request: Any) -> None:
        """Send ``request`` to ``server`` without waiting. As OTP's ``cast``, it never fails
        for a server that is not alive or not reachable.

        Raises:
            TypeError: ``server`` is not a pid, a name or ``(name, node)`` (OTP fails there too).
        """
        node = current_node()
        try:
            target = _resolve_server(node, server)
        except BadArg:
            return
        if target is not None:
            target.deliver(_Cast(request))
        elif node.distribution is not None and _is_remote(node, server):
            node.distribution.send(server, _Cast(request))

    @staticmethod
    def reply(from_: From, value: Any) -> None:
        """Answer the call ``from_`` (from any process); dropped if the caller gave up."""
        node = current_node()
        caller = node.resolve(from_.pid)
        if caller is None:
            if from_.pid._proc is None and node.distribution is not None:
                node.distribution.reply(from_, value)
            return
        aliases = caller.aliases
        if aliases is not None:
            waiter = aliases.get(from_.tag)
            if waiter is not None:
                waiter.resolve(value, False)

    @staticmethod
    async def stop(server: Any, reason: Any = NORMAL, timeout: float | None = None) -> None:
        """Stop ``server`` (pid, name or ``(name, node)``, on this node or another) with
        ``reason``: it runs ``terminate`` and exits; waits for that, monitoring it.

        Raises:
            NoProc: the server is not alive.
            StopError: it exited with another reason (say, ``terminate`` crashed), or the
                connection to its node was lost (``"noconnection"``).
            TimeoutError: it did not exit within ``timeout`` seconds (it may still stop).
            TypeError, ValueError: ``timeout`` is not a number of seconds or None, or is NaN
                (nothing is sent).
        """
        if timeout is not None:
            timeout = _checked_timeout(timeout, "GenServer.stop(timeout=...)")
        me = current_process()
        node = me.node
        try:
            target = _resolve_server(node, server)
        except BadArg:
            target = None
        if target is not None:
            ref = node.make_ref()
            waiter = CallWaiter()
            _watch(me, target, ref, waiter)
            target.deliver(_SystemTerminate(reason))
            await _wait(node, waiter, timeout, lambda: _unwatch(me, target, ref))
            outcome = waiter.value
        elif node.distribution is not None and _is_remote(node, server):
            outcome = await node.distribution.stop(me, server, reason, timeout)
        else:
            outcome = NOPROC
            await trio.lowlevel.checkpoint()
        if outcome is TIMED_OUT:
            raise TimeoutError(f"stop({server!r}) timed out after {timeout} s")
        if outcome != reason:
            if outcome == NOPROC:
                raise NoProc(f"stop({server!r}): no such process")
            raise StopError(outcome)

    # ======================================== callbacks ======================================
    # Subclasses override these with any signature, plain or async (the engine looks once, at
    # class creation, which ones are coroutines). For the type checker they are plain callables,
    # so ``def init(self, port: int) -> Ok`` is a valid override.

    if TYPE_CHECKING:
        init: Callable[..., Any]
        handle_call: Callable[..., Any]
        handle_cast: Callable[..., Any]
        handle_info: Callable[..., Any]
        handle_continue: Callable[..., Any]
        terminate: Callable[..., Any]
    else:

        def init(self, *args: Any) -> Ok | Ignore | Stop:
            """Set up the state. Default: ``Ok(arg)`` for one argument, ``Ok(None)`` for none."""
            if len(args) > 1:
                raise TypeError(
                    f"{type(self).__qualname__} got {len(args)} start arguments but does not"
                    " define init(): override init(self, ...)"
                )
            return Ok(args[0] if args else None)

        def handle_call(self, request: Any, from_: From, state: Any) -> Reply | NoReply | Stop:
            """Answer a call. Default: crash, naming the request (OTP's ``undef``)."""
            raise NotImplementedError(
                f"{type(self).__qualname__} got call {request!r} but does not define handle_call()"
            )

        def handle_cast(self, request: Any, state: Any) -> NoReply | Stop:
            """Handle a cast. Default: crash, naming the request."""
            raise NotImplementedError(
                f"{type(self).__qualname__} got cast {request!r} but does not define handle_cast()"
            )

        def handle_info(self, message: Any, state: Any) -> NoReply | Stop:
            """Handle any other message. Default: log it as unexpected and carry on."""
            logger.warning(
                "%s %r received unexpected message: %r",
                type(self).__qualname__,
                current_process().pid,
                message,
            )
            return NoReply(state)

        def handle_continue(self, continue_: Any, state: Any) -> NoReply | Stop:
            """Run a ``continue_`` requested by the previous callback. Default: crash."""
            raise NotImplementedError(
                f"{type(self).__qualname__} asked to continue with {continue_!r} but does not"
                " define handle_continue()"
            )

        def terminate(self, reason: Any, state: Any) -> None:
            """Clean up before the server exits with ``reason``. Default: nothing."""


# -- engine -------------------------------------------------------------------------------------


def _is_remote(node: Node, server: Any) -> bool:
    if server.__class__ is Pid:
        return bool(server.node != node.name)
    return isinstance(server, tuple) and len(server) == 2 and server[1] != node.name


def _resolve_server(node: Node, server: Any) -> Process | None:
    if server.__class__ is Pid:
        return node.resolve(server)
    if isinstance(server, str):
        return node.names.get(server)
    if isinstance(server, tuple) and len(server) == 2 and isinstance(server[0], str):
        return node.names.get(server[0]) if server[1] == node.name else None
    raise TypeError(f"a server is a Pid, a registered name or (name, node) (got {server!r})")


async def _wait(
    node: Node, waiter: CallWaiter, timeout: float | None, cleanup: Callable[[], None]
) -> None:
    """Wait for ``waiter`` or ``timeout`` seconds (on the node's timer heap, which is cheaper
    than a cancel scope per call); ``cleanup`` runs whatever happens, cancellation included."""
    timer = None
    try:
        if timeout is not None:
            timer = node.timers.start(timeout, waiter.time_out)
        await waiter.wait()
    finally:
        cleanup()
        if timer is not None:
            node.timers.cancel(timer)


def _watch(me: Process, target: Process, ref: Ref, waiter: CallWaiter) -> None:
    """Monitor ``target`` with ``ref`` routed to ``waiter`` instead of the mailbox."""
    if me.aliases is None:
        me.aliases = {ref: waiter}
    else:
        me.aliases[ref] = waiter
    if target.monitored_by is None:
        target.monitored_by = {ref: me.pid}
    else:
        target.monitored_by[ref] = me.pid
    if me.monitors is None:
        me.monitors = {ref: target.pid}
    else:
        me.monitors[ref] = target.pid


def _unwatch(me: Process, target: Process, ref: Ref) -> None:
    if me.aliases is not None:
        me.aliases.pop(ref, None)
    if me.monitors is not None:
        me.monitors.pop(ref, None)
    if target.monitored_by is not None:
        target.monitored_by.pop(ref, None)


async def _start(
    cls: type[GenServer], args: tuple[Any, ...], name: str | None, timeout: float | None, link: bool
) -> Pid:
    if timeout is not None:
        verb = "start_link" if link else "start"
        timeout = _checked_timeout(timeout, f"{cls.__qualname__}.{verb}(timeout=...)")
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
    child = node.spawn(_serve, (cls, args, name, From(me.pid, ref), link), me, link=link)
    _watch(me, child, ref, waiter)
    try:
        await _wait(node, waiter, timeout, lambda: _unwatch(me, child, ref))
    except trio.Cancelled:
        # A cancel scope of the caller gave up: nobody will ever get the pid. A caller that is
        # itself exiting leaves the child to OTP's rules instead: a start_link child gets the
        # caller's exit signal through the link (a trapping one, say a supervisor, shuts down
        # cleanly once init returns); a start child lives on.
        if not me.exiting:
            _kill_flush(me, child, link)
        raise
    if waiter.value is TIMED_OUT:
        _kill_flush(me, child, link)
        raise StartError("timeout")
    result = waiter.value
    if waiter.is_down:
        raise StartError(result)
    if result is Ignore:
        raise StartIgnored()
    if isinstance(result, _StartFailed):
        raise StartError(result.reason)
    return child.pid


def _kill_flush(me: Process, child: Process, link: bool) -> None:
    """Kill a child whose start timed out or was cancelled, without its death reaching the
    caller (OTP's ``kill_flush``): unlink, kill, and drop an ``Exit`` the link may have queued
    already."""
    if link:
        unlink(child.pid)
    me.node.exit_signal(child, me.pid, KILL, False)
    if link:
        me.remove_messages(lambda m: m.__class__ is Exit and m.pid == child.pid)


class _StartFailed:
    __slots__ = ("reason",)

    def __init__(self, reason: Any) -> None:
        self.reason = reason


def _ack(starter: From, value: Any) -> None:
    GenServer.reply(starter, value)


async def _serve(
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
            _ack(starter, _StartFailed(reason))
            raise ProcessExit(NORMAL) from None
    server = cls()
    try:
        result = server.init(*args)
        if cls._async_init:
            result = await result
    except Exception as exc:
        reason = Crash(exc)
        log_crash(me, reason)
        _ack(starter, _StartFailed(reason))
        raise ProcessExit(reason) from None
    rc = result.__class__
    if rc is Ok:
        pass
    elif rc is Ignore:
        _ack(starter, Ignore)
        raise ProcessExit(NORMAL)
    elif rc is Stop:
        _ack(starter, _StartFailed(result.reason))
        raise ProcessExit(result.reason)
    else:
        reason = BadReturnValue(result)
        _ack(starter, _StartFailed(reason))
        raise ProcessExit(reason)
    _ack(starter, me.pid)
    parent = starter.pid if link else me.pid
    await _loop(server, me, parent, result.state, result.timeout, result.continue_)


async def _loop(
    server: GenServer, me: Process, parent: Pid, state: Any, timeout: float | None, cont: Any
) -> None:
    cls = type(server)
    receive = me.receive
    handle_call = server.handle_call
    async_call = cls._async_call
    message: Any = None
    ret: Any
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
                message = await receive()
            else:
                message = await receive(None, timeout, "timeout")
            me.last_message = message
            mc = message.__class__
            if mc is _Call:
                from_ = message.from_
                ret = handle_call(message.request, from_, state)
                if async_call:
                    ret = await ret
                rc = ret.__class__
                if rc is Reply:
                    GenServer.reply(from_, ret.value)
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
            if mc is _Cast:
                ret = server.handle_cast(message.request, state)
                if cls._async_cast:
                    ret = await ret
            elif mc is Exit and message.pid == parent and me.trap_exit:
                await _terminate(server, me, message.reason, state, message)
            elif mc is _SystemTerminate:
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
        GenServer.reply(reply_to, reply)
    raise _Terminated(reason)


call = GenServer.call
cast = GenServer.cast
reply = GenServer.reply
