"""The chaos run's worker program: ``python chaos_worker.py ADDRESS RUNS GIVE_UP``, a pull
worker of :class:`ChaosFlow` with ``SLOTS`` slots that the test SIGKILLs at random (it exits by
itself after GIVE_UP seconds without a registered stream, when GIVE_UP > 0: its server is dead).

Every handler run appends one line ``<execution_id> <attempt> <run id>`` to RUNS, a file opened
with ``O_APPEND`` and written by one ``os.write`` per line, so concurrent runs in several
processes never interleave and a run the kernel took is counted even if its process is killed
the next instant. The run id (``<pid>-<n>``) makes every run distinct.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import Any

from apps.matching import Flow, Registry, step

#: Steps per flow (the chaos run: 1,000 flows x 10 Steps).
STEPS = 10
#: Slots per worker process.
SLOTS = 8

_runs_fd = -1
_run_ids = itertools.count()
_run_ids_lock = threading.Lock()


def _record_run(ctx: object, index: int, value: list[int]) -> list[int]:
    """One handler run of Step ``index``: recorded, then the Step's effects: the flow's state
    counts it, and its value is its input with ``index`` appended (so the flow's result shows
    each Step's recorded value once, in order, and that each Step's state change was applied
    once before the next Step ran)."""
    with _run_ids_lock:
        n = next(_run_ids)
    line = f"{ctx.execution_id} {ctx.attempt} {os.getpid()}-{n}\n"  # type: ignore[attr-defined]
    os.write(_runs_fd, line.encode())
    state = ctx.state  # type: ignore[attr-defined]
    seen = state.get("steps", 0)
    state["steps"] = seen + 1
    # the state this Step was given counts every earlier Step once, or the value says so
    return [*value, index if seen == index else f"state counted {seen} Steps before {index}"]


def _step(index: int) -> Any:
    """Step ``index`` of :class:`ChaosFlow` (named ``s<index>``)."""

    def run(self: Flow, ctx: Any, value: list[int]) -> list[int]:
        return _record_run(ctx, index, value)

    return step(run, name=f"s{index}")


#: ``STEPS`` Steps ``s0``, ``s1``, ... each appending its index to the value: a flow started
#: with ``[n]`` ends with ``[n, 0, 1, ..., STEPS - 1]`` and state ``{"steps": STEPS}``.
ChaosFlow = type(
    "ChaosFlow", (Flow,), {"name": "chaos", **{f"s{i}": _step(i) for i in range(STEPS)}}
)


def main() -> None:
    global _runs_fd
    from benchmarks._matching_processes import serve_worker

    _runs_fd = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    serve_worker(Registry((ChaosFlow,)), sys.argv[1], SLOTS, give_up=float(sys.argv[3]))


if __name__ == "__main__":
    main()
