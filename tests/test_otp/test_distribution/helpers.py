"""Node names and hand-made peers shared by the distribution tests."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import trio
import trio.testing

import otp
import wire

from ..peer import COOKIE, raw_peer

B = "b@localhost"
C = "c@localhost"
X = "x@localhost"


async def _listening_at(address: str, **config: Any) -> list[str]:
    config["listen"] = (address,)
    return await otp.start_distribution(otp.DistConfig(cookie=COOKIE, **config))


def _raw_peer(
    path: Path, name: str = X, expected: str = B
) -> contextlib.AbstractAsyncContextManager[tuple[trio.SocketStream, wire.FrameStream]]:
    return raw_peer(path, COOKIE, name, expected)


async def _still_serves(path: Path) -> None:
    """A fresh peer passes the handshake with the node at ``path`` and gets its first frame."""
    async with _raw_peer(path, name="probe@localhost") as (_, frames):
        with trio.fail_after(5):
            assert await frames.receive_frame() is not None
