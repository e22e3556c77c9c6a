"""Helpers for the ETS tests: run a function in another process and get its outcome."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import otp


@attrs.frozen
class Outcome:
    tag: Any
    ok: bool
    value: Any


async def in_process(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a fresh process; return its result or raise its exception."""
    me = otp.self()
    tag = otp.make_ref()

    async def body() -> None:
        try:
            outcome = Outcome(tag, True, fn(*args))
        except Exception as exc:
            outcome = Outcome(tag, False, exc)
        otp.send(me, outcome)

    otp.spawn(body)
    outcome = await otp.receive(match=lambda m: isinstance(m, Outcome) and m.tag == tag)
    if not outcome.ok:
        raise outcome.value
    return outcome.value


async def start_idle() -> otp.Pid:
    """A process that waits for any message, then exits normally."""

    async def idle() -> None:
        await otp.receive()

    return otp.spawn(idle)
