"""Trusted builds of the matching messages read most often (``wire._matching.parse_matching``):
a worker reads an M_TASK per call, a client an M_REPLY per call, the server an M_CALL per call
and an M_ACCEPT and an M_RESULT (or M_FAILURE) per task.

``encode_result`` (:func:`result_encoder`) is the other way: the bytes of a worker's M_ACCEPT
and M_RESULT without building either message (a worker writes them once per quick call).

Each builder checks, inline, that every field has the shape the class's validators accept
(exactly those checks, in one function instead of a validator call per field), and builds
the instance with the class's slot setters, as attrs' ``__init__`` would. Anything else (a
missing key, a value of another shape) returns None: the class's constructor then runs and
names what is wrong, so errors are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from ._frame import Codec, MessageType, encode_message
from ._limits import Limits

__all__ = ["Builder", "ResultEncoder", "builders", "result_encoder"]

#: Builds a message from a payload dict and the frame's request id, or returns None.
Builder = Callable[[dict[Any, Any], int], Any]

_U64_MAX = (1 << 64) - 1
_isfinite = math.isfinite


def _setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of ``cls``'s attributes ``names``, which must be all of them, in
    their order (a builder that no longer matches its class fails at import)."""
    fields = tuple(a.name for a in attrs.fields(cls))
    if fields != names:
        raise TypeError(f"{cls.__name__}'s fields are {fields}, its builder's {names}")
    return tuple(cls.__dict__[name].__set__ for name in names)


def _task(cls: type) -> Builder:
    new = object.__new__
    (
        s_delivery,
        s_kind,
        s_flow_type,
        s_flow_id,
        s_name,
        s_execution_id,
        s_attempt,
        s_args,
        s_state,
        s_timeout,
        s_step_kind,
        s_rid,
    ) = _setters(
        cls,
        "delivery",
        "kind",
        "flow_type",
        "flow_id",
        "name",
        "execution_id",
        "attempt",
        "args",
        "state",
        "timeout",
        "step_kind",
        "rid",
    )

    def build(p: dict[Any, Any], rid: int) -> Any:
        get = p.get
        delivery = get("delivery")
        kind = get("kind")
        flow_type = get("flow_type")
        flow_id = get("flow_id")
        name = get("name")
        execution_id = get("execution_id")
        attempt = get("attempt")
        args = get("args")
        state = get("state")
        timeout = get("timeout")
        step_kind = get("step_kind")
        if not (
            (type(delivery) is int and 0 <= delivery <= _U64_MAX)
            and (kind == "step" or kind == "rpc")
            and type(kind) is str
            and (type(flow_type) is str and flow_type != "")
            and (type(flow_id) is str and flow_id != "")
            and (type(name) is str and name != "")
            and (type(execution_id) is str and execution_id != "")
            and type(attempt) is int
            and attempt >= 0
            and type(args) is list
            and type(state) is dict
            and "timeout" in p
            and (
                timeout is None or (type(timeout) is float and _isfinite(timeout) and timeout >= 0)
            )
            and (step_kind is None or step_kind == "execute" or step_kind == "wait_for")
            and (step_kind is None or type(step_kind) is str)
            and (type(rid) is int and 0 < rid <= _U64_MAX)
        ):
            return None
        task: Any = new(cls)
        s_delivery(task, delivery)
        s_kind(task, kind)
        s_flow_type(task, flow_type)
        s_flow_id(task, flow_id)
        s_name(task, name)
        s_execution_id(task, execution_id)
        s_attempt(task, attempt)
        s_args(task, args)
        s_state(task, state)
        s_timeout(task, timeout)
        s_step_kind(task, step_kind)
        s_rid(task, rid)
        return task

    return build


def _reply(cls: type) -> Builder:
    new = object.__new__
    s_value, s_rid = _setters(cls, "value", "rid")

    def build(p: dict[Any, Any], rid: int) -> Any:
        if "value" not in p or not (type(rid) is int and 0 < rid <= _U64_MAX):
            return None
        reply: Any = new(cls)
        s_value(reply, p["value"])
        s_rid(reply, rid)
        return reply

    return build


def _accept(cls: type) -> Builder:
    new = object.__new__
    s_delivery, s_rid = _setters(cls, "delivery", "rid")

    def build(p: dict[Any, Any], rid: int) -> Any:
        delivery = p.get("delivery")
        if not (
            (type(delivery) is int and 0 <= delivery <= _U64_MAX)
            and (type(rid) is int and 0 < rid <= _U64_MAX)
        ):
            return None
        accept: Any = new(cls)
        s_delivery(accept, delivery)
        s_rid(accept, rid)
        return accept

    return build


def _result(cls: type) -> Builder:
    new = object.__new__
    s_delivery, s_value, s_patch, s_not_yet, s_rid = _setters(
        cls, "delivery", "value", "patch", "not_yet", "rid"
    )

    def build(p: dict[Any, Any], rid: int) -> Any:
        delivery = p.get("delivery")
        patch = p.get("patch")
        not_yet = p.get("not_yet")
        if not (
            (type(delivery) is int and 0 <= delivery <= _U64_MAX)
            and "value" in p
            and type(patch) is dict
            and type(patch.get("set")) is dict
            and type(patch.get("delete")) is list
            and (not_yet is None or type(not_yet) is bool)
            and (type(rid) is int and 0 < rid <= _U64_MAX)
        ):
            return None
        result: Any = new(cls)
        s_delivery(result, delivery)
        s_value(result, p["value"])
        s_patch(result, patch)
        s_not_yet(result, not_yet)
        s_rid(result, rid)
        return result

    return build


def _failure(cls: type) -> Builder:
    new = object.__new__
    s_delivery, s_type, s_message, s_retryable, s_rid = _setters(
        cls, "delivery", "type", "message", "retryable", "rid"
    )

    def build(p: dict[Any, Any], rid: int) -> Any:
        delivery = p.get("delivery")
        kind = p.get("type")
        message = p.get("message")
        retryable = p.get("retryable")
        if not (
            (type(delivery) is int and 0 <= delivery <= _U64_MAX)
            and (type(kind) is str and kind != "")
            and type(message) is str
            and type(retryable) is bool
            and (type(rid) is int and 0 < rid <= _U64_MAX)
        ):
            return None
        failure: Any = new(cls)
        s_delivery(failure, delivery)
        s_type(failure, kind)
        s_message(failure, message)
        s_retryable(failure, retryable)
        s_rid(failure, rid)
        return failure

    return build


def _call(cls: type) -> Builder:
    new = object.__new__
    s_op, s_args, s_rid = _setters(cls, "op", "args", "rid")

    def build(p: dict[Any, Any], rid: int) -> Any:
        op = p.get("op")
        args = p.get("args")
        if not (
            (type(op) is str and op != "")
            and type(args) is dict
            and (type(rid) is int and 0 < rid <= _U64_MAX)
        ):
            return None
        call: Any = new(cls)
        s_op(call, op)
        s_args(call, args)
        s_rid(call, rid)
        return call

    return build


def builders(
    *, task: type, reply: type, accept: type, result: type, failure: type, call: type
) -> dict[type, Builder]:
    """The builders, by message class (the classes of ``wire._matching``, whose fields they
    know: a change to a class's fields must change its builder)."""
    return {
        task: _task(task),
        reply: _reply(reply),
        accept: _accept(accept),
        result: _result(result),
        failure: _failure(failure),
        call: _call(call),
    }


_M_ACCEPT, _M_RESULT = MessageType.M_ACCEPT, MessageType.M_RESULT

#: ``encode_result(delivery, value, patch, rid, codec, *, limits, accept=False) -> bytes``.
ResultEncoder = Callable[..., bytes]


def result_encoder(accept_cls: type, result_cls: type) -> ResultEncoder:
    """``encode_result`` of the classes of ``wire._matching`` (MatchAccept, MatchResult)."""

    def encode_result(
        delivery: int,
        value: Any,
        patch: dict[str, Any],
        rid: int,
        codec: Codec,
        *,
        limits: Limits,
        accept: bool = False,
    ) -> bytes:
        """``MatchResult(delivery, value, patch, rid=rid).encode(codec, limits=limits)``,
        after ``MatchAccept(delivery, rid=rid)``'s bytes when ``accept``, without building
        either (a worker writes them once per quick call): the same bytes, the same errors.

        Raises:
            InvalidValue: A field is invalid (as the classes say).
            WireError: as :func:`encode_message`.
        """
        if not (
            (type(delivery) is int and 0 <= delivery <= _U64_MAX)
            and (type(rid) is int and 0 < rid <= _U64_MAX)
            and type(patch) is dict
            and type(patch.get("set")) is dict
            and type(patch.get("delete")) is list
        ):
            # (the messages built: their constructors name what is wrong)
            data: bytes = result_cls(delivery, value, patch, rid=rid).encode(codec, limits=limits)
            if accept:
                data = accept_cls(delivery, rid=rid).encode(codec, limits=limits) + data
            return data
        data = encode_message(
            _M_RESULT,
            {"delivery": delivery, "value": value, "patch": patch},
            codec=codec,
            request_id=rid,
            limits=limits,
        )
        if accept:
            data = (
                encode_message(
                    _M_ACCEPT, {"delivery": delivery}, codec=codec, request_id=rid, limits=limits
                )
                + data
            )
        return data

    return encode_result
