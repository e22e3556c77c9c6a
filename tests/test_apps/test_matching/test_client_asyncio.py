"""The ``AsyncClient``'s own transport (``_client_asyncio``): the client's ops on the caller's
asyncio loop. Against the in-test server over a real Unix socket, in a thread of its own."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from apps.matching import (
    AsyncClient,
    CallTimeout,
    ClientClosed,
    ClientOptions,
    Flow,
    FlowNotFound,
    Registry,
    rpc,
    step,
)
from apps.matching._blobs import BlobCache

from .fake_matching_server import FakeServer, ThreadedFakeServer


class Greeting(Flow):
    name = "Greeting"

    @step
    def greet(self, ctx, who):
        return f"Hello, {who}!"

    @rpc
    def greeting(self, ctx):
        return None


@pytest.fixture
def short_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ma-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def threaded(short_dir) -> Iterator[ThreadedFakeServer]:
    threaded = ThreadedFakeServer(
        os.path.join(short_dir, "s.sock"), BlobCache(os.path.join(short_dir, "sb"))
    )
    with threaded:
        yield threaded


@pytest.fixture
def server(threaded) -> FakeServer:
    return threaded.server


def _client(server: FakeServer, short_dir: str, **options: Any) -> AsyncClient:
    return AsyncClient(
        Registry([Greeting]),
        BlobCache(os.path.join(short_dir, "cb"), inline_limit=16),
        ClientOptions(server_address=f"unix:{server.path}", **options),
    )


def _stuck(started: threading.Event) -> Any:
    async def stuck(args: dict[str, Any]) -> Any:
        started.set()
        await trio.sleep_forever()

    return stuck


async def _started(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 10)


def test_every_op_and_concurrent_calls_on_one_connection(server, short_dir):
    async def main() -> None:
        async with _client(server, short_dir) as client:
            assert await client.start_flow(Greeting, b"x" * 100, flow_id="f") == "f"
            await asyncio.gather(*(client.start_flow(Greeting, flow_id=f"{i}") for i in range(50)))
            assert (await client.describe_flow("f")).flow_id == "f"
            assert len(await client.list_flows(Greeting, limit=1000)) == 51
            await client.cancel_flow("f")
            with pytest.raises(FlowNotFound):
                await client.describe_flow("nope")

    asyncio.run(main())
    assert server.connections == 1 and "put_blob" in {op for op, _ in server.calls}


def test_an_idle_client_answers_the_servers_pings(threaded, short_dir):
    server = threaded.server

    async def main() -> None:
        async with _client(server, short_dir) as client:
            await client.open()

            async def ping_and_wait_for_the_pong() -> None:
                ponged = server.ponged
                await server.ping_clients()
                await ponged.wait()

            # (the pong comes while the client's loop is idle, before any other call)
            await asyncio.to_thread(threaded.run, ping_and_wait_for_the_pong)

    asyncio.run(main())
    assert server.pongs == 1 and server.connections == 1


def test_a_lost_connection_fails_the_calls_in_flight_and_the_next_call_dials(threaded, short_dir):
    server = threaded.server
    started = threading.Event()
    server.ops["call_rpc"] = _stuck(started)

    async def main() -> None:
        async with _client(server, short_dir) as client:
            await client.start_flow(Greeting, flow_id="a")
            call = asyncio.create_task(client.call_rpc("a", "greeting"))
            await _started(started)
            await asyncio.to_thread(threaded.run, server.drop_connections)
            with pytest.raises(ClientClosed, match="was closed"):
                await call
            assert (await client.describe_flow("a")).flow_id == "a"

    asyncio.run(main())
    assert server.connections == 2


def test_a_timed_out_or_cancelled_call_leaves_the_connection_usable(server, short_dir):
    started = threading.Event()
    server.ops["describe"] = _stuck(started)

    async def main() -> None:
        async with _client(server, short_dir, call_timeout=0.2) as client:
            with pytest.raises(CallTimeout, match=r"'describe' .* within 0\.2 s"):
                await client.describe_flow("x")
            started.clear()
            call = asyncio.create_task(client.describe_flow("x"))
            await _started(started)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await client.start_flow(Greeting, flow_id="after") == "after"

    asyncio.run(main())
    assert server.connections == 1


def test_close_fails_calls_in_flight_and_a_later_loop_dials_again(server, short_dir):
    started = threading.Event()
    server.ops["describe"] = _stuck(started)
    client = _client(server, short_dir)

    async def first() -> None:
        assert await client.start_flow(Greeting, flow_id="one") == "one"

    async def second() -> None:
        assert (await client.list_flows())[0].flow_id == "one"  # (another loop: dials again)
        call = asyncio.create_task(client.describe_flow("x"))
        await _started(started)
        await client.close()
        with pytest.raises(ClientClosed, match="closed during the call"):
            await call
        await client.close()  # twice is fine
        with pytest.raises(ClientClosed, match="the client is closed"):
            await client.describe_flow("one")

    asyncio.run(first())
    asyncio.run(second())
    assert server.connections == 2
