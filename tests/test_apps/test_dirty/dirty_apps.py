"""DirtyApps the tests run in real worker processes."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from apps import dirty
from apps.dirty import DirtyApp


class EchoApp(DirtyApp):
    """Echo, errors, streams, sleeps: the behaviours the tests need."""

    stashes = ("echo_table",)

    def init(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.stopped: dict[str, bool] = {}
        self.stop_changed = threading.Condition()  # notified when ``stopped`` changes
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
            with self.stop_changed:
                self.stopped[tag] = True
                self.stop_changed.notify_all()

    def was_stopped(self, tag: str) -> bool:
        return self.stopped.get(tag, False)

    def wait_stopped(self, tag: str, bound: float) -> bool:
        """Whether the stream ``tag`` was stopped within ``bound`` seconds (from now)."""
        with self.stop_changed:
            return self.stop_changed.wait_for(lambda: self.stopped.get(tag, False), bound)

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


class CallOnly:
    """Callable, but not a DirtyApp: no init() or close() (the worker calls both)."""

    def __call__(self, action: str, *args: Any, **kwargs: Any) -> Any:
        return action


class RaisesInInit(dirty.DirtyApp):
    def __init__(self) -> None:
        raise RuntimeError("constructor boom")


class BadStashes(dirty.DirtyApp):
    stashes = 5  # type: ignore[assignment]


def two_arg_worker_init(worker: Any, extra: Any) -> None:
    """A dirty_worker_init of the wrong arity (the worker calls it with one argument)."""


class BadWorkers(dirty.DirtyApp):
    workers = 0


class ProbeApp(dirty.DirtyApp):
    """Actions for the edges probed here."""

    def init(self) -> None:
        self._model: Any = None

    @property
    def model(self) -> Any:
        """A lazily checked attribute, as apps write them: raises until a model is loaded."""
        if self._model is None:
            raise RuntimeError("no model loaded yet")
        return self._model

    def echo(self, value: Any) -> Any:
        return value

    def step(self) -> str:
        return "method"

    def rebind(self, callable_: bool) -> None:
        """Replace ``step`` on the instance: by another callable, or by a value."""
        self.step = (lambda: "rebound") if callable_ else 42  # type: ignore[assignment,method-assign]

    def nested(self, depth: int) -> Any:
        """A list ``depth`` lists deep (the protocol's depth limit is on the whole payload)."""
        value: Any = []
        for _ in range(depth - 1):
            value = [value]
        return value

    def bad_file(self) -> None:
        # A file name from the OS (os.listdir, sys.argv, environ) that is not UTF-8.
        name = os.fsdecode(b"photo-\xff.png")
        raise ValueError(f"cannot open {name}")

    def cli(self) -> None:
        raise SystemExit(2)  # what argparse does on a bad option

    def missing_table(self) -> Any:
        raise dirty.StashTableNotFoundError("sessions")  # as stash.info() raises it in an app

    def count(self, n: int) -> Iterator[int]:
        yield from range(n)

    def exit_mid_stream(self) -> Iterator[int]:
        yield 1
        raise SystemExit(2)

    async def async_exit(self) -> None:
        raise SystemExit(2)


class BigStreamApp(dirty.DirtyApp):
    """A stream of large chunks, and how far it got."""

    def init(self) -> None:
        self.made = 0

    def big(self, n: int, size: int) -> Iterator[bytes]:
        for _ in range(n):
            self.made += 1
            yield b"x" * size

    def numbered(self, n: int, size: int) -> Iterator[bytes]:
        for i in range(n):
            self.made += 1
            yield i.to_bytes(4, "big") * (size // 4)

    def produced(self) -> int:
        return self.made

    def blob(self, size: int) -> bytes:
        return b"b" * size

    def echo(self, value: Any) -> Any:
        return value


class AuditApp(dirty.DirtyApp):
    """Actions for the edges the tests probe."""

    stashes = ("audit_declared",)

    def bad_result(self) -> Any:
        return {1, 2}  # a set: not TLV-encodable

    def bad_chunk(self) -> Iterator[Any]:
        yield 1
        yield object()  # not TLV-encodable
        yield 3

    async def abad_chunk(self) -> AsyncIterator[Any]:
        yield 1
        await asyncio.sleep(0)
        yield object()

    async def afail_midway(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i
        raise KeyError("async broke")

    async def araise(self) -> None:
        await asyncio.sleep(0)
        raise ZeroDivisionError("async boom")

    def stall_stream(self, seconds: float) -> Iterator[int]:
        yield 1
        time.sleep(seconds)
        yield 2

    def nothing(self) -> None:
        return None

    def echo(self, value: Any) -> Any:
        return value

    def gen_none(self) -> Iterator[Any]:
        yield None
        yield 0
        yield ""


class StashUserApp(dirty.DirtyApp):
    """Uses the stash from inside a dirty worker (sync and async actions)."""

    def use(self, table: str) -> dict[str, Any]:
        from apps.dirty import stash

        stash.put(table, "user:1", {"n": 1})
        stash.put(table, "user:2", None)
        stash.put(table, "other", 3)
        t = stash.table(table)
        t["k"] = "v"
        out: dict[str, Any] = {
            "get": stash.get(table, "user:1"),
            "none_value": stash.get(table, "user:2", "dflt"),
            "default": stash.get(table, "missing", "dflt"),
            "keys": sorted(stash.keys(table, "user:*")),
            "info": stash.info(table),
            "exists": [stash.exists(table), stash.exists(table, "other"), stash.exists(table, "x")],
            "counter": [stash.update_counter(table, "c"), stash.update_counter(table, "c", 4)],
            "insert_new": [stash.insert_new(table, "once", 1), stash.insert_new(table, "once", 2)],
            "cas": [
                stash.compare_and_set(table, "once", 1, 10),
                stash.compare_and_set(table, "once", 1, 11),
                stash.compare_and_set(table, "fresh", stash.ABSENT, "x"),
            ],
            "len": len(t),
            "contains": ["k" in t, "nope" in t],
            "table_get": t.get("nope", "d"),
        }
        try:
            t["nope"]
        except KeyError:
            out["missing_item"] = "KeyError"
        return out

    async def ause(self, table: str) -> list[Any]:
        from apps.dirty import stash

        stash.ensure(table)
        stash.put(table, "a", 1)
        return [stash.get(table, "a"), stash.get(table, "zz", "dflt"), stash.tables()]


try:
    _GunicornDirtyApp: Any = importlib.import_module("gunicorn.dirty.app").DirtyApp
except ImportError:  # pragma: no cover - gunicorn is a test extra
    _GunicornDirtyApp = dirty.DirtyApp


class GunicornStyleApp(_GunicornDirtyApp):
    """An app written for Gunicorn (subclassing gunicorn.dirty.app.DirtyApp)."""

    def init(self) -> None:
        self.base = 10

    def add(self, a: int) -> int:
        return self.base + a

    async def aadd(self, a: int) -> int:
        await asyncio.sleep(0)
        return self.base + a

    def gen(self, n: int) -> Iterator[int]:
        yield from range(n)

    async def agen(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    def _hidden(self) -> str:
        return "no"


class MarkApp(dirty.DirtyApp):
    """A call that tells the test it has started running (it creates the file ``mark``)."""

    def hold(self, mark: str, seconds: float) -> float:
        Path(mark).touch()
        time.sleep(seconds)
        return seconds

    def pid(self) -> int:
        return os.getpid()


class ContendApp(dirty.DirtyApp):
    """Stash work done from inside dirty workers, to race with web clients."""

    def bump(self, table: str, key: str, n: int) -> int:
        from apps.dirty import stash

        last = 0
        for _ in range(n):
            last = stash.update_counter(table, key)
        return last

    def cas_bump(self, table: str, key: str, n: int) -> int:
        from apps.dirty import stash

        retries = 0
        for _ in range(n):
            while True:
                current = stash.get(table, key, 0)
                if stash.compare_and_set(table, key, current, current + 1):
                    break
                retries += 1
        return retries

    def pid(self) -> int:
        return os.getpid()

    def put_then_hang(self, table: str, wait: float) -> None:
        import time

        from apps.dirty import stash

        stash.put(table, "before", 1)
        time.sleep(wait)
