"""Distribution benchmarks: a GenServer call and one-way sends to a node in another OS process
over a Unix socket, against a raw Unix-socket ping-pong of a 16-byte frame between two
processes, measured in the same run.

Every baseline's echo runs in a separate OS process (never a thread of the measuring
process, whose round trips would pay GIL hand-offs). ``remote.call_vs_trio``'s floor is the
same ping-pong with a trio task on each end, from the same trio run as the calls and taken in
turns with them (``_alternate``), with the processes on the same CPUs as the calls'
(``_placements``: this end on one CPU and the peers on another; ``remote.call_vs_trio_one_cpu``
every process on one). A call also shows its trio task wake-ups per call on each end (the
peer counts its own and reports them) and its CPU time per call on each end, in a pass of its
own (an installed instrument costs time).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

import otp

from ._harness import Benchmark, Result
from ._wakeups import counting_wakeups

COOKIE = b"benchmark-cookie-123456"

_PEER = r"""
import os, sys, trio, otp
from benchmarks._wakeups import WakeupCounter

counter = WakeupCounter()

def cpu():
    times = os.times()
    return times.user + times.system

class Echo(otp.GenServer):
    def handle_call(self, request, from_, state):
        if request == "count":
            trio.lowlevel.add_instrument(counter)
            counter.count = 0
            return otp.Reply(cpu(), state)
        if request == "counted":
            trio.lowlevel.remove_instrument(counter)
            return otp.Reply((counter.count, cpu()), state)
        return otp.Reply(request, state)

async def sink(expected_from):
    count = 0
    while True:
        message = await otp.receive()
        if message.__class__ is tuple and message[0] == "expect":
            target, goal = message[1], message[2]
            while count < goal:
                await otp.receive()
                count += 1
            otp.send(target, ("got", count))
            count = 0
        else:
            count += 1

async def main():
    await otp.start_distribution(otp.DistConfig(cookie=COOKIE, listen=(ADDRESS,)))
    await Echo.start(name="echo")
    otp.register("sink", otp.spawn(sink, None))
    print("ready", flush=True)
    await trio.sleep_forever()

otp.run(main, name="peer@localhost")
"""

_RAW_PEER = r"""
import socket, sys
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1]); server.listen(1)
print("ready", flush=True)
conn, _ = server.accept()
while True:
    data = b""
    while len(data) < 16:
        chunk = conn.recv(16 - len(data))
        if not chunk:
            raise SystemExit(0)
        data += chunk
    conn.sendall(data)
"""


_RAW_TRIO_PEER = r"""
import sys, trio
async def main():
    server = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await server.bind(sys.argv[1])
    server.listen(1)
    print("ready", flush=True)
    conn, _ = await server.accept()
    data = b""
    while True:
        chunk = await conn.recv(16 - len(data))
        if not chunk:
            return
        data += chunk
        if len(data) == 16:
            await conn.send(data)
            data = b""
trio.run(main)
"""


def _spawn(code: str, *args: str, cpus: set[int] | None = None) -> subprocess.Popen[str]:
    """``code`` in a new Python process (on ``cpus`` when given), once it prints "ready"."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    if cpus is not None:
        os.sched_setaffinity(process.pid, cpus)
    assert process.stdout.readline().strip() == "ready"
    return process


def _raw_round_trips(path: str, n: int, placement: _Placement) -> list[float]:
    peer = _spawn(_RAW_PEER, path, cpus=placement.peers)
    try:
        with _pinned(placement.here), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            frame = b"0123456789abcdef"
            samples = []
            clock = time.perf_counter
            for _ in range(n):
                start = clock()
                sock.sendall(frame)
                received = b""
                while len(received) < 16:
                    received += sock.recv(16 - len(received))
                samples.append(clock() - start)
            return samples
    finally:
        peer.kill()
        peer.wait()


#: Rounds in which ``remote.call_vs_trio`` measures a call and its floor in turns.
ROUNDS = 10


@attrs.frozen
class _Placement:
    """Where ``_otp_remote`` runs: this process on ``here``, the peers on ``peers`` (None: where
    the OS puts them)."""

    here: set[int] | None
    peers: set[int] | None


def _placements() -> dict[str, _Placement]:
    """The CPU placements the calls and their floor are measured in, each the same for both,
    the main one first: with two CPUs or more, "two CPUs" (this process on its first, the
    peers on its second: two nodes' usual lot), then "one CPU" (every process on this
    process's first, taking turns). Where the OS chose, the figure was one or the other by
    chance: on this machine's VM a CPU left idle between two messages comes back slower (user
    CPU a round trip about doubles, ours and the floor's alike, ours more), so an unpinned run
    gave ~0.35 or ~0.58 from run to run. Without ``sched_setaffinity`` (not Linux), one
    unpinned placement."""
    if not hasattr(os, "sched_getaffinity"):
        return {"unpinned": _Placement(None, None)}
    cpus = sorted(os.sched_getaffinity(0))
    out = {}
    if len(cpus) >= 2:
        out["two CPUs"] = _Placement({cpus[0]}, {cpus[1]})
    out["one CPU"] = _Placement({cpus[0]}, {cpus[0]})
    return out


@contextmanager
def _pinned(cpus: set[int] | None) -> Iterator[None]:
    """This process on ``cpus`` inside the block (as it was after it)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def _alternate(
    ours: Callable[[], Awaitable[object]],
    floor: Callable[[], Awaitable[object]],
    n: int,
    rounds: int = ROUNDS,
) -> tuple[list[float], list[float], float]:
    """``n`` round trips of ``ours`` and ``n`` of ``floor``, in ``rounds`` slices each, taken in
    turns with the order flipped each round (as bench_dirty's ``_alternate``): a host whose
    speed drifts (other processes, frequency, another VM) then moves both alike, where two
    passes one after the other set them apart by tens of percent. Returns each round trip's
    time for ``ours`` and for ``floor``, and this process's CPU per ``floor`` round trip."""
    clock = time.perf_counter
    samples: dict[str, list[float]] = {"ours": [], "floor": []}
    floor_cpu = 0.0
    each = max(n // rounds, 1)
    sides = [("ours", ours), ("floor", floor)]
    for r in range(rounds):
        for name, one in sides if r % 2 == 0 else sides[::-1]:
            times = samples[name]
            cpu = time.process_time()
            for _ in range(each):
                start = clock()
                await one()
                times.append(clock() - start)
            if name == "floor":
                floor_cpu += time.process_time() - cpu
    return samples["ours"], samples["floor"], floor_cpu / len(samples["floor"])


def _raw_trio_round_trip(stream: trio.SocketStream) -> Callable[[], Awaitable[None]]:
    """One round trip of the floor of ``remote.call_vs_trio``: the same ping-pong with trio on
    both sides, echoed by another OS process (``_RAW_TRIO_PEER``; two task wake-ups per round
    trip instead of two blocking reads)."""
    frame = b"0123456789abcdef"

    async def round_trip() -> None:
        await stream.send_all(frame)
        received = b""
        while len(received) < 16:
            received += await stream.receive_some(16 - len(received))

    return round_trip


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


@attrs.frozen
class _CallCost:
    """What one remote call costs on each end, from a counted pass of ``calls`` calls."""

    wakeups: float
    peer_wakeups: float
    cpu: float
    peer_cpu: float

    def __str__(self) -> str:
        return (
            f"per call: {self.wakeups:.2f} trio wake-ups here + {self.peer_wakeups:.2f} on the"
            f" peer, CPU {self.cpu * 1e6:.0f} us here +"
            f" {self.peer_cpu * 1e6:.0f} us on the peer"
        )


async def _counted_calls(echo: Any, calls: int) -> _CallCost:
    peer_start = await otp.call(echo, "count")
    start = _cpu()
    with counting_wakeups() as counter:
        for i in range(calls):
            await otp.call(echo, i)
    cpu = _cpu() - start
    peer_wakeups, peer_end = await otp.call(echo, "counted")
    return _CallCost(
        counter.count / calls, peer_wakeups / calls, cpu / calls, (peer_end - peer_start) / calls
    )


@attrs.frozen
class _Remote:
    """What ``_otp_remote`` measured."""

    #: Each call's time, and each raw trio round trip's (taken in turns, ``_alternate``).
    samples: list[float]
    floor: list[float]
    #: This process's CPU per raw trio round trip.
    floor_cpu: float
    #: The seconds ``sends`` one-way sends took.
    elapsed: float
    cost: _CallCost


def _otp_remote(
    address: str, floor_path: str, calls: int, sends: int, placement: _Placement
) -> _Remote:
    code = _PEER.replace("COOKIE", repr(COOKIE)).replace("ADDRESS", repr(address))
    peer = _spawn(code, cpus=placement.peers)
    floor_peer = _spawn(_RAW_TRIO_PEER, floor_path, cpus=placement.peers)
    try:

        async def main() -> _Remote:
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
            assert await otp.connect("peer@localhost", address)
            echo = ("echo", "peer@localhost")
            call = otp.call
            stream = await trio.open_unix_socket(floor_path)
            floor = _raw_trio_round_trip(stream)
            for i in range(200):
                await call(echo, i)
                await floor()

            async def ours() -> None:
                await call(echo, 0)

            samples, floor_samples, floor_cpu = await _alternate(ours, floor, calls)
            await stream.aclose()
            cost = await _counted_calls(echo, min(calls, 2_000))
            sink: Any = ("sink", "peer@localhost")
            send = otp.send
            me = otp.self()
            clock = time.perf_counter
            start = clock()
            send(sink, ("expect", me, sends))
            for i in range(sends):
                send(sink, i)
                if i % 1000 == 999:
                    await trio.sleep(0)
            got = await otp.receive()
            elapsed = clock() - start
            assert got == ("got", sends), got
            return _Remote(samples, floor_samples, floor_cpu, elapsed, cost)

        with _pinned(placement.here):
            return otp.run(main, name="bench@localhost")
    finally:
        for process in (peer, floor_peer):
            process.kill()
            process.wait()


def _call_vs_trio(name: str, where: str, measured: _Remote) -> Result:
    ours = statistics.median(measured.samples)
    return Result(
        name,
        "us median",
        ours * 1e6,
        "raw trio unix ping-pong (16 B)",
        statistics.median(measured.floor) * 1e6,
        direction="lower",
        notes=(
            f"{where}; floor: the same ping-pong with a trio task on each end, echoed by"
            f" another OS process in the same placement, measured in turns with the calls"
            f" ({ROUNDS} rounds, the order flipped each round); {measured.cost}. Raw trio pays"
            " 2 + 2 too, one of each end's its send's checkpoint, after the write; so does the"
            " caller's end (the caller reads its reply itself, the reader wakes after the next"
            " write), while the server's two (the reader, then the server) both come before its"
            " write. A call"
            " answered by its server sends no DEMONITOR (the reply ends the monitor). Raw"
            f" trio's CPU a round trip on this end: {measured.floor_cpu * 1e6:.0f} us"
        ),
    )


def remote(quick: bool) -> list[Result]:
    calls = 2_000 if quick else 10_000
    sends = 50_000 if quick else 300_000
    placements = _placements()
    main = next(iter(placements))
    measured: dict[str, _Remote] = {}
    with tempfile.TemporaryDirectory() as tmp:
        raw = statistics.median(_raw_round_trips(f"{tmp}/raw.sock", calls, placements[main]))
        for i, (where, placement) in enumerate(placements.items()):
            measured[where] = _otp_remote(
                f"unix:{tmp}/peer{i}.sock", f"{tmp}/trio{i}.sock", calls, 0, placement
            )
        # (Sends where the OS puts the ends: one-way, they go faster on one CPU, the receiver
        # woken for larger batches, and the OS finds that; a few calls only, to warm up.)
        unpinned = _otp_remote(
            f"unix:{tmp}/peer_s.sock", f"{tmp}/trio_s.sock", 200, sends, _Placement(None, None)
        )
    first = measured[main]
    results = [
        Result(
            "remote.call",
            "us median",
            statistics.median(first.samples) * 1e6,
            "raw unix ping-pong (16 B)",
            raw * 1e6,
            direction="lower",
            notes=(
                f"GenServer.call to a node in another OS process over a Unix socket; placed: {main}"
            ),
        ),
        _call_vs_trio(
            "remote.call_vs_trio", f"placed: {main} (_placements; the others' rows follow)", first
        ),
    ]
    for where in list(measured)[1:]:
        results.append(
            _call_vs_trio(
                f"remote.call_vs_trio_{where.replace(' ', '_').lower()}",
                f"placed: {where} (_placements)",
                measured[where],
            )
        )
    results.append(
        Result(
            "remote.send",
            "messages/s",
            sends / unpinned.elapsed,
            "raw unix ping-pong (16 B) round trips/s",
            1 / raw,
            notes=(
                "one-way sends to a process on another node, placed where the OS puts them;"
                " target >= 100k messages/s"
            ),
        )
    )
    return results


BENCHMARKS = [Benchmark("remote", remote)]
