"""A running pool for the tests: a real node (in the test's trio run) with real worker
processes, on a socket in a temporary directory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import otp
import supervisors
from apps import dirty

from .helpers import EchoPool, FakePool, StallingPool

#: Where the test apps live (the workers import them by path) and what they are.
APPS = "tests.test_apps.test_dirty.dirty_apps"
HOOKS = "tests.test_apps.test_dirty.dirty_hooks"
ECHO = f"{APPS}:EchoApp"
LIMITED = f"{APPS}:LimitedApp"
AUDIT = f"{APPS}:AuditApp"


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


@pytest.fixture
def fake_pool(tmp_path: Path) -> Any:
    pools: list[FakePool] = []

    def make(**kw: Any) -> FakePool:
        pool = FakePool(str(tmp_path / f"fake{len(pools)}.sock"), **kw)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture
def stalling_pool(tmp_path: Path) -> Iterator[Callable[..., StallingPool]]:
    pools: list[StallingPool] = []

    def make(first: int = 0) -> StallingPool:
        pool = StallingPool(str(tmp_path / f"stall{len(pools)}.sock"), first)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture
def echo_pool(tmp_path: Path) -> Iterator[EchoPool]:
    pool = EchoPool(str(tmp_path / "echo.sock"))
    yield pool
    pool.close()


@pytest.fixture
def echo_env(monkeypatch: pytest.MonkeyPatch, echo_pool: EchoPool) -> Iterator[EchoPool]:
    """GUNICORN_DIRTY_SOCKET set to an echo pool; the process's shared clients let go after."""
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", echo_pool.path)
    yield echo_pool
    dirty.close_dirty_client()


@pytest.fixture
def shared_env(monkeypatch: pytest.MonkeyPatch, socket_path: str) -> Iterator[str]:
    """GUNICORN_DIRTY_SOCKET set to the test's pool; the process's shared clients let go after."""
    monkeypatch.setenv("GUNICORN_DIRTY_SOCKET", socket_path)
    yield socket_path
    dirty.set_dirty_socket_path(None)
    dirty.close_dirty_client()
