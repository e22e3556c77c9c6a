"""Dirty pool benchmarks: a real pool (``python -m otp.node --app apps.dirty``, its own OS process,
with its worker processes) called by our sync client from this process, each figure against a
baseline measured in the same run.

Which floor each ratio uses:

- ``dirty.execute``, ``execute_8``, ``stream``, ``bytes_1mib``, ``execute_async``,
  ``execute_8_async``: a raw Unix-socket ping-pong with an echo in *another OS process*
  (:func:`_floor_echo`), which is what IPC costs (an echo thread of the measuring process would
  pay GIL hand-offs on every round trip: ~10x slower on this machine).
- ``dirty.execute_8_vs_floor`` (8 callers, calls/s) and ``dirty.execute_vs_floor`` (1 caller,
  median latency): the floor of the design itself: bare socket round trips (no frames, no
  client) from threads of this process through a raw trio process that only forwards bytes (the
  node's place in the data path) to 2 processes that echo at once (the workers'). No client,
  node or worker code runs, so nothing built this way can beat it. Ours and the floor are
  measured in slices that alternate (:func:`_alternate`), so both see the same load on a shared
  machine. Their notes show CPU us per call of each process beside its stand-in in the floor
  (node and forwarder, workers and echoes, client and bare callers, in nanoseconds from
  ``/proc/PID/task/*/schedstat`` and ``time.process_time``), and the node's trio wake-ups per
  call (counted with ``benchmarks._wakeups`` inside the node, in slices of their own after the
  timed ones: the counter costs trio a hook call per wake-up, which the forwarder does not
  pay). With one caller a call is a chain, so every process's
  CPU adds to its latency: the node pays the forwarder's syscalls and its 2 wake-ups per call
  (frames are forwarded by header, never decoded), and the gap to the floor is Python per
  frame in the client, the node and the worker (which the floor's bare caller and echoes do
  not run).
- ``dirty.execute_8_vs_shared_floor`` (8 callers, calls/s): the floor of our client's shape,
  8 threads of this process sharing *one* connection, through the same raw forwarder and echoes:
  the simplest correct client for that shape (``_dirty_shared.SharedConn``: request ids, a
  reader thread, a ``queue.SimpleQueue`` per caller; the fastest of the hand-offs measured),
  with no frames, errors or timeouts. Its notes give this floor's calls/s against the bare
  floor's: what sharing one connection among Python threads costs (or saves: one connection
  lets the forwarder move several records per read) by itself.
- ``dirty.*_vs_gunicorn``: a real ``gunicorn`` 27 started with the same dirty app, workers and
  threads (when gunicorn is installed), in the same run.

``dirty.execute``: median round trip of a small echo (1 client); ``dirty.execute_8``: calls/s
with 8 concurrent callers (threads sharing one client); ``dirty.stream``: chunks/s of a 10k-chunk
stream; ``dirty.bytes_1mib``: a 1 MiB echo round trip; ``dirty.execute_async`` and
``dirty.execute_8_async``: the first two from asyncio tasks (as an ASGI app calls the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from apps import dirty

from ._dirty_shared import SharedConn
from ._harness import Benchmark, Result
from .bench_wire import PATHS as WIRE_PATHS

APP = "benchmarks.bench_dirty:BenchApp"


class BenchApp(dirty.DirtyApp):
    """What the benchmarks call."""

    def echo(self, value: object) -> object:
        return value

    def chunks(self, n: int) -> object:
        return (i for i in range(n))


def _raw_pingpong(path: str, n: int, size: int = 64) -> float:
    """Median round trip (s) of ``size`` bytes over a Unix socket to an echo in another OS
    process (:func:`_floor_echo`): the floor any socket RPC between processes pays (an echo
    thread of this process would add GIL hand-offs to every round trip). Small messages go out
    with one ``sendall`` from the measuring thread; large ones from a long-lived sender thread
    (so neither side can deadlock on full buffers)."""
    echo = _start_helper("_floor_echo", path)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
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
        return statistics.median(times)
    finally:
        c.close()
        echo.kill()
        echo.wait()
        os.unlink(path)


def _cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used: its threads' run time, counted in nanoseconds
    (``/proc/PID/task/*/schedstat``; ``/proc/PID/stat`` counts clock ticks of 10 ms, as
    coarse as a whole slice of calls), or from ``/proc/PID/stat`` where there is none."""
    tasks = f"/proc/{pid}/task"
    if os.path.exists(f"{tasks}/{pid}/schedstat"):
        total = 0
        for task in os.listdir(tasks):
            with contextlib.suppress(FileNotFoundError), open(f"{tasks}/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(
    client: Any,
    quick: bool,
    callers: list[Any] | None = None,
    async_callers: list[Any] | None = None,
) -> dict[str, float]:
    """The figures, with ``client`` (Gunicorn's ``DirtyClient``); the 8 callers use ``callers``
    (one client each; ``async_callers`` for the asyncio ones) if given, else share ``client``."""
    n = 300 if quick else 3000
    for _ in range(50):
        client.execute(APP, "echo", "warm")
    out = {"execute": statistics.median(_round_trips(_echo_call(client), n))}
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
    out.update(_measure_rest(client, quick, async_callers))
    return out


def _measure_rest(
    client: Any, quick: bool, async_callers: list[Any] | None = None
) -> dict[str, float]:
    """The figures other than ``execute`` and ``execute_8``: a stream, a 1 MiB echo, and the
    asyncio calls (``async_callers``: one client per task, if given)."""
    out = {}
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


def _echo_call(client: Any) -> Callable[[], object]:
    return lambda: client.execute(APP, "echo", "hello")


def _round_trips(call: Callable[[], object], n: int) -> list[float]:
    """Each of ``n`` calls' round trip (s), one after the other."""
    times = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        call()
        times.append(clock() - t0)
    return times


def _calls_within(calls: list[Callable[[], object]], seconds: float) -> tuple[int, float]:
    """One thread per entry of ``calls``, each calling it once, then again until ``seconds``
    are up: the calls made by all of them and the wall time until the last one ended."""
    counts = [0] * len(calls)
    clock = time.perf_counter

    def caller(i: int) -> None:
        call = calls[i]
        k = 0
        while True:
            call()
            k += 1
            if clock() >= end:
                break
        counts[i] = k

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(calls))]
    end = clock() + seconds
    t0 = clock()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), clock() - t0


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


@contextlib.contextmanager
def _floor_rig(callers: int = 8, shared: bool = False) -> Iterator[_Side]:
    """The design's floor, up for the whole run (:func:`_alternate` measures it in slices
    between ours): ``callers`` bare callers (sockets of this process's threads, no frames, no
    client) through a raw trio forwarder process (a node doing nothing but forwarding) to 2 echo
    processes (workers costing nothing). What the pool, with the node in its data path as the
    design has it, could reach if client, node and workers did no work of their own. Its probe
    reads the forwarder's CPU seconds (no wake-up count: nan) and the echoes'.

    ``shared``: the callers share one connection instead, through the simplest correct client
    for that (:class:`SharedConn`: a reader thread hands each reply to its caller), which is
    our sync client's shape without its work: the floor of that shape."""
    tmp = tempfile.mkdtemp(prefix="bench-floor-")
    echoes = [os.path.join(tmp, f"echo{i}.sock") for i in range(2)]
    path = os.path.join(tmp, "node.sock")
    procs = [_start_helper("_floor_echo", echo) for echo in echoes]
    socks: list[socket.socket] = []
    conn: SharedConn | None = None
    try:
        forwarder = _start_helper("_floor_forwarder", path, *echoes)
        procs.append(forwarder)
        calls: list[Callable[[], object]] = []
        for _ in range(1 if shared else callers):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            socks.append(sock)
            sock.connect(path)
            if shared:
                conn = SharedConn(sock, _RECORD)
                calls = [conn.call] * callers
            else:
                calls.append(_bare_call(sock, sock.recv(1) + b"x" * (_RECORD - 1)))
        for call in calls:
            for _ in range(20):
                call()

        def probe() -> tuple[float, float, float]:
            echoes = sum(_cpu_seconds(p.pid) for p in procs[:2])
            return _cpu_seconds(forwarder.pid), math.nan, echoes

        yield _Side(calls, probe)
    finally:
        if conn is not None:
            conn.close()
        for sock in socks:
            sock.close()
        for proc in procs:
            proc.kill()
            proc.wait()


def _bare_call(sock: socket.socket, record: bytes) -> Callable[[], object]:
    def call() -> None:
        sock.sendall(record)
        got = 0
        while got < _RECORD:
            got += len(sock.recv(1 << 16))

    return call


@attrs.define
class _Side:
    """One side of the floor rows (our pool, or the floor): a call per caller thread (the first
    also makes the 1-caller calls) and a probe of its processes' counters (the node's or the
    forwarder's CPU seconds, its trio wake-ups, its workers' or echoes' CPU seconds).

    What its slices measured: every 1-caller round trip, the 8-caller calls and their wall time,
    and the counters' increase over each kind of slice (``spent[callers]``: the probe's three,
    then this process's CPU seconds)."""

    calls: list[Callable[[], object]]
    probe: Callable[[], tuple[float, float, float]]
    #: Turns the node's wake-up counter on (True) or off; None for the floor (it has none).
    count: Callable[[bool], object] | None = None
    #: Wake-ups per call by number of callers, from :meth:`count_wakeups`' slices.
    wakeups: dict[int, float] = attrs.Factory(dict)
    latencies: list[float] = attrs.Factory(list)
    made: int = 0
    seconds: float = 0.0
    spent: dict[int, list[float]] = attrs.Factory(dict)

    def one(self, n: int) -> None:
        """A slice of ``n`` calls by one caller."""
        with self._counting(1):
            self.latencies += _round_trips(self.calls[0], n)

    def many(self, seconds: float) -> None:
        """A slice of ``seconds`` with every caller calling."""
        with self._counting(len(self.calls)):
            made, took = _calls_within(self.calls, seconds)
        self.made += made
        self.seconds += took

    @contextlib.contextmanager
    def _counting(self, callers: int) -> Iterator[None]:
        before, mine = self.probe(), time.process_time()
        yield
        after, now = self.probe(), time.process_time()
        deltas = [b - a for a, b in zip(before, after, strict=True)]
        deltas.append(now - mine)
        total = self.spent.setdefault(callers, [0.0] * len(deltas))
        for i, d in enumerate(deltas):
            total[i] += d

    def count_wakeups(self, n: int, seconds: float) -> None:
        """The node's wake-ups per call (``wakeups``), over a slice of ``n`` calls by one
        caller and one of ``seconds`` with every caller, counted apart from the timed slices
        (the counter costs the node a hook call per wake-up)."""
        if self.count is None:
            return
        before = self.count(True)
        try:
            self.wakeups[1] = before
            _round_trips(self.calls[0], n)
            after = self.probe()[1]
            self.wakeups[1] = (after - before) / n
            made, _ = _calls_within(self.calls, seconds)
            self.wakeups[len(self.calls)] = (self.probe()[1] - after) / max(made, 1)
        finally:
            self.count(False)

    def per_call(self, callers: int) -> list[float]:
        """The counters' increase per call over the slices with ``callers`` callers."""
        calls = len(self.latencies) if callers == 1 else self.made
        return [d / max(calls, 1) for d in self.spent.get(callers, [])]

    def latency(self) -> float:
        """The median 1-caller round trip (s)."""
        return statistics.median(self.latencies)

    def rate(self) -> float:
        """Round trips/s, all callers together."""
        return self.made / self.seconds if self.seconds else 0.0


def _alternate(sides: list[_Side], quick: bool) -> None:
    """Measure ``sides`` (ours and the floor) in alternating slices, the order flipped each
    round, so that both see the same machine: on a shared machine the load drifts by the second,
    and one measured a minute after the other could differ by 2x either way."""
    rounds = 2 if quick else 6
    n = 150 if quick else 500
    seconds = 0.25 if quick else 0.5
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for side in order:
            side.one(n)
        for side in order:
            side.many(seconds)
    for side in sides:
        side.count_wakeups(n, seconds)


def _run_gunicorn(quick: bool) -> dict[str, float] | None:
    """Gunicorn's figures (:func:`_run_gunicorn_once`). Under load its arbiter now and then
    loses a worker mid-run (``DirtyWorkerError: ... Connection refused`` from its client, seen
    once in 7 runs at a load of 1.5): that run is measured again with a fresh gunicorn, and
    after a second failure its rows are left out, saying why, instead of ending the whole
    benchmark run."""
    for attempt in (1, 2):
        try:
            return _run_gunicorn_once(quick)
        except Exception as exc:
            then = "starting it again" if attempt == 1 else "its rows are left out of this run"
            print(f"bench_dirty: gunicorn failed while measured ({exc!r}); {then}", file=sys.stderr)
    return None


def _run_gunicorn_once(quick: bool) -> dict[str, float] | None:
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


#: Signals to the counted node (:func:`_counted_node`): turn its wake-up counter on, off.
_COUNT_ON = signal.SIGRTMIN
_COUNT_OFF = signal.SIGRTMIN + 1


def _counted_node(report: str, *argv: str) -> None:
    """(Its own process.) ``python -m otp.node *argv`` whose trio wake-ups can be counted
    (``benchmarks._wakeups``): ``_COUNT_ON`` installs the counter, ``_COUNT_OFF`` removes it
    (an installed instrument costs trio a hook call per wake-up, which the floor's forwarder
    does not pay: the timed slices run without it), and each of them and SIGUSR2 write the
    count so far to ``report`` once done."""
    import runpy
    import signal

    import trio

    from benchmarks._wakeups import WakeupCounter

    counter = WakeupCounter()
    run = trio.run
    token: list[trio.lowlevel.TrioToken] = []

    def counted_run(async_fn: Any, *args: Any, **kwargs: Any) -> Any:
        async def main() -> Any:
            token.append(trio.lowlevel.current_trio_token())
            return await async_fn(*args)

        return run(main, **kwargs)

    def write_count() -> None:
        with open(report + ".tmp", "w") as f:
            f.write(str(counter.count))
        os.replace(report + ".tmp", report)

    def switch(on: bool) -> None:
        # (In the run, not in the signal handler: trio may be inside an instrument hook.)
        if on:
            trio.lowlevel.add_instrument(counter)
        else:
            with contextlib.suppress(KeyError):
                trio.lowlevel.remove_instrument(counter)
        write_count()

    def on_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGUSR2 or not token:
            write_count()
        else:
            token[0].run_sync_soon(switch, signum == _COUNT_ON)

    trio.run = counted_run  # type: ignore[assignment]
    for signum in (signal.SIGUSR2, _COUNT_ON, _COUNT_OFF):
        signal.signal(signum, on_signal)
    sys.argv = ["otp.node", *argv]
    runpy.run_module("otp.node", run_name="__main__", alter_sys=True)


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (children, theirs, ...), from ``/proc``."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
            for child in map(int, f.read().split()):
                found += [child, *_descendants(child)]
    return found


def _probe_node(pid: int, report: str) -> tuple[float, float, float]:
    """The node's CPU seconds, trio wake-ups counted so far (see :func:`_counted_node`) and
    its worker processes' CPU seconds so far."""
    cpu = _cpu_seconds(pid)
    workers = 0.0
    for child in _descendants(pid):
        with contextlib.suppress(OSError):
            workers += _cpu_seconds(child)
    return cpu, _signal_node(pid, report, signal.SIGUSR2), workers


def _signal_node(pid: int, report: str, signum: int) -> float:
    """Send the counted node ``signum`` (:func:`_counted_node`); its wake-up count once it has
    acted on it (nan if it does not answer)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(report)
    os.kill(pid, signum)
    deadline = time.monotonic() + 5
    while not os.path.exists(report):
        if time.monotonic() > deadline:
            return math.nan
        time.sleep(0.001)
    with open(report) as f:
        return float(f.read())


def _start_pool(path: str, report: str) -> subprocess.Popen[bytes]:
    """Start our pool as users run it (``python -m otp.node --app apps.dirty ...``, its own OS
    process, same app, workers and threads as Gunicorn's; wrapped only to count its trio
    wake-ups into ``report``: :func:`_probe_node`), serving ``path`` once it answers."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = (
        "--log-level", "warning", "--app", "apps.dirty",
        "--dirty-app", APP, "--dirty-workers", "2", "--dirty-threads", "4",
        "--dirty-socket", path, "--dirty-pidfile", "",
    )  # fmt: skip
    code = f"from benchmarks.bench_dirty import _counted_node; _counted_node(*{(report, *argv)!r})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=root,
        env=dict(os.environ, PYTHONPATH=root),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def probe() -> None:
        with dirty.DirtyClient(path, timeout=2) as c:
            c.execute(APP, "echo", 1)

    if not _wait_answering(proc, probe, "the otp.node dirty pool"):
        _stop(proc)
        raise RuntimeError(f"the dirty pool node did not start (exit code {proc.poll()})")
    return proc


def _run_pool(quick: bool) -> tuple[dict[str, float], _Side, _Side, _Side]:
    """Measure our pool (:func:`_start_pool`) from this process with one sync client shared by
    the 8 caller threads; ``execute`` and ``execute_8`` in slices alternating with the floors'
    (:func:`_floor_rig`: bare callers, and callers sharing one connection; :func:`_alternate`).
    Returns the figures and the three sides (ours, the bare floor, the shared floor)."""
    tmp = tempfile.mkdtemp(prefix="bench-dirty-")
    path = os.path.join(tmp, "pool.sock")
    report = os.path.join(tmp, "wakeups")
    proc = _start_pool(path, report)
    try:
        client = dirty.DirtyClient(path, timeout=60)
        try:
            for _ in range(50):
                client.execute(APP, "echo", "warm")
            ours = _Side(
                [_echo_call(client)] * 8,
                lambda: _probe_node(proc.pid, report),
                lambda on: _signal_node(proc.pid, report, _COUNT_ON if on else _COUNT_OFF),
            )
            with _floor_rig() as floor, _floor_rig(shared=True) as shared:
                _alternate([ours, floor, shared], quick)
            out = {"execute": ours.latency(), "execute_8": ours.rate()}
            out.update(_measure_rest(client, quick))
            return out, ours, floor, shared
        finally:
            client.close()
    finally:
        _stop(proc)


def _cost_notes(pool: _Side, floor: _Side, callers: int, clients: str = "bare callers") -> str:
    """The floor rows' notes: each process's CPU per call beside its stand-in's, the node's
    wake-ups per call, and whether wire's C fast paths ran (the node, its workers and the
    client decode and frame with them: a stale build turns them all off, silently)."""
    node, _, workers, client = (x * 1e6 for x in pool.per_call(callers))
    forwarder, _, echoes, bare = (x * 1e6 for x in floor.per_call(callers))
    wakeups = pool.wakeups.get(callers, math.nan)
    return (
        f"; CPU us/call: node {node:.0f} (forwarder {forwarder:.0f}), workers"
        f" {workers:.0f} (echoes {echoes:.0f}), client {client:.0f} ({clients}"
        f" {bare:.0f}); {wakeups:.1f} node wake-ups/call; wire: {WIRE_PATHS}"
    )


def run(quick: bool) -> list[Result]:
    tmp = tempfile.mkdtemp(prefix="bench-raw-")
    n = 500 if quick else 5000
    raw_small = _raw_pingpong(os.path.join(tmp, "raw.sock"), n)
    raw_big = _raw_pingpong(os.path.join(tmp, "raw2.sock"), 5 if quick else 20, 1 << 20)
    ours, pool, floor, shared = _run_pool(quick)
    theirs = _run_gunicorn(quick)
    raw_rate = 1 / raw_small

    results = [
        Result("dirty.execute", "us", ours["execute"] * 1e6, "raw unix ping-pong",
               raw_small * 1e6, direction="lower",
               notes="echo in another process; target: at most 5x the raw round trip"),
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
               "no-work floor of a node in the path", floor.rate(),
               notes="8 bare callers -> raw trio forwarder -> 2 echo processes, in slices"
               " alternating with ours" + _cost_notes(pool, floor, 8)),
        Result("dirty.execute_8_vs_shared_floor", "calls/s", ours["execute_8"],
               "no-work floor of threads sharing a connection", shared.rate(),
               notes="8 threads sharing one connection (a reader thread, a SimpleQueue per"
               " caller) -> raw trio forwarder -> 2 echo processes, in slices alternating with"
               f" ours; this floor is {shared.rate() / max(floor.rate(), 1):.2f}x the bare"
               " floor's calls/s" + _cost_notes(pool, shared, 8, "sharing callers")),
        Result("dirty.execute_vs_floor", "us", ours["execute"] * 1e6,
               "no-work floor of a node in the path", floor.latency() * 1e6, direction="lower",
               notes="1 bare caller -> raw trio forwarder -> 2 echo processes, in slices"
               " alternating with ours (floor: see the module doc)" + _cost_notes(pool, floor, 1)),
    ]  # fmt: skip
    if theirs is not None:
        results += [
            Result("dirty.execute_vs_gunicorn", "us", ours["execute"] * 1e6,
                   "gunicorn 27 dirty arbiter", theirs["execute"] * 1e6, direction="lower",
                   notes=f"raw ping-pong {raw_small * 1e6:.1f} us"),
            Result("dirty.execute_8_vs_gunicorn", "calls/s", ours["execute_8"],
                   "gunicorn 27 dirty arbiter", theirs["execute_8"],
                   notes="target: at least 10x; gunicorn: one client per thread"),
            Result("dirty.execute_8_floor_vs_gunicorn", "calls/s", floor.rate(),
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
