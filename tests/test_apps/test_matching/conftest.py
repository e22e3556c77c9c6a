"""Fixtures the matching tests share: a real PostgreSQL server (``postgres_server.py``), one
per test session, started on first use; ``store_kind``, which runs a test once on each kind
of store (SQLite, then PostgreSQL in a schema of its own); and ``fake_server``, the in-test
matching server (``fake_matching_server.py``) in a thread of its own on a Unix socket."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.matching._blobs import BlobCache

from ._stores import StoreKind
from .fake_matching_server import FakeServer, ThreadedFakeServer
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


# -- the in-test matching server in a thread of its own (for blocking and asyncio clients) --


@pytest.fixture
def fake_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="mc-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def threaded_fake(fake_dir) -> Iterator[ThreadedFakeServer]:
    threaded = ThreadedFakeServer(
        os.path.join(fake_dir, "s.sock"), BlobCache(os.path.join(fake_dir, "sb"))
    )
    with threaded:
        yield threaded


@pytest.fixture
def fake_server(threaded_fake) -> FakeServer:
    return threaded_fake.server
