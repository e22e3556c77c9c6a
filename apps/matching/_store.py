"""The matching server's durable store: its records, the ``Store`` interface, and ``StoreServer``.

``Store`` is the one interface the engine writes through (SQLite here, PostgreSQL later: claims
are row leases, so ``claim_pending`` maps to ``FOR UPDATE SKIP LOCKED`` and ``wait_pending`` to
``LISTEN/NOTIFY``). ``StoreServer`` is the GenServer that owns one store and group-commits the
batches written through it, as a database's WAL writer does (the seed's "one writer").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

import otp

from . import _errors as errors
from ._errors import MatchingError

__all__ = [
    "FLOW_STATUSES",
    "ATTEMPT_STATUSES",
    "DISPATCH_KINDS",
    "SERVER_NAME",
    "AttemptRecord",
    "DispatchRecord",
    "FlowExists",
    "FlowRecord",
    "PendingStep",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreServer",
    "StoreServerStatistics",
    "StoreStatistics",
    "WriteBatch",
    "check_batch",
]

FLOW_STATUSES = ("running", "completed", "failed", "cancelled")
ATTEMPT_STATUSES = ("completed", "failed", "not_dispatched", "lost")
DISPATCH_KINDS = ("step", "rpc")
#: The name ``StoreServer`` registers by default.
SERVER_NAME = "matching_store"
#: The default timeout of the ``StoreServer`` client functions (seconds).
DEFAULT_TIMEOUT = 30.0


# -- errors ---------------------------------------------------------------------------------------


class StoreError(MatchingError):
    """The store refused or failed an operation (the message says which and why)."""

    def __str__(self) -> str:  # KeyError's own __str__ (FlowExists) would quote the message
        return self.message


class FlowExists(StoreError, errors.FlowExists, KeyError):
    """A flow with that ``flow_id`` is stored already (``details["flow_id"]``): the package's
    :class:`~apps.matching.FlowExists`, raised by the store."""

    code = "flow_exists"


class StoreConflict(StoreError):
    """An update expected another stored version (optimistic concurrency): read the flow again.

    ``details`` holds ``flow_id``, ``expected`` (``record.version - 1``) and ``stored``.
    """

    code = "conflict"
    retryable_default = True


# -- validation -----------------------------------------------------------------------------------


def _where(inst: Any, attribute: attrs.Attribute[Any]) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def _text(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{_where(inst, attribute)} must be a non-empty str (got {value!r})")


def _text_or_none(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _text(inst, attribute, value)


def _count(minimum: int) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                f"{_where(inst, attribute)} must be an int >= {minimum} (got {value!r})"
            )

    return check


def _int(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_where(inst, attribute)} must be an int (got {value!r})")


def _time(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(
            f"{_where(inst, attribute)} must be a finite number of seconds (got {value!r})"
        )


def _time_or_none(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _time(inst, attribute, value)


def _one_of(choices: tuple[str, ...]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices or not isinstance(value, str):
            names = ", ".join(f'"{c}"' for c in choices)
            raise ValueError(f"{_where(inst, attribute)} must be one of {names} (got {value!r})")

    return check


def _error(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("type"), str)
        or not isinstance(value.get("message"), str)
    ):
        raise TypeError(
            f'{_where(inst, attribute)} must be None or a dict with str "type" and "message"'
            f" (got {value!r})"
        )


# -- records --------------------------------------------------------------------------------------


@attrs.frozen
class FlowRecord:
    """One flow instance as stored.

    ``step_index`` is the next step to run (0-based) and ``step_input`` the argument list it
    gets; ``version`` grows by one with each update (optimistic concurrency, see
    :class:`WriteBatch`). Times are wall-clock unix seconds.
    """

    flow_id: str = attrs.field(validator=_text)
    flow_type: str = attrs.field(validator=_text)
    status: str = attrs.field(validator=_one_of(FLOW_STATUSES))
    args: tuple[Any, ...] | list[Any] = attrs.field(
        validator=attrs.validators.instance_of((tuple, list))
    )
    state: dict[str, Any] = attrs.field(validator=attrs.validators.instance_of(dict))
    step_index: int = attrs.field(validator=_count(0))
    step_input: Any
    result: Any
    error: dict[str, Any] | None = attrs.field(validator=_error)
    sticky_worker: str | None = attrs.field(validator=_text_or_none)
    created_at: float = attrs.field(validator=_time)
    updated_at: float = attrs.field(validator=_time)
    version: int = attrs.field(validator=_count(1))
    #: The flow type's definition the flow was started with (the engine pins it: steps with
    #: their retry policies and timeouts, RPC names), so it runs to its end with that one.
    definition: dict[str, Any] = attrs.field(
        factory=dict, validator=attrs.validators.instance_of(dict)
    )


@attrs.frozen
class AttemptRecord:
    """One finished attempt of a step (appended; read back in the order written)."""

    flow_id: str = attrs.field(validator=_text)
    step_index: int = attrs.field(validator=_count(0))
    step: str = attrs.field(validator=_text)
    execution_id: str = attrs.field(validator=_text)
    attempt: int = attrs.field(validator=_count(1))
    delivery: int = attrs.field(validator=_int)
    worker_id: str | None = attrs.field(validator=_text_or_none)
    status: str = attrs.field(validator=_one_of(ATTEMPT_STATUSES))
    error: dict[str, Any] | None = attrs.field(validator=_error)
    started_at: float = attrs.field(validator=_time)
    finished_at: float = attrs.field(validator=_time)


@attrs.frozen
class DispatchRecord:
    """One routing decision (``Routed``) for a flow's step or RPC (appended)."""

    flow_id: str = attrs.field(validator=_text)
    delivery: int = attrs.field(validator=_int)
    kind: str = attrs.field(validator=_one_of(DISPATCH_KINDS))
    name: str = attrs.field(validator=_text)
    attempt: int = attrs.field(validator=_count(1))
    queue: str = attrs.field(validator=_text)
    reason: str = attrs.field(validator=_text)
    worker_id: str | None = attrs.field(validator=_text_or_none)
    at: float = attrs.field(validator=_time)


@attrs.frozen
class PendingStep:
    """A step waiting to be dispatched, or running: the at-least-once record, kept until the
    step's outcome is committed (``WriteBatch.pending_done``).

    ``(flow_id, step_index)`` is its key. A claim leases it to ``lease_owner`` until
    ``lease_expires`` (both None while it is free); ``not_before`` delays it (retry backoff).

    Raises:
        ValueError: ``lease_owner`` and ``lease_expires`` are not both None or both set.
    """

    flow_id: str = attrs.field(validator=_text)
    step_index: int = attrs.field(validator=_count(0))
    step: str = attrs.field(validator=_text)
    execution_id: str = attrs.field(validator=_text)
    attempt: int = attrs.field(validator=_count(1))
    lease_owner: str | None = attrs.field(default=None, validator=_text_or_none)
    lease_expires: float | None = attrs.field(default=None, validator=_time_or_none)
    not_before: float = attrs.field(default=0.0, validator=_time)

    def __attrs_post_init__(self) -> None:
        if (self.lease_owner is None) != (self.lease_expires is None):
            raise ValueError(
                "PendingStep.lease_owner and PendingStep.lease_expires must both be None (free)"
                f" or both be set (leased) (got {self.lease_owner!r} and {self.lease_expires!r})"
            )

    @property
    def key(self) -> tuple[str, int]:
        """``(flow_id, step_index)``."""
        return (self.flow_id, self.step_index)


@attrs.define
class WriteBatch:
    """Writes committed together, atomically: all of them or none.

    Applied in this order: ``flows_created`` (insert only: :class:`FlowExists` if the id is
    stored), ``flows_upserted`` (insert when the id is new, whatever its version; else an update
    that needs the stored version to be ``record.version - 1``, or :class:`StoreConflict`; the
    record replaces the stored one), ``attempts`` and ``dispatches`` (appended),
    ``pending_put`` (insert or replace by key, lease fields included), then ``pending_done``
    (deleted by ``(flow_id, step_index)``; a missing key is no error). Attempts, dispatches and
    pending steps must name a flow stored once the batch's flows are applied (else
    :class:`StoreError`).
    """

    flows_upserted: list[FlowRecord] = attrs.field(factory=list)
    attempts: list[AttemptRecord] = attrs.field(factory=list)
    dispatches: list[DispatchRecord] = attrs.field(factory=list)
    pending_put: list[PendingStep] = attrs.field(factory=list)
    pending_done: list[tuple[str, int]] = attrs.field(factory=list)
    flows_created: list[FlowRecord] = attrs.field(factory=list)

    def __len__(self) -> int:
        return (
            len(self.flows_upserted)
            + len(self.attempts)
            + len(self.dispatches)
            + len(self.pending_put)
            + len(self.pending_done)
            + len(self.flows_created)
        )


def check_batch(batch: Any) -> None:
    """Refuse anything but a :class:`WriteBatch` of the right records, before any I/O.

    Raises:
        TypeError: naming the field and the item that is wrong.
    """
    if not isinstance(batch, WriteBatch):
        raise TypeError(f"a WriteBatch is needed (got {batch!r})")
    fields: tuple[tuple[str, Any, type], ...] = (
        ("flows_created", batch.flows_created, FlowRecord),
        ("flows_upserted", batch.flows_upserted, FlowRecord),
        ("attempts", batch.attempts, AttemptRecord),
        ("dispatches", batch.dispatches, DispatchRecord),
        ("pending_put", batch.pending_put, PendingStep),
    )
    for field, items, cls in fields:
        if not isinstance(items, list) or not all(isinstance(i, cls) for i in items):
            raise TypeError(f"WriteBatch.{field} must be a list of {cls.__name__} (got {items!r})")
    done = batch.pending_done
    if not isinstance(done, list) or not all(
        isinstance(k, tuple)
        and len(k) == 2
        and isinstance(k[0], str)
        and isinstance(k[1], int)
        and not isinstance(k[1], bool)
        for k in done
    ):
        raise TypeError(
            f"WriteBatch.pending_done must be a list of (flow_id: str, step_index: int) tuples"
            f" (got {done!r})"
        )


@attrs.frozen
class StoreStatistics:
    """Counters of one open ``Store`` (``statistics()``).

    Attributes:
        transactions: Write transactions run (each ``commit_many`` is one, committed or not).
        batches: Batches committed.
        refused: Batches refused (conflict, duplicate flow, bad reference or value) or lost with
            a failed transaction.
        claimed: Pending steps handed out by ``claim_pending``.
    """

    transactions: int
    batches: int
    refused: int
    claimed: int


@attrs.frozen
class StoreServerStatistics:
    """Counters of a ``StoreServer`` (``StoreServer.statistics``).

    Attributes:
        groups: Group commits run (one transaction each).
        batches: Batches answered through group commits (committed or refused).
        largest_group: The most batches one transaction carried.
        queued: Batches waiting for the next group now.
        in_flight: Batches in the transaction running now.
        store: The store's own counters.
    """

    groups: int
    batches: int
    largest_group: int
    queued: int
    in_flight: int
    store: StoreStatistics


# -- the interface --------------------------------------------------------------------------------


class Store(Protocol):
    """The durable store of the matching server.

    Every async method is a trio checkpoint. Cancellation never leaves a transaction half
    done: a cancelled call either took effect completely or not at all, and a write whose caller
    was cancelled while it ran may have committed (read back to know). Methods called before
    ``open`` or after ``close`` raise :class:`StoreError`. Failures of the database itself are
    :class:`StoreError` with the cause chained.

    Implementations keep to what PostgreSQL can do as well as SQLite: times are passed in by
    the caller (wall-clock unix seconds), claims lease rows (``FOR UPDATE SKIP LOCKED``), and
    ``wait_pending`` is a wake-up (``LISTEN/NOTIFY``), never a guarantee of work.
    """

    async def open(self) -> None:
        """Connect, then create or migrate the schema (a versioned ``schema_migrations`` table).

        Raises:
            StoreError: the database's schema is newer than this code (nothing is changed), or
                the database cannot be opened.
        """
        ...

    async def close(self) -> None:
        """Wait for the running operation, then disconnect. Closing twice is a no-op."""
        ...

    async def create_flow(self, record: FlowRecord) -> None:
        """Insert a new flow (one transaction).

        Raises:
            FlowExists: a flow with ``record.flow_id`` is stored.
        """
        ...

    async def get_flow(self, flow_id: str) -> FlowRecord | None:
        """The stored flow, or None."""
        ...

    async def list_flows(
        self, *, flow_type: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[FlowRecord]:
        """Up to ``limit`` flows, newest ``created_at`` first (ties: the later insert first),
        filtered by ``flow_type`` and ``status`` when given."""
        ...

    async def attempts(self, flow_id: str) -> list[AttemptRecord]:
        """The flow's attempts, in the order they were written."""
        ...

    async def dispatches(self, flow_id: str, limit: int = 200) -> list[DispatchRecord]:
        """The flow's last ``limit`` dispatch records, oldest of them first."""
        ...

    async def pending(self, flow_id: str) -> list[PendingStep]:
        """The flow's pending steps, by ``step_index``."""
        ...

    async def commit(self, batch: WriteBatch) -> None:
        """Apply ``batch`` in one transaction.

        Raises:
            StoreConflict: an update's version does not follow the stored one.
            FlowExists: a ``flows_created`` id is stored.
            StoreError: a reference or a value was refused, or the transaction failed.
        """
        ...

    async def commit_many(self, batches: Sequence[WriteBatch]) -> list[StoreError | None]:
        """Apply ``batches`` in order in one transaction, each atomically on its own (a
        savepoint): a refused batch is rolled back alone and its error put in its slot of the
        result (None for a committed batch); later batches see the earlier ones' writes.

        Raises:
            StoreError: the transaction itself failed; no batch was committed.
        """
        ...

    async def claim_pending(
        self, owner: str, now: float, lease_seconds: float, limit: int
    ) -> list[PendingStep]:
        """Lease up to ``limit`` pending steps to ``owner`` until ``now + lease_seconds``: those
        free or with an expired lease (``lease_expires <= now``) and ``not_before <= now``,
        earliest ``not_before`` first (then by key). Returns them as leased. Two claimers never
        get the same step while its lease runs."""
        ...

    async def renew_leases(self, owner: str, now: float, lease_seconds: float) -> int:
        """Extend every lease ``owner`` holds to ``now + lease_seconds``; returns how many. A
        lease that expired and was claimed by another owner is not ``owner``'s any more."""
        ...

    async def release_leases(self, owner: str) -> int:
        """Free every lease ``owner`` holds (say, on a clean shutdown); returns how many."""
        ...

    async def wait_pending(self, seen: int) -> int:
        """Wait until the pending-change generation exceeds ``seen``; return it.

        The generation grows when a commit puts pending steps or leases are released (by this
        server, and on PostgreSQL by any other through ``LISTEN/NOTIFY``); it starts at 0 on
        each ``open``. Claim, and wait with the generation read before the claim, and no
        wake-up is lost. Expired leases and ``not_before`` passing wake nobody: poll for them.
        """
        ...

    def statistics(self) -> StoreStatistics:
        """The store's counters since ``open``."""
        ...


# -- the server -----------------------------------------------------------------------------------

_ERRORS: dict[str, type[StoreError]] = {
    "exists": FlowExists,
    "conflict": StoreConflict,
    "error": StoreError,
}
_TAGS = {cls: tag for tag, cls in _ERRORS.items()}


def _error_reply(exc: StoreError) -> tuple[str, str, str, dict[str, Any]]:
    return ("error", _TAGS.get(type(exc), "error"), exc.message, exc.details)


def _unwrap(reply: Any) -> Any:
    if reply[0] == "ok":
        return reply[1]
    _, tag, message, details = reply
    raise _ERRORS[tag](message, details=details)


@attrs.frozen
class _Read:
    from_: otp.From
    fn: Callable[[], Awaitable[Any]]


@attrs.frozen
class _Group:
    entries: list[tuple[WriteBatch, otp.From]]


@attrs.frozen
class _Committed:
    size: int


@attrs.frozen
class _PendingChanged:
    generation: int


@attrs.define
class _State:
    store: Store
    jobs: trio.MemorySendChannel[_Read | _Group]
    worker: otp.Pid
    watcher: otp.Pid
    queued: list[tuple[WriteBatch, otp.From]] = attrs.field(factory=list)
    in_flight: int = 0
    groups: int = 0
    batches: int = 0
    largest_group: int = 0
    generation: int = 0
    waiters: list[tuple[otp.From, int]] = attrs.field(factory=list)


#: The operations the server runs on its store for a call, in the order they arrive.
_OPS: dict[str, Callable[[Store], Callable[..., Awaitable[Any]]]] = {
    "get_flow": lambda store: store.get_flow,
    "list_flows": lambda store: store.list_flows,
    "attempts": lambda store: store.attempts,
    "dispatches": lambda store: store.dispatches,
    "pending": lambda store: store.pending,
    "claim_pending": lambda store: store.claim_pending,
    "renew_leases": lambda store: store.renew_leases,
    "release_leases": lambda store: store.release_leases,
}


class StoreServer(otp.GenServer):
    """Owns one :class:`Store`; registered as ``matching_store`` by the application.

    Writes are group-committed: while one transaction runs (in a worker thread, driven by a
    process the server links to), batches sent meanwhile queue up and all go into the next
    transaction, each batch atomic on its own; each caller is answered once its batch is
    durable (or refused). Reads, claims and lease changes run on the same connection in the
    order they arrive, between transactions, so the server's mailbox is read all the while.

    Start it with ``StoreServer.start_link(store, name=SERVER_NAME)``; ``init`` opens the store
    (a schema newer than the code fails the start) and ``terminate`` closes it. It traps exits:
    if its worker or wake-up process dies, the server stops with that reason, and callers
    waiting for it get a ``CallError`` (a batch then in flight may or may not have committed).
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
        send, receive = trio.open_memory_channel[_Read | _Group](math.inf)
        me = otp.self()
        worker = otp.spawn_link(_worker, store, receive, me)
        watcher = otp.spawn_link(_watcher, store, me)
        return otp.Ok(_State(store=store, jobs=send, worker=worker, watcher=watcher))

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> Any:
        match request:
            case ("commit", WriteBatch() as batch):
                try:
                    check_batch(batch)  # a bad batch must not crash the worker
                except TypeError as exc:
                    return otp.Reply(("error", "error", str(exc), {}), state)
                state.queued.append((batch, from_))
                if not state.in_flight:
                    _flush(state)
                return otp.NoReply(state)
            case (str(op), tuple(args), dict(kwargs)) if op in _OPS:
                fn = functools.partial(_OPS[op](state.store), *args, **kwargs)
                state.jobs.send_nowait(_Read(from_, fn))
                return otp.NoReply(state)
            case ("wait_pending", int(seen)):
                if state.generation > seen:
                    return otp.Reply(state.generation, state)
                state.waiters.append((from_, seen))
                return otp.NoReply(state)
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

    def handle_info(self, message: Any, state: _State) -> Any:
        match message:
            case _Committed(size=size):
                state.groups += 1
                state.batches += size
                state.largest_group = max(state.largest_group, size)
                state.in_flight = 0
                if state.queued:
                    _flush(state)
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
        return otp.NoReply(state)

    async def terminate(self, reason: Any, state: _State) -> None:
        state.jobs.close()
        otp.exit(state.watcher, otp.KILL)
        otp.exit(state.worker, otp.KILL)
        await state.store.close()  # waits for a transaction still running in its thread


def _flush(state: _State) -> None:
    """Hand every queued batch to the worker as one group (one transaction)."""
    group, state.queued = state.queued, []
    state.in_flight = len(group)
    state.jobs.send_nowait(_Group(group))


async def _worker(
    store: Store, jobs: trio.MemoryReceiveChannel[_Read | _Group], server: otp.Pid
) -> None:
    """Runs the server's store operations one at a time and answers their callers."""
    async for job in jobs:
        if isinstance(job, _Group):
            try:
                outcomes = await store.commit_many([batch for batch, _ in job.entries])
            except StoreError as exc:
                outcomes = [exc] * len(job.entries)
            for (_, from_), outcome in zip(job.entries, outcomes, strict=True):
                otp.reply(from_, ("ok", None) if outcome is None else _error_reply(outcome))
            otp.send(server, _Committed(len(job.entries)))
        else:
            try:
                value = await job.fn()
            except StoreError as exc:
                otp.reply(job.from_, _error_reply(exc))
            else:
                otp.reply(job.from_, ("ok", value))


async def _watcher(store: Store, server: otp.Pid) -> None:
    """Forwards the store's pending-change wake-ups to the server."""
    generation = 0
    while True:
        generation = await store.wait_pending(generation)
        otp.send(server, _PendingChanged(generation))
