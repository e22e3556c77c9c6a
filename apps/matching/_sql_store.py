"""``SqlStore``: what the two SQL stores (SQLite, PostgreSQL) share of the :class:`Store`
interface: one connection used by one call at a time (behind a trio lock, each call in a
worker thread or, for tests on MockClock, on trio's own; on SQLite a group commit of up to
``INLINE_RECORDS`` records on trio's own too, ``commit_soon``), the reads, the commits and the
leases.

A subclass says how to connect and migrate (``_connect``), how a write transaction starts
(``_BEGIN``), how a claim locks its rows (``_CLAIM_LOCK``), which driver errors are integrity
violations and which are the database's, and how ``wait_pending`` is woken (SQLite: this
store's own commits; PostgreSQL: ``LISTEN/NOTIFY`` too).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import outcome
import trio

import wire

from ._store_records import (
    AttemptRecord,
    Claim,
    DispatchRecord,
    FlowRecord,
    PendingStep,
    StoreError,
    StoreStatistics,
    WriteBatch,
    check_batch,
)
from ._store_servers import SqlServers
from ._store_sql import (
    ATTEMPT_COLUMNS,
    DISPATCH_COLUMNS,
    FLOW_COLUMNS,
    PENDING_COLUMNS,
    GroupRows,
    SqlConnection,
    apply_refusable,
    attempt_from_row,
    check_limit,
    dispatch_from_row,
    flow_from_row,
    group_rows,
    list_flows_sql,
    pending_from_row,
    puts_free,
)
from ._store_threads import ThreadCalls

__all__ = ["SqlStore"]

T = TypeVar("T")


class SqlStore(SqlServers):
    """The shared body of ``SqliteStore`` and ``PostgresStore`` (see the module docstring);
    the ``servers`` table's operations are in ``SqlServers``."""

    #: The statement that starts a write transaction.
    _BEGIN: ClassVar[str] = "BEGIN"
    #: What a claim's SELECT ends with to lock the rows it leases ("" where one writer is all).
    _CLAIM_LOCK: ClassVar[str] = ""
    #: What a SELECT of one flow's row ends with to lock it until the transaction ends.
    _ROW_LOCK: ClassVar[str] = ""
    #: Whether several servers may share the database (else every lease is this server's:
    #: ``adopt_leases`` takes them all at start).
    _SHARED: ClassVar[bool] = False
    #: Whether a group commit may go in one statement per table (``_commit_group``).
    _GROUPS: ClassVar[bool] = False
    #: The most records a ``commit_soon`` group may commit on trio's thread (0: never;
    #: PostgreSQL's: its commit is a network round trip, which would stall every other actor).
    _INLINE_RECORDS: ClassVar[int] = 0
    #: The driver's integrity-violation errors, and every error of the driver.
    _INTEGRITY: ClassVar[type[Exception] | tuple[type[Exception], ...]] = ()
    _DB_ERRORS: ClassVar[type[Exception] | tuple[type[Exception], ...]] = ()

    def __init__(self, *, threads: bool) -> None:
        if not isinstance(threads, bool):
            raise TypeError(f"{type(self).__name__}.threads must be a bool (got {threads!r})")
        self.threads = threads
        self._conn: Any = None
        self._calls: ThreadCalls | None = None
        self._closed = False
        #: One call on the connection at a time: a semaphore, not a lock, so that a commit
        #: started by ``commit_soon`` (no task waits for it) frees it from its thread's hand-back.
        self._lock = trio.Semaphore(1, max_value=1)
        self._transactions = 0
        self._batches = 0
        self._refused = 0
        self._claimed = 0
        self._inline_commits = 0
        #: (``_INLINE_RECORDS``, per store: a test holding transactions in their thread sets 0.)
        self._inline = self._INLINE_RECORDS
        self._generation = 0
        self._changed = trio.Event()

    # -- what a subclass provides -----------------------------------------------------------------

    def _connect(self) -> SqlConnection:
        """(In the call's thread.) Connect and migrate; raise StoreError when that fails."""
        raise NotImplementedError

    def _disconnect(self, conn: Any) -> None:
        conn.close()

    def _in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def _schema_version(self, conn: Any, code: int) -> int:
        """The version ``schema_migrations`` records (0 for a new database).

        Raises:
            StoreError: it is newer than ``code``, this code's version (nothing is changed).
        """
        row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
        current = int(row[0]) if row is not None else 0
        if current > code:
            raise StoreError(
                f"{self!r}: the database has schema version {current}, newer than this code's"
                f" {code}; run a release that knows version {current} (nothing was changed)",
                details={"schema": current, "code": code},
            )
        return current

    def _migrate_to(self, conn: Any, version: int, statements: Sequence[str]) -> None:
        """(Inside the caller's transaction.) Run one version's statements and record it."""
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))

    # -- plumbing ---------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # The connection without a trip through the scheduler when it is free (the call
        # that follows is a checkpoint): a wake-up less per store call.
        lock = self._lock
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            if self._conn is None:
                await trio.lowlevel.checkpoint()
                state = "closed" if self._closed else "not open: await store.open() first"
                raise StoreError(f"{self!r} is {state}")
            if self._calls is not None:
                return await self._calls.run(fn, self._conn, *args)
            return await self._call(fn, self._conn, *args)
        finally:
            lock.release()

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

    def _guarded(self, fn: Callable[[Any], T]) -> Callable[[Any], T]:
        """``fn`` with the driver's and the codec's errors turned into StoreError (chained)."""

        errors: tuple[type[Exception], ...] = (*_as_tuple(self._DB_ERRORS), wire.WireError)

        def run(conn: Any) -> T:
            try:
                return fn(conn)
            except errors as exc:
                raise StoreError(f"the store failed: {type(exc).__name__}: {exc}") from exc

        return run

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[None]:
        """``_BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` on any exception."""
        conn.execute(self._BEGIN)
        try:
            yield
        except BaseException:
            if self._in_transaction(conn):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        """As :meth:`Store.open`. Opening an open store is a no-op.

        Raises:
            StoreError: the schema is newer than this code's, or the database failed.
        """
        async with self._lock:
            if self._conn is not None:
                await trio.lowlevel.checkpoint()
                return
            self._conn = await self._call(self._connect)
            self._calls = ThreadCalls() if self.threads else None
            self._closed = False
            self._generation = 0

    async def close(self) -> None:
        """As :meth:`Store.close`: waits for the running call, then closes the connection."""
        async with self._lock:
            conn, self._conn = self._conn, None
            self._closed = True
            if conn is None:
                await trio.lowlevel.checkpoint()
                return
            calls, self._calls = self._calls, None
            if calls is not None:
                calls.close()
            await self._call(self._disconnect, conn)

    def statistics(self) -> StoreStatistics:
        """As :meth:`Store.statistics`."""
        return StoreStatistics(
            transactions=self._transactions,
            batches=self._batches,
            refused=self._refused,
            claimed=self._claimed,
            inline=self._inline_commits,
        )

    # -- reads ------------------------------------------------------------------------------------

    async def get_flow(self, flow_id: str) -> FlowRecord | None:
        """As :meth:`Store.get_flow`."""

        def read(conn: Any) -> FlowRecord | None:
            row = conn.execute(
                f"SELECT {FLOW_COLUMNS} FROM flows WHERE flow_id = ?", (flow_id,)
            ).fetchone()
            return None if row is None else flow_from_row(row)

        return await self._run(self._guarded(read))

    async def list_flows(
        self, *, flow_type: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[FlowRecord]:
        """As :meth:`Store.list_flows`."""
        sql, params = list_flows_sql(flow_type, status, check_limit(limit, "list_flows"))

        def read(conn: Any) -> list[FlowRecord]:
            return [flow_from_row(row) for row in conn.execute(sql, params)]

        return await self._run(self._guarded(read))

    async def attempts(self, flow_id: str) -> list[AttemptRecord]:
        """As :meth:`Store.attempts`."""

        def read(conn: Any) -> list[AttemptRecord]:
            sql = f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE flow_id = ? ORDER BY seq"
            return [attempt_from_row(row) for row in conn.execute(sql, (flow_id,))]

        return await self._run(self._guarded(read))

    async def dispatches(self, flow_id: str, limit: int = 200) -> list[DispatchRecord]:
        """As :meth:`Store.dispatches`."""
        limit = check_limit(limit, "dispatches")

        def read(conn: Any) -> list[DispatchRecord]:
            sql = (
                f"SELECT {DISPATCH_COLUMNS} FROM dispatches WHERE flow_id = ?"
                " ORDER BY seq DESC LIMIT ?"
            )
            return [dispatch_from_row(row) for row in conn.execute(sql, (flow_id, limit))][::-1]

        return await self._run(self._guarded(read))

    async def pending(self, flow_id: str) -> list[PendingStep]:
        """As :meth:`Store.pending`."""

        def read(conn: Any) -> list[PendingStep]:
            sql = f"SELECT {PENDING_COLUMNS} FROM pending WHERE flow_id = ? ORDER BY step_index"
            return [pending_from_row(row) for row in conn.execute(sql, (flow_id,))]

        return await self._run(self._guarded(read))

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
        self._committed()
        if any(o is None and puts_free(b) for b, o in zip(batches, outcomes, strict=True)):
            self._wake()
        return outcomes

    def commit_soon(
        self,
        batches: list[WriteBatch],
        done: Callable[[outcome.Outcome[list[StoreError | None]]], None],
        *,
        here_only: bool = False,
    ) -> bool:
        """As :meth:`Store.commit_soon`, with threads and the connection free: a group that
        ``commits_here`` here and now, ``done`` called before this returns; any other in a
        thread (none with ``here_only``), whose end calls ``done`` through trio's
        ``run_sync_soon``, with the connection free again.

        Why here, idle or busy: the thread's hand-off costs ~100 us of latency and of CPU a
        commit, and under load its GIL hand-offs (the sqlite3 module gives the GIL up and takes
        it back around every statement) kept the commit thread waiting while trio's ran
        Python: both cost more than the transaction (no fsync; checkpoints in their own
        thread). ARCHITECTURE.md, "Durability and delivery"."""
        calls = self._calls
        if calls is None:
            return False
        here = self.commits_here(sum(map(len, batches)))
        if here_only and not here:
            return False
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            return False
        if here:
            self._inline_commits += 1
            result = outcome.capture(self._commit_many, self._conn, batches)
            self._commit_ended(batches, done, result)
            return True
        ended = functools.partial(self._commit_ended, batches, done)
        calls.start(functools.partial(self._commit_many, self._conn, batches), ended)
        return True

    def commits_here(self, records: int) -> bool:
        """As :meth:`Store.commits_here`: up to ``_INLINE_RECORDS`` records, with threads (a
        store without runs every call on trio's thread already)."""
        return self._calls is not None and records <= self._inline

    def _commit_ended(
        self,
        batches: list[WriteBatch],
        done: Callable[[outcome.Outcome[list[StoreError | None]]], None],
        result: outcome.Outcome[list[StoreError | None]],
    ) -> None:
        """(On trio's thread, a ``commit_soon`` transaction ended.) What ``commit_many`` does
        after its transaction, then ``done``. Called in no task (where a raise would end trio's
        run) or in ``commit_soon``'s caller's: a bug in that bookkeeping goes to ``done`` as
        the outcome instead (the StoreServer crashes with it, its senders told by its DOWN)."""
        self._lock.release()
        if isinstance(result, outcome.Value):
            try:
                self._committed()
                if any(
                    o is None and puts_free(b) for b, o in zip(batches, result.value, strict=True)
                ):
                    self._wake()
            except Exception as exc:
                result = outcome.Error(exc)
        done(result)

    def _committed(self) -> None:
        """(After a ``commit_many`` transaction.) Nothing here; SQLite counts them for its
        checkpoints."""

    def _notify_pending(self, conn: Any) -> None:
        """(Inside a commit that puts pending steps.) Tell other servers; nothing on SQLite."""

    def _commit_many(self, conn: Any, batches: list[WriteBatch]) -> list[StoreError | None]:
        """Every batch in one transaction: in one statement per table (``_commit_group``) when
        ``group_rows`` allows it and no batch is refused; else one by one (``_commit_each``)."""
        rows = group_rows(batches) if self._GROUPS else None
        if rows is not None:
            try:
                committed = self._commit_group(conn, rows, any(map(puts_free, batches)))
            except _as_tuple(self._DB_ERRORS) as exc:
                self._refused += len(batches)
                raise StoreError(f"{self!r}: the transaction failed: {exc}") from exc
            if committed:
                self._transactions += 1
                self._batches += len(batches)
                return [None] * len(batches)
        return self._commit_each(conn, batches)

    def _commit_group(self, conn: Any, rows: GroupRows, free: bool) -> bool:
        """Write a group's ``rows`` in one transaction (telling other servers when it puts
        ``free`` pending steps): True once committed, False once rolled back because a batch
        must be refused or the rows need what only the one-by-one path does. On the driver's
        error the transaction is rolled back and the error raised."""
        conn.execute(self._BEGIN)
        try:
            try:
                applied = self._write_rows(conn, rows)
            except self._INTEGRITY:
                applied = False  # (one batch names a missing flow: one by one tells which)
            if applied and free:
                self._notify_pending(conn)
            conn.execute("COMMIT" if applied else "ROLLBACK")
        except BaseException:
            if self._in_transaction(conn):
                conn.execute("ROLLBACK")
            raise
        return applied

    def _write_rows(self, conn: Any, rows: GroupRows) -> bool:
        """(Inside ``_commit_group``'s transaction; a subclass's, with ``_GROUPS``.) Write
        ``rows``: True when every create inserted and every update found the version it
        follows, else False."""
        raise NotImplementedError

    def _commit_each(self, conn: Any, batches: list[WriteBatch]) -> list[StoreError | None]:
        """The batches one by one in one transaction, each in its savepoint when there are
        several: a refused batch is rolled back alone."""
        outcomes: list[StoreError | None] = []
        self._transactions += 1
        try:
            conn.execute(self._BEGIN)
            try:
                if len(batches) == 1:  # no savepoint needed: a refusal rolls back them all
                    outcomes.append(apply_refusable(conn, batches[0], self._INTEGRITY))
                    if outcomes[0] is None and puts_free(batches[0]):
                        self._notify_pending(conn)
                    conn.execute("COMMIT" if outcomes[0] is None else "ROLLBACK")
                else:
                    for batch in batches:
                        conn.execute("SAVEPOINT batch")
                        outcome = apply_refusable(conn, batch, self._INTEGRITY)
                        if outcome is not None:
                            conn.execute("ROLLBACK TO batch")
                        conn.execute("RELEASE batch")
                        outcomes.append(outcome)
                    if any(
                        o is None and puts_free(b) for b, o in zip(batches, outcomes, strict=True)
                    ):
                        self._notify_pending(conn)
                    conn.execute("COMMIT")
            except BaseException:
                if self._in_transaction(conn):
                    conn.execute("ROLLBACK")
                raise
        except _as_tuple(self._DB_ERRORS) as exc:
            self._refused += len(batches)
            raise StoreError(f"{self!r}: the transaction failed: {exc}") from exc
        failed = sum(o is not None for o in outcomes)
        self._refused += failed
        self._batches += len(batches) - failed
        return outcomes

    async def claim_pending(
        self, owner: str, now: float, lease_seconds: float, limit: int
    ) -> list[PendingStep]:
        """As :meth:`Store.claim_pending` (see :meth:`claim_steps`)."""
        return [claim.step for claim in await self.claim_steps(owner, now, lease_seconds, limit)]

    async def claim_steps(
        self, owner: str, now: float, lease_seconds: float, limit: int
    ) -> list[Claim]:
        """As :meth:`Store.claim_steps`: one transaction whose SELECT locks the rows it
        leases (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's one writer does the same)."""
        limit = check_limit(limit, "claim_pending")
        sql = (
            f"SELECT {PENDING_COLUMNS} FROM pending"
            " WHERE not_before <= ? AND (lease_owner IS NULL OR lease_expires <= ?)"
            f" ORDER BY not_before, flow_id, step_index LIMIT ?{self._CLAIM_LOCK}"
        )
        claimed = await self._run(
            self._guarded(
                lambda conn: self._lease(conn, sql, (now, now, limit), owner, now + lease_seconds)
            )
        )
        self._claimed += len(claimed)
        return claimed

    async def claim_flow(
        self, flow_id: str, owner: str, now: float, lease_seconds: float
    ) -> Claim | None:
        """As :meth:`Store.claim_flow`."""
        sql = (
            f"SELECT {PENDING_COLUMNS} FROM pending WHERE flow_id = ?"
            f" ORDER BY step_index LIMIT 1{self._ROW_LOCK}"
        )
        expires = now + lease_seconds

        def claim(conn: Any) -> Claim | None:
            with self._transaction(conn):
                row = conn.execute(sql, (flow_id,)).fetchone()
                if row is None:
                    return None
                holder, until = row[5], row[6]
                if holder is not None and holder != owner and until > now:
                    return Claim(pending_from_row(row), holder)
                return self._leased(conn, [row], owner, expires)[0]

        claimed = await self._run(self._guarded(claim))
        if claimed is not None and claimed.held_by(owner):
            self._claimed += 1
        return claimed

    async def adopt_leases(self, owner: str, now: float, lease_seconds: float) -> list[Claim]:
        """As :meth:`Store.adopt_leases` (every pending step unless ``_SHARED``)."""
        where = " WHERE lease_owner = ?" if self._SHARED else ""
        sql = (
            f"SELECT {PENDING_COLUMNS} FROM pending{where}"
            f" ORDER BY not_before, flow_id, step_index{self._ROW_LOCK}"
        )
        params = (owner,) if self._SHARED else ()
        return await self._run(
            self._guarded(lambda conn: self._lease(conn, sql, params, owner, now + lease_seconds))
        )

    def _lease(
        self, conn: Any, select: str, params: Sequence[Any], owner: str, expires: float
    ) -> list[Claim]:
        """(In one transaction.) Lease the rows ``select`` finds to ``owner``."""
        with self._transaction(conn):
            return self._leased(conn, conn.execute(select, params).fetchall(), owner, expires)

    @staticmethod
    def _leased(conn: Any, rows: list[Any], owner: str, expires: float) -> list[Claim]:
        conn.executemany(
            "UPDATE pending SET lease_owner = ?, lease_expires = ?"
            " WHERE flow_id = ? AND step_index = ?",
            [(owner, expires, row[0], row[1]) for row in rows],
        )
        return [Claim(pending_from_row((*row[:5], owner, expires, row[7])), row[5]) for row in rows]

    async def renew_leases(self, owner: str, now: float, lease_seconds: float) -> int:
        """As :meth:`Store.renew_leases`."""

        def renew(conn: Any) -> int:
            with self._transaction(conn):
                cursor = conn.execute(
                    "UPDATE pending SET lease_expires = ? WHERE lease_owner = ?",
                    (now + lease_seconds, owner),
                )
            return int(cursor.rowcount)

        return await self._run(self._guarded(renew))

    async def release_leases(self, owner: str) -> int:
        """As :meth:`Store.release_leases`."""

        def release(conn: Any) -> int:
            with self._transaction(conn):
                cursor = conn.execute(
                    "UPDATE pending SET lease_owner = NULL, lease_expires = NULL"
                    " WHERE lease_owner = ?",
                    (owner,),
                )
                if cursor.rowcount:
                    self._notify_pending(conn)
            return int(cursor.rowcount)

        released = await self._run(self._guarded(release))
        if released:
            self._wake()
        return released

    async def wait_pending(self, seen: int) -> int:
        """As :meth:`Store.wait_pending` (woken by this store's own commits; a subclass may add
        other sources through ``_wake``)."""
        if self._generation > seen:
            await trio.lowlevel.checkpoint()
        while self._generation <= seen:
            await self._changed.wait()
        return self._generation


def _as_tuple(
    errors: type[Exception] | tuple[type[Exception], ...],
) -> tuple[type[Exception], ...]:
    return errors if isinstance(errors, tuple) else (errors,)
