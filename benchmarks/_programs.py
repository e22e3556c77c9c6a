"""A supervised OS program: Erlang's gen_server that owns a port, with the program's output
appended to a log file. The matching chaos run supervises its servers and workers so."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import attrs

import otp
from otp import GenServer, NoReply, Ok, Reply, Stop

from ._matching_processes import ROOT

__all__ = ["Program"]


class Program(GenServer):
    """A supervised OS program (Erlang's gen_server that owns a port).

    ``init`` starts ``argv`` (in :data:`ROOT`, with ``env`` if given) as a port and returns
    once the program printed a line containing ``ready``; every line it prints (stdout and
    stderr) is appended to the file ``log``; the program's exit is this server's exit with the
    port's reason (``Signaled("SIGKILL")`` when killed), so a supervisor restarts it by its
    restart type. ``call(pid, "os_pid")`` answers the program's OS pid. A stop (say, the
    supervisor's shutdown) closes the port: SIGTERM, SIGKILL after 10 s."""

    async def init(
        self, argv: Sequence[str], log: str, ready: str, env: dict[str, str] | None = None
    ) -> Ok | Stop:
        otp.process_flag(trap_exit=True)
        port = await otp.open_port(
            list(argv), env=env, cwd=ROOT, mode="line", stderr_to_stdout=True, kill_timeout=10
        )
        out = open(log, "ab")
        state = _ProgramState(port, await otp.port_os_pid(port), out)

        def mine(m: Any) -> bool:
            if type(m) is otp.PortData:
                return bool(m.port == port)
            return type(m) is otp.Exit and m.pid == port

        while True:
            message = await otp.receive(mine, timeout=60)
            if type(message) is otp.Exit:
                out.close()
                return Stop(("exited before it was ready", message.reason))
            out.write(message.data + b"\n")
            if ready.encode() in message.data:
                out.flush()
                return Ok(state)

    def handle_call(self, request: Any, from_: otp.From, state: _ProgramState) -> Reply:
        return Reply(state.os_pid, state)

    def handle_info(self, message: Any, state: _ProgramState) -> NoReply | Stop:
        if type(message) is otp.PortData:
            state.out.write(message.data + b"\n")
            state.out.flush()
            return NoReply(state)
        if type(message) is otp.Exit and message.pid == state.port:
            state.port = None
            return Stop(message.reason, state)
        return NoReply(state)

    def terminate(self, reason: Any, state: _ProgramState) -> None:
        if state.port is not None:
            with contextlib.suppress(otp.BadArg):
                otp.port_close(state.port)
        state.out.close()


@attrs.define
class _ProgramState:
    port: otp.Pid | None
    os_pid: int
    out: Any
