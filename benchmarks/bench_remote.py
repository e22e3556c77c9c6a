"""Distribution benchmarks: a GenServer call and one-way sends to a node in another OS process
over a Unix socket, against a raw Unix-socket ping-pong of a 16-byte frame between two
processes, measured in the same run.

Every baseline's echo runs in a separate OS process (never a thread of the measuring
process, whose round trips would pay GIL hand-offs). ``remote.call_vs_trio``'s floor is the
same ping-pong with a trio task on each end; a call also shows its trio task wake-ups per
call on each end (the peer counts its own and reports them) and its CPU time per call on
each end, in a pass of its own (an installed instrument costs time).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
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


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _raw_round_trips(path: str, n: int) -> list[float]:
    peer = _spawn(_RAW_PEER, path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
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


def _raw_trio_round_trips(path: str, n: int) -> tuple[list[float], float]:
    """The same ping-pong with trio on both sides: the floor for anything built on trio's
    scheduler (two task wake-ups per round trip instead of two blocking reads). Returns the
    round trips' times and this end's CPU time per round trip."""
    peer = _spawn(_RAW_TRIO_PEER, path)
    try:

        async def main() -> tuple[list[float], float]:
            stream = await trio.open_unix_socket(path)
            frame = b"0123456789abcdef"
            samples = []
            clock = time.perf_counter
            cpu = _cpu()
            for _ in range(n):
                start = clock()
                await stream.send_all(frame)
                received = b""
                while len(received) < 16:
                    received += await stream.receive_some(16 - len(received))
                samples.append(clock() - start)
            cpu = _cpu() - cpu
            await stream.aclose()
            return samples, cpu / n

        return trio.run(main)
    finally:
        peer.kill()
        peer.wait()


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


def _otp_remote(address: str, calls: int, sends: int) -> tuple[list[float], float, _CallCost]:
    code = _PEER.replace("COOKIE", repr(COOKIE)).replace("ADDRESS", repr(address))
    peer = _spawn(code)
    try:

        async def main() -> tuple[list[float], float, _CallCost]:
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
            assert await otp.connect("peer@localhost", address)
            echo = ("echo", "peer@localhost")
            call = otp.call
            for i in range(200):
                await call(echo, i)
            clock = time.perf_counter
            samples = []
            for i in range(calls):
                start = clock()
                await call(echo, i)
                samples.append(clock() - start)
            cost = await _counted_calls(echo, min(calls, 2_000))
            sink: Any = ("sink", "peer@localhost")
            send = otp.send
            me = otp.self()
            start = clock()
            send(sink, ("expect", me, sends))
            for i in range(sends):
                send(sink, i)
                if i % 1000 == 999:
                    await trio.sleep(0)
            got = await otp.receive()
            elapsed = clock() - start
            assert got == ("got", sends), got
            return samples, elapsed, cost

        return otp.run(main, name="bench@localhost")
    finally:
        peer.kill()
        peer.wait()


def remote(quick: bool) -> list[Result]:
    calls = 2_000 if quick else 10_000
    sends = 50_000 if quick else 300_000
    with tempfile.TemporaryDirectory() as tmp:
        raw = statistics.median(_raw_round_trips(f"{tmp}/raw.sock", calls))
        raw_trio_samples, raw_trio_cpu = _raw_trio_round_trips(f"{tmp}/trio.sock", calls)
        raw_trio = statistics.median(raw_trio_samples)
        samples, elapsed, cost = _otp_remote(f"unix:{tmp}/peer.sock", calls, sends)
    ours = statistics.median(samples)
    return [
        Result(
            "remote.call",
            "us median",
            ours * 1e6,
            "raw unix ping-pong (16 B)",
            raw * 1e6,
            direction="lower",
            notes="GenServer.call to a node in another OS process over a Unix socket",
        ),
        Result(
            "remote.call_vs_trio",
            "us median",
            ours * 1e6,
            "raw trio unix ping-pong (16 B)",
            raw_trio * 1e6,
            direction="lower",
            notes=(
                "floor: the same ping-pong with a trio task on each end, echoed by another OS"
                f" process; {cost}. Raw trio pays 2 + 2 too, but one of each end's is its"
                " send's checkpoint, after the write; a call's two (the reader, then the caller"
                " or the server) both come before it, so the ratio is about raw trio's CPU"
                " over a call's, both ends summed. A call answered by its server sends no"
                " DEMONITOR (the reply ends the monitor). Raw trio's CPU a round trip on this"
                " end:"
                f" {raw_trio_cpu * 1e6:.0f} us (both ends' CPU is each round trip's wall time"
                " when they take turns)"
            ),
        ),
        Result(
            "remote.send",
            "messages/s",
            sends / elapsed,
            "raw unix ping-pong (16 B) round trips/s",
            1 / raw,
            notes="one-way sends to a process on another node; target >= 100k messages/s",
        ),
    ]


BENCHMARKS = [Benchmark("remote", remote)]
