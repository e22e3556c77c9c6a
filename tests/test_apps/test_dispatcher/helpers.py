"""Shared pieces of the dispatcher tests: scripted handlers and a running dispatcher."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

import otp
from apps import dispatcher as d


@attrs.define
class Script:
    """A handler that plays a script, one step per attempt: "ok", "transient", "timeout"
    (sleeps past any timeout), "internal", or a number of seconds to sleep before succeeding.
    Past the end of the script it succeeds. It records when each attempt started."""

    steps: list[Any] = attrs.Factory(list)
    runs: int = 0
    starts: list[float] = attrs.Factory(list)
    cancelled: int = 0

    async def __call__(self, **args: Any) -> Any:
        self.runs += 1
        self.starts.append(trio.current_time())
        step = self.steps.pop(0) if self.steps else "ok"
        try:
            if step == "transient":
                await trio.lowlevel.checkpoint()
                raise d.TransientError("upstream busy")
            if step == "internal":
                await trio.lowlevel.checkpoint()
                raise ValueError("bad state")
            if step == "timeout":
                await trio.sleep(10_000)
            elif isinstance(step, int | float):
                await trio.sleep(step)
            else:
                await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        return {"run": self.runs, "args": args}


@attrs.define
class Gauge:
    """A handler that measures how many of its runs overlap."""

    seconds: float = 1.0
    now: int = 0
    peak: int = 0

    async def __call__(self, **args: Any) -> Any:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await trio.sleep(self.seconds)
        finally:
            self.now -= 1
        return args.get("i")


@asynccontextmanager
async def running(*tools: d.Tool, **config: Any) -> AsyncIterator[otp.Pid]:
    """A node (the test task is its process) with a dispatcher serving ``tools``."""
    async with otp.open_node():
        pid = await d.start_dispatcher(list(tools), d.DispatcherConfig(seed=7, **config))
        yield pid


async def add(a: int, b: int) -> int:
    await trio.lowlevel.checkpoint()
    return a + b


ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}

#: For the application test: a ``module:attr`` path names these.
TOOLS = [d.Tool("add", add, ADD_SCHEMA, idempotent=True)]
