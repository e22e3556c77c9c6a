"""A real PostgreSQL server for the tests: a throwaway data directory (in ``/dev/shm`` where
there is one), a free loopback port, run as a non-root user (``postgres`` when the tests run as
root, as on CI).

``.ci/run`` installs Debian's ``postgresql`` package and sets ``OTP_REQUIRE_POSTGRES=1``, so
there a missing server is a failure; elsewhere the PostgreSQL tests are skipped, saying how to
run them (README: "Every matching test that reaches a store runs twice").
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

REQUIRED = os.environ.get("OTP_REQUIRE_POSTGRES") == "1"


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _in_memory() -> str | None:
    """``/dev/shm`` if it is a writable tmpfs with room for a data directory (a container's
    64 MiB has not), else None (the temporary directory): each test's schema is made (its
    tables' files created) anew, which takes a third of the time there it takes on a disk."""
    shm = "/dev/shm"
    if not os.access(shm, os.W_OK | os.X_OK):
        return None
    return shm if shutil.disk_usage(shm).free >= 1 << 30 else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """``start()`` an initdb'd server; ``with schema() as url`` for a fresh schema in it,
    dropped after; ``stop()``."""

    def __init__(self) -> None:
        self.bin = _binaries()
        self.tmp = ""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._admin: Any = None  # (the connection that makes and drops the schemas)

    def _as_owner(self, *args: str) -> list[str]:
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def start(self) -> None:
        if self.bin is None:
            message = (
                "PostgreSQL's server programs (initdb, postgres) are not installed: install"
                " Debian's postgresql package (apt-get install postgresql) to run these tests"
            )
            if REQUIRED:
                pytest.fail(message)
            pytest.skip(message)
        self.tmp = tempfile.mkdtemp(prefix="otp-pg-", dir=_in_memory())
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres")
        data = os.path.join(self.tmp, "data")
        subprocess.run(
            self._as_owner(
                f"{self.bin}/initdb", "-D", data, "-A", "trust", "-U", "otp", "-E", "UTF8",
                "--no-sync", "--no-instructions", *self._linguistic_collation(),
            ),
            check=True, capture_output=True,
        )  # fmt: skip
        self.port = _free_port()
        with open(os.path.join(self.tmp, "server.log"), "wb") as log:
            self.proc = subprocess.Popen(
                self._as_owner(
                    f"{self.bin}/postgres", "-D", data, "-p", str(self.port), "-k", self.tmp,
                    "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                    "-c", "max_connections=200",
                ),
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            ready = subprocess.run(
                [f"{self.bin}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                check=False,
            )
            if ready.returncode == 0:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(self.tmp, "server.log"), errors="replace") as f:
                    raise RuntimeError(f"PostgreSQL did not start: {f.read()[-2000:]}")
            time.sleep(0.05)

    def _linguistic_collation(self) -> list[str]:
        """initdb's options for a database whose text sorts as people's languages do (ICU's
        en-US: "a" before "B"), as production databases made in an en_US.UTF-8 locale do,
        so a store that sorted by the database's collation would differ from SQLite's code
        point order here too; none before PostgreSQL 15 (no ICU default provider)."""
        usage = subprocess.run(
            [f"{self.bin}/initdb", "--help"], check=False, capture_output=True, text=True
        ).stdout
        if "--locale-provider" not in usage:
            return []
        return ["--locale-provider=icu", "--icu-locale=en-US"]

    @property
    def base_url(self) -> str:
        return f"postgresql://otp@127.0.0.1:{self.port}/postgres"

    def url(self) -> str:
        """A URL whose connections work in a new, empty schema of their own, kept until the
        server stops (prefer :meth:`schema`, or the ``store_kind`` fixture)."""
        return self._new_schema()[1]

    def _new_schema(self) -> tuple[str, str]:
        import psycopg

        if self._admin is None:
            self._admin = psycopg.connect(self.base_url, autocommit=True)
            self._admin.execute("SET lock_timeout = '10s'")
        schema = f"t_{uuid.uuid4().hex[:12]}"
        self._admin.execute(f"CREATE SCHEMA {schema}")
        return schema, f"{self.base_url}?options=-csearch_path%3D{schema}"

    @contextlib.contextmanager
    def schema(self) -> Iterator[str]:
        """A URL whose connections work in a new, empty schema of their own, dropped after
        (with what is in it)."""
        import psycopg

        schema, url = self._new_schema()
        try:
            yield url
        finally:
            try:
                self._admin.execute(f"DROP SCHEMA {schema} CASCADE")
            except psycopg.errors.LockNotAvailable:
                # A connection the test left inside a transaction holds a lock on the schema:
                # end every other session (the tests run one at a time), then drop it.
                self._admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
                self._admin.execute(f"DROP SCHEMA {schema} CASCADE")

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # (SIGTERM: PostgreSQL's "smart" shutdown)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
