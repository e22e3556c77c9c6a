"""The blocking ``Client``'s own transport (``_client_sync``, ``_sync_connection``): calling
threads do the socket I/O themselves. Against the in-test server over a real Unix socket (TLS
and credentials: ``test_credentials.py``)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from apps.matching import (
    CallTimeout,
    Client,
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
    d = tempfile.mkdtemp(prefix="mc-", dir="/tmp")
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


def _client(server: FakeServer, short_dir: str, **options: Any) -> Client:
    return Client(
        Registry([Greeting]),
        BlobCache(os.path.join(short_dir, "cb"), inline_limit=16),
        ClientOptions(server_address=f"unix:{server.path}", **options),
    )


def _stuck(started: threading.Event) -> Any:
    async def stuck(args: dict[str, Any]) -> Any:
        started.set()
        await trio.sleep_forever()

    return stuck


def _in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_every_op_on_one_connection_and_large_values_through_the_blob_cache(server, short_dir):
    with _client(server, short_dir) as client:
        big = b"x" * 100
        flow_id = client.start_flow(Greeting, big, flow_id="f")
        assert server.calls[-1][0] == "start_flow"
        assert {op for op, _ in server.calls} == {"put_blob", "start_flow"}
        assert client.describe_flow(flow_id).flow_id == "f"
        assert [s.flow_id for s in client.list_flows(Greeting)] == ["f"]
        client.cancel_flow(flow_id)
        with pytest.raises(FlowNotFound):
            client.describe_flow("nope")
    assert server.connections == 1 and server.hellos[0].role == "client"


def test_concurrent_calls_from_many_threads_share_one_connection(server, short_dir):
    with _client(server, short_dir) as client:
        threads = [
            _in_thread(
                lambda i=i: [client.start_flow(Greeting, flow_id=f"{i}-{j}") for j in range(20)]
            )
            for i in range(12)
        ]
        for thread, errors in threads:
            thread.join()
            assert errors == []
    assert len(server.flows) == 12 * 20 and server.connections == 1


def test_a_ping_while_a_call_waits_is_answered_by_the_reading_thread(threaded, short_dir):
    server = threaded.server

    async def describe_after_a_pong(args: dict[str, Any]) -> Any:
        ponged = server.ponged
        await server.ping_clients()
        await ponged.wait()  # (the call would hang if the reading thread left it unanswered)
        raise FlowNotFound("no such flow")

    server.ops["describe"] = describe_after_a_pong
    with _client(server, short_dir) as client, pytest.raises(FlowNotFound):
        client.describe_flow("x")
    assert server.pongs == 1


def test_pings_an_idle_client_got_are_answered_before_its_next_call(threaded, short_dir):
    server = threaded.server
    with _client(server, short_dir) as client:
        client.open()
        threaded.run(server.ping_clients)
        threaded.run(server.ping_clients)
        client.start_flow(Greeting, flow_id="after")
        assert server.pongs == 2 and server.connections == 1


def test_an_idle_connection_the_server_dropped_is_dialled_again_before_sending(threaded, short_dir):
    # (as after the server's peer_timeout: nobody reads an idle connection, see the module
    # docs of _sync_connection). start_flow is not retried on a loss, yet it goes through once.
    server = threaded.server
    with _client(server, short_dir) as client:
        client.start_flow(Greeting, flow_id="a")
        threaded.run(server.drop_connections)
        client.start_flow(Greeting, flow_id="b")
    assert [args["flow_id"] for op, args in server.calls if op == "start_flow"] == ["a", "b"]
    assert server.connections == 2


def test_a_lost_connection_fails_the_calls_in_flight_and_the_next_call_dials(threaded, short_dir):
    server = threaded.server
    started = threading.Event()
    server.ops["call_rpc"] = _stuck(started)
    with _client(server, short_dir) as client:
        client.start_flow(Greeting, flow_id="a")
        thread, errors = _in_thread(client.call_rpc, "a", "greeting")
        assert started.wait(10)
        threaded.run(server.drop_connections)
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], ClientClosed)
        assert errors[0].retryable and "was closed" in str(errors[0])
        assert client.describe_flow("a").flow_id == "a"
    assert server.connections == 2


def test_a_timed_out_call_leaves_the_connection_usable(server, short_dir):
    started = threading.Event()
    server.ops["describe"] = _stuck(started)
    with _client(server, short_dir, call_timeout=0.2) as client:
        with pytest.raises(CallTimeout, match=r"'describe' .* within 0\.2 s"):
            client.describe_flow("x")
        assert client.start_flow(Greeting, flow_id="after") == "after"
    assert server.connections == 1


def test_a_sleeping_caller_times_out_while_another_thread_reads(server, short_dir):
    started = threading.Event()
    server.ops["call_rpc"] = _stuck(started)
    with _client(server, short_dir) as client:
        reader, errors = _in_thread(client.call_rpc, "a", "greeting")
        assert started.wait(10)
        started.clear()
        with pytest.raises(CallTimeout):
            client.call_rpc("a", "greeting", timeout=0.1)  # (locally 0.1 s + the grace)
        assert reader.is_alive()
        client.close()
        reader.join()
    assert len(errors) == 1 and isinstance(errors[0], ClientClosed)


def test_close_fails_calls_in_flight_with_client_closed_and_is_idempotent(server, short_dir):
    started = threading.Event()
    server.ops["describe"] = _stuck(started)
    client = _client(server, short_dir)
    thread, errors = _in_thread(client.describe_flow, "x")
    assert started.wait(10)
    client.close()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], ClientClosed)
    assert "closed during the call" in str(errors[0])
    client.close()
    with pytest.raises(ClientClosed, match="the client is closed"):
        client.describe_flow("x")


def test_a_keyboard_interrupt_mid_read_leaves_the_connection_usable(server, short_dir):
    started = threading.Event()
    server.ops["describe"] = _stuck(started)
    main = threading.get_ident()

    with _client(server, short_dir) as client:
        client.open()
        conn = client._engine._conn
        assert conn is not None

        def interrupt() -> None:
            assert started.wait(10)
            # No event says the caller is past its send and reading (an interrupt during
            # the send may close the connection instead, see the next test): look.
            while not conn.reader:
                time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGINT)

        thread = threading.Thread(target=interrupt)
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            client.describe_flow("x")
        thread.join()
        assert conn.broken is None and not conn.reader and not conn.waiters
        assert client.start_flow(Greeting, flow_id="after") == "after"
    assert server.connections == 1


def test_a_keyboard_interrupt_anywhere_in_a_call_leaves_the_client_usable(server, short_dir):
    # Interrupts land at every point of a call in turn (a send may have gone out partly:
    # the connection is then closed, its calls fail, the next call dials again).
    started = threading.Event()
    server.ops["describe"] = _stuck(started)
    main = threading.get_ident()
    with _client(server, short_dir) as client:
        for i in range(20):
            started.clear()

            def interrupt() -> None:
                assert started.wait(10)
                signal.pthread_kill(main, signal.SIGINT)

            thread = threading.Thread(target=interrupt)
            thread.start()
            with pytest.raises(KeyboardInterrupt):
                client.describe_flow("x")
            thread.join()
            assert client.start_flow(Greeting, flow_id=f"after-{i}") == f"after-{i}"
