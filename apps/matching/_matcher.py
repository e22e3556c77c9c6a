"""The ``matching_matcher`` GenServer: the queue registry, stream counts and limits, and sticky
routing (the seed's "路由和可用性" and its ``matching.max*`` limits).

It starts queue actors on demand under ``matching_queues`` (a flow type's queue even before any
worker registers it, so a dispatch waits there for its dispatch wait), counts the streams per
app worker id (monitoring them), refuses registrations past the limits or for an app worker id
another worker process holds, and routes each submitted dispatch: to the sticky worker's queue
while that worker has a stream there and is not draining, else to the flow type's queue. With
other servers connected (node distribution), a dispatch whose streams are all on another server
goes to that server's matcher (``_matcher_remote``). The queues it would send a fresh dispatch
to at once it publishes as direct routes (``_matcher_routes``): the engine sends there without
waking it.

An unused queue (``QueueIdle``) is forgotten and told to stop (``StopIdle``) once nothing can
be on its way to it: no stream of it is counted, no registration is pending, and it has received
every dispatch sent to it. The next dispatch or registration for its name starts a new one.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

import otp
import supervisors

from ._dispatch import (
    Capabilities,
    Dispatch,
    Forwarded,
    MatchingLimits,
    NotDispatched,
    Routed,
    StreamRejection,
    WorkerDraining,
    WorkerFreed,
)
from ._matcher_checks import check_registration as _check_registration
from ._matcher_checks import reject as _reject
from ._matcher_remote import HandOff, RemoteQueues, joined_flow_type
from ._matcher_routes import open_routes, publish_route
from ._queue import Forward, Queue, QueueHandle, QueueIdle, StopIdle, queue_spec
from ._queue_book import QueueStatistics

__all__ = [
    "MATCHER",
    "QUEUES",
    "Matcher",
    "MatcherStatistics",
    "StreamUp",
    "notify_worker",
    "register_stream",
    "start_matcher",
    "statistics",
    "submit",
]

logger = logging.getLogger("apps.matching")

#: The matcher's registered name, and its queues' DynamicSupervisor's.
MATCHER = "matching_matcher"
QUEUES = "matching_queues"


@attrs.frozen
class StreamUp:
    """stream -> matcher: the stream process ``stream`` of ``worker_id`` runs, on queue
    ``queue_pid``, for the connection ``conn`` (sent by ``open_stream``)."""

    stream: otp.Pid
    conn: otp.Pid
    worker_id: str
    queue_pid: otp.Pid


@attrs.frozen
class MatcherStatistics:
    """Streams registered (in all and per app worker id) and every queue's backlog."""

    streams: int
    workers: dict[str, int]
    queues: dict[str, QueueStatistics | None]


@attrs.define(eq=False)
class _Worker:
    session: str
    streams: set[otp.Pid] = attrs.Factory(set)
    #: Its streams per queue name (the queues ``notify_worker`` tells).
    queues: dict[str, int] = attrs.Factory(dict)
    #: Registrations not yet followed by their stream's ``StreamUp``, per connection.
    pending: dict[otp.Pid, int] = attrs.Factory(dict)
    draining: bool = False

    def count(self) -> int:
        return len(self.streams) + sum(self.pending.values())


@attrs.define(eq=False)
class _StreamEntry:
    worker_id: str
    queue: str
    conn: otp.Pid
    ref: otp.Ref


@attrs.define(eq=False)
class _State:
    limits: MatchingLimits
    queues_sup: Any
    queues: dict[str, otp.Pid] = attrs.Factory(dict)
    queue_names: dict[otp.Pid, str] = attrs.Factory(dict)
    #: Each queue's handle, published with its direct route (``QueueHandle``).
    queue_handles: dict[otp.Pid, QueueHandle] = attrs.Factory(dict)
    queue_refs: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)
    #: Dispatches sent to each queue (``QueueIdle.received`` tells whether all arrived).
    queue_sent: dict[otp.Pid, int] = attrs.Factory(dict)
    #: Attached streams per queue name.
    queue_streams: dict[str, int] = attrs.Factory(dict)
    workers: dict[str, _Worker] = attrs.Factory(dict)
    streams: dict[otp.Pid, _StreamEntry] = attrs.Factory(dict)
    stream_refs: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)
    #: Connections with pending registrations, monitored: pid -> (ref, worker ids).
    conns: dict[otp.Pid, tuple[otp.Ref, set[str]]] = attrs.Factory(dict)
    conn_refs: dict[otp.Ref, otp.Pid] = attrs.Factory(dict)
    pending_total: int = 0
    #: This matcher's ``pg`` groups, and other servers' matchers (``_matcher_remote``).
    remote: RemoteQueues = attrs.Factory(lambda: RemoteQueues(otp.self().node))
    #: The direct routes' ``otp.ets`` table (``_matcher_routes``), None when unregistered.
    routes: Any = None
    #: ``NoReply(self)``, built once (a frozen value: every callback that carries on returns it).
    carry_on: Any = None


async def start_matcher(
    limits: MatchingLimits | None = None, queues: Any = QUEUES, name: str | None = MATCHER
) -> otp.Pid:
    """Start the matcher linked to the caller (its supervisor), registered as ``name``;
    ``queues`` is the DynamicSupervisor (pid or name) its queues run under.

    Raises:
        otp.StartError: the name is taken.
    """
    return await Matcher.start_link(limits or MatchingLimits(), queues, name, name=name)


async def register_stream(
    session: str,
    worker_id: str,
    queue: str,
    name: str,
    caps: Capabilities,
    *,
    matcher: Any = MATCHER,
    timeout: float | None = 5.0,
) -> otp.Pid | StreamRejection:
    """Register a stream of ``worker_id`` (a worker process's ``session``) on the queue
    ``queue`` (``"flow"`` or ``"worker"``) named ``name``. Call it from the connection process,
    then ``open_stream(..., queue_pid)`` at once: until the stream runs, the registration is
    counted for this connection (and dropped if the connection dies).

    Returns the queue's pid, or a :class:`StreamRejection`: ``bad_frame`` (a malformed
    registration), ``limit`` (a ``matching.*`` limit, named in the message) or
    ``already_registered`` (another session holds ``worker_id``; permanent).

    Raises:
        otp.CallError: the matcher is not alive.
    """
    request = ("register", session, worker_id, queue, name, caps)
    return await otp.call(matcher, request, timeout)


def submit(dispatch: Dispatch, *, matcher: Any = MATCHER) -> None:
    """Route ``dispatch`` (a cast; never blocks). ``dispatch.reply_to`` gets ``Routed`` for
    each routing decision and, in the end, ``Completed``, ``Failed``, ``NotDispatched`` or
    ``Lost``."""
    otp.cast(matcher, dispatch)


def notify_worker(message: WorkerFreed | WorkerDraining, *, matcher: Any = MATCHER) -> None:
    """Tell every queue holding streams of the worker (a cast). ``WorkerDraining`` also ends
    sticky routing to it."""
    otp.cast(matcher, message)


async def statistics(*, matcher: Any = MATCHER) -> MatcherStatistics:
    """Streams, and each queue's streams and backlog (None for a queue that just went away).

    Raises:
        otp.CallError: the matcher is not alive.
    """
    streams, workers, queues = await otp.call(matcher, "statistics")
    found: dict[str, QueueStatistics | None] = {}
    for queue_name, pid in sorted(queues.items()):
        try:
            found[queue_name] = await Queue.statistics(pid)
        except otp.CallError:
            found[queue_name] = None
    return MatcherStatistics(streams, workers, found)


_QUEUE_COUNTS = ("streams", "idle", "offered", "busy", "waiting", "workers", "declines")


def queue_rows(stats: MatcherStatistics) -> list[dict[str, Any]]:
    """One dict of plain values per queue (the ``queues`` op's rows): ``name``, ``kind`` and
    the counts of :class:`QueueStatistics`; a queue that stopped while asked is left out."""
    rows = []
    for queue, found in stats.queues.items():
        if found is None:
            continue
        kind, _, name = queue.partition(":")
        row: dict[str, Any] = {"name": name, "kind": kind}
        row.update({key: getattr(found, key) for key in _QUEUE_COUNTS})
        rows.append(row)
    return rows


class Matcher(otp.GenServer):
    """The matcher. Client functions are the module's :func:`register_stream`,
    :func:`submit`, :func:`notify_worker` and :func:`statistics`."""

    async def init(
        self, limits: MatchingLimits, queues_sup: Any, name: str | None = None
    ) -> otp.Ok:
        # A new matcher knows no queue: the old one's queues (if it crashed) would never be
        # found again, so they go (their streams close and their workers register again).
        try:
            children = await supervisors.which_children(queues_sup)
        except otp.CallError:
            children = []
        for _, pid, _, _ in children:
            if isinstance(pid, otp.Pid):
                await supervisors.terminate_child(queues_sup, pid)
        state = _State(limits, queues_sup)
        state.routes = open_routes(name)
        state.carry_on = otp.NoReply(state)
        # (every join and leave: a flow type's first streams on another server take over the
        # dispatches waiting here for want of any)
        otp.pg.monitor_scope()
        return otp.Ok(state)

    async def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case ("register", str() as session, str() as worker_id, queue, name, caps):
                return otp.Reply(
                    await self._register(state, from_.pid, session, worker_id, queue, name, caps),
                    state,
                )
            case "statistics":
                workers = {w: entry.count() for w, entry in sorted(state.workers.items())}
                stats = (len(state.streams), workers, dict(state.queues))
                return otp.Reply(stats, state)
        return otp.Reply(("error", ("unknown_request", request)), state)

    async def handle_cast(self, message: Any, state: _State) -> otp.NoReply:
        kind = type(message)
        if kind is Dispatch:
            await self._submit(state, message)
        elif kind is Forwarded:
            await self._submit(state, message.dispatch(trio.current_time()))
        elif kind is otp.pg.PgJoin:
            self._joined(state, message)
        elif kind is otp.pg.PgLeave:
            pass
        elif kind is Forward:
            await self._to_flow(state, message.dispatch, message.reason, message.worker_id)
        elif kind is StreamUp:
            self._stream_up(state, message)
        elif kind is QueueIdle:
            self._queue_idle(state, message)
        elif kind is WorkerFreed or kind is WorkerDraining:
            self._notify(state, message)
        else:
            logger.warning("matching matcher: unexpected cast %r", message)
        return state.carry_on

    async def handle_info(self, message: Any, state: _State) -> otp.NoReply:
        if type(message) is otp.Down:
            ref = message.ref
            if ref in state.stream_refs:
                self._stream_down(state, state.stream_refs.pop(ref))
            elif ref in state.queue_refs:
                pid = state.queue_refs.pop(ref)
                queue_name = state.queue_names.pop(pid, None)
                state.queue_handles.pop(pid, None)
                state.queue_sent.pop(pid, None)
                if queue_name is not None and state.queues.get(queue_name) == pid:
                    del state.queues[queue_name]
                    self._publish(state, queue_name)
            elif ref in state.conn_refs:
                self._conn_down(state, state.conn_refs.pop(ref))
            return state.carry_on
        return await self.handle_cast(message, state)

    # -- registration ---------------------------------------------------------------------------

    async def _register(
        self,
        state: _State,
        conn: otp.Pid,
        session: str,
        worker_id: str,
        queue: Any,
        name: Any,
        caps: Any,
    ) -> otp.Pid | StreamRejection:
        limits = state.limits
        rejection = _check_registration(limits, worker_id, queue, name, caps)
        if rejection is not None:
            return rejection
        worker = state.workers.get(worker_id)
        if worker is not None and worker.session != session and worker.count():
            return _reject(
                "already_registered",
                f"app worker id {worker_id!r} is held by another worker process (session"
                f" {worker.session!r}); an app worker id must name one worker process and change"
                " when it restarts: leave it unset so the SDK generates one",
                permanent=True,
            )
        total = len(state.streams) + state.pending_total
        if total >= limits.max_streams:
            return _reject(
                "limit",
                f"the node has {total} streams registered, the most matching.max_streams="
                f"{limits.max_streams} allows; retry later, or raise matching.max_streams",
                permanent=False,
            )
        allowed = limits.max_streams_per_worker + len(caps.flows) + 1
        held = worker.count() if worker is not None and worker.session == session else 0
        if held >= allowed:
            return _reject(
                "limit",
                f"app worker id {worker_id!r} holds {held} streams, the most"
                f" matching.max_streams_per_worker={limits.max_streams_per_worker} allows for a"
                f" worker of {len(caps.flows)} flow types ({allowed} with its idle streams);"
                " lower max_concurrent_tasks or idle_streams_per_queue, or raise"
                " matching.max_streams_per_worker",
                permanent=False,
            )
        queue_name = f"{queue}:{name}"
        pid = state.queues.get(queue_name)
        if pid is None:
            found = await self._queue(state, queue, name)
            if isinstance(found, StreamRejection):
                return found
            pid = found
        if worker is None or worker.session != session:
            worker = _Worker(session)
            state.workers[worker_id] = worker
        worker.pending[conn] = worker.pending.get(conn, 0) + 1
        state.pending_total += 1
        entry = state.conns.get(conn)
        if entry is None:
            ref = otp.monitor(conn)
            state.conns[conn] = (ref, {worker_id})
            state.conn_refs[ref] = conn
        else:
            entry[1].add(worker_id)
        return pid

    async def _queue(self, state: _State, kind: str, name: str) -> otp.Pid | StreamRejection:
        """The queue ``kind:name``, started now if need be."""
        queue_name = f"{kind}:{name}"
        pid = state.queues.get(queue_name)
        if pid is not None:
            return pid
        limits = state.limits
        if kind == "flow":
            flows = sum(1 for q in state.queues if q.startswith("flow:"))
            if flows >= limits.max_flow_types:
                return _reject(
                    "limit",
                    f"the node has {flows} flow-type queues, the most matching.max_flow_types="
                    f"{limits.max_flow_types} allows; flow type {name!r} gets none: raise"
                    " matching.max_flow_types",
                    permanent=True,
                )
        handle = QueueHandle()
        spec = queue_spec(kind, name, limits, otp.self(), handle)
        result = await supervisors.start_child(state.queues_sup, spec)
        if not (isinstance(result, tuple) and result[0] == "ok"):
            logger.error("matching: queue %s could not start: %r", queue_name, result)
            return _reject(
                "internal",
                f"queue {queue_name} could not start ({result!r}); see the server's log",
                permanent=False,
            )
        pid = result[1]
        state.queues[queue_name] = pid
        state.queue_names[pid] = queue_name
        state.queue_handles[pid] = handle
        state.queue_refs[otp.monitor(pid)] = pid
        return pid

    def _queue_idle(self, state: _State, message: QueueIdle) -> None:
        """Stop the unused queue if nothing can still be on its way to it."""
        pid = message.queue
        queue_name = state.queue_names.get(pid)
        if queue_name is None or state.queues.get(queue_name) != pid:
            otp.send(pid, StopIdle())  # forgotten already (it had a late backlog to serve)
            return
        if (
            state.queue_streams.get(queue_name, 0)
            or state.pending_total
            # (it counts the dispatches sent to it straight too: ``_matcher_routes``)
            or state.queue_sent.get(pid, 0) > message.received
        ):
            return  # in use after all: it asks again after another idle timeout
        del state.queues[queue_name]
        logger.debug("matching: queue %s is unused: it stops", queue_name)
        otp.send(pid, StopIdle())

    def _stream_up(self, state: _State, message: StreamUp) -> None:
        stream = message.stream
        if stream in state.streams:
            return
        worker = state.workers.get(message.worker_id)
        if worker is None:
            # A stream nobody registered (tests, or a registration already dropped).
            worker = _Worker("")
            state.workers[message.worker_id] = worker
        pending = worker.pending.get(message.conn, 0)
        if pending:
            state.pending_total -= 1
            if pending == 1:
                del worker.pending[message.conn]
            else:
                worker.pending[message.conn] = pending - 1
        queue_name = state.queue_names.get(message.queue_pid, "?")
        ref = otp.monitor(stream)
        state.streams[stream] = _StreamEntry(message.worker_id, queue_name, message.conn, ref)
        state.stream_refs[ref] = stream
        worker.streams.add(stream)
        worker.queues[queue_name] = worker.queues.get(queue_name, 0) + 1
        count = state.queue_streams[queue_name] = state.queue_streams.get(queue_name, 0) + 1
        if count == 1:
            self._publish(state, queue_name)
        if worker.draining:
            otp.send(message.queue_pid, WorkerDraining(message.worker_id))
        if count == 1 and not (worker.draining and queue_name.startswith("worker:")):
            # (a flow-type queue's group counts every worker's streams; a draining worker's
            # own queue gets no sticky routing from other servers)
            state.remote.has_streams(queue_name)

    def _stream_down(self, state: _State, stream: otp.Pid) -> None:
        entry = state.streams.pop(stream, None)
        if entry is None:
            return
        left = state.queue_streams.get(entry.queue, 1) - 1
        if left > 0:
            state.queue_streams[entry.queue] = left
        else:
            state.queue_streams.pop(entry.queue, None)
            state.remote.no_streams(entry.queue)
            self._publish(state, entry.queue)
            kind, _, name = entry.queue.partition(":")
            pid = state.queues.get(entry.queue)
            if kind == "flow" and pid is not None and state.remote.member(kind, name, 0):
                # What waits here for want of a stream goes to a server with some, as when one
                # joins (``_joined``): the engine may have sent it straight here just before.
                otp.send(pid, HandOff())
        worker = state.workers.get(entry.worker_id)
        if worker is not None:
            if stream in worker.streams:
                worker.streams.discard(stream)
                held = worker.queues.get(entry.queue, 1) - 1
                if held > 0:
                    worker.queues[entry.queue] = held
                else:
                    worker.queues.pop(entry.queue, None)
            if not worker.count():
                del state.workers[entry.worker_id]

    def _conn_down(self, state: _State, conn: otp.Pid) -> None:
        """Registrations the connection never followed with a stream are dropped."""
        _, worker_ids = state.conns.pop(conn, (None, set()))
        for worker_id in worker_ids:
            worker = state.workers.get(worker_id)
            if worker is None:
                continue
            state.pending_total -= worker.pending.pop(conn, 0)
            if not worker.count():
                del state.workers[worker_id]

    def _notify(self, state: _State, message: WorkerFreed | WorkerDraining) -> None:
        worker = state.workers.get(message.worker_id)
        if worker is None:
            return
        if type(message) is WorkerDraining:
            worker.draining = True
            state.remote.no_streams(f"worker:{message.worker_id}")  # no sticky routing here
            self._publish(state, f"worker:{message.worker_id}")
        for queue_name in worker.queues:
            pid = state.queues.get(queue_name)
            if pid is not None:
                otp.send(pid, message)

    # -- routing --------------------------------------------------------------------------------

    def _publish(self, state: _State, queue_name: str) -> None:
        """Publish whether ``queue_name`` is a direct route now: the queue a fresh dispatch
        goes to at once (see ``_submit`` and ``_to_flow``), because it has a stream here (and,
        a worker's queue, its worker is not draining)."""
        pid = state.queues.get(queue_name)
        if pid is not None and not state.queue_streams.get(queue_name):
            pid = None
        if pid is not None and queue_name.startswith("worker:"):
            worker = state.workers.get(queue_name[len("worker:") :])
            if worker is None or worker.draining:
                pid = None
        handle = None if pid is None else state.queue_handles.get(pid)
        publish_route(state.routes, queue_name, pid, handle)

    def _joined(self, state: _State, message: otp.pg.PgJoin) -> None:
        """Another server's matcher has streams for a flow type: what waits here for want of
        any goes there."""
        flow_type = joined_flow_type(message, state.remote.node)
        if flow_type is not None and not state.queue_streams.get(f"flow:{flow_type}"):
            pid = state.queues.get(f"flow:{flow_type}")
            if pid is not None:
                otp.send(pid, HandOff())

    async def _submit(self, state: _State, dispatch: Dispatch) -> None:
        sticky = dispatch.sticky_worker
        if sticky is None:
            await self._to_flow(state, dispatch, "flow_queue", None)
            return
        worker = state.workers.get(sticky)
        queue_name = f"worker:{sticky}"
        pid = state.queues.get(queue_name)
        if (
            worker is not None
            and not worker.draining
            and pid is not None
            and state.queue_streams.get(queue_name, 0) > 0
            and sticky not in dispatch.excluded
        ):
            otp.send(
                dispatch.reply_to, Routed(dispatch.task.delivery, queue_name, "sticky", sticky)
            )
            sent = state.queue_sent
            sent[pid] = sent.get(pid, 0) + 1
            otp.send(pid, dispatch)
            return
        if worker is None and sticky not in dispatch.excluded:
            member = state.remote.member("worker", sticky, dispatch.hops)
            if member is not None and state.remote.forward(dispatch, member, sticky):
                return
        await self._to_flow(state, dispatch, "fallback_no_stream", sticky)

    async def _to_flow(
        self, state: _State, dispatch: Dispatch, reason: str, worker_id: str | None
    ) -> None:
        task = dispatch.task
        limits = state.limits
        if not task.flow_type or len(task.flow_type) > limits.max_flow_type_length:
            otp.send(
                dispatch.reply_to,
                NotDispatched(
                    task.delivery,
                    "unavailable",
                    f"flow type {task.flow_type[:64]!r} is not a name of 1 to"
                    f" matching.max_flow_type_length={limits.max_flow_type_length} characters;"
                    " no worker can register it",
                ),
            )
            return
        queue_name = f"flow:{task.flow_type}"
        if not state.queue_streams.get(queue_name):
            member = state.remote.member("flow", task.flow_type, dispatch.hops)
            if member is not None and state.remote.forward(dispatch, member, worker_id):
                return
        found = await self._queue(state, "flow", task.flow_type)
        if isinstance(found, StreamRejection):
            otp.send(dispatch.reply_to, NotDispatched(task.delivery, "unavailable", found.message))
            return
        otp.send(dispatch.reply_to, Routed(task.delivery, queue_name, reason, worker_id))
        sent = state.queue_sent
        sent[found] = sent.get(found, 0) + 1
        otp.send(found, dispatch)
