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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import otp
import supervisors
from apps.matching._application import application
from apps.matching._config import MatchingConfig
from apps.matching._listener import Listener
from tests.test_otp.peer import PeerNode

COOKIE = b"matching-cluster-cookie"


async def _start_matching(directory: str, name: str, **config: Any) -> str:
    """The matching application (a Unix socket in ``directory``, an in-memory store); its
    address."""
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
        await otp.start_distribution(
            otp.DistConfig(cookie=COOKIE, listen=(f"unix:{directory}/{name}.dist",))
        )
        address = await _start_matching(directory, name, **config)
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


class PeerServer(PeerNode):
    """A matching server on node ``name@localhost`` in a thread (``matching`` its address);
    ``stop()`` ends its node at once (every process killed, its sockets closed), as a crashed
    server's would; ``kill_process(name)`` kills one registered process of it (its supervisor
    restarts it)."""

    def __init__(self, directory: str, name: str, **config: Any) -> None:
        dist = f"unix:{directory}/{name}.dist"
        super().__init__(f"{name}@localhost", dist, cookie=COOKIE, setup=self._serve)
        self.directory = directory
        self.matching_config = config
        self.matching = ""

    async def _serve(self) -> None:
        self.matching = await _start_matching(
            self.directory, self.name.partition("@")[0], **self.matching_config
        )
        otp.register("control", otp.spawn(_control))

    async def kill_process(self, name: str) -> None:
        """(From a process of a node connected to this one.)"""
        otp.send(("control", self.name), ("kill", name, otp.self()))
        assert await otp.receive(lambda m: m == "killed") == "killed"


@asynccontextmanager
async def two_servers(**config: Any) -> AsyncIterator[tuple[str, PeerServer]]:
    """Server m1 on this test's node (its address) and m2 in a thread, their nodes connected."""
    async with (
        cluster_directory() as directory,
        PeerServer(directory, "m2", **config) as m2,
        clustered_server(directory, "m1", **config) as m1,
    ):
        assert await otp.connect(m2.name, m2.address)
        yield m1, m2
