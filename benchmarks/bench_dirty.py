"""Dirty pool benchmarks: a real pool (this process's node + worker processes) called by our
sync client, each figure against a raw Unix-socket ping-pong measured in the same run.

``dirty.execute``: median round trip of a small echo (1 client); ``dirty.execute_8``: calls/s
with 8 concurrent callers (threads sharing one client); ``dirty.stream``: chunks/s of a 10k-chunk
stream; ``dirty.bytes_1mib``: a 1 MiB echo round trip. (Gunicorn's arbiter is not compared here
yet.)
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import threading
import time

import trio

import otp
import supervisors
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
    """Median round trip (s) of ``size`` bytes over a Unix socket to an echo thread."""
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
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sender = threading.Thread(target=c.sendall, args=(payload,))
        sender.start()
        got = 0
        while got < size:
            got += len(c.recv(1 << 20))
        sender.join()
        times.append(time.perf_counter() - t0)
    c.close()
    t.join(5)
    server.close()
    os.unlink(path)
    return statistics.median(times)


def _measure(socket_path: str, quick: bool) -> dict[str, float]:
    client = dirty.DirtyClient(socket_path)
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

    def caller() -> None:
        for _ in range(per):
            client.execute(APP, "echo", "hello")

    threads = [threading.Thread(target=caller) for _ in range(8)]
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
    big = []
    for _ in range(5 if quick else 20):
        t0 = time.perf_counter()
        client.execute(APP, "echo", blob)
        big.append(time.perf_counter() - t0)
    out["bytes_1mib"] = statistics.median(big)
    client.close()
    return out


def _run_pool(quick: bool) -> dict[str, float]:
    tmp = tempfile.mkdtemp(prefix="bench-dirty-")
    path = os.path.join(tmp, "pool.sock")
    config = dirty.DirtyConfig(
        dirty_apps=[APP],
        dirty_workers=2,
        dirty_threads=4,
        dirty_socket=path,
        dirty_pidfile="",
        handle_signals=False,
    )
    result: dict[str, float] = {}

    async def main() -> None:
        await supervisors.start_application(dirty.application(dirty_config=config))
        result.update(await trio.to_thread.run_sync(_measure, path, quick))
        await supervisors.stop_application("dirty")

    otp.run(main)
    return result


def run(quick: bool) -> list[Result]:
    tmp = tempfile.mkdtemp(prefix="bench-raw-")
    n = 500 if quick else 5000
    raw_small = _raw_pingpong(os.path.join(tmp, "raw.sock"), n)
    raw_big = _raw_pingpong(os.path.join(tmp, "raw2.sock"), 5 if quick else 20, 1 << 20)
    ours = _run_pool(quick)
    raw_rate = 1 / raw_small
    return [
        Result("dirty.execute", "us", ours["execute"] * 1e6, "raw unix ping-pong",
               raw_small * 1e6, direction="lower"),
        Result("dirty.execute_8", "calls/s", ours["execute_8"], "raw ping-pong (1 caller)",
               raw_rate),
        Result("dirty.stream", "chunks/s", ours["stream"], "raw ping-pong round trips/s",
               raw_rate),
        Result("dirty.bytes_1mib", "ms", ours["bytes_1mib"] * 1e3, "raw 1 MiB ping-pong",
               raw_big * 1e3, direction="lower"),
    ]  # fmt: skip


BENCHMARKS = [Benchmark("dirty", run)]
