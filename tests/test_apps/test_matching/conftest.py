"""Fixtures the matching tests share: a real PostgreSQL server (``postgres_server.py``), one
per test session, started on first use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
