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

import trio
from trio.lowlevel import cancel_shielded_checkpoint, current_task, wait_task_rescheduled

from ._errors import BadArg, CallError, CallTimeout, NoProc, StopError
from ._gen_server_core import (
    GenCall,
    GenCast,
    SystemTerminate,
    checked_timeout,
    is_remote,
    resolve_server,
    send_reply,
    start_server,
    unwatch,
    wait_reply,
    watch,
)
from ._gen_server_returns import Ignore, NoReply, Ok, Reply, Stop
from ._ids import Pid
from ._messages import From
from ._node import current_node
from ._process import (
    TIMED_OUT,
    CallWaiter,
    current_process,
)
from ._reasons import NOPROC, NORMAL

logger = logging.getLogger("otp.gen_server")

DEFAULT_CALL_TIMEOUT = 5.0


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
        return await start_server(cls, args, name, timeout, link=True)

    @classmethod
    async def start(cls, *args: Any, name: str | None = None, timeout: float | None = None) -> Pid:
        """Start a server not linked to the caller; otherwise as :meth:`start_link`."""
        return await start_server(cls, args, name, timeout, link=False)

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
            timeout = checked_timeout(timeout, "GenServer.call(timeout=...)")
        me = current_process()
        node = me.node
        if (
            server.__class__ is tuple
            and len(server) == 2
            and server[0].__class__ is str
            and server[1] != node.name
            and node.distribution is not None
        ):
            # ``(name, node)`` of another node: a remote call's hot path, without the two
            # calls resolve_server and is_remote would take to find that out.
            return await node.distribution.call(me, server, request, timeout)
        try:
            target = resolve_server(node, server)
        except BadArg:
            target = None
        if target is None:
            dist = node.distribution
            if dist is not None and is_remote(node, server):
                return await dist.call(me, server, request, timeout)
            await trio.lowlevel.checkpoint()
            raise CallError(NOPROC, server, request)
        if target is me:
            raise CallError("calling_self", server, request)
        ref = node.make_ref()
        waiter = CallWaiter()
        watch(me, target, ref, waiter)
        target.deliver(GenCall(From(me.pid, ref), request))
        # wait_reply inlined (the hot path): no closure and two coroutine frames fewer a call.
        timer = (
            None if timeout is None else node.timers.start(timeout, waiter.time_out, private=True)
        )
        try:
            if waiter.done:
                await cancel_shielded_checkpoint()
            else:
                waiter.task = current_task()
                await wait_task_rescheduled(waiter.abort)
        finally:
            unwatch(me, target, ref)
            if timer is not None:
                node.timers.discard(timer)
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
            target = resolve_server(node, server)
        except BadArg:
            return
        if target is not None:
            target.deliver(GenCast(request))
        elif node.distribution is not None and is_remote(node, server):
            node.distribution.send(server, GenCast(request))

    @staticmethod
    def reply(from_: From, value: Any) -> None:
        """Answer the call ``from_`` (from any process); dropped if the caller gave up."""
        send_reply(from_, value)

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
            timeout = checked_timeout(timeout, "GenServer.stop(timeout=...)")
        me = current_process()
        node = me.node
        try:
            target = resolve_server(node, server)
        except BadArg:
            target = None
        if target is not None:
            ref = node.make_ref()
            waiter = CallWaiter()
            watch(me, target, ref, waiter)
            target.deliver(SystemTerminate(reason))
            await wait_reply(node, waiter, timeout, lambda: unwatch(me, target, ref))
            outcome = waiter.value
        elif node.distribution is not None and is_remote(node, server):
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


call = GenServer.call
cast = GenServer.cast
reply = GenServer.reply
