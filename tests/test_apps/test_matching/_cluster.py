"""Two matching servers as one service, for tests of dispatch across servers: this test's own
node runs one (``clustered_server``), a thread runs the other (``PeerServer``, its own node in
its own ``trio.run``), connected by otp's distribution over Unix sockets. Each has its own
in-memory store: routing needs no shared store.

Both run on the wall clock (two ``trio.run``s share no MockClock); every wait is on an event,
bounded by ``BOUND``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import otp
import supervisors
from apps.matching._application import application
from apps.matching._config import MatchingConfig
from apps.matching._listener import Listener

COOKIE = b"matching-cluster-cookie"


async def _start_server(directory: str, name: str, **config: Any) -> str:
    """Distribution on ``directory/<name>.dist``, then the matching application; its address."""
    await otp.start_distribution(
        otp.DistConfig(cookie=COOKIE, listen=(f"unix:{directory}/{name}.dist",))
    )
    config.setdefault("listen", [f"unix:{os.path.join(directory, name + '.sock')}"])
    config.setdefault("store", ":memory:")
    await supervisors.start_application(application(matching_config=MatchingConfig(**config)))
    [address, *_] = await Listener.address()
    return str(address)


@asynccontextmanager
async def cluster_directory() -> AsyncIterator[str]:
    directory = tempfile.mkdtemp(prefix="mc-", dir="/tmp")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def clustered_server(directory: str, name: str, **config: Any) -> AsyncIterator[str]:
    """This test's node ``name@localhost`` running a matching server; yields its address."""
    async with otp.open_node(f"{name}@localhost"):
        address = await _start_server(directory, name, **config)
        try:
            yield address
        finally:
            if any(a[0] == "matching" for a in await supervisors.which_applications()):
                await supervisors.stop_application("matching")


async def _control() -> None:
    """Registered as "control" on a ``PeerServer``'s node: ``("kill", name, reply_to)`` kills
    the process registered as ``name`` there (brutally) and answers ``"killed"``."""
    while True:
        request = await otp.receive()
        if isinstance(request, tuple) and request[0] == "kill":
            _, name, reply_to = request
            target = otp.whereis(name)
            if target is not None:
                ref = otp.monitor(target)
                otp.exit(target, otp.KILL)
                await otp.receive(lambda m, ref=ref: isinstance(m, otp.Down) and m.ref == ref)
            otp.send(reply_to, "killed")


class PeerServer:
    """A matching server on node ``name@localhost`` in a thread; ``kill()`` ends its node at
    once (every process killed, its sockets closed), as a crashed server's would;
    ``kill_process(name)`` kills one registered process of it (its supervisor restarts it)."""

    def __init__(self, directory: str, name: str, **config: Any) -> None:
        self.directory = directory
        self.name = name
        self.node = f"{name}@localhost"
        self.dist_address = f"unix:{directory}/{name}.dist"
        self.config = config
        self.address = ""
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self.error: BaseException | None = None

    async def __aenter__(self) -> PeerServer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        await trio.to_thread.run_sync(self._ready.wait, 30)
        if self.error is not None:
            raise self.error
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kill()
        assert self._thread is not None
        await trio.to_thread.run_sync(self._thread.join, 30)

    def kill(self) -> None:
        if self._token is not None and self._scope is not None:
            try:
                self._token.run_sync_soon(self._scope.cancel)
            except trio.RunFinishedError:
                pass

    async def kill_process(self, name: str) -> None:
        """(From a process of a node connected to this one.)"""
        otp.send(("control", self.node), ("kill", name, otp.self()))
        assert await otp.receive(lambda m: m == "killed") == "killed"

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test through .error
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        async with otp.open_node(self.node):
            self.address = await _start_server(self.directory, self.name, **self.config)
            otp.register("control", otp.spawn(_control))
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self._scope:
                self._ready.set()
                await trio.sleep_forever()
