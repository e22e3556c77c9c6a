"""``SqliteStore``: the matching server's embedded :class:`Store`, on the stdlib's sqlite3.

One connection, used by one thread at a time (``trio.to_thread``, behind a lock); files run in
WAL mode with ``synchronous=NORMAL``; values are wire CBOR in BLOB columns (never pickle). The
schema is versioned in ``schema_migrations`` as Django's and Alembic's are: applied in order,
and a database newer than the code is refused.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import trio

import wire

from ._store import (
    AttemptRecord,
    DispatchRecord,
    FlowExists,
    FlowRecord,
    PendingStep,
    StoreConflict,
    StoreError,
    StoreStatistics,
    WriteBatch,
    check_batch,
)

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

T = TypeVar("T")

#: ``(version, statements)``, applied in order, each version in one transaction.
_MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE flows (
                seq INTEGER PRIMARY KEY,
                flow_id TEXT NOT NULL UNIQUE,
                flow_type TEXT NOT NULL,
                status TEXT NOT NULL,
                args BLOB NOT NULL,
                state BLOB NOT NULL,
                step_index INTEGER NOT NULL,
                step_input BLOB NOT NULL,
                result BLOB NOT NULL,
                error BLOB NOT NULL,
                sticky_worker TEXT,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL,
                version INTEGER NOT NULL,
                definition BLOB NOT NULL
            )""",
            "CREATE INDEX flows_by_created ON flows (created_at, seq)",
            "CREATE INDEX flows_by_type ON flows (flow_type, created_at, seq)",
            "CREATE INDEX flows_by_status ON flows (status, created_at, seq)",
            "CREATE INDEX flows_by_type_status ON flows (flow_type, status, created_at, seq)",
            """CREATE TABLE attempts (
                seq INTEGER PRIMARY KEY,
                flow_id TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
                step_index INTEGER NOT NULL,
                step TEXT NOT NULL,
                execution_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                delivery INTEGER NOT NULL,
                worker_id TEXT,
                status TEXT NOT NULL,
                error BLOB NOT NULL,
                started_at REAL NOT NULL,
                finished_at REAL NOT NULL
            )""",
            "CREATE INDEX attempts_by_flow ON attempts (flow_id, seq)",
            """CREATE TABLE dispatches (
                seq INTEGER PRIMARY KEY,
                flow_id TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
                delivery INTEGER NOT NULL,
                kind TEXT NOT NULL,
                name TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                queue TEXT NOT NULL,
                reason TEXT NOT NULL,
                worker_id TEXT,
                at REAL NOT NULL
            )""",
            "CREATE INDEX dispatches_by_flow ON dispatches (flow_id, seq)",
            """CREATE TABLE pending (
                flow_id TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
                step_index INTEGER NOT NULL,
                step TEXT NOT NULL,
                execution_id TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                lease_owner TEXT,
                lease_expires REAL,
                not_before REAL NOT NULL,
                PRIMARY KEY (flow_id, step_index)
            )""",
            "CREATE INDEX pending_by_due ON pending (not_before, flow_id, step_index)",
            "CREATE INDEX pending_by_owner ON pending (lease_owner)",
        ),
    ),
)
#: The schema version this code writes and reads.
SCHEMA_VERSION = _MIGRATIONS[-1][0]

_FLOW_COLUMNS = (
    "flow_id, flow_type, status, args, state, step_index, step_input, result, error,"
    " sticky_worker, created_at, updated_at, version, definition"
)
_PENDING_COLUMNS = (
    "flow_id, step_index, step, execution_id, attempt, lease_owner, lease_expires, not_before"
)
_ATTEMPT_COLUMNS = (
    "flow_id, step_index, step, execution_id, attempt, delivery, worker_id, status, error,"
    " started_at, finished_at"
)
_DISPATCH_COLUMNS = "flow_id, delivery, kind, name, attempt, queue, reason, worker_id, at"


def _encode(value: Any, what: str) -> bytes:
    try:
        return wire.cbor_encode(value)
    except wire.WireError as exc:
        raise StoreError(f"{what} has no wire form, so it cannot be stored: {exc}") from exc


def _decode(data: bytes) -> Any:
    return wire.cbor_decode(data)


def _flow_row(r: FlowRecord) -> tuple[Any, ...]:
    where = f"FlowRecord {r.flow_id!r}"
    return (
        r.flow_id,
        r.flow_type,
        r.status,
        _encode(r.args, f"{where}: args"),
        _encode(r.state, f"{where}: state"),
        r.step_index,
        _encode(r.step_input, f"{where}: step_input"),
        _encode(r.result, f"{where}: result"),
        _encode(r.error, f"{where}: error"),
        r.sticky_worker,
        r.created_at,
        r.updated_at,
        r.version,
        _encode(r.definition, f"{where}: definition"),
    )


def _flow(row: tuple[Any, ...]) -> FlowRecord:
    return FlowRecord(
        flow_id=row[0],
        flow_type=row[1],
        status=row[2],
        args=_decode(row[3]),
        state=_decode(row[4]),
        step_index=row[5],
        step_input=_decode(row[6]),
        result=_decode(row[7]),
        error=_decode(row[8]),
        sticky_worker=row[9],
        created_at=row[10],
        updated_at=row[11],
        version=row[12],
        definition=_decode(row[13]),
    )


def _pending(row: tuple[Any, ...]) -> PendingStep:
    return PendingStep(*row)


def _attempt(row: tuple[Any, ...]) -> AttemptRecord:
    return AttemptRecord(
        flow_id=row[0],
        step_index=row[1],
        step=row[2],
        execution_id=row[3],
        attempt=row[4],
        delivery=row[5],
        worker_id=row[6],
        status=row[7],
        error=_decode(row[8]),
        started_at=row[9],
        finished_at=row[10],
    )


def _dispatch(row: tuple[Any, ...]) -> DispatchRecord:
    return DispatchRecord(*row)


def _limit(limit: Any, what: str) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise StoreError(f"{what}: limit must be an int >= 0 (got {limit!r})")
    return limit


class _Refused(Exception):
    """Carries a batch's StoreError out of its savepoint."""


class SqliteStore:
    """A :class:`~apps.matching._store.Store` on SQLite.

    Args:
        path: A file path, or ``":memory:"`` for a private in-memory database (tests).

    One connection serves every call, one at a time, each in a worker thread; a call waiting
    for the connection is cancellable, a call running in its thread finishes its transaction
    first (cancellation then takes effect at the caller's next checkpoint).
    """

    def __init__(self, path: str) -> None:
        if not isinstance(path, str) or not path:
            raise TypeError(f'SqliteStore.path must be a file path or ":memory:" (got {path!r})')
        self.path = path
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
        return f"SqliteStore({self.path!r})"

    # -- plumbing ---------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            if self._conn is None:
                await trio.lowlevel.checkpoint()
                state = "closed" if self._closed else "not open: await store.open() first"
                raise StoreError(f"{self!r} is {state}")
            return await trio.to_thread.run_sync(fn, self._conn, *args)

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
            self._conn = await trio.to_thread.run_sync(self._connect)
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
        for version, statements in _MIGRATIONS:
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
            await trio.to_thread.run_sync(conn.close)

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
                f"SELECT {_FLOW_COLUMNS} FROM flows WHERE flow_id = ?", (flow_id,)
            ).fetchone()
            return None if row is None else _flow(row)

        return await self._run(_guarded(read))

    async def list_flows(
        self, *, flow_type: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[FlowRecord]:
        """As :meth:`Store.list_flows`."""
        limit = _limit(limit, "list_flows")
        where, params = [], []
        if flow_type is not None:
            where.append("flow_type = ?")
            params.append(flow_type)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        sql = f"SELECT {_FLOW_COLUMNS} FROM flows"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, seq DESC LIMIT ?"

        def read(conn: sqlite3.Connection) -> list[FlowRecord]:
            return [_flow(row) for row in conn.execute(sql, (*params, limit))]

        return await self._run(_guarded(read))

    async def attempts(self, flow_id: str) -> list[AttemptRecord]:
        """As :meth:`Store.attempts`."""

        def read(conn: sqlite3.Connection) -> list[AttemptRecord]:
            sql = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE flow_id = ? ORDER BY seq"
            return [_attempt(row) for row in conn.execute(sql, (flow_id,))]

        return await self._run(_guarded(read))

    async def dispatches(self, flow_id: str, limit: int = 200) -> list[DispatchRecord]:
        """As :meth:`Store.dispatches`."""
        limit = _limit(limit, "dispatches")

        def read(conn: sqlite3.Connection) -> list[DispatchRecord]:
            sql = (
                f"SELECT {_DISPATCH_COLUMNS} FROM dispatches WHERE flow_id = ?"
                " ORDER BY seq DESC LIMIT ?"
            )
            return [_dispatch(row) for row in conn.execute(sql, (flow_id, limit))][::-1]

        return await self._run(_guarded(read))

    async def pending(self, flow_id: str) -> list[PendingStep]:
        """As :meth:`Store.pending`."""

        def read(conn: sqlite3.Connection) -> list[PendingStep]:
            sql = f"SELECT {_PENDING_COLUMNS} FROM pending WHERE flow_id = ? ORDER BY step_index"
            return [_pending(row) for row in conn.execute(sql, (flow_id,))]

        return await self._run(_guarded(read))

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
                for batch in batches:
                    conn.execute("SAVEPOINT batch")
                    try:
                        _apply(conn, batch)
                    except _Refused as refused:
                        conn.execute("ROLLBACK TO batch")
                        outcomes.append(refused.args[0])
                    else:
                        outcomes.append(None)
                    conn.execute("RELEASE batch")
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
        limit = _limit(limit, "claim_pending")
        expires = now + lease_seconds

        def claim(conn: sqlite3.Connection) -> list[PendingStep]:
            with _transaction(conn):
                rows = conn.execute(
                    f"SELECT {_PENDING_COLUMNS} FROM pending"
                    " WHERE not_before <= ? AND (lease_owner IS NULL OR lease_expires <= ?)"
                    " ORDER BY not_before, flow_id, step_index LIMIT ?",
                    (now, now, limit),
                ).fetchall()
                conn.executemany(
                    "UPDATE pending SET lease_owner = ?, lease_expires = ?"
                    " WHERE flow_id = ? AND step_index = ?",
                    [(owner, expires, row[0], row[1]) for row in rows],
                )
            return [_pending((*row[:5], owner, expires, row[7])) for row in rows]

        claimed = await self._run(_guarded(claim))
        self._claimed += len(claimed)
        return claimed

    async def renew_leases(self, owner: str, now: float, lease_seconds: float) -> int:
        """As :meth:`Store.renew_leases`."""

        def renew(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                cursor = conn.execute(
                    "UPDATE pending SET lease_expires = ? WHERE lease_owner = ?",
                    (now + lease_seconds, owner),
                )
            return cursor.rowcount

        return await self._run(_guarded(renew))

    async def release_leases(self, owner: str) -> int:
        """As :meth:`Store.release_leases`."""

        def release(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                cursor = conn.execute(
                    "UPDATE pending SET lease_owner = NULL, lease_expires = NULL"
                    " WHERE lease_owner = ?",
                    (owner,),
                )
            return cursor.rowcount

        released = await self._run(_guarded(release))
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


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _guarded(fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``fn`` with sqlite's and the codec's errors turned into StoreError (cause chained)."""

    def run(conn: sqlite3.Connection) -> T:
        try:
            return fn(conn)
        except (sqlite3.Error, wire.WireError) as exc:
            raise StoreError(f"the store failed: {type(exc).__name__}: {exc}") from exc

    return run


def _apply(conn: sqlite3.Connection, batch: WriteBatch) -> None:
    """Apply one batch inside its savepoint; a refusal raises ``_Refused(StoreError)``."""
    try:
        for record in batch.flows_created:
            if conn.execute("SELECT 1 FROM flows WHERE flow_id = ?", (record.flow_id,)).fetchone():
                raise FlowExists(
                    f"a flow with id {record.flow_id!r} exists already",
                    details={"flow_id": record.flow_id},
                )
            _insert_flow(conn, record)
        for record in batch.flows_upserted:
            row = conn.execute(
                "SELECT version FROM flows WHERE flow_id = ?", (record.flow_id,)
            ).fetchone()
            if row is None:
                _insert_flow(conn, record)
                continue
            if row[0] != record.version - 1:
                raise StoreConflict(
                    f"flow {record.flow_id!r}: the update to version {record.version} expects"
                    f" stored version {record.version - 1}, but version {row[0]} is stored"
                    " (another writer updated it; read the flow again)",
                    details={
                        "flow_id": record.flow_id,
                        "expected": record.version - 1,
                        "stored": row[0],
                    },
                )
            values = _flow_row(record)
            conn.execute(
                "UPDATE flows SET flow_type = ?, status = ?, args = ?, state = ?,"
                " step_index = ?, step_input = ?, result = ?, error = ?, sticky_worker = ?,"
                " created_at = ?, updated_at = ?, version = ?, definition = ? WHERE flow_id = ?",
                (*values[1:], record.flow_id),
            )
        conn.executemany(
            f"INSERT INTO attempts ({_ATTEMPT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    a.flow_id,
                    a.step_index,
                    a.step,
                    a.execution_id,
                    a.attempt,
                    a.delivery,
                    a.worker_id,
                    a.status,
                    _encode(a.error, f"AttemptRecord of {a.flow_id!r}: error"),
                    a.started_at,
                    a.finished_at,
                )
                for a in batch.attempts
            ],
        )
        conn.executemany(
            f"INSERT INTO dispatches ({_DISPATCH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    d.flow_id,
                    d.delivery,
                    d.kind,
                    d.name,
                    d.attempt,
                    d.queue,
                    d.reason,
                    d.worker_id,
                    d.at,
                )
                for d in batch.dispatches
            ],
        )
        conn.executemany(
            f"INSERT OR REPLACE INTO pending ({_PENDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    p.flow_id,
                    p.step_index,
                    p.step,
                    p.execution_id,
                    p.attempt,
                    p.lease_owner,
                    p.lease_expires,
                    p.not_before,
                )
                for p in batch.pending_put
            ],
        )
        conn.executemany(
            "DELETE FROM pending WHERE flow_id = ? AND step_index = ?",
            [(flow_id, step_index) for flow_id, step_index in batch.pending_done],
        )
    except StoreError as exc:
        raise _Refused(exc) from exc
    except sqlite3.IntegrityError as exc:
        refused = StoreError(
            f"a batch was refused by the database ({exc}): attempts, dispatches and pending"
            " steps must name a flow stored in or before their batch"
        )
        refused.__cause__ = exc
        raise _Refused(refused) from exc


def _insert_flow(conn: sqlite3.Connection, record: FlowRecord) -> None:
    conn.execute(
        f"INSERT INTO flows ({_FLOW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        _flow_row(record),
    )
