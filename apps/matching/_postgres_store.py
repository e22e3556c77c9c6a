"""``PostgresStore``: the matching server's :class:`Store` on PostgreSQL, with psycopg 3.

Several matching servers may share one database. What makes that safe here: every write is one
transaction; a claim locks the rows it leases with ``FOR UPDATE SKIP LOCKED``, so two servers
never lease one pending step; a flow update names the version it follows (``StoreConflict``
otherwise); schema migrations take an advisory lock, so servers starting together migrate
once; and a commit that puts free pending steps (or a release of leases) sends a ``NOTIFY`` on
:data:`CHANNEL`, which wakes ``wait_pending`` on every server (``LISTEN`` on a second
connection).

The driver is psycopg's blocking API, each call in a worker thread (of trio's cache), as
``SqliteStore`` runs sqlite3. psycopg's async API runs on asyncio only, so under trio the
choice is a thread hand-off per call or blocking the loop for a network round trip; measured
on this project's 2-core machine (loaded), a one-row commit took 1.2 ms on the loop and 1.9 ms
through a thread. The hand-off is the price of never stalling every other actor for a round
trip, and the ``StoreServer``'s group commit pays it once per group, not per Step.

``threads=False`` (for tests only, as ``SqliteStore``'s) calls psycopg on trio's own thread, so
tests on trio's ``MockClock`` run the same on both stores; ``wait_pending`` then waits for the
listening socket to turn readable (or this store's own commits) and reads what came without
blocking.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, ClassVar

import psycopg
import psycopg.errors
import trio
from psycopg.pq import TransactionStatus

from ._postgres_batches import apply_rows
from ._postgres_schema import MIGRATIONS, SCHEMA_VERSION
from ._sql_store import SqlStore
from ._store_records import StoreError
from ._store_sql import GroupRows, redact

__all__ = ["CHANNEL", "SCHEMA_VERSION", "PostgresStore"]

#: The ``NOTIFY`` channel of pending-step changes.
CHANNEL = "otp_matching_pending"
#: The advisory lock migrations run under (any constant; this one spells "otpm").
_MIGRATION_LOCK = 0x6F74706D
#: How long a ``wait_pending`` listens before looking at this store's own wake-ups again.
_LISTEN_SLICE = 0.5


@functools.lru_cache(maxsize=256)
def _pg(sql: str) -> str:
    return sql.replace("?", "%s")  # (the shared SQL has no other ? and no %)


def _nul(value: Any) -> bool:
    return type(value) is str and "\x00" in value


class _PgConnection:
    """A psycopg connection with sqlite3's ``execute``/``executemany`` and ``?`` parameters."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Any = None) -> psycopg.Cursor[Any]:
        if params and sql.startswith("SELECT") and any(_nul(p) for p in params):
            # PostgreSQL's text cannot hold a NUL character (no stored one does: writes refuse
            # them): a read naming one finds no row, as it does on SQLite, not an error.
            return self.raw.execute("SELECT 1 WHERE false")
        return self.raw.execute(_pg(sql), params)

    def executemany(self, sql: str, rows: Any) -> None:
        with self.raw.cursor() as cursor:
            cursor.executemany(_pg(sql), rows)

    def close(self) -> None:
        self.raw.close()


class PostgresStore(SqlStore):
    """A :class:`~apps.matching._store.Store` on PostgreSQL.

    Args:
        url: A libpq connection URL, ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE``
            (query parameters as libpq takes them, e.g. ``?sslmode=require``).
        connect_timeout: Seconds a connection attempt may take.
        threads: Run each psycopg call in a worker thread (of trio's cache), the default,
            so the trio loop never waits for the network. ``False`` runs them on trio's own
            thread, after a checkpoint: for tests on ``trio.testing.MockClock`` only, whose
            autojump would otherwise jump (and fire every timer early) while the database
            worked; it stalls every other task for each round trip.

    One connection serves every call, one at a time, each in a worker thread; a second one
    listens for other servers' ``NOTIFY``. A call waiting for the connection is cancellable;
    a call running in its thread finishes its transaction first.
    """

    _BEGIN: ClassVar[str] = "BEGIN"
    _CLAIM_LOCK: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    _ROW_LOCK: ClassVar[str] = " FOR UPDATE"
    _SHARED: ClassVar[bool] = True
    _GROUPS: ClassVar[bool] = True
    _INTEGRITY = psycopg.errors.IntegrityError
    _DB_ERRORS = psycopg.Error

    def __init__(self, url: str, *, connect_timeout: float = 10.0, threads: bool = True) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise TypeError(
                f"PostgresStore.url must be a postgresql:// URL (got {redact(str(url))!r})"
            )
        super().__init__(threads=threads)
        self.url = url
        self.connect_timeout = connect_timeout
        self._listen: psycopg.Connection[Any] | None = None
        self._listening = trio.Lock()
        #: The payload of this store's own NOTIFYs (its commits wake its waiters directly).
        self._origin = uuid.uuid4().hex

    def __repr__(self) -> str:
        if not self.threads:
            return f"PostgresStore({redact(self.url)!r}, threads=False)"
        return f"PostgresStore({redact(self.url)!r})"

    # -- connecting and migrating ----------------------------------------------------------------

    def _dial(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, round(self.connect_timeout))
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"{self!r}: cannot connect to the database: {str(exc).strip()}; check the URL,"
                " that the server runs and that it accepts this user"
            ) from exc

    def _connect(self) -> _PgConnection:
        conn = _PgConnection(self._dial())
        try:
            self._migrate(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"{self!r}: cannot open the database: {exc}") from exc
            raise
        return conn

    def _migrate(self, conn: _PgConnection) -> None:
        with self._transaction(conn):
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations"
                " (version BIGINT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            current = self._schema_version(conn, SCHEMA_VERSION)
            for version, statements in MIGRATIONS:
                if version > current:
                    self._migrate_to(conn, version, statements)

    def _in_transaction(self, conn: _PgConnection) -> bool:
        return conn.raw.info.transaction_status != TransactionStatus.IDLE

    async def open(self) -> None:
        """As :meth:`Store.open`; also starts listening on :data:`CHANNEL`."""
        await super().open()
        async with self._listening:
            if self._listen is None:
                self._listen = await self._call(self._open_listener)

    def _open_listener(self) -> psycopg.Connection[Any]:
        listen = self._dial()
        try:
            listen.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            listen.close()
            raise StoreError(f"{self!r}: cannot LISTEN on {CHANNEL}: {exc}") from exc
        return listen

    async def close(self) -> None:
        """As :meth:`Store.close` (both connections)."""
        await super().close()
        if not self.threads:
            # (a waiter for the listening socket holds _listening: this wakes it, it lets go)
            changed, self._changed = self._changed, trio.Event()
            changed.set()
        async with self._listening:
            listen, self._listen = self._listen, None
            if listen is not None:
                await self._call(listen.close)

    # -- group commits ---------------------------------------------------------------------------

    def _commit_group(self, conn: Any, rows: GroupRows, free: bool) -> bool:
        """As ``SqlStore._commit_group``: ``BEGIN``, the rows (one statement per table,
        ``_postgres_batches``) and the ``NOTIFY`` in one round trip, then ``COMMIT``."""
        try:
            try:
                applied = apply_rows(conn.raw, rows, (CHANNEL, self._origin) if free else None)
            except psycopg.errors.IntegrityError:
                applied = False  # (one batch names a missing flow: the batches tell which)
            conn.execute("COMMIT" if applied else "ROLLBACK")
        except psycopg.Error:
            if not conn.raw.closed and self._in_transaction(conn):
                conn.execute("ROLLBACK")
            raise
        return applied

    # -- pending-step wake-ups -------------------------------------------------------------------

    def _notify_pending(self, conn: _PgConnection) -> None:
        conn.execute("SELECT pg_notify(?, ?)", (CHANNEL, self._origin))  # (sent at COMMIT)

    async def wait_pending(self, seen: int) -> int:
        """As :meth:`Store.wait_pending`: woken by this store's commits and by any server's
        ``NOTIFY`` on :data:`CHANNEL` (heard within ``_LISTEN_SLICE`` seconds; without threads,
        when it reaches the listening socket)."""
        if self._generation > seen:
            await trio.lowlevel.checkpoint()
        while self._generation <= seen:
            if self._listening.locked() or self._listen is None:
                await self._changed.wait()  # (another waiter listens, and wakes us)
                continue
            async with self._listening:
                listen = self._listen
                if listen is None or self._generation > seen:
                    continue
                if self.threads:
                    heard = await trio.to_thread.run_sync(_hear, listen, _LISTEN_SLICE)
                else:
                    heard = await self._hear_here(listen)
            if any(origin != self._origin for origin in heard):
                self._wake()  # (another server's; our own commits woke us already)
        return self._generation

    async def _hear_here(self, listen: psycopg.Connection[Any]) -> list[str]:
        """(``threads=False``.) What came on ``listen`` once its socket turns readable or this
        store's own commits wake it (never blocking trio's thread for the network)."""
        woken = self._changed
        async with trio.open_nursery() as nursery:

            async def readable() -> None:
                await trio.lowlevel.wait_readable(listen.fileno())
                nursery.cancel_scope.cancel()

            nursery.start_soon(readable)
            await woken.wait()
            nursery.cancel_scope.cancel()
        return [] if listen.closed else _hear(listen, 0)


def _hear(listen: psycopg.Connection[Any], timeout: float) -> list[str]:
    """The payloads of the notifications that came within ``timeout`` seconds (returning at
    the first); with 0, of every one that has come, without waiting."""
    try:
        came = listen.notifies(timeout=timeout, stop_after=1 if timeout else None)
        return [n.payload for n in came]
    except psycopg.Error as exc:
        raise StoreError(f"listening on {CHANNEL} failed: {exc}") from exc
