"""A running pool for the tests: a real node (in the test's trio run) with real worker
processes, on a socket in a temporary directory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import otp
import supervisors
from apps import dirty

ECHO = "tests.test_apps.test_dirty.dirty_apps:EchoApp"
LIMITED = "tests.test_apps.test_dirty.dirty_apps:LimitedApp"


async def calls_in_flight() -> int:
    """Calls in flight in the pool's workers, as the pool's observer view counts them."""
    [app] = [a for a in await supervisors.observe() if a.name == "dirty"]
    assert app.view is not None
    return sum(w["in_flight"] for w in app.view["workers"])


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "dirty.sock")


def make_config(socket_path: str, **kw: Any) -> dirty.DirtyConfig:
    kw.setdefault("dirty_apps", [ECHO])
    kw.setdefault("dirty_workers", 2)
    kw.setdefault("handle_signals", False)
    kw.setdefault("dirty_pidfile", socket_path + ".pid")
    return dirty.DirtyConfig(dirty_socket=socket_path, **kw)


@pytest.fixture
async def start_pool(socket_path: str) -> AsyncIterator[Callable[..., Any]]:
    """``await start_pool(**DirtyConfig fields)`` starts the pool in this node."""
    started = False
    async with otp.open_node():

        async def start(**kw: Any) -> dirty.DirtyConfig:
            nonlocal started
            config = make_config(socket_path, **kw)
            await supervisors.start_application(dirty.application(dirty_config=config))
            started = True
            return config

        yield start
        if started:
            with contextlib.suppress(supervisors.ApplicationError):  # the test stopped it
                await supervisors.stop_application("dirty")
