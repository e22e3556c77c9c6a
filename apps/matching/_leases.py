"""``matching_leases``: keeps this server's leases on its flows' pending steps, and claims the
steps no live server holds (MULTISERVER.md, part A).

Every ``lease_seconds / 3`` it renews every lease this server holds (``renew_leases``) and
claims; it claims too whenever the store says free steps appeared (``wait_pending``: a server
released its leases as it stopped; on PostgreSQL a ``NOTIFY``). Expired leases (a server that
died or went silent) wake nobody, so the poll finds them. What it claims goes to the engine
(``Claimed``), which takes those flows and dispatches their current steps again.

It is a child of ``matching_sup`` right after the engine, and monitors it: the engine's
restart restarts it (rest_for_one), and a new engine takes back every lease of this server at
its start, so a claim sent to an engine that died is not lost. On a clean stop it releases this
server's leases, which wakes the other servers: they claim those flows at once.

On a store no other server shares (SQLite, one server per file) there is nobody to renew
against, claim from or hand over to (the engine takes every step back at its next start): the
keeper then does nothing at all, so the embedded default costs nothing more than before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs

import otp

from ._engine_state import ENGINE, Claimed, EngineOptions
from ._store import StoreError, StoreServer

__all__ = ["LEASES", "CLAIM_PAGE", "LeaseKeeper", "start_leases"]

logger = logging.getLogger("apps.matching")

#: The registered name of the lease keeper.
LEASES = "matching_leases"
#: Steps one claim takes (it claims again at once while a claim comes back full).
CLAIM_PAGE = 200
#: How long a clean stop waits for the release of this server's leases.
RELEASE_TIMEOUT = 5.0


@attrs.frozen
class _Tick:
    """A third of the lease passed: renew, and claim what expired."""


@attrs.frozen
class _Woken:
    """The store's pending-change generation grew: claim."""


@attrs.define
class _State:
    options: EngineOptions
    engine: otp.Pid | None = None
    engine_ref: otp.Ref | None = None
    watcher: otp.Pid | None = None


class LeaseKeeper(otp.GenServer):
    """The ``matching_leases`` GenServer (see the module docstring). Start it with
    :func:`start_leases` once the engine is registered."""

    def init(self, options: EngineOptions, engine: Any = ENGINE, shared: bool = True) -> Any:
        state = _State(options=options)
        if not shared:
            return otp.Ok(state)
        pid = otp.whereis(engine) if isinstance(engine, str) else engine
        if pid is None:
            return otp.Stop(f"matching_leases: the engine {engine!r} is not running")
        otp.process_flag(trap_exit=True)  # (to release the leases when stopped)
        state.engine, state.engine_ref = pid, otp.monitor(pid)
        me = otp.self()
        state.watcher = otp.spawn_link(_watch, options.store, me)
        otp.send_after(options.lease_seconds / 3, me, _Tick())
        return otp.Ok(state)

    async def handle_info(self, message: Any, state: _State) -> Any:
        match message:
            case _Woken():
                await self._claim(state)
            case _Tick():
                options = state.options
                await StoreServer.renew_leases(
                    options.server_id, time.time(), options.lease_seconds,
                    server=options.store, timeout=None,
                )  # fmt: skip
                await self._claim(state)
                otp.send_after(options.lease_seconds / 3, otp.self(), _Tick())
            case otp.Down(ref=ref, reason=reason) if ref == state.engine_ref:
                return otp.Stop(reason, state)
            case otp.Exit(pid=pid, reason=reason) if pid == state.watcher:
                return otp.Stop(reason, state)
        return otp.NoReply(state)

    async def _claim(self, state: _State) -> None:
        options, engine = state.options, state.engine
        assert engine is not None  # (only a keeper of a shared store claims)
        while True:
            claims = await StoreServer.claim_steps(
                options.server_id, time.time(), options.lease_seconds, CLAIM_PAGE,
                server=options.store, timeout=None,
            )  # fmt: skip
            if claims:
                otp.send(engine, Claimed(tuple(claims)))
            if len(claims) < CLAIM_PAGE:
                return

    async def terminate(self, reason: Any, state: _State) -> None:
        options = state.options
        if state.watcher is None:
            return  # (an unshared store: nothing to hand over)
        try:
            released = await StoreServer.release_leases(
                options.server_id, server=options.store, timeout=RELEASE_TIMEOUT
            )
        except (StoreError, otp.CallError, otp.CallTimeout) as exc:
            logger.warning(
                "matching_leases: could not release the leases of %s as it stopped (%s);"
                " other servers take its flows when the leases expire",
                options.server_id, exc,
            )  # fmt: skip
        else:
            if released:
                logger.info(
                    "matching_leases: released %d leases of %s", released, options.server_id
                )


async def _watch(store: Any, keeper: otp.Pid) -> None:
    """Tells the keeper each time the store's pending-change generation grows."""
    generation = 0
    while True:
        generation = await StoreServer.wait_pending(generation, server=store)
        otp.send(keeper, _Woken())


async def start_leases(options: EngineOptions, engine: Any = ENGINE, *, shared: bool) -> otp.Pid:
    """Start ``matching_leases`` linked to the caller (``matching_sup``); ``shared``: whether
    other servers may use the store (PostgreSQL), else the keeper does nothing."""
    return await LeaseKeeper.start_link(options, engine, shared, name=LEASES)
