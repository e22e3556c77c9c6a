"""The ops a server connection serves for M_CALL: clients' ``start_flow``, ``start_known``,
``call_rpc``, ``result``, ``describe``, ``list``, ``cancel``, ``queues``, workers'
``define_flows`` and everyone's ``put_blob`` / ``get_blob``.

Each call runs in a task of its own on its connection (as a Gunicorn-style worker serves
requests concurrently) and is answered by M_REPLY, or by an M_ERROR carrying the error's code
(``bad_frame`` for arguments of the wrong shape). While the connection drains (a graceful stop)
new calls, and the calls :func:`cancel_calls` gives up, get a retryable ``draining`` error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

import otp
import wire

from . import _matcher
from ._engine import FlowEngine
from ._errors import MatchingError
from ._flow_spec import parse_definitions

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["MAX_CALLS", "cancel_calls", "start_call"]

logger = logging.getLogger("apps.matching")

#: Client calls in flight on one connection.
MAX_CALLS = 1024


def start_call(conn: Connection, msg: wire.MatchCall) -> None:
    """Run ``msg``'s op in a task of its own on ``conn``'s nursery, answered by M_REPLY or
    M_ERROR; refused at once (M_ERROR) for a call id in flight, over :data:`MAX_CALLS`, or an
    op the connection's role may not call."""
    rid = msg.rid
    if rid in conn.calls:
        message = f"call id {rid} is already in flight on this connection"
        logger.warning("matching: bad frame from %s: %s", conn.label, message)
        conn.error(rid, "bad_frame", message)
        return
    if len(conn.calls) >= MAX_CALLS:
        conn.error(
            rid, "limit", f"{MAX_CALLS} calls are in flight on this connection", retryable=True
        )
        return
    if conn.drain_over or (conn.draining and conn.role == "client"):
        conn.error(rid, "draining", _DRAINING.format(op=msg.op), retryable=True)
        return
    op = _OPS.get(msg.op)
    allowed_ops = _WORKER_OPS if conn.role == "worker" else _CLIENT_OPS
    if op is None or msg.op not in allowed_ops:
        allowed = sorted(allowed_ops)
        conn.error(
            rid, "unsupported", f"a {conn.role} may call {', '.join(allowed)}, not {msg.op!r}"
        )
        return
    conn.calls.add(rid)
    scope = trio.CancelScope()
    conn.call_scopes[rid] = (msg.op, scope)
    assert conn.nursery is not None
    conn.nursery.start_soon(_run_call, conn, rid, msg.op, op, msg.args, scope)


def cancel_calls(conn: Connection, *, ops: tuple[str, ...] | None = None) -> None:
    """Give up ``conn``'s calls in flight (those of ``ops``, or all): each is answered by a
    retryable ``draining`` error as its task unwinds (what the op had done stays done)."""
    for name, scope in conn.call_scopes.values():
        if ops is None or name in ops:
            scope.cancel()


#: The ``draining`` error's message.
_DRAINING = "the server is stopping: {op} was not answered; retry it once it is back"


async def _run_call(
    conn: Connection,
    rid: int,
    name: str,
    op: Callable[[Connection, dict[Any, Any]], Awaitable[Any]],
    args: dict[Any, Any],
    scope: trio.CancelScope,
) -> None:
    try:
        with scope:
            value = await op(conn, args)
        if scope.cancelled_caught:
            conn.error(rid, "draining", _DRAINING.format(op=name), retryable=True)
            return
    except MatchingError as exc:
        conn.send_message(
            wire.MatchError(exc.code, exc.message, exc.retryable, dict(exc.details), rid=rid)
        )
    except _BadArgs as exc:
        conn.error(rid, "bad_frame", str(exc))
    except _CodedError as exc:
        conn.error(rid, exc.code, exc.message)
    except otp.CallTimeout as exc:
        conn.error(rid, "timeout", f"the server did not answer in time: {exc}", retryable=True)
    except otp.CallError as exc:
        conn.error(rid, "internal", f"the server failed the call: {exc}", retryable=True)
    else:
        conn.send_message(wire.MatchReply(value, rid=rid))
    finally:
        conn.calls.discard(rid)
        conn.call_scopes.pop(rid, None)
        conn.settle()


class _BadArgs(Exception):
    """A call's arguments are not what its op takes."""


class _CodedError(Exception):
    """A call's failure with a wire code of its own."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _arg(args: dict[Any, Any], key: str, kind: Any, *, optional: bool = False) -> Any:
    if key not in args:
        if optional:
            return None
        raise _BadArgs(f"the call needs the argument {key!r}")
    value = args[key]
    if value is None and optional:
        return None
    if kind is float:
        ok = type(value) in (int, float) and value >= 0
    else:
        ok = type(value) is kind
    if not ok:
        raise _BadArgs(
            f"argument {key!r} must be a {getattr(kind, '__name__', kind)}"
            f"{' or None' if optional else ''} (got {type(value).__name__})"
        )
    return float(value) if kind is float else value


async def _put_blob(conn: Connection, args: dict[Any, Any]) -> Any:
    data = _arg(args, "data", bytes)
    return await trio.to_thread.run_sync(conn.ctx.blobs.put, data)


async def _get_blob(conn: Connection, args: dict[Any, Any]) -> Any:
    key = _arg(args, "key", str)
    try:
        return await trio.to_thread.run_sync(conn.ctx.blobs.get, key)
    except KeyError:
        raise _CodedError(
            "blob_not_found", f"no blob {key} on this server: put_blob it first"
        ) from None


async def _start_flow(conn: Connection, args: dict[Any, Any]) -> Any:
    return await FlowEngine.start_flow(
        _arg(args, "flow_type", str),
        _arg(args, "args", list),
        _arg(args, "definition", dict),
        _arg(args, "flow_id", str, optional=True),
        server=conn.ctx.engine,
    )


async def _start_known(conn: Connection, args: dict[Any, Any]) -> Any:
    return await FlowEngine.start_known(
        _arg(args, "flow_type", str),
        _arg(args, "args", list),
        _arg(args, "flow_id", str, optional=True),
        server=conn.ctx.engine,
    )


async def _call_rpc(conn: Connection, args: dict[Any, Any]) -> Any:
    return await FlowEngine.call_rpc(
        _arg(args, "flow_id", str),
        _arg(args, "name", str),
        _arg(args, "args", list),
        _arg(args, "timeout", float, optional=True),
        server=conn.ctx.engine,
    )


async def _result(conn: Connection, args: dict[Any, Any]) -> Any:
    return await FlowEngine.result(
        _arg(args, "flow_id", str),
        _arg(args, "timeout", float, optional=True),
        server=conn.ctx.engine,
    )


async def _describe(conn: Connection, args: dict[Any, Any]) -> Any:
    return await FlowEngine.describe(_arg(args, "flow_id", str), server=conn.ctx.engine)


async def _list(conn: Connection, args: dict[Any, Any]) -> Any:
    limit = _arg(args, "limit", int, optional=True)
    return await FlowEngine.list_flows(
        _arg(args, "flow_type", str, optional=True),
        _arg(args, "status", str, optional=True),
        100 if limit is None else limit,
        server=conn.ctx.engine,
    )


async def _cancel(conn: Connection, args: dict[Any, Any]) -> Any:
    await FlowEngine.cancel(_arg(args, "flow_id", str), server=conn.ctx.engine)
    return None


async def _define_flows(conn: Connection, args: dict[Any, Any]) -> Any:
    definitions = parse_definitions(
        _arg(args, "flows", dict), max_flow_types=conn.ctx.config.limits.max_flow_types
    )
    FlowEngine.advertise(definitions, server=conn.ctx.engine)
    return None


async def _queues(conn: Connection, args: dict[Any, Any]) -> Any:
    return _matcher.queue_rows(await _matcher.statistics(matcher=conn.ctx.matcher))


_OPS: dict[str, Callable[[Connection, dict[Any, Any]], Awaitable[Any]]] = {
    "start_flow": _start_flow,
    "start_known": _start_known,
    "call_rpc": _call_rpc,
    "result": _result,
    "describe": _describe,
    "list": _list,
    "cancel": _cancel,
    "queues": _queues,
    "define_flows": _define_flows,
    "put_blob": _put_blob,
    "get_blob": _get_blob,
}
_WORKER_OPS = frozenset({"define_flows", "put_blob", "get_blob"})
#: Every op but the workers' own ``define_flows`` (the definitions of the code that runs).
_CLIENT_OPS = frozenset(_OPS) - {"define_flows"}
