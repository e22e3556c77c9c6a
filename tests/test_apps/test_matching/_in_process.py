"""The real matching server in this test's own trio run, for end-to-end tests of the SDKs.

``async with matching_server(store_kind, **MatchingConfig fields) as address`` starts the
``matching`` application in a fresh node (a Unix socket in a short temporary directory; the
store ``store_kind`` names, or an in-memory SQLite without one) and stops it after. The store
runs its database calls on trio's own thread (``STORE_THREADS``), so tests using it run on
trio's MockClock (``autojump_clock``) on either kind of store; ``until`` polls in that virtual
time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

import otp
import supervisors
from apps.matching._application import STORE_THREADS, application
from apps.matching._config import MatchingConfig
from apps.matching._listener import Listener

from ._stores import StoreKind

#: The bound on every wait of these tests (they take milliseconds when all is well).
BOUND = 20.0


@asynccontextmanager
async def matching_server(store_kind: StoreKind | None = None, **config: Any) -> AsyncIterator[str]:
    """Yield the address the server listens on (its first). ``store`` in ``config`` names
    another location of ``store_kind``'s (its ``durable`` one, say)."""
    directory = tempfile.mkdtemp(prefix="m-", dir="/tmp")
    try:
        config.setdefault("listen", [f"unix:{os.path.join(directory, 'm.sock')}"])
        config.setdefault("store", ":memory:" if store_kind is None else store_kind.location)
        STORE_THREADS.set(False)  # (for this trio run: the servers it starts after this one too)
        async with otp.open_node():
            await supervisors.start_application(
                application(matching_config=MatchingConfig(**config))
            )
            try:
                [address, *_] = await Listener.address()
                yield address
            finally:
                running = await supervisors.which_applications()
                if any(a[0] == "matching" for a in running):
                    await supervisors.stop_application("matching")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def until(condition: Callable[[], bool], bound: float = BOUND) -> None:
    """Wait (polling in the test's clock; bounded by ``bound`` seconds) until ``condition()``
    holds: for SDK statistics, which no event announces."""
    with trio.fail_after(bound):
        while not condition():
            await trio.sleep(0.002)
