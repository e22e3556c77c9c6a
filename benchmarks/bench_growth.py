"""Growth benchmarks (issue 22): how the cost of one unit of work changes as N grows.

Every figure is a cost per unit at one N. Its row ``growth.<what>.<N>`` takes as baseline the
same cost at the smallest N, measured in the same run, so the ratio reads "how much of the
small-N speed is left" (1.0 = flat; the target is >= 0.5, i.e. within 2x, except for
``ordered_set``, whose baseline is the smallest N's cost scaled by log2 N: it is O(log n)).
Where raw trio (or a plain dict) has the same workload, ``growth.<what>.<N>.vs_trio`` (``vs_dict``)
compares with it at the same N.

- ``growth.spawn``: spawn N idle processes (each waiting in ``receive``), in a fresh OS process
  per N: us per spawn, tracemalloc bytes per process and RSS bytes per process (raw trio: N
  tasks in ``trio.sleep_forever``). ``growth.spawn.cpu`` is the CPU of that first batch and
  ``growth.spawn.gc_full`` / ``gc_young`` the part of it in the cyclic GC's collections:
  CPython runs a full collection only once the objects that survived young collections since
  the last one exceed a quarter of those that survived it, so each live object is scanned a
  bounded number of times and the GC's cost per spawn levels off (none at 1k, where no full
  collection runs; about 4 us at 10k; about 17 us of 60 at 100k and at 1M, 10 and 20 full
  collections), while ``cpu_outside_gc`` (and ``time_nogc``, a batch with the GC off) stays
  flat. ``gc.freeze()`` after boot saves nothing at 1M (the 42k boot objects are 0.3% of what
  is scanned), and freezing live processes would leak the dead ones (a process and its pid
  refer to each other, so only the cyclic GC frees them); a higher young threshold
  (``gc.set_threshold(10000)``: 47 CPU us at 100k) only postpones the first full collections,
  and is the application's call, as it sets the whole OS process's GC.
- ``growth.ring``: one message around a ring of N processes, us per hop (raw trio: N tasks
  joined by memory channels).
- ``growth.call_backlog``: ``call`` to an echo server while the caller's mailbox holds 0, 10k,
  100k unrelated messages: us per call (must stay flat: the reply never scans the mailbox).
- ``growth.ets``: ``insert`` (N new keys in random order into an empty table) and ``lookup``
  (random keys of a table of N objects), set and ordered_set: us per operation. Grows: set
  lookup as a dict's does (the machine's caches; vs_dict stays flat); ordered_set's index is
  a chunked sorted list (``otp/ets/_ordered_index.py``), so its insert is O(log n)-ish.
  At 1M objects a set's lookup costs 3-4x its 1k cost (its insert about 2x), as the plain
  dict's grows too (5-9x: its table and the objects no longer fit the caches), so ``vs_dict`` stays
  within 2x; ordered_set's insert grows with the comparisons of its bisects (each a cache
  miss at 1M), 5.0 / 8.1 / 13.3 CPU us at 1k / 100k / 1M (0.75 of log-scaled 1k).
- ``growth.dirty``: a real dirty pool (``python -m otp.node --app apps.dirty``, 2 workers x 4
  threads) called by 1, 8, 64 and 256 concurrent asyncio tasks sharing one client: calls/s
  (baseline: 1 caller) and p99 latency (baseline: the mean latency Little's law gives for
  that many callers at that throughput, so the ratio says how heavy the tail is).
- ``growth.supervisor``: a one_for_one supervisor of N GenServer children: start (us per
  child), restart of one killed child (us, until its ``init`` ran again), shutdown of all (us
  per child) (raw trio: N tasks started with ``nursery.start``, then cancelled).
- ``growth.mesh``: a full mesh of N nodes, each its own OS process on this machine (this one and
  N - 1 peers; every node dials the nodes after it, all at once): median connect time and
  one-way send throughput of one pair while the rest of the mesh is connected. The median
  connect grows with N as the handshakes a node has in flight do (N - 1, all at once, on a
  2-core machine: 2.5 / 8.6 / 17.4 ms at 2 / 4 / 8 nodes in one full run);
  ``growth.mesh.connect_per_peer`` divides by them (2.5 / 2.9 / 2.5 ms).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio
import trio.testing

import otp
from otp import ets
from supervisors import ChildSpec, Supervisor, SupFlags

from ._harness import Benchmark, Result

_ROOT = str(Path(__file__).resolve().parent.parent)


def _label(n: int) -> str:
    """``1k``, ``100k``, ``1M``: the N in a row's name."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def _rows(
    what: str,
    unit: str,
    costs: dict[int, float],
    *,
    direction: str = "lower",
    raw: dict[int, float] | None = None,
    raw_name: str = "raw trio",
    suffix: str = "vs_trio",
    log_scaled: bool = False,
    notes: str = "",
) -> list[Result]:
    """One row per N against the smallest N (``log_scaled``: that cost times log2 N / log2 N0),
    and, with ``raw``, one per N against ``raw`` at that N."""
    sizes = sorted(costs)
    first = sizes[0]
    out: list[Result] = []
    for n in sizes:
        base = costs[first]
        baseline = f"growth.{what}.{_label(first)} (same run)"
        if log_scaled and n != first:
            base *= math.log2(n) / math.log2(first)
            baseline = f"{_label(first)} x log2(N)/log2({_label(first)})"
        out.append(
            Result(f"growth.{what}.{_label(n)}", unit, costs[n], baseline, base,
                   direction=direction,  # type: ignore[arg-type]
                   notes=notes if n == first else "")
        )  # fmt: skip
        if raw is not None and n in raw:
            out.append(
                Result(f"growth.{what}.{_label(n)}.{suffix}", unit, costs[n],
                       f"{raw_name}, N = {_label(n)}", raw[n],
                       direction=direction)  # type: ignore[arg-type]
            )  # fmt: skip
    return out


def _helper(function: str, *args: Any) -> dict[str, Any]:
    """Run ``function(*args)`` of this module in a fresh Python process; its last stdout line
    is the JSON it prints."""
    code = f"from benchmarks.bench_growth import {function}; {function}(*{args!r})"
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"bench_growth: {function}{args!r} failed:\n{done.stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _report(answer: dict[str, Any]) -> None:
    """(In a helper process.) Print the answer and leave at once: tearing down a million
    tasks would take longer than making them, and is not what is measured."""
    print(json.dumps(answer), flush=True)
    os._exit(0)


# -- spawn and idle memory ------------------------------------------------------------------


def spawn_probe(kind: str, n: int) -> None:
    """(Its own process.) Spawn ``n`` idle processes (``kind`` "otp") or trio tasks ("trio"):
    report per spawn the seconds and RSS growth of that first batch (the best seconds of a few
    more batches of ``n`` when ``n`` is small: one batch is then a few milliseconds), the
    seconds of a batch of ``min(n, 100k)`` with the cyclic GC off, and the tracemalloc bytes
    of a batch of ``min(n, 10k)`` (marginal costs with the first ``n`` alive; tracemalloc
    slows every allocation, so it times nothing)."""

    async def idle() -> None:
        await otp.receive()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if kind == "otp":
                spawn = otp.spawn

                def batch(count: int) -> None:
                    for _ in range(count):
                        spawn(idle)

            else:
                start_soon, sleep_forever = nursery.start_soon, trio.sleep_forever

                def batch(count: int) -> None:
                    for _ in range(count):
                        start_soon(sleep_forever)

            async def timed_batch(count: int) -> float:
                start = time.perf_counter()
                batch(count)
                await trio.testing.wait_all_tasks_blocked()
                return time.perf_counter() - start

            # CPU seconds of the first batch, and of them those spent in the cyclic GC's
            # collections (by generation): what load on the machine does not disturb.
            in_gc = [0.0, 0.0, 0.0]
            gc_start = [0.0]

            def on_gc(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    gc_start[0] = time.process_time()
                else:
                    in_gc[info["generation"]] += time.process_time() - gc_start[0]

            gc.collect()
            rss0 = _rss()
            gc.callbacks.append(on_gc)
            cpu = time.process_time()
            best = await timed_batch(n)
            cpu = time.process_time() - cpu
            gc.callbacks.remove(on_gc)
            gc.collect()
            rss = _rss() - rss0
            for _ in range(4 if n <= 10_000 else 0):
                best = min(best, await timed_batch(n))
            # The same with the cyclic GC off: what spawning costs without the collections
            # that scan every live object (which is where the growth with N goes).
            gc.disable()
            nogc = min(n, 100_000)
            unscanned = await timed_batch(nogc)
            gc.enable()
            traced = min(n, 10_000)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            batch(traced)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
            _report(
                {"seconds": best / n, "nogc": unscanned / nogc, "rss": rss / n,
                 "traced": grown / traced, "cpu": cpu / n, "gc_young": sum(in_gc[:2]) / n,
                 "gc_full": in_gc[2] / n}
            )  # fmt: skip

    if kind == "otp":
        otp.run(main)
    else:
        trio.run(main)


def _gc_rows(found: dict[int, dict[str, float]]) -> list[Result]:
    """Per N, the CPU per spawn spent in the cyclic GC: full (generation 2) and young
    collections, each against the whole CPU per spawn at that N (the ratio is the share)."""
    rows = []
    for n, f in sorted(found.items()):
        for key, what in (("gc_full", "full"), ("gc_young", "young")):
            rows.append(
                Result(f"growth.spawn.gc_{what}.{_label(n)}", "CPU us/spawn", f[key] * 1e6,
                       f"CPU per spawn, N = {_label(n)} (ratio: the GC's share)", f["cpu"] * 1e6,
                       direction="higher",
                       notes="" if n != min(found) else f"CPU in the cyclic GC's {what}"
                       " collections during the first batch")
            )  # fmt: skip
    return rows


def spawn(quick: bool) -> list[Result]:
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000)
    ours = {n: _helper("spawn_probe", "otp", n) for n in sizes}
    raw = {n: _helper("spawn_probe", "trio", n) for n in sizes}

    def per(found: dict[int, dict[str, float]], key: str, scale: float = 1.0) -> dict[int, float]:
        return {n: f[key] * scale for n, f in found.items()}

    return [
        *_rows("spawn.time", "us/spawn", per(ours, "seconds", 1e6),
               raw=per(raw, "seconds", 1e6), raw_name="trio start_soon",
               notes="spawn N idle processes, until all wait in receive"),
        *_rows("spawn.time_nogc", "us/spawn", per(ours, "nogc", 1e6),
               raw=per(raw, "nogc", 1e6), raw_name="trio start_soon, GC off",
               notes="the same with the cyclic GC off (a batch of min(N, 100k) more)"),
        *_rows("spawn.cpu", "CPU us/spawn", per(ours, "cpu", 1e6),
               raw=per(raw, "cpu", 1e6), raw_name="trio start_soon",
               notes="CPU time of the first batch of N (what load disturbs least)"),
        *_rows("spawn.cpu_outside_gc", "CPU us/spawn",
               {n: (f["cpu"] - f["gc_young"] - f["gc_full"]) * 1e6 for n, f in ours.items()},
               notes="the same without the CPU of the cyclic GC's collections"),
        *_gc_rows(ours),
        *_rows("spawn.bytes", "bytes/process", per(ours, "traced"),
               raw=per(raw, "traced"), raw_name="idle trio task",
               notes="tracemalloc, per idle process (a batch of min(N, 10k) more, N alive)"),
        *_rows("spawn.rss", "RSS bytes/process", per(ours, "rss"),
               notes="growth of the OS process's resident set, per idle process"),
    ]  # fmt: skip


# -- ring -----------------------------------------------------------------------------------


def _hops(n: int, quick: bool) -> int:
    """Rounds x ``n``: at least a few rounds, and about the same number of hops at every N."""
    total = 30_000 if quick else 300_000
    return max(2, total // n)


def _otp_ring(n: int, rounds: int) -> float:
    async def link(next_: otp.Pid) -> None:
        receive, send = otp.receive, otp.send
        while True:
            send(next_, await receive())

    async def main() -> float:
        send, receive = otp.send, otp.receive
        head = otp.self()
        for _ in range(n - 1):
            head = otp.spawn(link, head)
        await trio.testing.wait_all_tasks_blocked()
        start = time.perf_counter()
        for i in range(rounds):
            send(head, i)
            await receive()
        return time.perf_counter() - start

    return otp.run(main)


def _trio_ring(n: int, rounds: int) -> float:
    async def main() -> float:
        first_tx, rx = trio.open_memory_channel[Any](math.inf)
        async with trio.open_nursery() as nursery:

            async def link(inbox: Any, outbox: Any) -> None:
                async for message in inbox:
                    outbox.send_nowait(message)

            for _ in range(n - 1):
                tx, next_rx = trio.open_memory_channel[Any](math.inf)
                nursery.start_soon(link, rx, tx)
                rx = next_rx
            await trio.testing.wait_all_tasks_blocked()
            start = time.perf_counter()
            for i in range(rounds):
                first_tx.send_nowait(i)
                await rx.receive()
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        return elapsed

    return trio.run(main)


def ring(quick: bool) -> list[Result]:
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    ours, raw = {}, {}
    for n in sizes:
        rounds = _hops(n, quick)
        ours[n] = min(_otp_ring(n, rounds) for _ in range(2)) / (rounds * n) * 1e6
        raw[n] = min(_trio_ring(n, rounds) for _ in range(2)) / (rounds * n) * 1e6
    return _rows("ring", "us/hop", ours, raw=raw, raw_name="trio memory-channel ring",
                 notes="one message around a ring of N processes")  # fmt: skip


# -- call with a backlog --------------------------------------------------------------------


class _Echo(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(request, state)


def _backlog_call(backlog: int, calls: int) -> float:
    async def main() -> float:
        server = await _Echo.start_link()
        me, send, call = otp.self(), otp.send, otp.call
        for i in range(backlog):
            send(me, ("unrelated", i))
        for i in range(200):
            await call(server, i)
        start = time.perf_counter()
        for i in range(calls):
            await call(server, i)
        elapsed = time.perf_counter() - start
        info = otp.process_info(me)
        left = info.message_queue_len if info is not None else -1
        if left != backlog:
            raise AssertionError(f"the backlog changed during the calls: {left} != {backlog}")
        return elapsed

    return otp.run(main)


def call_backlog(quick: bool) -> list[Result]:
    # A backlog costs only its sends (well under a second for 100k), so quick runs every N.
    sizes = (0, 10_000, 100_000)
    calls = 5_000 if quick else 20_000
    costs = {n: min(_backlog_call(n, calls) for _ in range(3)) / calls * 1e6 for n in sizes}
    rows = []
    for n in sizes:
        rows.append(
            Result(f"growth.call_backlog.{_label(n)}", "us/call", costs[n],
                   "growth.call_backlog.0 (same run)", costs[0], direction="lower",
                   notes="" if n else "call an echo server, N unrelated messages in the caller's"
                   " mailbox")
        )  # fmt: skip
    return rows


# -- ets ------------------------------------------------------------------------------------

_LOOKUPS = 100_000


def _ets_costs(n: int, kind: ets.TableType, repeats: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        rng = random.Random(22)
        keys = list(range(n))
        rng.shuffle(keys)
        objects = [(key, key) for key in keys]
        probes = [rng.randrange(n) for _ in range(_LOOKUPS)]
        insert, lookup = ets.insert, ets.lookup
        best = dict.fromkeys(("insert", "lookup", "dict_insert", "dict_lookup"), math.inf)
        gc.disable()
        try:
            for _ in range(repeats):
                table = ets.new("growth", type=kind)
                start = time.perf_counter()
                for obj in objects:
                    insert(table, obj)
                best["insert"] = min(best["insert"], time.perf_counter() - start)
                start = time.perf_counter()
                for key in probes:
                    lookup(table, key)
                best["lookup"] = min(best["lookup"], time.perf_counter() - start)
                ets.delete(table)
                plain: dict[Any, Any] = {}
                start = time.perf_counter()
                for obj in objects:
                    plain[obj[0]] = obj
                best["dict_insert"] = min(best["dict_insert"], time.perf_counter() - start)
                get = plain.get
                start = time.perf_counter()
                for key in probes:
                    get(key)
                best["dict_lookup"] = min(best["dict_lookup"], time.perf_counter() - start)
                del plain
                gc.collect()
        finally:
            gc.enable()
        return {
            "insert": best["insert"] / n * 1e6,
            "lookup": best["lookup"] / _LOOKUPS * 1e6,
            "dict_insert": best["dict_insert"] / n * 1e6,
            "dict_lookup": best["dict_lookup"] / _LOOKUPS * 1e6,
        }

    return otp.run(main)


def ets_growth(quick: bool) -> list[Result]:
    sizes = (1_000, 100_000) if quick else (1_000, 100_000, 1_000_000)
    rows = []
    for kind in (ets.SET, ets.ORDERED_SET):
        costs = {n: _ets_costs(n, kind, (3 if quick else 5) if n < 1_000_000 else 2) for n in sizes}
        ordered = kind is ets.ORDERED_SET
        for op in ("insert", "lookup"):
            what = "insert: N new keys (random order) into an empty table" if op == "insert" else (
                f"lookup: {_LOOKUPS:,} random keys of a table of N objects")  # fmt: skip
            rows += _rows(
                f"ets.{kind}.{op}",
                "us/op",
                {n: c[op] for n, c in costs.items()},
                raw=None if ordered else {n: c[f"dict_{op}"] for n, c in costs.items()},
                raw_name="dict",
                suffix="vs_dict",
                log_scaled=ordered,
                notes=what,
            )
    return rows


# -- dirty pool -----------------------------------------------------------------------------

_DIRTY_APP = "benchmarks.bench_dirty:BenchApp"


def _start_pool(path: str) -> subprocess.Popen[bytes]:
    from apps import dirty

    args = [
        sys.executable, "-m", "otp.node", "--log-level", "warning", "--app", "apps.dirty",
        "--dirty-app", _DIRTY_APP, "--dirty-workers", "2", "--dirty-threads", "4",
        "--dirty-socket", path, "--dirty-pidfile", "",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=_ROOT)
    proc = subprocess.Popen(
        args, cwd=_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with dirty.DirtyClient(path, timeout=2) as client:
                client.execute(_DIRTY_APP, "echo", 1)
            return proc
        except Exception:
            time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"bench_growth: the dirty pool node did not start ({proc.poll()})")


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _dirty_load(path: str, callers: int, calls: int) -> tuple[float, list[float]]:
    """``calls`` echo calls in all from ``callers`` asyncio tasks sharing one client:
    (seconds, each call's latency)."""
    from apps import dirty

    client = dirty.DirtyClient(path, timeout=60)
    try:
        for _ in range(50):
            await client.execute_async(_DIRTY_APP, "echo", "warm")
        latencies: list[float] = []
        clock = time.perf_counter
        per = max(1, calls // callers)

        async def caller() -> None:
            for _ in range(per):
                t0 = clock()
                await client.execute_async(_DIRTY_APP, "echo", "hello")
                latencies.append(clock() - t0)

        start = clock()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return clock() - start, latencies
    finally:
        await client.close_async()


def dirty_pool(quick: bool) -> list[Result]:
    sizes = (1, 8, 64, 256)
    calls = 1_500 if quick else 10_000
    rates, p99s, means = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        path = os.path.join(tmp, "pool.sock")
        proc = _start_pool(path)
        try:
            for callers in sizes:
                seconds, latencies = asyncio.run(_dirty_load(path, callers, max(calls, callers)))
                rates[callers] = len(latencies) / seconds
                p99s[callers] = statistics.quantiles(latencies, n=100)[98] * 1e6
                means[callers] = callers / rates[callers] * 1e6
        finally:
            _stop(proc)
    rows = _rows("dirty.callers", "calls/s", rates, direction="higher",
                 notes="N asyncio tasks sharing one DirtyClient; echo of a short str")  # fmt: skip
    for callers in sizes:
        rows.append(
            Result(f"growth.dirty.callers.{callers}.p99", "us", p99s[callers],
                   "mean latency by Little's law (N / throughput)", means[callers],
                   direction="lower",
                   notes="" if callers > 1 else "p99 of every call's latency at N callers")
        )  # fmt: skip
    return rows


# -- supervisor -----------------------------------------------------------------------------


class _Reporter(otp.GenServer):
    """A child that tells the benchmark each time its ``init`` runs (so a restart is seen
    without asking the supervisor, whose answers grow with its children)."""

    async def init(self, report_to: otp.Pid) -> Any:
        otp.send(report_to, ("up", otp.self()))
        return otp.Ok(None)


def _otp_supervisor(n: int, restarts: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        otp.process_flag(trap_exit=True)
        me = otp.self()
        children = [ChildSpec(f"w{i}", (_Reporter.start_link, me)) for i in range(n)]
        flags = SupFlags(intensity=restarts + 10, period=3600)
        start = time.perf_counter()
        sup = await Supervisor.start_link(flags, children)
        started = time.perf_counter() - start
        pids = []
        for _ in range(n):
            pids.append((await otp.receive())[1])
        samples = []
        victim = pids[n // 2]
        for _ in range(restarts):
            start = time.perf_counter()
            otp.exit(victim, otp.KILL)
            _, victim = await otp.receive(tuple)
            samples.append(time.perf_counter() - start)
        start = time.perf_counter()
        otp.exit(sup, otp.SHUTDOWN)
        await otp.receive(otp.Exit)
        stopped = time.perf_counter() - start
        return {
            "start": started / n * 1e6,
            "restart": statistics.median(samples) * 1e6,
            "shutdown": stopped / n * 1e6,
        }

    return otp.run(main)


def _trio_supervisor(n: int) -> dict[str, float]:
    async def worker(task_status: Any) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def main() -> dict[str, float]:
        async with trio.open_nursery() as outer:
            nursery_box: list[trio.Nursery] = []
            done = trio.Event()

            async def tree(task_status: Any) -> None:
                async with trio.open_nursery() as nursery:
                    nursery_box.append(nursery)
                    task_status.started()
                    await trio.sleep_forever()
                done.set()

            await outer.start(tree)
            nursery = nursery_box[0]
            start = time.perf_counter()
            for _ in range(n):
                await nursery.start(worker)
            started = time.perf_counter() - start
            start = time.perf_counter()
            nursery.cancel_scope.cancel()
            await done.wait()
            stopped = time.perf_counter() - start
        return {"start": started / n * 1e6, "shutdown": stopped / n * 1e6}

    return trio.run(main)


def supervisor(quick: bool) -> list[Result]:
    sizes = (10, 1_000) if quick else (10, 1_000, 10_000)
    restarts = 50 if quick else 200
    ours: dict[int, dict[str, float]] = {}
    raw: dict[int, dict[str, float]] = {}
    for n in sizes:
        runs = [_otp_supervisor(n, restarts) for _ in range(3 if n <= 1_000 else 1)]
        ours[n] = {k: min(r[k] for r in runs) for k in ("start", "restart", "shutdown")}
        raws = [_trio_supervisor(n) for _ in range(3)]
        raw[n] = {k: min(r[k] for r in raws) for k in ("start", "shutdown")}
    return [
        *_rows("supervisor.start", "us/child", {n: c["start"] for n, c in ours.items()},
               raw={n: c["start"] for n, c in raw.items()}, raw_name="trio nursery.start",
               notes="Supervisor.start_link of N GenServer children (one_for_one)"),
        *_rows("supervisor.restart", "us", {n: c["restart"] for n, c in ours.items()},
               notes=f"median of {restarts} kills of one child among N, until its init ran"),
        *_rows("supervisor.shutdown", "us/child", {n: c["shutdown"] for n, c in ours.items()},
               raw={n: c["shutdown"] for n, c in raw.items()}, raw_name="trio cancel of N tasks",
               notes="orderly shutdown of the supervisor and its N children"),
    ]  # fmt: skip


# -- mesh -----------------------------------------------------------------------------------

_COOKIE = b"growth-benchmark-cookie-22"

_PEER = r"""
import sys, time, otp, trio

async def sink():
    count = 0
    while True:
        message = await otp.receive()
        if message.__class__ is tuple and message[0] == "expect":
            while count < message[2]:
                await otp.receive()
                count += 1
            otp.send(message[1], ("got", count))
            count = 0
        else:
            count += 1

async def control():
    while True:
        reply_to, peers = await otp.receive()
        times = []

        async def dial(name, address):
            start = time.perf_counter()
            ok = await otp.connect(name, address)
            times.append(time.perf_counter() - start if ok else -1.0)

        async with trio.open_nursery() as nursery:
            for name, address in peers:
                nursery.start_soon(dial, name, address)
        otp.send(reply_to, ("dialled", otp.node_name(), times))

async def main():
    config = otp.DistConfig(cookie=COOKIE, listen=(sys.argv[2],), mesh=False)
    await otp.start_distribution(config)
    otp.register("sink", otp.spawn(sink))
    otp.register("control", otp.spawn(control))
    print("ready", flush=True)
    await trio.sleep_forever()

otp.run(main, name=sys.argv[1])
"""


def _start_peer(name: str, address: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = _PEER.replace("COOKIE", repr(_COOKIE))
    return subprocess.Popen(
        [sys.executable, "-c", code, name, address], stdout=subprocess.PIPE, text=True, env=env
    )


def _mesh(n: int, sends: int, tmp: str) -> dict[str, float]:
    names = [f"growth{i}@localhost" for i in range(n)]
    addresses = [f"unix:{tmp}/n{n}-{i}.sock" for i in range(n)]
    peers = [_start_peer(names[i], addresses[i]) for i in range(1, n)]
    try:
        for peer in peers:
            assert peer.stdout is not None
            if peer.stdout.readline().strip() != "ready":
                raise RuntimeError("bench_growth: a mesh peer did not start")

        async def main() -> dict[str, float]:
            config = otp.DistConfig(cookie=_COOKIE, listen=tuple([addresses[0]]), mesh=False)  # type: ignore[list-item]
            await otp.start_distribution(config)
            me = otp.self()
            times: list[float] = []
            start = time.perf_counter()

            async def dial(name: str, address: str) -> None:
                t0 = time.perf_counter()
                if not await otp.connect(name, address):
                    raise RuntimeError(f"bench_growth: could not connect to {name}")
                times.append(time.perf_counter() - t0)

            # This node dials every peer; each peer dials the peers after it, all at once.
            async with trio.open_nursery() as nursery:
                for i in range(1, n):
                    nursery.start_soon(dial, names[i], addresses[i])
            for i in range(1, n):
                later = list(zip(names[i + 1 :], addresses[i + 1 :], strict=True))
                otp.send(("control", names[i]), (me, later))
            for _ in range(1, n):
                _, _, theirs = await otp.receive(lambda m: m[0] == "dialled")
                if min(theirs, default=0.0) < 0:
                    raise RuntimeError("bench_growth: a peer could not connect to another")
                times.extend(theirs)
            meshed = time.perf_counter() - start
            sink: Any = ("sink", names[1])
            for i in range(200):
                otp.send(sink, i)
            otp.send(sink, ("expect", me, 200))
            await otp.receive(lambda m: m[0] == "got")
            send = otp.send
            start = time.perf_counter()
            send(sink, ("expect", me, sends))
            for i in range(sends):
                send(sink, i)
                if i % 1000 == 999:
                    await trio.sleep(0)
            got = await otp.receive(lambda m: m[0] == "got")
            elapsed = time.perf_counter() - start
            if got != ("got", sends):
                raise AssertionError(f"the sink got {got!r}, expected {sends} messages")
            return {
                "connect": statistics.median(times) * 1e3,
                "meshed": meshed * 1e3,
                "send": sends / elapsed,
            }

        return otp.run(main, name=names[0])
    finally:
        for peer in peers:
            peer.kill()
            peer.wait()


def _per_peer(connect: dict[int, float]) -> dict[int, float]:
    """Each N's median connect time over the N - 1 handshakes every node of the mesh has in
    flight at once (it dials the nodes after it as the ones before it dial it): a connect's
    wall time holds its node's share of all of them, so this is the cost of one."""
    return {n: ms / (n - 1) for n, ms in connect.items()}


def mesh(quick: bool) -> list[Result]:
    sizes = (2, 4) if quick else (2, 4, 8)
    sends = 20_000 if quick else 100_000
    found = {}
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        for n in sizes:
            found[n] = _mesh(n, sends, tmp)
    meshed = ", ".join(f"N={n}: {found[n]['meshed']:.0f} ms" for n in sizes)
    connect = {n: f["connect"] for n, f in found.items()}
    return [
        *_rows("mesh.connect", "ms", connect,
               notes=f"median connect (dial + handshake) in a mesh of N; whole mesh: {meshed}"),
        *_rows("mesh.connect_per_peer", "ms", _per_peer(connect),
               notes="median connect / (N - 1): a node's N - 1 handshakes run at once"),
        *_rows("mesh.send", "messages/s", {n: f["send"] for n, f in found.items()},
               direction="higher", notes="one-way sends of one pair, the rest of the mesh idle"),
    ]  # fmt: skip


BENCHMARKS = [
    Benchmark("growth.spawn", spawn),
    Benchmark("growth.ring", ring),
    Benchmark("growth.call_backlog", call_backlog),
    Benchmark("growth.ets", ets_growth),
    Benchmark("growth.dirty", dirty_pool),
    Benchmark("growth.supervisor", supervisor),
    Benchmark("growth.mesh", mesh),
]
