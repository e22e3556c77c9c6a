"""``SqliteStore``: the matching server's embedded :class:`Store`, on the stdlib's sqlite3.

One connection, used by one thread at a time (trio's thread cache, behind a lock; trio's own
for group commits of up to ``INLINE_RECORDS`` records, ``SqlStore.commit_soon``); files run in
WAL mode with ``synchronous=NORMAL``, checkpointed on a connection of their own, off the commit
path (``_sqlite_checkpoints``); values are wire CBOR in BLOB columns (never pickle). The
schema, in ``_sqlite_schema``, is versioned in ``schema_migrations`` as Django's and Alembic's
are, applied in order, and a database newer than the code is refused; the rows and batches it
shares with PostgreSQL are in ``_store_sql``. A group commit goes in one statement per table
(``_sqlite_batches``) when its batches allow it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, ClassVar, cast

from ._sql_store import SqlStore
from ._sqlite_batches import apply_rows
from ._sqlite_checkpoints import WRITER_CHECKPOINT_PAGES, WalCheckpoints
from ._sqlite_schema import MIGRATIONS, SCHEMA_VERSION
from ._store_records import StoreError
from ._store_sql import GroupRows

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

# Binding None, ``sqlite3`` looks for an adapter first (None is not one of the types it binds
# without one), and failing, formats an ``AttributeError`` and drops it: ~2 us a value, and a
# Step binds several (a dispatch record's worker, a new flow's sticky worker). Registered, the
# adapter is found at once and gives None back, which binds NULL as before. ``{}.get``: one
# C call that returns None. (The registry is the process's: any connection binds None as
# NULL, as it did.)
sqlite3.register_adapter(type(None), cast("Callable[[None], None]", {}.get))

#: Prepared statements the connection keeps (the default, 128, is near what it uses: the
#: group path's are up to eleven sizes of six, ``_sqlite_batches``, and preparing one costs
#: several times running it).
_STATEMENTS = 256

#: The most records a threaded store's group commits on trio's own thread, busy or idle
#: (``SqlStore.commit_soon``; measured in ARCHITECTURE.md, "Durability and delivery"): a lone
#: Step's batches hold 2 (its flow's start) and 5 (its end); a loaded server's, ~80 at the
#: median and ~200 at the 99th percentile with 64 flows in flight, ~800 with 256, ~11 us a
#: record on this machine. A larger group (a burst) goes to a thread: no one transaction
#: holds the loop much past ~10 ms.
INLINE_RECORDS = 1024


class SqliteStore(SqlStore):
    """A :class:`~apps.matching._store.Store` on SQLite.

    Args:
        path: A file path, or ``":memory:"`` for a private in-memory database (tests).
        threads: Run each sqlite call in a worker thread (of trio's cache), the default, so
            the trio loop never blocks on the disk. ``False`` runs them on trio's own thread,
            after a checkpoint: for tests on ``trio.testing.MockClock``, whose autojump would
            otherwise jump (and fire every timer early) while a worker thread ran.

    One connection serves every call, one at a time, each in a worker thread (but for group
    commits of up to ``INLINE_RECORDS`` records, ``SqlStore.commit_soon``); a call waiting for
    the connection is cancellable, a call running in its thread finishes its transaction first
    (cancellation then takes effect at the caller's next checkpoint).
    """

    _BEGIN: ClassVar[str] = "BEGIN IMMEDIATE"
    _INTEGRITY = sqlite3.IntegrityError
    _DB_ERRORS = sqlite3.Error
    #: (The group path is as tested, on SQLite 3.33 and later: an older one goes one by one.)
    _GROUPS = sqlite3.sqlite_version_info >= (3, 33, 0)
    #: (``SqlStore.commit_soon``: a group of up to that many commits on trio's thread.)
    _INLINE_RECORDS = INLINE_RECORDS

    def __init__(self, path: str, *, threads: bool = True) -> None:
        if not isinstance(path, str) or not path:
            raise TypeError(f'SqliteStore.path must be a file path or ":memory:" (got {path!r})')
        super().__init__(threads=threads)
        self.path = path
        #: The WAL's checkpoints off the commit path (a file's, with threads), while open.
        self._checkpoints: WalCheckpoints | None = None

    def __repr__(self) -> str:
        if not self.threads:
            return f"SqliteStore({self.path!r}, threads=False)"
        return f"SqliteStore({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=_STATEMENTS,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self!r}: cannot open the database: {exc}") from exc
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA busy_timeout = 5000")
            # (A statement of many rows keeps a journal of its own, to undo itself alone; in
            # memory, not a temp file's writes: the group path's statements are such.)
            conn.execute("PRAGMA temp_store = MEMORY")
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            if self.path != ":memory:" and self.threads:
                # (WalCheckpoints runs them; a COMMIT only past WRITER_CHECKPOINT_PAGES, which
                # restarts the WAL. Without threads, as in tests on MockClock, SQLite's own
                # run as before.)
                conn.execute(f"PRAGMA wal_autocheckpoint = {WRITER_CHECKPOINT_PAGES}")
                self._checkpoints = WalCheckpoints(self.path)
            self._migrate(conn)
        except BaseException as exc:
            conn.close()
            self._checkpoints = None
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"{self!r}: cannot open the database: {exc}") from exc
            raise
        return conn

    def _disconnect(self, conn: Any) -> None:
        conn.close()
        checkpoints, self._checkpoints = self._checkpoints, None
        if checkpoints is not None:
            checkpoints.close()

    def _committed(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.committed()

    def _write_rows(self, conn: Any, rows: GroupRows) -> bool:
        """As ``SqlStore._write_rows``, one statement per table (``_sqlite_batches``)."""
        return apply_rows(conn, rows)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        current = self._schema_version(conn, SCHEMA_VERSION)
        for version, statements in MIGRATIONS:
            if version <= current:
                continue
            with self._transaction(conn):
                self._migrate_to(conn, version, statements)
