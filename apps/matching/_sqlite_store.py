"""``SqliteStore``: the matching server's embedded :class:`Store`, on the stdlib's sqlite3.

One connection, used by one thread at a time (``trio.to_thread``, behind a lock); files run in
WAL mode with ``synchronous=NORMAL``; values are wire CBOR in BLOB columns (never pickle). The
schema and the row codecs are in ``_sqlite_schema``: versioned in ``schema_migrations`` as
Django's and Alembic's are, applied in order, and a database newer than the code is refused.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import trio

from ._sqlite_schema import (
    ATTEMPT_COLUMNS,
    DISPATCH_COLUMNS,
    FLOW_COLUMNS,
    MIGRATIONS,
    PENDING_COLUMNS,
    SCHEMA_VERSION,
    apply_refusable,
    attempt_from_row,
    check_limit,
    dispatch_from_row,
    flow_from_row,
    guarded,
    pending_from_row,
    transaction,
)
from ._store_records import (
    AttemptRecord,
    DispatchRecord,
    FlowRecord,
    PendingStep,
    StoreError,
    StoreStatistics,
    WriteBatch,
    check_batch,
)

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

T = TypeVar("T")


class SqliteStore:
    """A :class:`~apps.matching._store.Store` on SQLite.

    Args:
        path: A file path, or ``":memory:"`` for a private in-memory database (tests).
        threads: Run each sqlite call in a worker thread (``trio.to_thread``), the default, so
            the trio loop never blocks on the disk. ``False`` runs them on trio's own thread,
            after a checkpoint: for tests on ``trio.testing.MockClock``, whose autojump would
            otherwise jump (and fire every timer early) while a worker thread ran.

    One connection serves every call, one at a time, each in a worker thread; a call waiting
    for the connection is cancellable, a call running in its thread finishes its transaction
    first (cancellation then takes effect at the caller's next checkpoint).
    """

    def __init__(self, path: str, *, threads: bool = True) -> None:
        if not isinstance(path, str) or not path:
            raise TypeError(f'SqliteStore.path must be a file path or ":memory:" (got {path!r})')
        if not isinstance(threads, bool):
            raise TypeError(f"SqliteStore.threads must be a bool (got {threads!r})")
        self.path = path
        self.threads = threads
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._lock = trio.Lock()
        self._transactions = 0
        self._batches = 0
        self._refused = 0
        self._claimed = 0
        self._generation = 0
        self._changed = trio.Event()

    def __repr__(self) -> str:
        if not self.threads:
            return f"SqliteStore({self.path!r}, threads=False)"
        return f"SqliteStore({self.path!r})"

    # -- plumbing ---------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            if self._conn is None:
                await trio.lowlevel.checkpoint()
                state = "closed" if self._closed else "not open: await store.open() first"
                raise StoreError(f"{self!r} is {state}")
            return await self._call(fn, self._conn, *args)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, or (``threads=False``) here after a checkpoint."""
        if self.threads:
            return await trio.to_thread.run_sync(fn, *args)
        await trio.lowlevel.checkpoint()
        return fn(*args)

    def _wake(self) -> None:
        self._generation += 1
        self._changed.set()
        self._changed = trio.Event()

    # -- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        """As :meth:`Store.open`. Opening an open store is a no-op.

        Raises:
            StoreError: the schema is newer than :data:`SCHEMA_VERSION`, or sqlite failed.
        """
        async with self._lock:
            if self._conn is not None:
                await trio.lowlevel.checkpoint()
                return
            self._conn = await self._call(self._connect)
            self._closed = False
            self._generation = 0

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{self!r}: cannot open the database: {exc}") from exc
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA busy_timeout = 5000")
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            self._migrate(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"{self!r}: cannot open the database: {exc}") from exc
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        (current,) = conn.execute(
            "SELECT coalesce(max(version), 0) FROM schema_migrations"
        ).fetchone()
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self!r}: the database has schema version {current}, newer than this code's"
                f" {SCHEMA_VERSION}; run a release that knows version {current} (nothing was"
                " changed)",
                details={"schema": current, "code": SCHEMA_VERSION},
            )
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    async def close(self) -> None:
        """As :meth:`Store.close`: waits for the running call, then closes the connection."""
        async with self._lock:
            conn, self._conn = self._conn, None
            self._closed = True
            if conn is None:
                await trio.lowlevel.checkpoint()
                return
            await self._call(conn.close)

    def statistics(self) -> StoreStatistics:
        """As :meth:`Store.statistics`."""
        return StoreStatistics(
            transactions=self._transactions,
            batches=self._batches,
            refused=self._refused,
            claimed=self._claimed,
        )

    # -- reads ------------------------------------------------------------------------------------

    async def get_flow(self, flow_id: str) -> FlowRecord | None:
        """As :meth:`Store.get_flow`."""

        def read(conn: sqlite3.Connection) -> FlowRecord | None:
            row = conn.execute(
                f"SELECT {FLOW_COLUMNS} FROM flows WHERE flow_id = ?", (flow_id,)
            ).fetchone()
            return None if row is None else flow_from_row(row)

        return await self._run(guarded(read))

    async def list_flows(
        self, *, flow_type: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[FlowRecord]:
        """As :meth:`Store.list_flows`."""
        limit = check_limit(limit, "list_flows")
        where, params = [], []
        if flow_type is not None:
            where.append("flow_type = ?")
            params.append(flow_type)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        sql = f"SELECT {FLOW_COLUMNS} FROM flows"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, seq DESC LIMIT ?"

        def read(conn: sqlite3.Connection) -> list[FlowRecord]:
            return [flow_from_row(row) for row in conn.execute(sql, (*params, limit))]

        return await self._run(guarded(read))

    async def attempts(self, flow_id: str) -> list[AttemptRecord]:
        """As :meth:`Store.attempts`."""

        def read(conn: sqlite3.Connection) -> list[AttemptRecord]:
            sql = f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE flow_id = ? ORDER BY seq"
            return [attempt_from_row(row) for row in conn.execute(sql, (flow_id,))]

        return await self._run(guarded(read))

    async def dispatches(self, flow_id: str, limit: int = 200) -> list[DispatchRecord]:
        """As :meth:`Store.dispatches`."""
        limit = check_limit(limit, "dispatches")

        def read(conn: sqlite3.Connection) -> list[DispatchRecord]:
            sql = (
                f"SELECT {DISPATCH_COLUMNS} FROM dispatches WHERE flow_id = ?"
                " ORDER BY seq DESC LIMIT ?"
            )
            return [dispatch_from_row(row) for row in conn.execute(sql, (flow_id, limit))][::-1]

        return await self._run(guarded(read))

    async def pending(self, flow_id: str) -> list[PendingStep]:
        """As :meth:`Store.pending`."""

        def read(conn: sqlite3.Connection) -> list[PendingStep]:
            sql = f"SELECT {PENDING_COLUMNS} FROM pending WHERE flow_id = ? ORDER BY step_index"
            return [pending_from_row(row) for row in conn.execute(sql, (flow_id,))]

        return await self._run(guarded(read))

    # -- writes -----------------------------------------------------------------------------------

    async def create_flow(self, record: FlowRecord) -> None:
        """As :meth:`Store.create_flow`."""
        await self.commit(WriteBatch(flows_created=[record]))

    async def commit(self, batch: WriteBatch) -> None:
        """As :meth:`Store.commit`."""
        (outcome,) = await self.commit_many([batch])
        if outcome is not None:
            raise outcome

    async def commit_many(self, batches: Sequence[WriteBatch]) -> list[StoreError | None]:
        """As :meth:`Store.commit_many`."""
        for batch in batches:
            check_batch(batch)
        outcomes = await self._run(self._commit_many, list(batches))
        committed = [b for b, o in zip(batches, outcomes, strict=True) if o is None]
        if any(b.pending_put for b in committed):
            self._wake()
        return outcomes

    def _commit_many(
        self, conn: sqlite3.Connection, batches: list[WriteBatch]
    ) -> list[StoreError | None]:
        outcomes: list[StoreError | None] = []
        self._transactions += 1
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if len(batches) == 1:  # no savepoint needed: a refusal rolls back them all
                    outcomes.append(apply_refusable(conn, batches[0]))
                    conn.execute("COMMIT" if outcomes[0] is None else "ROLLBACK")
                else:
                    for batch in batches:
                        conn.execute("SAVEPOINT batch")
                        outcome = apply_refusable(conn, batch)
                        if outcome is not None:
                            conn.execute("ROLLBACK TO batch")
                        conn.execute("RELEASE batch")
                        outcomes.append(outcome)
                    conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._refused += len(batches)
            raise StoreError(f"{self!r}: the transaction failed: {exc}") from exc
        failed = sum(o is not None for o in outcomes)
        self._refused += failed
        self._batches += len(batches) - failed
        return outcomes

    async def claim_pending(
        self, owner: str, now: float, lease_seconds: float, limit: int
    ) -> list[PendingStep]:
        """As :meth:`Store.claim_pending` (one ``BEGIN IMMEDIATE`` transaction: SQLite has one
        writer, which is what ``FOR UPDATE SKIP LOCKED`` gives each row on PostgreSQL)."""
        limit = check_limit(limit, "claim_pending")
        expires = now + lease_seconds

        def claim(conn: sqlite3.Connection) -> list[PendingStep]:
            with transaction(conn):
                rows = conn.execute(
                    f"SELECT {PENDING_COLUMNS} FROM pending"
                    " WHERE not_before <= ? AND (lease_owner IS NULL OR lease_expires <= ?)"
                    " ORDER BY not_before, flow_id, step_index LIMIT ?",
                    (now, now, limit),
                ).fetchall()
                conn.executemany(
                    "UPDATE pending SET lease_owner = ?, lease_expires = ?"
                    " WHERE flow_id = ? AND step_index = ?",
                    [(owner, expires, row[0], row[1]) for row in rows],
                )
            return [pending_from_row((*row[:5], owner, expires, row[7])) for row in rows]

        claimed = await self._run(guarded(claim))
        self._claimed += len(claimed)
        return claimed

    async def renew_leases(self, owner: str, now: float, lease_seconds: float) -> int:
        """As :meth:`Store.renew_leases`."""

        def renew(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                cursor = conn.execute(
                    "UPDATE pending SET lease_expires = ? WHERE lease_owner = ?",
                    (now + lease_seconds, owner),
                )
            return cursor.rowcount

        return await self._run(guarded(renew))

    async def release_leases(self, owner: str) -> int:
        """As :meth:`Store.release_leases`."""

        def release(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                cursor = conn.execute(
                    "UPDATE pending SET lease_owner = NULL, lease_expires = NULL"
                    " WHERE lease_owner = ?",
                    (owner,),
                )
            return cursor.rowcount

        released = await self._run(guarded(release))
        if released:
            self._wake()
        return released

    async def wait_pending(self, seen: int) -> int:
        """As :meth:`Store.wait_pending` (woken by this store's own commits only)."""
        if self._generation > seen:
            await trio.lowlevel.checkpoint()
        while self._generation <= seen:
            await self._changed.wait()
        return self._generation
