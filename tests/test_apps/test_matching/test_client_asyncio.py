"""The ``AsyncClient``'s own transport (``_client_asyncio``): the client's ops on the caller's
asyncio loop. Against the in-test server over a real Unix socket, in a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from apps.matching import (
    AsyncClient,
    CallTimeout,
    ClientClosed,
    FlowNotFound,
)

from .fake_matching_server import FakeServer
from .sdk_clients import Greeting, client_args, stuck


def _client(server: FakeServer, fake_dir: str, **options: Any) -> AsyncClient:
    return AsyncClient(*client_args(server, fake_dir, **options))


async def _started(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 10)


def test_every_op_and_concurrent_calls_on_one_connection(fake_server, fake_dir):
    async def main() -> None:
        async with _client(fake_server, fake_dir) as client:
            assert await client.start_flow(Greeting, b"x" * 100, flow_id="f") == "f"
            await asyncio.gather(*(client.start_flow(Greeting, flow_id=f"{i}") for i in range(50)))
            assert (await client.describe_flow("f")).flow_id == "f"
            assert len(await client.list_flows(Greeting, limit=1000)) == 51
            await client.cancel_flow("f")
            with pytest.raises(FlowNotFound):
                await client.describe_flow("nope")

    asyncio.run(main())
    assert fake_server.connections == 1 and "put_blob" in {op for op, _ in fake_server.calls}


def test_an_idle_client_answers_the_servers_pings(threaded_fake, fake_server, fake_dir):

    async def main() -> None:
        async with _client(fake_server, fake_dir) as client:
            await client.open()

            async def ping_and_wait_for_the_pong() -> None:
                ponged = fake_server.ponged
                await fake_server.ping_clients()
                await ponged.wait()

            # (the pong comes while the client's loop is idle, before any other call)
            await asyncio.to_thread(threaded_fake.run, ping_and_wait_for_the_pong)

    asyncio.run(main())
    assert fake_server.pongs == 1 and fake_server.connections == 1


def test_a_lost_connection_fails_the_calls_in_flight_and_the_next_call_dials(
    threaded_fake, fake_server, fake_dir
):
    started = threading.Event()
    fake_server.ops["call_rpc"] = stuck(started)

    async def main() -> None:
        async with _client(fake_server, fake_dir) as client:
            await client.start_flow(Greeting, flow_id="a")
            call = asyncio.create_task(client.call_rpc("a", "greeting"))
            await _started(started)
            await asyncio.to_thread(threaded_fake.run, fake_server.drop_connections)
            with pytest.raises(ClientClosed, match="was closed"):
                await call
            assert (await client.describe_flow("a")).flow_id == "a"

    asyncio.run(main())
    assert fake_server.connections == 2


def test_a_timed_out_or_cancelled_call_leaves_the_connection_usable(fake_server, fake_dir):
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)

    async def main() -> None:
        async with _client(fake_server, fake_dir, call_timeout=0.2) as client:
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
    assert fake_server.connections == 1


def test_close_fails_calls_in_flight_and_a_later_loop_dials_again(fake_server, fake_dir):
    started = threading.Event()
    fake_server.ops["describe"] = stuck(started)
    client = _client(fake_server, fake_dir)

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
    assert fake_server.connections == 2
