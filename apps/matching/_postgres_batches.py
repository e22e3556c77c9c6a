"""A group commit's batches on PostgreSQL in one statement per table (multi-row ``VALUES``),
instead of one statement per record.

Why: each statement is a network round trip, a parse and a plan in the database and a pass
through psycopg's Python; a group of a dozen Steps had ~25 round trips (one per flow insert
and update) and left the store's thread as busy as the whole rest of the server. Here a group
is at most six statements, whatever its size, sent in one round trip with its ``BEGIN`` (a
pipeline), then its ``COMMIT``.

Only when that gives what applying the batches one by one would (``_store_sql``'s path, with a
savepoint per batch): ``_store_sql.group_rows`` says when (and builds the rows; SQLite's
``_sqlite_batches`` takes the same). ``apply_rows`` says whether every create inserted and
every update found the version it follows; when not (a refusal, which one batch alone must
take) or when the database refuses a row (a missing flow), the caller rolls back and applies
them one by one, which names the batch refused and why.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg

from ._store_sql import (
    FLOW_COLUMNS,
    ROWS_CREATE_FLOWS,
    ROWS_INSERT_ATTEMPTS,
    ROWS_INSERT_DISPATCHES,
    ROWS_PUT_PENDING,
    GroupRows,
)

__all__ = ["apply_rows"]

#: Rows per statement at most (PostgreSQL takes 65,535 parameters; a flow row has 14).
_CHUNK = 1000

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
        created = _send(conn, ROWS_CREATE_FLOWS, rows.created)
        updated = _send(conn, _UPDATE, rows.updated, _FLOW_TYPES)
        others = [
            *_send(conn, ROWS_INSERT_ATTEMPTS, rows.attempts),
            *_send(conn, ROWS_INSERT_DISPATCHES, rows.dispatches),
            *_send(conn, ROWS_PUT_PENDING, rows.pending_put),
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
