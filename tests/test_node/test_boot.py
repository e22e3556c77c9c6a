"""Booting applications in process: a failed start stops what already started, in reverse,
and a SIGTERM during a start stops the node."""

from __future__ import annotations

import io
import signal
from typing import Any

import trio

import otp
import supervisors
from otp.node import NodeConfig, serve

from .helpers import _app


async def test_a_failed_start_stops_the_applications_already_started_in_reverse(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[str] = []
    apps = [
        _app("one", events, "a", "b"),
        _app("two", events, "c"),
        _app("three", events, "d", "e", fail="e"),
    ]
    out = io.StringIO()
    code = await serve(NodeConfig(name="boot@audit"), apps, out=out)
    assert code == 1
    assert "application three failed to start" in out.getvalue()
    assert "is running" not in out.getvalue()
    assert events == [
        "init a",
        "init b",
        "init c",
        "init d",
        "terminate d shutdown",  # three's own tree, stopped as its start fails
        "terminate c shutdown",
        "terminate b shutdown",
        "terminate a shutdown",
    ]


class _StuckInInit(otp.GenServer):
    """An init that never returns (waiting on a database that is down, say)."""

    async def init(self, entered: trio.Event) -> otp.Ok:
        entered.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_sigterm_while_an_application_is_starting_stops_the_node(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[str] = []
    entered = trio.Event()
    stuck = supervisors.Application(
        "stuck",
        (
            supervisors.SupFlags(strategy="one_for_one"),
            [supervisors.ChildSpec("s", (_StuckInInit.start_link, entered))],
        ),
    )
    out = io.StringIO()
    codes: list[int] = []

    async def run() -> None:
        codes.append(
            await serve(NodeConfig(name="boot@audit"), [_app("one", events, "a"), stuck], out=out)
        )

    def ours(signum: int, frame: Any) -> None:
        raise AssertionError("SIGTERM arrived while the node's receiver was not installed")

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        with trio.move_on_after(600):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await entered.wait()
                assert signal.getsignal(signal.SIGTERM) is not ours
                signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "SIGTERM: stopping gracefully" in out.getvalue()
    assert codes == [0], out.getvalue()
    assert events == ["init a", "terminate a shutdown"]
