"""DirtyApps the tests run in real worker processes."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from apps.dirty import DirtyApp


class EchoApp(DirtyApp):
    """Echo, errors, streams, sleeps: the behaviours the tests need."""

    stashes = ("echo_table",)

    def init(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.stopped: dict[str, bool] = {}
        self.active = 0
        self.most_active = 0

    def track(self, seconds: float) -> int:
        """Counts the sync actions running at once; returns the most seen so far."""
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        time.sleep(seconds)
        with self.lock:
            self.active -= 1
            return self.most_active

    def echo(self, value: Any) -> Any:
        return value

    def add(self, a: int, b: int = 0) -> int:
        return a + b

    def pid(self) -> int:
        return os.getpid()

    def fail(self, message: str) -> None:
        raise RuntimeError(message)

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)  # blocking work, as a real app would do
        return seconds

    async def async_add(self, a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    def count(self, n: int) -> Iterator[int]:
        yield from range(n)

    async def acount(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    def fail_midway(self, n: int) -> Iterator[int]:
        yield from range(n)
        raise ValueError("broke mid-stream")

    def endless(self, tag: str) -> Iterator[int]:
        i = 0
        try:
            while True:
                yield i
                i += 1
                time.sleep(0.001)
        finally:
            self.stopped[tag] = True

    def was_stopped(self, tag: str) -> bool:
        return self.stopped.get(tag, False)

    def _private(self) -> str:
        return "secret"


class LimitedApp(DirtyApp):
    """Loaded by one worker only."""

    workers = 1

    def pid(self) -> int:
        return os.getpid()


class BrokenApp(DirtyApp):
    """Fails to load."""

    def init(self) -> None:
        raise RuntimeError("cannot load the model")


class LogApp(DirtyApp):
    """Logs through the worker's root logger (USR1 tests) and reports its environment (hooks)."""

    def log(self, message: str) -> None:
        logging.getLogger("dirty.test").warning("%s", message)

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    async def async_block(self, seconds: float) -> float:
        time.sleep(seconds)  # blocks the worker's loop: no heartbeats either
        return seconds

    def stall_stream(self, seconds: float) -> Iterator[int]:
        yield 1
        time.sleep(seconds)
        yield 2


class CallApp(DirtyApp):
    """Its own ``__call__`` (runs in a worker thread) hands back coroutines, async
    generators, generators and plain values."""

    def __call__(self, action: str, *args: Any, **kwargs: Any) -> Any:
        if action == "coro":
            return self._coro(*args)
        if action == "agen":
            return self._agen(*args)
        if action == "gen":
            return (i for i in range(args[0]))
        if action == "fail":
            raise ValueError("custom call failed")
        return (action, list(args))

    async def _coro(self, value: Any) -> Any:
        await asyncio.sleep(0)
        return ["coro", value]

    async def _agen(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i


class GatedApp(DirtyApp):
    """A worker started while the FIFO named by ``DIRTY_TEST_GATE`` exists loads this app only
    once the test has opened the FIFO for writing and closed it again: a worker start the test
    holds open for as long as it likes (and knows to be under way). A plain file there makes
    the load fail."""

    def init(self) -> None:
        gate = os.environ.get("DIRTY_TEST_GATE")
        if gate and os.path.isfile(gate):
            raise RuntimeError("the gate is shut")
        if gate and os.path.exists(gate):
            with open(gate) as fifo:  # blocks until the test opens the writing end
                fifo.read()  # until the test closes it

    def pid(self) -> int:
        return os.getpid()


def _note(event: str) -> None:
    """Append ``event pid`` to the file named by DIRTY_TEST_ORDER (hooks and apps share it)."""
    with open(os.environ["DIRTY_TEST_ORDER"], "a") as log:
        log.write(f"{event} {os.getpid()}\n")


class OrderApp(DirtyApp):
    """Records when its ``__init__`` and ``init()`` run, in the worker."""

    def __init__(self) -> None:
        _note("__init__")

    def init(self) -> None:
        _note("init")

    def pid(self) -> int:
        return os.getpid()


class TogetherApp(DirtyApp):
    """Each worker's ``init()`` waits until every worker of the pool (DIRTY_TEST_WORKERS of
    them) is in its ``init()``: the pool loads only if its workers load at the same time."""

    def init(self) -> None:
        folder = os.environ["DIRTY_TEST_TOGETHER"]
        open(os.path.join(folder, str(os.getpid())), "w").close()
        while len(os.listdir(folder)) < int(os.environ["DIRTY_TEST_WORKERS"]):
            time.sleep(0.01)

    def pid(self) -> int:
        return os.getpid()


class FlakyLoadApp(DirtyApp):
    """Its first load fails (it leaves the file DIRTY_TEST_FLAKY behind); the next ones work."""

    def init(self) -> None:
        mark = os.environ["DIRTY_TEST_FLAKY"]
        if not os.path.exists(mark):
            open(mark, "w").close()
            raise RuntimeError("the model file is not there yet")

    def pid(self) -> int:
        return os.getpid()
