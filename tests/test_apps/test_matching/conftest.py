"""Fixtures the matching tests share: a real PostgreSQL server (``postgres_server.py``), one
per test session, started on first use; and ``store_kind``, which runs a test once on each kind
of store (SQLite, then PostgreSQL in a schema of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._stores import StoreKind
from .postgres_server import PostgresServer


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server (skipped, or failed on CI, when none is installed)."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKind]:
    """The store a test runs on, once of each kind: every behaviour of a store, of the engine
    over it and of a whole server must be the same on both (issue 20). PostgreSQL's is a new,
    empty schema of the session's server, dropped after the test."""
    if request.param == "sqlite":
        yield StoreKind("sqlite", ":memory:", str(tmp_path / "store.sqlite3"))
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    with server.schema() as url:
        yield StoreKind("postgresql", url, url)
