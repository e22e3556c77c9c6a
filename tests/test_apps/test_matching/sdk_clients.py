"""What the tests of the client flavours' own transports share (``test_client_sync.py``,
``test_client_asyncio.py``): a flow type, a client's arguments for the in-test server (the
``fake_server`` fixture of ``conftest.py``), and a server op that never answers."""

from __future__ import annotations

import os
import threading
from typing import Any

import trio

from apps.matching import Flow, rpc, step
from apps.matching._blobs import BlobCache

from .fake_matching_server import FakeServer


class Greeting(Flow):
    name = "Greeting"

    @step
    def greet(self, ctx, who):
        return f"Hello, {who}!"

    @rpc
    def greeting(self, ctx):
        return None


def client_args(server: FakeServer, short_dir: str, **options: Any) -> tuple[Any, ...]:
    """A client's arguments for ``server`` (values over 16 bytes go through the blob cache)."""
    from apps.matching import ClientOptions, Registry

    return (
        Registry([Greeting]),
        BlobCache(os.path.join(short_dir, "cb"), inline_limit=16),
        ClientOptions(server_address=f"unix:{server.path}", **options),
    )


def stuck(started: threading.Event) -> Any:
    """A server op that sets ``started`` and never answers."""

    async def op(args: dict[str, Any]) -> Any:
        started.set()
        await trio.sleep_forever()

    return op
