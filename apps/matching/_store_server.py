"""``StoreServer``: the GenServer that owns the matching server's one ``Store`` and
group-commits the batches written through it, as a database's WAL writer does (the seed's "one
writer"); reads and lease calls run on the same connection between transactions.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

import otp

from ._store_group import (
    ERRORS,
    Committed,
    Crashed,
    Group,
    Notify,
    StoreHandle,
    To,
    answer,
    count,
    error_reply,
    flush,
    handle_of,
    register,
)
from ._store_records import (
    DEFAULT_TIMEOUT,
    SERVER_NAME,
    AttemptRecord,
    BatchCommitted,
    Claim,
    DispatchRecord,
    FlowRecord,
    PendingStep,
    StoreError,
    StoreServerStatistics,
    WriteBatch,
    check_batch,
)
from ._store_servers import ServerRecord

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["StoreServer"]

logger = logging.getLogger("apps.matching")


def _unwrap(reply: Any) -> Any:
    if reply[0] == "ok":
        return reply[1]
    _, tag, message, details = reply
    raise ERRORS[tag](message, details=details)


@attrs.frozen
class _Read:
    from_: otp.From
    fn: Callable[[], Awaitable[Any]]


@attrs.frozen
class _PendingChanged:
    generation: int


@attrs.define
class _State:
    store: Store
    me: otp.Pid
    jobs: trio.MemorySendChannel[_Read | Group]
    worker: otp.Pid
    watcher: otp.Pid
    queued: list[tuple[WriteBatch, To]] = attrs.field(factory=list)
    in_flight: int = 0
    groups: int = 0
    batches: int = 0
    largest_group: int = 0
    generation: int = 0
    waiters: list[tuple[otp.From, int]] = attrs.field(factory=list)
    #: ``NoReply(self)``, built once (a frozen value: every callback that carries on returns it).
    carry_on: Any = None
    #: Set once it stops, or a bug handed over crashes it: nothing more is handed over.
    stopped: bool = False
    #: Its ``StoreHandle`` (which this keeps alive: the run's registry holds it weakly).
    handle: StoreHandle | None = None


#: The operations the server runs on its store for a call, in the order they arrive.
_OPS: dict[str, Callable[[Store], Callable[..., Awaitable[Any]]]] = {
    "get_flow": lambda store: store.get_flow,
    "list_flows": lambda store: store.list_flows,
    "attempts": lambda store: store.attempts,
    "dispatches": lambda store: store.dispatches,
    "pending": lambda store: store.pending,
    "claim_pending": lambda store: store.claim_pending,
    "claim_steps": lambda store: store.claim_steps,
    "claim_flow": lambda store: store.claim_flow,
    "adopt_leases": lambda store: store.adopt_leases,
    "renew_leases": lambda store: store.renew_leases,
    "release_leases": lambda store: store.release_leases,
    # (the servers table's, ``_store_servers``)
    "register_server": lambda store: store.register_server,
    "beat": lambda store: store.beat,
    "servers": lambda store: store.servers,
    "remove_server": lambda store: store.remove_server,
    "forget_servers": lambda store: store.forget_servers,
}


class StoreServer(otp.GenServer):
    """Owns one :class:`Store`; registered as ``matching_store`` by the application.

    Writes are group-committed: while one transaction runs (in a worker thread, started by the
    server itself when the connection is free, else by a process the server links to, behind
    the reads it runs; on SQLite, a group of up to ``INLINE_RECORDS`` records on trio's thread,
    by the server itself or, for ``commit_nowait``, in its sender's task), batches sent
    meanwhile queue up and all go into the next transaction, each batch atomic on its own;
    each caller is answered once its batch is durable (or refused). Reads, claims and lease
    changes run on the same connection in the order they arrive, between transactions, so the
    server's mailbox is read all the while.

    Start it with ``StoreServer.start_link(store, name=SERVER_NAME)``; ``init`` opens the store
    (a schema newer than the code fails the start) and ``terminate`` closes it. It traps exits:
    if its worker or wake-up process dies, the server stops with that reason, and callers
    waiting for it get a ``CallError`` (a batch then in flight may or may not have committed);
    a transaction that raises what is not a :class:`StoreError` crashes it the same way.
    """

    # ======================================== client side ====================================

    @staticmethod
    async def commit(
        batch: WriteBatch, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> None:
        """Commit ``batch``; returns once it is durable.

        Raises:
            StoreConflict, FlowExists, StoreError: as :meth:`Store.commit`; the batch left no
                trace.
            otp.CallTimeout, otp.CallError: no answer in time, or the server died; the batch may
                or may not have committed (read back to know). Cancellation leaves the same.
        """
        check_batch(batch)
        _unwrap(await otp.call(server, ("commit", batch), timeout))

    @staticmethod
    def commit_nowait(
        batch: WriteBatch, reply_to: otp.Pid, tag: Any, *, server: Any = SERVER_NAME
    ) -> None:
        """Hand ``batch`` to the server and return at once (not a checkpoint): it is
        group-committed as :meth:`commit`'s are, and ``reply_to`` gets
        ``BatchCommitted(tag, None)`` once it is durable, or ``BatchCommitted(tag, error)`` if
        it was refused (a batch of the wrong records too: a :class:`StoreError` naming the
        field). Nothing is sent if the server dies first: monitor it. Batches handed over by one
        process are committed in the order handed over. An idle server (on SQLite) may commit it
        in the caller's own task, its answer sent before this returns (``StoreHandle``,
        ``_store_group``): no wake-up of the server's task, nor of the caller's.
        """
        handle = handle_of(server)
        if handle is None or not handle.commit(batch, reply_to, tag):
            otp.GenServer.cast(server, ("commit", batch, reply_to, tag))

    @staticmethod
    async def create_flow(
        record: FlowRecord, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> None:
        """Insert a new flow (group-committed). Raises :class:`FlowExists` as
        :meth:`Store.create_flow`, and as :meth:`commit` otherwise."""
        await StoreServer.commit(WriteBatch(flows_created=[record]), server=server, timeout=timeout)

    @staticmethod
    async def get_flow(
        flow_id: str, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> FlowRecord | None:
        """As :meth:`Store.get_flow`, through the server."""
        return _unwrap(await otp.call(server, ("get_flow", (flow_id,), {}), timeout))

    @staticmethod
    async def list_flows(
        *,
        flow_type: str | None = None,
        status: str | None = None,
        limit: int = 100,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[FlowRecord]:
        """As :meth:`Store.list_flows`, through the server."""
        request: tuple[Any, ...] = (
            "list_flows",
            (),
            {"flow_type": flow_type, "status": status, "limit": limit},
        )
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def attempts(
        flow_id: str, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> list[AttemptRecord]:
        """As :meth:`Store.attempts`, through the server."""
        return _unwrap(await otp.call(server, ("attempts", (flow_id,), {}), timeout))

    @staticmethod
    async def dispatches(
        flow_id: str,
        limit: int = 200,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[DispatchRecord]:
        """As :meth:`Store.dispatches`, through the server."""
        return _unwrap(await otp.call(server, ("dispatches", (flow_id, limit), {}), timeout))

    @staticmethod
    async def pending(
        flow_id: str, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> list[PendingStep]:
        """As :meth:`Store.pending`, through the server."""
        return _unwrap(await otp.call(server, ("pending", (flow_id,), {}), timeout))

    @staticmethod
    async def claim_pending(
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[PendingStep]:
        """As :meth:`Store.claim_pending`, through the server (after the commits before it).
        A claim whose caller gave up may have leased steps: they come back when the lease
        expires, or at once with ``release_leases(owner)``."""
        request: tuple[Any, ...] = ("claim_pending", (owner, now, lease_seconds, limit), {})
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def claim_steps(
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[Claim]:
        """As :meth:`Store.claim_steps`, through the server (as :meth:`claim_pending`)."""
        request: tuple[Any, ...] = ("claim_steps", (owner, now, lease_seconds, limit), {})
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def claim_flow(
        flow_id: str,
        owner: str,
        now: float,
        lease_seconds: float,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> Claim | None:
        """As :meth:`Store.claim_flow`, through the server."""
        request: tuple[Any, ...] = ("claim_flow", (flow_id, owner, now, lease_seconds), {})
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def adopt_leases(
        owner: str,
        now: float,
        lease_seconds: float,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[Claim]:
        """As :meth:`Store.adopt_leases`, through the server."""
        request: tuple[Any, ...] = ("adopt_leases", (owner, now, lease_seconds), {})
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def renew_leases(
        owner: str,
        now: float,
        lease_seconds: float,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> int:
        """As :meth:`Store.renew_leases`, through the server."""
        request: tuple[Any, ...] = ("renew_leases", (owner, now, lease_seconds), {})
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def release_leases(
        owner: str, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> int:
        """As :meth:`Store.release_leases`, through the server."""
        return _unwrap(await otp.call(server, ("release_leases", (owner,), {}), timeout))

    # -- the servers sharing the database (``_store_servers``, for ``_cluster``) -------------

    @staticmethod
    async def register_server(
        record: ServerRecord, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> None:
        """As :meth:`Store.register_server`, through the server."""
        _unwrap(await otp.call(server, ("register_server", (record,), {}), timeout))

    @staticmethod
    async def beat(
        server_id: str,
        now: float,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> bool:
        """As :meth:`Store.beat`, through the server."""
        return _unwrap(await otp.call(server, ("beat", (server_id, now), {}), timeout))

    @staticmethod
    async def servers(
        now: float,
        timeout_seconds: float,
        *,
        server: Any = SERVER_NAME,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> list[ServerRecord]:
        """As :meth:`Store.servers` (``timeout_seconds`` is its ``timeout``), through the
        server."""
        request: tuple[Any, ...] = ("servers", (now, timeout_seconds), {})
        return _unwrap(await otp.call(server, request, timeout))

    @staticmethod
    async def remove_server(
        server_id: str, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> bool:
        """As :meth:`Store.remove_server`, through the server."""
        return _unwrap(await otp.call(server, ("remove_server", (server_id,), {}), timeout))

    @staticmethod
    async def forget_servers(
        before: float, *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> int:
        """As :meth:`Store.forget_servers`, through the server."""
        return _unwrap(await otp.call(server, ("forget_servers", (before,), {}), timeout))

    @staticmethod
    async def wait_pending(
        seen: int, *, server: Any = SERVER_NAME, timeout: float | None = None
    ) -> int:
        """As :meth:`Store.wait_pending`, through the server: returns the pending-change
        generation once it exceeds ``seen``. Waits forever by default (``timeout=None``); a
        timeout raises ``otp.CallTimeout``."""
        return await otp.call(server, ("wait_pending", seen), timeout)

    @staticmethod
    async def statistics(
        *, server: Any = SERVER_NAME, timeout: float | None = DEFAULT_TIMEOUT
    ) -> StoreServerStatistics:
        """The server's group-commit counters and its store's."""
        return await otp.call(server, ("statistics",), timeout)

    # ======================================== callbacks ======================================

    async def init(self, store: Store) -> otp.Ok:
        await store.open()
        otp.process_flag(trap_exit=True)
        send, receive = trio.open_memory_channel[_Read | Group](math.inf)
        me = otp.self()
        worker = otp.spawn_link(_worker, store, receive, me)
        watcher = otp.spawn_link(_watcher, store, me)
        state = _State(store=store, me=me, jobs=send, worker=worker, watcher=watcher)
        state.carry_on = otp.NoReply(state)
        state.handle = register(state)
        return otp.Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case ("commit", WriteBatch() as batch):
                try:
                    check_batch(batch)  # a bad batch must not crash the worker
                except TypeError as exc:
                    return otp.Reply(("error", "error", str(exc), {}), state)
                state.queued.append((batch, from_))
                if not state.in_flight:
                    flush(state)
                return state.carry_on
            case (str(op), tuple(args), dict(kwargs)) if op in _OPS:
                fn = functools.partial(_OPS[op](state.store), *args, **kwargs)
                state.jobs.send_nowait(_Read(from_, fn))
                return state.carry_on
            case ("wait_pending", int(seen)):
                if state.generation > seen:
                    return otp.Reply(state.generation, state)
                state.waiters.append((from_, seen))
                return state.carry_on
            case ("statistics",):
                stats = StoreServerStatistics(
                    groups=state.groups,
                    batches=state.batches,
                    largest_group=state.largest_group,
                    queued=len(state.queued),
                    in_flight=state.in_flight,
                    store=state.store.statistics(),
                )
                return otp.Reply(stats, state)
        message = f"StoreServer: unknown request {request!r}"
        return otp.Reply(("error", "error", message, {}), state)

    def handle_cast(self, request: Any, state: _State) -> Any:
        match request:
            case ("commit", batch, otp.Pid() as reply_to, tag):
                try:
                    check_batch(batch)  # a bad batch must not crash the worker
                except TypeError as exc:
                    otp.send(reply_to, BatchCommitted(tag, StoreError(str(exc))))
                    return state.carry_on
                state.queued.append((batch, Notify(reply_to, tag)))
                if not state.in_flight:
                    flush(state)
            case _:
                logger.warning("StoreServer: unknown cast %r", request)
        return state.carry_on

    def handle_info(self, message: Any, state: _State) -> Any:
        match message:
            case Committed(size=size):
                count(state, size)
                if state.queued:
                    flush(state)
            case _PendingChanged(generation=generation):
                state.generation = max(state.generation, generation)
                still = []
                for from_, seen in state.waiters:
                    if state.generation > seen:
                        otp.reply(from_, state.generation)
                    else:
                        still.append((from_, seen))
                state.waiters = still
            case otp.Exit(pid=pid, reason=reason) if pid in (state.worker, state.watcher):
                return otp.Stop(reason, state)
            case Crashed(error=error):
                raise error
        return state.carry_on

    async def terminate(self, reason: Any, state: _State) -> None:
        state.stopped = True
        state.jobs.close()
        otp.exit(state.watcher, otp.KILL)
        otp.exit(state.worker, otp.KILL)
        await state.store.close()  # waits for a transaction still running in its thread


async def _worker(
    store: Store, jobs: trio.MemoryReceiveChannel[_Read | Group], server: otp.Pid
) -> None:
    """Runs the server's store operations one at a time and answers their callers."""
    async for job in jobs:
        if isinstance(job, Group):
            try:
                outcomes = await store.commit_many([batch for batch, _ in job.entries])
            except StoreError as exc:
                outcomes = [exc] * len(job.entries)
            answer(job.entries, outcomes)
            otp.send(server, Committed(len(job.entries)))
        else:
            try:
                value = await job.fn()
            except StoreError as exc:
                otp.reply(job.from_, error_reply(exc))
            else:
                otp.reply(job.from_, ("ok", value))


async def _watcher(store: Store, server: otp.Pid) -> None:
    """Forwards the store's pending-change wake-ups to the server."""
    generation = 0
    while True:
        generation = await store.wait_pending(generation)
        otp.send(server, _PendingChanged(generation))
