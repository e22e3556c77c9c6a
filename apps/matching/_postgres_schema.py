"""``PostgresStore``'s schema: ``SqliteStore``'s migrations (``_sqlite_schema.MIGRATIONS``) in
PostgreSQL's types, so the two stores cannot drift apart (the same tables, columns, keys and
indexes, version for version).

The translation is by column type: ``INTEGER PRIMARY KEY`` (SQLite's rowid) becomes an
identity column, ``INTEGER`` ``BIGINT``, ``REAL`` ``DOUBLE PRECISION``, ``BLOB`` ``BYTEA``, and
``TEXT`` ``TEXT COLLATE "C"``: text compares and sorts by code point, as SQLite's ``BINARY``
does (and Python's ``sorted``), whatever the database's own collation (en_US, say, puts "a"
before "B" and skips punctuation: claims would go in another order on each store). A table
``WITHOUT ROWID`` (SQLite's, keyed by its primary key alone) is an ordinary table: every
PostgreSQL table is a heap beside its key's index. Everything else in the DDL is standard SQL
both accept.
"""

from __future__ import annotations

import re

from ._sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from ._sqlite_schema import SCHEMA_VERSION

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "to_postgres"]

_TYPES = (
    (re.compile(r"\bINTEGER PRIMARY KEY\b"), "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
    (re.compile(r"\)\s*WITHOUT ROWID$"), ")"),
)


def to_postgres(statement: str) -> str:
    """One of SQLite's DDL statements in PostgreSQL's types."""
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    return statement


#: ``(version, statements)``, applied in order, each version in one transaction.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = tuple(
    (version, tuple(to_postgres(s) for s in statements))
    for version, statements in SQLITE_MIGRATIONS
)
