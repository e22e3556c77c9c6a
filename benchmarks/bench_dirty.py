"""Dirty pool benchmarks: a real pool (``python -m otp.node --app apps.dirty``, its own OS process,
with its worker processes) called by our sync client from this process, each figure against a
raw Unix-socket ping-pong measured in the same run.

``dirty.execute``: median round trip of a small echo (1 client); ``dirty.execute_8``: calls/s
with 8 concurrent callers (threads sharing one client); ``dirty.stream``: chunks/s of a 10k-chunk
stream; ``dirty.bytes_1mib``: a 1 MiB echo round trip; ``dirty.execute_async`` and
``dirty.execute_8_async``: the first two from asyncio tasks (as an ASGI app calls the pool).
When gunicorn is installed, the same figures are measured against a real ``gunicorn`` 27
started with the same dirty app, workers and threads (``dirty.*_vs_gunicorn``), in the same run.

``dirty.execute_8_vs_floor`` (and ``dirty.execute_8_floor_vs_gunicorn``) compare with the floor
of the design itself: 8 threads doing bare socket round trips through a raw trio process that
only forwards bytes (the node's place in the data path) to 2 processes that echo at once (the
workers'). No client, node or worker code runs, so nothing built this way can beat it.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from apps import dirty

from ._harness import Benchmark, Result

APP = "benchmarks.bench_dirty:BenchApp"


class BenchApp(dirty.DirtyApp):
    """What the benchmarks call."""

    def echo(self, value: object) -> object:
        return value

    def chunks(self, n: int) -> object:
        return (i for i in range(n))


def _raw_pingpong(path: str, n: int, size: int = 64) -> float:
    """Median round trip (s) of ``size`` bytes over a Unix socket to an echo thread: the floor
    any socket RPC pays. Small messages go out with one ``sendall`` from the measuring thread;
    large ones from a long-lived sender thread (so the echo cannot deadlock on full buffers)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def echo() -> None:
        conn, _ = server.accept()
        while data := conn.recv(1 << 20):
            conn.sendall(data)
        conn.close()

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    payload = b"x" * size
    jobs: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def sender() -> None:
        while (data := jobs.get()) is not None:
            c.sendall(data)

    s = threading.Thread(target=sender, daemon=True)
    s.start()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        if size <= 65536:
            c.sendall(payload)
        else:
            jobs.put(payload)
        got = 0
        while got < size:
            got += len(c.recv(1 << 20))
        times.append(time.perf_counter() - t0)
    jobs.put(None)
    s.join(5)
    c.close()
    t.join(5)
    server.close()
    os.unlink(path)
    return statistics.median(times)


def _measure(
    client: Any,
    quick: bool,
    callers: list[Any] | None = None,
    async_callers: list[Any] | None = None,
) -> dict[str, float]:
    """The figures, with ``client`` (ours or Gunicorn's ``DirtyClient``); the 8 callers use
    ``callers`` (one client each; ``async_callers`` for the asyncio ones) if given, else share
    ``client``."""
    n = 300 if quick else 3000
    for _ in range(50):
        client.execute(APP, "echo", "warm")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.execute(APP, "echo", "hello")
        times.append(time.perf_counter() - t0)
    out = {"execute": statistics.median(times)}
    per = n // 4
    clients = callers or [client] * 8

    def caller(c: Any) -> None:
        for _ in range(per):
            c.execute(APP, "echo", "hello")

    threads = [threading.Thread(target=caller, args=(c,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["execute_8"] = 8 * per / (time.perf_counter() - t0)
    chunks = 10_000
    t0 = time.perf_counter()
    count = sum(1 for _ in client.stream(APP, "chunks", chunks))
    out["stream"] = count / (time.perf_counter() - t0)
    blob = b"y" * (1 << 20)
    for _ in range(4):  # each worker's first large frames (buffers, heap) are not the figure
        client.execute(APP, "echo", blob)
    big = []
    for _ in range(5 if quick else 20):
        t0 = time.perf_counter()
        client.execute(APP, "echo", blob)
        big.append(time.perf_counter() - t0)
    out["bytes_1mib"] = statistics.median(big)
    out.update(asyncio.run(_measure_async(client, quick, async_callers)))
    return out


async def _measure_async(
    client: Any, quick: bool, callers: list[Any] | None = None
) -> dict[str, float]:
    """``execute`` latency and 8-caller throughput from asyncio tasks; the 8 tasks use
    ``callers`` (one client each) if given, else share ``client``."""
    n = 300 if quick else 3000
    for _ in range(50):
        await client.execute_async(APP, "echo", "warm")
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.execute_async(APP, "echo", "hello")
        times.append(time.perf_counter() - t0)
    per = n // 4
    clients = callers or [client] * 8

    async def caller(c: Any) -> None:
        for _ in range(per):
            await c.execute_async(APP, "echo", "hello")

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in clients))
    rate = 8 * per / (time.perf_counter() - t0)
    for c in {id(c): c for c in [client, *clients]}.values():
        await c.close_async()
    return {"execute_async": statistics.median(times), "execute_8_async": rate}


#: Gunicorn's config for the comparison: the same app, workers and threads as our pool.
_GUNICORN_CONF = """
import os
bind = "127.0.0.1:0"
workers = 1
dirty_apps = [{app!r}]
dirty_workers = 2
dirty_threads = 4
loglevel = "warning"

def on_dirty_starting(arbiter):
    with open(os.environ["BENCH_DIRTY_SOCKET_FILE"], "w") as f:
        f.write(arbiter.socket_path)
"""


def wsgi_app(environ: Any, start_response: Any) -> list[bytes]:
    """The web app Gunicorn serves in the comparison (unused: only its dirty pool is called)."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


_RECORD = 80


def _floor_echo(path: str) -> None:
    """(Its own process.) A stand-in for a worker that costs nothing: echoes every read back
    at once from a plain epoll loop."""
    import select

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    poll = select.epoll()
    poll.register(server.fileno(), select.EPOLLIN)
    conns: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for fd, _ in poll.poll():
            if fd == server.fileno():
                conn, _ = server.accept()
                conns[conn.fileno()] = conn
                poll.register(conn.fileno(), select.EPOLLIN)
            elif data := conns[fd].recv(1 << 16):
                conns[fd].sendall(data)
            else:
                poll.unregister(fd)
                conns.pop(fd).close()


def _floor_forwarder(path: str, *upstream_paths: str) -> None:
    """(Its own process.) The least a trio node between clients and workers can do: forward
    each read of a client to the next upstream (round-robin) and each upstream record back to
    the client its first byte names, with raw trio (no actors, no frames, no routing table)."""
    import trio

    async def main() -> None:
        ups = []
        for upstream in upstream_paths:
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(upstream)
            up.setblocking(False)
            ups.append(up)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(16)
        server.setblocking(False)
        clients: list[socket.socket] = []
        turn = [0]

        async def from_client(conn: socket.socket) -> None:
            while True:
                await trio.lowlevel.wait_readable(conn)
                data = conn.recv(1 << 16)
                if not data:
                    return
                ups[turn[0] % len(ups)].sendall(data)
                turn[0] += 1

        async def from_upstream(up: socket.socket) -> None:
            pending = b""
            while True:
                await trio.lowlevel.wait_readable(up)
                pending += up.recv(1 << 16)
                while len(pending) >= _RECORD:
                    record, pending = pending[:_RECORD], pending[_RECORD:]
                    clients[record[0]].sendall(record)

        async with trio.open_nursery() as nursery:
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


def _start_helper(function: str, *args: str) -> subprocess.Popen[bytes]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"from benchmarks.bench_dirty import {function}; {function}(*{args!r})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root),
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"bench_dirty: {function} did not start")
    return proc


def _node_floor(quick: bool) -> float:
    """Calls/s of the design's floor with 8 callers: 8 threads doing bare socket round trips
    (no frames, no client) through a raw trio forwarder process (a node doing nothing but
    forwarding) to 2 echo processes (workers costing nothing). What the pool, with the node
    in its data path as the design has it, could reach if client, node and workers did no
    work of their own."""
    tmp = tempfile.mkdtemp(prefix="bench-floor-")
    echoes = [os.path.join(tmp, f"echo{i}.sock") for i in range(2)]
    path = os.path.join(tmp, "node.sock")
    procs = [_start_helper("_floor_echo", echo) for echo in echoes]
    try:
        procs.append(_start_helper("_floor_forwarder", path, *echoes))
        socks = []
        for _ in range(8):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            socks.append((sock, sock.recv(1) + b"x" * (_RECORD - 1)))
        end = time.monotonic() + (1.0 if quick else 3.0)
        counts = [0] * len(socks)

        def caller(i: int) -> None:
            sock, record = socks[i]
            while time.monotonic() < end:
                sock.sendall(record)
                got = 0
                while got < _RECORD:
                    got += len(sock.recv(1 << 16))
                counts[i] += 1

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(socks))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        for sock, _ in socks:
            sock.close()
        return sum(counts) / elapsed
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _run_gunicorn(quick: bool) -> dict[str, float] | None:
    """Start a real gunicorn 27 with a dirty app, as a user would; measure it with its own
    client (one client per caller thread: Gunicorn's client is not safe to share)."""
    try:
        from gunicorn.dirty import DirtyClient as GunicornClient  # type: ignore[import-untyped]
    except ImportError:
        return None
    tmp = tempfile.mkdtemp(prefix="bench-gunicorn-")
    conf = os.path.join(tmp, "gunicorn.conf.py")
    socket_file = os.path.join(tmp, "socket-path")
    with open(conf, "w") as f:
        f.write(_GUNICORN_CONF.format(app=APP))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, BENCH_DIRTY_SOCKET_FILE=socket_file, PYTHONPATH=root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", conf, "benchmarks.bench_dirty:wsgi_app"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    found: list[str] = []

    def probe() -> None:
        with open(socket_file) as f:
            path = f.read().strip()
        client = GunicornClient(path, timeout=2)
        try:
            client.execute(APP, "echo", 1)
        finally:
            client.close()
        found.append(path)

    try:
        if not _wait_answering(proc, probe, "gunicorn's dirty arbiter"):
            return None
        client = GunicornClient(found[0], timeout=60)
        callers = [GunicornClient(found[0], timeout=60) for _ in range(8)]
        async_callers = [GunicornClient(found[0], timeout=60) for _ in range(8)]
        try:
            return _measure(client, quick, callers, async_callers)
        finally:
            for c in [client, *callers, *async_callers]:
                c.close()
    finally:
        _stop(proc)


def _wait_answering(proc: subprocess.Popen[bytes], ready: Any, what: str) -> bool:
    """Poll ``ready()`` until it returns without raising (True), or the process exits or 30 s
    pass (False)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            ready()
            return True
        except Exception:
            time.sleep(0.1)
    print(f"bench_dirty: {what} did not start answering", file=sys.stderr)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _run_pool(quick: bool) -> dict[str, float]:
    """Start our pool as users run it (``python -m otp.node --app apps.dirty ...``, its own OS
    process, same app, workers and threads as Gunicorn's) and measure it from this process with
    one sync client shared by the 8 caller threads."""
    tmp = tempfile.mkdtemp(prefix="bench-dirty-")
    path = os.path.join(tmp, "pool.sock")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = [
        sys.executable, "-m", "otp.node", "--log-level", "warning", "--app", "apps.dirty",
        "--dirty-app", APP, "--dirty-workers", "2", "--dirty-threads", "4",
        "--dirty-socket", path, "--dirty-pidfile", "",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.Popen(
        args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:

        def probe() -> None:
            with dirty.DirtyClient(path, timeout=2) as c:
                c.execute(APP, "echo", 1)

        if not _wait_answering(proc, probe, "the otp.node dirty pool"):
            raise RuntimeError(f"the dirty pool node did not start (exit code {proc.poll()})")
        client = dirty.DirtyClient(path, timeout=60)
        try:
            return _measure(client, quick)
        finally:
            client.close()
    finally:
        _stop(proc)


def run(quick: bool) -> list[Result]:
    tmp = tempfile.mkdtemp(prefix="bench-raw-")
    n = 500 if quick else 5000
    raw_small = _raw_pingpong(os.path.join(tmp, "raw.sock"), n)
    raw_big = _raw_pingpong(os.path.join(tmp, "raw2.sock"), 5 if quick else 20, 1 << 20)
    ours = _run_pool(quick)
    theirs = _run_gunicorn(quick)
    floor = _node_floor(quick)
    raw_rate = 1 / raw_small
    results = [
        Result("dirty.execute", "us", ours["execute"] * 1e6, "raw unix ping-pong",
               raw_small * 1e6, direction="lower", notes="target: at most 5x the raw round trip"),
        Result("dirty.execute_8", "calls/s", ours["execute_8"], "raw ping-pong (1 caller)",
               raw_rate, notes="8 threads sharing one client"),
        Result("dirty.stream", "chunks/s", ours["stream"], "raw ping-pong round trips/s",
               raw_rate, notes="target: at least 100k chunks/s"),
        Result("dirty.bytes_1mib", "ms", ours["bytes_1mib"] * 1e3, "raw 1 MiB ping-pong",
               raw_big * 1e3, direction="lower", notes="target: under 3 ms"),
        Result("dirty.execute_async", "us", ours["execute_async"] * 1e6, "raw unix ping-pong",
               raw_small * 1e6, direction="lower", notes="from an asyncio task"),
        Result("dirty.execute_8_async", "calls/s", ours["execute_8_async"],
               "raw ping-pong (1 caller)", raw_rate, notes="8 asyncio tasks sharing one client"),
        Result("dirty.execute_8_vs_floor", "calls/s", ours["execute_8"],
               "no-work floor of a node in the path", floor,
               notes="8 bare callers -> raw trio forwarder -> 2 echo processes"),
    ]  # fmt: skip
    if theirs is not None:
        results += [
            Result("dirty.execute_vs_gunicorn", "us", ours["execute"] * 1e6,
                   "gunicorn 27 dirty arbiter", theirs["execute"] * 1e6, direction="lower",
                   notes=f"raw ping-pong {raw_small * 1e6:.1f} us"),
            Result("dirty.execute_8_vs_gunicorn", "calls/s", ours["execute_8"],
                   "gunicorn 27 dirty arbiter", theirs["execute_8"],
                   notes="target: at least 10x; gunicorn: one client per thread"),
            Result("dirty.execute_8_floor_vs_gunicorn", "calls/s", floor,
                   "gunicorn 27 dirty arbiter", theirs["execute_8"],
                   notes="no-work floor: bare callers, raw trio forwarder, echo workers"),
            Result("dirty.stream_vs_gunicorn", "chunks/s", ours["stream"],
                   "gunicorn 27 dirty arbiter", theirs["stream"]),
            Result("dirty.bytes_1mib_vs_gunicorn", "ms", ours["bytes_1mib"] * 1e3,
                   "gunicorn 27 dirty arbiter", theirs["bytes_1mib"] * 1e3, direction="lower"),
            Result("dirty.execute_async_vs_gunicorn", "us", ours["execute_async"] * 1e6,
                   "gunicorn 27 dirty arbiter", theirs["execute_async"] * 1e6,
                   direction="lower", notes="asyncio, both clients"),
            Result("dirty.execute_8_async_vs_gunicorn", "calls/s", ours["execute_8_async"],
                   "gunicorn 27 dirty arbiter", theirs["execute_8_async"],
                   notes="8 asyncio tasks; gunicorn: one client per task"),
        ]  # fmt: skip
    return results


BENCHMARKS = [Benchmark("dirty", run)]
