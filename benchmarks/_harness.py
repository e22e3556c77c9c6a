"""The benchmark harness: every benchmark measures itself against a baseline in the same run.

A benchmark module is a ``benchmarks/bench_*.py`` file with a module-level ``BENCHMARKS`` list
of :class:`Benchmark`. Each one's ``run(quick)`` returns :class:`Result` s; the harness prints
the table and writes the JSON described in the README.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Literal, TextIO

import attrs

Direction = Literal["higher", "lower"]


@attrs.frozen
class Result:
    """One measured figure and the same run's baseline figure.

    ``direction`` says which way is better for ``value``: "higher" for throughputs (ratio =
    value / baseline_value) and "lower" for latencies and sizes (ratio = baseline_value / value),
    so a ratio of 1.0 always means "as good as the baseline" and higher is always better.
    """

    name: str
    unit: str
    value: float
    baseline: str
    baseline_value: float
    direction: Direction = "higher"
    notes: str = ""

    @property
    def ratio(self) -> float:
        if self.value == 0 or self.baseline_value == 0:
            return 0.0
        if self.direction == "higher":
            return self.value / self.baseline_value
        return self.baseline_value / self.value

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "unit": self.unit,
            "value": self.value,
            "baseline": self.baseline,
            "baseline_value": self.baseline_value,
            "ratio": round(self.ratio, 4),
            "direction": self.direction,
            "notes": self.notes,
        }


@attrs.frozen
class Benchmark:
    """A named benchmark; ``run(quick)`` measures it and its baseline and returns the results."""

    name: str
    run: Callable[[bool], list[Result]]


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    """The smallest of ``repeats`` timings of ``fn`` (which returns seconds), to cut noise."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        best = min(best, fn())
    return best


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took on the monotonic performance counter."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def select(benchmarks: Sequence[Benchmark], prefixes: Sequence[str]) -> list[Benchmark]:
    """The benchmarks whose name starts with any of ``prefixes`` (all of them when none given).

    A prefix that matches nothing is a typo, not an empty run: :class:`ValueError` names it.
    """
    if not prefixes:
        return list(benchmarks)
    unmatched = [p for p in prefixes if not any(b.name.startswith(p) for b in benchmarks)]
    if unmatched:
        known = ", ".join(b.name for b in benchmarks)
        raise ValueError(f"--only {' '.join(unmatched)} matches no benchmark; known: {known}")
    return [b for b in benchmarks if b.name.startswith(tuple(prefixes))]


def run_all(benchmarks: Sequence[Benchmark], quick: bool, progress: TextIO) -> list[Result]:
    """Run ``benchmarks`` in order, writing one line to ``progress`` as each starts and ends.

    Two whole lines rather than one line finished in place: benchmarks start worker processes
    whose own stderr output would otherwise land in the middle of a half-written line.
    """
    results: list[Result] = []
    total = len(benchmarks)
    started = time.perf_counter()
    for index, bench in enumerate(benchmarks, 1):
        tag = f"[{index}/{total}] {bench.name}"
        print(f"{tag} ...", file=progress, flush=True)
        start = time.perf_counter()
        figures = bench.run(quick)
        elapsed = time.perf_counter() - start
        plural = "" if len(figures) == 1 else "s"
        done = f"{tag} ... {elapsed:.1f} s, {len(figures)} figure{plural}"
        print(done, file=progress, flush=True)
        results.extend(figures)
    summary = f"{total} benchmarks, {len(results)} figures in {time.perf_counter() - started:.1f} s"
    print(summary, file=progress, flush=True)
    return results
