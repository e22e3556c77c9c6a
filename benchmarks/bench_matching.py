"""Matching server benchmarks: a real server (``python -m otp.node --app apps.matching``, its
own OS process, durable SQLite store in a temp file) with pull workers in OS processes of their
own, called by our SDK client from this process; each figure against the no-work floor of the
same shape measured in the same run.

``matching.rpc_latency``: p50 of an RPC round trip (client -> server -> one worker process with
an empty sync handler -> back), 1 caller. ``matching.step_latency``: p50 of ``start_flow`` +
``result`` of a one-Step flow (empty Step), 1 caller. Both against the floor of that shape:
a bare socket round trip from this process through a raw trio relay process (the server's place
in the data path, doing nothing but forwarding) to an echo process (a worker costing nothing)
and back. ``matching.steps_per_s``: Steps/s of a one-Step flow with 4 worker processes x 8
slots and 64 flows in flight from one trio client, against the floor's round trips/s with 64
bare callers through the relay to 4 echo processes. ``matching.cpu_per_step``: the CPU every
process (server, workers, client) spent per Step during that run, against the CPU the floor's
processes spent per round trip: on a machine of N cores, N / that total bounds Steps/s; its
notes give the server's trio wake-ups per Step (counted inside the server as bench_dirty counts
its node's).

``matching.*_design``: Steps/s, CPU per Step and the Step's p50 against the floor of this
design's own shape with durable state (:func:`_step_relay`, :func:`_step_echo`): each caller's
START and WAIT records go through a raw trio relay that group-commits every START and every
worker RESULT to SQLite (as the store does) before it answers, to echo processes that answer
each TASK with ACCEPT and RESULT. No actor, frame, routing or SDK code runs, so nothing built in
this shape can beat it: the gap is what our Python above that minimum costs.

The floor helpers (``_floor_echo``, ``_floor_forwarder``, ``_start_helper``) are bench_dirty's.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from apps.matching import Flow, rpc, step

from ._harness import Benchmark, Result
from ._matching_processes import (
    MatchingNode,
    PostgresMissing,
    PostgresServer,
    cluster,
    cluster_missing,
    process_env,
    serve_worker,
)
from .bench_dirty import _COUNT_ON, _RECORD, _descendants, _signal_node, _start_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Flows in flight at once for ``matching.steps_per_s`` (and bare callers of its floor).
CONCURRENCY = 64
#: Worker processes and slots each for ``matching.steps_per_s``.
WORKERS = 4
SLOTS = 8


class BenchFlow(Flow):
    """One empty Step and one empty RPC: what the benchmarks run and call."""

    name = "bench_matching"

    @step
    def work(self, ctx: Any, n: object = None) -> object:
        return n

    @rpc
    def ping(self, ctx: Any, *args: object) -> object:
        return None


# --- the no-work floor (raw sockets, separate OS processes) -------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by ``pids`` (Linux ``/proc``; 0.0 elsewhere),
    plus this process's own when 0 is among them."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    for pid in pids:
        if pid == 0:
            mine = os.times()
            total += mine.user + mine.system
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _start_helpers(
    calls: list[tuple[str, ...]], module: str = "benchmarks.bench_dirty"
) -> list[subprocess.Popen[bytes]]:
    """bench_dirty's ``_start_helper`` for several helpers (functions of ``module``) at once
    (started in parallel)."""
    procs: list[subprocess.Popen[bytes]] = []
    for function, *args in calls:
        code = f"from {module} import {function}; {function}(*{tuple(args)!r})"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=dict(os.environ, PYTHONPATH=ROOT),
                stdout=subprocess.PIPE,
            )
        )
    try:
        for proc, (function, *_) in zip(procs, calls, strict=True):
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"bench_matching: {function} did not start")
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    return procs


class _Floor:
    """A raw trio relay process (bench_dirty's ``_floor_forwarder``) in front of ``echoes``
    echo processes (``_floor_echo``), all in OS processes of their own; stopped on exit."""

    def __init__(self, echoes: int) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-matching-floor-")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.echoes = [os.path.join(self.tmp, f"echo{i}.sock") for i in range(echoes)]
        self.path = os.path.join(self.tmp, "relay.sock")

    def __enter__(self) -> _Floor:
        try:
            self.procs = _start_helpers([("_floor_echo", echo) for echo in self.echoes])
            self.procs.append(_start_helper("_floor_forwarder", self.path, *self.echoes))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def connect(self) -> tuple[socket.socket, bytes]:
        """A caller's socket and its record (first byte: the index the relay gave it)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        return sock, sock.recv(1) + b"x" * (_RECORD - 1)


def _floor_latency(floor: _Floor, quick: bool) -> list[float]:
    """Round trips (s) of one bare caller: this process -> relay -> an echo -> relay -> back."""
    n = 1000 if quick else 5000
    sock, record = floor.connect()
    try:
        times = []
        for i in range(200 + n):
            t0 = time.perf_counter()
            sock.sendall(record)
            got = 0
            while got < _RECORD:
                got += len(sock.recv(1 << 16))
            if i >= 200:
                times.append(time.perf_counter() - t0)
        return times
    finally:
        sock.close()


def _floor_throughput(floor: _Floor, quick: bool) -> tuple[float, float]:
    """Round trips/s of ``CONCURRENCY`` bare callers (one epoll loop in this process driving
    that many sockets, each with one record in flight) through the relay to ``WORKERS`` echo
    processes: what the server, with 4 workers behind it, could reach doing no work at all;
    and the CPU seconds all those processes spent per round trip."""
    socks = [floor.connect() for _ in range(CONCURRENCY)]
    poll = select.epoll()
    try:
        received: dict[int, int] = {}
        by_fd: dict[int, tuple[socket.socket, bytes]] = {}
        for sock, record in socks:
            sock.setblocking(False)
            by_fd[sock.fileno()] = (sock, record)
            received[sock.fileno()] = 0
            poll.register(sock.fileno(), select.EPOLLIN)

        def drive(seconds: float) -> int:
            done = 0
            for sock, record in socks:
                sock.send(record)
            end = time.monotonic() + seconds
            pending = len(socks)
            while pending:
                events = poll.poll(5.0)
                if not events:
                    raise RuntimeError("bench_matching: the floor's relay stopped answering")
                for fd, _ in events:
                    sock, record = by_fd[fd]
                    received[fd] += len(sock.recv(1 << 16))
                    while received[fd] >= _RECORD:
                        received[fd] -= _RECORD
                        done += 1
                        if time.monotonic() < end:
                            sock.send(record)
                        else:
                            pending -= 1
            return done

        drive(0.2)  # warm up
        pids = [0, *(proc.pid for proc in floor.procs)]
        cpu0, t0 = _cpu_seconds(pids), time.perf_counter()
        done = drive(1.0 if quick else 4.0)
        elapsed, cpu = time.perf_counter() - t0, _cpu_seconds(pids) - cpu0
        return done / elapsed, cpu / max(done, 1)
    finally:
        poll.close()
        for sock, _ in socks:
            sock.close()


# --- the design's floor: a Step's exchange through raw processes, with its commits -------------

#: Record kinds of the Step floor (a record's second byte; its first names the caller).
_START, _STARTED, _WAIT, _DONE, _TASK, _ACCEPT, _RESULT = b"SsWdTAR"


def _step_echo(path: str) -> None:
    """(Its own process.) The least a worker does for a Step: each TASK record read is answered
    with an ACCEPT record and then a RESULT record (two writes, as a worker accepts before it
    runs the handler), from a plain epoll loop."""
    import select

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    poll = select.epoll()
    poll.register(server.fileno(), select.EPOLLIN)
    conns: dict[int, tuple[socket.socket, bytearray]] = {}
    print("ready", flush=True)
    while True:
        for fd, _ in poll.poll():
            if fd == server.fileno():
                conn, _ = server.accept()
                conns[conn.fileno()] = (conn, bytearray())
                poll.register(conn.fileno(), select.EPOLLIN)
                continue
            conn, pending = conns[fd]
            data = conn.recv(1 << 16)
            if not data:
                poll.unregister(fd)
                conns.pop(fd)[0].close()
                continue
            pending += data
            while len(pending) >= _RECORD:
                record = bytes(pending[:_RECORD])
                del pending[:_RECORD]
                conn.sendall(bytes([record[0], _ACCEPT]) + record[2:])
                conn.sendall(bytes([record[0], _RESULT]) + record[2:])


def _step_relay(path: str, db: str, *upstream_paths: str) -> None:
    """(Its own process.) The least this design's server does for a Step, in raw trio with no
    actors, frames or routing: a caller's START is committed (a SQLite row, WAL,
    ``synchronous=NORMAL`` as the store) before it is answered STARTED and its TASK goes to the
    next worker (round-robin); the worker's RESULT is committed (the row updated) before the
    caller's WAIT is answered DONE. The commits of everything that arrived meanwhile go as one
    transaction each way (group commit, on trio's own thread: no worker thread)."""
    import sqlite3

    import trio

    store = sqlite3.connect(db, isolation_level=None)
    store.execute("PRAGMA journal_mode = WAL")
    store.execute("PRAGMA synchronous = NORMAL")
    store.execute("CREATE TABLE steps (caller INTEGER PRIMARY KEY, status TEXT NOT NULL)")

    async def main() -> None:
        ups = []
        for upstream in upstream_paths:
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(upstream)
            up.setblocking(False)
            ups.append(up)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(128)
        server.setblocking(False)
        clients: list[socket.socket] = []
        started: list[bytes] = []
        finished: list[bytes] = []
        waiting: set[int] = set()
        done: set[int] = set()
        wake = [trio.Event()]
        turn = [0]

        def reply(caller: int, kind: int, record: bytes) -> None:
            clients[caller].sendall(bytes([caller, kind]) + record[2:])

        def commit(sql: str, records: list[bytes]) -> None:
            """One transaction of ``sql`` for each record's caller."""
            store.execute("BEGIN IMMEDIATE")
            store.executemany(sql, [(record[0],) for record in records])
            store.execute("COMMIT")

        async def committer() -> None:
            while True:
                await wake[0].wait()
                wake[0] = trio.Event()
                starts, started[:] = started[:], []
                ends, finished[:] = finished[:], []
                if starts:
                    commit("INSERT OR REPLACE INTO steps VALUES (?, 'running')", starts)
                    for record in starts:
                        reply(record[0], _STARTED, record)
                        ups[turn[0] % len(ups)].sendall(bytes([record[0], _TASK]) + record[2:])
                        turn[0] += 1
                if ends:
                    commit("UPDATE steps SET status = 'completed' WHERE caller = ?", ends)
                    for record in ends:
                        if record[0] in waiting:
                            waiting.discard(record[0])
                            reply(record[0], _DONE, record)
                        else:
                            done.add(record[0])

        async def records(sock: socket.socket) -> AsyncIterator[bytes]:
            """The records read from ``sock`` until it closes."""
            pending = b""
            while True:
                await trio.lowlevel.wait_readable(sock)
                data = sock.recv(1 << 16)
                if not data:
                    return
                pending += data
                while len(pending) >= _RECORD:
                    record, pending = pending[:_RECORD], pending[_RECORD:]
                    yield record

        async def from_client(conn: socket.socket) -> None:
            async for record in records(conn):
                if record[1] == _START:
                    started.append(record)
                    wake[0].set()
                elif record[0] in done:
                    done.discard(record[0])
                    reply(record[0], _DONE, record)
                else:
                    waiting.add(record[0])

        async def from_upstream(up: socket.socket) -> None:
            async for record in records(up):
                if record[1] == _RESULT:
                    finished.append(record)
                    wake[0].set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer)
            for up in ups:
                nursery.start_soon(from_upstream, up)
            print("ready", flush=True)
            while True:
                await trio.lowlevel.wait_readable(server)
                conn, _ = server.accept()
                conn.setblocking(False)
                conn.send(bytes([len(clients)]))
                clients.append(conn)
                nursery.start_soon(from_client, conn)

    trio.run(main)


class _StepFloor(_Floor):
    """:func:`_step_relay` in front of ``echoes`` :func:`_step_echo` processes, with its
    SQLite file in the temp dir; stopped on exit."""

    def __enter__(self) -> _StepFloor:
        try:
            module = "benchmarks.bench_matching"
            self.procs = _start_helpers([("_step_echo", echo) for echo in self.echoes], module)
            db = os.path.join(self.tmp, "steps.sqlite3")
            self.procs += _start_helpers([("_step_relay", self.path, db, *self.echoes)], module)
        except BaseException:
            self.__exit__()
            raise
        return self


def _step_floor(floor: _StepFloor, quick: bool) -> dict[str, float]:
    """The Step floor's figures: the p50 of one caller's Step (START, STARTED, WAIT, DONE:
    two round trips, the TASK/ACCEPT/RESULT exchange and two commits behind them), then
    Steps/s of ``CONCURRENCY`` callers (one epoll loop in this process) and the CPU all the
    floor's processes spent per Step."""
    socks = [floor.connect() for _ in range(CONCURRENCY)]
    out: dict[str, float] = {}
    try:
        sock, record = socks[0]
        start = record[:1] + bytes([_START]) + record[2:]
        wait = record[:1] + bytes([_WAIT]) + record[2:]

        def read_one() -> None:
            got = 0
            while got < _RECORD:
                got += len(sock.recv(_RECORD - got))

        times = []
        for i in range(100 + (300 if quick else 2000)):
            t0 = time.perf_counter()
            sock.sendall(start)
            read_one()
            sock.sendall(wait)
            read_one()
            if i >= 100:
                times.append(time.perf_counter() - t0)
        out["p50"] = statistics.median(times)
        poll = select.epoll()
        try:
            by_fd: dict[int, tuple[socket.socket, bytes, bytes]] = {}
            received: dict[int, int] = {}
            for sock, record in socks:
                sock.setblocking(False)
                by_fd[sock.fileno()] = (
                    sock,
                    record[:1] + bytes([_START]) + record[2:],
                    record[:1] + bytes([_WAIT]) + record[2:],
                )
                received[sock.fileno()] = 0
                poll.register(sock.fileno(), select.EPOLLIN)

            def drive(seconds: float) -> int:
                steps = 0
                started = dict.fromkeys(by_fd, False)  # (each caller: STARTED, then DONE)
                for sock, start, _ in by_fd.values():
                    sock.send(start)
                end = time.monotonic() + seconds
                pending = len(by_fd)
                while pending:
                    events = poll.poll(5.0)
                    if not events:
                        raise RuntimeError("bench_matching: the Step floor stopped answering")
                    for fd, _ in events:
                        sock, start, wait = by_fd[fd]
                        received[fd] += len(sock.recv(1 << 16))
                        while received[fd] >= _RECORD:
                            received[fd] -= _RECORD
                            if not started[fd]:
                                started[fd] = True
                                sock.send(wait)
                                continue
                            started[fd] = False
                            steps += 1
                            if time.monotonic() < end:
                                sock.send(start)
                            else:
                                pending -= 1
                return steps

            drive(0.2)
            pids = [0, *(proc.pid for proc in floor.procs)]
            cpu0, t0 = _cpu_seconds(pids), time.perf_counter()
            steps = drive(1.0 if quick else 4.0)
            elapsed, cpu = time.perf_counter() - t0, _cpu_seconds(pids) - cpu0
            out["rate"] = steps / elapsed
            out["cpu"] = cpu / max(steps, 1)
        finally:
            poll.close()
    finally:
        for sock, _ in socks:
            sock.close()
    return out


# --- the matching server and its workers (OS processes of their own) ---------------------------


def _worker_main(address: str, slots: str, blobs: str) -> None:
    """(Its own process.) A blocking pull worker serving :class:`BenchFlow` with ``slots``
    slots; prints ``ready`` once registered, runs until its stdin closes."""
    from apps.matching import Registry

    serve_worker(Registry((BenchFlow,)), address, int(slots), blobs=blobs)


class _Server:
    """``python -m otp.node --app apps.matching`` on a Unix socket in a temp dir with ``store``
    (default: a SQLite file there), or ``node``'s command line (a cluster's node), plus worker
    processes started by :meth:`add_workers`; all stopped on exit (the temp dir removed)."""

    def __init__(self, store: str | None = None, node: MatchingNode | None = None) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-matching-")
        if node is None:
            sock = os.path.join(self.tmp, "matching.sock")
            node = MatchingNode(f"unix:{sock}", store or os.path.join(self.tmp, "matching.sqlite3"))
        self.command = node  # (not `node`: a distributed subclass keeps its node name there)
        self.sock = node.socket_path
        self.address = node.address
        self.log = os.path.join(self.tmp, "server.log")
        self.blobs = os.path.join(self.tmp, "blobs")
        self.report = os.path.join(self.tmp, "wakeups")
        self.env = process_env()
        self.proc: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.worker_logs: list[str] = []
        self.log_text = ""

    def __enter__(self) -> _Server:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _argv(self) -> tuple[str, ...]:
        """The server's ``python -m otp.node`` arguments (:class:`MatchingNode`'s)."""
        return tuple(self.command.args())

    def _start(self) -> None:
        argv = self._argv()
        # ``python -m otp.node`` with its trio wake-ups counted (bench_dirty's _counted_node:
        # each SIGUSR2 writes the count so far to ``self.report``).
        code = (
            "from benchmarks.bench_dirty import _counted_node;"
            f" _counted_node(*{(self.report, *argv)!r})"
        )
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"bench_matching: the server did not start (exit code {self.proc.poll()}):"
                    f" {self._read(self.log)[-2000:]}"
                )
            time.sleep(0.05)
        # Counted from the start (bench_dirty's node counts only when asked): every figure
        # here is taken with the same counter on, the server's wake-ups beside its CPU.
        _signal_node(self.proc.pid, self.report, _COUNT_ON)

    def add_workers(self, count: int, slots: int) -> None:
        """Start ``count`` worker processes and wait until every one is registered."""
        code = (
            "from benchmarks.bench_matching import _worker_main;"
            f" _worker_main({self.address!r}, {str(slots)!r}, {self.blobs!r})"
        )
        started = []
        for _ in range(count):
            log = os.path.join(self.tmp, f"worker{len(self.workers)}.log")
            with open(log, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-c", code],
                    cwd=ROOT,
                    env=self.env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                )
            self.workers.append(proc)
            self.worker_logs.append(log)
            started.append((proc, log))
        for proc, log in started:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(
                    f"bench_matching: a worker did not register (exit code {proc.poll()}):"
                    f" {self._read(log)[-2000:]}"
                )

    def wakeups(self) -> float:
        """The server's trio wake-ups so far (NaN if it does not answer within 5 s)."""
        assert self.proc is not None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.report)
        os.kill(self.proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 5
        while not os.path.exists(self.report):
            if time.monotonic() > deadline:
                return math.nan
            time.sleep(0.001)
        with open(self.report) as f:
            return float(f.read())

    @staticmethod
    def _read(path: str) -> str:
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def problems(self) -> list[str]:
        """The server's log lines at WARNING and above, and every line a worker wrote to its
        stderr (they write nothing when all is well)."""
        out = []
        for line in self._read(self.log).splitlines():
            if any(w in line for w in ("WARNING", "ERROR", "CRITICAL", "Traceback")):
                out.append(f"server: {line.strip()}")
        for path in self.worker_logs:
            for line in self._read(path).splitlines():
                if line.strip():
                    out.append(f"{os.path.basename(path)[:-4]}: {line.strip()}")
        return out

    def __exit__(self, *exc: object) -> None:
        for proc in self.workers:
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        for proc in self.workers:
            _stop(proc, 10)
        if self.proc is not None:
            _stop(self.proc, 30, signal_first=True)
        self.log_text = "\n".join(self.problems())
        shutil.rmtree(self.tmp, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes], grace: float, *, signal_first: bool = False) -> None:
    """Wait ``grace`` seconds for ``proc`` to exit (after SIGTERM if ``signal_first``; a
    worker exits once its stdin is closed), then SIGTERM, then SIGKILL."""
    if signal_first and proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _latencies(fn: Callable[[], object], warm: int, n: int) -> list[float]:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU so far of every thread of ``pid`` (Linux ``schedstat``: finer than
    ``_cpu_seconds``' clock ticks, for the few hundred calls of a quick run; 0 elsewhere)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total


def _costs(server: _Server, fn: Callable[[], object], warm: int, n: int) -> tuple[list[float], str]:
    """``_latencies`` of ``fn``, and what one call cost (the server's trio wake-ups, the CPU
    of the server, of its first worker and of this process), as a note."""
    for _ in range(warm):
        fn()
    assert server.proc is not None
    pids = (server.proc.pid, server.workers[0].pid, os.getpid())
    wakeups = server.wakeups()
    cpu = [_cpu_ns(pid) for pid in pids]
    times = _latencies(fn, 0, n)
    cpu = [(_cpu_ns(pid) - before) / n / 1e3 for pid, before in zip(pids, cpu, strict=True)]
    wakeups = (server.wakeups() - wakeups) / n
    note = (
        f"server {wakeups:.1f} trio wake-ups, CPU server {cpu[0]:.0f} us, worker {cpu[1]:.0f} us,"
        f" client {cpu[2]:.0f} us"
    )
    return times, note


def _measure_latency(server: _Server, quick: bool) -> tuple[dict[str, list[float]], dict[str, str]]:
    """RPC and Step round trips (s) of 1 caller, with the blocking ``Client`` (as sync code
    calls the server) and with ``TrioClient`` from a trio task; and what one blocking RPC and
    one Step cost (``_costs``' notes)."""
    import trio

    from apps.matching import BlobCache, Client, ClientOptions, Registry, TrioClient

    registry = Registry((BenchFlow,))
    options = ClientOptions(server_address=server.address)
    n_rpc = 200 if quick else 2000
    n_step = 80 if quick else 500
    out: dict[str, list[float]] = {}
    costs: dict[str, str] = {}
    client = Client(registry, BlobCache(server.blobs), options)
    try:
        flow_id = client.start_flow(BenchFlow, 0)
        client.result(flow_id, timeout=30)
        out["rpc"], costs["rpc"] = _costs(
            server, lambda: client.call_rpc(flow_id, "ping"), 50, n_rpc
        )

        def one_step() -> None:
            client.result(client.start_flow(BenchFlow, 1), timeout=30)

        out["step"], costs["step"] = _costs(server, one_step, 20, n_step)
    finally:
        client.close()

    async def in_trio() -> None:
        trio_client = TrioClient(registry, BlobCache(server.blobs), options)
        try:
            flow_id = await trio_client.start_flow(BenchFlow, 0)
            await trio_client.result(flow_id, timeout=30)
            for key, warm, n in (("rpc_trio", 50, n_rpc), ("step_trio", 20, n_step)):
                times = []
                for i in range(warm + n):
                    t0 = time.perf_counter()
                    if key == "rpc_trio":
                        await trio_client.call_rpc(flow_id, "ping")
                    else:
                        await trio_client.result(
                            await trio_client.start_flow(BenchFlow, 1), timeout=30
                        )
                    if i >= warm:
                        times.append(time.perf_counter() - t0)
                out[key] = times
        finally:
            await trio_client.close()

    trio.run(in_trio)
    return out, costs


def _measure_throughput(servers: _Server | list[_Server], quick: bool) -> dict[str, float]:
    """Steps/s of one-Step flows, ``CONCURRENCY`` in flight from trio tasks sharing one
    ``TrioClient`` per server (callers spread over the servers), for a fixed time after a
    warm-up."""
    import trio

    from apps.matching import BlobCache, ClientOptions, Registry, TrioClient

    if isinstance(servers, _Server):
        servers = [servers]
    seconds = 2.5 if quick else 8.0
    out: dict[str, float] = {}
    errors: list[str] = []
    slow: list[float] = []

    def wakeups() -> float:
        return sum(server.wakeups() for server in servers)

    async def main() -> None:
        clients = [
            TrioClient(
                Registry((BenchFlow,)),
                BlobCache(server.blobs),
                ClientOptions(server_address=server.address),
            )
            for server in servers
        ]
        try:

            async def caller(
                client: TrioClient, end: float, counts: list[int], times: list[float]
            ) -> None:
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    try:
                        flow_id = await client.start_flow(BenchFlow, 1)
                        await client.result(flow_id, timeout=60)
                    except Exception as exc:  # reported in the notes, never fails the run
                        errors.append(f"{type(exc).__name__}: {exc}")
                        if len(errors) >= 100:
                            return  # the server is broken, not slow: stop this caller
                        continue
                    times.append(time.perf_counter() - t0)
                    counts[0] += 1

            roles: dict[str, list[int]] = {"server": [], "workers": [], "client": [0]}
            for server in servers:
                assert server.proc is not None
                roles["server"].append(server.proc.pid)
                roles["workers"] += [w.pid for w in server.workers]
            for phase, length in (("warm", 0.5), ("run", seconds)):
                counts = [0]
                times: list[float] = []
                cpu0 = {role: _cpu_seconds(pids) for role, pids in roles.items()}
                wakeups0 = wakeups()
                t0 = time.perf_counter()
                end = time.monotonic() + length
                async with trio.open_nursery() as nursery:
                    for i in range(CONCURRENCY):
                        client = clients[i % len(clients)]
                        nursery.start_soon(caller, client, end, counts, times)
                elapsed = time.perf_counter() - t0
                if phase == "run":
                    out["rate"] = counts[0] / elapsed
                    out["flows"] = counts[0]
                    for role, pids in roles.items():
                        used = _cpu_seconds(pids) - cpu0[role]
                        out[f"cpu_{role}"] = used / max(counts[0], 1)
                    out["wakeups"] = (wakeups() - wakeups0) / max(counts[0], 1)
                    if times:
                        out["p50"] = statistics.median(times)
                        out["p99"] = _percentile(times, 0.99)
                        slow.extend(t for t in times if t > 1.0)
        finally:
            for client in clients:
                await client.close()

    trio.run(main)
    out["errors"] = len(errors)
    out["slow"] = len(slow)
    if errors:
        print(f"bench_matching: {len(errors)} errors, first: {errors[0]}", file=sys.stderr)
    return out


# --- on PostgreSQL: the database's own floor, one server, a cluster of three -----------------

#: Servers in the cluster row (``matching.pg_cluster_steps_per_s``).
CLUSTER = 3
#: Rows a bare claim takes at most (``LIMIT n``): the engine's claims take many at once.
CLAIM_LIMIT = 64


def _claim_loop(url: str, seconds: float, counts: list[int], errors: list[str]) -> None:
    """One claimer of the bare claim loop (in a thread, on a connection of its own): INSERT a
    job row (one commit), then claim with ``SELECT ... FOR UPDATE SKIP LOCKED LIMIT n``, DELETE
    what it claimed and commit, until ``seconds`` have passed; ``counts[0]`` grows by the rows
    each claim deleted."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.execute("INSERT INTO jobs (payload) VALUES (%s)", (b"x" * 64,))
                with conn.transaction():
                    ids = [
                        row[0]
                        for row in conn.execute(
                            "SELECT id FROM jobs ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                            (CLAIM_LIMIT,),
                        )
                    ]
                    if ids:
                        conn.execute("DELETE FROM jobs WHERE id = ANY(%s)", (ids,))
                counts[0] += len(ids)
    except Exception as exc:  # reported with the figure, never fails the run
        errors.append(f"{type(exc).__name__}: {exc}")


def _postgres_cpu(postgres: PostgresServer) -> float:
    """CPU seconds (user + system) PostgreSQL's processes used so far: every process under
    the server's, with the children each has reaped (the backends of closed connections)."""
    assert postgres.proc is not None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in [postgres.proc.pid, *_descendants(postgres.proc.pid)]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(field) for field in fields[11:15]) / tick
    return total


def _claim_floor(
    postgres: PostgresServer, claimers: int, quick: bool
) -> tuple[float, float, list[str]]:
    """Claims/s of ``claimers`` bare claim loops (:func:`_claim_loop`) on one PostgreSQL
    database: what the database does for a job's minimum (a durable insert, a locked claim, a
    durable delete) with no server in the way; and the CPU seconds per claim of the claimers
    (this process) and PostgreSQL together."""
    import threading

    import psycopg

    url = postgres.url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL)")
    errors: list[str] = []
    rate = cpu = 0.0
    for phase, seconds in (("warm", 0.5), ("run", 2.5 if quick else 8.0)):
        counts = [[0] for _ in range(claimers)]
        threads = [
            threading.Thread(target=_claim_loop, args=(url, seconds, count, errors))
            for count in counts
        ]
        cpu0 = _cpu_seconds([0]) + _postgres_cpu(postgres)
        t0 = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if phase == "run":
            claims = sum(count[0] for count in counts)
            rate = claims / (time.perf_counter() - t0)
            cpu = (_cpu_seconds([0]) + _postgres_cpu(postgres) - cpu0) / max(claims, 1)
    return rate, cpu, errors


def _postgres_results(quick: bool) -> list[Result]:
    """``matching.pg_steps_per_s`` (one server on PostgreSQL against the bare claim loop) and
    ``matching.pg_cluster_steps_per_s`` (three servers on one database against one), each
    with ``WORKERS`` worker processes x ``SLOTS`` slots, in a PostgreSQL of their own."""
    one_name = "bare claim loop: INSERT a job, SELECT FOR UPDATE SKIP LOCKED, DELETE, commit"
    cluster_name = "1 server on PostgreSQL (this run)"
    try:
        with PostgresServer() as postgres:
            floor, floor_cpu, floor_errors = _claim_floor(postgres, 1, quick)
            with _Server(store=postgres.url()) as server:
                server.add_workers(WORKERS, SLOTS)
                cpu0 = _postgres_cpu(postgres)
                one = _measure_throughput(server, quick)
                one["cpu_postgres"] = (_postgres_cpu(postgres) - cpu0) / max(one["flows"], 1)
            one_problems = server.log_text.splitlines()
            missing = cluster_missing()
            three: dict[str, float] = {}
            three_problems: list[str] = []
            if missing is None:
                three, three_problems = _cluster_throughput(postgres.url(), quick)
    except PostgresMissing as exc:
        problem = f"not measured: {exc}"
        return [
            Result("matching.pg_steps_per_s", "Steps/s", 0.0, one_name, 0.0, notes=problem),
            Result("matching.pg_cluster_steps_per_s", "Steps/s", 0.0, cluster_name, 0.0,
                   notes=problem),
        ]  # fmt: skip
    cores = os.cpu_count() or 1
    step_cpu = sum(one.get(f"cpu_{role}", 0.0) for role in ("server", "workers", "client"))
    step_cpu += one.get("cpu_postgres", 0.0)
    one_notes = (
        f"1 server (python -m otp.node --app apps.matching --store postgresql://...) with"
        f" {WORKERS} worker processes x {SLOTS} slots, {CONCURRENCY} one-Step flows in flight"
        f" from one TrioClient; {int(one.get('flows', 0))} flows, p50"
        f" {one.get('p50', 0) * 1e3:.1f} ms, {int(one.get('errors', 0))} errors,"
        f" {len(one_problems)} warning lines; CPU per Step: server"
        f" {one.get('cpu_server', 0) * 1e6:.0f} us, workers"
        f" {one.get('cpu_workers', 0) * 1e6:.0f} us, client"
        f" {one.get('cpu_client', 0) * 1e6:.0f} us, PostgreSQL"
        f" {one.get('cpu_postgres', 0) * 1e6:.0f} us (all: {cores} CPUs cap it at"
        f" {cores / max(step_cpu, 1e-9):.0f} Steps/s); against the database's floor: 1 claimer"
        f" (the server's one store connection) doing INSERT + claim (LIMIT {CLAIM_LIMIT}) +"
        f" DELETE + commit per job, {floor:.0f} claims/s, CPU per claim (claimer and"
        f" PostgreSQL) {floor_cpu * 1e6:.0f} us ({cores} CPUs cap it at"
        f" {cores / max(floor_cpu, 1e-9):.0f} claims/s; CPU ratio"
        f" {floor_cpu / max(step_cpu, 1e-9):.2f})"
        f"{f' ({len(floor_errors)} errors: {floor_errors[0]})' if floor_errors else ''};"
        f" PostgreSQL with fsync=off on this machine; target: ratio >= 0.5"
    )
    if missing is not None:
        cluster_notes = f"not measured: {missing}"
    else:
        cluster_notes = (
            f"{CLUSTER} servers on one PostgreSQL database as one cluster (node distribution,"
            f" MULTISERVER.md's command line), {WORKERS} worker processes spread over them,"
            f" {CONCURRENCY} flows in flight started through all {CLUSTER};"
            f" {int(three.get('flows', 0))} flows, p50 {three.get('p50', 0) * 1e3:.1f} ms,"
            f" {int(three.get('errors', 0))} errors, {len(three_problems)} warning lines; all"
            f" on this machine's {os.cpu_count()} CPUs, so the ratio shows that claims do not"
            f" contend, not that capacity grows; target: ratio >= 0.9"
        )
    return [
        Result("matching.pg_steps_per_s", "Steps/s", one.get("rate", 0.0), one_name, floor,
               notes=one_notes),
        Result("matching.pg_cluster_steps_per_s", "Steps/s", three.get("rate", 0.0),
               cluster_name, one.get("rate", 0.0), notes=cluster_notes),
    ]  # fmt: skip


def _cluster_throughput(url: str, quick: bool) -> tuple[dict[str, float], list[str]]:
    """Steps/s of ``CLUSTER`` servers on the database ``url`` as one cluster, ``WORKERS``
    worker processes spread over them, flows started through all of them."""
    tmp = tempfile.mkdtemp(prefix="bench-matching-cluster-")
    try:
        with contextlib.ExitStack() as stack:
            nodes = cluster(tmp, url, CLUSTER)
            servers = [stack.enter_context(_Server(node=node)) for node in nodes]
            for i in range(WORKERS):
                servers[i % CLUSTER].add_workers(1, SLOTS)
            out = _measure_throughput(servers, quick)
        problems = [line for server in servers for line in server.log_text.splitlines()]
        return out, problems
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(quick: bool) -> list[Result]:
    with _Floor(WORKERS) as floor:
        floor_times = _floor_latency(floor, quick)
        floor_rate, floor_cpu = _floor_throughput(floor, quick)
    with _StepFloor(WORKERS) as step_floor:
        design = _step_floor(step_floor, quick)
    floor_p50 = statistics.median(floor_times)
    floor_note = (
        f"floor p50 {floor_p50 * 1e6:.0f} us, p99 {_percentile(floor_times, 0.99) * 1e6:.0f} us"
    )
    floor_name = "no-work floor: relay + echo processes"
    floor_rate_name = f"no-work floor: {CONCURRENCY} callers, relay, {WORKERS} echoes"
    floor_cpu_name = "no-work floor: CPU of callers, relay and echoes per round trip"
    design_name = "design floor: a Step's frames and 2 group commits through raw processes"

    def unmeasured(problem: str) -> list[Result]:
        """The three figures at 0 with the floor and why the server was not measured."""
        problem = f"server not measured: {problem}"
        return [
            Result("matching.rpc_latency", "us", 0.0, floor_name, floor_p50 * 1e6,
                   direction="lower", notes=f"{problem}; {floor_note}"),
            Result("matching.step_latency", "us", 0.0, floor_name, floor_p50 * 1e6,
                   direction="lower", notes=problem),
            Result("matching.steps_per_s", "Steps/s", 0.0, floor_rate_name, floor_rate,
                   notes=problem),
            Result("matching.cpu_per_step", "us", 0.0, floor_cpu_name, floor_cpu * 1e6,
                   direction="lower", notes=problem),
            Result("matching.steps_per_s_design", "Steps/s", 0.0, design_name, design["rate"],
                   notes=problem),
        ]  # fmt: skip

    try:
        from apps.matching import Client, TrioClient, TrioWorker, Worker  # noqa: F401
    except ImportError as exc:
        print(f"bench_matching: the matching SDK is not importable ({exc})", file=sys.stderr)
        return unmeasured(f"the SDK is not importable ({exc})")
    try:
        with _Server() as server:
            server.add_workers(1, SLOTS)
            lat, costs = _measure_latency(server, quick)
            server.add_workers(WORKERS - 1, SLOTS)
            thr = _measure_throughput(server, quick)
    except Exception as exc:  # a broken server is reported, not a failed run
        import traceback

        traceback.print_exc()
        return unmeasured(f"{type(exc).__name__}: {str(exc)[:300]}")
    problems = server.log_text.splitlines()
    if problems:
        print(
            f"bench_matching: {len(problems)} error/warning lines in the server's and workers'"
            " output, first ones:",
            file=sys.stderr,
        )
        for line in problems[:10]:
            print(f"  {line}", file=sys.stderr)

    def us(times: list[float], q: float) -> str:
        return f"{_percentile(times, q) * 1e6:.0f} us"

    rpc_p50 = statistics.median(lat["rpc"])
    step_p50 = statistics.median(lat["step"])
    rpc_notes = (
        f"blocking Client, 1 caller, 1 worker process (empty sync RPC); p99 {us(lat['rpc'], 0.99)};"
        f" TrioClient p50 {us(lat['rpc_trio'], 0.5)} p99 {us(lat['rpc_trio'], 0.99)};"
        f" {floor_note}; target: ratio >= 0.3 and p50 <= 1 ms; per RPC: {costs['rpc']}"
    )
    step_notes = (
        f"start_flow + result of a one-Step flow (empty sync Step), blocking Client, 1 caller;"
        f" p99 {us(lat['step'], 0.99)}; TrioClient p50 {us(lat['step_trio'], 0.5)}"
        f" p99 {us(lat['step_trio'], 0.99)}; a Step is 2 client calls, a TASK/ACCEPT/RESULT"
        f" exchange with the worker and durable SQLite commits, against a floor of one round"
        f" trip; {floor_note}; per Step: {costs['step']}"
    )
    thr_notes = (
        f"{WORKERS} worker processes x {SLOTS} slots, {CONCURRENCY} flows in flight from one"
        f" TrioClient, durable SQLite store; {int(thr.get('flows', 0))} flows,"
        f" flow p50 {thr.get('p50', 0) * 1e3:.1f} ms p99 {thr.get('p99', 0) * 1e3:.1f} ms,"
        f" {int(thr['errors'])} errors, {int(thr['slow'])} flows over 1 s,"
        f" {len(problems)} warning lines from the server and workers;"
        f" {os.cpu_count()} CPUs; target: >= 5,000 Steps/s on 2 cores"
    )
    cpu = {role: thr.get(f"cpu_{role}", 0.0) * 1e6 for role in ("server", "workers", "client")}
    cpu_total = sum(cpu.values())
    cores = os.cpu_count() or 1
    cpu_notes = (
        f"CPU (user + system, all processes) per Step during matching.steps_per_s: server"
        f" {cpu['server']:.0f} us, {WORKERS} workers {cpu['workers']:.0f} us, client"
        f" {cpu['client']:.0f} us; {cores} CPUs cap Steps/s at {cores} / that total ="
        f" {cores * 1e6 / max(cpu_total, 1):.0f}"
        f" whatever the scheduling; 5,000 Steps/s on 2 cores needs <= 400 us;"
        f" {thr.get('wakeups', math.nan):.2f} server trio wake-ups per Step"
    )
    design_notes = (
        f"the floor of this design's shape (client -> server -> worker, durable state): a raw"
        f" trio relay with no actors, frames or routing commits each START to SQLite (WAL,"
        f" synchronous=NORMAL, grouped, on the relay's one thread) before it answers and sends the"
        f" TASK to one of {WORKERS} echo processes, which answer ACCEPT and RESULT; the RESULT"
        f" is committed before the caller's WAIT is answered. {CONCURRENCY} callers in one"
        f" epoll loop: {design['rate']:.0f} Steps/s, CPU {design['cpu'] * 1e6:.0f} us per"
        f" Step in all its processes ({cores * 1e6 / max(design['cpu'] * 1e6, 1):.0f} Steps/s"
        f" on {cores} CPUs at most); 1 caller: p50 {design['p50'] * 1e6:.0f} us"
    )
    sqlite = [
        Result("matching.rpc_latency", "us", rpc_p50 * 1e6, floor_name, floor_p50 * 1e6,
               direction="lower", notes=rpc_notes),
        Result("matching.step_latency", "us", step_p50 * 1e6, floor_name, floor_p50 * 1e6,
               direction="lower", notes=step_notes),
        Result("matching.steps_per_s", "Steps/s", thr.get("rate", 0.0), floor_rate_name,
               floor_rate, notes=thr_notes),
        Result("matching.cpu_per_step", "us", cpu_total, floor_cpu_name, floor_cpu * 1e6,
               direction="lower", notes=cpu_notes),
        Result("matching.steps_per_s_design", "Steps/s", thr.get("rate", 0.0), design_name,
               design["rate"], notes=design_notes),
        Result("matching.cpu_per_step_design", "us", cpu_total, design_name,
               design["cpu"] * 1e6, direction="lower",
               notes="the CPU of matching.cpu_per_step against the design floor's per Step"),
        Result("matching.step_latency_design", "us", step_p50 * 1e6, design_name,
               design["p50"] * 1e6, direction="lower",
               notes="matching.step_latency's p50 against the design floor's with 1 caller"),
    ]  # fmt: skip
    return sqlite + _postgres_results(quick)


BENCHMARKS = [Benchmark("matching", run)]
