"""ETS benchmarks: ``ets.lookup`` and ``ets.insert`` on a set table of 100k keys against a plain
Python dict in the same run, ``ets.update_counter`` from 8 concurrent processes, and reading a
table with ``select/3`` in chunks against one ``select/2``.

Targets (issue 3): lookup at least 0.3x the dict's operations per second, insert at least 0.1x.
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any

import trio

import otp
from otp import ets

from ._harness import Benchmark, Result

WRITERS = 8


def _lookup_and_insert(n: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds for each loop, all measured inside one node."""

    async def main() -> dict[str, float]:
        in_order = list(range(n))
        keys = list(in_order)
        random.Random(3).shuffle(keys)
        objects = [(key, key) for key in keys]
        best = dict.fromkeys(("lookup", "dict.get", "insert", "dict[k]=", "lookup@", "get@"), 1e9)
        # Both the table and the dict are filled in key order; lookups then go in random order
        # (ets.lookup) or in that same order (ets.lookup.in_key_order, the dict's best case).
        table = ets.new("bench")
        ets.insert(table, [(key, key) for key in in_order])
        plain = {key: (key, key) for key in in_order}
        lookup, insert, get = ets.lookup, ets.insert, plain.get
        gc.disable()
        try:
            for _ in range(repeats):
                start = time.perf_counter()
                for key in keys:
                    lookup(table, key)
                best["lookup"] = min(best["lookup"], time.perf_counter() - start)
                start = time.perf_counter()
                for key in keys:
                    get(key)
                best["dict.get"] = min(best["dict.get"], time.perf_counter() - start)
                start = time.perf_counter()
                for key in in_order:
                    lookup(table, key)
                best["lookup@"] = min(best["lookup@"], time.perf_counter() - start)
                start = time.perf_counter()
                for key in in_order:
                    get(key)
                best["get@"] = min(best["get@"], time.perf_counter() - start)

                fresh = ets.new("fresh")
                start = time.perf_counter()
                for obj in objects:
                    insert(fresh, obj)
                best["insert"] = min(best["insert"], time.perf_counter() - start)
                ets.delete(fresh)
                target: dict[Any, Any] = {}
                start = time.perf_counter()
                for obj in objects:
                    target[obj[0]] = obj
                best["dict[k]="] = min(best["dict[k]="], time.perf_counter() - start)
                gc.collect()
        finally:
            gc.enable()
        return best

    return otp.run(main)


def lookup_insert(quick: bool) -> list[Result]:
    n = 100_000
    timings = _lookup_and_insert(n, 3 if quick else 9)
    return [
        Result(
            "ets.lookup",
            "ops/s",
            n / timings["lookup"],
            "dict.get",
            n / timings["dict.get"],
            notes="set table of 100k keys, keys in random order; target ratio >= 0.3",
        ),
        Result(
            "ets.lookup.in_key_order",
            "ops/s",
            n / timings["lookup@"],
            "dict.get",
            n / timings["get@"],
            notes="as ets.lookup, keys in the order they were inserted (cache-friendly, the"
            " dict's best case)",
        ),
        Result(
            "ets.insert",
            "ops/s",
            n / timings["insert"],
            "dict[key] = obj",
            n / timings["dict[k]="],
            notes="100k new keys (random order) into an empty set table by its owner;"
            " target ratio >= 0.1",
        ),
    ]


def _counters(n: int, use_ets: bool) -> float:
    """Seconds for ``WRITERS`` processes to add 1 ``n`` times in all to one counter."""

    async def main() -> float:
        table = ets.new("counters", access=ets.PUBLIC)
        ets.insert(table, ("hits", 0))
        plain = {"hits": 0}
        me = otp.self()
        share = n // WRITERS

        async def writer() -> None:
            update = ets.update_counter
            for i in range(share):
                if use_ets:
                    update(table, "hits", 1)
                else:
                    plain["hits"] += 1
                if i % 64 == 63:
                    await trio.lowlevel.checkpoint()  # interleave with the other writers
            otp.send(me, "done")

        start = time.perf_counter()
        for _ in range(WRITERS):
            otp.spawn(writer)
        for _ in range(WRITERS):
            await otp.receive()
        elapsed = time.perf_counter() - start
        total = ets.lookup_element(table, "hits", 1) if use_ets else plain["hits"]
        if total != share * WRITERS:
            raise AssertionError(f"update_counter lost updates: {total} != {share * WRITERS}")
        return elapsed

    return otp.run(main)


def update_counter(quick: bool) -> list[Result]:
    n = 80_000 if quick else 400_000
    repeats = 2 if quick else 3
    ours = min(_counters(n, True) for _ in range(repeats))
    base = min(_counters(n, False) for _ in range(repeats))
    return [
        Result(
            "ets.update_counter",
            "ops/s",
            n / ours,
            "dict[key] += 1",
            n / base,
            notes=f"{WRITERS} concurrent processes on one counter; total checked ({n})",
        )
    ]


def _chunked(n: int, kind: ets.TableType, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds to read every object with select/3 in chunks of 100 (and
    the first chunk alone, right after a write), and with one select/2."""

    async def main() -> dict[str, float]:
        table = ets.new("bench", type=kind)
        ets.insert(table, [(key, key) for key in range(n)])
        spec = [(ets.ANY, [], ets.OBJECT)]
        best = dict.fromkeys(("chunks", "first", "select/2"), 1e9)
        for _ in range(repeats):
            start = time.perf_counter()
            answer = ets.select(table, spec, 100)
            while answer is not ets.END_OF_TABLE and answer[1] is not ets.END_OF_TABLE:
                answer = ets.select(answer[1])
            best["chunks"] = min(best["chunks"], time.perf_counter() - start)
            ets.insert(table, (n, n))  # a fresh key: no traversal state to reuse
            ets.delete(table, n)
            start = time.perf_counter()
            ets.select(table, spec, 100)
            best["first"] = min(best["first"], time.perf_counter() - start)
            start = time.perf_counter()
            ets.select(table, spec)
            best["select/2"] = min(best["select/2"], time.perf_counter() - start)
        return best

    return otp.run(main)


def select_chunks(quick: bool) -> list[Result]:
    n = 100_000
    results = []
    for kind in (ets.SET, ets.ORDERED_SET):
        timings = _chunked(n, kind, 2 if quick else 5)
        results.append(
            Result(
                f"ets.select.chunks.{kind}",
                "objects/s",
                n / timings["chunks"],
                "one ets.select/2",
                n / timings["select/2"],
                notes=f"{kind} of 100k objects read with select/3 in chunks of 100",
            )
        )
        results.append(
            Result(
                f"ets.select.first_chunk.{kind}",
                "s",
                timings["first"],
                "one ets.select/2",
                timings["select/2"],
                direction="lower",
                notes="select/3's first chunk of 100 right after a write (a new key snapshot)",
            )
        )
    return results


BENCHMARKS: list[Benchmark] = [
    Benchmark("ets.lookup_insert", lookup_insert),
    Benchmark("ets.update_counter", update_counter),
    Benchmark("ets.select_chunks", select_chunks),
]
