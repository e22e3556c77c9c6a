"""The frames the server writes every Step, made straight from their fields: M_TASK (one a
Step) and M_REPLY (two a Step, ``start_flow``'s and ``result``'s). (What it reads, M_CALL,
M_ACCEPT and M_RESULT, ``wire.parse_matching`` builds as cheaply itself.)

The same messages and bytes as ``wire.MatchTask(...)`` / ``wire.MatchReply(...)`` and their
``encode``, with the same errors, for less: each message's
fields go through one function of checks instead of a validator call per field, and a payload
is written as a dict literal instead of a loop over the fields (issue 15: about 60 Python
calls a Step less). Anything the checks do not pass goes to wire's own code, which says what is
wrong.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

import wire

__all__ = ["encode_reply", "encode_task", "task_message"]

_new = object.__new__
_U64_MAX = 2**64 - 1
_M_TASK = wire.MessageType.M_TASK
_M_REPLY = wire.MessageType.M_REPLY
_encode = wire.encode_message


#: ``wire.MatchTask``'s fields in their order (which ``task_message``'s arguments follow), and
#: their slots' setters (what ``object.__setattr__`` calls, without looking each up by name).
_TASK_FIELDS = tuple(field.name for field in attrs.fields(wire.MatchTask))
_TASK_SETTERS = tuple(wire.MatchTask.__dict__[name].__set__ for name in _TASK_FIELDS)
assert _TASK_FIELDS == (
    "delivery", "kind", "flow_type", "flow_id", "name", "execution_id", "attempt", "args",
    "state", "timeout", "step_kind", "rid",
)  # fmt: skip


def task_message(
    rid: int,
    delivery: int,
    kind: str,
    flow_type: str,
    flow_id: str,
    name: str,
    execution_id: str,
    attempt: int,
    args: list[Any],
    state: dict[Any, Any],
    timeout: float | None,
    step_kind: str | None,
) -> wire.MatchTask:
    """``wire.MatchTask(...)`` of these fields (by keyword there), checked as its validators
    check them, in one function.

    Raises:
        WireError: as ``wire.MatchTask``'s constructor (which makes the error: the fields
            are given to it when any check fails).
    """
    if not (
        type(delivery) is int
        and 0 <= delivery <= _U64_MAX
        and type(kind) is str
        and (kind == "step" or kind == "rpc")
        and type(flow_type) is str
        and flow_type
        and type(flow_id) is str
        and flow_id
        and type(name) is str
        and name
        and type(execution_id) is str
        and execution_id
        and type(attempt) is int
        and attempt >= 0
        and type(args) is list
        and type(state) is dict
        # (an int timeout goes to the constructor too: its converter makes it a float)
        and (timeout is None or (type(timeout) is float and 0.0 <= timeout < math.inf))
        and (
            step_kind is None
            or (type(step_kind) is str and (step_kind == "execute" or step_kind == "wait_for"))
        )
        and type(rid) is int
        and 1 <= rid <= _U64_MAX
    ):
        return wire.MatchTask(
            delivery=delivery,
            kind=kind,
            flow_type=flow_type,
            flow_id=flow_id,
            name=name,
            execution_id=execution_id,
            attempt=attempt,
            args=args,
            state=state,
            timeout=timeout,
            step_kind=step_kind,
            rid=rid,
        )
    msg = _new(wire.MatchTask)
    (s_delivery, s_kind, s_flow_type, s_flow_id, s_name, s_execution_id, s_attempt, s_args,
     s_state, s_timeout, s_step_kind, s_rid) = _TASK_SETTERS  # fmt: skip
    s_delivery(msg, delivery)
    s_kind(msg, kind)
    s_flow_type(msg, flow_type)
    s_flow_id(msg, flow_id)
    s_name(msg, name)
    s_execution_id(msg, execution_id)
    s_attempt(msg, attempt)
    s_args(msg, args)
    s_state(msg, state)
    s_timeout(msg, timeout)
    s_step_kind(msg, step_kind)
    s_rid(msg, rid)
    return msg


def encode_task(msg: wire.MatchTask, codec: wire.Codec, limits: wire.Limits) -> bytes:
    """``msg.encode(codec, limits=limits)``: the same bytes and errors.

    Raises:
        WireError: as ``wire.MatchTask.encode``.
    """
    payload = {
        "delivery": msg.delivery,
        "kind": msg.kind,
        "flow_type": msg.flow_type,
        "flow_id": msg.flow_id,
        "name": msg.name,
        "execution_id": msg.execution_id,
        "attempt": msg.attempt,
        "args": msg.args,
        "state": msg.state,
        "timeout": msg.timeout,
    }
    if msg.step_kind is not None:  # (optional: left out when None, as wire does)
        payload["step_kind"] = msg.step_kind
    return _encode(_M_TASK, payload, codec=codec, request_id=msg.rid, limits=limits)


def encode_reply(value: Any, rid: int, codec: wire.Codec, limits: wire.Limits) -> bytes:
    """``wire.MatchReply(value, rid=rid).encode(codec, limits=limits)`` for the call id of a
    call the connection read (so a valid one): the same bytes and errors.

    Raises:
        WireError: as ``wire.MatchReply.encode`` (a value past the limits, say).
    """
    return _encode(_M_REPLY, {"value": value}, codec=codec, request_id=rid, limits=limits)
