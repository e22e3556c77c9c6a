"""The embedded default of ``python -m otp.node``: a small supervision tree to look at.

``demo`` is an application whose root supervisor runs a registered ``greeter`` server and a
``ticker`` that counts seconds on trio's clock; both show up in the node's banner, and both stop
in reverse start order when the node does.
"""

from __future__ import annotations

import logging
from typing import Any

import otp
import supervisors

logger = logging.getLogger("otp.node.demo")


class Greeter(otp.GenServer):
    """Answers ``("hello", name)`` calls; counts how many it answered."""

    def init(self) -> otp.Ok:
        return otp.Ok(0)

    def handle_call(self, request: Any, from_: otp.From, count: int) -> otp.Reply:
        match request:
            case ("hello", name):
                return otp.Reply(f"hello, {name}, from {otp.node_name()}", count + 1)
            case "count":
                return otp.Reply(count, count)
        return otp.Reply(("error", ("unknown_request", request)), count)


class Ticker(otp.GenServer):
    """Counts ticks, one a second, with ``send_after`` (no sleeping loop)."""

    def init(self, interval: float = 1.0) -> otp.Ok:
        otp.send_after(interval, otp.self(), "tick")
        return otp.Ok((interval, 0))

    def handle_info(self, message: Any, state: tuple[float, int]) -> otp.NoReply:
        interval, ticks = state
        if message == "tick":
            otp.send_after(interval, otp.self(), "tick")
            logger.debug("tick %d", ticks + 1)
            return otp.NoReply((interval, ticks + 1))
        return otp.NoReply(state)

    def handle_call(self, request: Any, from_: otp.From, state: tuple[float, int]) -> otp.Reply:
        return otp.Reply(state[1], state)


demo_application = supervisors.Application(
    "demo",
    (
        supervisors.SupFlags(strategy="one_for_one", intensity=3, period=5),
        [
            supervisors.ChildSpec("greeter", Greeter),
            supervisors.ChildSpec("ticker", (Ticker.start_link, 1.0)),
        ],
    ),
    description="a demo tree: a greeter and a ticker",
    version="1",
)
