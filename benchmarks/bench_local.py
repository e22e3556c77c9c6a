"""In-process benchmarks of the core runtime against raw trio in the same run.

local.ping_pong, local.send, local.call, local.spawn and local.memory, plus pykka's actors
(when installed) on the same ping-pong and call workloads.
"""

from __future__ import annotations

import gc
import math
import statistics
import sys
import time
import tracemalloc
from typing import Any

import trio

import otp

from ._harness import Benchmark, Result

_TRIOTP_NOTE = (
    "triotp (0.3 needs Python >= 3.13) is shown when installed"
    if sys.version_info >= (3, 13)
    else "triotp not measured: triotp 0.3 needs Python >= 3.13, this is " + sys.version.split()[0]
)

# -- ping-pong --------------------------------------------------------------------------------


def _raw_ping_pong(n: int) -> float:
    async def main() -> float:
        to_pong, pong_inbox = trio.open_memory_channel[Any](math.inf)
        to_ping, ping_inbox = trio.open_memory_channel[Any](math.inf)

        async def pong() -> None:
            async for message in pong_inbox:
                to_ping.send_nowait(message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pong)
            start = time.perf_counter()
            for i in range(n):
                to_pong.send_nowait(i)
                await ping_inbox.receive()
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
        return elapsed

    return trio.run(main)


def _otp_ping_pong(n: int) -> float:
    async def pong() -> None:
        receive = otp.receive
        send = otp.send
        while True:
            sender, message = await receive()
            send(sender, message)

    async def main() -> float:
        other = otp.spawn(pong)
        me = otp.self()
        send = otp.send
        receive = otp.receive
        start = time.perf_counter()
        for i in range(n):
            send(other, (me, i))
            await receive()
        return time.perf_counter() - start

    return otp.run(main)


def ping_pong(quick: bool) -> list[Result]:
    n = 20_000 if quick else 100_000
    raw = min(_raw_ping_pong(n) for _ in range(3))
    ours = min(_otp_ping_pong(n) for _ in range(3))
    results = [Result("local.ping_pong", "round trips/s", n / ours, "raw trio channels", n / raw)]
    peer = _pykka_ping_pong(n // 10)
    if peer is not None:
        results.append(
            Result(
                "peer.pykka.ping_pong",
                "round trips/s",
                peer,
                "raw trio channels",
                n / raw,
                notes="pykka ThreadingActor ask() round trips",
            )
        )
    return results


def _pykka_samples(n: int) -> list[float] | None:
    """Seconds each of ``n`` pykka ``ask()`` round trips took, or None without pykka."""
    try:
        import pykka
    except ImportError:
        return None

    class Echo(pykka.ThreadingActor):  # type: ignore[misc]
        def on_receive(self, message: Any) -> Any:
            return message

    ref = Echo.start()
    try:
        samples = []
        clock = time.perf_counter
        for i in range(n):
            start = clock()
            ref.ask(i)
            samples.append(clock() - start)
        return samples
    finally:
        ref.stop()


def _pykka_ping_pong(n: int) -> float | None:
    samples = _pykka_samples(n)
    return None if samples is None else n / sum(samples)


# -- one-way send -----------------------------------------------------------------------------


def _raw_send(n: int) -> float:
    async def main() -> float:
        tx, rx = trio.open_memory_channel[Any](math.inf)
        done = trio.Event()

        async def drain() -> None:
            for _ in range(n):
                await rx.receive()
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked()
            start = time.perf_counter()
            for i in range(n):
                tx.send_nowait(i)
            await done.wait()
            return time.perf_counter() - start

    import trio.testing

    return trio.run(main)


def _otp_send(n: int) -> float:
    async def drain(reply_to: otp.Pid) -> None:
        receive = otp.receive
        for _ in range(n):
            await receive()
        otp.send(reply_to, "done")

    async def main() -> float:
        import trio.testing

        other = otp.spawn(drain, otp.self())
        await trio.testing.wait_all_tasks_blocked()
        send = otp.send
        start = time.perf_counter()
        for i in range(n):
            send(other, i)
        await otp.receive()
        return time.perf_counter() - start

    return otp.run(main)


def one_way(quick: bool) -> list[Result]:
    n = 200_000 if quick else 1_000_000
    raw = min(_raw_send(n) for _ in range(3))
    ours = min(_otp_send(n) for _ in range(3))
    return [Result("local.send", "messages/s", n / ours, "trio channel send_nowait", n / raw)]


# -- call -------------------------------------------------------------------------------------


class _Echo(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(request, state)


def _raw_call(n: int) -> list[float]:
    async def main() -> list[float]:
        requests, inbox = trio.open_memory_channel[Any](math.inf)

        async def server() -> None:
            async for request, reply_channel in inbox:
                reply_channel.send_nowait(request)

        samples = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            clock = time.perf_counter
            for i in range(n):
                start = clock()
                reply_tx, reply_rx = trio.open_memory_channel[Any](1)
                requests.send_nowait((i, reply_tx))
                await reply_rx.receive()
                samples.append(clock() - start)
            nursery.cancel_scope.cancel()
        return samples

    return trio.run(main)


def _otp_call(n: int) -> list[float]:
    async def main() -> list[float]:
        server = await _Echo.start_link()
        call = otp.call
        clock = time.perf_counter
        samples = []
        for i in range(n):
            start = clock()
            await call(server, i)
            samples.append(clock() - start)
        return samples

    return otp.run(main)


def call(quick: bool) -> list[Result]:
    n = 5_000 if quick else 20_000
    raw = min(statistics.median(_raw_call(n)) for _ in range(3))
    ours = min(statistics.median(_otp_call(n)) for _ in range(3))
    results = [
        Result(
            "local.call",
            "us median",
            ours * 1e6,
            "trio request + reply channel",
            raw * 1e6,
            direction="lower",
        )
    ]
    peer = _pykka_call(n // 5)
    if peer is not None:
        results.append(
            Result(
                "peer.pykka.call",
                "us median",
                peer * 1e6,
                "trio request + reply channel",
                raw * 1e6,
                direction="lower",
                notes="pykka ThreadingActor ask()",
            )
        )
    return results


def _pykka_call(n: int) -> float | None:
    samples = _pykka_samples(n)
    return None if samples is None else statistics.median(samples)


# -- spawn ------------------------------------------------------------------------------------


def _raw_spawn(n: int) -> float:
    async def trivial(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def main() -> float:
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                await nursery.start(trivial)
        return time.perf_counter() - start

    return trio.run(main)


def _otp_spawn(n: int) -> float:
    async def trivial() -> None:
        return

    async def main() -> float:
        start = time.perf_counter()
        spawn_monitor = otp.spawn_monitor
        for _ in range(n):
            spawn_monitor(trivial)
        receive = otp.receive
        for _ in range(n):
            await receive()
        return time.perf_counter() - start

    return otp.run(main)


def spawn(quick: bool) -> list[Result]:
    n = 2_000 if quick else 10_000
    raw = min(_raw_spawn(n) for _ in range(3))
    ours = min(_otp_spawn(n) for _ in range(3))
    return [
        Result(
            "local.spawn",
            "spawns/s",
            n / ours,
            "trio nursery.start",
            n / raw,
            notes="spawn_monitor + await the DOWN of each",
        )
    ]


# -- memory -----------------------------------------------------------------------------------


def _bytes_per_task(n: int) -> float:
    async def main() -> float:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            nursery.cancel_scope.cancel()
        tracemalloc.stop()
        return (after - before) / n

    import trio.testing

    return trio.run(main)


def _bytes_per_process(n: int) -> float:
    async def idle() -> None:
        await otp.receive()

    async def main() -> float:
        import trio.testing

        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(n):
            otp.spawn(idle)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return (after - before) / n

    return otp.run(main)


def memory(quick: bool) -> list[Result]:
    n = 20_000 if quick else 100_000
    raw = _bytes_per_task(n)
    ours = _bytes_per_process(n)
    return [
        Result(
            "local.memory",
            "bytes/idle process",
            ours,
            "idle trio task",
            raw,
            direction="lower",
            notes=(
                "tracemalloc; target <= 3 KiB per process. The floor: the idle trio task of the"
                " baseline, plus ~800 B for the process's own cancel scope (a CancelScope, its"
                " CancelStatus and that status's two sets, the nursery status's set entry): how"
                " an exit signal reaches a process parked anywhere. A process parked in receive()"
                " holds no coroutine frame of ours (ParkedReceive)"
            ),
        )
    ]


BENCHMARKS = [
    Benchmark("local.ping_pong", ping_pong),
    Benchmark("local.send", one_way),
    Benchmark("local.call", call),
    Benchmark("local.spawn", spawn),
    Benchmark("local.memory", memory),
]
