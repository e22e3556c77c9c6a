"""Workers and helpers shared by the supervisor tests."""

from __future__ import annotations

from typing import Any

import trio.testing

import otp
from supervisors import ChildSpec


class Worker(otp.GenServer):
    """A worker that traps exits, answers ``ping``, stops on ``("stop", reason)`` and records
    its lifecycle in ``log`` as ``(event, name, reason)``."""

    async def init(self, name: str, log: list[Any] | None = None, trap: bool = True) -> Any:
        if trap:
            otp.process_flag(trap_exit=True)
        if log is not None:
            log.append(("start", name))
        return otp.Ok((name, log))

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request == "ping":
            return otp.Reply("pong", state)
        return otp.Reply(state[0], state)

    async def handle_cast(self, request: Any, state: Any) -> Any:
        return otp.Stop(request[1], state)

    async def terminate(self, reason: Any, state: Any) -> None:
        name, log = state
        if log is not None:
            log.append(("terminate", name, reason))


class Failing(otp.GenServer):
    """A worker whose init fails with ``reason`` (or ignores, for reason None)."""

    async def init(self, reason: Any) -> Any:
        return otp.Ignore() if reason is None else otp.Stop(reason)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def pid_of(rows: list[Any], child_id: Any) -> otp.Pid:
    for row in rows:
        if row[0] == child_id:
            assert isinstance(row[1], otp.Pid), row
            return row[1]
    raise AssertionError(f"no child {child_id!r} in {rows!r}")


def worker(name: str, log: list[Any] | None = None, **kwargs: Any) -> ChildSpec:
    return ChildSpec(name, (Worker.start_link, name, log), **kwargs)


def alive(pid: otp.Pid) -> bool:
    return otp.process_info(pid) is not None
