"""Applications the node tests boot in real ``python -m otp.node`` processes."""

from __future__ import annotations

import sys
from typing import Any

import trio

import otp
import supervisors


class Reporter(otp.GenServer):
    """Prints its start and its terminate, so a test can read the order from stdout."""

    def init(self, label: str, slow_stop: float = 0.0) -> otp.Ok:
        otp.process_flag(trap_exit=True)
        print(f"init {label}", flush=True)
        return otp.Ok((label, slow_stop))

    async def terminate(self, reason: Any, state: tuple[str, float]) -> None:
        label, slow_stop = state
        print(f"terminate {label} {otp.format_reason(reason)}", flush=True)
        if slow_stop:
            await trio.sleep(slow_stop)


def _app(name: str, *children: supervisors.ChildSpec) -> supervisors.Application:
    return supervisors.Application(
        name, (supervisors.SupFlags(strategy="one_for_one"), list(children))
    )


first = _app(
    "first",
    supervisors.ChildSpec("a", (Reporter.start_link, "first.a")),
    supervisors.ChildSpec("b", (Reporter.start_link, "first.b")),
)
second = _app("second", supervisors.ChildSpec("c", (Reporter.start_link, "second.c")))
slow = _app(
    "slow",
    supervisors.ChildSpec(
        "sleepy", (Reporter.start_link, "slow.sleepy", 600.0), shutdown="infinity"
    ),
)


class CrashesSoon(otp.GenServer):
    def init(self) -> otp.Ok:
        otp.send_after(0.05, otp.self(), "crash")
        return otp.Ok(None)

    def handle_info(self, message: Any, state: Any) -> otp.NoReply:
        raise RuntimeError("this worker always crashes")


fragile = supervisors.Application(
    "fragile",
    (
        supervisors.SupFlags(strategy="one_for_one", intensity=1, period=5),
        [supervisors.ChildSpec("crasher", CrashesSoon)],
    ),
)


def echo_stdout(config: Any) -> supervisors.Application:
    """A factory: the node passes its config; flags an app adds arrive in settings["flags"]."""
    print(f"factory saw node {config.name}", file=sys.stdout, flush=True)
    return second


class GcReporter(otp.GenServer):
    """Prints the collector's thresholds and frozen object count as the node runs them."""

    def init(self) -> otp.Ok:
        import gc

        print(f"gc thresholds {gc.get_threshold()} frozen {gc.get_freeze_count()}", flush=True)
        return otp.Ok(None)


gc_report = _app("gc_report", supervisors.ChildSpec("gc", GcReporter))


def _echo_start() -> Any:
    from test_otp.peer import Echo

    return Echo.start_link(name="echo")


cluster = _app("cluster", supervisors.ChildSpec("echo", (_echo_start,)))


class _CountedCalls:
    """The dirty pool's ``calls`` view (the shape its observer view reports), counting ten
    calls each time it is read: 9 under 10 ms, 1 under 50 ms, one error in ten reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> dict[str, Any]:
        self.reads += 1
        n = self.reads
        return {
            "calls": {
                "total": 10 * n,
                "errors": {"DirtyTimeoutError": n // 10},
                "latency_seconds": {
                    "buckets": [[0.01, 9 * n], [0.05, 10 * n], [float("inf"), 10 * n]],
                    "sum": n * (9 * 0.005 + 0.04),
                    "count": 10 * n,
                },
            }
        }


#: An application named like the dirty pool, showing only its call counters (no OS workers).
counted_dirty = supervisors.Application(
    "dirty", (supervisors.SupFlags(), []), observer_view=_CountedCalls()
)
