"""Dispatcher benchmarks (issue 7).

``dispatch.overhead``: a no-op async tool dispatched 100k times against calling the handler
directly in the same run; target ratio >= 0.35 (issue 22). The tool yields once
(``checkpoint()``), as every trio async function does. Its notes give what a dispatcher that
entered a cancel scope for every call's timeout could reach at best: the direct call under
``trio.move_on_after`` against the direct call (entering and leaving a trio cancel scope with a
deadline costs more than the handler itself). ``dispatch`` enters it only when the handler
waits (``apps/dispatcher/_deadline.py``), which this handler never does.
``dispatch.overhead.nonyielding`` is the same with a handler that never yields, where the
baseline is a bare coroutine call (no checkpoint) and the ratio is far lower: the per-call cost
is then all dispatch (lookup, the deadline's bookkeeping, breaker, counters).
``dispatch.overhead.vs_timeout`` compares with the direct call under ``trio.move_on_after``,
the plain way to keep a per-call timeout promise.
``dispatch.fanout``: 1,000 calls of a tool that sleeps 1 ms through
``gather_bounded(limit=8)`` against a raw trio nursery with a semaphore of 8.
``dispatch.keyed``: 20k keyed calls of the no-op tool, each with a new key (the run goes through
the dispatcher's runner process and its result is cached), against the same calls without a
key; ``dispatch.keyed.hit`` repeats the keys (every call is answered from the cache).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import trio

import otp
from apps import dispatcher as d

from ._harness import Benchmark, Result


async def _noop() -> None:
    await trio.lowlevel.checkpoint()


async def _noop_nonyielding() -> None:
    return None


async def _sleepy() -> None:
    await trio.sleep(0.001)


def _tools() -> list[d.Tool]:
    schema = {"type": "object"}
    return [
        d.Tool("noop", _noop, schema, idempotent=True),
        d.Tool("noop_nonyielding", _noop_nonyielding, schema, idempotent=True),
        d.Tool("sleepy", _sleepy, schema, idempotent=True),
    ]


def _overhead_times(n: int, repeats: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        await d.start_dispatcher(_tools())
        best = dict.fromkeys(("dispatch", "direct", "dispatch0", "direct0", "scoped"), 1e9)
        dispatch = d.dispatch
        args: dict[str, Any] = {}
        gc.disable()
        try:
            for _ in range(repeats):
                for label, direct_label, name, handler in (
                    ("dispatch", "direct", "noop", _noop),
                    ("dispatch0", "direct0", "noop_nonyielding", _noop_nonyielding),
                ):
                    start = time.perf_counter()
                    for _ in range(n):
                        await dispatch(name, args)
                    best[label] = min(best[label], time.perf_counter() - start)
                    start = time.perf_counter()
                    for _ in range(n):
                        await handler(**args)
                    best[direct_label] = min(best[direct_label], time.perf_counter() - start)
                start = time.perf_counter()
                for _ in range(n):
                    with trio.move_on_after(30.0):
                        await _noop(**args)
                best["scoped"] = min(best["scoped"], time.perf_counter() - start)
                gc.collect()
        finally:
            gc.enable()
        return best

    return otp.run(main)


def overhead(quick: bool) -> list[Result]:
    n = 20_000 if quick else 100_000
    t = _overhead_times(n, 2 if quick else 5)
    return [
        Result(
            "dispatch.overhead",
            "calls/s",
            n / t["dispatch"],
            "the handler called directly",
            n / t["direct"],
            notes=(
                f"{n:,} calls of a no-op async tool that yields once; target ratio >= 0.35;"
                f" with a cancel scope entered every call it could reach at best"
                f" {t['direct'] / t['scoped']:.2f} (the same handler under trio.move_on_after,"
                " against it called directly)"
            ),
        ),
        Result(
            "dispatch.overhead.nonyielding",
            "calls/s",
            n / t["dispatch0"],
            "the handler called directly",
            n / t["direct0"],
            notes="a handler that never yields: the ratio measures dispatch alone",
        ),
        Result(
            "dispatch.overhead.vs_timeout",
            "calls/s",
            n / t["dispatch"],
            "the handler called under trio.move_on_after(30)",
            n / t["scoped"],
            notes="the fair baseline: a direct call that also keeps a timeout promise",
        ),
    ]


async def _bounded(semaphore: trio.Semaphore, results: list[Any], index: int) -> None:
    async with semaphore:
        results[index] = await _sleepy()


def _fanout_times(n: int, repeats: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        await d.start_dispatcher(_tools())
        calls = [("sleepy", {})] * n
        best = {"gather": 1e9, "nursery": 1e9}
        for _ in range(repeats):
            start = time.perf_counter()
            values = await d.gather_bounded(calls, limit=8)  # raises if a call failed
            best["gather"] = min(best["gather"], time.perf_counter() - start)
            assert len(values) == n

            results: list[Any] = [None] * n
            semaphore = trio.Semaphore(8)
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for index in range(n):
                    nursery.start_soon(_bounded, semaphore, results, index)
            best["nursery"] = min(best["nursery"], time.perf_counter() - start)
        return best

    return otp.run(main)


def fanout(quick: bool) -> list[Result]:
    n = 1_000
    t = _fanout_times(n, 1 if quick else 3)
    return [
        Result(
            "dispatch.fanout",
            "calls/s",
            n / t["gather"],
            "trio nursery + Semaphore(8)",
            n / t["nursery"],
            notes=f"{n:,} calls of a tool sleeping 1 ms, at most 8 at once",
        )
    ]


def _keyed_times(n: int, repeats: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        await d.start_dispatcher(_tools())
        dispatch = d.dispatch
        args: dict[str, Any] = {}
        best = dict.fromkeys(("keyed", "hit", "plain"), 1e9)
        for round_ in range(repeats):
            keys = [f"{round_}:{i}" for i in range(n)]
            start = time.perf_counter()
            for key in keys:
                await dispatch("noop", args, idempotency_key=key)
            best["keyed"] = min(best["keyed"], time.perf_counter() - start)
            start = time.perf_counter()
            for key in keys:
                await dispatch("noop", args, idempotency_key=key)
            best["hit"] = min(best["hit"], time.perf_counter() - start)
            start = time.perf_counter()
            for _ in keys:
                await dispatch("noop", args)
            best["plain"] = min(best["plain"], time.perf_counter() - start)
        return best

    return otp.run(main)


def keyed(quick: bool) -> list[Result]:
    n = 5_000 if quick else 20_000
    t = _keyed_times(n, 2 if quick else 3)
    return [
        Result(
            "dispatch.keyed",
            "calls/s",
            n / t["keyed"],
            "the same calls without a key",
            n / t["plain"],
            notes=f"{n:,} calls with a new idempotency key each (run by the runner, cached)",
        ),
        Result(
            "dispatch.keyed.hit",
            "calls/s",
            n / t["hit"],
            "the same calls without a key",
            n / t["plain"],
            notes="the keys again: every call is answered from the idempotency cache",
        ),
    ]


BENCHMARKS = [
    Benchmark("dispatch.overhead", overhead),
    Benchmark("dispatch.fanout", fanout),
    Benchmark("dispatch.keyed", keyed),
]
