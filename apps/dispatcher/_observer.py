"""The dispatcher's view for ``supervisors.observe()``: per tool, its calls, errors by kind,
retries, breaker state and latency, from the counters and histograms the dispatcher keeps
(timing a call is two clock reads and a bucket's increment; see :mod:`._latency`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

import otp

from ._config import DEFAULT_NAME
from ._latency import Latency
from ._state import _find

_ERROR = "dispatch.error."


def observer_view(dispatcher: str | otp.Pid = DEFAULT_NAME) -> dict[str, Any]:
    """A dict of plain values: ``running`` handler attempts, ``in_flight_keys``,
    ``cached_results`` and ``tools``: for each registered tool its ``calls`` (finished: ``ok``
    plus errors), ``attempts``, ``ok``, ``errors`` by kind, ``retries``, ``retries_denied``,
    ``timeouts``, ``dedup_hits``, ``breaker`` (``closed``, ``open``, ``half_open``; None for a
    tool without one, or not called yet), ``latency_seconds`` (how long its calls took, from
    ``dispatch`` to result or error: ``{"buckets": [[le, cumulative_count], ...], "sum": s,
    "count": n}``, the last ``le`` ``"+Inf"``) and ``p50_seconds`` / ``p99_seconds`` (estimated
    from those buckets; None before any call).

    Raises:
        DispatcherNotRunning: no dispatcher runs as ``dispatcher``.
    """
    state = _find(dispatcher)
    stats = state.statistics()  # settles the counters of by_tool too
    now = trio.current_time()
    tools = {}
    for name in stats.tools:
        counts: Mapping[str, int] = state.by_tool.get(name) or {}
        errors = {
            event[len(_ERROR) :]: count
            for event, count in sorted(counts.items())
            if event.startswith(_ERROR)
        }
        breaker = state.breakers.get(name)
        latency = state.latency.get(name) or Latency()
        tools[name] = {
            "calls": counts.get("dispatch.ok", 0) + sum(errors.values()),
            "attempts": counts.get("dispatch.attempt", 0),
            "ok": counts.get("dispatch.ok", 0),
            "errors": errors,
            "retries": counts.get("dispatch.retry", 0),
            "retries_denied": counts.get("dispatch.retry_denied", 0),
            "timeouts": counts.get("dispatch.timeout", 0),
            "dedup_hits": counts.get("dispatch.dedup_hit", 0),
            "breaker": str(breaker.current(now)) if breaker is not None else None,
            "latency_seconds": latency.histogram(),
            "p50_seconds": latency.quantile(0.5),
            "p99_seconds": latency.quantile(0.99),
        }
    return {
        "running": stats.running,
        "in_flight_keys": stats.in_flight_keys,
        "cached_results": stats.cached_results,
        "tools": tools,
    }
