"""Real OS processes for the matching server's benchmarks and its tests: a throwaway PostgreSQL
server, ``python -m otp.node --app apps.matching`` command lines (one server, or several as one
cluster on one database) and the pull-worker program's main loop.

One place for what ``benchmarks/bench_matching.py`` and the tests under
``tests/test_apps/test_matching`` (``postgres_server.py``, the chaos run) both start, so the
benchmark measures the processes the tests check. Each user owns the lifetime: the benchmark
runs them as ``subprocess.Popen`` children, the chaos test as port children of an otp
supervisor (``benchmarks/_programs.py``). Nothing here imports pytest, nor otp: a worker
program imports this module, and pays for the SDK alone. A missing PostgreSQL is
:class:`PostgresMissing`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

__all__ = [
    "ROOT",
    "MatchingNode",
    "PostgresMissing",
    "PostgresServer",
    "cluster",
    "cluster_missing",
    "free_port",
    "process_env",
    "serve_worker",
]

#: The repository's root (what ``PYTHONPATH`` names for the processes started here).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PostgresMissing(RuntimeError):
    """PostgreSQL's server programs (``initdb``, ``postgres``) are not installed here."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 free at the time of asking."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_env(*paths: str) -> dict[str, str]:
    """This process's environment with ``paths`` and :data:`ROOT` first on ``PYTHONPATH`` and
    unbuffered output (a SIGKILLed program has written every line it printed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, ROOT])
    env["PYTHONUNBUFFERED"] = "1"
    return env


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


class PostgresServer:
    """A real PostgreSQL server: a throwaway data directory, a free loopback port, run as a
    non-root user (``postgres`` when this process is root, as on CI), ``fsync=off`` (the data
    is thrown away: what is measured and tested is the protocol and the locking, not the disk).

    ``start()`` it (or ``with``), ``url()`` for a fresh schema in it, ``stop()``.
    """

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
        """Start the server and wait until it accepts connections.

        Raises:
            PostgresMissing: The server programs are not installed (nothing was started).
            RuntimeError: The server did not start within 30 s (its log's tail says why).
        """
        if self.bin is None:
            raise PostgresMissing(
                "PostgreSQL's server programs (initdb, postgres) are not installed: install"
                " Debian's postgresql package (apt-get install postgresql)"
            )
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
        self.port = free_port()
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
        server stops (prefer :meth:`schema`)."""
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
                # A connection left inside a transaction holds a lock on the schema: end
                # every other session (the tests run one at a time), then drop it.
                self._admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
                self._admin.execute(f"DROP SCHEMA {schema} CASCADE")

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 30 s) and remove its data directory."""
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

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@attrs.frozen
class MatchingNode:
    """One matching server's command line (``python -m otp.node --app apps.matching``), as
    the README's "several servers on PostgreSQL" runs it.

    Attributes:
        address: Where its workers and clients connect (``unix:PATH``).
        store: ``--store``: a SQLite path or a ``postgresql://`` URL.
        name: The distributed node's name (``m1@127.0.0.1``), None for a node not distributed.
        listen: Its distribution address (``tcp:127.0.0.1:PORT``), with ``name``.
        cookie_file: The cluster's cookie file (mode 0600), with ``name``.
        log_level: ``--log-level``.
        extra: More arguments, last.
    """

    address: str
    store: str
    name: str | None = None
    listen: str | None = None
    cookie_file: str | None = None
    log_level: str = "warning"
    extra: tuple[str, ...] = ()

    @property
    def socket_path(self) -> str:
        """The Unix socket file of :attr:`address` (it exists once the server listens)."""
        return self.address.removeprefix("unix:")

    def args(self) -> list[str]:
        """The arguments after ``python -m otp.node``."""
        args = ["--log-level", self.log_level, "--app", "apps.matching"]
        if self.name is not None:
            args += ["--name", self.name]
            if self.listen is not None:
                args += ["--listen", self.listen, "--insecure-tcp"]
            if self.cookie_file is not None:
                args += ["--cookie-file", self.cookie_file]
        args += ["--store", self.store, "--matching-listen", self.address, *self.extra]
        return args

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "otp.node", *self.args()]


def cluster(
    tmp: str, store: str, count: int, *, log_level: str = "warning", extra: Sequence[str] = ()
) -> list[MatchingNode]:
    """``count`` servers on one ``store`` as one cluster: distributed nodes ``m1@127.0.0.1``,
    ... on free loopback ports with one cookie (written to ``tmp/cookie``), each with its own
    Unix socket in ``tmp`` for workers and clients."""
    cookie = os.path.join(tmp, "cookie")
    if not os.path.exists(cookie):
        fd = os.open(cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(uuid.uuid4().hex + "\n")
    return [
        MatchingNode(
            address=f"unix:{os.path.join(tmp, f'm{i}.sock')}",
            store=store,
            name=f"m{i}@127.0.0.1",
            listen=f"tcp:127.0.0.1:{free_port()}",
            cookie_file=cookie,
            log_level=log_level,
            extra=tuple(extra),
        )
        for i in range(1, count + 1)
    ]


def cluster_missing() -> str | None:
    """Why this tree cannot run several matching servers as one cluster yet, or None once it
    can: the cluster parts of issue 20 (MULTISERVER.md) are ownership by leases (part A,
    ``EngineOptions.server_id``), discovery and forwarding (part B, the store's ``servers``
    table: ``Store.register_server``) and dispatch across servers (part C, the matcher's
    ``pg`` groups: ``_matcher_remote``)."""
    import importlib.util

    from apps.matching import _engine_state, _store

    missing = []
    if "server_id" not in attrs.fields_dict(_engine_state.EngineOptions):
        missing.append("ownership by leases (EngineOptions.server_id, part A)")
    if not hasattr(_store.Store, "register_server"):
        missing.append("discovery and forwarding (Store.register_server, part B)")
    if importlib.util.find_spec("apps.matching._matcher_remote") is None:
        missing.append("dispatch across servers (apps.matching._matcher_remote, part C)")
    if not missing:
        return None
    return (
        "several matching servers cannot run as one cluster yet: this tree lacks "
        + "; ".join(missing)
        + " (MULTISERVER.md; the lead enables this once the match-leases, match-cluster and"
        " match-remote branches are merged)"
    )


def serve_worker(
    registry: Any, address: str, slots: int, *, blobs: str | None = None, give_up: float = 0.0
) -> None:
    """The worker program's main: a blocking pull worker serving ``registry`` with ``slots``
    slots on ``address``; prints ``ready`` once registered and runs until its stdin closes.

    With ``give_up`` > 0 the program also exits (status 3) once it has had no registered
    stream for that many seconds: the server it dials is gone, and whoever supervises the
    program restarts it on a live one (as a liveness probe gets a pod restarted).
    """
    from apps.matching import BlobCache, PullWorkerOptions, Worker, WorkerOptions

    worker = Worker(
        registry,
        BlobCache(blobs) if blobs is not None else None,
        WorkerOptions(
            server_address=address,
            pull=PullWorkerOptions(max_concurrent_tasks=slots, stop_drain_timeout=1),
        ),
    )
    closed = threading.Event()

    def read_stdin() -> None:
        sys.stdin.read()
        closed.set()

    try:
        worker.start_background()
        worker.wait_pull_registered(timeout=30)
        print("ready", flush=True)
        threading.Thread(target=read_stdin, daemon=True).start()
        registered_at = time.monotonic()
        while not closed.wait(0.2 if give_up > 0 else None):
            queues = worker.pull_registration_state().queues.values()
            if any(q.has_registered_stream for q in queues):
                registered_at = time.monotonic()
            elif time.monotonic() - registered_at > give_up:
                print(f"worker: no stream registered on {address} for {give_up} s", file=sys.stderr)
                os._exit(3)
    finally:
        worker.close()
