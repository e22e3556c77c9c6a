"""``send_request``: a GenServer call whose answer arrives as a message (OTP's
``gen_server:send_request/2`` with ``check_response``).

A process that serves many callers at once (a connection multiplexing its peer's requests, a
router) would otherwise park one task per outstanding ``call``. With ``send_request`` it sends
the request, goes on, and later receives a :class:`Response` naming the request: the server's
reply, or the server's exit reason if it died (or was not alive) first. The caller monitors the
server while the request is outstanding, exactly as ``call`` does; there is no timeout (as in
OTP, the caller decides how long to wait for the message).

A caller whose handling of the answer never waits may pass ``on_response`` instead: the answer of
a local server is then handed to it where it is resolved (in the server's task, or as the server
exits), with no message and no wake-up of the caller (issue 15: the matching server's
connections answer two requests a Step so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ._api import spawn
from ._errors import CallError
from ._gen_server import call
from ._gen_server_core import GenCall, is_remote, resolve_server, unwatch, watch
from ._ids import Ref
from ._messages import From
from ._node import current_node, log_crash
from ._process import Process, current_process
from ._reasons import NOPROC, Crash

__all__ = ["Response", "send_request"]


@attrs.frozen(slots=True)
class Response:
    """The answer to :func:`send_request` (a message in the caller's mailbox).

    Attributes:
        request_id: What ``send_request`` returned.
        value: The server's reply (None when ``error`` is set).
        error: None, or why there is no reply: the server's exit reason (``"noproc"`` when it
            was not alive, ``"calling_self"`` when it is the caller), as ``CallError`` carries
            it for ``call``.
    """

    request_id: Ref
    value: Any = None
    error: Any = None


class _ResponseSlot:
    """The alias of one outstanding request (duck-typed as a call's waiter): its reply or the
    server's DOWN becomes a :class:`Response` in the caller's mailbox, or goes to the caller's
    ``on_response``."""

    __slots__ = ("caller", "done", "on_response", "ref", "target")

    def __init__(
        self,
        caller: Process,
        target: Process,
        ref: Ref,
        on_response: Callable[[Response], None] | None,
    ) -> None:
        self.caller = caller
        self.target = target
        self.ref = ref
        self.on_response = on_response
        self.done = False

    def resolve(self, value: Any, is_down: bool) -> None:
        if self.done:
            return
        self.done = True
        caller = self.caller
        unwatch(caller, self.target, self.ref)
        if is_down:
            response = Response(self.ref, None, value)
        else:
            response = Response(self.ref, value, None)
        on_response = self.on_response
        if on_response is None:
            caller.deliver(response)
            return
        if not caller.alive or caller.exiting:
            return  # (what its mailbox would have dropped)
        try:
            on_response(response)
        except Exception as exc:
            # A bug of the caller's: it ends the caller, as it would have in its own task,
            # not the server whose task ran it.
            reason = Crash(exc)
            log_crash(caller, reason, last_message=response)
            caller.die(reason)

    def time_out(self) -> None:  # (never armed: a request has no timeout)
        pass


def send_request(
    server: Any,
    request: Any,
    *,
    on_response: Callable[[Response], None] | None = None,
    hand_over: Callable[[From, Any], bool] | None = None,
) -> Ref:
    """Send ``request`` to the GenServer ``server`` (pid, name or ``(name, node)``) as a call,
    without waiting; return the request id. Exactly one :class:`Response` with that id reaches
    the caller's mailbox later: the reply, or the server's exit reason.

    With ``on_response``, the :class:`Response` of a live local server is not sent: it is
    passed to ``on_response`` by whoever resolves the request, in the server's task when it
    replies, or as it exits; never before ``send_request`` has returned (but inside
    ``hand_over``, below), and never once the caller is dead or exiting. ``on_response`` must
    not block (it is no coroutine) and should not raise: an exception it raises is a crash of
    the caller (logged, the caller exits with it), not of the server. A request answered at
    once (``noproc``, ``calling_self``) or sent to another node still answers with a message.

    ``hand_over(from_, request)``, if given, is asked first for a live local server: a server
    whose handling of the request never waits may run it in the caller's task, on its state
    (as its ``handle_call`` with ``from_``), and return True, instead of being sent it; False
    sends it. A reply given inside ``hand_over`` goes to ``on_response`` there and then (a
    message without one), before this returns: a caller that files its requests by id files
    this one in ``hand_over``, where ``from_.tag`` is the id (the matching connection's two
    calls a Step are answered so, their commits run inside: issue 15).

    Raises:
        TypeError: ``server`` is not a pid, a name or ``(name, node)``.
    """
    me = current_process()
    node = me.node
    ref = node.make_ref()
    target = resolve_server(node, server)
    if target is None:
        if node.distribution is not None and is_remote(node, server):
            # A remote server: a helper process (not linked) makes the call and answers.
            spawn(_remote_request, me.pid, ref, server, request)
        else:
            me.deliver(Response(ref, None, NOPROC))
        return ref
    if target is me:
        me.deliver(Response(ref, None, "calling_self"))
        return ref
    slot = _ResponseSlot(me, target, ref, on_response)
    watch(me, target, ref, slot)  # type: ignore[arg-type]
    from_ = From(me.pid, ref)
    if hand_over is not None and hand_over(from_, request):
        return ref
    target.deliver(GenCall(from_, request))
    return ref


async def _remote_request(caller: Any, ref: Ref, server: Any, request: Any) -> None:
    node = current_node()
    try:
        value = await call(server, request, None)
    except CallError as exc:
        answer = Response(ref, None, exc.reason)
    else:
        answer = Response(ref, value, None)
    proc = node.resolve(caller)
    if proc is not None:
        proc.deliver(answer)
