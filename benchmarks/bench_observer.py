"""Observer benchmark: ``otp.observer.observe_processes()`` over 100k idle processes, against a
raw loop in the same run that builds one frozen record of as many fields from each of the same
processes' trio tasks.

Target (issue 19): cheap enough to call every second on a node with 100,000 processes.
"""

from __future__ import annotations

import gc
import time

import attrs
import trio
import trio.testing

import otp

from ._harness import Benchmark, Result

PROCESSES = 100_000


@attrs.frozen
class _TaskRecord:
    """The baseline's record: 14 fields, as many as ``otp.observer.ProcessSnapshot``."""

    name: str
    coro: object
    context: object
    nursery: object
    children: tuple[object, ...]
    a: int
    b: int
    c: tuple[object, ...]
    d: tuple[object, ...]
    e: tuple[object, ...]
    f: bool
    g: object
    h: float
    i: int


def _raw(tasks: list[trio.lowlevel.Task]) -> float:
    start = time.perf_counter()
    [
        _TaskRecord(
            task.name,
            task.coro,
            task.context,
            task.parent_nursery,
            tuple(task.child_nurseries),
            0,
            0,
            (),
            (),
            (),
            False,
            None,
            0.0,
            0,
        )
        for task in tasks
    ]
    return time.perf_counter() - start


def _snapshot_ms(repeats: int) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        async def idle() -> None:
            await otp.receive()

        for _ in range(PROCESSES):
            otp.spawn(idle)
        await trio.testing.wait_all_tasks_blocked()
        nursery = otp.current_node().nursery
        tasks = list(nursery.child_tasks)
        observe = otp.observer.observe_processes
        best_ours = best_raw = float("inf")
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            found = observe()
            best_ours = min(best_ours, time.perf_counter() - start)
            assert len(found) >= PROCESSES
            del found
            gc.collect()
            best_raw = min(best_raw, _raw(tasks))
        return best_ours * 1000, best_raw * 1000

    return otp.run(main)


def snapshot(quick: bool) -> list[Result]:
    ours, raw = _snapshot_ms(3 if quick else 7)
    return [
        Result(
            "observer.snapshot_100k",
            "ms",
            ours,
            "a frozen record per trio task",
            raw,
            direction="lower",
            notes=f"observe_processes() over {PROCESSES:,} idle processes, best of runs",
        )
    ]


BENCHMARKS = [Benchmark("observer.snapshot_100k", snapshot)]
