"""The matching server's durable store: the ``Store`` interface (re-exporting its records from
``_store_records`` and its server from ``_store_server``).

``Store`` is the one interface the engine writes through (``SqliteStore``, ``PostgresStore``:
claims are row leases, so ``claim_pending`` maps to ``FOR UPDATE SKIP LOCKED`` and
``wait_pending`` to ``LISTEN/NOTIFY``). ``StoreServer`` is the GenServer that owns one store
and group-commits the batches written through it, as a database's WAL writer does (the seed's
"one writer").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import outcome

from ._store_records import (
    ATTEMPT_STATUSES,
    DEFAULT_TIMEOUT,
    DISPATCH_KINDS,
    FLOW_STATUSES,
    SERVER_NAME,
    AttemptRecord,
    BatchCommitted,
    Claim,
    DispatchRecord,
    FlowExists,
    FlowRecord,
    PendingStep,
    StoreConflict,
    StoreError,
    StoreServerStatistics,
    StoreStatistics,
    WriteBatch,
    check_batch,
)
from ._store_server import StoreServer
from ._store_servers import ServerRecord

__all__ = [
    "ATTEMPT_STATUSES",
    "DEFAULT_TIMEOUT",
    "DISPATCH_KINDS",
    "FLOW_STATUSES",
    "SERVER_NAME",
    "AttemptRecord",
    "BatchCommitted",
    "Claim",
    "DispatchRecord",
    "FlowExists",
    "FlowRecord",
    "PendingStep",
    "ServerRecord",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoreServer",
    "StoreServerStatistics",
    "StoreStatistics",
    "WriteBatch",
    "check_batch",
]


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

    def commit_soon(
        self,
        batches: list[WriteBatch],
        done: Callable[[outcome.Outcome[list[StoreError | None]]], None],
        *,
        here_only: bool = False,
    ) -> bool:
        """``commit_many(batches)`` started now, with no task waiting for it (the
        ``StoreServer``'s commits: no hand-off to a task of its own), if the store can: True
        once started (``done`` then gets, on trio's thread, the outcome ``commit_many`` would
        return or raise; later calls wait for it as for any other), False when it cannot (no
        threads, or another call holds the connection): nothing started, await ``commit_many``.
        A store may also run it to its end before returning True (SQLite: a group of up to
        ``INLINE_RECORDS`` records), ``done`` called first; ``here_only`` starts nothing else
        (False: the ``StoreServer``'s handle then sends the batch to the server instead). The
        batches are checked (``check_batch``) already."""
        ...

    def commits_here(self, records: int) -> bool:
        """Whether a ``commit_soon`` group of ``records`` records (``len`` of its batches) would
        run to its end before it returns, if the connection is free (not a promise: the
        ``StoreServer``'s handle asks before it checks a batch)."""
        ...

    async def claim_pending(
        self, owner: str, now: float, lease_seconds: float, limit: int
    ) -> list[PendingStep]:
        """Lease up to ``limit`` pending steps to ``owner`` until ``now + lease_seconds``: those
        free or with an expired lease (``lease_expires <= now``) and ``not_before <= now``,
        earliest ``not_before`` first (then by key). Returns them as leased. Two claimers never
        get the same step while its lease runs."""
        ...

    async def claim_steps(
        self, owner: str, now: float, lease_seconds: float, limit: int
    ) -> list[Claim]:
        """As :meth:`claim_pending`, each step with the owner whose lease it took (None for a
        free step): a step another server held is a takeover."""
        ...

    async def claim_flow(
        self, flow_id: str, owner: str, now: float, lease_seconds: float
    ) -> Claim | None:
        """Lease the flow's pending step (its current one) to ``owner`` until ``now +
        lease_seconds`` if it is free, its lease expired, or ``owner`` holds it already
        (whatever its ``not_before``); None when the flow has no pending step. A step another
        owner's live lease holds is left alone: the claim names that owner
        (``claim.held_by(owner)`` is False)."""
        ...

    async def adopt_leases(self, owner: str, now: float, lease_seconds: float) -> list[Claim]:
        """At a server's start: lease to ``owner`` until ``now + lease_seconds`` and return the
        steps it holds already (a previous run under the same server id) and, on a store no
        other server shares (SQLite), every pending step: the leases there are all a previous
        run's. On a shared store (PostgreSQL) other owners' leases are left to expire."""
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

        The generation grows when a commit puts free pending steps (with no lease: steps a
        claim can take) or leases are released (by this server, and on PostgreSQL by any other
        through ``LISTEN/NOTIFY``); it starts at 0 on each ``open``. A commit of leased steps
        only (the engine's) wakes nobody: nobody else could claim them. Claim, and wait with
        the generation read before the claim, and no wake-up is lost. Expired leases and
        ``not_before`` passing wake nobody: poll for them.
        """
        ...

    def statistics(self) -> StoreStatistics:
        """The store's counters since ``open``."""
        ...

    # -- the servers sharing the database (``_store_servers``) -----------------------------------

    async def register_server(self, record: ServerRecord) -> None:
        """Insert ``record``, or replace the row of its ``server_id``."""
        ...

    async def beat(self, server_id: str, now: float) -> bool:
        """Set the server's ``heartbeat_at`` to ``now``; False if it has no row."""
        ...

    async def servers(self, now: float, timeout: float) -> list[ServerRecord]:
        """The servers whose heartbeat is later than ``now - timeout``, by ``server_id``."""
        ...

    async def remove_server(self, server_id: str) -> bool:
        """Delete the server's row; False if it had none."""
        ...

    async def forget_servers(self, before: float) -> int:
        """Delete the rows whose heartbeat is older than ``before``; how many went."""
        ...
