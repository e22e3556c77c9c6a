"""Small servers shared by the otp tests."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

import otp
from otp import GenServer, Reply, Stop


class Sleepy(GenServer):
    """Answers ``("sleep", s)`` after sleeping ``s`` seconds inside handle_call."""

    async def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request[0] == "sleep":
            await trio.sleep(request[1])
            return Reply(("slept", request[1]), state)
        if request[0] == "die":
            return Stop(request[1], state)
        return Reply(request, state)
