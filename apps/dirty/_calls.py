"""The pool's call counters: calls answered, errors by kind and a latency histogram, counted
by the worker proxies where a call ends (its last frame from the worker, or the proxy failing
it) and read by the observer view and the node's ``/metrics``.

Counting is a few integer and float adds on the node's one thread (no lock); the histogram's
buckets are fixed (Prometheus's ``le`` bounds, cumulative only when read).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

#: Upper bounds (seconds) of the latency buckets: a dirty call takes from ~100 us (a small
#: ``execute``) to minutes (a model); the ``+Inf`` bucket is the count.
LATENCY_BOUNDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: Error kinds kept apart (error types are the pool's and the apps' DirtyError classes); any
#: more are counted under ``"other"``.
MAX_KINDS = 64


class CallStats:
    """Calls that ended (``total``), the errors among them by kind, and their latency from the
    request's arrival in the node to its last reply frame (``seconds``: the sum; ``counts``:
    per bucket of :data:`LATENCY_BOUNDS`, the last one past them all)."""

    __slots__ = ("counts", "errors", "seconds", "total")

    def __init__(self) -> None:
        self.total = 0
        self.seconds = 0.0
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)
        self.errors: dict[str, int] = {}

    def error(self, kind: str, n: int = 1) -> None:
        """Count ``n`` errors of ``kind`` (the calls themselves are counted apart)."""
        errors = self.errors
        if kind not in errors and len(errors) >= MAX_KINDS:
            kind = "other"
        errors[kind] = errors.get(kind, 0) + n

    def view(self) -> dict[str, Any]:
        """Plain values: ``{"total", "errors": {kind: n}, "latency_seconds": {"buckets":
        [[le, cumulative count], ...], "sum", "count"}}`` (the ``+Inf`` bucket is ``count``)."""
        buckets = []
        running = 0
        for le, n in zip(LATENCY_BOUNDS, self.counts, strict=False):
            running += n
            buckets.append([le, running])
        return {
            "total": self.total,
            "errors": dict(sorted(self.errors.items())),
            "latency_seconds": {"buckets": buckets, "sum": self.seconds, "count": self.total},
        }


def count_call(calls: CallStats, latency: float) -> None:
    """Count one call that ended after ``latency`` seconds (the proxies' readers inline this)."""
    calls.total += 1
    calls.seconds += latency
    calls.counts[bisect_left(LATENCY_BOUNDS, latency)] += 1
