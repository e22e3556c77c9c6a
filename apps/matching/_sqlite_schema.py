"""The SQLite side of ``SqliteStore``: the versioned schema (``schema_migrations``, as Django's
and Alembic's migrations), rows to and from records (values as wire CBOR in BLOB columns, never
pickle), and applying one ``WriteBatch`` inside a transaction.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import wire

from ._store_records import (
    AttemptRecord,
    DispatchRecord,
    FlowExists,
    FlowRecord,
    PendingStep,
    StoreConflict,
    StoreError,
    WriteBatch,
)

__all__ = [
    "ATTEMPT_COLUMNS",
    "DISPATCH_COLUMNS",
    "FLOW_COLUMNS",
    "MIGRATIONS",
    "PENDING_COLUMNS",
    "SCHEMA_VERSION",
    "apply_refusable",
    "attempt_from_row",
    "check_limit",
    "dispatch_from_row",
    "flow_from_row",
    "guarded",
    "pending_from_row",
    "transaction",
]

T = TypeVar("T")

#: ``(version, statements)``, applied in order, each version in one transaction.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
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
SCHEMA_VERSION = MIGRATIONS[-1][0]

FLOW_COLUMNS = (
    "flow_id, flow_type, status, args, state, step_index, step_input, result, error,"
    " sticky_worker, created_at, updated_at, version, definition"
)
PENDING_COLUMNS = (
    "flow_id, step_index, step, execution_id, attempt, lease_owner, lease_expires, not_before"
)
ATTEMPT_COLUMNS = (
    "flow_id, step_index, step, execution_id, attempt, delivery, worker_id, status, error,"
    " started_at, finished_at"
)
DISPATCH_COLUMNS = "flow_id, delivery, kind, name, attempt, queue, reason, worker_id, at"
_INSERT_ATTEMPT = f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES ({', '.join('?' * 11)})"
_INSERT_DISPATCH = f"INSERT INTO dispatches ({DISPATCH_COLUMNS}) VALUES ({', '.join('?' * 9)})"
_PUT_PENDING = f"INSERT OR REPLACE INTO pending ({PENDING_COLUMNS}) VALUES ({', '.join('?' * 8)})"


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


def flow_from_row(row: tuple[Any, ...]) -> FlowRecord:
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


def pending_from_row(row: tuple[Any, ...]) -> PendingStep:
    return PendingStep(*row)


def attempt_from_row(row: tuple[Any, ...]) -> AttemptRecord:
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


def dispatch_from_row(row: tuple[Any, ...]) -> DispatchRecord:
    return DispatchRecord(*row)


def check_limit(limit: Any, what: str) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise StoreError(f"{what}: limit must be an int >= 0 (got {limit!r})")
    return limit


class _Refused(Exception):
    """Carries a batch's StoreError out of its savepoint."""


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def guarded(fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """``fn`` with sqlite's and the codec's errors turned into StoreError (cause chained)."""

    def run(conn: sqlite3.Connection) -> T:
        try:
            return fn(conn)
        except (sqlite3.Error, wire.WireError) as exc:
            raise StoreError(f"the store failed: {type(exc).__name__}: {exc}") from exc

    return run


def apply_refusable(conn: sqlite3.Connection, batch: WriteBatch) -> StoreError | None:
    """Apply one batch; return the StoreError that refused it (its writes then to be rolled
    back by the caller), or None."""
    try:
        _apply(conn, batch)
    except _Refused as refused:
        error: StoreError = refused.args[0]
        return error
    return None


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
        if batch.attempts:
            conn.executemany(
                _INSERT_ATTEMPT,
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
        if batch.dispatches:
            conn.executemany(
                _INSERT_DISPATCH,
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
        if batch.pending_put:
            conn.executemany(
                _PUT_PENDING,
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
        if batch.pending_done:
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
        f"INSERT INTO flows ({FLOW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        _flow_row(record),
    )
