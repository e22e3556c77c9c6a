"""The observer's sampler: a supervised GenServer of the ``observer`` application that reads
the node once a second (``send_after``, no sleeping loop) and keeps the rates of the last
minutes in a bounded ring, for the web observer's charts (``/api/series``).

It mirrors what Erlang's observer keeps for its load charts: each point is a rate over the last
interval, computed from counters the runtime, the supervisors and the applications keep anyway
(messages taken from mailboxes, restarts, the dirty pool's calls); nothing is counted on the hot
path for it.
"""

from __future__ import annotations

import collections
import copy
import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import trio

import otp
import supervisors

__all__ = ["SAMPLER_NAME", "SERIES", "Counters", "Sampler", "read_counters", "step"]

#: The sampler's registered name.
SAMPLER_NAME = "observer_sampler"
#: Seconds between two samples, and how many points the ring keeps (10 minutes).
INTERVAL = 1.0
WINDOW = 600
#: The series of each point, in order (None where there is nothing to say: no dirty pool, or
#: no dirty call finished in the interval for a latency).
SERIES = (
    "messages_per_second",
    "restarts_per_second",
    "dirty_calls_per_second",
    "dirty_errors_per_second",
    "dirty_latency_mean_seconds",
    "dirty_latency_p99_seconds",
)
#: The dirty pool's application name (its view's ``calls`` carries the counters).
DIRTY_APPLICATION = "dirty"


@attrs.frozen
class Counters:
    """The node's counters at one moment (what the rates are differences of).

    Attributes:
        time: When they were read, on trio's clock.
        handled: Messages each live process has taken from its mailbox, by pid.
        restarts: Restarts of every supervisor of every running application, summed.
        dirty: The dirty pool's ``calls`` view (``total``, ``errors`` by kind,
            ``latency_seconds`` histogram), or None (no dirty pool, or one without counters).
    """

    time: float
    handled: Mapping[otp.Pid, int]
    restarts: int
    dirty: Mapping[str, Any] | None


def _restarts(view: supervisors.SupervisorView | None) -> int:
    if view is None:
        return 0
    return view.restarts_total + sum(_restarts(child.supervisor) for child in view.children)


def _dirty_calls(applications: Iterable[supervisors.ApplicationView]) -> Mapping[str, Any] | None:
    for app in applications:
        if app.name == DIRTY_APPLICATION and isinstance(app.view, dict):
            calls = app.view.get("calls")
            if isinstance(calls, dict) and isinstance(calls.get("total"), int):
                # A copy: a view may hand out the dicts it keeps counting in.
                return copy.deepcopy(calls)
    return None


async def read_counters() -> Counters:
    """The counters now: every process's messages handled, every supervisor's restarts and
    the dirty pool's calls (one ``supervisors.observe()`` walk)."""
    applications = await supervisors.observe()
    return Counters(
        time=trio.current_time(),
        # The one counter it needs, read off each live process: a full snapshot of every
        # process (links, monitors, memory) each second would cost ten times as much.
        handled={
            proc.pid: proc.handled for proc in otp.current_node().processes.values() if proc.alive
        },
        restarts=sum(_restarts(app.root) for app in applications),
        dirty=_dirty_calls(applications),
    )


def _latency(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[Any, Any]:
    """The mean and the p99 (the upper bound of the bucket it falls in) of the calls that
    finished between two readings of the dirty pool's histogram; None, None if none did."""
    old = before.get("latency_seconds") or {}
    new = after.get("latency_seconds") or {}
    count = new.get("count", 0) - old.get("count", 0)
    if count <= 0:
        return None, None
    mean = max(0.0, new.get("sum", 0.0) - old.get("sum", 0.0)) / count
    previous = {float(le): n for le, n in old.get("buckets", ())}
    p99 = None
    for le, cumulative in new.get("buckets", ()):
        if cumulative - previous.get(float(le), 0) >= 0.99 * count:
            p99 = float(le) if math.isfinite(float(le)) else None
            break
    return mean, p99


def _errors(calls: Mapping[str, Any]) -> int:
    return sum(n for n in (calls.get("errors") or {}).values() if isinstance(n, int))


def step(before: Counters, after: Counters) -> dict[str, Any]:
    """One point of the series (see :data:`SERIES`): the rates between two readings.

    A process that died in between takes its messages with it, and a restarted application's
    supervisors start their counts again: rates never go below 0.
    """
    elapsed = max(after.time - before.time, 1e-9)
    old = before.handled
    messages = sum(max(0, n - old.get(pid, 0)) for pid, n in after.handled.items())
    point: dict[str, Any] = {
        "t": after.time,
        "messages_per_second": messages / elapsed,
        "restarts_per_second": max(0, after.restarts - before.restarts) / elapsed,
        "dirty_calls_per_second": None,
        "dirty_errors_per_second": None,
        "dirty_latency_mean_seconds": None,
        "dirty_latency_p99_seconds": None,
    }
    if before.dirty is not None and after.dirty is not None:
        calls = max(0, after.dirty["total"] - before.dirty["total"])
        point["dirty_calls_per_second"] = calls / elapsed
        point["dirty_errors_per_second"] = (
            max(0, _errors(after.dirty) - _errors(before.dirty)) / elapsed
        )
        mean, p99 = _latency(before.dirty, after.dirty)
        point["dirty_latency_mean_seconds"] = mean
        point["dirty_latency_p99_seconds"] = p99
    return point


@attrs.define
class _State:
    interval: float
    window: int
    last: Counters
    points: collections.deque[dict[str, Any]]


class Sampler(otp.GenServer):
    """Samples every ``interval`` seconds into a ring of ``window`` points.

    Calls: ``"series"`` -> ``{"interval", "window", "now", "t": [...], "series": {name:
    [...]}}``, the points oldest first, ``t`` on trio's clock (``now`` says when it answered).
    """

    async def init(self, interval: float = INTERVAL, window: int = WINDOW) -> otp.Ok:
        otp.send_after(interval, otp.self(), "sample")
        return otp.Ok(_State(interval, window, await read_counters(), collections.deque()))

    async def handle_info(self, message: Any, state: _State) -> otp.NoReply:
        if message == "sample":
            # The next tick is set first: a slow reading delays no later one.
            otp.send_after(state.interval, otp.self(), "sample")
            now = await read_counters()
            state.points.append(step(state.last, now))
            while len(state.points) > state.window:
                state.points.popleft()
            state.last = now
        return otp.NoReply(state)

    def handle_call(self, request: Any, from_: otp.From, state: _State) -> otp.Reply:
        if request == "series":
            return otp.Reply(series(state), state)
        return otp.Reply(("error", ("unknown_request", request)), state)


def series(state: _State) -> dict[str, Any]:
    points = list(state.points)
    return {
        "interval": state.interval,
        "window": state.window,
        "now": trio.current_time(),
        "t": [p["t"] for p in points],
        "series": {name: [p[name] for p in points] for name in SERIES},
    }


async def start_sampler(interval: float = INTERVAL, window: int = WINDOW) -> otp.Pid:
    """Start the sampler linked to the caller, registered as :data:`SAMPLER_NAME`."""
    return await Sampler.start_link(interval, window, name=SAMPLER_NAME)
