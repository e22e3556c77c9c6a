"""A Step forwarded to another matching server vs a local one (issue 20, MULTISERVER.md part C).

Two ``python -m otp.node --app apps.matching`` servers, each with its own SQLite store, their
nodes connected by otp's distribution over Unix sockets; one worker process (8 slots) connected
to server 2 only. A one-Step flow started through server 2 is dispatched locally (the
baseline); started through server 1, its Step is forwarded to server 2's matcher and its
outcome crosses back to server 1's engine. Both are measured in the same run, alternating:
the latency of one flow at a time (p50), and Steps/s with ``CONCURRENCY`` flows in flight, with
the CPU time and trio wake-ups per Step of each server.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from ._harness import Benchmark, Result
from .bench_matching import BenchFlow, _cpu_seconds, _Server

COOKIE = b"bench-matching-remote-cookie"
CONCURRENCY = 16


class _Node(_Server):
    """A matching server on a distributed node ``name@localhost`` (``connect``: the peer node
    it dials at boot, ``name@address``), its trio wake-ups counted as ``_Server``'s."""

    def __init__(self, name: str, cookie_file: str, connect: str | None = None) -> None:
        super().__init__()
        self.node = f"{name}@localhost"
        self.dist = f"unix:{os.path.join(self.tmp, 'dist.sock')}"
        self.cookie_file = cookie_file
        self.connect = connect

    def _argv(self) -> tuple[str, ...]:
        argv = (*super()._argv(), "--name", self.node, "--listen", self.dist)
        argv += ("--cookie-file", self.cookie_file)
        return argv if self.connect is None else (*argv, "--connect", self.connect)


def _measure(client_on: _Node, servers: list[_Node], quick: bool) -> dict[str, float]:
    """One flow at a time (p50 latency), then ``CONCURRENCY`` at once (Steps/s, CPU and
    wake-ups per Step on each server), every flow started through ``client_on``."""
    import trio

    from apps.matching import BlobCache, ClientOptions, Registry, TrioClient

    n = 100 if quick else 600
    seconds = 2.0 if quick else 6.0
    out: dict[str, float] = {}

    async def main() -> None:
        client = TrioClient(
            Registry((BenchFlow,)),
            BlobCache(client_on.blobs),
            ClientOptions(server_address=client_on.address),
        )
        try:
            times = []
            for i in range(n + 20):
                t0 = time.perf_counter()
                await client.result(await client.start_flow(BenchFlow, 1), timeout=30)
                if i >= 20:
                    times.append(time.perf_counter() - t0)
            out["p50"] = statistics.median(times)
            counts = [0]

            async def caller(end: float) -> None:
                while time.monotonic() < end:
                    await client.result(await client.start_flow(BenchFlow, 1), timeout=60)
                    counts[0] += 1

            pids = [s.proc.pid for s in servers if s.proc is not None]
            cpu0 = [_cpu_seconds([pid]) for pid in pids]
            wake0 = [s.wakeups() for s in servers]
            t0 = time.perf_counter()
            end = time.monotonic() + seconds
            async with trio.open_nursery() as nursery:
                for _ in range(CONCURRENCY):
                    nursery.start_soon(caller, end)
            elapsed = time.perf_counter() - t0
            steps = max(counts[0], 1)
            out["rate"] = counts[0] / elapsed
            for i, (pid, server) in enumerate(zip(pids, servers, strict=True)):
                out[f"cpu{i + 1}"] = (_cpu_seconds([pid]) - cpu0[i]) / steps
                out[f"wakeups{i + 1}"] = (server.wakeups() - wake0[i]) / steps
        finally:
            await client.close()

    trio.run(main)
    return out


def run(quick: bool) -> list[Result]:
    cookie_dir = tempfile.mkdtemp(prefix="bench-cookie-")
    cookie_file = os.path.join(cookie_dir, "cookie")
    with open(os.open(cookie_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(COOKIE)
    local: list[dict[str, float]] = []
    forwarded: list[dict[str, float]] = []
    try:
        with _Node("m1", cookie_file) as m1:
            with _Node("m2", cookie_file, connect=f"{m1.node}@{m1.dist}") as m2:
                m2.add_workers(1, 8)
                for _ in range(2 if quick else 3):  # alternating, medians reported
                    local.append(_measure(m2, [m1, m2], quick))
                    forwarded.append(_measure(m1, [m1, m2], quick))
    finally:
        shutil.rmtree(cookie_dir, ignore_errors=True)

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def costs(runs: list[dict[str, float]]) -> str:
        return (
            f"CPU per Step {med(runs, 'cpu1') * 1e6:.0f} us on server 1 +"
            f" {med(runs, 'cpu2') * 1e6:.0f} us on server 2, trio wake-ups per Step"
            f" {med(runs, 'wakeups1'):.1f} + {med(runs, 'wakeups2'):.1f}"
        )

    local_p50, fwd_p50 = med(local, "p50") * 1e6, med(forwarded, "p50") * 1e6
    local_rate, fwd_rate = med(local, "rate"), med(forwarded, "rate")
    return [
        Result(
            "matching_remote.step_latency",
            "us median",
            fwd_p50,
            "the same one-Step flow dispatched on its own server",
            local_p50,
            "lower",
            f"forwarded: {costs(forwarded)}; local: {costs(local)}",
        ),
        Result(
            "matching_remote.steps_per_s",
            "Steps/s",
            fwd_rate,
            f"the same {CONCURRENCY} flows in flight dispatched on their own server",
            local_rate,
            "higher",
            "one worker process (8 slots) on server 2; the forwarded flows are started through"
            " server 1",
        ),
    ]


BENCHMARKS = [Benchmark("matching_remote", run)]
