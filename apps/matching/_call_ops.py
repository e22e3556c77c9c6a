"""The ops a server connection serves for M_CALL: clients' ``start_flow``, ``start_known``,
``call_rpc``, ``result``, ``describe``, ``list``, ``cancel``, ``queues``, workers'
``define_flows`` and everyone's ``put_blob`` / ``get_blob``.

The engine's ops (flows, RPCs, results, reads) go to the engine with ``otp.send_request``: no
task waits for them, the engine's answer is an ``otp.Response`` handed to :func:`answer_request`
where the engine gives it (``on_response``; a message to the connection's mailbox when the
engine was not there to ask), so a connection with a thousand calls in flight parks nothing.
An RPC and a ``result`` are handed to the engine (``hand_over``): it may run them in the
reader's own task (``_engine_handoff``), and answer them there. The other ops
run in a task of their own on the connection. Each call is answered by M_REPLY, or by an
M_ERROR carrying the error's code (``bad_frame`` for arguments of the wrong shape). While the
connection drains (a graceful stop) new calls, and the calls :func:`cancel_calls` gives up,
get a retryable ``draining`` error.
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
from ._engine_handoff import call_taker
from ._errors import MatchingError
from ._flow_spec import parse_definitions

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["MAX_CALLS", "answer_request", "cancel_calls", "start_call"]

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
    allowed_ops = _WORKER_OPS if conn.role == "worker" else _CLIENT_OPS
    if msg.op not in allowed_ops:
        allowed = sorted(allowed_ops)
        conn.error(
            rid, "unsupported", f"a {conn.role} may call {', '.join(allowed)}, not {msg.op!r}"
        )
        return
    request = _ENGINE_REQUESTS.get(msg.op)
    if request is not None:
        try:
            engine_request = request(msg.args)
        except _BadArgs as exc:
            conn.error(rid, "bad_frame", str(exc))
            return
        conn.calls.add(rid)
        call = (rid, msg.op)
        # (an op the engine may take in this task: ``_engine_handoff``)
        taker = call_taker(conn.ctx.engine, conn.takers) if msg.op in _HANDED_OPS else None
        if taker is None:
            ref = otp.send_request(conn.ctx.engine, engine_request, on_response=conn.answer)
            conn.requests[ref] = call
            return

        def hand_over(from_: otp.From, request: Any) -> bool:
            # (filed first: the engine may answer inside, ``send_request``'s ``hand_over``)
            conn.requests[from_.tag] = call
            return taker(from_, request)

        ref = otp.send_request(
            conn.ctx.engine, engine_request, on_response=conn.answer, hand_over=hand_over
        )
        if rid in conn.calls:  # (not answered inside: filed, or answered at once by message)
            conn.requests[ref] = call
        return
    op = _TASK_OPS[msg.op]
    conn.calls.add(rid)
    scope = trio.CancelScope()
    conn.call_scopes[rid] = (msg.op, scope)
    assert conn.nursery is not None
    conn.nursery.start_soon(_run_call, conn, rid, msg.op, op, msg.args, scope)


def answer_request(conn: Connection, response: otp.Response) -> None:
    """Answer the call whose engine request ``response`` answers (dropped if the call was
    given up meanwhile)."""
    call = conn.requests.pop(response.request_id, None)
    if call is None:
        return
    rid, _ = call
    conn.calls.discard(rid)
    reply = response.value
    if response.error is not None:
        reason = otp.format_reason(response.error)
        conn.error(rid, "internal", f"the server failed the call: {reason}", retryable=True)
    elif reply[0] == "ok":
        conn.send_reply(rid, reply[1])
    else:
        _, code, message, retryable, details = reply
        conn.send_message(wire.MatchError(code, message, retryable, dict(details), rid=rid))
    if conn.draining:  # (``settle`` does nothing otherwise: once a call)
        conn.settle()


def cancel_calls(conn: Connection, *, ops: tuple[str, ...] | None = None) -> None:
    """Give up ``conn``'s calls in flight (those of ``ops``, or all): each is answered by a
    retryable ``draining`` error (at once for an engine request, whose late answer is dropped;
    as its task unwinds for the others). What the op had done stays done."""
    for name, scope in conn.call_scopes.values():
        if ops is None or name in ops:
            scope.cancel()
    for ref, (rid, name) in list(conn.requests.items()):
        if ops is None or name in ops:
            del conn.requests[ref]
            conn.calls.discard(rid)
            conn.error(rid, "draining", _DRAINING.format(op=name), retryable=True)
    conn.settle()


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
        conn.send_reply(rid, value)
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


def _start_flow(args: dict[Any, Any]) -> tuple[Any, ...]:
    # Every argument of the usual shape, checked inline (one ``start_flow`` a Step: issue 15);
    # anything else goes through ``_arg``, which names what is wrong.
    flow_type, flow_args = args.get("flow_type"), args.get("args")
    flow_id, definition = args.get("flow_id"), args.get("definition")
    if (
        type(flow_type) is str
        and type(flow_args) is list
        and (flow_id is None or type(flow_id) is str)
        and type(definition) is dict
    ):
        return ("start_flow", flow_type, flow_args, flow_id, definition)
    return (
        "start_flow",
        _arg(args, "flow_type", str),
        _arg(args, "args", list),
        _arg(args, "flow_id", str, optional=True),
        _arg(args, "definition", dict),
    )


def _start_known(args: dict[Any, Any]) -> tuple[Any, ...]:
    return (
        "start_known",
        _arg(args, "flow_type", str),
        _arg(args, "args", list),
        _arg(args, "flow_id", str, optional=True),
    )


def _call_rpc(args: dict[Any, Any]) -> tuple[Any, ...]:
    flow_id, name, rpc_args, timeout = (
        args.get("flow_id"),
        args.get("name"),
        args.get("args"),
        args.get("timeout"),
    )
    if (  # (the usual shape, inline: see _start_flow)
        type(flow_id) is str
        and type(name) is str
        and type(rpc_args) is list
        and (timeout is None or (type(timeout) in (int, float) and timeout >= 0))
    ):
        return ("call_rpc", flow_id, name, rpc_args, None if timeout is None else float(timeout))
    return (
        "call_rpc",
        _arg(args, "flow_id", str),
        _arg(args, "name", str),
        _arg(args, "args", list),
        _arg(args, "timeout", float, optional=True),
    )


def _result(args: dict[Any, Any]) -> tuple[Any, ...]:
    flow_id, timeout = args.get("flow_id"), args.get("timeout")
    if type(flow_id) is str and (  # (the usual shape, inline: see _start_flow)
        timeout is None or (type(timeout) in (int, float) and timeout >= 0)
    ):
        return ("result", flow_id, None if timeout is None else float(timeout))
    return ("result", _arg(args, "flow_id", str), _arg(args, "timeout", float, optional=True))


def _describe(args: dict[Any, Any]) -> tuple[Any, ...]:
    return ("describe", _arg(args, "flow_id", str))


def _list(args: dict[Any, Any]) -> tuple[Any, ...]:
    limit = _arg(args, "limit", int, optional=True)
    return (
        "list_flows",
        _arg(args, "flow_type", str, optional=True),
        _arg(args, "status", str, optional=True),
        100 if limit is None else limit,
    )


def _cancel(args: dict[Any, Any]) -> tuple[Any, ...]:
    return ("cancel", _arg(args, "flow_id", str))


async def _define_flows(conn: Connection, args: dict[Any, Any]) -> Any:
    definitions = parse_definitions(
        _arg(args, "flows", dict), max_flow_types=conn.ctx.config.limits.max_flow_types
    )
    FlowEngine.advertise(definitions, server=conn.ctx.engine)
    return None


async def _queues(conn: Connection, args: dict[Any, Any]) -> Any:
    return _matcher.queue_rows(await _matcher.statistics(matcher=conn.ctx.matcher))


#: The engine's ops: each arguments -> the engine's request (``FlowEngine``'s client functions).
_ENGINE_REQUESTS: dict[str, Callable[[dict[Any, Any]], tuple[Any, ...]]] = {
    "start_flow": _start_flow,
    "start_known": _start_known,
    "call_rpc": _call_rpc,
    "result": _result,
    "describe": _describe,
    "list": _list,
    "cancel": _cancel,
}
#: The engine's ops it may take in the reader's task (``_engine_handoff``; not ``start_flow``
#: yet: see ARCHITECTURE.md).
_HANDED_OPS = frozenset({"call_rpc", "result"})
#: The other ops, each run in a task of its own.
_TASK_OPS: dict[str, Callable[[Connection, dict[Any, Any]], Awaitable[Any]]] = {
    "queues": _queues,
    "define_flows": _define_flows,
    "put_blob": _put_blob,
    "get_blob": _get_blob,
}
_WORKER_OPS = frozenset({"define_flows", "put_blob", "get_blob"})
#: Every op but the workers' own ``define_flows`` (the definitions of the code that runs).
_CLIENT_OPS = (frozenset(_TASK_OPS) | frozenset(_ENGINE_REQUESTS)) - {"define_flows"}
