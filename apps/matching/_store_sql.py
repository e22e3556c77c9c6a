"""What the matching server's SQL stores share (SQLite and PostgreSQL): the columns, rows to
and from records (values as wire CBOR in binary columns, never pickle), applying one
``WriteBatch`` inside a transaction, and a group's rows per table (``group_rows``) for the
stores' one-statement-per-table path (``_sqlite_batches``, ``_postgres_batches``).

The SQL here is written once, with ``?`` parameters and what both databases accept (``INSERT
... ON CONFLICT ... DO UPDATE``); a PostgreSQL connection adapter turns ``?`` into ``%s``. A
connection is anything with ``execute(sql, params)`` (returning a cursor with ``fetchone``)
and ``executemany(sql, rows)``.
"""

from __future__ import annotations

import copy
import operator
import urllib.parse
from collections.abc import Sequence
from itertools import chain
from typing import Any, Protocol

import attrs

import wire

from ._store_records import (
    FLOW_STATUSES,
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
    "PENDING_COLUMNS",
    "ROWS_CREATE_FLOWS",
    "ROWS_INSERT_ATTEMPTS",
    "ROWS_INSERT_DISPATCHES",
    "ROWS_PUT_PENDING",
    "GroupRows",
    "SqlConnection",
    "apply_refusable",
    "attempt_from_row",
    "attempt_row",
    "check_limit",
    "dispatch_from_row",
    "dispatch_row",
    "flow_from_row",
    "flow_row",
    "group_rows",
    "list_flows_sql",
    "pending_from_row",
    "pending_row",
    "puts_free",
    "redact",
]


class SqlConnection(Protocol):
    """The part of a DB-API connection the shared code uses."""

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, rows: Any, /) -> Any: ...


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
_CREATE_FLOW = (
    f"INSERT INTO flows ({FLOW_COLUMNS}) VALUES ({', '.join('?' * 14)})"
    " ON CONFLICT (flow_id) DO NOTHING"
)
_UPDATE_FLOW = (
    "UPDATE flows SET flow_type = ?, status = ?, args = ?, state = ?, step_index = ?,"
    " step_input = ?, result = ?, error = ?, sticky_worker = ?, created_at = ?, updated_at = ?,"
    " version = ?, definition = ? WHERE flow_id = ? AND version = ?"
)
#: The same, fenced: only while no other owner's lease holds the flow's pending step.
_UPDATE_OWNED_FLOW = (
    _UPDATE_FLOW + " AND NOT EXISTS (SELECT 1 FROM pending WHERE pending.flow_id = ?"
    " AND pending.lease_owner <> ?)"
)
#: A group's inserts, ``{}`` for its rows of placeholders (``_sqlite_batches``,
#: ``_postgres_batches``; a batch's own below are the same with one row of ``?``).
ROWS_CREATE_FLOWS = (
    f"INSERT INTO flows ({FLOW_COLUMNS}) VALUES {{}} ON CONFLICT (flow_id) DO NOTHING"
)
ROWS_INSERT_ATTEMPTS = f"INSERT INTO attempts ({ATTEMPT_COLUMNS}) VALUES {{}}"
ROWS_INSERT_DISPATCHES = f"INSERT INTO dispatches ({DISPATCH_COLUMNS}) VALUES {{}}"
ROWS_PUT_PENDING = (
    f"INSERT INTO pending ({PENDING_COLUMNS}) VALUES {{}}"
    " ON CONFLICT (flow_id, step_index) DO UPDATE SET step = excluded.step,"
    " execution_id = excluded.execution_id, attempt = excluded.attempt,"
    " lease_owner = excluded.lease_owner, lease_expires = excluded.lease_expires,"
    " not_before = excluded.not_before"
)
_INSERT_ATTEMPT = ROWS_INSERT_ATTEMPTS.format(f"({', '.join('?' * 11)})")
_INSERT_DISPATCH = ROWS_INSERT_DISPATCHES.format(f"({', '.join('?' * 9)})")
_PUT_PENDING = ROWS_PUT_PENDING.format(f"({', '.join('?' * 8)})")


_NEWEST = "ORDER BY created_at DESC, seq DESC LIMIT ?"


def list_flows_sql(
    flow_type: str | None, status: str | None, limit: int
) -> tuple[str, tuple[Any, ...]]:
    """``list_flows``'s query and its parameters: the newest ``limit`` flows (of
    ``flow_type``, in ``status``, when given), each row ``FLOW_COLUMNS`` then ``seq``.

    The flows' indexes all begin with the status after the type, if any (``flows_by_status``,
    ``flows_by_type_status``: a Step writes no other, ``_sqlite_schema``'s version 3), so
    without a status it merges the newest ``limit`` of each status, each an index range read
    in order, rather than sorting every flow (of the type)."""
    columns = f"{FLOW_COLUMNS}, seq FROM flows WHERE "
    typed = "" if flow_type is None else "flow_type = ? AND "
    kind = () if flow_type is None else (flow_type,)
    if status is not None:
        return f"SELECT {columns}{typed}status = ? {_NEWEST}", (*kind, status, limit)
    parts = [
        f"SELECT * FROM (SELECT {columns}{typed}status = ? {_NEWEST}) AS s{i}"
        for i in range(len(FLOW_STATUSES))
    ]
    params = [value for s in FLOW_STATUSES for value in (*kind, s, limit)]
    return " UNION ALL ".join(parts) + f" {_NEWEST}", (*params, limit)


def _encode(value: Any, what: str) -> bytearray:
    """``value`` as wire CBOR, as a ``bytearray``: ``sqlite3`` binds one as a BLOB at once,
    but sends ``bytes`` through its adapter lookup first, which fails slowly (an
    ``AttributeError`` formatted and dropped, ~1 us a value; a Step binds 13 blobs)."""
    try:
        return _blob(value)
    except wire.WireError as exc:
        raise StoreError(f"{what} has no wire form, so it cannot be stored: {exc}") from exc


_NULL = wire.cbor_encode(None)
#: The blobs of None and of an empty map and list, shared by every row that writes one (a new
#: flow's result and error, an empty state): never changed in place, and both drivers copy
#: what they bind.
_NULL_BLOB = bytearray(_NULL)
_EMPTY_BLOBS: dict[type, bytearray] = {
    dict: bytearray(wire.cbor_encode({})),
    list: bytearray(wire.cbor_encode([])),
}


def _blob(value: Any) -> bytearray:
    """``value`` as wire CBOR in a ``bytearray`` (see :func:`_encode`); None and an empty
    map or list without the encoder."""
    if value is None:
        return _NULL_BLOB
    if not value:
        empty = _EMPTY_BLOBS.get(type(value))
        if empty is not None:
            return empty
    return bytearray(wire.cbor_encode(value))


#: ``id(definition) -> (definition, a copy of it as encoded, its CBOR)``: a flow type's
#: definition is one dict shared by every flow that pins it (``FlowSpec.to_wire``), written
#: with each of their rows (twice a one-Step flow). Comparing it with the copy costs half of
#: encoding it again, and still sees a dict changed in place since. Cleared when full.
_DEFINITIONS: dict[int, tuple[dict[str, Any], dict[str, Any], bytearray]] = {}
_MAX_DEFINITIONS = 256


def _definition_blob(definition: dict[str, Any]) -> bytearray:
    known = _DEFINITIONS.get(id(definition))
    if known is not None and known[0] is definition and known[1] == definition:
        return known[2]
    blob = _blob(definition)
    if len(_DEFINITIONS) >= _MAX_DEFINITIONS:
        _DEFINITIONS.clear()
    _DEFINITIONS[id(definition)] = (definition, copy.deepcopy(definition), blob)
    return blob


def flow_row(r: FlowRecord) -> tuple[Any, ...]:
    try:
        args = _blob(r.args)
        return (
            r.flow_id,
            r.flow_type,
            r.status,
            args,
            _blob(r.state),
            r.step_index,
            # (a new flow's first step gets its args: the same list, encoded once)
            args if r.step_input is r.args else _blob(r.step_input),
            _blob(r.result),
            _blob(r.error),
            r.sticky_worker,
            r.created_at,
            r.updated_at,
            r.version,
            _definition_blob(r.definition),
        )
    except wire.WireError:
        # (the message names the value: found again, off the path of every row)
        for name in ("args", "state", "step_input", "result", "error", "definition"):
            _encode(getattr(r, name), f"FlowRecord {r.flow_id!r}: {name}")
        raise


def _decode(data: bytes) -> Any:
    return wire.cbor_decode(data)


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


# Their columns are their fields, in order (as ``dispatch_from_row`` and ``pending_from_row``
# read them back); one C call builds a row.
dispatch_row = operator.attrgetter(*(field.name for field in attrs.fields(DispatchRecord)))
pending_row = operator.attrgetter(*(field.name for field in attrs.fields(PendingStep)))


def attempt_row(a: AttemptRecord) -> tuple[Any, ...]:
    error = a.error
    return (
        a.flow_id,
        a.step_index,
        a.step,
        a.execution_id,
        a.attempt,
        a.delivery,
        a.worker_id,
        a.status,
        _NULL_BLOB if error is None else _encode(error, f"AttemptRecord of {a.flow_id!r}: error"),
        a.started_at,
        a.finished_at,
    )


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


def apply_refusable(
    conn: SqlConnection, batch: WriteBatch, integrity: type[Exception] | tuple[type[Exception], ...]
) -> StoreError | None:
    """Apply one batch; return the StoreError that refused it (its writes then to be rolled
    back by the caller: on PostgreSQL the transaction or savepoint is aborted), or None.
    ``integrity`` is the driver's integrity-violation error (a missing flow, a duplicate)."""
    try:
        _apply(conn, batch, integrity)
    except _Refused as refused:
        error: StoreError = refused.args[0]
        return error
    return None


def _apply(
    conn: SqlConnection,
    batch: WriteBatch,
    integrity: type[Exception] | tuple[type[Exception], ...],
) -> None:
    """Apply one batch inside its savepoint; a refusal raises ``_Refused(StoreError)``."""
    try:
        for record in batch.flows_created:
            # (one statement, not a SELECT first: a stored id inserts no row)
            if conn.execute(_CREATE_FLOW, _no_nul(flow_row(record))).rowcount != 1:
                raise FlowExists(
                    f"a flow with id {record.flow_id!r} exists already",
                    details={"flow_id": record.flow_id},
                )
        for record in batch.flows_upserted:
            # The update names the version it replaces: one statement when it is stored (the
            # usual case); else the stored version tells a new flow from a conflict.
            values = _no_nul(flow_row(record))
            key = (*values[1:], record.flow_id, record.version - 1)
            if batch.owner is None:
                updated = conn.execute(_UPDATE_FLOW, key)
            else:
                updated = conn.execute(_UPDATE_OWNED_FLOW, (*key, record.flow_id, batch.owner))
            if updated.rowcount == 1:
                continue
            row = conn.execute(
                "SELECT version FROM flows WHERE flow_id = ?", (record.flow_id,)
            ).fetchone()
            if row is None:
                _insert_flow(conn, values)
                continue
            if row[0] == record.version - 1:  # (so another owner's lease refused it)
                raise _lease_conflict(conn, record.flow_id, batch.owner)
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
        if batch.attempts:
            conn.executemany(_INSERT_ATTEMPT, [_no_nul(attempt_row(a)) for a in batch.attempts])
        if batch.dispatches:
            conn.executemany(_INSERT_DISPATCH, [_no_nul(dispatch_row(d)) for d in batch.dispatches])
        if batch.pending_put:
            conn.executemany(_PUT_PENDING, [_no_nul(pending_row(p)) for p in batch.pending_put])
        if batch.pending_done:
            conn.executemany(
                "DELETE FROM pending WHERE flow_id = ? AND step_index = ?",
                [_no_nul((flow_id, step_index)) for flow_id, step_index in batch.pending_done],
            )
    except StoreError as exc:
        raise _Refused(exc) from exc
    except integrity as exc:
        refused = StoreError(
            f"a batch was refused by the database ({exc}): attempts, dispatches and pending"
            " steps must name a flow stored in or before their batch"
        )
        refused.__cause__ = exc
        raise _Refused(refused) from exc


def _no_nul(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``row``, unless a text in it holds a NUL character: PostgreSQL's text cannot hold one
    and SQLite's could, so both stores refuse such a batch (alone in its group), alike."""
    for value in row:
        if type(value) is str and "\x00" in value:
            raise StoreError(
                f"a batch was refused: text may not hold a NUL character (got {value!r})",
                details={"text": value},
            )
    return row


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
    """The rows of ``batches`` for a store's one-statement-per-table path, or None when they
    must go one by one (each batch in its savepoint, :func:`apply_refusable`).

    Only when that gives what applying the batches one by one would: every flow named in at
    most one batch, no flow created or updated twice, no pending key put twice, no text holding
    a NUL, every value encodable. Then the batches cannot see each other's rows, and each
    table's statement does in one go what the batches' records did in order. The store still
    checks that every create inserted and every update found the version it follows (else it
    rolls back and goes one by one, which names the batch refused and why).
    """
    created: list[tuple[Any, ...]] = []
    updated: list[tuple[Any, ...]] = []
    attempts: list[tuple[Any, ...]] = []
    dispatches: list[tuple[Any, ...]] = []
    pending_put: list[tuple[Any, ...]] = []
    pending_done: list[tuple[Any, ...]] = []
    written: set[str] = set()
    put: set[tuple[str, int]] = set()
    owners: dict[str, int] = {}
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
            attempts += map(attempt_row, batch.attempts)
            dispatches += map(dispatch_row, batch.dispatches)
            for step in batch.pending_put:
                if step.key in put:
                    return None
                put.add(step.key)
            pending_put += map(pending_row, batch.pending_put)
            pending_done += batch.pending_done
            if len(batches) > 1 and not _alone(batch, index, owners):
                return None
    except StoreError:
        return None  # (a value with no wire form: that batch alone is refused)
    rows = GroupRows(created, updated, attempts, dispatches, pending_put, pending_done)
    if _any_nul(created, _FLOW_TEXT) or _any_nul(updated, _UPDATED_TEXT):
        return None
    if _any_nul(attempts, _ATTEMPT_TEXT) or _any_nul(dispatches, _DISPATCH_TEXT):
        return None
    if _any_nul(pending_put, _PENDING_TEXT) or _any_nul(pending_done, _DONE_TEXT):
        return None
    return rows


def _alone(batch: WriteBatch, index: int, owners: dict[str, int]) -> bool:
    """Whether no batch before ``index`` named a flow ``batch`` names (recording its flows)."""
    names = set(map(_FLOW_ID, batch.flows_created))
    names.update(
        map(_FLOW_ID, batch.flows_upserted),
        map(_FLOW_ID, batch.attempts),
        map(_FLOW_ID, batch.dispatches),
        map(_FLOW_ID, batch.pending_put),
        map(_FIRST, batch.pending_done),
    )
    for flow_id in names:  # (a batch of a Step names one)
        if owners.setdefault(flow_id, index) != index:
            return False
    return True


# (Each record's flow, and a pending key's, in one C call.)
_FLOW_ID = operator.attrgetter("flow_id")
_FIRST = operator.itemgetter(0)


# Where each table's rows may hold text (the rest are numbers, bytes, or None).
_FLOW_TEXT = operator.itemgetter(0, 1, 2, 9)
_UPDATED_TEXT = operator.itemgetter(0, 1, 8, 13, 15)
_ATTEMPT_TEXT = operator.itemgetter(0, 2, 3, 6, 7)
_DISPATCH_TEXT = operator.itemgetter(0, 2, 3, 5, 6, 7)
_PENDING_TEXT = operator.itemgetter(0, 2, 3, 5)
_DONE_TEXT = operator.itemgetter(0, 0)  # (twice: a tuple, as the others give)


def _any_nul(rows: list[tuple[Any, ...]], texts: operator.itemgetter[Any]) -> bool:
    """Whether a text in ``rows`` holds a NUL (or a text column holds something else: the
    one-by-one path then checks each value), in one pass in C: ``texts`` picks the columns
    that hold a str or None (``filter`` drops the Nones; no ``str()`` per value)."""
    if not rows:
        return False
    try:
        return "\x00" in "".join(filter(None, chain.from_iterable(map(texts, rows))))
    except TypeError:
        return True


def _lease_conflict(conn: SqlConnection, flow_id: str, owner: str | None) -> StoreConflict:
    row = conn.execute(
        "SELECT lease_owner FROM pending WHERE flow_id = ? AND lease_owner <> ?", (flow_id, owner)
    ).fetchone()
    holder = row[0] if row is not None else None
    return StoreConflict(
        f"flow {flow_id!r}: {owner!r} may not update it: its pending step is leased to"
        f" {holder!r} (that server took the flow over; read it again)",
        details={"flow_id": flow_id, "owner": owner, "holder": holder},
    )


def _insert_flow(conn: SqlConnection, values: tuple[Any, ...]) -> None:
    conn.execute(
        f"INSERT INTO flows ({FLOW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        values,
    )


def redact(url: str) -> str:
    """``url`` without its password (for messages and ``repr``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<a malformed URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def puts_free(batch: WriteBatch) -> bool:
    """Whether ``batch`` puts a pending step with no lease (one a claim can take)."""
    return any(step.lease_owner is None for step in batch.pending_put)
