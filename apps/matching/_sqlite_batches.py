"""A group commit's batches on SQLite in one statement per table (multi-row ``VALUES``),
instead of one statement per record: what ``_postgres_batches`` does for PostgreSQL.

Why: each statement is a pass through ``sqlite3``'s Python binding (a cursor, the statement
cache, the GIL released and taken back around each step, which on a busy server waits for the
trio thread) and a VDBE program start; a group of a dozen Steps was ~100 statements. Here it
is a few per table: a power of two rows each, so that a few prepared statements serve every
group size. A flow's update and a pending step's delete are the exception: one
``executemany`` each of a statement of one row (``_UPDATE``, ``_DONE``), cheaper there.

``_store_sql.group_rows`` says when the batches may go this way and builds the rows. A flow's
update sets only what a Step changes: ``flow_type`` and ``created_at`` are compared, not set
(SQLite rewrites an index's entry only when the update sets one of its columns); a record
that changes them misses, as a refused one does, and the caller rolls back and applies the
batches one by one (``_store_sql.apply_refusable``), whose update sets every column.
"""

from __future__ import annotations

import functools
import sqlite3
from itertools import chain
from typing import Any

from . import _store_sql as sql
from ._store_sql import FLOW_COLUMNS, GroupRows

__all__ = ["apply_rows"]

#: Rows per statement at most (SQLite takes 32,766 parameters; an updated flow's row has 16).
_CHUNK = 1024

#: ``GroupRows.updated``'s columns, as ``?N`` names the Nth value of a row bound.
_U = {
    name.strip(): f"?{i}"
    for i, name in enumerate([*FLOW_COLUMNS.split(",")[1:], "flow_id", "prev", "owner"], 1)
}
#: What a Step changes in a flow's row (not ``flow_type`` nor ``created_at``).
_SET = (
    "status, args, state, step_index, step_input, result, error, sticky_worker, updated_at,"
    " version, definition"
)
#: One flow a run, the group's in one ``executemany``, each a seek by its id: an ``UPDATE
#: ... FROM`` a ``VALUES`` list of them first joined the list into a temporary table (the
#: group's statements, by callgrind: 176.5k -> 165.3k instructions a Step in groups of 12
#: Steps, 341k -> 270k alone).
_UPDATE = (
    f"UPDATE flows SET {', '.join(f'{name} = {_U[name]}' for name in _SET.split(', '))}"
    f" WHERE flow_id = {_U['flow_id']} AND version = {_U['prev']}"
    f" AND flow_type = {_U['flow_type']} AND created_at = {_U['created_at']}"
    f" AND ({_U['owner']} IS NULL OR NOT EXISTS (SELECT 1 FROM pending"
    f" WHERE pending.flow_id = {_U['flow_id']} AND pending.lease_owner <> {_U['owner']}))"
)
#: One key a run, the group's keys in one ``executemany``: a key's delete is a seek into the
#: keyed table, where a statement of many keys (``IN`` a ``VALUES`` list) first builds a
#: temporary index of them and collects the rows to delete: ~4 times the instructions for a
#: lone Step's, more than half of the group's SQLite work on one (measured with callgrind).
_DONE = "DELETE FROM pending WHERE flow_id = ? AND step_index = ?"


@functools.lru_cache(maxsize=512)
def _sql(template: str, width: int, rows: int) -> str:
    """``template`` with ``rows`` rows of ``width`` ``?`` placeholders."""
    row = "(" + ", ".join("?" * width) + ")"
    return template.format(", ".join([row] * rows))


def _run(conn: sqlite3.Connection, template: str, rows: list[tuple[Any, ...]]) -> int:
    """Run ``template`` over ``rows`` in chunks of a power of two rows each (13 rows: 8, 4
    and 1), so that a few prepared statements serve every group size (preparing one costs
    several times running it); the rows it changed."""
    changed = 0
    start = 0
    while start < len(rows):
        size = min(_CHUNK, 1 << ((len(rows) - start).bit_length() - 1))
        chunk = rows[start : start + size]
        statement = _sql(template, len(chunk[0]), size)
        changed += conn.execute(statement, list(chain.from_iterable(chunk))).rowcount
        start += size
    return changed


def apply_rows(conn: sqlite3.Connection, rows: GroupRows) -> bool:
    """(Inside the caller's transaction.) Write ``rows``: True when every create inserted and
    every update found the version it follows (COMMIT it), False otherwise (ROLLBACK: a batch
    must be refused, or changes what this update does not set). The database's refusals (a
    missing flow) raise its error."""
    if _run(conn, sql.ROWS_CREATE_FLOWS, rows.created) != len(rows.created):
        return False
    if rows.updated and conn.executemany(_UPDATE, rows.updated).rowcount != len(rows.updated):
        return False
    _run(conn, sql.ROWS_INSERT_ATTEMPTS, rows.attempts)
    _run(conn, sql.ROWS_INSERT_DISPATCHES, rows.dispatches)
    _run(conn, sql.ROWS_PUT_PENDING, rows.pending_put)
    if rows.pending_done:
        conn.executemany(_DONE, rows.pending_done)
    return True
