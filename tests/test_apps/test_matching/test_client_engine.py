"""The client engine against an in-test server over a real Unix socket."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest
import trio
import trio.testing

from apps.matching import (
    CallTimeout,
    ClientClosed,
    ClientOptions,
    ConfigurationError,
    Flow,
    FlowNotFound,
    FlowStatus,
    Registry,
    RetryPolicy,
    UnknownFlowType,
    rpc,
    step,
)
from apps.matching._blobs import BlobCache
from apps.matching._client_engine import ClientEngine

from .fake_matching_server import FakeServer


class Greeting(Flow):
    name = "Greeting"

    @step(retry=RetryPolicy(max_attempts=5, initial_backoff=0.5), timeout=10)
    def greet(self, ctx, who):
        ctx.state["greeting"] = f"Hello, {who}!"
        return ctx.state["greeting"]

    @step
    def shout(self, ctx, text):
        return text.upper()

    @rpc
    def greeting(self, ctx):
        return ctx.state.get("greeting")


@pytest.fixture
def short_dir() -> Iterator[str]:
    # Unix socket paths are short (108 bytes): pytest's tmp_path may be too long.
    d = tempfile.mkdtemp(prefix="mt-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def server(short_dir) -> AsyncIterator[FakeServer]:
    fake = FakeServer(os.path.join(short_dir, "s.sock"), BlobCache(os.path.join(short_dir, "sb")))
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        yield fake
        nursery.cancel_scope.cancel()


@pytest.fixture
async def client(server, short_dir) -> AsyncIterator[ClientEngine]:
    engine = ClientEngine(
        Registry([Greeting]),
        BlobCache(os.path.join(short_dir, "cb"), inline_limit=16),
        ClientOptions(server_address=f"unix:{server.path}"),
    )
    yield engine
    await engine.close()


async def test_start_flow_sends_type_id_args_and_the_definition(client, server):
    flow_id = await client.start_flow(Greeting, "world", flow_id="f-1")
    assert flow_id == "f-1"
    op, args = server.calls[-1]
    assert op == "start_flow"
    assert args == {
        "flow_type": "Greeting",
        "flow_id": "f-1",
        "args": ["world"],
        "definition": {
            "steps": [
                {
                    "name": "greet",
                    "kind": "execute",
                    "max_attempts": 5,
                    "initial_backoff": 0.5,
                    "backoff_coefficient": 2.0,
                    "max_backoff": 60.0,
                    "non_retryable_errors": [],
                    "timeout": 10.0,
                },
                {
                    "name": "shout",
                    "kind": "execute",
                    "max_attempts": 3,
                    "initial_backoff": 1.0,
                    "backoff_coefficient": 2.0,
                    "max_backoff": 60.0,
                    "non_retryable_errors": [],
                    "timeout": None,
                },
            ],
            "rpcs": ["greeting"],
        },
    }
    assert server.hellos[0].role == "client" and server.hellos[0].worker_id is None


async def test_start_flow_by_name_or_instance_and_server_chosen_id(client, server):
    first = await client.start_flow("Greeting", "a")
    second = await client.start_flow(Greeting(), "b")
    assert first != second and {first, second} <= set(server.flows)


async def test_start_flow_of_a_type_the_registry_lacks_sends_nothing(client, server):
    with pytest.raises(UnknownFlowType, match="'Other' is not in this registry"):
        await client.start_flow("Other")
    assert server.calls == []


async def test_server_errors_arrive_as_their_typed_classes(client, server):
    with pytest.raises(FlowNotFound, match="no flow 'missing'"):
        await client.describe_flow("missing")

    async def refuse(args):
        raise UnknownFlowType("the server has no flow type 'Greeting'")

    server.ops["start_flow"] = refuse
    with pytest.raises(UnknownFlowType, match="the server has no flow type"):
        await client.start_flow(Greeting)


async def test_large_arguments_are_uploaded_as_blobs_and_results_fetched(client, server):
    big = b"A" * 100
    flow_id = await client.start_flow(Greeting, big, b"small")
    ops = [op for op, _ in server.calls]
    assert ops == ["put_blob", "start_flow"]
    sent = server.calls[-1][1]["args"]
    assert sent[1] == b"small"
    assert sent[0]["size"] == 100 and server.blobs.get(sent[0]["$blob"]) == big

    result = b"R" * 200
    ref = {"$blob": server.blobs.put(result), "size": 200}

    async def finished(args):
        return {"out": [ref]}

    server.ops["result"] = finished
    assert await client.result(flow_id) == {"out": [result]}
    assert server.calls[-1][0] == "get_blob"
    assert client.cache.has(ref["$blob"])


async def test_an_rpcs_large_arguments_are_uploaded_and_its_large_answer_fetched(client, server):
    result = b"R" * 200
    ref = {"$blob": server.blobs.put(result), "size": 200}

    async def answer(args):
        return {"got": args["args"], "out": ref}

    server.ops["call_rpc"] = answer
    got = await client.call_rpc("f", "greeting", b"A" * 100, 1)
    assert [op for op, _ in server.calls] == ["put_blob", "call_rpc", "get_blob"]
    assert got == {"got": [b"A" * 100, 1], "out": result}
    # A small answer in a container is looked through, and kept as it is.
    server.ops["call_rpc"] = lambda args: _value({"a": [1, "x"]})
    assert await client.call_rpc("f", "greeting") == {"a": [1, "x"]}


async def _value(value):
    return value


async def test_call_rpc_sends_name_args_and_timeout(client, server):
    async def answer(args):
        return ["rpc", args["name"], args["args"], args["timeout"]]

    server.ops["call_rpc"] = answer
    assert await client.call_rpc("f", "greeting", 1, 2, timeout=3) == [
        "rpc",
        "greeting",
        [1, 2],
        3.0,
    ]
    assert await client.call_rpc("f", "greeting") == ["rpc", "greeting", [], None]


async def test_result_asks_the_server_to_wait_the_call_timeout_by_default(client, server):
    async def answer(args):
        return args["timeout"]

    server.ops["result"] = answer
    assert await client.result("f") == 60.0
    assert await client.result("f", timeout=2.5) == 2.5


async def test_result_of_a_flow_that_does_not_end_times_out(client, server, autojump_clock):
    await client.start_flow(Greeting, "x", flow_id="slow")  # no worker: it never ends
    with pytest.raises(CallTimeout, match=r"still running after 5\.0 s"):
        await client.result("slow", timeout=5)


async def test_describe_and_list_flows(client, server):
    await client.start_flow(Greeting, "x", flow_id="one")
    await client.start_flow(Greeting, "y", flow_id="two")
    description = await client.describe_flow("one")
    assert description.flow_id == "one"
    assert description.status is FlowStatus.RUNNING
    assert description.args == ("x",)
    rows = await client.list_flows(Greeting, status="running", limit=1)
    assert [r.flow_id for r in rows] == ["two"]
    assert server.calls[-1][1] == {"flow_type": "Greeting", "status": "running", "limit": 1}
    assert await client.list_flows(status=FlowStatus.COMPLETED) == []


async def test_list_flows_validates_its_arguments(client):
    with pytest.raises(ConfigurationError, match="status must be one of"):
        await client.list_flows(status="sleeping")
    with pytest.raises(ConfigurationError, match="limit must be an int >= 1 \\(got 0\\)"):
        await client.list_flows(limit=0)


async def test_cancel_flow(client, server):
    await client.start_flow(Greeting, "x", flow_id="c")
    await client.cancel_flow("c")
    await trio.testing.wait_all_tasks_blocked()
    assert server.flows["c"]["status"] == "cancelled"


async def test_a_connection_lost_between_calls_reconnects_on_the_next_call(client, server):
    await client.start_flow(Greeting, "x", flow_id="a")
    await server.drop_connections()
    await trio.testing.wait_all_tasks_blocked()
    assert (await client.describe_flow("a")).flow_id == "a"
    assert server.connections == 2


async def test_one_connection_serves_concurrent_calls(client, server):
    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(client.start_flow, Greeting, i)
    assert len(server.flows) == 10 and server.connections == 1


async def test_a_cancelled_call_leaves_the_client_usable(client, server):
    async def stuck(args):
        await trio.sleep_forever()

    server.ops["describe"] = stuck
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.describe_flow, "x")
        await trio.testing.wait_all_tasks_blocked()
        assert server.calls[-1][0] == "describe"
        nursery.cancel_scope.cancel()
    await client.start_flow(Greeting, flow_id="after")
    assert "after" in server.flows and server.connections == 1


async def test_calls_after_close_raise_client_closed(client):
    await client.open()
    await client.close()
    with pytest.raises(ClientClosed, match="the client is closed"):
        await client.describe_flow("x")
    await client.close()  # twice is fine


async def test_an_unreachable_server_is_unavailable_and_later_calls_dial_again(short_dir):
    from apps.matching import Unavailable

    path = os.path.join(short_dir, "late.sock")
    engine = ClientEngine(
        Registry([Greeting]), BlobCache(short_dir), ClientOptions(server_address=path)
    )
    with pytest.raises(Unavailable):
        await engine.open()
    fake = FakeServer(path, BlobCache(os.path.join(short_dir, "b2")))
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        assert await engine.start_flow(Greeting, flow_id="z") == "z"
        await engine.close()
        nursery.cancel_scope.cancel()


def test_the_engine_checks_what_it_is_given(tmp_path):
    options = ClientOptions(server_address="unix:/x")
    with pytest.raises(ConfigurationError, match="registry must be a Registry"):
        ClientEngine(object(), BlobCache(tmp_path), options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="options must be a ClientOptions"):
        ClientEngine(Registry([]), BlobCache(tmp_path), None)  # type: ignore[arg-type]


# -- against the real server --------------------------------------------------------------


async def test_an_idle_client_answers_pings_and_outlives_three_peer_timeouts(
    store_kind, short_dir, autojump_clock
):
    import otp
    import supervisors
    from apps.matching import MatchingError
    from apps.matching._application import STORE_THREADS, application
    from apps.matching._config import MatchingConfig

    sock = os.path.join(short_dir, "real.sock")
    STORE_THREADS.set(False)  # (the mock clock must not jump while the store works)
    async with otp.open_node():
        config = MatchingConfig(listen=[f"unix:{sock}"], store=store_kind.location)
        await supervisors.start_application(application(matching_config=config))
        engine = ClientEngine(Registry([Greeting]), None, ClientOptions(server_address=sock))
        try:
            await engine.open()
            conn = engine._conn
            assert conn is not None
            await trio.sleep(3 * config.peer_timeout + config.ping_interval)
            assert engine._conn is conn and not conn.closed
            # Still the same connection: a call is answered on it (without a thread, so the
            # mock clock does not jump under it).
            with pytest.raises(MatchingError) as caught:
                await engine._call("no_such_op", {}, None)
            assert type(caught.value) is MatchingError and "no_such_op" in str(caught.value)
            assert engine._conn is conn and not conn.closed
        finally:
            await engine.close()
        await supervisors.stop_application("matching")
