"""Small servers shared by the otp tests."""

from __future__ import annotations

import sys
from typing import Any

import trio
import trio.testing

import otp
from otp import GenServer, NoReply, Ok, Reply, Stop


class Sleepy(GenServer):
    """Answers ``("sleep", s)`` after sleeping ``s`` seconds inside handle_call."""

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request[0] == "sleep":
            await trio.sleep(request[1])
            return Reply(("slept", request[1]), state)
        if request[0] == "die":
            return Stop(request[1], state)
        return Reply(request, state)


async def idle() -> None:
    await otp.receive(lambda m: m == "never")


class _Recorder(GenServer):
    """Reports every request, info and terminate to the process given at start."""

    def init(self, report_to: otp.Pid, trap: bool = False) -> Ok:
        otp.process_flag(trap_exit=trap)
        return Ok(report_to)

    def handle_call(self, request: Any, from_: otp.From, state: otp.Pid) -> Any:
        otp.send(state, ("call", request))
        if request == "hang":
            return NoReply(state)
        return Reply(request, state)

    def handle_info(self, message: Any, state: otp.Pid) -> Any:
        otp.send(state, ("info", message))
        return NoReply(state)

    def terminate(self, reason: Any, state: otp.Pid) -> None:
        otp.send(state, ("terminate", reason))


#: Generous bound on waits for a real OS program (a busy 2-core CI machine); every wait ends on
#: the message it waits for, so a passing test never takes this long.
BOUND = 10.0


PY = sys.executable
