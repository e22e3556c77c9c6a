"""The store a matching test runs on: ``StoreKind``, what the ``store_kind`` fixture
(``conftest.py``) gives each test, once per kind of store (SQLite, then PostgreSQL)."""

from __future__ import annotations

import sqlite3
from typing import Any

import attrs

from apps.matching._postgres_store import PostgresStore
from apps.matching._sqlite_store import SqliteStore

__all__ = ["StoreKind"]


@attrs.frozen
class StoreKind:
    """One kind of store, for one test.

    Attributes:
        name: ``"sqlite"`` or ``"postgresql"`` (the test's id says which).
        location: What ``MatchingConfig.store`` names: ``":memory:"`` for SQLite (every store
            opened on it is a new, empty one), or the URL of the test's own PostgreSQL schema
            (made for the test, dropped after it).
        durable: A location whose data outlives a store closed and opened again (a file in
            the test's temporary directory, or the same URL).
    """

    name: str
    location: str
    durable: str

    def store(self, location: str | None = None, *, threads: bool = False) -> Any:
        """A new store (not yet open) on ``location`` (default: :attr:`location`). Its calls
        run on trio's own thread unless ``threads``, so tests on trio's MockClock run the
        same on both kinds."""
        where = self.location if location is None else location
        if self.name == "postgresql":
            return PostgresStore(where, threads=threads)
        return SqliteStore(where, threads=threads)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """``sql`` run on :attr:`durable`'s database with the kind's own driver, outside any
        store (the rows it returns, if any)."""
        if self.name == "sqlite":
            with sqlite3.connect(self.durable) as conn:
                return conn.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(self.durable, autocommit=True) as pg:
            cursor = pg.execute(sql)
            return cursor.fetchall() if cursor.description else []
