"""Supervisor benchmarks, each against raw trio in the same run.

- ``supervisor.restart``: a one_for_one child is killed; time until the restarted child answers
  a call (median over the kills). Baseline: a task re-started in a nursery after it raises, until
  it answers a request.
- ``supervisor.restart_crash``: the same, but the child *raises* (in a cast), with the node's
  default logging on (``otp.node.configure_logging("info", "text", ...)``, to ``/dev/null``
  line-buffered as stderr is), so each restart writes a crash report with its traceback and a
  supervisor report through the handler a node installs (a progress report is written only at
  ``--log-level debug``, as OTP's default level ``notice`` leaves them out). The burst limit is
  off here so every report is formatted and written (with it on, a storm this fast would drop
  most of them). Baseline: the raw trio restart loop above.
- ``supervisor.start_tree``: start and stop a tree of 1,000 workers under 10 supervisors.
  Baseline: 1,000 tasks started with ``nursery.start`` under 10 nested nurseries, then cancelled.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

import otp
from benchmarks._harness import Benchmark, Result, best_of
from otp.node import configure_logging
from otp.node._logs import PROGRESS_LOGGER
from supervisors import ChildSpec, Supervisor, SupFlags

# -- supervisor.restart -------------------------------------------------------------------------


class _Echo(otp.GenServer):
    async def init(self) -> Any:
        return otp.Ok(None)

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        return otp.Reply(request, state)


class _Crashy(_Echo):
    async def handle_cast(self, request: Any, state: Any) -> Any:
        raise RuntimeError(f"asked to {request}")


async def _otp_restart(kills: int, crash: bool = False) -> list[float]:
    otp.process_flag(trap_exit=True)
    flags = SupFlags(intensity=kills * 10, period=3600)
    server = _Crashy if crash else _Echo
    sup = await Supervisor.start_link(flags, [ChildSpec("echo", (server.start_link,))])
    pid = (await Supervisor.which_children(sup))[0][1]
    samples = []
    for _ in range(kills):
        start = time.perf_counter()
        if crash:
            otp.cast(pid, "crash")
        else:
            otp.exit(pid, otp.KILL)
        while True:
            rows = await Supervisor.which_children(sup)
            new = rows[0][1]
            if isinstance(new, otp.Pid) and new != pid:
                try:
                    await otp.call(new, "ping")
                except otp.CallError:
                    continue
                pid = new
                break
        samples.append(time.perf_counter() - start)
    otp.exit(sup, otp.SHUTDOWN)
    await otp.receive(otp.Exit)
    return samples


class _Boom(Exception):
    pass


async def _raw_restart(kills: int) -> list[float]:
    current: dict[str, Any] = {}

    async def child(task_status: Any) -> None:
        send, receive = trio.open_memory_channel[Any](math.inf)
        current["inbox"] = send
        task_status.started()
        async for request, reply in receive:
            if request == "die":
                raise _Boom
            reply.send_nowait(request)

    async def run_child() -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(child)
        except* _Boom:
            pass

    async def supervise() -> None:
        while True:
            await run_child()

    samples = []
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: _started(supervise, task_status))
        while "inbox" not in current:
            await trio.sleep(0)
        for _ in range(kills):
            start = time.perf_counter()
            old = current["inbox"]
            old.send_nowait(("die", None))
            while current["inbox"] is old:
                await trio.sleep(0)
            reply_send, reply_receive = trio.open_memory_channel[Any](1)
            current["inbox"].send_nowait(("ping", reply_send))
            await reply_receive.receive()
            samples.append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    return samples


async def _started(fn: Any, task_status: Any) -> None:
    task_status.started()
    await fn()


def _restart_result(name: str, ours: list[float], raw: list[float], notes: str) -> list[Result]:
    return [
        Result(
            name,
            "us",
            statistics.median(ours) * 1e6,
            "raw trio restart loop",
            statistics.median(raw) * 1e6,
            direction="lower",
            notes=notes,
        )
    ]


def _restart(quick: bool) -> list[Result]:
    kills = 200 if quick else 1000
    ours = otp.run(_otp_restart, kills)
    return _restart_result(
        "supervisor.restart",
        ours,
        trio.run(_raw_restart, kills),
        f"median of {kills} kills; one_for_one, restart until the new child answers",
    )


@contextmanager
def _node_logging() -> Iterator[None]:
    """The root logger as ``python -m otp.node`` sets it up (text, level info), writing to
    /dev/null, without the burst limit; the benchmark process's own logging is put back after."""
    root = logging.getLogger()
    progress = logging.getLogger(PROGRESS_LOGGER)
    saved = root.handlers[:], root.level, progress.level
    root.handlers.clear()
    with open(os.devnull, "w", buffering=1) as sink:
        configure_logging("info", "text", "bench@localhost", sink, burst_limit_enable=False)
        try:
            yield
        finally:
            root.handlers[:] = saved[0]
            root.setLevel(saved[1])
            progress.setLevel(saved[2])


def _restart_crash(quick: bool) -> list[Result]:
    kills = 200 if quick else 1000
    with _node_logging():
        ours = otp.run(_otp_restart, kills, True)
    return _restart_result(
        "supervisor.restart_crash",
        ours,
        trio.run(_raw_restart, kills),
        f"median of {kills} crashes (the child raises); the node's text logging on, every"
        " crash and supervisor report written (to /dev/null, line-buffered)",
    )


# -- supervisor.start_tree ----------------------------------------------------------------------


class _Idle(otp.GenServer):
    async def init(self) -> Any:
        otp.process_flag(trap_exit=True)
        return otp.Ok(None)


def _tree(subs: int, workers: int) -> tuple[SupFlags, list[ChildSpec]]:
    children = [
        ChildSpec(
            f"sup{s}",
            (
                Supervisor.start_link,
                SupFlags(),
                [ChildSpec(f"w{s}.{w}", (_Idle.start_link,)) for w in range(workers)],
            ),
            type="supervisor",
        )
        for s in range(subs)
    ]
    return SupFlags(), children


async def _otp_tree(subs: int, workers: int) -> float:
    otp.process_flag(trap_exit=True)
    flags, children = _tree(subs, workers)
    start = time.perf_counter()
    root = await Supervisor.start_link(flags, children)
    otp.exit(root, otp.SHUTDOWN)
    await otp.receive(otp.Exit)
    return time.perf_counter() - start


async def _raw_tree(subs: int, workers: int) -> float:
    async def worker(task_status: Any) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def sub(task_status: Any) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(workers):
                await nursery.start(worker)
            task_status.started()

    start = time.perf_counter()
    async with trio.open_nursery() as root:
        for _ in range(subs):
            await root.start(sub)
        root.cancel_scope.cancel()
    return time.perf_counter() - start


def _start_tree(quick: bool) -> list[Result]:
    repeats = 3 if quick else 7
    ours = best_of(repeats, lambda: otp.run(_otp_tree, 10, 100))
    raw = best_of(repeats, lambda: trio.run(_raw_tree, 10, 100))
    return [
        Result(
            "supervisor.start_tree",
            "ms",
            ours * 1e3,
            "raw trio nested nurseries",
            raw * 1e3,
            direction="lower",
            notes=f"1,000 workers under 10 supervisors, start + orderly stop; best of {repeats}",
        )
    ]


BENCHMARKS: list[Benchmark] = [
    Benchmark("supervisor.restart", _restart),
    Benchmark("supervisor.restart_crash", _restart_crash),
    Benchmark("supervisor.start_tree", _start_tree),
]
