"""The table actor: the process that stands for a table on its node.

Local processes read and write a table directly; the actor owns what needs a process: it sweeps
expired objects on trio's clock and serves requests from other nodes (and ``ets.rpc``), checking
access against the requester. It is a ``GenServer`` and lives exactly as long as its table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._gen_server import GenServer, NoReply, Ok, Reply, Stop
from .._gen_server_core import serve
from .._messages import From
from .._process import Process
from .._reasons import NORMAL
from ._errors import EtsError, brief
from ._expiry import SWEEP
from ._registry import ON_BEHALF_OF
from ._table import STOP, Tab, add_hook

Operations = Mapping[str, Callable[..., Any]]


#: The tag of a request to a table actor: ``(REQUEST, operation, args, kwargs)``. Requests and
#: replies are plain tuples so that they cross nodes through ``otp``'s distribution as they are.
REQUEST = "$ets_request"


def request(operation: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A request to run the ``ets`` function ``operation`` on the actor's table."""
    return (REQUEST, operation, args, kwargs)


def ok(value: Any) -> tuple[Any, ...]:
    return ("ok", value)


def failed(kind: str, message: str) -> tuple[Any, ...]:
    """The reply when the operation raised: the error's class name and message, re-raised by
    the client as the same ``otp.ets`` error."""
    return ("error", kind, message)


class TableActor(GenServer):
    """The GenServer behind one table (state: the table and the operations it may serve)."""

    def init(self, tab: Tab, operations: Operations) -> Ok:
        return Ok((tab, operations))

    def handle_call(self, request: Any, from_: From, state: tuple[Tab, Operations]) -> Reply:
        tab, operations = state
        if not (
            isinstance(request, tuple)
            and len(request) == 4
            and request[0] == REQUEST
            and isinstance(request[2], tuple | list)
            and isinstance(request[3], dict)
        ):
            return Reply(
                failed("EtsError", f"the table actor got a bad request {brief(request)}"), state
            )
        _, operation, args, kwargs = request
        fn = operations.get(operation)
        if fn is None:
            return Reply(
                failed("EtsError", f"ets.rpc: {brief(operation)} is not an ets operation"), state
            )
        token = ON_BEHALF_OF.set(from_.pid)
        try:
            reply = ok(fn(tab.handle, *args, **kwargs))
        except Exception as exc:
            # A bad request from a client must not take the table's actor down: the client
            # gets the error back, re-raised on its side.
            if isinstance(exc, EtsError):
                reply = failed(type(exc).__name__, str(exc))
            else:
                reply = failed("EtsError", f"ets.{operation}: {type(exc).__name__}: {exc}")
        finally:
            ON_BEHALF_OF.reset(token)
        return Reply(reply, state)

    def handle_info(self, message: Any, state: tuple[Tab, Operations]) -> NoReply | Stop:
        if message is SWEEP:
            state[0].sweep()
            return NoReply(state)
        if message is STOP:
            return Stop(NORMAL, state)
        return NoReply(state)


def spawn_actor(tab: Tab, operations: Operations) -> Process:
    """Start the actor of ``tab`` now, without waiting for its ``init`` (``ets.new`` is a plain
    function, as Erlang's BIF is). Requests sent before ``init`` ran wait in its mailbox."""
    owner = tab.owner_proc
    node = tab.node
    # The start acknowledgement goes to a tag nobody waits for, so it is dropped.
    starter = From(owner.pid, node.make_ref())
    proc = node.spawn(serve, (TableActor, (tab, operations), None, starter, False), owner)
    tab.actor_proc = proc
    add_hook(proc, tab.actor_exited)
    return proc
