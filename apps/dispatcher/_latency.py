"""Per-tool call latency: a fixed-bucket histogram (Prometheus's shape) kept by the dispatcher,
read by its observer view (p50/p99 and the buckets) and by the node's ``/metrics``
(``otp_dispatcher_call_duration_seconds``).

Recording a call is one bisection and two additions (:meth:`Latency.observe`; ``dispatch``'s
fast path does the same inline); the count is the buckets' sum, and quantiles are estimated from
the buckets when a view is read (as Prometheus's ``histogram_quantile``), so no sample is kept.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import attrs

#: Bucket upper bounds in seconds: from 50 us (a tool that answers at once) to a minute (the
#: longest tool timeouts); past the last, +Inf.
BOUNDS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


@attrs.define(eq=False)
class Latency:
    """How long one tool's calls took, from ``dispatch`` to its result or error."""

    counts: list[int] = attrs.Factory(lambda: [0] * (len(BOUNDS) + 1))
    sum: float = 0.0

    @property
    def count(self) -> int:
        """How many calls were recorded."""
        return sum(self.counts)

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BOUNDS, seconds)] += 1
        self.sum += seconds

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile estimated from the buckets (linear within the bucket it falls
        in; the last finite bound if it falls past them); None before any call."""
        total = self.count
        if not total:
            return None
        rank = q * total
        seen = 0
        for index, count in enumerate(self.counts):
            if count and seen + count >= rank:
                if index == len(BOUNDS):
                    return BOUNDS[-1]
                low = BOUNDS[index - 1] if index else 0.0
                return low + (BOUNDS[index] - low) * (rank - seen) / count
            seen += count
        return BOUNDS[-1]

    def histogram(self) -> dict[str, Any]:
        """``{"buckets": [[le, cumulative_count], ...], "sum": s, "count": n}``; the last
        bucket's ``le`` is ``"+Inf"``, as Prometheus writes it."""
        buckets: list[list[Any]] = []
        total = 0
        for bound, count in zip((*BOUNDS, "+Inf"), self.counts, strict=True):
            total += count
            buckets.append([bound, total])
        return {"buckets": buckets, "sum": self.sum, "count": total}
