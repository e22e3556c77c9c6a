"""Forwarding a call for a flow another matching server owns (MULTISERVER.md, part B).

A running flow is owned by the server whose lease holds its pending row; only the owner holds
it in memory. When a client's ``result``, ``call_rpc`` or ``cancel`` reaches a server that does
not hold the flow and cannot claim it (its row is leased, unexpired, to another server), the
engine hands the call to :func:`forward`, which returns at once: a helper process sends the
request, marked ``forwarded``, to the owner's engine with ``otp.call((engine, owner_node),
...)`` over the distribution connection the cluster keeps open (``_cluster``), and gives the
answer to the original caller. The engine never waits.

An engine asked a *forwarded* request about a flow it does not hold and cannot claim answers
``not_owner`` (:func:`not_owner`) rather than forwarding again, so calls never bounce between
servers. When the owner answers ``not_owner`` (it lost the flow meanwhile), its node goes down
mid-call, or it is not reachable, the helper re-resolves: it reads the flow's pending row again
and asks the server that holds the lease now, or this server's own engine when the lease is
free, expired or ours (which then claims the flow). It retries with a backoff (0.05 s doubling
to 1 s), within the caller's own timeout and at most ``ForwardOptions.patience`` seconds (a
little over two default leases: a dead owner's lease expires meanwhile); past that the caller
gets a retryable ``unavailable`` naming the owner. An RPC whose owner went away mid-call is not
sent again (it may have run, and RPCs are not run twice): its caller gets a retryable
``handler_error`` of type ``lost``, as for a worker lost with it. Never a hang: a forwarded call
whose node goes down fails at once (``noconnection``), and every wait is bounded.

The engine's own *notices* about a SubFlow's family travel the same way, with no caller to
answer (:data:`NOTICES`): ``("child_ended", parent_id)`` from the server where a child ended to
the server holding its parent (which reads the child from the store), and ``("cancel_child",
child_id, parent_id)`` from the server holding a parent that no longer waits for its child to
the child's owner. The owner acknowledges a notice once it holds the flow and has acted; a
notice is re-resolved like a call (a dead owner's lease expires meanwhile: then this server's
own engine takes the flow, and finds the ended child as any recovery does) for at most
``patience`` seconds, and one that still finds nobody is logged: the flow's next owner finds
the child's state in the store when it takes the flow (``_engine_kinds``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import attrs
import trio

import otp

from ._cluster import CLUSTER, Cluster
from ._engine_state import CALL_MARGIN, DEFAULT_TIMEOUT, ENGINE, _err, _State
from ._errors import ConfigurationError, HandlerError, MatchingError, Unavailable
from ._store import SERVER_NAME, PendingStep, StoreServer

__all__ = [
    "CANCEL_CHILD",
    "CHILD_ENDED",
    "FORWARDED",
    "NOTICES",
    "NOT_OWNER",
    "ForwardOptions",
    "forward",
    "is_not_owner",
    "known_owner",
    "lease_owner",
    "marked",
    "not_owner",
    "remember_owner",
]

logger = logging.getLogger("apps.matching")

#: The tag of a forwarded engine request: ``(FORWARDED, request)``.
FORWARDED = "forwarded"
#: The error code of an engine's answer to a forwarded request for a flow it does not own.
NOT_OWNER = "not_owner"
#: A notice: the child of the parent's parked SubFlow step may have ended (``(CHILD_ENDED,
#: parent_id)``).
CHILD_ENDED = "child_ended"
#: A notice: the parent no longer waits for this child; cancel it (``(CANCEL_CHILD, child_id,
#: parent_id)``).
CANCEL_CHILD = "cancel_child"
#: The requests that are notices: forwarded with nobody to answer.
NOTICES = frozenset({CHILD_ENDED, CANCEL_CHILD})
#: How long an owner found in the store is trusted before the store is read again.
OWNER_TTL = 5.0
#: The most owners an engine remembers.
MAX_OWNERS = 10_000
_FIRST_DELAY = 0.05
_MAX_DELAY = 1.0


def _seconds(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(
            f"ForwardOptions.{attribute.name} must be a number of seconds > 0 (got {value!r})"
        )


@attrs.frozen
class ForwardOptions:
    """How an engine forwards calls (``EngineOptions.forward``; None: it shares its store with
    no other server, and a call for a flow another server owns answers ``unavailable``).

    Attributes:
        cluster: The cluster process (``_cluster``), asked for an owner's node.
        store: The ``StoreServer``, read to re-resolve an owner.
        engine: The engine's registered name, on every server.
        patience: The longest a call is re-resolved (an owner unreachable or losing the flow)
            before its caller gets a retryable ``unavailable``.
    """

    cluster: Any = CLUSTER
    store: Any = SERVER_NAME
    engine: str = ENGINE
    patience: float = attrs.field(default=40.0, validator=_seconds)


def marked(request: tuple[Any, ...], forwarded: bool) -> tuple[Any, ...]:
    """``request`` as the engine hands it to :func:`forward`: ``(FORWARDED, request)`` when it
    came from another server's helper (then it is answered ``not_owner``, never forwarded
    again)."""
    return (FORWARDED, request) if forwarded else request


def lease_owner(rows: Sequence[PendingStep], server_id: str, now: float) -> str | None:
    """The other server whose unexpired lease holds one of the flow's pending ``rows`` (wall
    clock ``now``), or None: free, expired, or ours."""
    for row in rows:
        owner, expires = row.lease_owner, row.lease_expires
        if owner is not None and owner != server_id and expires is not None and expires > now:
            return owner
    return None


def not_owner(flow_id: str, server_id: str, owner: str | None) -> tuple[Any, ...]:
    """The engine's answer to a forwarded request for a flow it does not hold and cannot
    claim (only a forwarding helper ever sees it)."""
    held = f"server {owner} holds its lease" if owner is not None else "its lease is not ours"
    message = f"server {server_id} does not own flow {flow_id!r} ({held})"
    return ("error", NOT_OWNER, message, True, {"flow_id": flow_id, "owner": owner})


def is_not_owner(reply: Any) -> bool:
    return isinstance(reply, tuple) and len(reply) == 5 and reply[:2] == ("error", NOT_OWNER)


def known_owner(state: _State, flow_id: str) -> str | None:
    """The other server this engine lately found holding ``flow_id`` (within
    :data:`OWNER_TTL`), or None: a call for it is forwarded there without reading the store
    first. A stale entry costs one ``not_owner`` or a failed call, then the helper re-resolves
    from the store (and a flow this engine holds is found in memory before this is asked)."""
    known = state.owners.get(flow_id)
    if known is None:
        return None
    if known[1] < trio.current_time():
        del state.owners[flow_id]
        return None
    return known[0]


def remember_owner(state: _State, flow_id: str, owner: str) -> None:
    """``owner`` holds ``flow_id`` (its lease, read from the store just now); remembered only
    when this engine forwards (without it, every call reads the store, and one made once the
    lease expired takes the flow here at once)."""
    if state.options.forward is None:
        return
    owners = state.owners
    owners.pop(flow_id, None)
    owners[flow_id] = (owner, trio.current_time() + OWNER_TTL)
    if len(owners) > MAX_OWNERS:  # (the oldest entry goes: dicts keep insertion order)
        del owners[next(iter(owners))]


def forward(
    state: _State,
    from_: otp.From | None,
    request: tuple[Any, ...],
    flow_id: str,
    owner: str | None,
) -> None:
    """Answer ``from_``'s ``request`` (``("result", flow_id, timeout)``, ``("call_rpc",
    flow_id, name, args, timeout)`` or ``("cancel", flow_id)``; :func:`marked` when it was
    forwarded here) for the running flow ``flow_id``, which server ``owner`` holds (None: it
    moved while this engine looked it up; the store says where), or deliver the notice
    ``request`` (one of :data:`NOTICES`; ``from_`` None). Returns at once: a helper process
    linked to the engine delivers the request and answers ``from_`` (see the module
    docstring). A request forwarded here is answered :func:`not_owner` instead."""
    me = state.options.server_id
    if request[0] == FORWARDED:
        assert from_ is not None  # (forwarded requests are calls)
        otp.reply(from_, not_owner(flow_id, me, owner))
        return
    options: ForwardOptions | None = state.options.forward
    if options is None:  # (one server: nowhere to forward to)
        where = "another matching server" if owner is None else f"matching server {owner!r}"
        if from_ is None:
            logger.warning(
                "matching engine: cannot tell %s of %r about flow %r: this server does not"
                " forward (its store is not shared); that server finds it in the store when"
                " it next takes the flow",
                where, request[0], flow_id,
            )  # fmt: skip
            return
        exc = Unavailable(
            f"flow {flow_id!r} is run by {where}, not by this one ({me!r}): call that server,"
            " or retry here (its flows move to this server when it stops)",
            details={"flow_id": flow_id, "owner": owner},
        )
        otp.reply(from_, _err(exc))
        return
    call = _Call(me, from_, request, trio.current_time())
    otp.spawn_link(_forwarder, options, call, flow_id, owner)


@attrs.frozen
class _Call:
    """A forwarded call: this server's id, the caller, its request, when it was forwarded."""

    server_id: str
    #: None for a notice (:data:`NOTICES`): nobody waits for its answer.
    from_: otp.From | None
    request: tuple[Any, ...]
    started: float


async def _forwarder(options: ForwardOptions, call: _Call, flow_id: str, owner: str | None) -> None:
    try:
        answer = await _deliver(options, call, flow_id, owner)
    except Exception as exc:  # (the caller must be answered; the engine must not crash)
        logger.exception("matching engine: forwarding a call for flow %r failed", flow_id)
        answer = _err(
            Unavailable(
                f"the call for flow {flow_id!r} could not be forwarded to its owner:"
                f" {type(exc).__name__}: {exc}; retry it"
            )
        )
    if call.from_ is not None:
        otp.reply(call.from_, answer)
    elif answer != ("ok", None):
        logger.warning(
            "matching engine: the %r notice about flow %r reached no server that holds it"
            " (%s); the flow's next owner finds what it says in the store when it takes the"
            " flow",
            call.request[0], flow_id, answer[2] if len(answer) > 2 else answer,
        )  # fmt: skip


async def _deliver(options: ForwardOptions, call: _Call, flow_id: str, owner: str | None) -> Any:
    """The owner's answer to ``call`` (re-resolving as the module docstring says), or a
    retryable ``unavailable`` once the caller's timeout or ``patience`` is spent."""
    limit = _timeout_of(call.request)
    deadline = call.started + limit if limit is not None else math.inf
    delay = _FIRST_DELAY
    why = ""
    resolved = owner is not None
    first_failure = True
    while True:
        if not resolved:
            owner = lease_owner(
                await StoreServer.pending(flow_id, server=options.store, timeout=DEFAULT_TIMEOUT),
                call.server_id,
                time.time(),
            )
        resolved = False
        target: Any = options.engine  # (free, expired or ours: our engine claims it)
        if owner is not None:
            node = await Cluster.owner_node(owner, server=options.cluster)
            target = None if node is None else (options.engine, node)
        if target is None and otp.current_node().distribution is None:
            # (no server can ever be reached from here: waiting would not help)
            why = (
                f"its owner is server {owner}, and this server is not distributed (start every"
                " server with --name NAME@HOST --listen ADDRESS --cookie-file PATH)"
            )
            return _err(_unavailable(flow_id, owner, why))
        if target is None:
            why = f"its owner, server {owner}, is not reachable"
        else:
            request = _with_timeout(call.request, call.started, limit)
            try:
                reply = await otp.call(target, (FORWARDED, request), _call_timeout(request))
            except otp.CallError as exc:
                server = owner or call.server_id
                if request[0] == "call_rpc":  # (it may have run: RPCs are not run twice)
                    return _err(_rpc_lost(flow_id, request[2], server, exc))
                if isinstance(exc, otp.CallTimeout):
                    why = f"server {server} did not answer in time"
                else:
                    why = f"server {server} went away ({otp.format_reason(exc)})"
            else:
                if not is_not_owner(reply):
                    return reply
                why = reply[2]
        now = trio.current_time()
        if first_failure:
            # (patience counts from the first failure: a result may wait for hours, then its
            # owner go down)
            first_failure = False
            deadline = min(deadline, now + options.patience)
        if now + delay >= deadline:
            return _err(_unavailable(flow_id, owner, why))
        await trio.sleep(delay)
        delay = min(2 * delay, _MAX_DELAY)


def _unavailable(flow_id: str, owner: str | None, why: str) -> MatchingError:
    return Unavailable(
        f"flow {flow_id!r} is owned by another matching server and the call could not reach"
        f" it: {why}; retry it (once the owner's lease expires another server takes the"
        " flow over)",
        details={"flow_id": flow_id, "owner": owner},
    )


def _rpc_lost(flow_id: str, name: str, server: str, exc: otp.CallError) -> MatchingError:
    """The answer to a forwarded RPC whose owner went away (or went silent) with it: as a worker
    lost with an RPC, retryable, since it may or may not have run."""
    return HandlerError(
        f"server {server}, which runs flow {flow_id!r}, went away while it ran RPC {name!r}"
        f" ({otp.format_reason(exc)}); it may or may not have run: retry it if it is idempotent",
        retryable=True,
        details={"type": "lost", "flow_id": flow_id},
    )


def _timeout_of(request: tuple[Any, ...]) -> float | None:
    """The caller's own timeout (``result``'s, ``call_rpc``'s), or None (a notice: nobody
    waits, so it is bounded by the patience alone)."""
    if request[0] in NOTICES:
        return None
    if request[0] in ("result", "call_rpc"):
        timeout = request[-1]
        return None if timeout is None else float(timeout)
    return DEFAULT_TIMEOUT


def _with_timeout(request: tuple[Any, ...], started: float, limit: float | None) -> tuple[Any, ...]:
    """``request`` with the caller's timeout cut to what is left of it."""
    if limit is None or request[0] not in ("result", "call_rpc"):
        return request
    left = max(limit - (trio.current_time() - started), 0.001)
    return (*request[:-1], left)


def _call_timeout(request: tuple[Any, ...]) -> float | None:
    if request[0] in ("result", "call_rpc"):
        timeout = request[-1]
        return None if timeout is None else timeout + CALL_MARGIN
    return DEFAULT_TIMEOUT
