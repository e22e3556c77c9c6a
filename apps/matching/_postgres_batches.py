"""A group commit's batches on PostgreSQL in one statement per table (multi-row ``VALUES``),
instead of one statement per record.

Why: each statement is a network round trip, a parse and a plan in the database and a pass
through psycopg's Python; a group of a dozen Steps had ~25 round trips (one per flow insert
and update) and left the store's thread as busy as the whole rest of the server. Here a group
is at most six statements, whatever its size, sent in one round trip with its ``BEGIN`` (a
pipeline), then its ``COMMIT``.

Only when that gives what applying the batches one by one would (``_store_sql``'s path, with a
savepoint per batch): every flow named in at most one batch, no flow created or updated twice,
no pending key put twice, no text holding a NUL, every value encodable. Then the batches
cannot see each other's rows, and each table's statement does in one go what the batch's
records did in order. ``apply_rows`` says whether every create inserted and every update found
the version it follows; when not (a refusal, which one batch alone must take) or when the
database refuses a row (a missing flow), the caller rolls back and applies them one by one,
which names the batch refused and why.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg

from ._store_records import StoreError, WriteBatch
from ._store_sql import (
    FLOW_COLUMNS,
    PENDING_COLUMNS,
    attempt_row,
    dispatch_row,
    flow_row,
    pending_row,
)

__all__ = ["GroupRows", "apply_rows", "group_rows"]

#: Rows per statement at most (PostgreSQL takes 65,535 parameters; a flow row has 14).
_CHUNK = 1000


@attrs.frozen
class GroupRows:
    """A group's rows, per table, in the order the batches wrote them."""

    created: list[tuple[Any, ...]]
    #: ``(*flow_row[1:], flow_id, version - 1, owner)``
    updated: list[tuple[Any, ...]]
    attempts: list[tuple[Any, ...]]
    dispatches: list[tuple[Any, ...]]
    pending_put: list[tuple[Any, ...]]
    pending_done: list[tuple[Any, ...]]


def group_rows(batches: Sequence[WriteBatch]) -> GroupRows | None:
    """The rows of ``batches`` for :func:`apply_rows`, or None when they must go one by one
    (see the module docstring)."""
    owners: dict[str, int] = {}
    created: list[tuple[Any, ...]] = []
    updated: list[tuple[Any, ...]] = []
    attempts: list[tuple[Any, ...]] = []
    dispatches: list[tuple[Any, ...]] = []
    pending_put: list[tuple[Any, ...]] = []
    pending_done: list[tuple[Any, ...]] = []
    written: set[str] = set()
    put: set[tuple[str, int]] = set()
    try:
        for index, batch in enumerate(batches):
            for record in batch.flows_created:
                if record.flow_id in written:
                    return None
                written.add(record.flow_id)
                created.append(flow_row(record))
            for record in batch.flows_upserted:
                if record.flow_id in written:
                    return None
                written.add(record.flow_id)
                row = flow_row(record)
                updated.append((*row[1:], record.flow_id, record.version - 1, batch.owner))
            attempts.extend(attempt_row(a) for a in batch.attempts)
            dispatches.extend(dispatch_row(d) for d in batch.dispatches)
            for step in batch.pending_put:
                if step.key in put:
                    return None
                put.add(step.key)
                pending_put.append(pending_row(step))
            pending_done.extend(batch.pending_done)
            # Which batch names each flow: one batch each, or their rows could meet.
            names = {r.flow_id for r in batch.flows_created}
            names.update(r.flow_id for r in batch.flows_upserted)
            names.update(r.flow_id for r in batch.attempts)
            names.update(r.flow_id for r in batch.dispatches)
            names.update(step.flow_id for step in batch.pending_put)
            names.update(flow_id for flow_id, _ in batch.pending_done)
            for flow_id in names:
                if owners.setdefault(flow_id, index) != index:
                    return None
    except StoreError:
        return None  # (a value with no wire form: that batch alone is refused)
    rows = GroupRows(created, updated, attempts, dispatches, pending_put, pending_done)
    if any(_has_nul(r) for table in attrs.astuple(rows, recurse=False) for r in table):
        return None
    return rows


def _has_nul(row: tuple[Any, ...]) -> bool:
    return any(type(value) is str and "\x00" in value for value in row)


_CREATE = f"INSERT INTO flows ({FLOW_COLUMNS}) VALUES {{}} ON CONFLICT (flow_id) DO NOTHING"
_FLOW_SET = [c.strip() for c in FLOW_COLUMNS.split(",")][1:]
_FLOW_TYPES = (
    "text", "text", "bytea", "bytea", "bigint", "bytea", "bytea", "bytea", "text",
    "float8", "float8", "bigint", "bytea", "text", "bigint", "text",
)  # fmt: skip
#: The update each batch's flow would get (``_store_sql._UPDATE_FLOW``, fenced when the batch
#: names an owner), for many flows at once. (Each value cast: a VALUES list types its columns
#: from its values, and a column of NULLs would be text.)
_UPDATE = (
    f"UPDATE flows SET {', '.join(f'{c} = v.{c}' for c in _FLOW_SET)}"
    f" FROM (VALUES {{}}) AS v ({', '.join(_FLOW_SET)}, flow_id, prev, owner)"
    " WHERE flows.flow_id = v.flow_id AND flows.version = v.prev AND (v.owner IS NULL"
    " OR NOT EXISTS (SELECT 1 FROM pending WHERE pending.flow_id = v.flow_id"
    " AND pending.lease_owner <> v.owner))"
)
_ATTEMPTS = (
    "INSERT INTO attempts (flow_id, step_index, step, execution_id, attempt, delivery,"
    " worker_id, status, error, started_at, finished_at) VALUES {}"
)
_DISPATCHES = (
    "INSERT INTO dispatches (flow_id, delivery, kind, name, attempt, queue, reason, worker_id,"
    " at) VALUES {}"
)
_PUT = (
    f"INSERT INTO pending ({PENDING_COLUMNS}) VALUES {{}}"
    " ON CONFLICT (flow_id, step_index) DO UPDATE SET step = excluded.step,"
    " execution_id = excluded.execution_id, attempt = excluded.attempt,"
    " lease_owner = excluded.lease_owner, lease_expires = excluded.lease_expires,"
    " not_before = excluded.not_before"
)
_DONE = "DELETE FROM pending WHERE (flow_id, step_index) IN (VALUES {})"


@functools.lru_cache(maxsize=512)
def _sql(template: str, width: int, rows: int, types: tuple[str, ...] = ()) -> str:
    """``template`` with ``rows`` rows of ``width`` PostgreSQL placeholders (``$n``: the
    cursor is raw, psycopg parses no ``%s``: with hundreds of them that parse cost more than
    the database's work), each cast to ``types`` when given."""
    casts = [f"::{t}" for t in types] if types else [""] * width
    return template.format(
        ", ".join(
            "(" + ", ".join(f"${row * width + i + 1}{casts[i]}" for i in range(width)) + ")"
            for row in range(rows)
        )
    )


def _send(
    conn: psycopg.Connection[Any],
    template: str,
    rows: list[tuple[Any, ...]],
    types: tuple[str, ...] = (),
) -> list[psycopg.RawCursor[Any]]:
    """(In a pipeline.) Send ``template`` over ``rows`` in chunks, a cursor each: their
    ``rowcount`` once the pipeline is synced."""
    cursors = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        sql = _sql(template, len(chunk[0]), len(chunk), types)
        cursor = psycopg.RawCursor(conn)
        cursor.execute(sql, [value for row in chunk for value in row])
        cursors.append(cursor)
    return cursors


def apply_rows(
    conn: psycopg.Connection[Any], rows: GroupRows, notify: tuple[str, str] | None
) -> bool:
    """(On a connection outside any transaction.) ``BEGIN``, write ``rows`` and, when given,
    ``pg_notify(*notify)`` (sent at COMMIT), all in one round trip (a pipeline), leaving the
    transaction open for the caller to end: True when every create inserted and every update
    found the version it follows (COMMIT it), False otherwise (ROLLBACK). The database's
    refusals (a missing flow) raise its error; the transaction is then aborted (ROLLBACK)."""
    with conn.pipeline() as pipeline:
        conn.execute("BEGIN")
        created = _send(conn, _CREATE, rows.created)
        updated = _send(conn, _UPDATE, rows.updated, _FLOW_TYPES)
        others = [
            *_send(conn, _ATTEMPTS, rows.attempts),
            *_send(conn, _DISPATCHES, rows.dispatches),
            *_send(conn, _PUT, rows.pending_put),
            *_send(conn, _DONE, rows.pending_done, ("text", "bigint")),
        ]
        if notify is not None:
            others.append(psycopg.RawCursor(conn))
            others[-1].execute("SELECT pg_notify($1, $2)", notify)
        try:
            pipeline.sync()
            return sum(c.rowcount for c in created) == len(rows.created) and sum(
                c.rowcount for c in updated
            ) == len(rows.updated)
        finally:
            for cursor in (*created, *updated, *others):
                cursor.close()
